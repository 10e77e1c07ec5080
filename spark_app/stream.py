"""The Spark side: one streaming query per flow, its lifecycle, and the mirror that runs every flow's query.

Each query plans batches over every source topic the flow selects, quarantined ones included (spark_app.planner),
and copies them with the writer's `RangeCopier`. When that set changes (a new topic, a partition added) the query
is stopped between batches and started again on the same checkpoint; the planner starts the new partitions at
their earliest offset, so records produced before the mirror noticed a topic are copied too. After each batch the
landings go to the flow's quarantine (spark_app.quarantine), its totals and metrics, and the DR service
(spark_app.dr); a lock keeps batches and quarantine catch-ups apart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .config import STOP_BATCH_TIMEOUT_S, FlowConfig, MirrorConfig
from .metrics import FlowTotals, LagSource, MirrorMetrics
from .planner import PAUSE_FILE, OffsetRangeSource, plan_source_options, write_record_bytes
from .quarantine import FlowQuarantine, FlowState, by_topic
from .ranges import LANDED_SCHEMA, RANGE_SCHEMA, Landing, OffsetRange
from .storage import checkpoint_files
from .topics import TopicPlan, TopicSync
from .writer import RangeCopier

log = logging.getLogger(__name__)

Topics = tuple[tuple[str, int], ...]  # what a query subscribes to: (source topic, partition count), sorted


def build_session(master: str | None = None, app_name: str = "mirrorkit") -> SparkSession:
    """The session `run` uses; spark-submit's own settings win inside the image."""
    builder = SparkSession.builder.appName(app_name)
    # Spark's console progress bar would draw over the mirror's own progress line (spark_app.progress).
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    session = builder.config("spark.task.maxFailures", "4").getOrCreate()
    session.dataSource.register(OffsetRangeSource)
    return session


