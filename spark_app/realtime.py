"""Real-time mode: long-running Spark tasks copy their source partitions record by record and tell the driver where
each record landed.

A micro-batch costs about 0.3 s of Spark's own work, and a record waits for the next batch and then for its batch
(bench/: p99 near a second). Spark's own real-time mode reads only through its Kafka source into the JVM and gives
no landing offsets back, which the DR bookkeeping needs. So a real-time flow keeps the mirror's copy path and uses
Spark as the scheduler of long-running copier tasks instead of a streaming query:

- The driver runs one Spark job of `realtime_tasks` tasks for the flow. Each task asks the driver, over a socket
  (multiprocessing.connection, authenticated with a key made for this run), which source partitions it copies and
  from where; reads them with one librdkafka consumer; and writes each record as it comes through the writer's
  `Outbox` (the same fidelity, provenance header, echo drops and refusals as a batch), with a producer linger of a
  few milliseconds.
- Every REPORT_S a task sends one landing per partition, covering its offsets since the last report up to the first
  record not delivered yet. Every `realtime_commit_interval_s` the driver files what it heard as it files a batch:
  totals and metrics, the quarantine (which saves the positions in the flow's state beside its checkpoint) and the
  DR service (offset syncs, checkpoints).
- Positions live in the flow's state, not in a Spark checkpoint. A restart resumes at the saved positions: what a
  SIGKILL copies again is what landed after the last save, and the start counts it on the target and logs it.
- A task that fails is retried by Spark (spark.task.maxFailures) and resumes where its partitions' newest report
  ended. The job is stopped (each task flushes and reports) and started again on the same positions when the flow's
  topic set changes or a quarantined topic rejoins; a refused record holds only its own partition at once.
- `run --available-now` gives each task its partitions' end offsets at the start; it stops there.

Cores: each task holds one for as long as the flow runs, and copies any number of partitions with one consumer and
one producer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import cast

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import OffsetSpec
from pyspark.sql import SparkSession

from . import clients
from .config import STOP_BATCH_TIMEOUT_S, ClusterConfig, FlowConfig
from .metrics import owed_from
from .policy import target_topic
from .ranges import Landing
from .stream import FlowMirror, Topics, first_cause
from .writer import CONSUMER_DEFAULTS, Outbox, Partition, Record, end_of_log, producer_settings

log = logging.getLogger(__name__)

REPORT_S = 0.5  # how often a task tells the driver where its partitions stand
# A task's consumer returns what it has after at most this long, so a record waits for at most that before it is sent.
CONSUME_WAIT_S = 0.005
CONSUME_BATCH = 2_000
# The producer sends what it holds after this long: a few ms buys batches of a few records per partition at
# 10,000 records/s (bench/) without adding latency users see.
LINGER_MS = 2
# End-of-log events tell an available-now run where each partition ends (past transaction markers); a continuous run
# has no use for them, and they cost about a tenth more events at a steady rate.
CONSUMER_SETTINGS = CONSUMER_DEFAULTS | {"group.id": "mirrorkit-realtime", "enable.partition.eof": False}
STOP = "stop"


@dataclass(frozen=True)
class Assignment:
    """What one task copies: per source partition where it starts, and for `run --available-now` where it stops."""

    starts: dict[Partition, int]
    stops: dict[Partition, int] | None


@dataclass
class _Part:
    """One partition a task copies: the landing its records go to now, and the offset after the last one read."""

    landing: Landing
    next: int
    stop: int | None
    read_any: bool = False
    reported: bool = False
    held_from: int = -1  # the first offset held back: nothing from there on is reported as copied


class CopierTask:
    """What each real-time Spark task runs (picklable): copy what the driver assigns until it says stop."""

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, address: tuple[str, int],
        authkey: bytes, max_message_bytes: int | None,
    ) -> None:  # fmt: skip
        self.flow = flow
        self.source = source
        self.target = target
        self.address = address
        self.authkey = authkey
        self.producer_settings = producer_settings(max_message_bytes) | {"linger.ms": LINGER_MS}

    def __call__(self, slot: int, _rows: Iterable[int]) -> Iterator[int]:
        with Client(self.address, authkey=self.authkey) as conn:
            conn.send(("hello", slot))
            assignment = cast(Assignment, conn.recv())
            yield LiveCopy(self, assignment).run(conn)


class LiveCopy:
    """One task's copy loop over its assigned partitions."""

    def __init__(self, task: CopierTask, assignment: Assignment) -> None:
        self.flow = task.flow
        self.task = task
        stops = assignment.stops or {}
        self.parts = {
            key: _Part(Landing(key[0], key[1], start, start), start, stops.get(key))
            for key, start in assignment.starts.items()
        }
        self.copied = 0

    def run(self, conn: Connection) -> int:
        """Copy until every partition reached its stop (available-now) or the driver says stop; returns the count."""
        producer = clients.shared_producer(self.task.target, self.task.producer_settings)
        eof = {"enable.partition.eof": any(part.stop is not None for part in self.parts.values())}
        consumer = clients.consumer(self.task.source, CONSUMER_SETTINGS | eof)  # its own: a task pauses what it holds
        outbox = Outbox(self.flow, producer, lambda key: self.parts[key].landing)
        open_ = {key for key, part in self.parts.items() if part.stop is None or part.next < part.stop}
        for key in self.parts:
            outbox.open(key)
        consumer.assign([TopicPartition(t, p, self.parts[(t, p)].next) for t, p in sorted(open_)])
        report_at = time.monotonic() + REPORT_S
        stopped = False
        try:
            while open_ and not stopped:
                # Read from assigned partitions, so topic, partition and offset are set (the stubs say Optional).
                for msg in cast(list[Record], consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S)):
                    key = (msg.topic(), msg.partition())
                    if key in open_ and not self._take(msg, key, outbox, conn):
                        open_.discard(key)
                        consumer.pause([TopicPartition(*key)])
                producer.poll(0)
                if time.monotonic() >= report_at:
                    report_at = time.monotonic() + REPORT_S
                    self._hold(outbox.settle(), open_, consumer)
                    outbox.raise_failures()
                    conn.send(("landed", self._report(outbox)))
                    stopped = conn.poll() and conn.recv() == STOP
            outbox.flush(300)
            self._hold(outbox.settle(), open_, consumer)
        finally:
            consumer.close()
        conn.send(("done", self._report(outbox)))
        return self.copied

    def _take(self, msg: Record, key: Partition, outbox: Outbox, conn: Connection) -> bool:
        """One consumed event of an open partition; False when the partition is done: its stop reached, or held."""
        part, offset = self.parts[key], msg.offset()
        if msg.error() is not None:  # the log's end: no record, but the position moves past markers
            end_of_log(self.flow, msg)
            part.next = max(part.next, offset)
            return part.stop is None or part.next < part.stop
        if part.stop is not None and offset >= part.stop:
            return False
        if offset < part.next:
            self._went_back(key, offset, outbox, conn)
        elif not part.read_any:
            part.landing.first_offset = offset  # past the start: retention deleted what lay between (reported)
        part.read_any = True
        part.next = offset + 1
        if not outbox.send(msg, key, offset, part.landing):
            return False
        self.copied += 1
        return part.stop is None or part.next < part.stop

    def _went_back(self, key: Partition, offset: int, outbox: Outbox, conn: Connection) -> None:
        """The consumer was reset to the log start below where the partition stood (the topic was deleted and made
        again, or truncated): report what landed before, then start a landing that says so (spark_app.quarantine)."""
        outbox.flush(300)
        outbox.settle()
        conn.send(("landed", self._report(outbox)))
        part = self.parts[key]
        part.landing = Landing(key[0], key[1], offset, offset, reset_from=part.next)

    def _hold(self, held: set[Partition], open_: set[Partition], consumer: Consumer) -> None:
        """Partitions refused by the target after later records were sent: read no further."""
        for key in held & open_:
            open_.discard(key)
            consumer.pause([TopicPartition(*key)])

    def _report(self, outbox: Outbox) -> list[Landing]:
        """Each partition's landing up to its first record not delivered yet; each goes on with a new landing."""
        rows = []
        for key, part in self.parts.items():
            landing = part.landing
            in_flight = outbox.in_flight.get(key)
            landing.end_offset = in_flight[0] if in_flight else part.next
            if landing.held_from >= 0:  # nothing from there on is read: the hold is its first offset only
                part.held_from = min(landing.held_from, part.held_from if part.held_from >= 0 else landing.held_from)
                landing.held_until = part.held_from
            if part.held_from >= 0:
                landing.end_offset = min(landing.end_offset, part.held_from)
            if not part.reported or _changed(landing):
                rows.append(landing)
                part.landing = Landing(key[0], key[1], landing.end_offset, landing.end_offset)
            part.reported = True
        return rows


