"""Record size handled per record: a target topic with a small `max.message.bytes` takes every record that fits,
whatever the backlog, and a record over its cap goes to the dead-letter topic or holds its partition."""

from __future__ import annotations

import time

import pytest

from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from spark_app.outbox import DLQ_PREFIX
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

CAP = 262_144  # the target topic's max.message.bytes
HUGE = 2_000_000  # one record over it, on a source that takes it
SMALL = 2_000  # records per partition before and after it, 1 KB each: many producer batches' worth


def records(partition: int, tag: str, count: int) -> list[Record]:
    """Explicit timestamps (near now), so copies compare equal field by field."""
    now = int(time.time() * 1000)
    return [Record(partition, f"{tag}{i}".encode(), bytes([i % 251]) * 1_000, (), now + i) for i in range(count)]


@pytest.mark.parametrize("dead_letters", [True, False])
def test_a_256_kb_cap_target_takes_every_record_that_fits_under_backlog_and_a_2_mb_record_is_handled_alone(
    dead_letters, spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic, dlq = f"capped-{unique}", f"dlq-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2}, {"max.message.bytes": "3000000"})
    huge = Record(0, b"huge", b"x" * HUGE, (), int(time.time() * 1000))
    sent = records(0, "a", SMALL) + [huge] + records(0, "b", SMALL) + records(1, "c", SMALL)
    produce(plaintext_cluster.client, topic, sent, **{"message.max.bytes": "3000000"})
    remote = f"onprem.{topic}"
    create_topics(source_cluster.admin, {remote: 2}, {"max.message.bytes": str(CAP)})
    flow_keys: dict = {"emit_heartbeats": False}
    if dead_letters:
        create_topics(source_cluster.admin, {dlq: 1})
        flow_keys["dead_letter_topic"] = dlq
    config = parse_config(one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", **flow_keys))

    mirror = Mirror(spark, config)
    mirror.run_available_now()

    ledger = mirror.flows[0].ledger
    if dead_letters:
        # Every record that fits landed, in order; only the huge one is a dead letter, with its coordinates.
        got = read_all(source_cluster.client, remote, expected=len(sent) - 1)
        assert_each_record_once_in_order(remote, got, [r for r in sent if r is not huge])
        (letter,) = read_all(source_cluster.client, dlq, expected=1)
        assert dict(letter.headers)[f"{DLQ_PREFIX}offset"] == str(SMALL).encode() and letter.value is None
        assert ledger.quarantined == {}
    else:
        # Partition 0 holds from the huge record: all before it landed, none after it, no duplicate; 1 goes on.
        got = read_all(source_cluster.client, remote, expected=2 * SMALL)
        assert_each_record_once_in_order(remote, got, sent[:SMALL] + sent[2 * SMALL + 1 :])
        assert ledger.held[topic] == {0: SMALL}
        assert f"offset {SMALL} ({HUGE} bytes)" in ledger.quarantined[topic]
