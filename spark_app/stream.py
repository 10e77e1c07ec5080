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
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .config import STOP_BATCH_TIMEOUT_S, FlowConfig, MirrorConfig
from .dr.service import DrSync
from .errors import ClusterUnreachable, MirrorFailed
from .metrics import FlowTotals, LagPoller, LagSource, MirrorMetrics
from .planner import PAUSE_FILE, UNREACHABLE_GIVE_UP_S, OffsetRangeSource, plan_source_options, write_record_bytes
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
        options = plan_source_options(
            self.source, dict(topics), self.flow.start_from, self.spark.sparkContext.defaultParallelism,
            self.flow.max_records_per_trigger, self.flow.max_bytes_per_trigger, self._driver_dir,
            by_topic(self.quarantine.state.adopted),
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
                landed = self._land(frame.mapInArrow(copier, LANDED_SCHEMA))
                resets = self.quarantine.after_batch(landed)
                if resets:
                    self.metrics.error(self.flow.name, "offsets_reset", len(resets))
                self._publish()

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

    def stop_between_batches(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
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
        self.totals.add(landed)
        records = sum(self.totals.records.values())
        if records:
            write_record_bytes(self._driver_dir, sum(self.totals.bytes.values()) / records)
        self.metrics.batch_landed(self.flow.name, landed)
        if self._on_landed is not None:
            self._on_landed(landed)
        return landed

    def _publish(self) -> None:
        """Copy the quarantines into the totals as plain data, for `status` and the metrics."""
        self.totals.quarantined = self.quarantine.reasons()
        self.totals.held = self.quarantine.held()
        self.totals.data_loss = self.quarantine.data_loss
        self.totals.offset_resets = self.quarantine.resets
        self.metrics.topics_quarantined(self.flow.name, self.totals.quarantined)


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
        self._on_jvm_sigterm: _SetOnSignal | None = None

    def stop_on_sigterm(self) -> None:
        """Set `stopping` on SIGTERM, whether it reaches this Python process or the Spark driver's JVM.

        Under spark-submit (the image: the Spark Operator's driver pod) the JVM is the process the pod's SIGTERM
        reaches, and the Python driver is its child and gets no signal. The JVM's default answer is to exit (status
        143) through its shutdown hooks, which stop the SparkContext and so cancel the batch in flight: it would be
        copied again. So the JVM's SIGTERM handler is replaced, through py4j, by one that calls back into this
        process and only sets `stopping`. The JVM then stays up, `run_forever` stops every query between batches,
        this process exits 0 and spark-submit with it. When Python started the JVM itself (`python -m spark_app`),
        the signal reaches Python, and its own handler does the same. Call it from the main thread.
        """
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        gateway = self.spark.sparkContext._gateway
        assert gateway is not None  # a live SparkSession has its py4j gateway
        ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]  # pyspark leaves it unannotated
        self._on_jvm_sigterm = _SetOnSignal(self.stopping)
        jvm_signal = gateway.jvm.sun.misc.Signal
        jvm_signal.handle(jvm_signal("TERM"), self._on_jvm_sigterm)

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
        with self.metrics.serve(self.config.metrics_port), LagPoller(self.metrics, [f.lag() for f in self.flows]):
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
        # Every flow at once, so a stop takes one flow's time (within STOP_GRACE_S), not the sum.
        with ThreadPoolExecutor(max(1, len(self.flows))) as pool:
            list(pool.map(self._stop_flow, self.flows))

    def _stop_flow(self, flow: FlowMirror) -> None:
        """Stop the flow's query between batches, then write its final offset syncs and checkpoints."""
        flow.stop_between_batches()
        self.dr[flow.flow.name].stop()


class _SetOnSignal:
    """A `sun.misc.SignalHandler` for the driver's JVM, run in Python through py4j's callback server."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def handle(self, jvm_signal: Any) -> None:
        log.info("SIG%s: stopping after the batch in flight", jvm_signal.getName())
        self.event.set()

    class Java:
        implements = ["sun.misc.SignalHandler"]


def _raise_if_failed(flow: FlowMirror) -> None:
    error = flow.query.exception() if flow.query is not None else None
    if error is not None:
        flow.metrics.error(flow.flow.name, "batch_failed")
        raise MirrorFailed(f"flow {flow.flow.name} failed: {_first_cause(str(error))}")


def _first_cause(message: str) -> str:
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
