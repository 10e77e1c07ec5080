"""Throughput mode's copy: the planned source offset ranges of one micro-batch, each in source order.

The driver plans every micro-batch as offset ranges, one per source topic-partition (spark_app.planner), in groups,
one per task of the batch's Spark job, and each task runs `RangeCopier.copy` on its group, so a batch's ranges are
copied in parallel; a quarantine's catch-up hands its ranges to the same copier, one per task. Each task reads its
ranges with one librdkafka consumer and writes them through the core spark_app.copy_wing.choice picks for the flow
(the Rust core, else the per-record path, spark_app.outbox) with one idempotent producer: records never cross from
Spark's JVM to Python and back, which is what made this path about twice as fast as reading with Spark's Kafka
source and writing from Arrow batches (bench/). Secrets are resolved on the worker from the same env vars and files
as on the driver, so they never travel in a task.

For every range it hands back one landing row (spark_app.ranges): where its records landed, with counts and a
replication-latency histogram. A partition the target refuses a record of is held from that record on, and the row
says which offsets were held (`held_from`, `held_until`), so the driver quarantines the topic and catches it up
later. A range of a topic that is not `ready` (quarantined, or not yet that many partitions on the target) is held
whole the same way, without reading it. So is the rest of a range whose source partition serves nothing (its leader
offline, or the whole source silent for PARTITION_STALL_S): the batch ends, and the topic catches up once the
partition is back. A batch therefore never waits on a source outage for longer than that, so a stop in the middle of
one ends within the stop's own bound (spark_app.config.STOP_BATCH_TIMEOUT_S).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from . import clients
from .clients import Partition, PartitionOffsets
from .compiled_copy import CoreTransactions, copy_compiled, copy_with, transactional_copier
from .config import ClusterConfig, FlowConfig
from .copy_wing.choice import Core, choose
from .errors import DeliveryFailed
from .outbox import (
    CONSUMER_DEFAULTS,
    FLUSH_S,
    Cursor,
    Outbox,
    Retries,
    copy_some,
    producer_settings,
    transaction_settings,
)
from .policy import transactional
from .ranges import Landing, OffsetRange
from .run_check import RunAddress, confirm_run
from .topics import TargetRules
from .transactions import (
    OTHER_LIFE,
    Aborted,
    PositionNote,
    SlotTransactions,
    TransactionFailed,
    lives_word,
    other_lives,
    python_slot,
)

log = logging.getLogger(__name__)

RANGE_CONSUME_BATCH = 10_000
RANGE_CONSUME_WAIT_S = 0.1
# A copy that runs this long is slow (a slow target, transactions aborted and copied again): it logs where each of its
# open partitions stands then, and again each time as long again. (A read that never returns ends its worker instead,
# spark_app.clients.consume.)
SAY_OPEN_S = 300.0

# A partition with records left that reads nothing this long is looked up in the source's metadata, and held at once
# when it has no leader (its broker offline). A fetch waits at most 500 ms (librdkafka's fetch.wait.max.ms), so 5 s
# of silence is well past a normal fetch; the look-up alone holds nothing.
LEADER_CHECK_S = 5.0
# A partition whose named leader serves nothing this long is held too (a broker the controller sees but the mirror
# cannot reach), and so is every idle partition of a source whose metadata does not answer either (the whole source
# down). Well above a slow fetch across a WAN, or a broker's restart, which the batch rides out.
PARTITION_STALL_S = 60.0
# How many transactions in a row a copy aborts and copies again when they fail with no refusal of their own (the one
# after a refused transaction does, spark_app.outbox.Outbox.refused) before the task fails.
LOST_TRANSACTIONS = 3


def warm(_task: int) -> None:
    """What a task runs to start an executor's Python worker with this module (and so the copy's) imported, and
    the compiled core loaded: spark_app.mirror runs it while the driver prepares the first batch."""
    import mirrorkit_copy_core  # noqa: F401  # the extension module's load, which each worker pays once


class RangeCopier:
    """A flow's copy of offset ranges, picklable into a task: `copy` for a batch's planned group, or a catch-up's.

    `ready` maps each source topic that may be written to its partition count on the target; ranges of other
    topics or partitions are held, not read. None writes everything. `rules` say what the target topics take.
    """

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, ready: dict[str, int] | None = None,
        rules: TargetRules | None = None, lives: Mapping[str, str] | None = None, run: RunAddress | None = None,
    ) -> None:  # fmt: skip
        self.flow = flow
        self.source = source
        self.target = target
        self.ready = ready
        # Per topic, the id of the life its ranges were planned in (the batch's end entry): an exactly-once slot
        # notes it beside each position it commits, and skips only what a position of that life says was committed.
        self.lives = dict(lives or {})
        # Where an exactly-once slot asks whether its run is still on, once its producer started (spark_app.run_check).
        self.run = run
        self.rules = rules or TargetRules()
        self.producer_settings = producer_settings(self.rules)
        self.core = choose(flow, source, target).core

    def copy(self, ranges: list[OffsetRange], slot: int = 0) -> list[Landing]:
        """Copy every range, each partition in order; one landing per range. A flow that writes in transactions
        copies them in transactions of the task's `slot` (spark_app.transactions); either way with the core `choose`
        names for it, handing back to the Python loop at the core's first event."""
        if transactional(self.flow, self.target.is_eventhubs):
            cursors = self._copy_in_transaction(ranges, slot)
        else:
            cursors = self._cursors(ranges, {})
            outbox = self._outbox(cursors, clients.shared_producer(self.target, self.producer_settings))
            if self.core is Core.RUST and any(not c.done for c in cursors.values()):
                copy_compiled(self.flow, self.source, self.target, cursors, self.rules, self.producer_settings, outbox)
            self._copy_open(cursors, outbox)
            while self._read_on_in_the_same_life(cursors, ranges):
                self._copy_open(cursors, outbox)
        for cursor in cursors.values():
            _end_a_later_life(cursor)
        return [landing for c in cursors.values() for landing in (*c.retired, c.landing)]

    def _cursors(self, ranges: list[OffsetRange], cut: dict[Partition, int]) -> dict[Partition, Cursor]:
        """A cursor per range; a range of a topic not `ready` holds whole, one `cut` stops at its offset there."""
        cursors: dict[Partition, Cursor] = {}
        for r in ranges:
            key = (r.topic, r.partition)
            landing = Landing(r.topic, r.partition, r.end, r.end, reset_from=r.reset_from)
            stop = min(r.end, cut.get(key, r.end))
            # A range of a topic whose life is known reads that life only (one of a topic whose id the planner could
            # not learn reads on to its stop: it cannot tell lives apart, so it copies twice rather than skip).
            one_life = bool(self.lives.get(r.topic))
            cursors[key] = Cursor(landing, r.start, stop, done=stop <= r.start, one_life=one_life)
            if self.ready is not None and r.partition >= self.ready.get(r.topic, 0):
                landing.first_offset = r.start
                landing.hold(r.start)
                cursors[key].done = True
        return cursors

    def _read_on_in_the_same_life(self, cursors: dict[Partition, Cursor], ranges: list[OffsetRange]) -> bool:
        """At least once: whether ranges that ended where their partition went backwards (`Cursor.one_life`) read on
        to their planned stop, as they do when the topic's id is the one they were planned under (a log truncated, a
        stale read of its end) or does not answer: the next batch starts at the planned stop, so ending there would
        skip the records in between. Where the topic was made again, the range ends there, and the next batch copies
        the new life from its log start (spark_app.planner.remade_within)."""
        planned = {(r.topic, r.partition): r.end for r in ranges}
        ended = {key: c for key, c in cursors.items() if _went_back_within(c) and c.done and c.landing.held_from < 0
                 and c.stop is not None and c.stop < planned[key]}  # fmt: skip
        if not ended:
            return False
        asked = {t: self.lives[t] for t, _ in ended if self.lives.get(t)}
        remade, _unsure = other_lives(clients.admin(self.source), asked, asked)
        reading_on = reopened(ended, planned, set(remade))
        if reading_on:
            log.warning("flow %s: %s went backwards with the id their ranges were planned under (or one that did not"
                        " answer): read on to the planned stop", self.flow.name,
                        ", ".join(f"{t}[{p}]" for t, p in sorted(reading_on)))  # fmt: skip
        return bool(reading_on)

    def _copy_in_transaction(self, ranges: list[OffsetRange], slot: int) -> dict[Partition, Cursor]:
        """Copy the ranges in transactions of the slot, each with their next offsets when the flow is exactly-once.

        The slot's producer is started for each task: that fences every earlier attempt (a zombie of this batch, or
        of the batch before it in another worker), and a producer kept for the next task would be fenced by the next
        worker that takes the slot.

        An exactly-once copy first skips what the slot's positions say was committed (a batch that runs again after a
        crash between its commit and Spark's). A transaction carries at most what spark_app.outbox.Outbox.full
        allows, so a slow target slows the copy down instead of outliving the transaction's timeout: it commits with
        its positions, and the next one goes on. When the target refuses a record, the transaction is aborted whole
        and copied again from the last commit: the largest record of a batch the broker refused goes alone in its
        batch, a record refused alone goes to the dead-letter topic, or its partition is copied up to it and holds
        from there (spark_app.outbox.Retries). The compiled core copies the transactions while it takes the common
        case (`_SlotCopy`)."""
        slot_copy = _SlotCopy(self, slot)
        try:
            if self.flow.exactly_once and self.run is not None:  # a task of a run that is over commits nothing
                confirm_run(self.run, f"flow {self.flow.name}: slot {slot}")
            with slot_copy.fenced_raises():
                return self._transactions(ranges, slot_copy)
        finally:  # a transaction left open is aborted by the task's retry, which starts the slot again
            slot_copy.close()

    def _transactions(self, ranges: list[OffsetRange], slot_copy: _SlotCopy) -> dict[Partition, Cursor]:
        """Copy the ranges in transactions of the slot until the last one commits (see `_copy_in_transaction`)."""
        cut: dict[Partition, tuple[int, int, str]] = {}  # a refused partition: its first refused offset, size, why
        retries = Retries()
        cursors = self._cursors(ranges, {})
        committed: PartitionOffsets = {}
        starts = {(r.topic, r.partition): r.start for r in ranges}
        if self.flow.exactly_once:
            noted = slot_copy.txn.committed_notes(k for k, c in cursors.items() if not c.done)
            _skip_committed(cursors, ranges, noted, self.lives)
            committed = _in_planned_life(noted, ranges, self.lives)
        # A range held whole writes no position, but one whose offsets went backwards does, empty or held: the
        # new life starts there, or the next batch would skip the new topic's records to the old life's position.
        copying = {key for key, c in cursors.items() if not c.done or _starts_over(c)}
        last_commit = copy.deepcopy(cursors)
        watch = PartitionWatch({key: c.next for key, c in cursors.items()}, time.monotonic())
        lost = 0  # transactions in a row that failed with no refusal
        admin: AdminClient | None = None  # asks the source for the ids of the topics' lives (exactly once)
        misread: set[str] = set()  # topics found gone backwards in the life they were planned in: copied again once
        while True:
            slot_copy.hand_back_if_stopped()
            slot_txn = slot_copy.txn
            slot_txn.begin()
            outbox = slot_copy.outbox(cursors, retries)
            try:
                slot_copy.copy(cursors, outbox, watch)
            except TransactionFailed:  # a refusal failed the transaction: it takes no more records
                failed = True
            else:
                failed = outbox.transaction_lost
            remade: dict[str, str] = {}
            unsure: set[str] = set()
            same: set[str] = set()
            read = _read_since(cursors, last_commit)
            asked = {t: self.lives[t] for t in read if self.lives.get(t)} if self.flow.exactly_once else {}
            if not failed and asked:
                admin = admin or clients.admin(self.source)
                remade, unsure = other_lives(admin, asked, read)
                went_back = _went_back(cursors, read)
                # A partition the copy found gone backwards is copied in its new life: right when the id changed; with
                # the id it was planned under, no new life began, and what it read again is copied already.
                same = {t for t in went_back if t in asked and t not in remade and t not in unsure}
                remade = {t: i for t, i in remade.items() if t not in went_back}
                failed = bool(remade or unsure or same)  # what it read may be a new life's, or read twice
            if not failed:
                for key, (offset, size, error) in cut.items():
                    if cursors[key].done:  # copied up to its refused record: it holds from there
                        cursors[key].landing.first_offset = min(cursors[key].landing.first_offset, offset)
                        cursors[key].landing.hold(offset, size, error)
                # A position never goes back, but where the partition's offsets did.
                positions = {
                    key: _position(c) if _starts_over(c) else max(_position(c), committed.get(key, -1))
                    for key, c in cursors.items()
                    if key in copying
                }
                notes = {key: _note(cursors[key], starts[key], self.lives.get(key[0], "")) for key in copying}
                try:
                    slot_txn.commit(positions, notes)
                    went_through = True
                except Aborted:  # the commit failed (the transaction after a refused one, see Outbox.refused), or
                    # said so after all: an end retried after its answer was lost, refused as the first went through
                    went_through = self.flow.exactly_once and slot_txn.went_through(positions, notes)
                if went_through:
                    if all(c.done for c in cursors.values()):
                        return cursors
                    last_commit, lost = copy.deepcopy(cursors), 0
                    continue
            slot_txn.abort()  # and the reports of what it had sent are served: the refusals among them
            outbox.settle()
            refused = outbox.take_refused()
            outbox.raise_failures()
            if same:
                log.warning(
                    "flow %s: slot %d's transaction was aborted: %s went backwards with the id it was planned"
                    " under (a stale read of the log's end, or the log truncated): %s",
                    self.flow.name,
                    slot_txn.slot,
                    ", ".join(sorted(same)),
                    "held from the last commit" if same & misread else "copied again from the last commit",
                )
            if remade or unsure:
                log.warning("flow %s: slot %d's transaction was aborted: %s; the batch copies no more of those topics"
                            " (one whose id did not answer holds from the last commit, to catch up once it does)",
                            self.flow.name, slot_txn.slot, lives_word(self.lives, remade, unsure))  # fmt: skip
            elif not same:  # the transaction after a refused one may fail too, with no refusal of its own, once
                lost = 0 if refused else lost + 1  # (Outbox.refused)
            if lost > LOST_TRANSACTIONS:
                raise DeliveryFailed(f"flow {self.flow.name}: {lost} transactions of slot {slot_txn.slot} in a row"
                                     " failed, with no record of them refused")  # fmt: skip
            for key in refused:  # held (not for a retry of its records alone, or a dead letter): cut there
                landing = cursors[key].landing  # (earlier, if one before the cut was refused too: a topic gone)
                if landing.held_from >= 0 and (key not in cut or landing.held_from < cut[key][0]):
                    cut[key] = (landing.held_from, landing.refused_bytes, landing.held_error)
            cursors = copy.deepcopy(last_commit)
            for key, (offset, _, _) in cut.items():
                cursor = cursors[key]
                cursor.stop = offset if cursor.stop is None else min(cursor.stop, offset)
                cursor.done = cursor.done or cursor.next >= cursor.stop
            _end_other_lives(cursors, remade, unsure, self.source.alias)
            _hold_misread(cursors, same & misread)
            misread |= same

    def _outbox(self, cursors: dict[Partition, Cursor], producer: Producer, retries: Retries | None = None) -> Outbox:
        """An outbox that writes with `producer` and files what lands into the cursors' landings; with `retries`, in
        the slot's transactions."""
        landing_of: Callable[[Partition], Landing] = lambda key: cursors[key].landing  # noqa: E731
        return Outbox(self.flow, producer, landing_of, self.rules, in_transaction=retries is not None, retries=retries)

    def _copy_open(self, cursors: dict[Partition, Cursor], outbox: Outbox, watch: PartitionWatch | None = None) -> None:
        """Copy the cursors not done through `outbox` (its landings are the cursors'), or as many as its transaction
        may carry (`Outbox.full`). `watch` is the copy's, across its transactions: each lasts at most TXN_OPEN_S, and
        a partition that reads nothing in one after another must still reach the stall bound, and be held."""
        open_ = {key: c for key, c in cursors.items() if not c.done}
        if not open_:
            return
        watch = watch or PartitionWatch({key: c.next for key, c in open_.items()}, time.monotonic())
        consumer = clients.shared_consumer(self.source, CONSUMER_DEFAULTS)
        consumer.assign([TopicPartition(t, p, c.next) for (t, p), c in open_.items()])
        try:
            for key in open_:
                outbox.open(key)
            # consume() returns once it has as many messages as asked, or at its timeout: ask for no more than the
            # ranges still hold, so a small batch (continuous mode) does not wait out the timeout.
            left = sum((c.stop or c.next) - c.next for c in open_.values())
            while open_ and not outbox.full:
                now = time.monotonic()
                if now >= watch.say_at:
                    watch.say_at += SAY_OPEN_S
                    log.warning("flow %s: a copy open for %.0f s; its open partitions (next offset, stop): %s",
                                self.flow.name, now - watch.began,
                                {f"{t}[{p}]": (c.next, c.stop) for (t, p), c in sorted(open_.items())})  # fmt: skip
                if now >= watch.look_at:  # a partition the source does not serve holds from where it is
                    idle = watch.idle({key: c.next for key, c in open_.items()}, now)
                    for key, why in unreadable(idle, self._leaders(consumer, idle), self.source.alias).items():
                        cursor = open_[key]
                        cursor.landing.first_offset = min(cursor.landing.first_offset, cursor.next)
                        cursor.landing.hold(cursor.next, error=why)
                        cursor.done = True
                left -= copy_some(consumer, open_, outbox, min(RANGE_CONSUME_BATCH, left), RANGE_CONSUME_WAIT_S)
                open_ = {key: c for key, c in open_.items() if not c.done}
        finally:
            consumer.unassign()  # no fetching past the ranges while the worker waits for its next task
        outbox.flush(FLUSH_S)
        outbox.settle()

    @staticmethod
    def _leaders(consumer: Consumer, idle: Iterable[Partition]) -> dict[Partition, int] | None:
        """Each partition of the idle partitions' topics with its leader as the source's metadata names it now (-1:
        none); None when the source does not answer."""
        leaders: dict[Partition, int] = {}
        try:
            for topic in {t for t, _ in idle}:
                metadata = consumer.list_topics(topic, timeout=clients.METADATA_CHECK_S).topics[topic]
                leaders |= {(topic, p): m.leader for p, m in metadata.partitions.items()}
        except KafkaException:
            return None
        return leaders


