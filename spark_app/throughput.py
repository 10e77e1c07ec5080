"""Throughput mode: a flow as micro-batches of planned offset ranges, each planned in the driver and copied by one
Spark job.

A thread of the driver runs the flow's batches one after another. Each is planned over every source topic the flow
subscribes to, quarantined ones included (spark_app.planner), logged in the flow's batch log (spark_app.batch_log),
copied by one Spark job whose tasks each copy a group of its ranges (spark_app.range_copy), filed into the flow's
ledger, and committed. Then the quarantined topics that are due catch up (copied outside the batches), so a topic
that rejoins is written by the very next batch. A new batch starts every `trigger_interval_s`, or at once after one
that took longer. When the subscription changes (a new topic, a partition added) the batches are stopped between two
and started again on the same log; the planner starts the new partitions at their earliest offset, so records
produced before the mirror noticed a topic are copied too.

Planning in the driver, not in a streaming source, is what keeps the mirror's Python to the driver and one worker per
task: a Python streaming source costs a process of its own for as long as it runs, and Spark's one-off Python steps
to look it up, make it and plan its first batch leave one more each (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable

from .batch_log import BatchLog, Planned
from .clients import PartitionOffsets
from .config import STOP_BATCH_TIMEOUT_S, FlowMode
from .errors import first_cause
from .ledger import by_topic
from .outbox import producer_settings
from .planner import BatchPlanner, rebased, remade_within, topic_ids_now
from .policy import transactional
from .range_copy import RangeCopier
from .ranges import Landing, OffsetRange
from .run_check import RunWitness
from .runner import FlowRunner, Subscription
from .storage import checkpoint_files
from .transactions import fence

log = logging.getLogger(__name__)


class ThroughputRunner(FlowRunner):
    """A flow's run of micro-batches: start, stop between batches, and its catch-ups between them."""

    _thread: threading.Thread | None = None
    _error: str | None = None  # why the last run of batches failed
    _committed: PartitionOffsets | None = None  # where the last committed batch ended
    # An exactly-once flow's run of batches answers its tasks (spark_app.run_check): none of an earlier run commits.
    _witness: RunWitness | None = None

    def start(self, subscription: Subscription, available_now: bool) -> None:
        self.subscription = subscription
        self._end_run()
        if transactional(self.flow, self.target.is_eventhubs):
            if self.flow.exactly_once:
                self._witness = RunWitness(self.spark, f"flow {self.flow.name}: exactly_once")
            # The zombies of every slot id a run before this one started.
            fence(self.flow, self.target, producer_settings(self.plan.rules), 0, self.ledger.state.slots)
        self.catch_up()
        if not subscription:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self._thread = None
            return
        state = self.ledger.state
        self._stopping = threading.Event()
        planner = BatchPlanner(
            self.source, dict(subscription), self.flow.start_from, self.spark.defaultParallelism,
            self.flow.max_records_per_trigger, self.flow.max_bytes_per_trigger, by_topic(state.adopted),
            by_topic(state.positions) if state.mode is FlowMode.REALTIME else None, self._stopping,
        )  # fmt: skip
        self._error = None
        self._group = f"mirrorkit-batches-{uuid.uuid4().hex[:8]}"
        self._thread = threading.Thread(target=self._run, args=(planner, available_now), name=self._group, daemon=True)
        self._thread.start()
        names = [t for t, _ in subscription]
        held = sorted(set(names) & set(self.ledger.quarantined))
        active = [t for t in names if t not in held]
        log.info(
            "flow %s: mirroring %d topic(s): %s%s", self.flow.name, len(active), ", ".join(active),
            f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip

    def _run(self, planner: BatchPlanner, available_now: bool) -> None:
        """Run batches until stopped (or, available-now, until nothing new is left); a failure is `failure`'s."""
        self.spark.setJobGroup(self._group, f"mirror {self.flow.name}", interruptOnCancel=True)
        try:
            self._batches(planner, available_now)
        except Exception as err:  # the flow's failure, in the mirror's own words; a cancelled batch is no failure
            log.debug("flow %s: its batches ended with an error", self.flow.name, exc_info=True)
            if not self._stopping.is_set():
                self._error = first_cause(str(err))

    def _batches(self, planner: BatchPlanner, available_now: bool) -> None:
        """A batch planned and not committed before (a crash, a cancelled stop) runs again first, as planned."""
        batch_log = BatchLog(checkpoint_files(self.flow.checkpoint_location, self.spark))
        resume = batch_log.resume()
        batch, start, end = resume.batch, resume.start, resume.planned
        self._committed = _positions(start)
        if available_now:
            planner.prepare_available_now()
        interval_s = self.config.trigger_interval_s
        while not self._stopping.is_set():
            began = time.monotonic()
            start = self._rebased(start, end, planner)
            if end is None:  # planning reads the source, not the ledger: the lock is not held meanwhile
                end = planner.latest(start, self.ledger.totals.mean_record_bytes())
                if end == start:
                    end = None
                else:
                    batch_log.plan(batch, end)
            if end is not None:
                with self.lock:
                    landed = self._copy(planner.ranges(start, end), lives=end.ids)
                    remade, restarts = remade_within(
                        start, end, landed, lambda topics: topic_ids_now(self.source, topics, self.flow.name)
                    )
                    self.ledger.note_topic_ids(end.ids | remade)
                    self.ledger.file(landed + restarts)
                    batch_log.commit(batch)
                    self._committed = _positions(end)
                    batch, start, end = batch + 1, end, None
                    self._catch_up()
            elif available_now:
                return  # everything there at the start is copied
            if not available_now:  # a batch starts every interval, or at once after one that took longer
                self._stopping.wait(max(0.0, began + interval_s - time.monotonic()))

    def _rebased(self, start: Planned, end: Planned | None, planner: BatchPlanner) -> Planned:
        """Where the batch starts, past topics made again in the middle of the batch before (spark_app.planner.rebased,
        from what the ledger filed: a real-time run's positions are the planner's `resume` instead). An available-now
        run copies nothing more of such a topic: the ends it fixed are the old life's."""
        state = self.ledger.state
        if state.mode is not FlowMode.THROUGHPUT:
            return start
        moved = rebased(start, end, state.topic_ids, state.positions)
        planner.drop_other_lives({t: i for t, i in moved.ids.items() if start.ids.get(t) != i})
        return moved

    def _copy(
        self, groups: list[list[OffsetRange]], ready: dict[str, int] | None = None, lives: dict[str, str] | None = None
    ) -> list[Landing]:
        """Copy each group of ranges in a Spark task of its own, writing only the topics `ready` (by default those not
        quarantined now); their landings. A task's index is its slot, as a transactional flow's producer is named
        (spark_app.transactions); `lives` are the ids of the topics' lives the ranges were planned in."""
        if not groups:
            return []
        if ready is None:
            ready = self.ledger.quarantines.ready(self.plan.mirrored)
        run = self._witness.address if self._witness is not None else None
        copier = RangeCopier(self.flow, self.source, self.target, ready, self.plan.rules, lives, run)
        if transactional(self.flow, self.target.is_eventhubs):  # the slots' mark, saved before a slot past it starts
            self.ledger.slots_start(len(groups))

        def copy(slot: int, tasks: Iterable[list[OffsetRange]]) -> list[Landing]:
            return [landing for ranges in tasks for landing in copier.copy(ranges, slot)]

        tasks = self.spark.parallelize(groups, len(groups))
        return tasks.mapPartitionsWithIndex(copy).collect()

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        """Stop after the batch in flight, so no batch is cut in half and none is written twice. A batch stuck past
        `timeout_s` is cancelled, and runs again, as planned, when the flow starts again (at least once)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._end_run()
            return
        self._stopping.set()
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("flow %s: the batch in flight did not end within %.0f s; cancelling it, it runs"
                        " again when the flow starts again", self.flow.name, timeout_s)  # fmt: skip
            self.spark.cancelJobGroup(self._group)
            thread.join(timeout_s)
            if thread.is_alive():  # a daemon thread: it ends with the process, its batch uncommitted
                log.error("flow %s: the cancelled batch did not end within %.0f s either; stopping without it",
                          self.flow.name, timeout_s)  # fmt: skip
        self._end_run()

    def _end_run(self) -> None:
        """The run of batches is over: a task of it still copying (a batch cancelled, or abandoned) commits nothing."""
        if self._witness is not None:
            self._witness.close()
            self._witness = None

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def failure(self) -> str | None:
        return None if self.running() else self._error

    def catch_up(self) -> None:
        """Catch up the quarantined topics that are due; between two batches, as each batch holds the lock (a batch
        that holds it long leaves the catch-up to the next round)."""
        with self.between_copies() as free:
            if free:
                self._catch_up()

    def _positions(self) -> PartitionOffsets:
        """Where the last committed batch ended."""
        return dict(self._committed or {})

    def _catch_up(self) -> None:
        """Copy what each quarantined topic that may rejoin owes, outside the batches (under `lock`)."""
        self.ledger.catch_up(
            self.plan.mirrored, lambda ranges, ready, lives: self._copy([[r] for r in ranges], ready, lives)
        )


def _positions(entry: Planned) -> PartitionOffsets:
    return {(topic, int(p)): offset for topic, offsets in entry.offsets.items() for p, offset in offsets.items()}
