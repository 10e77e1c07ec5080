"""One writer per flow's DR state: a second mirror of a flow fences the first, which writes no more and stops."""

from __future__ import annotations

import logging
import os
import time

import pytest

from bench.testbed.clients import commit, create_topics
from bench.testbed.ports import free_port
from spark_app import clients
from spark_app.clients import read_topic
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr.formats import Checkpoint, OffsetSync
from spark_app.dr.internal import offset_syncs_cluster
from spark_app.dr.lease import DrLease, holder
from spark_app.dr.service import DrSync
from spark_app.errors import MirrorFailed
from spark_app.metrics import MirrorMetrics
from spark_app.mirror import Mirror
from spark_app.policy import checkpoints_topic, lease_group, offset_syncs_topic
from spark_app.ranges import Landing
from tests.support.mirror_config import one_flow_config
from tests.support.running import in_background


def landed(topic: str, first: int, end: int) -> Landing:
    """A batch that copied source offsets first..end - 1 of partition 0 onto the same target offsets."""
    return Landing(
        topic, 0, first, end, last_offset=end - 1, last_target_offset=end - 1, records=end - first,
        runs=[(first, first, end - 1)],
    )  # fmt: skip


def _own_aliases_config(source, target, topics: list[str], tmp_path, unique: str) -> MirrorConfig:
    """One flow with aliases of the test's own, so its checkpoints topic and lease group are its own too."""
    return parse_config(
        one_flow_config(
            source,
            target,
            topics,
            tmp_path / "ckpt",
            source_alias=f"p{unique[-8:]}",
            target_alias=f"dr{unique[-8:]}",
            emit_heartbeats=False,
        )  # fmt: skip
    )


def test_a_second_mirror_of_a_flow_fences_the_first_which_writes_no_more_dr_state(
    plaintext_cluster, source_cluster, tmp_path, unique, caplog
):
    topic, group, alias = f"orders-{unique}", f"app-{unique}", f"p{unique[-8:]}"
    create_topics(plaintext_cluster.admin, {topic: 1})
    create_topics(source_cluster.admin, {f"{alias}.{topic}": 1})
    config = parse_config(
        one_flow_config(
            plaintext_cluster,
            source_cluster,
            [topic],
            tmp_path / "ckpt",
            source_alias=alias,  # its own checkpoints topic: a shared one holds others' groups, which it tombstones
            target_alias=f"dr{unique[-8:]}",
            groups={"include": [group]},
            emit_heartbeats=False,
        )  # fmt: skip
    )
    flow = config.flows[0]
    syncs_cluster = config.cluster(offset_syncs_cluster(flow))
    first, second = DrSync(config, flow), DrSync(config, flow)
    first.prepare()
    assert str(os.getpid()) in (holder(config, flow) or ""), "a running mirror's lease names its process"
    first.on_landed([landed(topic, 0, 10)])
    commit(plaintext_cluster.client, group, topic, {0: 5})
    assert [cp.downstream_offset for cp in first.checkpoint_once()] == [5]

    second.prepare()  # the replacement starts: the first is fenced at the broker
    first.on_landed([landed(topic, 10, 20)])
    commit(plaintext_cluster.client, group, topic, {0: 15})
    with caplog.at_level(logging.ERROR, logger="spark_app.dr.lease"):
        assert first.checkpoint_once() == [], "a fenced mirror writes no checkpoint"
    assert first.fenced is not None and "took over its DR state" in first.fenced
    assert any("fenced" in r.getMessage() and flow.name in r.getMessage() for r in caplog.records)
    on_syncs = read_topic(syncs_cluster, offset_syncs_topic(flow))
    syncs = [OffsetSync.decode(m.key(), m.value()) for m in on_syncs if m.value() is not None]  # not tombstones
    assert max(s.last_offset or s.upstream_offset for s in syncs if s.topic == topic) == 9, "no sync past the fence"
    first.heartbeat_once()
    first.stop()  # its final round writes nothing either

    second.on_landed([landed(topic, 10, 20)])
    assert [cp.downstream_offset for cp in second.checkpoint_once()] == [15]
    on_target = read_topic(source_cluster.client, checkpoints_topic(flow))
    written = [Checkpoint.decode(m.key(), m.value()) for m in on_target]
    assert [cp.downstream_offset for cp in written if cp.group == group] == [5, 15], "only the holder's checkpoints"
    second.stop()
    assert holder(config, flow) is None, "a mirror that stopped holds no lease"


