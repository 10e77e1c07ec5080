"""A source topic deleted and made again while mirrored: its offsets go backwards. The new records are copied, the
reset is reported and counted, and translation restarts on the new copy instead of pointing past it. The new topic
is refilled past the old position before the mirror looks again, so only its topic id tells it from the old one."""

from __future__ import annotations

import time

import pytest

from bench.testbed import clients
from bench.testbed.clients import Record, commit, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.dr.internal import read_checkpoints
from spark_app.mirror import Mirror
from spark_app.ranges import OffsetsReset
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_a_topic_made_again_and_refilled_past_the_old_position_is_copied_whole_reported_and_translated_anew(
    mode, spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic, group = f"remade-{unique}", f"app-{unique}"
    now = int(time.time() * 1000)
    old = [Record(0, b"k", f"old-{i}".encode(), (), now + i) for i in range(100)]
    new = [Record(0, b"k", f"new-{i}".encode(), (), now + 1000 + i) for i in range(130)]
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          groups={"include": [group]}, emit_heartbeats=False, mode=mode)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: 1})
    produce(plaintext_cluster.client, topic, old)
    Mirror(spark, config).run_available_now()

    clients.remake_topic(plaintext_cluster.admin, topic, 1)
    produce(plaintext_cluster.client, topic, new)
    commit(plaintext_cluster.client, group, topic, {0: 10})  # a consumer of the new topic read 10 of it
    mirror = Mirror(spark, config)
    mirror.run_available_now()

    remote = f"primary.{topic}"
    copied = read_all(source_cluster.client, remote, expected=230)
    assert_each_record_once_in_order(remote, copied, old + new)
    assert mirror.flows[0].ledger.resets == [OffsetsReset(topic, 0, 100, 0)]
    assert 'mirrorkit_errors_total{flow="primary->dr",kind="offsets_reset"} 1.0' in mirror.metrics.text()
    checkpoints = {cp.partition: cp for cp, _ in read_checkpoints(config, config.flows[0]).values()}
    # new-10's copy: at 110 after the old life's 100 and the new one's first 10; later in real time, whose commits
    # put control markers among the copies
    new_10 = next(r.offset for r in copied if r.value == b"new-10")
    assert new_10 == 110 or mode == "realtime"
    assert (checkpoints[0].upstream_offset, checkpoints[0].downstream_offset) == (10, new_10)


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_exactly_once_a_topic_made_again_and_first_seen_empty_is_copied_whole_once(
    mode, spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    """The common case of a topic made again: the mirror looks while it is still empty (one run sees it so), and its
    producers refill it past the old position only later. The committed positions must start the new life over, or
    the next run skips the new topic's first records to where the old life had stopped."""
    topic = f"remade-empty-{unique}"
    now = int(time.time() * 1000)
    old = [Record(0, b"k", f"old-{i}".encode(), (), now + i) for i in range(100)]
    new = [Record(0, b"k", f"new-{i}".encode(), (), now + 1000 + i) for i in range(130)]
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, mode=mode, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: 1})
    produce(plaintext_cluster.client, topic, old)
    Mirror(spark, config).run_available_now()

    clients.remake_topic(plaintext_cluster.admin, topic, 1)
    seen_empty = Mirror(spark, config)
    seen_empty.run_available_now()
    assert seen_empty.flows[0].ledger.resets == [OffsetsReset(topic, 0, 100, 0)]
    produce(plaintext_cluster.client, topic, new)
    Mirror(spark, config).run_available_now()

    remote = f"primary.{topic}"
    copied = read_all(source_cluster.client, remote, expected=230)  # read_committed: aborted attempts are not seen
    assert_each_record_once_in_order(remote, copied, old + new)
