"""The metrics endpoint of a running mirror, scraped over HTTP while it copies two waves of records."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import pytest

from spark_app.config import parse_config
from spark_app.stream import Mirror
from tests.support.clients import Record, create_topics, produce, read_all
from tests.support.mirror_config import cluster_entry, free_port
from tests.support.running import mirror_running
from tests.test_metrics import scrape

PARTITIONS = 4
WAVE_1 = 400  # stamped now by the producer
WAVE_2 = 4_000  # stamped two hours ago: every one of them is older than the top latency bucket (1 h)
PER_TRIGGER = 200  # so wave 2 takes at least 20 batches, long enough for lag to be seen before it drains
WAIT_S = 300.0


def wave(count: int, timestamp_ms: int | None, seed: int) -> list[Record]:
    return [
        Record(i % PARTITIONS, f"k{seed}-{i}".encode(), bytes(i % 97) * (1 + i % 5), (), timestamp_ms)
        for i in range(count)
    ]


class Scraper:
    """Reads the mirror's endpoint until a condition holds; fails with the mirror's own error if it died."""

    def __init__(self, port: int, mirror_errors: list[BaseException]) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.mirror_errors = mirror_errors
        self.max_lag = 0.0

    def until(self, what: str, condition: Callable[[dict], bool]) -> dict:
        deadline = time.monotonic() + WAIT_S
        got: dict = {}
        while time.monotonic() < deadline:
            assert not self.mirror_errors, f"the mirror stopped: {self.mirror_errors[0]!r}"
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    got = scrape(response.read().decode())
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.5)  # not listening yet
                continue
            self.max_lag = max(self.max_lag, total(got, "mirrorkit_lag_records"))
            if condition(got):
                return got
            time.sleep(0.5)
        figures = {k[0]: v for k, v in got.items() if "latency" not in k[0]}
        raise AssertionError(f"no {what} within {WAIT_S:.0f}s; last scrape: {figures}")


def total(got: dict, name: str, **where: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and ls >= frozenset(where.items()))


def bucket(got: dict, le: str) -> float:
    return total(got, "mirrorkit_replication_latency_seconds_bucket", le=le)


def test_running_mirror_serves_figures_that_move_with_each_wave_and_lag_that_drains(
    spark, source_cluster, target_cluster, tmp_path, unique
):
    live, held = f"live-{unique}", f"held-{unique}"
    create_topics(source_cluster.admin, {live: PARTITIONS, held: 1})
    create_topics(target_cluster.admin, {f"msk.{live}": PARTITIONS})  # no hub for `held`: it is quarantined
    first = wave(WAVE_1, None, seed=1)
    produce(source_cluster.client, live, first)
    port = free_port()
    config = parse_config(
        {
            "clusters": [cluster_entry(source_cluster, "msk"), cluster_entry(target_cluster, "eh")],
            "flows": [
                {
                    "source": "msk",
                    "target": "eh",
                    "topics": {"include": [live, held]},
                    "checkpoint_location": str(tmp_path / "ckpt"),
                    "max_records_per_trigger": PER_TRIGGER,
                    "emit_heartbeats": False,  # no `heartbeats` topic on the shared source cluster
                }
            ],
            "metrics_port": port,
        }
    )
    mirror = Mirror(spark, config)
    flow = "msk->eh"
    where = {"flow": flow, "topic": live}
    with mirror_running(mirror) as errors:
        scraper = Scraper(port, errors)
        after_1 = scraper.until(
            "wave 1 mirrored with lag 0 on every partition",
            lambda g: (
                total(g, "mirrorkit_records_mirrored_total", **where) == WAVE_1
                and sum(1 for n, ls in g if n == "mirrorkit_lag_records" and ("topic", live) in ls) == PARTITIONS
                and total(g, "mirrorkit_lag_records", **where) == 0
            ),
        )
        old_ms = int(time.time() * 1000) - 2 * 3_600_000
        second = wave(WAVE_2, old_ms, seed=2)
        produce(source_cluster.client, live, second)
        scraper.max_lag = 0.0
        after_2 = scraper.until(
            "wave 2 mirrored with lag 0 on every partition",
            lambda g: (
                total(g, "mirrorkit_records_mirrored_total", **where) == WAVE_1 + WAVE_2
                and total(g, "mirrorkit_replication_latency_seconds_count", **where) == WAVE_1 + WAVE_2
                and total(g, "mirrorkit_lag_records", **where) == 0
            ),
        )

    # Records and bytes, per partition, are exactly what was produced, and what the target holds.
    sent = first + second
    on_target = read_all(target_cluster.client, f"msk.{live}", expected=len(sent))
    assert len(on_target) == WAVE_1 + WAVE_2
    per_partition = Counter(r.partition for r in sent)
    bytes_per_partition = Counter()
    for r in sent:
        bytes_per_partition[r.partition] += len(r.key) + len(r.value)
    for p in range(PARTITIONS):
        assert total(after_1, "mirrorkit_records_mirrored_total", **where, partition=str(p)) == WAVE_1 / PARTITIONS
        assert total(after_2, "mirrorkit_records_mirrored_total", **where, partition=str(p)) == per_partition[p]
        assert total(after_2, "mirrorkit_bytes_mirrored_total", **where, partition=str(p)) == bytes_per_partition[p]
    assert total(after_2, "mirrorkit_bytes_mirrored_total") > total(after_1, "mirrorkit_bytes_mirrored_total") > 0

    # Latency: wave 1 was copied within the hour, every wave-2 record was two hours old when it landed.
    assert bucket(after_1, "3600.0") == bucket(after_1, "+Inf") == WAVE_1
    assert bucket(after_2, "3600.0") == WAVE_1
    assert bucket(after_2, "+Inf") - bucket(after_1, "+Inf") == WAVE_2
    latency_sum = "mirrorkit_replication_latency_seconds_sum"
    assert total(after_2, latency_sum) - total(after_1, latency_sum) >= WAVE_2 * 2 * 3600

    # Lag rose while wave 2 was being copied and fell back to 0.
    assert 0 < scraper.max_lag <= WAVE_2
    assert all(total(after_2, "mirrorkit_lag_records", **where, partition=str(p)) == 0 for p in range(PARTITIONS))

    assert total(after_2, "mirrorkit_last_batch_timestamp_seconds", flow=flow) > total(
        after_1, "mirrorkit_last_batch_timestamp_seconds", flow=flow
    )
    assert total(after_2, "mirrorkit_quarantined_topics", flow=flow) == 1
    assert total(after_2, "mirrorkit_errors_total", flow=flow, kind="quarantined") == 1
    assert total(after_2, "mirrorkit_records_mirrored_total", flow=flow, topic=held) == 0  # held, never written
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(scraper.url, timeout=5)  # the endpoint closed with the mirror