class FlowMirror:
    """Runs one flow's query: topic sync, start, stop between batches; landings go to the injected bookkeeping."""

    def __init__(
        self,
        spark: SparkSession,
        config: MirrorConfig,
        flow: FlowConfig,
        on_landed: Callable[[list[Landing]], None] | None = None,
        metrics: MirrorMetrics | None = None,
        topic_sync: TopicSync | None = None,
        quarantine: FlowQuarantine | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.flow = flow
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.topic_sync = topic_sync or TopicSync(flow, self.source, self.target)
        self.quarantine = quarantine or FlowQuarantine(
            flow, FlowState.load(checkpoint_files(flow.checkpoint_location, spark)), self.topic_sync.earliest_offsets
        )
        self.totals = FlowTotals()
        self.plan = TopicPlan()
        self.topics: Topics = ()
        self.query: StreamingQuery | None = None
        self._on_landed = on_landed
        self.metrics = metrics or MirrorMetrics()
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._between_batches = threading.Lock()
        # Where the driver talks to the flow's source, planned in a Python worker (spark_app.planner): a pause file
        # that a stop waits on, and the mean record size that bounds a batch's bytes.
        self._driver_dir = Path(tempfile.mkdtemp(prefix="mirrorkit-flow-"))
        self._pause_file = self._driver_dir / PAUSE_FILE
        self._publish()

    def source_frame(self, topics: Topics) -> DataFrame:
        """The flow's micro-batches as offset ranges over `topics` (name, partition count)."""
        state = self.quarantine.state
        options = plan_source_options(
            self.source, dict(topics), self.flow.start_from, self.spark.sparkContext.defaultParallelism,
            self.flow.max_records_per_trigger, self.flow.max_bytes_per_trigger, self._driver_dir,
            by_topic(state.adopted), by_topic(state.positions) if state.mode == "realtime" else None,
        )  # fmt: skip
        return self.spark.readStream.format(OffsetRangeSource.name()).options(**options).load()

    def sync_topics(self) -> Topics:
        """Run topic sync; quarantine what the target cannot take. Returns what the query should subscribe to."""
        plan = self.topic_sync.sync()
        with self._between_batches:
            self.plan = plan
            self.metrics.topics_selected(self.flow.name, plan.wanted)
            self.quarantine.refused(plan.quarantined)
            self._publish()
        return tuple(sorted(plan.wanted.items()))

    def start(self, topics: Topics, available_now: bool) -> StreamingQuery | None:
        self.topics = topics
        self.catch_up()
        if not topics:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.query = None
            return None

        def write_batch(frame: DataFrame, batch_id: int) -> None:
            with self._between_batches:
                self._catch_up()
                ready = self.quarantine.ready(self.plan.mirrored)
                copier = RangeCopier(self.flow, self.source, self.target, ready, self.plan.max_message_bytes)
                self._file(self._land(frame.mapInArrow(copier, LANDED_SCHEMA)))

        names = tuple(t for t, _ in topics)
        stream = self.source_frame(topics).writeStream.queryName(f"mirror {self.flow.name}")
        stream = stream.foreachBatch(write_batch).option("checkpointLocation", self.flow.checkpoint_location)
        if available_now:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self.query = stream.start()
        held = sorted(set(names) & set(self.quarantine.reasons()))
        active = [t for t in names if t not in held]
        log.info(
            "flow %s: mirroring %d topic(s): %s%s", self.flow.name, len(active), ", ".join(active),
            f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip
        return self.query

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
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

    def running(self) -> bool:
        return self.query is not None and self.query.isActive

    def wait(self) -> None:
        """Until the query ends (`run --available-now`: it has copied what was there); a failure is `failure`'s."""
        if self.query is not None:
            with contextlib.suppress(StreamingQueryException):  # reported by `failure`, in the mirror's own words
                self.query.awaitTermination()

    def failure(self) -> str | None:
        """Why the flow's query stopped, when it failed; None while it runs or after a clean end."""
        error = self.query.exception() if self.query is not None and not self.query.isActive else None
        return None if error is None else first_cause(str(error))

    def next_offsets(self) -> dict[tuple[str, int], int]:
        """Per source partition, the next offset the flow will copy: where its query's last batch ended.

        Kept across query restarts, so a topic that leaves the query (quarantined) still shows its lag.
        """
        progress = self.query.lastProgress if self.query is not None else None
        for source in progress.sources if progress is not None else ():
            for topic, offsets in (json.loads(source.endOffset) or {}).items():
                self._next_offsets.update({(topic, int(p)): offset for p, offset in offsets.items()})
        return dict(self._next_offsets)

    def lag(self) -> LagSource:
        """The flow as the lag poller reads it: a held partition's lag counts from its first held offset."""
        return LagSource(self.flow.name, self.source, self.next_offsets, lambda: self.totals.held)

    def catch_up(self) -> None:
        """Catch up quarantined topics whose cause may be gone; safe while the query runs (between its batches)."""
        with self._between_batches:
            self._catch_up()

    def _catch_up(self) -> None:
        self.quarantine.catch_up(self.plan.mirrored, self._copy)
        self._publish()

    def _copy(self, ranges: list[OffsetRange], ready: dict[str, int]) -> list[Landing]:
        """Copy ranges outside the stream (a quarantine catch-up), one Spark task per range."""
        rows = [(r.topic, r.partition, r.start, r.end, r.reset_from) for r in ranges]
        frame = self.spark.createDataFrame(rows, RANGE_SCHEMA).repartition(len(rows))
        copier = RangeCopier(self.flow, self.source, self.target, ready, self.plan.max_message_bytes)
        return self._land(frame.mapInArrow(copier, LANDED_SCHEMA))

    def _land(self, landings: DataFrame) -> list[Landing]:
        """Run the copy, then count what landed and hand it to the metrics and the DR service."""
        landed = [Landing.from_row(row.asDict()) for row in landings.collect()]
        self._count(landed)
        return landed

    def _count(self, landed: list[Landing]) -> None:
        """Count what landed, and hand it to the metrics and the DR service."""
        self.totals.add(landed)
        records = sum(self.totals.records.values())
        if records:
            write_record_bytes(self._driver_dir, sum(self.totals.bytes.values()) / records)
        self.metrics.batch_landed(self.flow.name, landed)
        if self._on_landed is not None:
            self._on_landed(landed)

    def _file(self, landed: list[Landing]) -> None:
        """After a copy (under `_between_batches`): quarantine what was held, save the positions, report."""
        resets = self.quarantine.after_batch(landed)
        if resets:
            self.metrics.error(self.flow.name, "offsets_reset", len(resets))
        self._publish()

    def _publish(self) -> None:
        """Copy the quarantines into the totals as plain data, for `status` and the metrics."""
        self.totals.quarantined = self.quarantine.reasons()
        self.totals.held = self.quarantine.held()
        self.totals.data_loss = self.quarantine.data_loss
        self.totals.offset_resets = self.quarantine.resets
        self.metrics.topics_quarantined(self.flow.name, self.totals.quarantined)


def first_cause(message: str) -> str:
    """The mirror's own error line out of a Py4J/Spark stack, when there is one."""
    for marker in (
        "MirrorFailed: ",
        "DeliveryFailed: ",
        "AuthenticationFailed: ",
        "SecretError: ",
        "OffsetOutOfRangeException: ",
    ):
        if marker in message:
            return marker + message.split(marker, 1)[1].splitlines()[0]
    return message.splitlines()[0] if message else "unknown error"