def _skip_committed(
    cursors: dict[Partition, Cursor], ranges: list[OffsetRange],
    committed: Mapping[Partition, tuple[int, PositionNote]], lives: Mapping[str, str],
) -> None:  # fmt: skip
    """Start each range past what its partition's committed position says was copied already, where the position is
    in the life the range was planned in (`_same_life`). The landings still cover the range from its start, as the
    copy that committed the position left them: where its note says records were gone from the source before that
    copy read them, a landing ends before the gap and the next starts after it, so the flow's ledger reports them.

    A position committed by a copy of this range that found its partition gone backwards (the range run again after
    a crash before the flow filed it) is in the life after the one the range was planned in: the range ends there,
    saying it went back, as the copy before it did."""
    for r in ranges:
        key = (r.topic, r.partition)
        cursor = cursors[key]
        if key not in committed or cursor.done:
            continue
        offset, note = committed[key]
        if _left_this_life(note, lives.get(r.topic, "")):
            # A range that starts a life over (planned from a log start) keeps its own reset, then the one its copy met.
            # It ends where that copy left the later life, as a range of one life does (`Cursor.one_life`).
            cursor.retired.append(Landing(r.topic, r.partition, r.start, r.start, reset_from=r.reset_from))
            cursor.landing = Landing(r.topic, r.partition, 0, offset, reset_from=r.start)
            cursor.seen, cursor.next, cursor.stop, cursor.done = True, offset, offset, True
            continue
        if offset <= cursor.next or not _same_life(note, lives.get(r.topic, ""), r):
            continue
        stop = r.end if cursor.stop is None else cursor.stop
        cursor.landing.first_offset = r.start
        for expected, first_read in note.gaps:
            if not r.start <= expected < first_read <= offset:
                continue  # not the range's (a gap of a range before it), or not past a landing's start
            if expected > cursor.landing.first_offset:
                cursor.retired.append(Landing(r.topic, r.partition, cursor.landing.first_offset, expected,
                                              reset_from=cursor.landing.reset_from))  # fmt: skip
                cursor.landing = Landing(r.topic, r.partition, first_read, max(r.end, first_read),
                                         reset_from=r.reset_from)  # fmt: skip
            else:
                cursor.landing.first_offset = first_read
                cursor.landing.end_offset = max(cursor.landing.end_offset, first_read)
        cursor.seen = True
        cursor.next = min(offset, stop)
        cursor.done = cursor.next >= stop


