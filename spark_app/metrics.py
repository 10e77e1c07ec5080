"""What the mirror reports about itself: per-flow totals, and Prometheus metrics served on `metrics_port`.

`FlowTotals` is what a flow has done since start (the `run` summary, the demo and tests read it). Each `Mirror`
owns one `MirrorMetrics` with a private registry, so two mirrors in one process never share a series. Figures come
from three places:
- the landing rows the writer hands back per batch (records, bytes, dead letters and a replication-latency
  histogram bucketed per record on the worker, at delivery time);
- `LagPoller`, a driver thread that compares each source partition's end offset with the first offset the target
  still lacks (where the copy reads next, or a quarantined partition's first held offset);
- the DR loop, which reports when it wrote a checkpoint and when a mirrored heartbeat arrived. Ages are computed
  at scrape time, so a loop that stops reporting shows as a growing age rather than a frozen one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from . import clients
from .clients import Partition, PartitionOffsets
from .config import ClusterConfig, ConfigError
from .ranges import LATENCY_BUCKETS_S, Landing

log = logging.getLogger(__name__)

LAG_POLL_INTERVAL_S = 5.0
LIST_OFFSETS_TIMEOUT_S = 15.0

Positions = Mapping[Partition, int]  # (source topic, partition) -> next offset the mirror will copy
Held = Mapping[str, Mapping[int, int]]  # source topic -> partition -> first offset not written (quarantined)


@dataclass
class FlowTotals:
    """What a flow has copied since start (its holds and losses are its ledger's): in all, and per source topic for
    the topics its ledger still knows. The ledger forgets a topic gone from the source (spark_app.ledger), and its
    figures here with it, so they do not pile up with every topic ever copied."""

    records: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    records_total: int = 0
    bytes_total: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    batches: int = 0
    recopied: int = 0  # real-time mode: records that landed after the last saved positions, copied again on restart

    @property
    def handled(self) -> int:
        """Source records done with: written, dropped (loop prevention) or dead-lettered; not those held."""
        return self.records_total + self.dropped + self.dead_lettered

    def mean_record_bytes(self) -> dict[str, float]:
        """Per topic with a record written, its mean record size (key and value) so far."""
        return {t: self.bytes.get(t, 0) / n for t, n in self.records.items() if n}

    def add(self, landed: Iterable[Landing]) -> None:
        """Count one batch (or catch-up) of landings."""
        self.batches += 1
        for row in landed:
            self.records[row.topic] = self.records.get(row.topic, 0) + row.records
            self.bytes[row.topic] = self.bytes.get(row.topic, 0) + row.bytes
            self.records_total += row.records
            self.bytes_total += row.bytes
            self.dropped += row.dropped
            self.dead_lettered += row.dead_lettered

    def forget(self, topics: Collection[str]) -> None:
        """Drop the per-topic figures of `topics`; the totals keep what they copied."""
        for topic in topics:
            self.records.pop(topic, None)
            self.bytes.pop(topic, None)


class MetricsPortError(ConfigError):
    """The endpoint cannot listen on the configured port; the remedy is another `metrics_port`."""


class MirrorMetrics:
    """Every series the mirror exports, and the calls that feed them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.registry = CollectorRegistry()
        self._clock = clock
        self._lock = threading.Lock()
        self._latency: dict[tuple[str, str], tuple[list[int], float]] = {}  # (flow, topic) -> (counts, sum s)
        self._checkpoints: dict[tuple[str, str], float] = {}  # (flow, group) -> unix time written
        self._heartbeats: dict[str, float] = {}  # flow -> newest heartbeat's unix time
        self._quarantined: dict[str, frozenset[str]] = {}
        self._selected: dict[str, frozenset[str]] = {}  # flow -> the topics it selects now, once topic sync told
        self._labelled: dict[str, set[tuple[str, str]]] = {}  # flow -> (topic, partition) with a series
        partition = ("flow", "topic", "partition")
        r = self.registry
        self.records = Counter("mirrorkit_records_mirrored", "Records written to the target.", partition, registry=r)
        self.bytes = Counter(
            "mirrorkit_bytes_mirrored", "Key and value bytes written to the target.", partition, registry=r
        )
        self.dead_lettered = Counter(
            "mirrorkit_dead_lettered", "Records diverted to the flow's dead-letter topic.", partition, registry=r
        )
        self.lag = Gauge(
            "mirrorkit_lag_records",
            "Source end offset minus the first offset the target still lacks.",
            partition,
            registry=r,
        )
        self.errors = Counter("mirrorkit_errors", "Errors by kind.", ("flow", "kind"), registry=r)
        self.landed_ahead = Counter(
            "mirrorkit_records_landed_ahead",
            "Records that landed on the target ahead of an earlier record of their partition the target refused"
            " (a flow without transactions): their first copies are out of source order.",
            partition,
            registry=r,
        )
        self.quarantined = Gauge(
            "mirrorkit_quarantined_topics",
            "Topics the flow holds back because the target cannot take them.",
            ("flow",),
            registry=r,
        )
        self.last_batch = Gauge(
            "mirrorkit_last_batch_timestamp_seconds", "Unix time the flow last finished a batch.", ("flow",), registry=r
        )
        self.dr_unusable = Gauge(
            "mirrorkit_dr_unusable_topics",
            "The flow's DR topics (offset syncs, checkpoints, heartbeats) its DR sync cannot use, so it keeps no such"
            " state: failover would translate nothing the topic should hold. The log says why.",
            ("flow",),
            registry=r,
        )
        self.core = Gauge(
            "mirrorkit_copy_core_info",
            "1 for the core that copies the flow's records (spark_app.copy_wing.choice), and what it copies.",
            ("flow", "core", "copies"),
            registry=r,
        )
        r.register(self)  # `collect` adds the series computed at scrape time

    def dr_topics_unusable(self, flow: str, topics: Collection[str]) -> None:
        """The DR topics the flow's DR sync found it cannot use, as its last start found them (0: all usable)."""
        self.dr_unusable.labels(flow).set(len(topics))

    def core_chosen(self, flow: str, core: str, copies: str) -> None:
        """Say which core copies the flow: a label to join the copy series on by `flow`."""
        self.core.labels(flow, core, copies).set(1)

    def batch_landed(self, flow: str, rows: Iterable[Landing]) -> None:
        """Add one batch's landings to the flow's figures (none for a topic that has left the selection)."""
        for row in rows:
            with self._lock:
                labels = self._series(flow, row.topic, row.partition)
            if labels is None:
                continue
            self.records.labels(*labels).inc(row.records)
            self.bytes.labels(*labels).inc(row.bytes)
            if row.dead_lettered:
                self.dead_lettered.labels(*labels).inc(row.dead_lettered)
            if any(row.latency_counts):
                self._add_latency(flow, row.topic, row.latency_counts, row.latency_sum_ms / 1000)
        self.last_batch.labels(flow).set(self._clock())

    def set_lag(self, flow: str, topic: str, partition: int, records: int) -> None:
        with self._lock:  # the lag poller's thread: never set a series `topics_selected` is removing
            labels = self._series(flow, topic, partition)
            if labels is not None:
                self.lag.labels(*labels).set(max(0, records))

    def topics_selected(self, flow: str, topics: Collection[str]) -> None:
        """The topics the flow selects now; every series of a topic that left the selection is removed, so a
        dashboard never shows a frozen figure for a topic the mirror no longer copies."""
        with self._lock:
            self._selected[flow] = frozenset(topics)
            labelled = self._labelled.setdefault(flow, set())
            gone = {(t, p) for t, p in labelled if t not in topics}
            labelled -= gone
            for topic, partition in gone:
                self._latency.pop((flow, topic), None)
                for series in (self.records, self.bytes, self.dead_lettered, self.landed_ahead, self.lag):
                    series.remove(flow, topic, partition)

    def selects(self, flow: str, topic: str) -> bool:
        """Whether the flow selects the topic, as topic sync last said (every topic before it first did)."""
        selected = self._selected.get(flow)
        return selected is None or topic in selected

    def _series(self, flow: str, topic: str, partition: int) -> tuple[str, str, str] | None:
        """The labels of one partition's series, noted for `topics_selected`; None once its topic left the
        selection. Called with the lock held."""
        if not self.selects(flow, topic):
            return None
        self._labelled.setdefault(flow, set()).add((topic, str(partition)))
        return flow, topic, str(partition)

    def topics_quarantined(self, flow: str, topics: Collection[str]) -> None:
        """The flow's quarantined topics now; each topic that enters quarantine counts one `quarantined` error."""
        now = frozenset(topics)
        entered = now - self._quarantined.get(flow, frozenset())
        self._quarantined[flow] = now
        self.quarantined.labels(flow).set(len(now))
        if entered:
            self.errors.labels(flow, "quarantined").inc(len(entered))

    def records_landed_ahead(self, flow: str, topic: str, partition: int, count: int) -> None:
        """`count` records of a partition landed ahead of an earlier one the target refused (spark_app.ledger)."""
        with self._lock:
            labels = self._series(flow, topic, partition)
        if labels is not None:
            self.landed_ahead.labels(*labels).inc(count)

    def error(self, flow: str, kind: str, count: int = 1) -> None:
        self.errors.labels(flow, kind).inc(count)

    def checkpoint_written(self, flow: str, group: str, unix_time: float | None) -> None:
        """The DR loop wrote a checkpoint for `group` at `unix_time`; its age grows from then until the next. None:
        the DR loop no longer checkpoints the group (gone, no longer selected, or committing nothing mirrored), and
        its series goes."""
        with self._lock:
            key = (flow, group)
            if unix_time is None:
                self._checkpoints.pop(key, None)
            else:
                self._checkpoints[key] = max(unix_time, self._checkpoints.get(key, unix_time))

    def heartbeat_seen(self, flow: str, heartbeat_unix_time: float) -> None:
        """A heartbeat emitted on the source at `heartbeat_unix_time` reached the target through the flow."""
        with self._lock:
            self._heartbeats[flow] = max(heartbeat_unix_time, self._heartbeats.get(flow, heartbeat_unix_time))

    def text(self) -> str:
        """The exposition the endpoint serves."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "0.0.0.0") -> MetricsServer:
        """Serve the registry over HTTP (any path, e.g. /metrics). Port 0 takes a free port."""
        try:
            server, thread = start_http_server(port, addr, registry=self.registry)
        except OSError as err:
            raise MetricsPortError(f"metrics_port: cannot serve metrics on {addr}:{port}: {err.strerror}") from None
        bound = server.server_address[1]
        log.info("metrics: serving Prometheus text on %s:%d", addr, bound)
        return MetricsServer(bound, server, thread)

    def _add_latency(self, flow: str, topic: str, counts: Sequence[int], sum_s: float) -> None:
        with self._lock:
            total, total_sum = self._latency.get((flow, topic), ([0] * len(counts), 0.0))
            self._latency[(flow, topic)] = ([a + b for a, b in zip(total, counts, strict=True)], total_sum + sum_s)

    def collect(self) -> Iterator[Metric]:
        """The series whose value depends on when they are read (the registry calls this on each scrape)."""
        now = self._clock()
        with self._lock:
            latency = dict(self._latency)
            checkpoints = dict(self._checkpoints)
            heartbeats = dict(self._heartbeats)
        histogram = HistogramMetricFamily(
            "mirrorkit_replication_latency_seconds",
            "Target write time minus the source record's timestamp.",
            labels=("flow", "topic"),
        )
        for (flow, topic), (counts, sum_s) in sorted(latency.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(floatToGoString, LATENCY_BUCKETS_S), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            histogram.add_metric((flow, topic), buckets, sum_s)
        yield histogram
        checkpoint_age = GaugeMetricFamily(
            "mirrorkit_checkpoint_age_seconds",
            "Seconds since the mirror last wrote a checkpoint for the consumer group.",
            labels=("flow", "group"),
        )
        for (flow, group), written in sorted(checkpoints.items()):
            checkpoint_age.add_metric((flow, group), max(0.0, now - written))
        yield checkpoint_age
        heartbeat_age = GaugeMetricFamily(
            "mirrorkit_heartbeat_age_seconds",
            "Seconds since the newest heartbeat that reached the target was emitted on the source.",
            labels=("flow",),
        )
        for flow, emitted in sorted(heartbeats.items()):
            heartbeat_age.add_metric((flow,), max(0.0, now - emitted))
        yield heartbeat_age


@dataclass
class MetricsServer:
    """The running endpoint; `port` is the one bound (useful when asked for port 0)."""

    port: int
    _server: Any
    _thread: threading.Thread

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@dataclass(frozen=True)
class LagSource:
    """One flow as the lag poller sees it: its source cluster, where its copy will read next, and its holds."""

    flow: str
    cluster: ClusterConfig
    positions: Callable[[], Positions]
    held: Callable[[], Held] = lambda: {}


def owed_from(read: Positions, held: Held) -> PartitionOffsets:
    """Per partition, the first source offset the target still lacks: where the copy reads next (`read`), or, for
    a held (quarantined) partition, its first held offset. The copy reads on past held records, so its own
    position would show their lag as about 0 while they are still owed."""
    owed = dict(read)
    for topic, partitions in held.items():
        for partition, first in partitions.items():
            owed[(topic, partition)] = min(first, owed.get((topic, partition), first))
    return owed


class LagPoller:
    """A driver thread that sets `mirrorkit_lag_records` from the source's end offsets every `interval_s`.

    Used as a context manager around a continuous run; `poll` does one round. Topics the flow no longer selects
    are not asked for (a deleted one would fail every round).
    """

    def __init__(
        self, metrics: MirrorMetrics, sources: Sequence[LagSource], interval_s: float = LAG_POLL_INTERVAL_S
    ) -> None:
        self.metrics = metrics
        self.sources = sources
        self.interval_s = interval_s
        self._admins: dict[str, AdminClient] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mirrorkit-lag", daemon=True)

    def __enter__(self) -> LagPoller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def poll(self) -> None:
        for source in self.sources:
            owed = owed_from(source.positions(), source.held())
            positions = {tp: offset for tp, offset in owed.items() if self.metrics.selects(source.flow, tp[0])}
            if positions:
                self._poll_flow(source, positions)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the thread must outlive one bad round; the next one retries
                log.exception("lag poll failed")

    def _poll_flow(self, source: LagSource, positions: Positions) -> None:
        admin = self._admins.get(source.cluster.alias)
        if admin is None:
            admin = self._admins[source.cluster.alias] = clients.admin(source.cluster)
        try:
            ends, unanswered = clients.list_offsets_each(
                admin, positions, OffsetSpec.latest(), timeout_s=LIST_OFFSETS_TIMEOUT_S
            )
        except KafkaException as err:  # the whole source is down
            ends, unanswered = {}, dict.fromkeys(positions, err.args[0].str())
        for (topic, partition), end in ends.items():
            self.metrics.set_lag(source.flow, topic, partition, end - positions[(topic, partition)])
        failed = [f"{t}[{p}]: {why}" for (t, p), why in unanswered.items()]
        if failed:
            self.metrics.error(source.flow, "lag_poll")
            log.warning(
                "flow %s: end offsets unavailable for %d partition(s): %s", source.flow, len(failed), failed[:3]
            )
