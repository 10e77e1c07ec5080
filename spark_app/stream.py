"""The Spark side: one streaming query per flow, wired to the writer and to topic sync.

Each query plans batches over every source topic the flow selects, quarantined ones included (spark_app.planner),
and copies them with the writer's `RangeCopier`. When that set changes (a new topic, a partition added) the query
is stopped between batches and started again on the same checkpoint; the planner starts the new partitions at
their earliest offset, so records produced before the mirror noticed a topic are copied too.

Quarantine (one bad topic never stops the others). The writer is told which topics are ready on the target; it
holds back every record of the others, and of a partition from the first record the target refused, and says per
partition which source offsets it held (`held_from` to `held_until`). The driver merges those into the flow's
`FlowState`: per quarantined topic, per partition, a `Hold` from the first offset not written to the offset the
query has read up to. The query itself goes on, so it keeps advancing past held records and the hold keeps growing;
nothing of the topic is written meanwhile, so order is kept. To rejoin, the driver, between batches (a lock keeps
batches and catch-ups apart), copies each hold as one offset range through the same writer, then marks the topic
ready: the next batch writes the topic's records after the hold. A catch-up is tried when topic sync says the
target can take the topic, at start (so a restart retries at once), and for a refused record every
`RECORD_RETRY_S`. The state is saved after every batch, before Spark commits it, so a crash replays a batch at most
(at least once, never a gap).

Data loss. Per partition the state keeps the next offset the query expects. When a batch starts further on, the
source's log start is checked: records below it that were never read were deleted by retention. They are reported
(log, `FlowTotals.data_loss`) and mirroring goes on, unless the flow sets `fail_on_data_loss`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .config import FlowConfig, MirrorConfig
from .dr import DrSync
from .metrics import LagPoller, LagSource, MirrorMetrics
from .planner import RANGE_SCHEMA, UNREACHABLE_GIVE_UP_S, OffsetRangeSource, plan_source_options
from .topics import ClusterUnreachable, DataLoss, FlowState, Hold, Quarantine, TopicPlan, TopicSync
from .writer import LANDED_SCHEMA, RangeCopier

log = logging.getLogger(__name__)

RECORD_RETRY_S = 60.0  # how often a topic held by a refused record tries again while `run` goes on


def build_session(master: str | None = None, app_name: str = "mirrorkit") -> SparkSession:
    """The session `run` uses; spark-submit's own settings win inside the image."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    session = (
        builder.config("spark.task.maxFailures", "4")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .getOrCreate()
    )
    session.dataSource.register(OffsetRangeSource)
    return session


@dataclass
class FlowTotals:
    """What a flow has done since start, per source topic; the demo, `status` and the metrics read it.

    `quarantined` maps each stopped topic to its reason; `held` maps it to {partition: first offset not written};
    `data_loss` lists the ranges deleted at the source before they were read.
    """

    records: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    dead_lettered: int = 0
    batches: int = 0
    quarantined: dict[str, str] = field(default_factory=dict)
    held: dict[str, dict[int, int]] = field(default_factory=dict)
    data_loss: list[DataLoss] = field(default_factory=list)
    landed_offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (src, tgt) per partition


Landed = list  # rows of LANDED_SCHEMA