def test_a_flow_whose_checkpoints_topic_deletes_old_records_still_has_one_writer_of_its_offset_syncs(
    plaintext_cluster, source_cluster, tmp_path, unique
):
    """Checkpoints are refused on such a topic, yet offset syncs go on: the lease rides on the topic all the same, so
    a replaced mirror does not write syncs beside its replacement."""
    topic = f"orders-{unique}"
    config = _own_aliases_config(plaintext_cluster, source_cluster, [topic], tmp_path, unique)
    flow = config.flows[0]
    create_topics(source_cluster.admin, {checkpoints_topic(flow): 1}, {"cleanup.policy": "delete"})
    metrics = MirrorMetrics()
    first, second = DrSync(config, flow, metrics), DrSync(config, flow)
    first.prepare()
    assert checkpoints_topic(flow) in first.disabled
    assert metrics.dr_unusable.labels(flow.name)._value.get() == 1, "an alert fires on it, not only a log line"
    first.on_landed([landed(topic, 0, 10)])
    first.checkpoint_once()
    second.prepare()
    first.on_landed([landed(topic, 10, 20)])
    first.checkpoint_once()
    assert first.fenced is not None, "the replaced mirror learns it was fenced"
    syncs_cluster = config.cluster(offset_syncs_cluster(flow))
    on_syncs = read_topic(syncs_cluster, offset_syncs_topic(flow))
    syncs = [OffsetSync.decode(m.key(), m.value()) for m in on_syncs if m.value() is not None]  # not tombstones
    assert max(s.last_offset or s.upstream_offset for s in syncs if s.topic == topic) == 9, "no sync past the fence"
    first.stop()
    second.stop()


@pytest.mark.timeout(300)
def test_a_running_mirror_whose_flow_another_mirror_takes_over_stops_and_says_why(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic = f"orders-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 1})
    config = parse_config(
        one_flow_config(
            plaintext_cluster,
            source_cluster,
            [topic],
            tmp_path / "ckpt",
            source_alias="primary",
            target_alias=f"dr{unique[-8:]}",
            emit_heartbeats=False,
            checkpoint_interval_s=0.5,
            topic_sync_interval_s=0.5,
            metrics_port=free_port(),
        )  # fmt: skip
    )
    mirror = Mirror(spark, config)
    running, failed = in_background(mirror.run_forever, "mirror")
    deadline = time.monotonic() + 120
    while holder(config, config.flows[0]) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert holder(config, config.flows[0]) is not None, "the running mirror holds its flow's lease"

    replacement = DrSync(config, config.flows[0])
    replacement.prepare()
    running.join(120)
    replacement.stop()
    assert not running.is_alive(), "the fenced mirror stopped"
    assert len(failed) == 1 and isinstance(failed[0], MirrorFailed), failed
    assert "took over its DR state" in str(failed[0]) and "this mirror stops" in str(failed[0])


def test_a_lease_taken_by_a_mirror_that_has_not_yet_marked_it_is_not_taken_back(
    plaintext_cluster, source_cluster, tmp_path, unique
):
    """Between another mirror's join and its mark's commit the group still carries the holder's own mark, which once
    made the holder read its fence as its own rejoin and take the lease back from the replacement."""
    config = _own_aliases_config(plaintext_cluster, source_cluster, [f"orders-{unique}"], tmp_path, unique)
    flow = config.flows[0]
    target = config.cluster(flow.target)
    create_topics(source_cluster.admin, {checkpoints_topic(flow): 1}, {"cleanup.policy": "compact"})
    lease = DrLease(target, flow)
    lease.acquire()
    assert lease.held()
    group = lease_group(flow)
    replacement = clients.consumer(target, {"group.id": group, "group.instance.id": group, "client.id": "replacement"})
    replacement.subscribe([checkpoints_topic(flow)])  # joins, fencing the holder, and commits no mark
    deadline = time.monotonic() + 30
    while not replacement.assignment() and time.monotonic() < deadline:
        replacement.poll(0.2)
    assert replacement.assignment(), "the replacement joined the lease group"
    assert not lease.held(), "the holder learns it was fenced"
    assert lease.fenced is not None and "took over its DR state" in lease.fenced
    assert holder(config, flow) is not None and replacement.poll(0.5) is None, "the replacement is still the member"
    replacement.close()
