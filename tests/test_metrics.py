"""The metrics module on its own: values, labels and the text format, read back with Prometheus' own parser."""

from __future__ import annotations

import dataclasses
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.testbed.clients import Record, create_topics, produce
from bench.testbed.kafka_cluster import cluster_entry
from infra.k8s import series
from spark_app import clients
from spark_app.config import ClusterConfig
from spark_app.metrics import LagPoller, LagSource, MetricsPortError, MirrorMetrics
from spark_app.ranges import LATENCY_BUCKETS_S, Landing
from tests.support.clock import Clock

FLOW = "msk->eh"
LANDED_COLUMNS = [f.name for f in dataclasses.fields(Landing)]


def landing_row(topic: str, partition: int, **figures) -> SimpleNamespace:
    """A landing row with exactly the writer's columns; unknown names fail, so this cannot drift from the writer."""
    row = dict.fromkeys(LANDED_COLUMNS, 0) | {
        "topic": topic,
        "partition": partition,
        "latency_counts": [0] * (len(LATENCY_BUCKETS_S) + 1),
        "latency_sum_ms": 0.0,
    }
    unknown = set(figures) - set(row)
    assert not unknown, f"not landing columns: {unknown}"
    return SimpleNamespace(**(row | figures))


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition, keyed by sample name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**kv: str) -> frozenset:
    return frozenset(kv.items())


def test_landing_rows_add_up_per_partition_and_latency_becomes_a_cumulative_histogram():
    clock = Clock(1_700_000_000.0)
    metrics = MirrorMetrics(clock)
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    counts[0], counts[6], counts[-1] = 3, 2, 1  # 3 under 10 ms, 2 in (0.5 s, 1 s], 1 over an hour
    metrics.batch_landed(
        FLOW,
        [
            landing_row("orders", 0, records=6, bytes=600, latency_counts=counts, latency_sum_ms=7_201_500.0),
            landing_row("orders", 1, records=2, bytes=20, dead_lettered=1),
        ],
    )
    clock.now += 5
    metrics.batch_landed(FLOW, [landing_row("orders", 0, records=4, bytes=40, latency_counts=counts)])

    got = scrape(metrics.text())
    p0 = labels(flow=FLOW, topic="orders", partition="0")
    p1 = labels(flow=FLOW, topic="orders", partition="1")
    assert got[("mirrorkit_records_mirrored_total", p0)] == 10
    assert got[("mirrorkit_records_mirrored_total", p1)] == 2
    assert got[("mirrorkit_bytes_mirrored_total", p0)] == 640
    assert got[("mirrorkit_dead_lettered_total", p1)] == 1
    assert ("mirrorkit_dead_lettered_total", p0) not in got
    assert got[("mirrorkit_last_batch_timestamp_seconds", labels(flow=FLOW))] == 1_700_000_005.0

    histogram = {
        dict(key[1])["le"]: value
        for key, value in got.items()
        if key[0] == "mirrorkit_replication_latency_seconds_bucket"
    }
    assert histogram["0.01"] == 6
    assert histogram["0.5"] == 6
    assert histogram["1.0"] == 10
    assert histogram["3600.0"] == 10
    assert histogram["+Inf"] == 12
    assert len(histogram) == len(LATENCY_BUCKETS_S) + 1
    by_topic = labels(flow=FLOW, topic="orders")
    assert got[("mirrorkit_replication_latency_seconds_count", by_topic)] == 12
    assert got[("mirrorkit_replication_latency_seconds_sum", by_topic)] == pytest.approx(7201.5)


def test_checkpoint_and_heartbeat_ages_grow_between_scrapes_and_never_go_back():
    clock = Clock(1_000.0)
    metrics = MirrorMetrics(clock)
    metrics.checkpoint_written(FLOW, "billing", 990.0)
    metrics.checkpoint_written(FLOW, "billing", 980.0)  # an older write reported late does not rejuvenate it
    metrics.checkpoint_written(FLOW, "search", 1_000.0)
    metrics.heartbeat_seen(FLOW, 997.5)

    first = scrape(metrics.text())
    clock.now = 1_030.0
    second = scrape(metrics.text())

    billing, search = labels(flow=FLOW, group="billing"), labels(flow=FLOW, group="search")
    assert first[("mirrorkit_checkpoint_age_seconds", billing)] == 10.0
    assert first[("mirrorkit_checkpoint_age_seconds", search)] == 0.0
    assert second[("mirrorkit_checkpoint_age_seconds", billing)] == 40.0
    assert first[("mirrorkit_heartbeat_age_seconds", labels(flow=FLOW))] == 2.5
    assert second[("mirrorkit_heartbeat_age_seconds", labels(flow=FLOW))] == 32.5
    metrics.checkpoint_written(FLOW, "search", None)  # the group is gone: its series goes too
    assert ("mirrorkit_checkpoint_age_seconds", search) not in scrape(metrics.text())
    metrics.heartbeat_seen(FLOW, 1_029.0)
    assert scrape(metrics.text())[("mirrorkit_heartbeat_age_seconds", labels(flow=FLOW))] == 1.0


