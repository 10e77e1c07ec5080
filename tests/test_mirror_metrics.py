"""The metrics endpoint of a running mirror, scraped over HTTP while it copies two waves of records.

The source is a cluster of the test's own: heartbeats are on, and they create `heartbeats` on the source, which
other tests' topic listings on the shared source cluster must not see.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable

import pytest

from bench.testbed.clients import Record, commit, create_topics, produce, read_all
from bench.testbed.ports import free_port
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from spark_app.policy import HEARTBEATS_TOPIC, checkpoints_topic, offset_syncs_topic, target_topic
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.support.running import mirror_running
from tests.test_metrics import scrape

PARTITIONS = 4
WAVE_1 = 400  # stamped now by the producer
WAVE_2 = 4_000  # stamped two hours ago: every one of them is older than the top latency bucket (1 h)
PER_TRIGGER = 200  # so wave 2 takes at least 20 batches, long enough for lag to be seen before it drains
WAIT_S = 300.0
CHECKPOINT_INTERVAL_S = 2.0
HEARTBEAT_INTERVAL_S = 1.0
# A checkpoint round stamps the group's checkpoint every interval, and a heartbeat reaches the target one trigger and
# batch after it is emitted: each time, the age served goes down. An age that stopped being refreshed would only grow.
REFRESHES = 3  # seen before wave 2, for each age; and for the checkpoint's, twice more once wave 2 was sent
CHECKPOINT_AGE = "mirrorkit_checkpoint_age_seconds"
HEARTBEAT_AGE = "mirrorkit_heartbeat_age_seconds"


def wave(count: int, timestamp_ms: int | None, seed: int) -> list[Record]:
    return [
        Record(i % PARTITIONS, f"k{seed}-{i}".encode(), bytes(i % 97) * (1 + i % 5), (), timestamp_ms)
        for i in range(count)
    ]


class Scraper:
    """Reads the mirror's endpoint every half second while a test waits, and keeps every scrape in `history`; fails
    with the mirror's own error if it died."""

    def __init__(self, port: int, mirror_errors: list[BaseException]) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.mirror_errors = mirror_errors
        self.history: list[dict] = []

    def until(self, what: str, condition: Callable[[dict], bool]) -> dict:
        """The first scrape for which `condition` holds."""
        last: dict = {}

        def holds() -> bool:
            nonlocal last
            last = self._scrape() or last
            return bool(last) and bool(condition(last))

        try:
            wait_until(holds, what, WAIT_S)
        except AssertionError as err:
            figures = {k[0]: v for k, v in last.items() if "latency" not in k[0]}
            raise AssertionError(f"{err}; last scrape: {figures}") from None
        return last

    def _scrape(self) -> dict | None:
        """One scrape, or None while the endpoint is not listening yet."""
        assert not self.mirror_errors, f"the mirror stopped: {self.mirror_errors[0]!r}"
        try:
            with urllib.request.urlopen(self.url, timeout=10) as response:
                got = scrape(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            return None
        self.history.append(got)
        return got


def total(got: dict, name: str, **where: str) -> float:
    return sum(v for (n, ls), v in got.items() if n == name and ls >= frozenset(where.items()))


def bucket(got: dict, le: str, **where: str) -> float:
    return total(got, "mirrorkit_replication_latency_seconds_bucket", le=le, **where)


def series(got: dict, name: str, **where: str) -> list[float]:
    """The values of every series of `name` whose labels include `where`."""
    return [v for (n, ls), v in got.items() if n == name and ls >= frozenset(where.items())]


def refreshes(scrapes: list[dict], name: str, **where: str) -> int:
    """How often the age `name` went down from one scrape to the next: each time, what it dates was written anew."""
    ages = [a for g in scrapes for a in series(g, name, **where)]
    return sum(1 for before, after in zip(ages, ages[1:], strict=False) if after < before)


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_running_mirror_serves_figures_that_move_with_each_wave_and_lag_that_drains(
    mode, spark, own_cluster, target_cluster, tmp_path, unique
):
    source = own_cluster(f"metrics-{unique[-8:]}", "msk-scram")
    alias = f"src{unique[-8:]}"  # its own names on the shared target: no other test's heartbeats or checkpoints
    live, held, group = f"live-{unique}", f"held-{unique}", f"app-{unique}"
    port = free_port()
    config = parse_config(
        one_flow_config(
            source,
            target_cluster,
            [live, held],
            tmp_path / "ckpt",
            source_alias=alias,
            target_alias="eh",
            groups={"include": [group]},
            max_records_per_trigger=PER_TRIGGER,
            metrics_port=port,
            checkpoint_interval_s=CHECKPOINT_INTERVAL_S,
            heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
            mode=mode,
        )
    )
    (flow_config,) = config.flows
    create_topics(source.admin, {live: PARTITIONS, held: 1})
    # no hub for `held`: it is quarantined
    create_topics(
        target_cluster.admin,
        {target_topic(flow_config, live): PARTITIONS, target_topic(flow_config, HEARTBEATS_TOPIC): 1},
    )
    compacted = [offset_syncs_topic(flow_config), checkpoints_topic(flow_config)]
    create_topics(target_cluster.admin, dict.fromkeys(compacted, 1), {"cleanup.policy": "compact"})
    first = wave(WAVE_1, None, seed=1)
    produce(source.client, live, first)
    commit(source.client, group, live, dict.fromkeys(range(PARTITIONS), WAVE_1 // PARTITIONS // 2))
    mirror = Mirror(spark, config)
    flow = flow_config.name
    where = {"flow": flow, "topic": live}
    checkpoint_age = {"flow": flow, "group": group}
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
        # The group's checkpoint and the heartbeats: served, and refreshed again and again.
        scraper.until(
            "checkpoint age and heartbeat age served",
            lambda g: series(g, CHECKPOINT_AGE, **checkpoint_age) and series(g, HEARTBEAT_AGE, flow=flow),
        )
        fresh_from = len(scraper.history)
        scraper.until(
            f"the checkpoint age and the heartbeat age each refreshed {REFRESHES} times",
            lambda _: (
                refreshes(scraper.history[fresh_from:], CHECKPOINT_AGE, **checkpoint_age) >= REFRESHES
                and refreshes(scraper.history[fresh_from:], HEARTBEAT_AGE, flow=flow) >= REFRESHES
            ),
        )
        window = scraper.history[fresh_from:]
        old_ms = int(time.time() * 1000) - 2 * 3_600_000
        second = wave(WAVE_2, old_ms, seed=2)
        produce(source.client, live, second)
        wave_2_from = len(scraper.history)
        after_2 = scraper.until(
            "wave 2 mirrored with lag 0 on every partition",
            lambda g: (
                total(g, "mirrorkit_records_mirrored_total", **where) == WAVE_1 + WAVE_2
                and total(g, "mirrorkit_replication_latency_seconds_count", **where) == WAVE_1 + WAVE_2
                and total(g, "mirrorkit_lag_records", **where) == 0
            ),
        )
        # The checkpoint loop runs beside the copy: it went on through wave 2 and after it.
        scraper.until(
            "the checkpoint age refreshed twice since wave 2 was sent",
            lambda _: refreshes(scraper.history[wave_2_from:], CHECKPOINT_AGE, **checkpoint_age) >= 2,
        )

    # Records and bytes, per partition, are exactly what was produced, and what the target holds.
    sent = first + second
    on_target = read_all(target_cluster.client, target_topic(flow_config, live), expected=len(sent))
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
    assert bucket(after_1, "3600.0", **where) == bucket(after_1, "+Inf", **where) == WAVE_1
    assert bucket(after_2, "3600.0", **where) == WAVE_1
    assert bucket(after_2, "+Inf", **where) - bucket(after_1, "+Inf", **where) == WAVE_2
    latency_sum = "mirrorkit_replication_latency_seconds_sum"
    assert total(after_2, latency_sum, **where) - total(after_1, latency_sum, **where) >= WAVE_2 * 2 * 3600

    # Lag rose while wave 2 was being copied (in batches of PER_TRIGGER; real time copies it faster than the lag
    # poller looks) and fell back to 0.
    max_lag = max(total(g, "mirrorkit_lag_records", **where) for g in scraper.history[wave_2_from:])
    assert 0 < max_lag <= WAVE_2 if mode == "throughput" else max_lag <= WAVE_2
    assert all(total(after_2, "mirrorkit_lag_records", **where, partition=str(p)) == 0 for p in range(PARTITIONS))

    assert total(after_2, "mirrorkit_last_batch_timestamp_seconds", flow=flow) > total(
        after_1, "mirrorkit_last_batch_timestamp_seconds", flow=flow
    )
    assert total(after_2, "mirrorkit_quarantined_topics", flow=flow) == 1
    assert total(after_2, "mirrorkit_errors_total", flow=flow, kind="quarantined") == 1
    assert total(after_2, "mirrorkit_records_mirrored_total", flow=flow, topic=held) == 0  # held, never written

    # Checkpoint and heartbeat ages: one series each on every scrape, the checkpoint's from the window on through all
    # of wave 2, the heartbeat's over the window (heartbeats queue behind a backlog like any record, which is what
    # makes their age a liveness signal). How old they grew is printed, not asserted: a slow machine only slows them.
    checkpoint_ages = [series(g, CHECKPOINT_AGE, **checkpoint_age) for g in scraper.history[fresh_from:]]
    heartbeat_ages = [series(g, HEARTBEAT_AGE, flow=flow) for g in window]
    assert all(len(ages) == 1 for ages in checkpoint_ages + heartbeat_ages)
    print(
        f"\nAges: checkpoint at most {max(a for (a,) in checkpoint_ages):.1f} s over {len(checkpoint_ages)} scrapes"
        f" ({refreshes(scraper.history[fresh_from:], CHECKPOINT_AGE, **checkpoint_age)} refreshes), heartbeat at most"
        f" {max(a for (a,) in heartbeat_ages):.1f} s over {len(window)} scrapes"
        f" ({refreshes(window, HEARTBEAT_AGE, flow=flow)} refreshes)"
    )
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(scraper.url, timeout=5)  # the endpoint closed with the mirror
    source.stop()
