"""The Spark side: one streaming query per flow, wired to the writer and to topic sync.

Each query subscribes to the explicit list of topics that topic sync has made ready on the target. When that list
changes (a new topic, a quarantine lifted) the query is stopped between batches and started again on the same
checkpoint; Spark then reads the new partitions from their earliest offset, so records produced before the mirror
noticed a topic are copied too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from .config import FlowConfig, MirrorConfig
from .dr import DrSync
from .metrics import LagPoller, LagSource, MirrorMetrics
from .profiles import spark_options
from .topics import TopicPlan, TopicSync
from .writer import LANDED_SCHEMA, SOURCE_COLUMNS, PartitionWriter

log = logging.getLogger(__name__)

JARS_ENV = "MIRRORKIT_SPARK_JARS"


def build_session(master: str | None = None, app_name: str = "mirrorkit") -> SparkSession:
    """The session `run` uses; spark-submit's own settings win inside the image."""
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if os.environ.get(JARS_ENV):
        builder = builder.config("spark.jars", os.environ[JARS_ENV])
    return (
        builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
        .config("spark.task.maxFailures", "4")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .getOrCreate()
    )


@dataclass
class FlowTotals:
    """What a flow has done since start, per source topic; the demo and status print it."""

    records: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    dead_lettered: int = 0
    batches: int = 0
    quarantined: dict[str, str] = field(default_factory=dict)
    landed_offsets: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # (src, tgt) per partition


Landed = list  # rows of LANDED_SCHEMA


class FlowMirror:
    """Runs one flow: topic sync, the query, and the bookkeeping of what landed."""

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
        self.totals = FlowTotals()
        self.topics: tuple[str, ...] = ()
        self.query: StreamingQuery | None = None
        self._on_landed = on_landed
        self.metrics = metrics or MirrorMetrics()
        self._next_offsets: dict[tuple[str, int], int] = {}

    def source_frame(self, topics: tuple[str, ...]) -> DataFrame:
        reader = (
            self.spark.readStream.format("kafka")
            .options(**spark_options(self.source, "consumer"))
            .option("subscribe", ",".join(topics))
            .option("includeHeaders", "true")
            .option("startingOffsets", self.flow.start_from)
            .option("failOnDataLoss", str(self.flow.fail_on_data_loss).lower())
        )
        if self.flow.max_records_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.flow.max_records_per_trigger))
        return reader.load().selectExpr(*SOURCE_COLUMNS)

    def sync_topics(self) -> TopicPlan:
        plan = self.topic_sync.sync()
        self.totals.quarantined = dict(plan.quarantined)
        self.metrics.topics_quarantined(self.flow.name, plan.quarantined)
        return plan

    def start(self, topics: tuple[str, ...], available_now: bool) -> StreamingQuery | None:
        self.topics = topics
        if not topics:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.query = None
            return None
        writer = PartitionWriter(self.flow, self.target)

        def write_batch(frame: DataFrame, batch_id: int) -> None:
            landed = frame.mapInArrow(writer, LANDED_SCHEMA).collect()
            self._record(landed)

        stream = self.source_frame(topics).writeStream.queryName(f"mirror {self.flow.name}")
        stream = stream.foreachBatch(write_batch).option("checkpointLocation", self.flow.checkpoint_location)
        if available_now:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self.query = stream.start()
        log.info("flow %s: mirroring %d topic(s): %s", self.flow.name, len(topics), ", ".join(topics))
        return self.query

    def stop_between_batches(self, timeout_s: float = 120.0) -> None:
        """Stop after the batch in flight, so no write is cut in half."""
        if self.query is None or not self.query.isActive:
            return
        deadline = time.monotonic() + timeout_s
        while self.query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
        self.query.stop()

    def next_offsets(self) -> dict[tuple[str, int], int]:
        """Per source partition, the next offset the flow will copy: where its query's last batch ended.

        Kept across query restarts, so a topic that leaves the query (quarantined) still shows its lag.
        """
        progress = self.query.lastProgress if self.query is not None else None
        for source in progress.sources if progress is not None else ():
            for topic, offsets in (json.loads(source.endOffset) or {}).items():
                self._next_offsets.update({(topic, int(p)): offset for p, offset in offsets.items()})
        return dict(self._next_offsets)

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
            flow.start(tuple(sorted(flow.sync_topics().mirrored)), available_now=True)
        for flow in self.flows:
            if flow.query is not None:
                with contextlib.suppress(StreamingQueryException):  # reported below, in the mirror's own words
                    flow.query.awaitTermination()
                _raise_if_failed(flow)
        for dr in self.dr.values():
            dr.stop()

    def run_forever(self) -> None:
        """Mirror continuously, re-syncing topics every `topic_sync_interval_s`, until `stopping` is set.

        Meanwhile the metrics endpoint listens on `metrics_port`, the lag poller runs, and so does each flow's DR loop.
        """
        lag_sources = [LagSource(f.flow.name, f.source, f.next_offsets) for f in self.flows]
        with self.metrics.serve(self.config.metrics_port), LagPoller(self.metrics, lag_sources):
            self._mirror_until_stopped()

    def _mirror_until_stopped(self) -> None:
        for dr in self.dr.values():
            dr.start()
        for flow in self.flows:
            flow.start(tuple(sorted(flow.sync_topics().mirrored)), available_now=False)
        while not self.stopping.wait(self.config.topic_sync_interval_s):
            for flow in self.flows:
                if flow.query is not None and not flow.query.isActive:
                    _raise_if_failed(flow)
                wanted = tuple(sorted(flow.sync_topics().mirrored))
                if wanted != flow.topics:
                    log.info("flow %s: topic set changed; restarting its query on the same checkpoint", flow.flow.name)
                    flow.stop_between_batches()
                    flow.start(wanted, available_now=False)
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
    for marker in ("RecordTooLarge: ", "DeliveryFailed: ", "SecretError: "):
        if marker in message:
            return marker + message.split(marker, 1)[1].splitlines()[0]
    return message.splitlines()[0] if message else "unknown error"


class MirrorFailed(RuntimeError):
    pass
