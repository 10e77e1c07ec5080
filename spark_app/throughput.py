"""Throughput mode: a flow as one Structured Streaming query whose micro-batches copy planned offset ranges.

The query plans batches over every source topic the flow subscribes to, quarantined ones included
(spark_app.planner), and its tasks copy them as they read them, with the `RangeCopier` (spark_app.range_copy) the
driver handed the planner last. When the subscription changes (a new topic, a partition added) the query is stopped
between batches and started again on the same checkpoint; the planner starts the new partitions at their earliest
offset, so records produced before the mirror noticed a topic are copied too. After each batch, and after each
quarantine catch-up (copied outside the stream), the landings go to the flow's ledger.

A batch's copier is fixed when the batch is planned, so it holds the topics quarantined then. The driver therefore
catches up a quarantined topic only between a batch and the planning of the next: after each batch, in the batch's
own turn, and on an idle stream with planning paused. A topic that rejoins is then written by the very next batch,
and never held again by a batch planned before it rejoined.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from .clients import PartitionOffsets
from .config import STOP_BATCH_TIMEOUT_S, FlowMode
from .errors import first_cause
from .ledger import by_topic
from .planner import PAUSE_FILE, OffsetRangeSource, Planned, plan_source_options, write_copier, write_record_bytes
from .range_copy import RangeCopier
from .ranges import LANDED_SCHEMA, RANGE_SCHEMA, Landing, OffsetRange
from .runner import FlowRunner, Subscription

log = logging.getLogger(__name__)


class ThroughputRunner(FlowRunner):
    """A flow's streaming query: start, stop between batches, and its catch-ups between them."""

    query: StreamingQuery | None = None
    # Where the driver talks to the query's planner, which runs in a Python worker (spark_app.planner): a pause file
    # that a stop waits on, and each topic's mean record size that bounds a batch's bytes. One per query run.
    _driver_dir: Path | None = None

    def start(self, subscription: Subscription, available_now: bool) -> None:
        self.subscription = subscription
        self.catch_up()
        if not subscription:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.query = None
            return
        self._driver_dir = Path(tempfile.mkdtemp(prefix="mirrorkit-flow-"))
        self._hand_to_planner()

        def write_batch(frame: DataFrame, batch_id: int) -> None:
            with self.lock:  # `frame` is the batch's landings: collecting it copies the batch (once)
                self.ledger.file([Landing.from_row(row.asDict()) for row in frame.collect()])
                self._catch_up()

        names = tuple(t for t, _ in subscription)
        stream = self._batches(subscription).writeStream.queryName(f"mirror {self.flow.name}")
        stream = stream.foreachBatch(write_batch).option("checkpointLocation", self.flow.checkpoint_location)
        if available_now:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")
        self.query = stream.start()
        held = sorted(set(names) & set(self.ledger.quarantined))
        active = [t for t in names if t not in held]
        log.info(
            "flow %s: mirroring %d topic(s): %s%s", self.flow.name, len(active), ", ".join(active),
            f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip

    def _batches(self, subscription: Subscription) -> DataFrame:
        """The flow's micro-batches as offset ranges over `subscription`."""
        assert self._driver_dir is not None  # made by `start`
        state = self.ledger.state
        options = plan_source_options(
            self.source, dict(subscription), self.flow.start_from, self.spark.sparkContext.defaultParallelism,
            self.flow.max_records_per_trigger, self.flow.max_bytes_per_trigger, self._driver_dir,
            by_topic(state.adopted), by_topic(state.positions) if state.mode is FlowMode.REALTIME else None,
        )  # fmt: skip
        return self.spark.readStream.format(OffsetRangeSource.name()).options(**options).load()

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        """Stop after the batch in flight, so no batch is cut in half and none is written twice.

        Spark's stop cancels whatever runs at that moment, and a batch cancelled after its write but before its
        commit is written again by the next query. So the source is paused first: a trigger that starts now plans
        no batch, and the one in flight (if any) runs to its commit before the query stops. A batch stuck past
        `timeout_s` is cancelled anyway, and runs again (at least once).
        """
        if self.query is None or not self.query.isActive:
            self._drop_driver_dir()
            return
        if not self._pause(timeout_s):
            log.warning("flow %s: the batch in flight did not end within %.0f s; cancelling it, it runs"
                        " again when the query restarts", self.flow.name, timeout_s)  # fmt: skip
        self.query.stop()
        self._drop_driver_dir()

    def _pause(self, timeout_s: float) -> bool:
        """Plan no new batch (the planner reads PAUSE_FILE) and wait up to `timeout_s` for the one in flight to end;
        whether it did."""
        assert self.query is not None and self._driver_dir is not None  # a running query has its folder
        (self._driver_dir / PAUSE_FILE).touch()
        deadline = time.monotonic() + timeout_s
        while self.query.status.get("isTriggerActive"):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def running(self) -> bool:
        return self.query is not None and self.query.isActive

    def wait(self) -> None:
        if self.query is not None:
            with contextlib.suppress(StreamingQueryException):  # reported by `failure`, in the mirror's own words
                self.query.awaitTermination()
        self._drop_driver_dir()

    def failure(self) -> str | None:
        error = self.query.exception() if self.query is not None and not self.query.isActive else None
        return None if error is None else first_cause(str(error))

    def catch_up(self) -> None:
        """Catch up the quarantined topics that are due, and hand the planner what topic sync found since. A running
        query's planning is paused meanwhile (see the module's docstring); if its batch in flight does not end within
        STOP_BATCH_TIMEOUT_S, the catch-up waits for that batch's own turn."""
        with self.lock:
            if not self.running() or not self.ledger.quarantines.due(self.plan.mirrored):
                self._catch_up()
                return
        assert self._driver_dir is not None  # a running query has its folder
        try:
            if self._pause(STOP_BATCH_TIMEOUT_S):
                with self.lock:
                    self._catch_up()
        finally:
            (self._driver_dir / PAUSE_FILE).unlink(missing_ok=True)

    def _positions(self) -> PartitionOffsets:
        """Where the query's last batch ended."""
        progress = self.query.lastProgress if self.query is not None else None
        reached: PartitionOffsets = {}
        for source in progress.sources if progress is not None else ():
            for topic, offsets in Planned.parse(json.loads(source.endOffset) or {}).offsets.items():
                reached.update({(topic, int(p)): offset for p, offset in offsets.items()})
        return reached

    def _catch_up(self) -> None:
        """Copy what each quarantined topic that may rejoin owes, outside the stream (under `lock`), and hand the
        planner the copier of the next batch."""
        self.ledger.catch_up(self.plan.mirrored, self._copy_outside)
        self._hand_to_planner()

    def _copy_outside(self, ranges: list[OffsetRange], ready: dict[str, int]) -> list[Landing]:
        """Copy ranges outside the stream, one Spark task each, writing only the topics `ready`."""
        rows = [(r.topic, r.partition, r.start, r.end, r.reset_from) for r in ranges]
        frame = self.spark.createDataFrame(rows, RANGE_SCHEMA).repartition(len(rows))
        copier = RangeCopier(self.flow, self.source, self.target, ready, self.plan.rules)
        return [Landing.from_row(row.asDict()) for row in frame.mapInArrow(copier, LANDED_SCHEMA).collect()]

    def _hand_to_planner(self) -> None:
        """Tell the planner each topic's mean record size, by which it holds a batch to max_bytes_per_trigger, and
        hand it the copier of the batches it plans next: one that writes the topics not quarantined now."""
        if self._driver_dir is not None:
            write_record_bytes(self._driver_dir, self.ledger.totals.mean_record_bytes())
            ready = self.ledger.quarantines.ready(self.plan.mirrored)
            write_copier(self._driver_dir, RangeCopier(self.flow, self.source, self.target, ready, self.plan.rules))

    def _drop_driver_dir(self) -> None:
        if self._driver_dir is not None:
            shutil.rmtree(self._driver_dir, ignore_errors=True)
            self._driver_dir = None