def _in_planned_life(
    committed: Mapping[Partition, tuple[int, PositionNote]], ranges: list[OffsetRange], lives: Mapping[str, str]
) -> PartitionOffsets:
    """The committed positions in the life each range was planned in (`_same_life`): the floor of what the copy
    commits, as a position never goes back within a life. One of another life is no floor: carried into the new
    life's commit, it would make the next batch skip the new life's records up to it."""
    out: PartitionOffsets = {}
    for r in ranges:
        key = (r.topic, r.partition)
        if key in committed and _same_life(committed[key][1], lives.get(r.topic, ""), r):
            out[key] = committed[key][0]
    return out


def _same_life(note: PositionNote, life: str, r: OffsetRange) -> bool:
    """Whether a committed position (with its note) is in the life of the topic range `r` reads (`life`, the id it
    was planned in): both ids known, when they are equal; else, as before notes named lives, where the range's offsets
    did not go backwards. Never a position a copy committed after it found its partition gone backwards in the middle
    of its range (`OTHER_LIFE`)."""
    if note.life == OTHER_LIFE:
        return False
    if note.life and life:
        return note.life == life
    return r.reset_from < 0


def _went_back(cursors: Mapping[Partition, Cursor], read: set[str]) -> set[str]:
    """Of the topics `read` since the last commit, those with a partition the copy found gone backwards itself."""
    return {t for (t, _), c in cursors.items() if t in read and _went_back_within(c)}