class FlowMirror:
    """Runs one flow: topic sync, the query, quarantines and the bookkeeping of what landed."""

    def __init__(
        self,
        spark: SparkSession,
        config: MirrorConfig,
        flow: FlowConfig,
        on_landed: Callable[[FlowConfig, Landed], None] | None = None,
        metrics: MirrorMetrics | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.flow = flow
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.topic_sync = TopicSync(flow, self.source, self.target)
        self.state = FlowState.load(flow.checkpoint_location)
        self.totals = FlowTotals()
        self.plan = TopicPlan()
        self.topics: tuple[tuple[str, int], ...] = ()  # what the query subscribes to, with partition counts
        self.query: StreamingQuery | None = None
        self._on_landed = on_landed
        self.metrics = metrics or MirrorMetrics()
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._between_batches = threading.Lock()
        # While this file exists the flow's source plans no new batch (spark_app.planner): a stop waits on it.
        self._pause_file = Path(tempfile.gettempdir()) / f"mirrorkit-pause-{uuid.uuid4().hex}"
        self._publish()

    def source_frame(self, topics: tuple[tuple[str, int], ...]) -> DataFrame:
        """The flow's micro-batches as offset ranges over `topics` (name, partition count)."""
        options = plan_source_options(
            self.source, dict(topics), self.flow.start_from, self.spark.sparkContext.defaultParallelism,
            self.flow.max_records_per_trigger, self._pause_file,
        )  # fmt: skip
        return self.spark.readStream.format(OffsetRangeSource.name()).options(**options).load()

    def copier(self, ready: dict[str, int]) -> RangeCopier:
        return RangeCopier(self.flow, self.source, self.target, ready=ready)

    def sync_topics(self) -> tuple[tuple[str, int], ...]:
        """Run topic sync; quarantine what the target cannot take. Returns what the query should subscribe to."""
        plan = self.topic_sync.sync()
        with self._between_batches:
            self.plan = plan
            for topic, reason in plan.quarantined.items():
                q = self.state.quarantined.setdefault(topic, Quarantine(reason))
                q.reason = reason
            self._publish()
        return tuple(sorted(plan.wanted.items()))

    def ready(self) -> dict[str, int]:
        """The topics the writer may write now, with their partition counts on the target."""
        return {t: n for t, n in self.plan.mirrored.items() if t not in self.state.quarantined}

    def start(self, topics: tuple[tuple[str, int], ...], available_now: bool) -> StreamingQuery | None:
        self.topics = topics
        self.catch_up()
        if not topics:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.query = None
            return None

        def write_batch(frame: DataFrame, batch_id: int) -> None:
            with self._between_batches:
                self._catch_up()
                landed = frame.mapInArrow(self.copier(self.ready()), LANDED_SCHEMA).collect()
                self._record(landed)
                self._after_batch(landed)

        names = tuple(t for t, _ in topics)
        stream = self.source_frame(topics).writeStream.queryName(f"mirror {self.flow.name}")
        stream = stream.foreachBatch(write_batch).option("checkpointLocation", self.flow.checkpoint_location)
        if available_now:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self.query = stream.start()
        active = [t for t in names if t not in self.state.quarantined]
        held = sorted(set(names) - set(active))
        log.info(
            "flow %s: mirroring %d topic(s): %s%s", self.flow.name, len(active), ", ".join(active),
            f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip
        return self.query

    def stop_between_batches(self, timeout_s: float = 120.0) -> None:
        """Stop after the batch in flight, so no batch is cut in half and none is written twice.

        Spark's stop cancels whatever runs at that moment, and a batch cancelled after its write but before its
        commit is written again by the next query. So the source is paused first: a trigger that starts now plans
        no batch, and the one in flight (if any) runs to its commit before the query stops. A batch stuck past
        `timeout_s` is cancelled anyway, and runs again (at least once).
        """
        if self.query is None or not self.query.isActive:
            return
        self._pause_file.touch()
        try:
            deadline = time.monotonic() + timeout_s
            while self.query.status.get("isTriggerActive"):
                if time.monotonic() > deadline:
                    log.warning("flow %s: the batch in flight did not end within %.0f s; cancelling it, it runs"
                                " again when the query restarts", self.flow.name, timeout_s)  # fmt: skip
                    break
                time.sleep(0.05)
            self.query.stop()
        finally:
            self._pause_file.unlink(missing_ok=True)

    def next_offsets(self) -> dict[tuple[str, int], int]:
        """Per source partition, the next offset the flow will copy: where its query's last batch ended.

        Kept across query restarts, so a topic that leaves the query (quarantined) still shows its lag.
        """
        progress = self.query.lastProgress if self.query is not None else None
        for source in progress.sources if progress is not None else ():
            for topic, offsets in (json.loads(source.endOffset) or {}).items():
                self._next_offsets.update({(topic, int(p)): offset for p, offset in offsets.items()})
        return dict(self._next_offsets)

    def catch_up(self) -> None:
        """Catch up quarantined topics whose cause may be gone; safe while the query runs (between its batches)."""
        with self._between_batches:
            self._catch_up()

    def _catch_up(self) -> None:
        now = time.monotonic()
        for topic, q in list(self.state.quarantined.items()):
            partitions = self.plan.mirrored.get(topic)
            if partitions is None or now < q.retry_at or any(p >= partitions for p in q.partitions):
                continue
            owed = {p: h for p, h in q.partitions.items() if h.next > h.first}
            landed = []
            if owed:
                ranges = [(topic, p, h.first, h.next) for p, h in sorted(owed.items())]
                frame = self.spark.createDataFrame(ranges, RANGE_SCHEMA).repartition(len(ranges))
                landed = frame.mapInArrow(self.copier({topic: partitions}), LANDED_SCHEMA).collect()
                self._record(landed)
            rows = {row.partition: row for row in landed}
            lost = [(topic, p, h.first, rows[p].first_offset if p in rows else h.next) for p, h in owed.items()]
            self._report_loss(lost)
            still = {p: Hold(rows[p].held_from, owed[p].next) for p in owed if p in rows and rows[p].held_from >= 0}
            copied = sum(r.records for r in landed)
            if still:
                p, row = next((p, rows[p]) for p in sorted(still))
                q.reason = _refused_reason(self.flow, topic, p, row.held_from, row.refused_bytes) or q.reason
                q.partitions, q.retry_at = still, now + RECORD_RETRY_S
                log.error("flow %s: topic '%s' still quarantined after copying %d: %s", self.flow.name, topic,
                          copied, q.reason)  # fmt: skip
            else:
                del self.state.quarantined[topic]
                log.info("flow %s: topic '%s' caught up %d record(s) from %s and rejoins", self.flow.name, topic,
                         copied, {p: h.first for p, h in owed.items()} or "its start")  # fmt: skip
        self._publish()
        self.state.save()

    def _record(self, landed: Landed) -> None:
        t = self.totals
        t.batches += 1
        for row in landed:
            t.records[row.topic] = t.records.get(row.topic, 0) + row.records
            t.bytes[row.topic] = t.bytes.get(row.topic, 0) + row.bytes
            t.dropped += row.dropped
            t.dead_lettered += row.dead_lettered
            if row.last_target_offset >= 0:
                t.landed_offsets[(row.topic, row.partition)] = (row.last_offset, row.last_target_offset)
        self.metrics.batch_landed(self.flow.name, landed)
        if self._on_landed is not None:
            self._on_landed(self.flow, landed)

    def _after_batch(self, landed: Landed) -> None:
        """Quarantine what the writer held, check for records deleted before they were read, save the state."""
        lost = []
        for row in landed:
            key = (row.topic, row.partition)
            expected = self.state.positions.get(key)
            if expected is not None and row.first_offset > expected:
                lost.append((row.topic, row.partition, expected, row.first_offset))
            self.state.positions[key] = max(row.end_offset, expected or 0)
            if row.held_from < 0:
                continue
            q = self.state.quarantined.get(row.topic)
            if q is None:
                reason = _refused_reason(self.flow, row.topic, row.partition, row.held_from, row.refused_bytes)
                reason = reason or f"partition {row.partition} is not on the target yet"
                q = self.state.quarantined[row.topic] = Quarantine(reason, retry_at=time.monotonic() + RECORD_RETRY_S)
                log.error("flow %s: topic '%s' quarantined: %s", self.flow.name, row.topic, reason)
            hold = q.partitions.get(row.partition)
            if hold is None:
                q.partitions[row.partition] = Hold(row.held_from, row.held_until)
            else:
                hold.first, hold.next = min(hold.first, row.held_from), max(hold.next, row.held_until)
        self._report_loss(lost)
        self._publish()
        self.state.save()

    def _report_loss(self, gaps: list[tuple[str, int, int, int]]) -> None:
        """Gaps (topic, partition, expected, first read) below the source's log start are records lost to retention."""
        if not gaps:
            return
        earliest = self.topic_sync.earliest_offsets([(t, p) for t, p, _, _ in gaps])
        for topic, partition, expected, first_read in gaps:
            end = min(earliest[(topic, partition)], first_read)
            if end <= expected:
                continue  # offsets that never held a record (compaction, transaction markers)
            loss = DataLoss(topic, partition, expected, end - 1)
            self.totals.data_loss.append(loss)
            log.error(
                "flow %s: %d record(s) of '%s' partition %d, offsets %d..%d, were deleted at the source before they"
                " were mirrored%s", self.flow.name, loss.count, topic, partition, loss.first_offset, loss.last_offset,
                "" if self.flow.fail_on_data_loss else "; mirroring goes on",
            )  # fmt: skip
            if self.flow.fail_on_data_loss:
                raise MirrorFailed(f"flow {self.flow.name}: records deleted before they were mirrored: {loss}")

    def _publish(self) -> None:
        """Copy the quarantines into the totals as plain data, for `status` and the metrics."""
        self.totals.quarantined = {t: q.reason for t, q in self.state.quarantined.items()}
        self.totals.held = {
            t: {p: h.first for p, h in sorted(q.partitions.items())} for t, q in self.state.quarantined.items()
        }
        self.metrics.topics_quarantined(self.flow.name, self.totals.quarantined)


def _refused_reason(flow: FlowConfig, topic: str, partition: int, offset: int, size: int) -> str | None:
    if not size:
        return None
    return (
        f"record too large for target '{flow.target}': topic '{topic}' partition {partition} offset {offset}"
        f" ({size} bytes); raise the target's cap, or set dead_letter_topic to divert such records"
    )


class Mirror:
    """All flows of a config in one Spark application."""

    def __init__(self, spark: SparkSession, config: MirrorConfig) -> None:
        self.spark = spark
        self.config = config
        self.metrics = MirrorMetrics()
        self.dr = {f.name: DrSync(config, f, self.metrics) for f in config.flows}  # offset syncs, checkpoints
        self.flows = [
            FlowMirror(spark, config, f, on_landed=self.dr[f.name].on_landed, metrics=self.metrics)
            for f in config.flows
        ]
        self.stopping = threading.Event()

    def run_available_now(self) -> None:
        """Mirror what is there now, write a final offset sync and checkpoint, then return."""
        for dr in self.dr.values():
            dr.prepare()
        for flow in self.flows:
            flow.start(flow.sync_topics(), available_now=True)
        for flow in self.flows:
            if flow.query is not None:
                with contextlib.suppress(StreamingQueryException):  # reported below, in the mirror's own words
                    flow.query.awaitTermination()
                _raise_if_failed(flow)
        for dr in self.dr.values():
            dr.stop()

    def run_forever(self) -> None:
        """Mirror continuously, re-syncing topics every `topic_sync_interval_s`, until `stopping` is set.

        A cluster that stops answering is waited for (the writer's producer retries meanwhile) for up to
        `UNREACHABLE_GIVE_UP_S`; then the mirror stops with the error. Meanwhile the metrics endpoint listens on
        `metrics_port`, the lag poller runs, and so does each flow's DR loop.
        """
        lag_sources = [LagSource(f.flow.name, f.source, f.next_offsets) for f in self.flows]
        with self.metrics.serve(self.config.metrics_port), LagPoller(self.metrics, lag_sources):
            self._mirror_until_stopped()

    def _mirror_until_stopped(self) -> None:
        for dr in self.dr.values():
            dr.start()
        for flow in self.flows:
            flow.start(flow.sync_topics(), available_now=False)
        unreachable_since: float | None = None
        while not self.stopping.wait(self.config.topic_sync_interval_s):
            for flow in self.flows:
                if flow.query is not None and not flow.query.isActive:
                    _raise_if_failed(flow)
                try:
                    wanted = flow.sync_topics()
                except ClusterUnreachable as err:
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since > UNREACHABLE_GIVE_UP_S:
                        raise
                    log.warning("flow %s: topic sync skipped, retrying: %s", flow.flow.name, err)
                    continue
                unreachable_since = None
                if wanted != flow.topics:
                    log.info("flow %s: topic set changed; restarting its query on the same checkpoint", flow.flow.name)
                    flow.stop_between_batches()
                    flow.start(wanted, available_now=False)
                else:
                    flow.catch_up()
        for flow in self.flows:
            flow.stop_between_batches()
        for dr in self.dr.values():
            dr.stop()


def _raise_if_failed(flow: FlowMirror) -> None:
    error = flow.query.exception() if flow.query is not None else None
    if error is not None:
        flow.metrics.error(flow.flow.name, "batch_failed")
        raise MirrorFailed(f"flow {flow.flow.name} failed: {_first_cause(str(error))}")


def _first_cause(message: str) -> str:
    """The mirror's own error line out of a Py4J/Spark stack, when there is one."""
    for marker in ("MirrorFailed: ", "DeliveryFailed: ", "SecretError: ", "OffsetOutOfRangeException: "):
        if marker in message:
            return marker + message.split(marker, 1)[1].splitlines()[0]
    return message.splitlines()[0] if message else "unknown error"


class MirrorFailed(RuntimeError):
    pass
