"""A flow switched between throughput and real-time mode goes on where the other mode stopped: nothing copied twice,
nothing skipped, in either direction."""

from __future__ import annotations

import time

from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

ROUND = 500


def test_switching_mode_back_and_forth_copies_each_record_once_in_order(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic = f"modes-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 3})
    sent: list[Record] = []
    for n, mode in enumerate(("throughput", "realtime", "throughput", "realtime")):
        now_ms = int(time.time() * 1000)
        wave = [Record(i % 3, f"{n}-{i}".encode(), f"v{n}-{i}".encode(), (), now_ms + i) for i in range(ROUND)]
        produce(plaintext_cluster.client, topic, wave)
        sent += wave
        config = one_flow_config(
            plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="sw", target_alias="to",
            emit_heartbeats=False, mode=mode,
        )  # fmt: skip
        mirror = Mirror(spark, parse_config(config))
        mirror.run_available_now()
        assert sum(mirror.flows[0].totals.records.values()) == ROUND, f"round {n} ({mode}) copied another count"
    got = read_all(source_cluster.client, f"sw.{topic}", expected=len(sent))
    assert_each_record_once_in_order(f"sw.{topic}", got, sent)
