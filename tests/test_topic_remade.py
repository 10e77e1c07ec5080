"""A source topic deleted and made again while an exactly-once real-time flow copies it, between two topic syncs: its
copier task finds the partitions gone backwards and copies the new life. A stop and a start after that must go on
from the new life's position: the new topic is copied once, not a second time from its log start."""

from __future__ import annotations

import time

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from spark_app.runner import FlowRunner
from spark_app.transactions import check_transactions
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

PARTITIONS = 2


def records(tag: str, count: int, at_ms: int) -> list[Record]:
    return [
        Record(i % PARTITIONS, f"k{i}".encode(), f"{tag}-{i}".encode(), timestamp_ms=at_ms + i) for i in range(count)
    ]


def recreate(cluster, topic: str) -> None:
    """Delete the topic and make it again, empty, once the broker has let go of the old one."""
    admin = clients.admin(cluster.admin)
    admin.delete_topics([topic], operation_timeout=30)[topic].result()
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(cluster.admin, {topic: PARTITIONS})
            return
        except AssertionError as err:  # still being deleted
            assert time.monotonic() < deadline, f"could not make '{topic}' again: {err}"
            time.sleep(0.5)


def copy_until(flow: FlowRunner, target, topic: str, count: int, within_s: float = 180.0) -> None:
    """Keep the flow going as the mirror's loop does between topic syncs (tasks that failed start again) until the
    target's read_committed reader sees `count` records of `topic`."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            read_all(target, topic, expected=count, timeout_s=5, exact=False)
            return
        except AssertionError:
            assert time.monotonic() < deadline, f"'{topic}': fewer than {count} records after {within_s:.0f} s"
            assert flow.failure() is None, flow.failure()
            flow.catch_up()


def test_exactly_once_real_time_a_topic_made_again_while_copied_is_copied_once_across_a_stop_and_start(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic = f"remade-live-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old, new = records("old", 1_000, now), records("new", 3_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, mode="realtime", exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)

    check_transactions(config)
    first = Mirror(spark, config)
    flow = first.flows[0]
    flow.start(flow.sync_topics(), available_now=False)
    try:
        copy_until(flow, source_cluster.client, remote, len(old))
        recreate(plaintext_cluster, topic)  # between two topic syncs: only the task sees it
        time.sleep(3)  # left empty a while, as producers come back only later
        produce(plaintext_cluster.client, topic, new)
        copy_until(flow, source_cluster.client, remote, len(old) + len(new))
    finally:
        flow.stop()  # the stop a SIGTERM makes: the tasks flush and report, the ledger files it
    assert [r.previous for r in flow.ledger.resets] == [500] * PARTITIONS, flow.ledger.resets

    check_transactions(config)
    again = Mirror(spark, config)
    again.run_available_now()
    assert again.flows[0].ledger.resets == [], "the new life was taken for the old one again"
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new))  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)