def _read_since(cursors: Mapping[Partition, Cursor], last_commit: Mapping[Partition, Cursor]) -> set[str]:
    """The topics the copy read records of since its last commit."""
    return {
        t
        for (t, p), c in cursors.items()
        if c.next != last_commit[(t, p)].next or len(c.retired) != len(last_commit[(t, p)].retired)
    }


def _end_other_lives(
    cursors: Mapping[Partition, Cursor], remade: Mapping[str, str], unsure: set[str], source: str
) -> None:
    """After a transaction aborted by spark_app.transactions.other_lives, with the cursors back at the last commit:
    each open partition of a topic made again ends its copy there (what its old life held past it went with it, and
    the next batch, planned in the new life, copies that from its log start); each of a topic whose id did not answer
    holds from there, and catches up once it does (spark_app.ledger.FlowLedger.catch_up asks the id first)."""
    for (topic, _), cursor in cursors.items():
        if cursor.done or (topic not in remade and topic not in unsure):
            continue
        cursor.landing.first_offset = min(cursor.landing.first_offset, cursor.next)
        cursor.landing.end_offset = cursor.next
        if topic in unsure:
            cursor.landing.hold(cursor.next, error=f"source '{source}' did not say whether the topic was made again")
        cursor.done = True


def _hold_misread(cursors: Mapping[Partition, Cursor], topics: set[str]) -> None:
    """After a transaction aborted a second time because a partition of `topics` went backwards in the life its range
    was planned in: each such partition holds from the last commit, to catch up from there."""
    for (topic, _), cursor in cursors.items():
        if topic in topics and not cursor.done:
            cursor.landing.first_offset = min(cursor.landing.first_offset, cursor.next)
            cursor.landing.end_offset = cursor.next
            cursor.landing.hold(cursor.next, error="its offsets went backwards with the topic's id unchanged, twice")
            cursor.done = True