def _changed(landing: Landing) -> bool:
    """Whether a landing says anything a position, a count or a hold does not already."""
    return (
        landing.end_offset != landing.first_offset
        or landing.records + landing.dropped + landing.dead_lettered > 0
        or bool(landing.runs)
        or landing.held_from >= 0
        or landing.reset_from >= 0
    )


class CopyJob:
    """One run of a real-time flow's tasks: the Spark job, the socket they report on, and the filing of reports.

    `on_landed` gets what the tasks reported, every `commit_interval_s` and once more when the job ends.
    """

    def __init__(
        self, spark: SparkSession, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig,
        assignment: Assignment, tasks: int, max_message_bytes: int | None, commit_interval_s: float,
        on_landed: Callable[[list[Landing]], None],
    ) -> None:  # fmt: skip
        self.spark = spark
        self.flow = flow
        self.reached = dict(assignment.starts)  # per partition, where its newest report ended
        self.error: str | None = None
        self._stops = assignment.stops
        keys = sorted(assignment.starts)
        self._slots = [keys[i :: max(1, tasks)] for i in range(min(max(1, tasks), len(keys)))]
        self._held: set[Partition] = set()
        self._on_landed = on_landed
        self._commit_interval_s = commit_interval_s
        self._inbox: list[Landing] = []
        self._lock = threading.Lock()  # the fields above that tasks' reports change
        self._filing = threading.Lock()  # one filing at a time, in the order the reports came
        self._conns: list[Connection] = []
        self._serving: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._ended = threading.Event()  # the Spark job returned
        self._done = threading.Event()  # and its last reports are filed
        self._closed = False
        self._group = f"mirrorkit-realtime-{uuid.uuid4().hex[:8]}"
        authkey = os.urandom(32)
        self._listener = Listener(("0.0.0.0", 0), authkey=authkey)
        address = (spark.conf.get("spark.driver.host") or "127.0.0.1", self._listener.address[1])
        self._task = CopierTask(flow, source, target, address, authkey, max_message_bytes)

    def start(self) -> CopyJob:
        for target in (self._accept, self._run, self._file_every):
            threading.Thread(target=target, name=f"{self._group}-{target.__name__}", daemon=True).start()
        return self

    @property
    def tasks(self) -> int:
        return len(self._slots)

    def running(self) -> bool:
        return not self._done.is_set()

    def held_any(self) -> bool:
        """Whether a task held a partition: its topic is quarantined, and its other partitions stop at a restart."""
        with self._lock:
            return bool(self._held)

    def wait(self) -> None:
        """Until every task has stopped (available-now: reached its stops) and its last reports are filed."""
        self._done.wait()

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        """Tell every task to stop, and wait for them to flush and report; past `timeout_s` cancel the job (what
        was in flight is copied again from the newest reports)."""
        self._stop_tasks()
        if not self._ended.wait(timeout_s):
            log.warning("flow %s: copier tasks did not stop within %.0f s; cancelling them", self.flow.name, timeout_s)
            self.spark.sparkContext.cancelJobGroup(self._group)
        self._done.wait()

    def _stop_tasks(self) -> None:
        self._stopping.set()
        with self._lock:
            for conn in self._conns:
                _send(conn, STOP)

    def _run(self) -> None:
        sc = self.spark.sparkContext
        sc.setJobGroup(self._group, f"mirror {self.flow.name} (real time)", interruptOnCancel=True)
        try:
            sc.parallelize(range(len(self._slots)), len(self._slots)).mapPartitionsWithIndex(self._task).collect()
        except Exception as err:  # noqa: BLE001 - a failed job is reported through `error`, in the mirror's words
            if not self._stopping.is_set():
                self.error = first_cause(str(err))
        finally:
            self._ended.set()
            self._finish()

    def _finish(self) -> None:
        """After the job: take the tasks' last reports (each connection ends after its task's), file them, close."""
        with self._lock:
            serving = list(self._serving)
        for thread in serving:
            thread.join(30)
        self._closed = True
        self._listener.close()
        self._file()
        self._done.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except (EOFError, AuthenticationError):  # not one of this job's tasks
                continue
            except OSError:  # closed (the job is over), or a connection that broke before its handshake
                if not self._closed:
                    time.sleep(0.1)
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), name=f"{self._group}-task", daemon=True)
            with self._lock:
                self._serving.append(thread)
            thread.start()

    def _serve(self, conn: Connection) -> None:
        """One task's connection: its assignment (from the newest reports: a retried task resumes there), then its
        reports until it ends."""
        with conn:
            try:
                _hello, slot = conn.recv()
                with self._lock:
                    keys = [k for k in self._slots[slot] if k not in self._held]
                    stops = {k: self._stops[k] for k in keys} if self._stops is not None else None
                    _send(conn, Assignment({k: self.reached[k] for k in keys}, stops))
                    self._conns.append(conn)
                    if self._stopping.is_set():
                        _send(conn, STOP)
                while True:
                    _kind, rows = conn.recv()
                    with self._lock:
                        for row in rows:
                            self.reached[(row.topic, row.partition)] = row.end_offset
                            if row.held_from >= 0:
                                self._held.add((row.topic, row.partition))
                        self._inbox.extend(rows)
            except (EOFError, OSError):  # the task ended, or died (Spark retries it)
                pass
            finally:
                with self._lock:
                    if conn in self._conns:
                        self._conns.remove(conn)

    def _file_every(self) -> None:
        while not self._done.wait(self._commit_interval_s):
            self._file()

    def _file(self) -> None:
        """Hand what the tasks reported to `on_landed`, in order. If that fails (a state file that cannot be saved,
        records lost at the source under `fail_on_data_loss`), the job stops with the error: its tasks would copy on
        with nothing saved."""
        with self._filing:
            with self._lock:
                rows, self._inbox = self._inbox, []
            if not rows:
                return
            try:
                self._on_landed(rows)
            except Exception as err:  # noqa: BLE001 - reported through `error`, which stops the mirror
                log.error("flow %s: filing what the copier tasks reported failed: %s", self.flow.name, err)
                self.error = self.error or f"filing what the copier tasks reported failed: {err}"
                self._stop_tasks()


