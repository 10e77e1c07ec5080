"""The mirror's loop never waits on a batch for good: a batch in flight holds its flow's lock, and one that hangs
(a stuck task) would otherwise keep topic sync, and with it the loop that hears SIGTERM, waiting forever."""

from __future__ import annotations

import threading
import time

import pytest

from bench.testbed.clients import create_topics
from spark_app import runner
from spark_app.config import parse_config
from spark_app.metrics import MirrorMetrics
from spark_app.throughput import ThroughputRunner
from tests.support.mirror_config import one_flow_config

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_topic_sync_and_catch_ups_leave_their_round_to_the_next_while_a_batch_holds_the_lock(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    monkeypatch.setattr(runner, "BETWEEN_COPIES_WAIT_S", 0.5)
    topic = f"held-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    entry = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", emit_heartbeats=False)
    config = parse_config(entry)
    flow = ThroughputRunner(spark, config, config.flows[0], MirrorMetrics())
    held, release = threading.Event(), threading.Event()

    def stuck_batch() -> None:  # stands in for a batch whose Spark job never ends
        with flow.lock:
            held.set()
            release.wait(60)

    batch = threading.Thread(target=stuck_batch, daemon=True)
    batch.start()
    held.wait(10)
    try:
        began = time.monotonic()
        assert flow.sync_topics() == flow.subscription == (), "its subscription as it was: nothing applied"
        flow.catch_up()
        assert time.monotonic() - began < 30, "the loop came back to hear a stop"
    finally:
        release.set()
        batch.join(10)
    assert flow.sync_topics() == ((topic, 2),), "the next round, with the lock free, applies topic sync"