def _in_a_later_life(cursor: Cursor) -> bool:
    """Whether the cursor's landing is in a life of its partition after the one its range was planned in: it found
    the partition gone backwards in the middle of its range (the topic made again), or ends where a copy that did
    left it."""
    return bool(cursor.retired) and cursor.landing.reset_from >= 0


def reopened(ended: Mapping[Partition, Cursor], planned: Mapping[Partition, int], remade: set[str]) -> set[Partition]:
    """Of the cursors that `ended` where their partition went backwards, those of a topic not `remade` read on to
    their `planned` stop again; which ones."""
    out = set()
    for key, cursor in ended.items():
        if key[0] not in remade:
            cursor.stop = planned[key]
            cursor.done = cursor.next >= cursor.stop
            out.add(key)
    return out


def _end_a_later_life(cursor: Cursor) -> None:
    """A range that found its partition in a later life (`_in_a_later_life`) and was not held ends at its stop, where
    its partition went backwards (`Cursor.one_life`) or where a copy before it left that life: its landing ends
    there, the new life's position."""
    landing = cursor.landing
    if _in_a_later_life(cursor) and landing.held_from < 0 and cursor.done and cursor.stop is not None:
        landing.end_offset = max(landing.end_offset, cursor.stop)


def _went_back_within(cursor: Cursor) -> bool:
    """Whether the copy found the cursor's partition gone backwards in the middle of its range."""
    return any(row.reset_from >= 0 for row in [*cursor.retired, cursor.landing][1:])


