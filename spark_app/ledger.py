"""The flow's ledger: positions, holds, landings, totals, resets and data loss, filed the same for both modes.

Whatever copied records (a micro-batch, a quarantine catch-up, a real-time task's report) hands its landings to
`FlowLedger.file`, which counts them (totals, metrics, the DR service's offset syncs), quarantines what was held
(spark_app.quarantine), notes partitions whose offsets went backwards, reports records deleted at the source before
they were read, moves the positions, and saves the state in the flow's checkpoint folder before the copy is committed,
so a crash replays at most what was filed after the last save (at least once, never a gap).

Data loss. Per partition the state keeps the next offset the flow expects. When a landing starts further on, the
source's log start is checked: records below it that were never read were deleted by retention. They are reported
(log, `data_loss`) and mirroring goes on, unless the flow sets `fail_on_data_loss`. A gap whose log start does not
answer (its leader offline) is saved with the positions that moved past it and checked at each filing until it does.

Order after a refusal. A flow without transactions cannot keep a partition in order past a record the target's
broker refuses in its delivery report (a cap lowered, compaction set or a timestamp rule met between topic syncs,
where no pre-send rule could tell): librdkafka's idempotent producer starts a new epoch and sends what it had queued
behind the refused record, so those records land first, and the catch-up writes the refused one after them. The
landings say so (a partition held from an offset, with records past it landed): each such range is reported (log,
`landed_ahead`, the metric `mirrorkit_records_landed_ahead`). With transactions the refusal aborts the transaction and
nothing lands ahead (spark_app.outbox.Retries). The same bound holds for a topic made again and refilled past where a
real-time copy stood before the mirror saw its new id: the copy reads the new life on from there, and nothing in the
records tells it from the old one's. Once the new id is seen the new life is copied from its log start, after what
landed; the copy's runner names the offsets that may be the new life's (`read_on`), reported the same way.

Topics gone. Topic sync tells the ledger which topics the source has now (`topics_seen`). A topic missing from
every round for TOPIC_GONE_GRACE_S is forgotten: its positions, landings, adopted offsets and per-topic totals, so
the state, rewritten at every save, holds the topics that exist rather than every topic ever copied. A topic missing
for less keeps everything and resumes where it stood; a quarantined one keeps its holds as long.

Slots. A flow that writes in transactions names its producers by slot (spark_app.transactions), and each run deals
its slots anew: a throughput batch one per task, a real-time job one per `realtime_tasks` it fills. The state keeps
how many slot ids any run ever started (`slots`, raised and saved before a slot past it starts), so a run with fewer
fences the ids from its own count up to it at its start: no zombie of a higher slot commits beside it.

`LedgerState` is a small versioned JSON file in the flow's checkpoint folder, beside its batch log, local or in
object storage (spark_app.storage), so it survives exactly when the batch log does.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import KafkaException

from .clients import Partition, PartitionOffsets
from .config import TOPIC_GONE_GRACE_S, FlowConfig, FlowMode
from .errors import MirrorFailed, StateError
from .metrics import FlowTotals, MirrorMetrics, owed_from
from .quarantine import Hold, Quarantine, Quarantines
from .ranges import DataLoss, Landing, OffsetRange, OffsetsReset
from .storage import CheckpointFiles

log = logging.getLogger(__name__)

_Value = TypeVar("_Value")

STATE_VERSION = 1
STATE_FILE = "mirrorkit-state.json"
# How many of the newest data-loss and offsets-reset events a flow keeps to be looked at (the log and the metrics have
# each one): a flow that runs for months must not keep them all.
RECENT_EVENTS = 100

# The source's log start of each partition that answers; one whose leader is offline is left out.
EarliestOffsets = Callable[[list[Partition]], PartitionOffsets]
# The source's topic ids now (KIP-516), of the topics that answer.
TopicIds = Callable[[set[str]], dict[str, str]]
# Copy these ranges with a copy that may write the given topics (name -> partitions on the target), each topic's ranges
# owed by its life given (name -> topic id; a topic left out: its life is not known).
CopyRanges = Callable[[list[OffsetRange], dict[str, int], dict[str, str]], list[Landing]]


@dataclass
class LedgerState:
    """What a flow remembers across restarts, saved as `mirrorkit-state.json` in its checkpoint folder."""

    files: CheckpointFiles
    quarantined: dict[str, Quarantine] = field(default_factory=dict)
    positions: PartitionOffsets = field(default_factory=dict)  # next source offset to read
    # Where to start a partition the batch log does not hold: MirrorMaker 2's next offset (spark_app.dr.adopt).
    adopted: PartitionOffsets = field(default_factory=dict)
    # Per partition, the target offset after the last record written before `positions`: a real-time restart counts
    # what landed after the save (spark_app.realtime).
    landed: PartitionOffsets = field(default_factory=dict)
    # Per topic, the id (KIP-516) of the topic `positions` belong to: one deleted and made again has another.
    topic_ids: dict[str, str] = field(default_factory=dict)
    # The mode whose copies saved `positions` last: a throughput run after a real-time one starts past its older batch
    # log, at `positions` (spark_app.planner).
    mode: FlowMode = FlowMode.THROUGHPUT
    # Gaps (expected, first read) the positions have moved past whose log start did not answer (the partition's leader
    # offline, the source unreachable): looked up at each filing until it answers, at most RECENT_EVENTS per partition.
    # Saved with the positions, or a restart meanwhile would never report what retention deleted in them.
    unresolved: dict[Partition, list[tuple[int, int]]] = field(default_factory=dict)
    # How many slot ids (0 up to it) any run of the flow ever started a transactional producer of: saved before a slot
    # past it starts, so each start fences the zombies of slots a run before it started and this one leaves idle
    # (spark_app.transactions.fence_idle). One integer per flow, whatever the history.
    slots: int = 0

    @property
    def where(self) -> str:
        return self.files.where(STATE_FILE)

    @classmethod
    def load(cls, files: CheckpointFiles) -> LedgerState:
        state = cls(files)
        data = files.read(STATE_FILE)
        if data is None:
            return state
        raw = json.loads(data)
        if raw.get("version") != STATE_VERSION:
            raise StateError(
                f"{state.where}: state version {raw.get('version')!r}, this mirror reads version {STATE_VERSION};"
                " run the mirror version that wrote it to drain its quarantines, or move the file away to accept"
                " that its held offsets are not caught up"
            )
        for topic, q in raw["quarantined"].items():
            holds = {int(p): Hold(h["first"], h["next"], h.get("life", "")) for p, h in q["partitions"].items()}
            state.quarantined[topic] = Quarantine(q["reason"], holds)
        state.positions = _by_partition(raw["positions"])
        state.adopted = _by_partition(raw["adopted"])
        # Written since the release before: a state without them is that release's.
        state.landed = _by_partition(raw.get("landed", {}))
        state.topic_ids = dict(raw.get("topic_ids", {}))
        state.mode = FlowMode(raw.get("mode", FlowMode.THROUGHPUT))
        unresolved = _by_partition(raw.get("unresolved", {}))
        state.unresolved = {tp: [(expected, first) for expected, first in gaps] for tp, gaps in unresolved.items()}
        state.slots = int(raw.get("slots", 0))
        return state

    def save(self) -> None:
        """Replace the file whole: a crash leaves the old state or the new one, never half of one."""
        raw = {
            "version": STATE_VERSION,
            "quarantined": {
                t: {"reason": q.reason, "partitions": {str(p): _hold(h) for p, h in sorted(q.partitions.items())}}
                for t, q in sorted(self.quarantined.items())
            },
            "positions": by_topic(self.positions),
            "adopted": by_topic(self.adopted),
            "landed": by_topic(self.landed),
            "topic_ids": dict(sorted(self.topic_ids.items())),
            "mode": self.mode.value,
            "unresolved": by_topic(self.unresolved),
            "slots": self.slots,
        }
        self.files.write(STATE_FILE, json.dumps(raw, indent=1).encode())

    def topics(self) -> set[str]:
        """The topics the state has an offset or an id of (their holds aside)."""
        return {t for offsets in (self.positions, self.landed, self.adopted) for t, _ in offsets} | set(self.topic_ids)

    def forget(self, topics: Collection[str]) -> None:
        """Drop the positions, landings, adopted offsets, unresolved gaps and ids of `topics`; holds are left alone
        (records owed)."""
        for offsets in (self.positions, self.landed, self.adopted, self.unresolved):
            for tp in [tp for tp in offsets if tp[0] in topics]:
                del offsets[tp]
        for topic in topics:
            self.topic_ids.pop(topic, None)


def _hold(hold: Hold) -> dict[str, object]:
    """A hold as the file has it: its life where known (a state written before holds named lives has none)."""
    return {"first": hold.first, "next": hold.next} | ({"life": hold.life} if hold.life else {})


def by_topic(offsets: Mapping[Partition, _Value]) -> dict[str, dict[str, _Value]]:
    """{(topic, partition): offset} as `{"topic": {"partition": offset}}`, the shape of the file and of Spark's."""
    out: dict[str, dict[str, _Value]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


@dataclass(frozen=True)
class LandedAhead:
    """Source offsets [first_offset, last_offset] of a partition (`count` records among them) that landed on the
    target ahead of `refused_offset`: an earlier record the target refused, or the start of a topic's new life that
    a copy read on unnoticed (`FlowLedger.read_on`: at most `count`, some of them may be the old life's)."""

    topic: str
    partition: int
    refused_offset: int
    first_offset: int
    last_offset: int
    count: int


def _by_partition(offsets: dict[str, dict[str, _Value]]) -> dict[Partition, _Value]:
    return {(t, int(p)): o for t, parts in offsets.items() for p, o in parts.items()}


class FlowLedger:
    """One flow's book over its `LedgerState`; the source's log starts, the metrics and the DR hook are injected."""

    def __init__(
        self, flow: FlowConfig, state: LedgerState, earliest: EarliestOffsets, metrics: MirrorMetrics | None = None,
        on_landed: Callable[[list[Landing]], None] | None = None, clock: Callable[[], float] = time.monotonic,
        topic_ids: TopicIds = lambda topics: {},
    ) -> None:  # fmt: skip
        self.flow = flow
        self.state = state
        self.quarantines = Quarantines(flow, state.quarantined, clock)
        self.totals = FlowTotals()
        self.metrics = metrics or MirrorMetrics()
        self.lost_records = 0  # records reported deleted before they were mirrored, over this process's life
        self._losses: collections.deque[DataLoss] = collections.deque(maxlen=RECENT_EVENTS)
        self._resets: collections.deque[OffsetsReset] = collections.deque(maxlen=RECENT_EVENTS)
        self._ahead: collections.deque[LandedAhead] = collections.deque(maxlen=RECENT_EVENTS)
        self._read_on: dict[Partition, tuple[int, int]] = {}  # `read_on`, reported with the partition's reset
        self._earliest = earliest
        self._topic_ids = topic_ids  # a catch-up asks which life a topic is in before it copies what its holds owe
        self._on_landed = on_landed
        self._clock = clock
        self._missing_since: dict[str, float] = {}  # known topic missing from topic sync -> when first missed

    @property
    def data_loss(self) -> list[DataLoss]:
        """The newest RECENT_EVENTS ranges reported deleted before they were mirrored (`lost_records` counts all)."""
        return list(self._losses)

    @property
    def landed_ahead(self) -> list[LandedAhead]:
        """The newest RECENT_EVENTS ranges that landed ahead of an earlier record the target refused."""
        return list(self._ahead)

    @property
    def resets(self) -> list[OffsetsReset]:
        """The newest RECENT_EVENTS partitions whose offsets went backwards."""
        return list(self._resets)

    @property
    def quarantined(self) -> dict[str, str]:
        """Each quarantined topic with why it stopped."""
        return self.quarantines.reasons()

    @property
    def held(self) -> dict[str, dict[int, int]]:
        """Per quarantined topic, per partition, the first source offset not written."""
        return self.quarantines.held()

    def resume_points(self) -> PartitionOffsets:
        """Per partition the ledger knows, the first source offset the target still lacks."""
        return owed_from(self.state.adopted | self.state.positions, self.held)

    def expect(self, starts: PartitionOffsets) -> None:
        """A copy starts reading these partitions here: those the ledger has no position of yet stand there from now
        (saved with the next filing, before any of their records is read). A crash before their first report then
        resumes there, and records deleted at the source meanwhile are reported; without it the restart would meet
        them as new partitions, from their log start, and say nothing of what lay below it."""
        for key, offset in starts.items():
            self.state.positions.setdefault(key, offset)

    def slots_start(self, count: int) -> None:
        """Slot ids 0 up to `count` are about to start their transactional producers: raise the flow's mark to
        `count`, saved before any of them starts, so a later run with fewer slots knows which ids to fence."""
        if count > self.state.slots:
            self.state.slots = count
            self._save()

    def note_topic_ids(self, ids: dict[str, str]) -> set[str]:
        """Remember which topic the positions belong to (saved with the next filing); returns the topics whose id
        changed, deleted and made again: their positions mean nothing in the new log."""
        remade = {t for t, i in ids.items() if self.state.topic_ids.get(t, i) != i}
        self.state.topic_ids.update(ids)
        return remade

    def topics_seen(self, present: Collection[str]) -> list[str]:
        """Topic sync found `present` at the source: forget each topic the ledger knows that has been missing from
        every round since TOPIC_GONE_GRACE_S ago, and return them. A quarantined one gives up its holds then, saying
        so: what it still owed went with it (deleted) or is no longer wanted (deselected)."""
        now = self._clock()
        known = self.state.topics() | set(self.totals.records) | set(self.quarantines.topics)
        missing = known - set(present)
        self._missing_since = {t: self._missing_since.get(t, now) for t in missing}
        gone = sorted(t for t, since in self._missing_since.items() if now - since >= TOPIC_GONE_GRACE_S)
        if not gone:
            return gone
        for topic in gone:
            del self._missing_since[topic]
            if topic in self.quarantines.topics:
                reason, held = self.quarantines.reasons()[topic], self.quarantines.held()[topic]
                del self.quarantines.topics[topic]
                log.error("flow %s: quarantined topic '%s' (%s) has been missing at the source for %.0f s; its held"
                          " records (first held offset per partition: %s) are given up", self.flow.name, topic, reason,
                          TOPIC_GONE_GRACE_S, held or "none")  # fmt: skip
        self.state.forget(gone)
        self.totals.forget(gone)
        log.info("flow %s: forgetting the positions of %d topic(s) missing at the source for %.0f s: %s",
                 self.flow.name, len(gone), TOPIC_GONE_GRACE_S, ", ".join(gone[:10]))  # fmt: skip
        self._save()
        return gone

    def file(self, landed: list[Landing]) -> None:
        """After a batch or a report: count what landed, quarantine what was held, note resets and records deleted
        before they were read, move the positions, save."""
        self._count(landed)
        lost, resets = [], []
        for row in landed:
            key = (row.topic, row.partition)
            self._report_ahead(row, row.held_from if row.held_from >= 0 else self._held_first(key))
            if row.reset_from >= 0:
                reset = OffsetsReset(row.topic, row.partition, row.reset_from, min(row.first_offset, row.end_offset))
                resets.append(reset)
                log.error(
                    "flow %s: offsets of '%s' partition %d went backwards (deleted and made again, or truncated): the"
                    " mirror had copied up to offset %d, the partition now starts over at %d; it is copied again from"
                    " there and its offset translation restarts", self.flow.name, row.topic, row.partition,
                    reset.previous, reset.restart,
                )  # fmt: skip
                self._report_read_on(key, reset.restart)
                self.state.positions.pop(key, None)
                self.quarantines.started_over(row.topic, row.partition)
            expected = self.state.positions.get(key)
            if expected is not None and row.first_offset > expected:
                lost.append((row.topic, row.partition, expected, row.first_offset))
            self.state.positions[key] = max(row.end_offset, expected or 0)
            if row.last_target_offset >= 0:
                self.state.landed[key] = row.last_target_offset + 1
            if row.held_from >= 0:
                self.quarantines.file(row, self.state.topic_ids.get(row.topic, ""))
        self._report_loss(lost)
        self._resets.extend(resets)
        if resets:
            self.metrics.error(self.flow.name, "offsets_reset", len(resets))
        self.state.mode = self.flow.mode
        self._save()

    def catch_up(self, mirrored: dict[str, int], copy: CopyRanges) -> None:
        """Copy (with `copy`) what each quarantined topic that may rejoin owes (`mirrored`: the topics the target can
        take, with their partition counts there), and file it. A topic whose holds name their life is asked its id
        first: holds of a life before it are given up, not read at their offsets in the new one; while its id does
        not answer, it waits."""
        due = self.quarantines.due(mirrored)
        dated = {t for t in due if self.quarantines.lives(t)}
        lives = self._topic_ids(dated) if dated else {}
        for topic in due:
            if topic in dated:
                if topic not in lives:
                    continue
                self.quarantines.outlived(topic, lives[topic])
            owed = self.quarantines.owed(topic, self.flow.max_records_per_trigger)
            life = {topic: lives[topic]} if topic in lives else {}
            self._file_catch_up(topic, owed, copy(owed, {topic: mirrored[topic]}, life) if owed else [])

    def _file_catch_up(self, topic: str, owed: list[OffsetRange], landed: list[Landing]) -> None:
        """After copying what a quarantined topic owed: count it, report records deleted meanwhile, and let the topic
        rejoin or stay held from where the copy held it again."""
        self._count(landed)
        for row in landed:
            self._report_ahead(row, row.held_from)
        gaps: list[tuple[str, int, int, int]] = []
        for r in owed:  # a partition's rows in order: retention may have moved it on between two of them
            rows = [row for row in landed if row.partition == r.partition]
            expected = r.start
            for row in rows:
                gaps.append((topic, r.partition, expected, row.first_offset))
                expected = max(expected, row.end_offset)
            if not rows:
                gaps.append((topic, r.partition, r.start, r.end))
        self._report_loss(gaps)
        self.quarantines.caught_up(topic, owed, landed)
        self._save()

    def refused(self, reasons: dict[str, str]) -> None:
        """Topic sync found targets that cannot take these topics: quarantine them whole."""
        self.quarantines.refused(reasons)
        self._publish()

    def release(self, topic: str) -> None:
        """Let a quarantined topic be written again from its first held offsets (real-time mode reads them again)."""
        for p, first in self.quarantines.release(topic).items():
            self.state.positions[(topic, p)] = min(first, self.state.positions.get((topic, p), first))
        self._save()

    def _held_first(self, key: Partition) -> int:
        """The first offset a quarantined partition has not written yet, -1 when it holds nothing."""
        q = self.quarantines.topics.get(key[0])
        hold = q.partitions.get(key[1]) if q is not None else None
        return hold.first if hold is not None else -1

    def _report_ahead(self, row: Landing, held: int) -> None:
        """Report the records of `row` that landed past `held`, the first offset of its partition not written (a
        record the target refused): on the target they came before it. Never with transactions (a refusal aborts
        what was sent with it)."""
        if held < 0 or self.flow.exactly_once:
            return
        past = [(max(first, held + 1), last) for first, _target, last in row.runs if last > held]
        if not past:
            return
        ahead = LandedAhead(row.topic, row.partition, held, min(f for f, _ in past), max(last for _, last in past),
                            sum(last - first + 1 for first, last in past))  # fmt: skip
        self._ahead.append(ahead)
        self.metrics.records_landed_ahead(self.flow.name, row.topic, row.partition, ahead.count)
        log.error(
            "flow %s: %d record(s) of '%s' partition %d, offsets %d..%d, landed on the target ahead of offset %d, which"
            " the target refused: their first copies there are out of source order (a flow without transactions"
            " cannot keep order past a refusal only the target's broker can judge); offset %d is copied after them"
            " once the target takes it", self.flow.name, ahead.count, ahead.topic, ahead.partition, ahead.first_offset,
            ahead.last_offset, ahead.refused_offset, ahead.refused_offset,
        )  # fmt: skip

    def read_on(self, partitions: dict[Partition, tuple[int, int]]) -> None:
        """Source offsets [first, last] per partition that may be a topic's new life, read on unnoticed and landed
        before the copy went back to the new life's start: reported when the partition's reset is filed. Never with
        transactions (a slot asks the topic's id before it commits)."""
        if not self.flow.exactly_once:
            self._read_on.update(partitions)

    def _report_read_on(self, key: Partition, restart: int) -> None:
        first, last = self._read_on.pop(key, (0, -1))
        if last < first:
            return
        ahead = LandedAhead(key[0], key[1], restart, first, last, last - first + 1)
        self._ahead.append(ahead)
        self.metrics.records_landed_ahead(self.flow.name, key[0], key[1], ahead.count)
        log.error(
            "flow %s: up to %d record(s) of '%s' partition %d, offsets %d..%d, may have landed on the target ahead of"
            " offset %d, the start of the topic's new life: it was made again and read on past where the copy stood"
            " before the mirror saw its new id, and a flow without transactions cannot tell the two lives' records"
            " apart; their first copies there may be out of source order", self.flow.name, ahead.count, ahead.topic,
            ahead.partition, ahead.first_offset, ahead.last_offset, ahead.refused_offset,
        )  # fmt: skip

    def _count(self, landed: list[Landing]) -> None:
        self.totals.add(landed)
        self.metrics.batch_landed(self.flow.name, landed)
        if self._on_landed is not None:
            self._on_landed(landed)

    def _save(self) -> None:
        self.state.save()
        self._publish()

    def _publish(self) -> None:
        self.metrics.topics_quarantined(self.flow.name, self.quarantined)

    def _report_loss(self, gaps: list[tuple[str, int, int, int]]) -> None:
        """Gaps (topic, partition, expected, first read) below the source's log start are records lost to retention.

        Only real gaps are looked up: a partition held before it read anything (its leader offline) is no gap, and
        its log start would not answer. A gap whose log start does not answer now (its leader went offline since the
        copy read past it) is looked up again at the next filing: the filing itself never fails for it."""
        gaps = [gap for gap in gaps if gap[3] > gap[2]]
        unresolved = self.state.unresolved
        gaps += [(t, p, expected, first) for (t, p), pending in unresolved.items() for expected, first in pending]
        unresolved.clear()
        if not gaps:
            return
        try:
            earliest = self._earliest(sorted({(t, p) for t, p, _, _ in gaps}))
        except KafkaException as err:
            log.warning("flow %s: the source's log starts did not answer (%s); gaps checked at the next filing",
                        self.flow.name, err.args[0])  # fmt: skip
            earliest = {}
        for topic, partition, expected, first_read in gaps:
            if (topic, partition) not in earliest:
                pending = unresolved.setdefault((topic, partition), [])
                if len(pending) < RECENT_EVENTS:
                    pending.append((expected, first_read))
                continue
            end = min(earliest[(topic, partition)], first_read)
            if end <= expected:
                continue  # offsets that never held a record (compaction, transaction markers)
            loss = DataLoss(topic, partition, expected, end - 1)
            self._losses.append(loss)
            self.lost_records += loss.count
            log.error(
                "flow %s: %d record(s) of '%s' partition %d, offsets %d..%d, were deleted at the source before they"
                " were mirrored%s", self.flow.name, loss.count, topic, partition, loss.first_offset, loss.last_offset,
                "" if self.flow.fail_on_data_loss else "; mirroring goes on",
            )  # fmt: skip
            if self.flow.fail_on_data_loss:
                raise MirrorFailed(f"flow {self.flow.name}: records deleted before they were mirrored: {loss}")
