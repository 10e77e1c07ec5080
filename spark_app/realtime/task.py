"""A real-time copier task: what each long-running Spark task runs, and its side of the report channel.

A task asks the driver which source partitions it copies and from where (an `Assignment`), reads them with one
librdkafka consumer, and writes each record as it comes with a producer linger of a few milliseconds: through the
Rust core (spark_app.compiled_copy) where spark_app.copy_wing.choice gives the flow that core, else (and for good
once the core met an event it leaves to Python) through the per-record path (spark_app.outbox). At each commit of its
slot's transaction (without transactions: every REPORT_S) it sends the driver one landing per partition, covering its
offsets since the last one up to the first record not delivered yet; between commits, every REPORT_S, it says how far
each partition reached the target. It copies until the driver says STOP or (an available-now run) every partition
reached its stop. The channel (spark_app.channel) carries
JSON messages, authenticated with a key made for the job's run. Where a flow's slots copy on the executors' JVM
(spark_app.realtime.jvm), which speaks the same channel, a slot's task here runs once the JVM handed the slot back.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from .. import channel, clients
from ..channel import Channel
from ..clients import Partition
from ..compiled_copy import CoreTransactions, copy_with, live_copier, transactional_copier
from ..config import ClusterConfig, FlowConfig
from ..copy_wing.choice import Core, choose
from ..outbox import (
    CONSUMER_DEFAULTS,
    FLUSH_S,
    Cursor,
    Outbox,
    Retries,
    copy_some,
    producer_settings,
    transaction_settings,
)
from ..policy import transactional
from ..ranges import Landing
from ..run_check import RunGone
from ..topics import TargetRules
from ..transactions import Aborted, SlotTransactions, TransactionFailed, lives_word, other_lives, python_slot

if TYPE_CHECKING:
    from mirrorkit_copy_core import Copier

log = logging.getLogger(__name__)

# A slot's transactions: through the Python loop's producer, or the compiled core's until its first event.
Slot = SlotTransactions[Producer] | SlotTransactions[CoreTransactions]

REPORT_S = 0.5  # how often a task tells the driver where its partitions stand
# How often an at-least-once slot that writes in transactions (to fence its zombie attempts) commits, and so reports
# landings: librdkafka's producer registers each new transaction's partitions with the coordinator in rounds, and
# their records wait meanwhile. Committing every REPORT_S tripled the p99 at 10,000 records/s
# (bench/results/20261129-realtime-commits.txt); every 5 s a bare loop's p99 is the same with and without them
# (bench/results/20261129-latency-order.txt). A crash copies again what landed since the last commit (MirrorMaker 2:
# since its last source offset commit, every 60 s by default).
TXN_COMMIT_S = 5.0
# A task's consumer returns what it has after at most this long, so a record waits for at most that before it is sent.
SLOT_CONSUME_WAIT_S = 0.005
SLOT_CONSUME_BATCH = 2_000
# The Python and Rust slots' producer sends what it holds after this long (the JVM slots' is
# spark_app.realtime.jvm.JAVA_LINGER_MS): a few ms buys batches of a few records per partition at 10,000 records/s
# (bench/) without adding latency users see.
LIBRDKAFKA_LINGER_MS = 2
# End-of-log events tell an available-now run where each partition ends (past transaction markers); a continuous run
# has no use for them, and they cost about a tenth more events at a steady rate.
CONSUMER_SETTINGS = CONSUMER_DEFAULTS | {"group.id": "mirrorkit-realtime", "enable.partition.eof": False}
# The channel's messages, as JSON. Task to driver: [HELLO, slot], an exactly-once slot's [STARTED, slot] once its
# producer started, then [LANDED, rows] per commit, [REACHED, offsets] between commits and [DONE, rows] at the end,
# each row a landing's `to_row`, the offsets as an `Assignment` gives them. Driver to task: the `Assignment`'s
# `to_json`, ON or OVER to a STARTED, and at most one STOP (before or after that answer).
HELLO, STARTED, LANDED, REACHED, DONE = "hello", "started", "landed", "reached", "done"
ON, OVER, STOP = "on", "over", "stop"


@dataclass(frozen=True)
class Assignment:
    """What one task copies: per source partition where it starts, for `run --available-now` where it stops, and per
    topic the id (KIP-516) of the life its starts belong to, where the flow's state knows it."""

    starts: dict[Partition, int]
    stops: dict[Partition, int] | None
    ids: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As the channel carries it: each partition as [[topic, partition], offset]."""
        stops = None if self.stops is None else offsets_to_json(self.stops)
        return {"starts": offsets_to_json(self.starts), "stops": stops, "ids": dict(self.ids)}

    @classmethod
    def from_json(cls, value: Any) -> Assignment:
        stops = value["stops"]
        ids = {str(t): str(i) for t, i in (value.get("ids") or {}).items()}
        return cls(offsets_from_json(value["starts"]), None if stops is None else offsets_from_json(stops), ids)


def offsets_to_json(offsets: dict[Partition, int]) -> list[list[Any]]:
    return [[list(key), offset] for key, offset in offsets.items()]


def offsets_from_json(pairs: Any) -> dict[Partition, int]:
    return {(topic, partition): offset for (topic, partition), offset in pairs}


class CopierTask:
    """What each real-time Spark task runs (picklable): copy what the driver assigns until it says stop."""

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, address: tuple[str, int],
        key: bytes, rules: TargetRules,
    ) -> None:  # fmt: skip
        self.flow = flow
        self.source = source
        self.target = target
        self.address = address
        self.key = key
        self.rules = rules
        self.producer_settings = producer_settings(rules) | {"linger.ms": LIBRDKAFKA_LINGER_MS}
        self.commit_s = flow.exactly_once_commit_interval_s
        self.core = choose(flow, source, target).core

    def __call__(self, slot: int, _rows: Iterable[int]) -> Iterator[int]:
        with channel.connect(self.address, self.key) as conn:
            yield LiveCopy(self, hello(conn, slot), slot).run(conn)


def hello(conn: Channel, slot: int) -> Assignment:
    """Tell the driver which task this is, and hear what it copies."""
    conn.send([HELLO, slot])
    return Assignment.from_json(conn.recv())


def still_on(conn: Channel, slot: int, flow: str) -> bool:
    """Ask the driver, once the slot's producer started, whether the task's run is still on; whether it did not also
    say stop. A run that is over (its job ended, or its driver gone) raises RunGone: the task commits nothing.

    Starting the producer fences every earlier attempt of the slot, and a mirror's start fences every slot id of the
    runs before; what neither fences is a task of a run that is over whose producer starts only after that: a Python
    worker paused, or slow, between its assignment and its producer's start. It would hold the slot's newest epoch and
    commit its old assignment's copy beside the new run's (spark_app.run_check says the same of batches)."""
    conn.send([STARTED, slot])
    stop = False
    try:
        while (answer := conn.recv()) == STOP:
            stop = True
    except (EOFError, OSError) as err:
        raise RunGone(f"flow {flow}: real-time slot {slot}: its driver does not answer ({err or 'gone'}): a task of a"
                      " run that is over, it commits nothing") from None  # fmt: skip
    if answer != ON:
        raise RunGone(f"flow {flow}: real-time slot {slot}: its driver answered {answer!r}: its run is over, it"
                      " commits nothing")  # fmt: skip
    return not stop


class LiveCopy:
    """One task's copy loop over its assigned partitions."""

    def __init__(self, task: CopierTask, assignment: Assignment, slot: int) -> None:
        self.flow = task.flow
        self.task = task
        self.slot = slot
        stops = assignment.stops or {}
        self.cursors = {
            key: Cursor(
                Landing(key[0], key[1], start, start), start, stops.get(key), done=start >= stops.get(key, start + 1)
            )
            for key, start in assignment.starts.items()
        }
        self._stops = dict(stops)  # where an available-now run stops each partition
        self.copied = 0
        self._committed: dict[Partition, int] = {}  # where the slot's last commit left each partition
        self._reported: set[Partition] = set()
        self._held_from: dict[Partition, int] = {}  # the first offset held back: nothing from there on is reported
        # What the broker's refusals in the slot's transactions taught it (spark_app.outbox.Retries), and the
        # partitions cut at a record too large for the target: copied up to it, then held from it (offset, size, why).
        self.retries = Retries()
        self._cuts: dict[Partition, tuple[int, int, str]] = {}
        # The compiled core's copier while the task copies with it; the Python loop's consumer is made only once the
        # core is not (or no longer) used: `_consumer`. A slot in transactions whose core stopped at an event goes on
        # with the Python loop's producer once that transaction ended (`_hand_back`).
        self.core: Copier | None = None
        self.slot_txn: Slot | None = None
        self._core_stopped = False
        self.consumer: Consumer | None = None
        # Per topic, the id of the life its positions belong to (the driver's), and the topics found made again since:
        # an exactly-once slot checks them before each commit (`_other_lives`) and copies those no further.
        self._ids = dict(assignment.ids)
        self._remade: dict[str, str] = {}
        self._ids_admin: AdminClient | None = None
        # End-of-log events only where a partition has a stop (available-now): they say where its log ends.
        self.consumer_settings = CONSUMER_SETTINGS | {
            "enable.partition.eof": any(c.stop is not None for c in self.cursors.values())
        }

    def run(self, conn: Channel) -> int:
        """Copy until every partition reached its stop (available-now) or the driver says stop; returns the count.

        A slot that writes in transactions (spark_app.transactions) starts its producer first, which fences every
        earlier attempt of the slot, and commits every `commit_s` (exactly once) or TXN_COMMIT_S; only then does it
        report landings, so the driver never hears of records a crash can still abort. An exactly-once slot resumes
        where its positions were committed, when that is past where the driver says it starts (a crash after a
        commit, before its report), and copies only once its driver said its run is still on (`still_on`)."""
        slot_txn = self.slot_txn = self._start_slot()
        if self.task.core is Core.RUST and slot_txn is None:
            source, target, settings = self.task.source, self.task.target, self.task.producer_settings
            self.core = live_copier(source, target, self.consumer_settings, settings)
        outbox = self._outbox()
        open_ = self._assign()
        commit_s = self.task.commit_s if self.flow.exactly_once else TXN_COMMIT_S if slot_txn else REPORT_S
        tick_s = min(REPORT_S, commit_s)
        started = time.monotonic()
        report_at, commit_at = started + tick_s, started + commit_s
        # A record the target refused fails the slot's open transaction (librdkafka sends nothing more of it): it is
        # aborted at once, not at its commit, and copied again.
        stopped, failed = False, False
        try:
            if slot_txn is not None and self.flow.exactly_once:
                stopped = not still_on(conn, self.slot, self.flow.name)
            with self._fenced_raises():
                while True:
                    while open_ and not stopped:
                        try:
                            self.copied += self._copy(open_, outbox, report_at)
                        except TransactionFailed:  # the producer takes no more of it: abort it now
                            failed, report_at = True, 0.0
                        if self._core_stopped:  # its transaction ends now, for the Python loop to go on after it
                            report_at = 0.0
                        now = time.monotonic()
                        if now >= report_at or outbox.full:  # a transaction that carried what it may commits now
                            report_at = now + tick_s
                            self._hold(outbox.settle())
                            outbox.raise_failures()
                            failed = failed or (slot_txn is not None and outbox.transaction_lost)
                            if now < commit_at and not failed and not outbox.full and not self._core_stopped:
                                conn.send([REACHED, offsets_to_json(self._reached(outbox))])
                            else:
                                commit_at = now + commit_s
                                committed = slot_txn is None or self._commit(slot_txn, outbox, failed)
                                if self._core_stopped:
                                    slot_txn = self._hand_back()
                                    outbox = self._outbox()
                                if not committed:
                                    open_, failed = self._assign(), False
                                    continue
                                self._send_report(conn, LANDED, outbox)
                            stopped = conn.poll() and conn.recv() == STOP
                        open_ = self._still_open(open_)
                    outbox.flush(300)
                    self._hold(outbox.settle())
                    if slot_txn is None or self._commit(slot_txn, outbox):
                        break
                    open_ = self._assign()  # the last transaction was aborted: copy it again
        finally:
            if self.consumer is not None:
                self.consumer.close()
            self._close_slot()
            self.core = None
        self._send_report(conn, DONE, outbox)
        return self.copied

    def _start_slot(self) -> Slot | None:
        """The slot's transactional producer, started (fencing its earlier attempts), when the flow writes in
        transactions: the compiled core's where the flow copies with it, else the Python loop's. An exactly-once
        slot's partitions move to their committed positions where those are ahead."""
        if not transactional(self.flow, self.task.target.is_eventhubs):
            return None
        settings = transaction_settings(self.task.producer_settings)
        slot_txn: Slot
        if self.task.core is Core.RUST:
            source, target, reading = self.task.source, self.task.target, self.consumer_settings

            def make(conf: dict[str, object]) -> CoreTransactions:
                return transactional_copier(source, target, conf, reading, None)

            core_slot = SlotTransactions(self.flow, target, settings, self.slot, make)
            self.core, slot_txn = core_slot.producer.copier, core_slot
        else:
            slot_txn = python_slot(self.flow, self.task.target, settings, self.slot)
        if self.flow.exactly_once:
            for key, offset in slot_txn.committed(self.cursors).items():
                cursor = self.cursors[key]
                if offset > cursor.next:  # copied by an attempt that crashed before it reported: no record again
                    cursor.landing.end_offset = cursor.next = offset
                    cursor.seen = True  # the landing starts where the driver said, and covers what was committed
                    cursor.done = cursor.stop is not None and offset >= cursor.stop
        self._committed = {key: c.next for key, c in self.cursors.items()}
        slot_txn.begin()
        return slot_txn

    def _hand_back(self) -> SlotTransactions[Producer]:
        """Between transactions, after the one the core's event fell in: the Python loop's producer takes the slot,
        fencing the core's, and its consumer reads on from where each partition's cursor stands."""
        self._close_slot()
        self._core_stopped = False
        settings = transaction_settings(self.task.producer_settings)
        slot_txn = self.slot_txn = python_slot(self.flow, self.task.target, settings, self.slot)
        slot_txn.begin()
        self._assign()
        return slot_txn

    def _close_slot(self) -> None:
        """Let go of the slot's producer (and the core's copier, if it wrote the slot's transactions)."""
        slot_txn, self.slot_txn = self.slot_txn, None
        if slot_txn is not None:
            slot_txn.close()
            if isinstance(slot_txn.producer, CoreTransactions):
                slot_txn.producer.copier.close()
                self.core = None

    def _outbox(self) -> Outbox:
        """The outbox of the slot's records: through its producer, or, while the core writes its transactions, one
        that files the refusals the core heard (the process's shared producer stands in: nothing goes through it)."""
        slot_txn = self.slot_txn
        producer = slot_txn.producer if slot_txn is not None and isinstance(slot_txn.producer, Producer) else (
            clients.shared_producer(self.task.target, self.task.producer_settings))  # fmt: skip
        outbox = Outbox(self.flow, producer, lambda key: self.cursors[key].landing, self.task.rules,
                        in_transaction=slot_txn is not None, retries=self.retries)  # fmt: skip
        for key in self.cursors:
            outbox.open(key)
        return outbox

    @contextlib.contextmanager
    def _fenced_raises(self) -> Iterator[None]:
        """SlotTransactions.fenced_raises of the producer that writes the slot's transactions when a call raises."""
        try:
            yield
        except KafkaException:
            if self.slot_txn is None:
                raise
            with self.slot_txn.fenced_raises():
                raise

    def _consumer(self) -> Consumer:
        """The Python loop's consumer, the task's own (it pauses what the task holds), made at its first use."""
        if self.consumer is None:
            self.consumer = clients.consumer(self.task.source, self.consumer_settings)
        return self.consumer

    def _assign(self) -> dict[Partition, Cursor]:
        """The partitions not done; the Python loop's consumer reads them from where their cursors stand, unless the
        core copies them (it reads from there at its next copy)."""
        open_ = {key: c for key, c in sorted(self.cursors.items()) if not c.done}
        if self.core is None:
            consumer = self._consumer()
            consumer.assign([TopicPartition(t, p, c.next) for (t, p), c in open_.items()])
            if open_:  # one paused while an aborted transaction held it reads again (a pause outlives an assign)
                consumer.resume([TopicPartition(t, p) for t, p in open_])
        return open_

    def _still_open(self, open_: dict[Partition, Cursor]) -> dict[Partition, Cursor]:
        """The open partitions that are not done; the Python loop's consumer, if any, stops fetching those that are
        (the core copies only what it is given). A partition cut at a refused record that reached it holds there."""
        for key, (offset, size, error) in self._cuts.items():
            cursor = open_.get(key)
            if cursor is not None and cursor.done and cursor.next >= offset:
                cursor.landing.hold(offset, size, error)
        done = [TopicPartition(*key) for key, c in open_.items() if c.done]
        if not done:
            return open_
        if self.consumer is not None:
            self.consumer.pause(done)
        return {key: c for key, c in open_.items() if not c.done}

    def _copy(self, open_: dict[Partition, Cursor], outbox: Outbox, until: float) -> int:
        """Copy some of the open partitions: with the core until `until`, else with the Python loop for a moment;
        how many records it passed on. Once the core stops at an event it leaves to the Python loop, the Python loop
        goes on from there for the rest of the task's run."""
        if self.core is None:
            return copy_some(self._consumer(), open_, outbox, SLOT_CONSUME_BATCH, SLOT_CONSUME_WAIT_S)
        task, left = self.task, max(0.0, until - time.monotonic())
        room: int | None = None
        if self.slot_txn is not None:  # one transaction's worth at most (spark_app.outbox.Outbox.full)
            seconds, room = outbox.transaction_room()
            left = min(left, seconds)
        taken, event = copy_with(self.core, self.flow, task.source, task.target, open_, task.rules, outbox, left, room)
        if event:
            log.warning("flow %s: slot %d goes on with the Python loop (the compiled core met a record or event it"
                        " leaves to it)", self.flow.name, self.slot)  # fmt: skip
            if self.slot_txn is not None:  # after this transaction ends (`_hand_back`)
                self._core_stopped = True
            else:
                self.core = None
                self._assign()
        return taken

    def _commit(self, slot_txn: Slot, outbox: Outbox, failed: bool = False) -> bool:
        """Commit what was sent (with each partition's next offset, exactly-once) and begin the next transaction;
        False when the target refused a record of it: then all of it was aborted, and every cursor is back where the
        last commit left it, to copy it again as spark_app.outbox.Retries says (a record sent alone, or written to the
        dead-letter topic in its place); a partition refused for good is copied up to the refused record and holds
        from it (its topic catches up later).

        A transaction that `failed` is aborted without waiting for what it still queues, which would never be sent."""
        refused: set[Partition] = set()
        remade: dict[str, str] = {}
        unsure: set[str] = set()
        if not failed:
            outbox.flush(FLUSH_S)
            self._hold(outbox.settle())
            lost = outbox.transaction_lost
            refused = outbox.take_refused()
            if not refused and not lost and self.flow.exactly_once:
                remade, unsure = self._other_lives()
            if not refused and not lost and not remade and not unsure:
                positions = {key: self._next_to_copy(key) for key in self.cursors}
                try:
                    slot_txn.commit(positions)
                    went_through = True
                except Aborted:  # or said so after all (SlotTransactions.went_through)
                    went_through = self.flow.exactly_once and slot_txn.went_through(positions, before=self._committed)
                if went_through:
                    self._committed = positions
                    self.retries.forget_below(positions)
                    slot_txn.begin()
                    outbox.began()
                    return True
        slot_txn.abort()  # and the reports of all it had sent are served: the refusals among them
        self._hold(outbox.settle())
        refused |= outbox.take_refused()
        for key in refused:  # held from a refused record (not one to send alone, or to dead-letter): cut there
            landing = self.cursors[key].landing  # (earlier, if one before the cut was refused too: a topic gone)
            if landing.held_from >= 0 and (key not in self._cuts or landing.held_from < self._cuts[key][0]):
                self._cuts[key] = (landing.held_from, landing.refused_bytes, landing.held_error)
        for key, cursor in self.cursors.items():
            start = self._committed[key]
            cursor.next, cursor.retired, cursor.seen = start, [], False
            cursor.landing = Landing(key[0], key[1], start, start)
            cursor.stop = self._stops.get(key)
            if key in self._cuts:  # copied up to the refused record, which it holds from (`_still_open`)
                offset, size, error = self._cuts[key]
                cursor.stop = offset if cursor.stop is None else min(cursor.stop, offset)
                if start >= offset:
                    cursor.landing.hold(offset, size, error)
            cursor.done = (cursor.stop is not None and start >= cursor.stop) or key[0] in self._remade
        if remade or unsure:
            log.warning("flow %s: slot %d's transaction was aborted: %s; copying again from its last commit",
                        self.flow.name, self.slot, lives_word(self._ids, remade, unsure))  # fmt: skip
        else:
            log.warning("flow %s: slot %d's transaction was aborted (the target refused a record of %s); copying again"
                        " from its last commit", self.flow.name, self.slot, sorted(refused) or "it")  # fmt: skip
        slot_txn.begin()
        outbox.began()
        return False

    def _other_lives(self) -> tuple[dict[str, str], set[str]]:
        """Before an exactly-once commit, spark_app.transactions.other_lives for the topics the slot still copies: a
        topic made again is copied no further by this task (`_remade`) once its transaction is aborted, until the
        driver, which finds the new id too (spark_app.realtime.flow), starts it again from its new life's log start.
        What the old life held past the last commit went with it. A transaction that carries records of a topic whose
        id did not answer is aborted and copied again."""
        asked = {t: self._ids[t] for t, _ in self.cursors if t in self._ids and t not in self._remade}
        moved = {t for (t, p), c in self.cursors.items() if c.next != self._committed.get((t, p), c.next) or c.retired}
        if not asked:
            return {}, set()
        if self._ids_admin is None:
            self._ids_admin = clients.admin(self.task.source)
        remade, unsure = other_lives(self._ids_admin, asked, moved)
        self._remade |= remade
        return remade, unsure

    def _next_to_copy(self, key: Partition) -> int:
        """Where a partition goes on from: its first held offset, if it holds (records read past it, sent before
        the hold or skipped after it, do not count), else the offset after the last one read."""
        cursor = self.cursors[key]
        held = [o for o in (cursor.landing.held_from, self._held_from.get(key, -1)) if o >= 0]
        return min([cursor.next, *held])

    def _send_report(self, conn: Channel, kind: str, outbox: Outbox) -> None:
        conn.send([kind, [row.to_row() for row in self._report(outbox)]])

    def _hold(self, held: set[Partition]) -> None:
        """Partitions refused by the target after later records were sent: read no further."""
        for key in held:
            self.cursors[key].done = True

    def _reached(self, outbox: Outbox) -> dict[Partition, int]:
        """Per partition, the first offset the target lacks as far as the slot knows, committed or not: its first
        record not delivered yet, or its first held one."""
        reached = {}
        for key in self.cursors:
            in_flight = outbox.in_flight.get(key)
            reached[key] = min(self._next_to_copy(key), in_flight[0]) if in_flight else self._next_to_copy(key)
        return reached

    def _report(self, outbox: Outbox) -> list[Landing]:
        """Each partition's landing up to its first record not delivered yet; each goes on with a new landing."""
        rows = []
        for key, end in self._reached(outbox).items():
            cursor = self.cursors[key]
            rows += cursor.retired
            cursor.retired = []
            landing = cursor.landing
            landing.end_offset = end
            if landing.held_from >= 0:  # nothing from there on is read: the hold is its first offset only
                self._held_from[key] = min(landing.held_from, self._held_from.get(key, landing.held_from))
                landing.held_until = self._held_from[key]
            if key in self._held_from:
                landing.end_offset = min(landing.end_offset, self._held_from[key])
            if key not in self._reported or _changed(landing):
                rows.append(landing)
                cursor.landing = Landing(key[0], key[1], landing.end_offset, landing.end_offset)
            self._reported.add(key)
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