def _left_this_life(note: PositionNote, life: str) -> bool:
    """Whether a committed position is one a copy of a range planned in `life` committed after it found the
    partition gone backwards in the middle of it: in the life after `life`. A range that itself starts `life` over
    (planned from its log start) is no exception: the topic made again once more while it was copied is the same."""
    return note.life == OTHER_LIFE and bool(life) and note.left == life


def _note(cursor: Cursor, start: int, life: str) -> PositionNote:
    """The note committed with a partition's position: the life its range was planned in, unless the copy found the
    partition gone backwards in the middle of its range (then another, unnamed), and the gaps between its landings
    from the range's `start` (where records were gone before they were read: the ledger checks which were deleted)."""
    if _went_back_within(cursor):
        return PositionNote(OTHER_LIFE, left=life)
    rows = [*cursor.retired, cursor.landing] if cursor.seen else cursor.retired
    gaps: list[tuple[int, int]] = []
    expected = start
    for row in rows:
        if row.first_offset > expected:
            gaps.append((expected, row.first_offset))
        expected = max(expected, row.end_offset)
    return PositionNote(life, tuple(gaps))


def _starts_over(cursor: Cursor) -> bool:
    """Whether the cursor's partition went backwards (its topic made again, or truncated), as the planner saw at the
    batch's start or the copy met within it: its position is the new life's, not the old life's larger one."""
    return cursor.landing.reset_from >= 0


