"""A mirror whose network breaks under it (a target cut off, a source that resets and lags) rides it out: it keeps
running, and every record lands, the first copies in source order."""

from __future__ import annotations

import time

from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.ports import free_port
from bench.testbed.toxiproxy import Stream
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import cluster_entry, one_flow_config
from tests.support.running import mirror_running
from tests.test_mirror_topic_faults import wait_until

PER_ROUND = 20  # records a round, one round a second
TARGET_CUT_S = 20
SOURCE_FAULTS_S = 15


def test_a_throughput_mirror_rides_out_a_cut_target_and_a_resetting_slow_source_and_lands_every_record_in_order(
    spark, plaintext_cluster, target_cluster, tmp_path, unique
):
    topic = f"net-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    create_topics(target_cluster.admin, {f"onprem.{topic}": 2})
    config = parse_config(
        one_flow_config(
            cluster_entry(plaintext_cluster, "onprem", proxied=True),
            cluster_entry(target_cluster, "dr", proxied=True),
            [topic],
            tmp_path / "ckpt",
            emit_heartbeats=False,
            metrics_port=free_port(),
            mode="throughput",
        )  # fmt: skip
    )
    sent: list[Record] = []

    def on_target() -> list[Record]:
        """Every record the target topic holds now, read directly (not through the proxy)."""
        return read_all(target_cluster.client, f"onprem.{topic}", expected=0, exact=False, timeout_s=30)

    def send_rounds(rounds: int) -> None:
        """Produced straight to the source (the application's path, not the mirror's), a round a second."""
        for _ in range(rounds):
            now, first = int(time.time() * 1000), len(sent)
            batch = [Record(i % 2, f"k{i}".encode(), f"{topic}-{i}".encode(), (), now + i - first)
                     for i in range(first, first + PER_ROUND)]  # fmt: skip
            produce(plaintext_cluster.client, topic, batch)
            sent.extend(batch)
            time.sleep(1)

    mirror = Mirror(spark, config)
    flow = mirror.flows[0]
    try:
        with mirror_running(mirror) as errors:
            send_rounds(3)
            wait_until(lambda: flow.totals.records.get(topic, 0) >= len(sent), errors, "the first rounds to land")

            target_cluster.faults.cut()
            send_rounds(TARGET_CUT_S)
            target_cluster.faults.heal()

            plaintext_cluster.faults.reset_peer(after_ms=2000)
            plaintext_cluster.faults.latency(300, jitter_ms=100, stream=Stream.UPSTREAM)
            send_rounds(SOURCE_FAULTS_S)
            plaintext_cluster.faults.heal()

            send_rounds(3)
            wait_until(lambda: flow.totals.records.get(topic, 0) >= len(sent), errors, "every record to land", 300)
            wait_until(lambda: set(sent) <= set(on_target()), errors, "every record to be readable on the target")
            assert flow.running(), f"the flow's copy stopped: {flow.failure()}"
    finally:
        target_cluster.faults.heal()
        plaintext_cluster.faults.heal()

    got = on_target()
    repeats = len(got) - len(set(got))
    print(f"{len(sent)} records sent, {len(got)} read on the target, {repeats} repeat(s)")
    assert_each_record_once_in_order(f"onprem.{topic}", got, sent, at_least_once=True)