def _send(conn: Connection, message: object) -> None:
    """Send to a task that may have just ended: then there is no one left to tell."""
    with contextlib.suppress(OSError):
        conn.send(message)


class RealtimeFlowMirror(FlowMirror):
    """A flow in real-time mode: the flow's topic sync, quarantine and bookkeeping, with a `CopyJob` in place of the
    streaming query."""

    job: CopyJob | None = None
    _copying: set[str] = set()  # the topics the job copies

    def start(self, topics: Topics, available_now: bool) -> None:
        self.topics = topics
        with self._between_batches:
            self._release_due()
            assignment = self._assign(topics, available_now)
        self._copying = {t for t, _ in assignment.starts}
        if not assignment.starts:
            log.warning("flow %s: no topic to mirror yet", self.flow.name)
            self.job = None
            return
        self.job = CopyJob(
            self.spark, self.flow, self.source, self.target, assignment, self.flow.realtime_tasks,
            self.plan.max_message_bytes, self.config.realtime_commit_interval_s, self._file_landings,
        ).start()  # fmt: skip
        copied = sorted({t for t, _ in assignment.starts})
        held = sorted({t for t, _ in topics} - set(copied))
        log.info(
            "flow %s: mirroring %d topic(s) in real time with %d task(s): %s%s", self.flow.name, len(copied),
            self.job.tasks, ", ".join(copied), f"; quarantined: {', '.join(held)}" if held else "",
        )  # fmt: skip

    def _assign(self, topics: Topics, available_now: bool) -> Assignment:
        """Where each partition the target can take starts: its saved position (or first held offset), else an
        adopted one, else `start_from` for a new topic and the log start for a new partition. A new partition the
        target cannot take now (its topic quarantined, or the target lacks the partition) is held at that start, so
        its topic catches up from there; a topic the target lacks a partition of is quarantined whole."""
        ready = self.quarantine.ready(self.plan.mirrored)
        state = self.quarantine.state
        resume = owed_from(state.adopted | state.positions, self.quarantine.held())
        every = [(t, p) for t, n in topics for p in range(n)]
        admin = clients.admin(self.source)
        ends = clients.list_offsets(admin, every, OffsetSpec.latest(), read_committed=True)
        fresh = [tp for tp in every if tp not in resume]
        known = {t for t, _ in resume}
        starts = {tp: resume[tp] for tp in every if tp in resume}
        starts |= {tp: ends[tp] for tp in fresh if self.flow.start_from == "latest" and tp[0] not in known}
        starts |= clients.list_offsets(admin, [tp for tp in fresh if tp not in starts], OffsetSpec.earliest())
        lacking = [(t, p) for t, p in every if t in ready and p >= ready[t]]
        held = lacking + [(t, p) for t, p in fresh if t not in ready]
        rows = [Landing(t, p, starts[(t, p)], starts[(t, p)]) for t, p in held]
        for row in rows:
            row.hold(row.first_offset)
        self._file(rows)
        short = {t for t, _ in lacking}
        writable = {tp: offset for tp, offset in starts.items() if tp[0] in ready and tp[0] not in short}
        self._report_recopies(writable)
        return Assignment(writable, {tp: ends[tp] for tp in writable} if available_now else None)

    def _report_recopies(self, starts: dict[Partition, int]) -> None:
        """Log how many records landed after the positions were saved: a crash copies them again."""
        landed = self.quarantine.state.landed
        saved = {(target_topic(self.flow, t), p): landed[(t, p)] for t, p in starts if (t, p) in landed}
        if not saved:
            return
        ends = clients.list_offsets(clients.admin(self.target), list(saved), OffsetSpec.latest())
        again = sum(max(0, ends[tp] - offset) for tp, offset in saved.items())
        if again:
            self.totals.recopied += again
            log.warning("flow %s: resuming at the saved positions; %d record(s) landed after the last save and are"
                        " copied again (counted on the target, where records others wrote count too)", self.flow.name,
                        again)  # fmt: skip

    def _file_landings(self, rows: list[Landing]) -> None:
        with self._between_batches:
            self._count(rows)
            self._file(rows)

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        if self.job is not None:
            self.job.stop(timeout_s)

    def running(self) -> bool:
        return self.job is not None and self.job.running()

    def wait(self) -> None:
        if self.job is not None:
            self.job.wait()

    def failure(self) -> str | None:
        return self.job.error if self.job is not None else None

    def next_offsets(self) -> dict[tuple[str, int], int]:
        if self.job is not None:
            self._next_offsets.update(self.job.reached)
        return dict(self._next_offsets)

    def catch_up(self) -> None:
        """Restart the job when a quarantined topic may rejoin (read from its first held offsets), when a task held
        a partition (its topic's other partitions stop until then), or when topic sync quarantined a topic."""
        with self._between_batches:
            due = self._release_due()
            stopped = self._copying - set(self.quarantine.ready(self.plan.mirrored))  # quarantined by topic sync
        if due or stopped or (self.job is not None and self.job.held_any()):
            self.stop()
            self.start(self.topics, available_now=False)

    def _release_due(self) -> list[str]:
        due = self.quarantine.due(self.plan.mirrored)
        for topic in due:
            self.quarantine.release(topic)
        self._publish()
        return due