def _position(cursor: Cursor) -> int:
    """Where a range's partition goes on from: its first held offset, else the range's end once copied, or where its
    copy stands (a transaction committed before the range's end). A partition found gone backwards in the middle of
    its range was copied in its new life from the start up to its stop (`_end_a_later_life` files it so), not only to
    where its new landing began."""
    landing = cursor.landing
    if landing.held_from >= 0:
        return landing.held_from
    if not cursor.done:
        return cursor.next
    if _in_a_later_life(cursor) and cursor.stop is not None:
        return max(landing.end_offset, cursor.stop)
    return landing.end_offset


class _SlotCopy:
    """A slot's copy in transactions: by the compiled core while it takes the common case, each copy one
    transaction's worth (`Outbox.transaction_room`, Outbox.full's bounds); from its first event on, by the Python
    loop, whose producer, started then, fences the core's (the transaction the event fell in is committed or aborted
    first, as any). A flow whose core is not the compiled one copies with the Python loop from the start
    (spark_app.copy_wing.choice)."""

    def __init__(self, copier: RangeCopier, slot: int) -> None:
        self.copier = copier
        self.slot = slot
        self.settings = transaction_settings(copier.producer_settings)
        self.core: SlotTransactions[CoreTransactions] | None = None
        self.python: SlotTransactions[Producer] | None = None
        self.stopped = False  # the core stopped at an event: the slot goes on with the Python loop
        if copier.core is Core.RUST:
            source, target = copier.source, copier.target
            self.core = SlotTransactions(copier.flow, target, self.settings, slot,
                                         lambda conf: transactional_copier(source, target, conf))  # fmt: skip
        else:
            self.python = python_slot(copier.flow, copier.target, self.settings, slot)

    @property
    def txn(self) -> SlotTransactions[CoreTransactions] | SlotTransactions[Producer]:
        """The slot's transactions now."""
        if self.core is not None:
            return self.core
        assert self.python is not None
        return self.python

    def outbox(self, cursors: dict[Partition, Cursor], retries: Retries) -> Outbox:
        """The outbox of the next transaction: the Python loop's producer's, or, for the core, one that files the
        refusals it heard (the process's shared producer stands in: nothing is written through it)."""
        producer = self.python.producer if self.python is not None else clients.shared_producer(
            self.copier.target, self.copier.producer_settings)  # fmt: skip
        return self.copier._outbox(cursors, producer, retries)

    def copy(self, cursors: dict[Partition, Cursor], outbox: Outbox, watch: PartitionWatch) -> None:
        """Copy what the open transaction may carry."""
        if self.core is None:
            self.copier._copy_open(cursors, outbox, watch)
            return
        c = self.copier
        seconds, room = outbox.transaction_room()
        _, self.stopped = copy_with(self.core.producer.copier, c.flow, c.source, c.target, cursors, c.rules, outbox,
                                    until_s=seconds, until_bytes=room)  # fmt: skip
        # The core's own idle clock starts again with each copy; the copy's watch spans its transactions: a partition
        # that read nothing for LEADER_CHECK_S goes to the Python loop, which looks it up and holds it when stalled.
        now = time.monotonic()
        if now >= watch.look_at and watch.idle({key: cur.next for key, cur in cursors.items() if not cur.done}, now):
            self.stopped = True

    def hand_back_if_stopped(self) -> None:
        """Between transactions: once the core stopped at an event, the Python loop's producer takes the slot."""
        if self.core is None or not self.stopped:
            return
        self._close_core()
        self.python = python_slot(self.copier.flow, self.copier.target, self.settings, self.slot)

    @contextlib.contextmanager
    def fenced_raises(self) -> Iterator[None]:
        """SlotTransactions.fenced_raises of the transactions the slot writes when a call raises."""
        try:
            yield
        except KafkaException:
            with self.txn.fenced_raises():
                raise

    def close(self) -> None:
        if self.python is not None:
            self.python.close()
        self._close_core()

    def _close_core(self) -> None:
        if self.core is not None:
            self.core.close()
            self.core.producer.copier.close()
            self.core = None