def test_quarantine_is_a_gauge_per_flow_and_each_topic_entering_it_counts_one_error():
    metrics = MirrorMetrics()
    metrics.topics_quarantined(FLOW, {"a": "no hub", "b": "too few partitions"})
    metrics.topics_quarantined(FLOW, {"a": "no hub", "b": "too few partitions"})  # still there: no new error
    metrics.topics_quarantined(FLOW, {"b": "too few partitions"})
    metrics.topics_quarantined(FLOW, {"b": "too few partitions", "c": "no hub"})
    metrics.error(FLOW, "lag_poll")
    metrics.set_lag(FLOW, "a", 3, -2)  # a position past a truncated end never shows as negative lag

    got = scrape(metrics.text())
    assert got[("mirrorkit_quarantined_topics", labels(flow=FLOW))] == 2
    assert got[("mirrorkit_errors_total", labels(flow=FLOW, kind="quarantined"))] == 3
    assert got[("mirrorkit_errors_total", labels(flow=FLOW, kind="lag_poll"))] == 1
    assert got[("mirrorkit_lag_records", labels(flow=FLOW, topic="a", partition="3"))] == 0


def test_dr_topics_the_dr_sync_cannot_use_are_a_gauge_per_flow_that_goes_back_to_zero():
    metrics = MirrorMetrics()
    metrics.dr_topics_unusable(FLOW, {"mm2-offset-syncs.dr.internal": "not compacted", "heartbeats": "denied"})
    assert scrape(metrics.text())[("mirrorkit_dr_unusable_topics", labels(flow=FLOW))] == 2
    metrics.dr_topics_unusable(FLOW, {})  # a later start found them usable
    assert scrape(metrics.text())[("mirrorkit_dr_unusable_topics", labels(flow=FLOW))] == 0


def test_every_series_the_deployed_alerts_and_dashboard_read_is_one_the_mirror_serves():
    """infra names the series its rules and panels read (infra.k8s.series); each must be served under that name."""
    metrics = MirrorMetrics()
    counts = [1] + [0] * len(LATENCY_BUCKETS_S)
    metrics.batch_landed(FLOW, [landing_row("t", 0, records=1, latency_counts=counts, latency_sum_ms=5.0)])
    metrics.set_lag(FLOW, "t", 0, 1)
    metrics.checkpoint_written(FLOW, "g", 1.0)
    metrics.heartbeat_seen(FLOW, 1.0)
    metrics.topics_quarantined(FLOW, {"q": "no hub"})
    metrics.dr_topics_unusable(FLOW, {})
    served = {name for name, _ in scrape(metrics.text())}
    named = {v for k, v in vars(series).items() if k.endswith("_METRIC")}
    assert len(named) >= 9
    missing = {n for n in named if n not in served and f"{n}_bucket" not in served}
    assert not missing, f"infra.k8s.series names series the mirror does not serve: {sorted(missing)}"


def test_series_of_a_topic_that_leaves_the_selection_are_removed_and_stay_gone():
    metrics = MirrorMetrics()
    counts = [1] + [0] * len(LATENCY_BUCKETS_S)
    rows = [
        landing_row(t, p, records=2, bytes=20, dead_lettered=1, latency_counts=counts)
        for t in ("kept", "left")
        for p in (0, 1)
    ]
    metrics.topics_selected(FLOW, {"kept", "left"})
    metrics.batch_landed(FLOW, rows)
    metrics.batch_landed("other->flow", [landing_row("left", 0, records=5, bytes=5)])
    for t in ("kept", "left"):
        metrics.set_lag(FLOW, t, 0, 9)

    def topics(flow: str) -> dict[str, set[str]]:
        """Per series name, the topics it has samples for in `flow`."""
        out: dict[str, set[str]] = {}
        for family in text_string_to_metric_families(metrics.text()):
            for sample in family.samples:
                if sample.labels.get("flow") == flow and "topic" in sample.labels:
                    out.setdefault(family.name, set()).add(sample.labels["topic"])
        return out

    families = ("mirrorkit_records_mirrored", "mirrorkit_bytes_mirrored", "mirrorkit_dead_lettered",
                "mirrorkit_lag_records", "mirrorkit_replication_latency_seconds")  # fmt: skip
    assert {f: topics(FLOW).get(f) for f in families} == dict.fromkeys(families, {"kept", "left"})

    metrics.topics_selected(FLOW, {"kept"})
    assert {f: topics(FLOW).get(f) for f in families} == dict.fromkeys(families, {"kept"})
    # A batch or a lag poll that was under way when the topic left does not bring its series back.
    metrics.batch_landed(FLOW, rows)
    metrics.set_lag(FLOW, "left", 0, 9)
    assert {f: topics(FLOW).get(f) for f in families} == dict.fromkeys(families, {"kept"})
    assert (
        scrape(metrics.text())[("mirrorkit_records_mirrored_total", labels(flow=FLOW, topic="kept", partition="1"))]
        == 4
    )
    assert topics("other->flow")["mirrorkit_records_mirrored"] == {"left"}, "another flow's series stay"
    # Selected again (say, a re-created topic): it counts from zero.
    metrics.topics_selected(FLOW, {"kept", "left"})
    metrics.batch_landed(FLOW, [landing_row("left", 0, records=3, bytes=3)])
    assert (
        scrape(metrics.text())[("mirrorkit_records_mirrored_total", labels(flow=FLOW, topic="left", partition="0"))]
        == 3
    )


