"""The operator verbs the site's toolbox runs with the mirror's identity, against real brokers that check ACLs: each
runs as the mirror's principal with only the grants infra renders for that identity (infra/kafka/acls.py with
`operator`), and is refused by the brokers with the mirror's own grants alone."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from bench.testbed.clients import create_topics
from bench.testbed.kafka_cluster import KafkaCluster, cluster_entry
from infra.kafka.acls import CLUSTER, AclSpec, mirror_acls
from spark_app import clients
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr import drill
from spark_app.dr.adopt import AdoptOptions, adopt
from spark_app.dr.drill import Drill, DrillOptions, DrillRefused
from spark_app.dr.formats import Checkpoint, OffsetSync
from spark_app.dr.handback import connect_key
from spark_app.errors import MirrorFailed
from spark_app.policy import (
    PROBE_TOPIC,
    checkpoints_topic,
    connect_offsets_topic,
    mm2_offset_syncs_topic,
    target_topic,
)
from tests.test_topic_acls import MIRROR, as_binding, set_acls


def drill_config(source: KafkaCluster, target: KafkaCluster, unique: str, tmp_path: Path) -> MirrorConfig:
    """A flow of its own aliases (its internal topics are its own) that mirrors a probe topic named as the toolbox's
    grants allow (it starts with PROBE_TOPIC) and checkpoints its probe groups."""
    tag = unique[-8:]
    probe = f"{PROBE_TOPIC}_{tag}"
    return parse_config(
        {
            "clusters": [cluster_entry(source, f"p{tag}"), cluster_entry(target, f"d{tag}")],
            "flows": [{"source": f"p{tag}", "target": f"d{tag}", "topics": {"include": [probe]},
                       "groups": {"include": [f"{re.escape(probe)}-.*"]}, "sync_topic_acls": False,
                       "emit_heartbeats": False, "checkpoint_location": str(tmp_path / "ckpt")}],
            "checkpoint_interval_s": 1,
        }
    )  # fmt: skip


def grant(cluster: KafkaCluster, specs: Iterable[AclSpec], principal: str = MIRROR) -> None:
    """These ACLs, as infra renders them, for the mirror's principal unless another is named."""
    set_acls(cluster, [as_binding(s, principal) for s in sorted(specs)])


def creates_allowed(config: MirrorConfig, alias: str, topic: str) -> bool:
    """Whether the mirror's principal may create `topic` on `alias` now (a validating request: nothing is made)."""
    admin = clients.admin(config.cluster(alias))
    future = admin.create_topics([NewTopic(topic, 2)], validate_only=True, request_timeout=15)[topic]
    try:
        future.result()
    except KafkaException as err:
        if err.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            return False
        raise
    return True


def until_applied(config: MirrorConfig, alias: str, topic: str, allowed: bool) -> None:
    """Wait until the broker applies the ACLs just set (its authorizer follows the metadata log; until then a
    resource no ACL matches is open to all): the probe topic's creation is `allowed`, or refused."""
    deadline = time.monotonic() + 30
    while creates_allowed(config, alias, topic) != allowed:
        assert time.monotonic() < deadline, f"the ACLs on '{alias}' did not apply in 30 s"
        time.sleep(0.2)


def operator_only(config: MirrorConfig, alias: str) -> set[AclSpec]:
    """What the toolbox's verbs add to the mirror's grants on a cluster."""
    return set(mirror_acls(alias, config.flows, operator=True)) - set(mirror_acls(alias, config.flows))