class PartitionWatch:
    """How long each partition of a copy has read nothing: its next offset to read is compared with what it was at
    the previous look, at most once a second. One per copy, from its start (`began`): also when it next says where
    its partitions stand (`say_at`)."""

    def __init__(self, reached: dict[Partition, int], now: float) -> None:
        self._seen = dict(reached)
        self._since = dict.fromkeys(reached, now)
        self.look_at = now + LEADER_CHECK_S
        self.began, self.say_at = now, now + SAY_OPEN_S

    def idle(self, reached: dict[Partition, int], now: float) -> dict[Partition, float]:
        """Those of the partitions in `reached` (each with its next offset to read) that read nothing for
        LEADER_CHECK_S or more, with for how many seconds."""
        self.look_at = now + 1.0
        out: dict[Partition, float] = {}
        for key, offset in reached.items():
            if offset != self._seen[key]:
                self._seen[key], self._since[key] = offset, now
            elif now - self._since[key] >= LEADER_CHECK_S:
                out[key] = now - self._since[key]
        return out


def unreadable(idle: dict[Partition, float], leaders: dict[Partition, int] | None, source: str) -> dict[Partition, str]:
    """Which idle partitions (seconds without a read) to hold, with why: those the source's metadata gives no leader,
    and those whose named leader served nothing for PARTITION_STALL_S. When the source's metadata did not answer
    either (`leaders` None), the whole source is down: a partition idle for PARTITION_STALL_S is held, so the batch
    ends and its topics catch up once the source is back (the planner stops the mirror if it never is)."""
    out: dict[Partition, str] = {}
    for key, seconds in idle.items():
        stalled = f"no progress reading partition for {seconds:.0f} s"
        if leaders is None:
            if seconds >= PARTITION_STALL_S:
                out[key] = f"{stalled}: source '{source}' does not answer"
            continue
        leader = leaders.get(key, -1)
        if leader < 0:
            out[key] = f"{stalled}: source '{source}' names no leader for it (leader offline?)"
        elif seconds >= PARTITION_STALL_S:
            out[key] = f"{stalled} from source '{source}' (leader {leader} unreachable?)"
    return out
