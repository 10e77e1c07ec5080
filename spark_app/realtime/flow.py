"""Real-time mode: a flow as long-running copier tasks that write each record as it comes.

A micro-batch costs about 0.3 s of Spark's own work, and a record waits for the next batch and then for its batch
(bench/: p99 near a second). Spark's own real-time mode reads only through its Kafka source into the JVM and gives
no landing offsets back, which the DR bookkeeping needs. So a real-time flow keeps the mirror's per-record path and
uses Spark as the scheduler of long-running copier tasks instead of micro-batches (spark_app.realtime.job).

Positions live in the flow's ledger, not in a batch log: the tasks' reports are filed as a batch's landings
are, every `realtime_commit_interval_s`. A restart resumes at the saved positions: what a SIGKILL copies again is
what landed after the last save, and the start counts it on the target and logs it. The job is stopped (each task
flushes and reports) and started again on the same positions when the flow's subscription changes or a quarantined
topic rejoins; a refused record holds only its own partition at once. Tasks that fail past Spark's own retries (its
`spark.task.maxFailures` counts over the job's whole life) are started again from the saved positions with a backoff,
so they never stop the other flows; only a cause that would fail again at once (bad credentials, state that cannot
be saved) stops the mirror. `run --available-now` gives each task its partitions' end offsets at the start; it stops
there, and any failure fails the run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec

from .. import clients, transactions
from ..clients import Partition, PartitionOffsets
from ..config import STOP_BATCH_TIMEOUT_S
from ..outbox import producer_settings
from ..planner import topic_ids_now
from ..policy import target_topic, transactional
from ..ranges import Landing
from ..runner import FlowRunner, Subscription
from ..transactions import fence
from .job import CopyJob
from .task import Assignment

log = logging.getLogger(__name__)

# The longest wait before copier tasks that failed are started again (the backoff doubles from 1 s up to it).
RESTART_BACKOFF_MAX_S = 60.0
# How often partitions left out of the job for not answering are asked again (the job restarts to place them).
UNPLACED_RECHECK_S = 30.0
# How long `run --available-now` asks again for the ends of partitions that do not answer before it leaves them.
AVAILABLE_NOW_WAIT_S = 60.0
ASK_AGAIN_S = 1.0


def _answered(
    admin: AdminClient, partitions: list[Partition], spec: OffsetSpec, wait_s: float, read_committed: bool = True
) -> PartitionOffsets:
    """The offsets of the partitions that answer, asking those that do not again for up to `wait_s`. Raises only when
    the cluster does not answer at all."""
    found, silent = clients.list_offsets_each(admin, partitions, spec, read_committed)
    deadline = time.monotonic() + wait_s
    while silent and time.monotonic() < deadline:
        time.sleep(ASK_AGAIN_S)
        more, silent = clients.list_offsets_each(admin, list(silent), spec, read_committed)
        found |= more
    return found


class RealtimeRunner(FlowRunner):
    """A flow in real-time mode: a `CopyJob` of copier tasks, filing into the flow's ledger."""

    job: CopyJob | None = None
    clock: Callable[[], float] = staticmethod(time.monotonic)
    _unplaced_since: float | None = None  # when `_assign` last left out partitions that did not answer
    _available_now = False
    # Restarts of failed tasks: how many in a row, when the last was, and when the next is due (None: none pending).
    _restarts = 0
    _restarted_at = -math.inf
    _restart_at: float | None = None
    # Per topic, its partitions the job's tasks found gone backwards (set at `start`), until the topic is filed in its
    # new life; a start meanwhile keeps their new life's positions.
    _went_back: dict[str, set[int]]
    _ids_admin: AdminClient | None = None  # asks the source for its topics' ids between topic syncs
    # Per partition, where the job's tasks had reached the target when the source last answered the id its positions
    # belong to: what landed below it was read before, so was the old life's (`_made_again`).
    _old_life: Mapping[Partition, int] = MappingProxyType({})  # rebound, never changed in place

    def start(self, subscription: Subscription, available_now: bool) -> None:
        self.subscription = subscription
        went_back, self._went_back = getattr(self, "_went_back", {}), {}
        self._available_now = available_now
        with self.lock:
            self._release_due()
            assignment = self._assign(subscription, available_now, went_back)
        if not assignment.starts:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.job = None
            return
        job = CopyJob(
            self.spark, self.flow, self.source, self.target, assignment, self.flow.realtime_tasks,
            self.plan.rules, self.config.realtime_commit_interval_s, self._file,
        )  # fmt: skip
        if transactional(self.flow, self.target.is_eventhubs):
            self._fence_idle(job.tasks)
        self.job = job.start()
        copied = sorted({t for t, _ in assignment.starts})
        held = sorted({t for t, _ in subscription} - set(copied))
        log.info(
            "flow %s: mirroring %d topic(s) in real time with %d task(s): %s%s", self.flow.name, len(copied),
            self.job.tasks, ", ".join(copied), f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip

    def _fence_idle(self, used: int) -> None:
        """Before this run's `used` slots start: file them in the flow's mark (the ledger's `slots`), then fence every
        slot id this run leaves idle up to the mark and `realtime_tasks`, so no zombie of a run with more slots (a
        higher `realtime_tasks` before, or more partitions) writes on beside the slot now copying its partitions."""
        with self.lock:
            self.ledger.slots_start(used)
        end = max(self.flow.realtime_tasks, self.ledger.state.slots)
        fence(self.flow, self.target, producer_settings(self.plan.rules), used, end)

    def _assign(
        self, subscription: Subscription, available_now: bool, went_back: dict[str, set[int]] | None = None
    ) -> Assignment:
        """Where each partition the target can take starts: its saved position (or first held offset), else an
        adopted one, else `start_from` for a new topic and the log start for a new partition. A saved position whose
        topic was made again meanwhile (another topic id) or that lies past the log's end starts over at the log
        start, reported as offsets that went backwards. A new partition the target cannot take now (its topic
        quarantined, or the target lacks the partition) is held at that start, so its topic catches up from there; a
        topic the target lacks a partition of is quarantined whole.

        Where each partition new to the ledger starts is saved before the tasks start, so a crash before their first
        report resumes there (and reports what retention deleted meanwhile) rather than meeting them as new.

        A partition whose leader does not answer never stops the others. With a start it is assigned (its consumer
        waits for the leader; a log start that does not answer is read as 0, from which the consumer moves to the log
        start). Without one (a new topic at `start_from: latest`), or in an available-now run that needs its end
        (asked again for AVAILABLE_NOW_WAIT_S first), it is left out and placed when it answers (UNPLACED_RECHECK_S)
        or by the next run.

        Of a topic made again, the partitions the job before found gone backwards (`went_back`) are no longer the old
        life's: they go on from their positions in the new life, and only the others start over."""
        went_back = went_back or {}
        ready = self.ledger.quarantines.ready(self.plan.mirrored)
        every = [(t, p) for t, n in subscription for p in range(n)]
        admin = clients.admin(self.source)
        remade = self.ledger.note_topic_ids(clients.topic_ids(admin, {t for t, _ in subscription}))
        ends = _answered(admin, every, OffsetSpec.latest(), AVAILABLE_NOW_WAIT_S if available_now else 0.0)
        resume = self.ledger.resume_points()
        # Offsets that went backwards while the flow was stopped: the topic made again (another id), or a log shorter
        # than where the flow stood. Such a partition starts over at its log start, and the ledger reports it.
        back = {
            tp: resume.pop(tp)
            for tp in every
            if tp in resume
            and ((tp[0] in remade and tp[1] not in went_back.get(tp[0], ())) or (tp in ends and resume[tp] > ends[tp]))
        }
        # What landed of a topic made again past where the old life was last confirmed may be the new life's, read on
        # unnoticed; without a confirmation in this process (the mirror started since), from its start.
        self.ledger.read_on({tp: (min(self._old_life.get(tp, 0), was), was - 1) for tp, was in back.items()
                             if tp[0] in remade})  # fmt: skip
        self._old_life = {tp: o for tp, o in self._old_life.items() if tp[0] not in remade}
        fresh = [tp for tp in every if tp not in resume]
        known = {t for t, _ in resume} | {t for t, _ in back}
        at_end = [tp for tp in fresh if self.flow.start_from == "latest" and tp[0] not in known]
        starts = {tp: resume[tp] for tp in every if tp in resume} | {tp: ends[tp] for tp in at_end if tp in ends}
        from_start = [tp for tp in fresh if tp not in at_end]
        log_starts = _answered(admin, from_start, OffsetSpec.earliest(), 0.0)
        starts |= dict.fromkeys(from_start, 0) | log_starts
        unplaced = [tp for tp in every if tp not in starts or (available_now and tp not in ends)]
        self._unplaced_since = self.clock() if unplaced else None
        if unplaced:
            log.warning("flow %s: %d partition(s) did not answer and wait %s: %s", self.flow.name, len(unplaced),
                        "for the next run" if available_now else "until they do", unplaced[:5])  # fmt: skip
        for tp in unplaced:
            starts.pop(tp, None)
        lacking = [(t, p) for t, p in starts if t in ready and p >= ready[t]]
        held = lacking + [(t, p) for t, p in fresh if t not in ready and (t, p) in starts]
        resets = [Landing(t, p, starts[(t, p)], starts[(t, p)], reset_from=was) for (t, p), was in back.items()]
        holds = [Landing(t, p, starts[(t, p)], starts[(t, p)]) for t, p in held]
        for row in holds:
            row.hold(row.first_offset)
        short = {t for t, _ in lacking}
        writable = {tp: offset for tp, offset in starts.items() if tp[0] in ready and tp[0] not in short}
        # Not a log start that did not answer (read as 0): saved, the move to the real one would report a gap.
        self.ledger.expect({tp: o for tp, o in writable.items() if tp not in from_start or tp in log_starts})
        if self.flow.exactly_once:  # positions the old life of a topic committed would skip the new one's records
            transactions.reset_positions(self.flow, self.target, {tp: starts[tp] for tp in back if tp in writable})
        self._report_recopies(writable)
        self.ledger.file(resets + holds)  # saves the new starts, and the marks the report left, too
        ids = {t: i for t, i in self.ledger.state.topic_ids.items() if any(tp[0] == t for tp in writable)}
        return Assignment(writable, {tp: ends[tp] for tp in writable} if available_now else None, ids)

    def _report_recopies(self, starts: PartitionOffsets) -> None:
        """Log how many records landed after the positions were saved: a crash copies them again. A partition with
        no landing saved yet takes the target's end now as its mark, so a crash before its first report counts what
        that life copied too."""
        landed = self.ledger.state.landed
        on_target = {(target_topic(self.flow, t), p): (t, p) for t, p in starts}
        if not on_target:
            return
        ends = _answered(clients.admin(self.target), list(on_target), OffsetSpec.latest(), 0.0, read_committed=False)
        again = sum(max(0, ends[tp] - landed[src]) for tp, src in on_target.items() if tp in ends and src in landed)
        landed.update({src: ends[tp] for tp, src in on_target.items() if tp in ends and src not in landed})
        if again:
            self.totals.recopied += again
            log.warning("flow %s: resuming at the saved positions; %d record(s) landed after the last save and are"
                        " copied again (counted on the target, where records others wrote count too)", self.flow.name,
                        again)  # fmt: skip

    def _file(self, rows: list[Landing]) -> None:
        """File the tasks' report. A topic every partition of which a task found gone backwards (the topic made again
        while the job ran) now stands in its new life: its new id is noted and saved with the report, or the next start
        would take the new life's positions for the old one's and copy the new topic again from its log start. Until
        every partition went back the old id stays: a partition that did not went on reading the new life where the
        old one stood, and only a start that takes the topic as made again copies what lies below it."""
        for row in rows:
            if row.reset_from >= 0:
                self._went_back.setdefault(row.topic, set()).add(row.partition)
        counts = dict(self.subscription)
        every = {t for t, parts in self._went_back.items() if t in counts and parts >= set(range(counts[t]))}
        ids = topic_ids_now(self.source, every, self.flow.name)
        for topic in ids:
            del self._went_back[topic]
        with self.lock:
            self.ledger.note_topic_ids(ids)
            self.ledger.file(rows)
        if ids and self.job is not None:
            self.job.note_ids(ids)

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        if self.job is not None:
            self.job.stop(timeout_s)

    def running(self) -> bool:
        return self.job is not None and self.job.running()

    def wait(self) -> None:
        if self.job is not None:
            self.job.wait()

    def failure(self) -> str | None:
        """Why the flow stopped: a cause that would fail again at once, or in an available-now run any failure. A
        continuous run's tasks that failed otherwise are started again by `catch_up`, so they never stop the other
        flows."""
        job = self.job
        if job is None or job.error is None:
            return None
        return job.error if job.terminal or self._available_now else None

    def _positions(self) -> PartitionOffsets:
        return self.job.lag_positions() if self.job is not None else {}

    def catch_up(self) -> None:
        """Restart the job when a quarantined topic may rejoin (read from its first held offsets), when a task held
        a partition (its topic's other partitions stop until then), when topic sync quarantined a topic the job
        copies, when partitions left out for not answering may answer now, or when a topic the job copies was made
        again and its tasks did not find every partition gone backwards (see `_made_again`)."""
        made_again = self._made_again()
        with self.lock:
            due = self._release_due()
            copying = {t for t, _ in self.job.reached} if self.job is not None else set()
            stopped = copying - set(self.ledger.quarantines.ready(self.plan.mirrored))
        since = self._unplaced_since
        unplaced = since is not None and self.clock() - since >= UNPLACED_RECHECK_S
        if self._failed_tasks_due():
            self.start(self.subscription, available_now=False)
        elif due or stopped or unplaced or made_again or (self.job is not None and self.job.held_any()):
            self.stop()
            self.start(self.subscription, available_now=False)

    def _made_again(self) -> set[str]:
        """The topics the running job copies whose id at the source is not the one their positions belong to: made
        again between two topic syncs, and not (yet) filed in their new life. A partition whose new life had passed
        where its task stood before the task looked is read on from there, unnoticed; the start that follows takes the
        topic as made again, so what lies below is copied too (a partition the tasks found gone backwards goes on)."""
        job = self.job
        if job is None or not job.running():
            return set()
        if self._ids_admin is None:
            self._ids_admin = clients.admin(self.source)
        landed = job.lag_positions()  # before the ids are asked: what had landed then was read before
        try:
            ids = clients.topic_ids(self._ids_admin, {t for t, _ in landed})
        except KafkaException:
            return set()  # asked again at the next topic sync
        with self.lock:
            saved = dict(self.ledger.state.topic_ids)
        made = {t for t, i in ids.items() if saved.get(t, i) != i}
        self._old_life = {**self._old_life, **{tp: o for tp, o in landed.items() if tp[0] in ids and tp[0] not in made}}
        if made:
            log.warning("flow %s: topic(s) made again while copied: %s; the copy starts again, the new life of each"
                        " partition not yet found gone backwards from its log start", self.flow.name,
                        ", ".join(sorted(made)))  # fmt: skip
        return made

    def _failed_tasks_due(self) -> bool:
        """Whether the job's tasks failed (past Spark's own retries of a task) and their restart is due: at once
        the first time, then after a backoff that doubles up to RESTART_BACKOFF_MAX_S, and starts over once the
        tasks ran for RESTART_BACKOFF_MAX_S without failing."""
        job = self.job
        if job is None or job.error is None or job.terminal or job.running():
            return False
        now = self.clock()
        if self._restart_at is None:
            calm = now - self._restarted_at > RESTART_BACKOFF_MAX_S
            self._restarts = 0 if calm else self._restarts + 1
            self._restart_at = now + (0.0 if calm else min(RESTART_BACKOFF_MAX_S, 2.0**self._restarts))
            log.error("flow %s: its copier tasks failed: %s; they start again from the saved positions in %.0f s",
                      self.flow.name, job.error, self._restart_at - now)  # fmt: skip
            self.metrics.error(self.flow.name, "tasks_restarted")
        if now < self._restart_at:
            return False
        self._restart_at, self._restarted_at = None, now
        return True

    def _release_due(self) -> list[str]:
        due = self.ledger.quarantines.due(self.plan.mirrored)
        for topic in due:
            self.ledger.release(topic)
        return due