def test_two_mirrors_in_one_process_serve_their_own_figures_on_free_ports():
    first, second = MirrorMetrics(), MirrorMetrics()
    first.batch_landed(FLOW, [landing_row("t", 0, records=1, bytes=1)])
    second.batch_landed(FLOW, [landing_row("t", 0, records=7, bytes=70)])
    key = ("mirrorkit_records_mirrored_total", labels(flow=FLOW, topic="t", partition="0"))
    with first.serve(0) as one, second.serve(0) as two:
        assert one.port != two.port
        for server, expected in ((one, 1), (two, 7)):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                assert scrape(response.read().decode())[key] == expected


def test_a_taken_metrics_port_fails_naming_the_setting_and_is_free_again_after_close():
    metrics = MirrorMetrics()
    with metrics.serve(0) as server:
        with pytest.raises(MetricsPortError, match=rf"metrics_port: cannot serve metrics on 0\.0\.0\.0:{server.port}"):
            MirrorMetrics().serve(server.port)
        port = server.port
    with metrics.serve(port) as again:
        assert again.port == port


class EndOffsets:
    """An admin client that answers ListOffsets(latest) from a dict, as confluent-kafka's futures do."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends
        self.asked: set[tuple[str, int]] = set()

    def list_offsets(self, wanted, **_options):
        self.asked = {(tp.topic, tp.partition) for tp in wanted}
        return {tp: SimpleNamespace(result=lambda tp=tp: SimpleNamespace(offset=self.ends[(tp.topic, tp.partition)]))
                for tp in wanted}  # fmt: skip


def test_a_held_partitions_lag_counts_from_its_first_held_offset_and_keeps_growing(monkeypatch):
    ends = {("t", 0): 110, ("t", 1): 50, ("q", 0): 30}
    admin = EndOffsets(ends)
    monkeypatch.setattr(clients, "admin", lambda _cluster: admin)
    cluster = ClusterConfig(alias="src", bootstrap_servers="src.example:9092", profile="kafka")
    # The query has read every partition to its end, past the held records of t[0] (from 100) and of q, a topic
    # quarantined since its first record and not read by the query yet.
    read = {("t", 0): 110, ("t", 1): 50}
    held: dict[str, dict[int, int]] = {"t": {0: 100}, "q": {0: 0}}
    metrics = MirrorMetrics()
    poller = LagPoller(metrics, [LagSource(FLOW, cluster, lambda: read, lambda: held)])

    def lag(topic: str, partition: int) -> float:
        return scrape(metrics.text())[
            ("mirrorkit_lag_records", labels(flow=FLOW, topic=topic, partition=str(partition)))
        ]

    poller.poll()
    assert (lag("t", 0), lag("t", 1), lag("q", 0)) == (10, 0, 30)
    ends |= {("t", 0): 125, ("t", 1): 60, ("q", 0): 31}  # more records while held; the query reads them too
    read |= {("t", 0): 125, ("t", 1): 60, ("q", 0): 31}
    poller.poll()
    assert (lag("t", 0), lag("t", 1), lag("q", 0)) == (25, 0, 31)
    held.clear()  # caught up: lag is where the query reads again
    poller.poll()
    assert (lag("t", 0), lag("t", 1), lag("q", 0)) == (0, 0, 0)
    metrics.topics_selected(FLOW, {"t"})  # q left the selection: its end offsets are no longer asked for
    poller.poll()
    assert admin.asked == {("t", 0), ("t", 1)}
    assert not any(dict(key[1]).get("topic") == "q" for key in scrape(metrics.text()))


def test_lag_is_the_source_end_offset_minus_the_next_offset_to_copy(plaintext_cluster, unique):
    topic = f"lag-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    produce(plaintext_cluster.client, topic, [Record(0, None, b"x")] * 10 + [Record(1, None, b"y")] * 3)
    cluster = ClusterConfig(**cluster_entry(plaintext_cluster, "onprem"))
    metrics = MirrorMetrics()
    gone = f"gone-{unique}"
    positions = {(topic, 0): 4, (topic, 1): 3, (gone, 0): 0}

    LagPoller(metrics, [LagSource(FLOW, cluster, lambda: positions)]).poll()

    got = scrape(metrics.text())
    assert got[("mirrorkit_lag_records", labels(flow=FLOW, topic=topic, partition="0"))] == 6
    assert got[("mirrorkit_lag_records", labels(flow=FLOW, topic=topic, partition="1"))] == 0
    assert ("mirrorkit_lag_records", labels(flow=FLOW, topic=gone, partition="0")) not in got
    assert got[("mirrorkit_errors_total", labels(flow=FLOW, kind="lag_poll"))] == 1