@contextmanager
def stand_in_mirror(config: MirrorConfig, source: KafkaCluster, target: KafkaCluster) -> Iterator[None]:
    """A running mirror of the probe topic, as the drill expects one, signed in as the brokers' super user: it copies
    each probe record to the same partition and offset of the copy, and checkpoints each probe group's committed
    offsets (the same offsets on the copy), every half second. Spark's mirror does the same under the mirror's own
    grants (tests/test_dr_drill.py); here only the drill's grants are under test."""
    flow = config.flows[0]
    probe = flow.topics.include[0]
    remote = target_topic(flow, probe)
    create_topics(target.admin, {remote: 2, checkpoints_topic(flow): 1})
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        reader = clients.consumer(source.admin, {"group.id": f"stand-in-{flow.source}"})
        writer = clients.producer(target.admin, {"acks": "all"})
        admin = clients.admin(source.admin)
        assigned = False
        try:
            while not stop.is_set():
                if not assigned:
                    found = clients.list_topics(admin, source.admin).get(probe)
                    if found is None or found.error is not None or not found.partitions:
                        stop.wait(0.5)
                        continue
                    reader.assign([TopicPartition(probe, p, 0) for p in sorted(found.partitions)])
                    assigned = True
                for msg in reader.consume(500, 0.5):
                    if msg.error() is None:
                        writer.produce(remote, msg.value(), msg.key(), partition=msg.partition())
                writer.flush(30)
                listing = admin.list_consumer_groups(request_timeout=30).result()
                for group in (g.group_id for g in listing.valid if g.group_id.startswith(f"{probe}-")):
                    request = [ConsumerGroupTopicPartitions(group)]
                    found_offsets = admin.list_consumer_group_offsets(request, request_timeout=30)[group].result()
                    for tp in found_offsets.topic_partitions or []:
                        if tp.topic == probe and tp.offset >= 0:
                            cp = Checkpoint(group, remote, tp.partition, tp.offset, tp.offset)
                            writer.produce(checkpoints_topic(flow), cp.record_value(), cp.key())
                writer.flush(30)
        except BaseException as err:  # the drill then waits in vain: the test reports this instead
            failed.append(err)
        finally:
            reader.close()

    thread = threading.Thread(target=run, name="stand-in mirror", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
        if failed:  # raised over whatever the drill raised: a drill with no mirror waits in vain
            raise AssertionError(f"the stand-in mirror failed: {failed[0]!r}") from failed[0]


def refusal_code(err: BaseException) -> str:
    """The Kafka error name a drill was refused with."""
    if isinstance(err, KafkaException):
        return err.args[0].name()
    return str(err)


def test_a_drill_runs_as_the_mirrors_principal_with_the_toolboxs_grants_and_is_refused_without_them(
    acl_source_cluster: KafkaCluster, acl_target_cluster: KafkaCluster, unique: str, tmp_path: Path, monkeypatch
):
    """With the mirror's own grants, the drill cannot make its probe topic; with those on the probe topic but not
    on its group, the probe group cannot commit; with everything the toolbox's identity is granted it runs to the
    end: measured, failed over on the target, and its probe group deleted on both clusters."""
    monkeypatch.setattr(drill, "WARMUP_TIMEOUT_S", 60.0)  # the stand-in copies within a second or has failed
    config = drill_config(acl_source_cluster, acl_target_cluster, unique, tmp_path)
    flow = config.flows[0]
    probe = flow.topics.include[0]
    options = DrillOptions(probe_topic=probe, records=60, seconds=1.0)
    # The test bed's brokers allow what no ACL names (`allow.everyone.if.no.acl.found`), a cluster-wide Create
    # among it, as no cluster of production does: an ACL of a bystander's on each cluster resource ends that.
    for cluster in (acl_source_cluster, acl_target_cluster):
        grant(cluster, [AclSpec("Cluster", "Literal", CLUSTER, "Describe")], f"User:bystander-{unique[-8:]}")
    # The mirror's own grants, as the identity held them before the toolbox's verbs were granted.
    grant(acl_source_cluster, mirror_acls(flow.source, config.flows))
    grant(acl_target_cluster, mirror_acls(flow.target, config.flows))
    until_applied(config, flow.source, probe, allowed=False)

    with pytest.raises(DrillRefused) as refused:
        Drill(config, flow, options, log=lambda _: None).run()
    assert "TOPIC_AUTHORIZATION_FAILED" in str(refused.value), refused.value

    added_on_source, added_on_target = operator_only(config, flow.source), operator_only(config, flow.target)
    assert {a.resource_type for a in added_on_source | added_on_target} == {"Topic", "Group"}
    topics_only = {a for a in added_on_source if a.resource_type == "Topic"}
    with stand_in_mirror(config, acl_source_cluster, acl_target_cluster):
        grant(acl_source_cluster, topics_only)
        until_applied(config, flow.source, probe, allowed=True)
        with pytest.raises(KafkaException) as no_group:
            Drill(config, flow, options, log=lambda _: None).run()
        assert refusal_code(no_group.value) == "GROUP_AUTHORIZATION_FAILED", no_group.value

        grant(acl_source_cluster, added_on_source - topics_only)
        grant(acl_target_cluster, added_on_target)
        report = Drill(config, flow, options, log=lambda _: None).run()

    assert report.produced >= 60 and 0 < report.consumed_on_source < report.produced
    assert report.skipped == 0 and report.read_on_target >= report.produced - report.consumed_on_source
    # The probe group went from both clusters (from the source before its failover), and its checkpoints with it.
    assert f"deleted group '{report.probe_group}' on '{flow.target}'" in report.cleanup, report.cleanup
    assert not [line for line in report.cleanup if line.startswith("could not")], report.cleanup
    for cluster in (acl_source_cluster, acl_target_cluster):
        assert report.probe_group not in groups_on(cluster)
    # The probe alone, by its exact name, and no other probe topic.
    assert {a.name for a in added_on_source if a.name.startswith(PROBE_TOPIC) and a.resource_type == "Topic"} == {probe}


def groups_on(cluster: KafkaCluster) -> set[str]:
    admin = clients.admin(cluster.admin)  # held: the futures of a client already freed never complete
    return {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid}


def test_adopt_runs_as_the_mirrors_principal_with_the_toolboxs_grants_and_finds_nothing_without_them(
    acl_source_cluster: KafkaCluster, acl_target_cluster: KafkaCluster, unique: str, tmp_path: Path
):
    """MirrorMaker 2's state as a stopped MM2 on a Connect cluster of its own leaves it (Strimzi's: its offsets topic
    and group named in the flow's `mirrormaker2`), written by the super user: a copied topic, Connect's offsets topic
    on the target with MM2's position, and MM2's offset syncs on the source. With the
    mirror's own grants Connect's offsets topic is not even visible to the mirror's principal; with the toolbox's
    identity's grants adopt takes the flow over at MM2's position."""
    tag = unique[-8:]
    p, d, topic = f"p{tag}", f"d{tag}", f"orders-{tag}"
    config = parse_config(
        {
            "clusters": [cluster_entry(acl_source_cluster, p), cluster_entry(acl_target_cluster, d)],
            "flows": [{"source": p, "target": d, "topics": {"include": [topic]}, "sync_topic_acls": False,
                       "emit_heartbeats": False, "checkpoint_location": str(tmp_path / "ckpt"),
                       # A Connect cluster of its own (Strimzi's), named in the flow: granted and found by name.
                       "mirrormaker2": {"offsets_topic": f"mm2-cluster-offsets-{tag}",
                                        "connect_group": f"mm2-cluster-{tag}"}}],
        }
    )  # fmt: skip
    flow = config.flows[0]
    remote = target_topic(flow, topic)
    offsets_topic = connect_offsets_topic(flow)
    syncs = mm2_offset_syncs_topic(flow, "source")
    create_topics(acl_source_cluster.admin, {topic: 1, syncs: 1})
    create_topics(acl_target_cluster.admin, {remote: 1, offsets_topic: 1})
    now_ms = int(time.time() * 1000)  # not older: retention would delete the records
    for cluster, name in ((acl_source_cluster, topic), (acl_target_cluster, remote)):
        writer = clients.producer(cluster.admin, {"acks": "all"})
        for i in range(10):
            writer.produce(name, f"v{i}".encode(), f"k{i}".encode(), partition=0, timestamp=now_ms + i)
        assert writer.flush(30) == 0
    writer = clients.producer(acl_target_cluster.admin, {"acks": "all"})
    writer.produce(offsets_topic, b'{"offset":9}', connect_key("MirrorSourceConnector", p, topic, 0), partition=0)
    assert writer.flush(30) == 0
    writer = clients.producer(acl_source_cluster.admin, {"acks": "all"})
    writer.produce(syncs, *reversed(OffsetSync(topic, 0, 0, 0).mm2_record()), partition=0)
    assert writer.flush(30) == 0
    # The test bed's brokers let anyone use what no ACL names; a cluster of production lets no one. A bystander's
    # ACL on each of MM2's resources here (and on each cluster) makes them as closed as that.
    bystander = f"User:bystander-{tag}"
    for cluster, alias in ((acl_source_cluster, p), (acl_target_cluster, d)):
        named = {(a.resource_type, a.pattern, a.name) for a in operator_only(config, alias) if a.name != "heartbeats"}
        grant(cluster, [AclSpec(*n, "Describe") for n in named | {("Cluster", "Literal", CLUSTER)}], bystander)
        grant(cluster, mirror_acls(alias, config.flows))

    deadline = time.monotonic() + 30
    while True:  # until the broker applies the ACLs just set (its authorizer follows the metadata log)
        try:
            adopt(config, flow, AdoptOptions())
        except MirrorFailed as refused:
            # Connect's offsets topic is hidden from the mirror's principal: adopt finds no MM2 there.
            assert f"no MirrorMaker 2 offsets in '{offsets_topic}'" in str(refused), refused
            break
        assert time.monotonic() < deadline, "adopt ran with the mirror's own grants alone"
        shutil.rmtree(tmp_path / "ckpt")
        time.sleep(0.5)

    grant(acl_source_cluster, operator_only(config, p))
    grant(acl_target_cluster, operator_only(config, d))
    deadline = time.monotonic() + 30
    for alias, name in ((p, syncs), (d, offsets_topic), (d, remote)):  # until the broker applies the ACLs just set
        while not clients.read_topic(config.cluster(alias), name):
            assert time.monotonic() < deadline, f"the toolbox's grants on '{name}' did not apply in 30 s"
            time.sleep(0.5)
    result = adopt(config, flow, AdoptOptions())
    assert result.refused == [] and result.skipped == []
    (adopted,) = result.partitions
    assert (adopted.topic, adopted.partition, adopted.next_offset, adopted.committed) == (topic, 0, 10, True)
    assert adopted.runs[-1].last == 9  # MM2's sync, stretched to its position once the copy's record there matched
    assert (tmp_path / "ckpt").is_dir() and any((tmp_path / "ckpt").iterdir())  # the flow's state, beside it
