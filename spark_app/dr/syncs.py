"""The offset-sync store and translation: where a consumer group resumes on the target, never skipping a record.

The writer reports, per copied range, its *runs*: stretches of consecutive source offsets that landed on
consecutive target offsets, as `Run(start, target, last)` (source offsets `start..last` landed at `target..`). A
topic without gaps, copied by one mirror, is one run for its whole history; a run breaks where the source skips
offsets (compaction, transaction markers, records dropped by loop prevention or refused), where other producers'
records land between ours on the target (identity active/active), or where a batch is copied again after a crash.

Translation of a committed offset C (the next record the group reads) maps the last record it read, C - 1, and
resumes right after it: inside a run that is exact, with nothing read again. Because it resumes after the last
record the group read, a record written on the target by someone else after that point is read, never skipped.
When C - 1 falls after a run's end (a gap, or a record the mirror has not copied yet) it resumes right after the
run: safe, with at most C - 1 - last source records read again. A group whose C - 1 is older than every kept run
gets the caller's fallback.

Memory is bounded per partition (per kind of run): at most `run_bound(G)` = max(MAX_RUNS, MAX_TRAIL) + 64 +
G + MAX_RUNS / 4 runs, G the distinct committed offsets groups hold there (2,048 + 64 + 64 + G with the defaults).
Eviction keeps: the dense tail (the MAX_RUNS newest); the trail, every run above the slowest group's position up
to the MAX_TRAIL newest; the run under each committed offset the checkpoint task saw last (`keep_for`); and
exponentially spaced history, the newest run at or below head - 2**k for every k, down to the oldest run (after
Kafka's KAFKA-14666). So a parked group is exact at any lag; a group that keeps consuming is exact while it stays
within MAX_TRAIL runs of the head, as the runs it moves into were kept since they were written; and a group beyond
that (or one never seen) resumes safely after the nearest exponential point below it, re-reading at most about its
own lag, which the translation reports. No bounded store does better for a moving group at any lag: the run it
moves into next is one of the runs between it and the head, and any of them may be the one. A partition without
gaps is one run, exact at any lag. History read back at start, and a partition new to the store or reset, is not
evicted until the next `keep_for` says what groups need, so a restart keeps what a parked group's translation rests on;
if no `keep_for` comes (the source refuses to list groups), such a partition is evicted as usual once it holds twice
`run_bound(0)`, with the committed offsets it knew last.
A reset writes tombstones for the old slots, so its old runs never come back after a restart.

Under `identity` the target topic also holds records written there locally (including any it held before the
flow's first write, which count as a local span from offset 0 unless history read back says otherwise), and a
group resuming after the last
mirrored record it read could skip a local one below that it never read. The flow the other way copies those
local records to the source, stamped with their target offset, and this flow drops them there as echoes; it keeps
them as *echo runs* (source offset -> the target offset the record came from), and it notes the *local spans*,
target offsets that landed between its own writes (someone else's records). A group at C has read every local
record up to the echo it read last, e = the target offset of the newest echo below C; so it resumes at the first
local-span offset past e when that comes before the mirrored position. That is exact when every local record is
echoed back, and otherwise conservative: a span that is not the other flow's (a third writer) is read again,
never skipped. `Translation.guarded` says so, and `failover --dry-run` prints it. Local spans are bounded by
merging the oldest neighbours (a merged span also covers the mirrored records between, which only re-reads); the
span each committed offset needs is never merged away.

Each run and span owns a *slot*; the offset-syncs topic is keyed by (topic, partition, slot, kind), so after
compaction it holds exactly one record per live run or span and a restart rebuilds the same store from it.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ..clients import Partition

# Recent runs kept per partition, beside the ones groups need. A topic with few gaps needs one; a transactional
# topic breaks a run at every commit marker, so this is about MAX_RUNS transactions of exact history.
MAX_RUNS = 256
# Runs kept above the slowest group's position, newest first, so a group that keeps consuming behind the dense tail
# still finds the run it moves into: about MAX_TRAIL transactions of lag translate exactly.
MAX_TRAIL = 2048
# Exponentially spaced history: the newest run at or below head - 2**k, for every k.
EXPONENTIAL_POINTS = 64
# Local spans kept per partition: identity active/active adds about one per batch with local writes.
MAX_LOCAL_SPANS = 256
# What a synced record holds: a mirrored run, an echo run, or a local span (written as a run onto itself).
MIRRORED, ECHO, LOCAL = 0, 1, 2


@dataclass(frozen=True)
class Run:
    """Source offsets start..last landed, one after another, at target offsets target..target + (last - start)."""

    start: int
    target: int
    last: int

    @property
    def target_end(self) -> int:
        """The target offset right after the run's last record."""
        return self.target + (self.last - self.start) + 1

    def follows(self, before: Run) -> bool:
        """This run continues `before` without a break in either offset sequence."""
        return self.start == before.last + 1 and self.target == before.target_end


@dataclass(frozen=True)
class Translation:
    downstream_offset: int
    reread: int  # at most this many records a consumer reads again on the target
    guarded: bool = False  # moved back to a target-local record the group may not have read (identity)


def run_bound(committed_offsets: int, max_runs: int = MAX_RUNS, max_trail: int = MAX_TRAIL) -> int:
    """The most runs one partition keeps (of one kind), given how many distinct committed offsets groups hold on
    it: the dense tail or the trail above the slowest group, the exponential points, one run per committed offset,
    and the slack eviction waits for."""
    return max(max_runs, max_trail) + EXPONENTIAL_POINTS + committed_offsets + _slack(max_runs)


def _slack(max_runs: int) -> int:
    """Runs recorded past the last eviction before the next one, so eviction costs O(1) per run amortized."""
    return max(1, max_runs // 4)


@dataclass
class _PartitionRuns:
    runs: list[Run] = field(default_factory=list)  # sorted by start, not overlapping
    slots: dict[int, int] = field(default_factory=dict)  # run start -> slot
    needed: frozenset[int] = frozenset()  # committed offsets of the groups the checkpoint task saw last
    dirty: set[int] = field(default_factory=set)  # starts of runs changed since the last `take_changed`
    pinned: bool = False  # read back at start: nothing is evicted until `keep_for` says what groups need
    evict_at: int = 0  # evict once this many runs are held

    def starts(self) -> list[int]:
        return [r.start for r in self.runs]


_start = operator.attrgetter("start")


@dataclass(frozen=True)
class SlottedRun:
    """A run as the offset-syncs topic holds it; `run` None is a tombstone: the slot holds nothing any more."""

    topic: str
    partition: int
    slot: int
    run: Run | None
    kind: int = MIRRORED


class RunHistory:
    """Runs of one kind per source partition, with translation; at most `run_bound` runs per partition."""

    def __init__(self, kind: int, max_runs: int = MAX_RUNS, max_trail: int = MAX_TRAIL) -> None:
        self.kind = kind
        self.max_runs = max_runs
        self.max_trail = max_trail
        self._parts: dict[Partition, _PartitionRuns] = {}
        self._tombstones: dict[Partition, set[int]] = {}  # slots of reset partitions, to delete on the topic

    def record(self, topic: str, partition: int, run: Run) -> None:
        """A run the writer reports. A run starting at or before kept history means a batch copied again: what
        it overlaps is replaced, as reading goes on from the newer copy."""
        self._record(topic, partition, run, slot=None)

    def _record(self, topic: str, partition: int, run: Run, slot: int | None) -> None:
        # A partition new to the store is pinned until `keep_for` says which of its runs groups need.
        part = self._parts.setdefault((topic, partition), _PartitionRuns(pinned=True))
        runs = part.runs
        cut = len(runs) if not runs or runs[-1].start < run.start else bisect.bisect_left(runs, run.start, key=_start)
        for old in runs[cut:]:
            self._free(part, old)
        del runs[cut:]
        if runs and runs[-1].last >= run.start:  # the previous run reaches into the copy: cut it short
            prev = runs[-1]
            runs[-1] = Run(prev.start, prev.target, run.start - 1)
            part.dirty.add(prev.start)
        if runs and run.follows(runs[-1]):
            prev = runs[-1]
            runs[-1] = Run(prev.start, prev.target, run.last)
            part.dirty.add(prev.start)
        else:
            runs.append(run)
            part.slots[run.start] = self._free_slot(part) if slot is None else slot
            part.dirty.add(run.start)
        if slot is None and len(runs) > max(self.max_runs, part.evict_at):
            self._evict(part)

    def load(self, synced: Iterable[SlottedRun]) -> None:
        """Rebuild from the offset-syncs topic, replaying its records in the order it holds them (compacted or
        not; a tombstone empties its slot). Nothing is evicted until `keep_for` says which runs groups need."""
        for s in synced:
            part = self._parts.setdefault((s.topic, s.partition), _PartitionRuns())
            part.pinned = True
            stale = next((start for start, slot in part.slots.items() if slot == s.slot), None)
            if stale is not None:  # the slot was written again: the newer run replaces the one it held
                part.runs = [r for r in part.runs if r.start != stale]
                del part.slots[stale]
            if s.run is not None:
                self._record(s.topic, s.partition, s.run, slot=s.slot)
            part.dirty.clear()

    def reset(self, topic: str, partition: int) -> None:
        """Forget a partition whose offsets went backwards; its runs start over with the next batch. Every slot it
        held gets a tombstone at the next `take_changed`, so a restart never brings the old runs back."""
        part = self._parts.pop((topic, partition), None)
        if part is not None and part.slots:
            self._tombstones.setdefault((topic, partition), set()).update(part.slots.values())
        self._parts[(topic, partition)] = _PartitionRuns(pinned=True)  # groups start over too: wait for keep_for

    def forget(self, topics: Collection[str]) -> None:
        """Drop every partition of `topics`, gone from the source for good; each slot they held gets a tombstone at
        the next `take_changed`, so neither this store nor the topic keeps their runs."""
        for key in [key for key in self._parts if key[0] in topics]:
            part = self._parts.pop(key)
            if part.slots:
                self._tombstones.setdefault(key, set()).update(part.slots.values())

    def keep_for(self, needed: Mapping[Partition, Iterable[int]]) -> None:
        """The committed offsets groups have now, per partition: the runs holding them, and the runs above the
        slowest of them (up to `max_trail`), outlive the dense tail."""
        for key, part in self._parts.items():
            part.needed = frozenset(needed.get(key, ()))
            part.pinned = False
            self._evict(part)

    def translate(
        self, topic: str, partition: int, committed: int, fallback: Translation | None = None
    ) -> Translation | None:
        """The target offset to resume at for a source committed offset; `fallback` when history does not reach
        back to it."""
        run = self._run_before(topic, partition, committed)
        if run is None:
            return fallback
        read = committed - 1
        if read <= run.last:
            return Translation(run.target + (read - run.start) + 1, 0)
        return Translation(run.target_end, read - run.last)

    def latest(self, topic: str, partition: int) -> Run | None:
        part = self._parts.get((topic, partition))
        return part.runs[-1] if part and part.runs else None

    def partitions(self) -> list[Partition]:
        return sorted(k for k, p in self._parts.items() if p.runs)

    def runs(self, topic: str, partition: int) -> list[Run]:
        part = self._parts.get((topic, partition))
        return list(part.runs) if part else []

    def take_changed(self) -> Iterator[SlottedRun]:
        """The tombstones of reset partitions' slots, then the runs changed since the last call (new or
        extended), each with its slot, to write to the topic in this order."""
        for (topic, partition), slots in sorted(self._tombstones.items()):
            for slot in sorted(slots):
                yield SlottedRun(topic, partition, slot, None, self.kind)
        self._tombstones.clear()
        for (topic, partition), part in sorted(self._parts.items()):
            for run in part.runs:
                if run.start in part.dirty:
                    yield SlottedRun(topic, partition, part.slots[run.start], run, self.kind)
            part.dirty.clear()

    def rebase(self, older: RunHistory) -> None:
        """Put `older` history (read back at start) under this history's runs, in place. The older runs keep
        their slots; nothing is evicted until `keep_for` says what groups need (a parked group's run is there)."""
        merged = RunHistory(self.kind, self.max_runs, self.max_trail)
        for (topic, partition), part in older._parts.items():
            for run in part.runs:
                merged._record(topic, partition, run, slot=part.slots[run.start])
            merged._parts.setdefault((topic, partition), _PartitionRuns()).dirty.clear()
        for key, part in self._parts.items():
            merged._parts.setdefault(key, _PartitionRuns()).pinned = True
            for run in part.runs:
                merged._record(key[0], key[1], run, slot=None)
            merged._parts[key].needed = part.needed
        for part in merged._parts.values():
            part.pinned = True
        for key, slots in (*older._tombstones.items(), *self._tombstones.items()):
            merged._tombstones.setdefault(key, set()).update(slots)
        self._parts, self._tombstones = merged._parts, merged._tombstones

    # -- bookkeeping ------------------------------------------------------------------------------------------

    def _run_before(self, topic: str, partition: int, committed: int) -> Run | None:
        """The newest run starting at or before the last record read (committed - 1)."""
        part = self._parts.get((topic, partition))
        if part is None:
            return None
        i = bisect.bisect_right(part.runs, committed - 1, key=_start)  # per translation: no list of starts
        return part.runs[i - 1] if i else None

    @staticmethod
    def _free_slot(part: _PartitionRuns) -> int:
        return lowest_free(part.slots.values())

    @staticmethod
    def _free(part: _PartitionRuns, run: Run) -> None:
        part.slots.pop(run.start, None)
        part.dirty.discard(run.start)

    def _evict(self, part: _PartitionRuns) -> None:
        """Keep the runs translation needs and drop the rest: the dense tail (`max_runs` newest), or down to the
        slowest group's run if that is lower (at most `max_trail` newest); the run under each committed offset;
        and the newest run at or below head - 2**k for every k (exponentially spaced history)."""
        if not part.runs or part.pinned and len(part.runs) < 2 * run_bound(0, self.max_runs, self.max_trail):
            return
        runs, starts = part.runs, part.starts()
        under = [bisect.bisect_right(starts, c - 1) - 1 for c in part.needed]  # -1: below every run
        held = {i for i in under if i >= 0}
        dense_from = len(runs) - self.max_runs
        if under:  # a group below every run anchors the trail at the oldest
            dense_from = min(dense_from, max(max(0, min(under)), len(runs) - self.max_trail))
        keep = held | set(range(max(0, dense_from), len(runs)))
        head = runs[-1].last + 1
        for k in range(EXPONENTIAL_POINTS):  # the last point is the oldest run: history reaches back that far
            keep.add(max(0, bisect.bisect_right(starts, head - (1 << k)) - 1))
            if head - (1 << k) < runs[0].start:
                break
        kept = []
        for i, run in enumerate(runs):
            if i in keep:
                kept.append(run)
            else:
                self._free(part, run)
        part.runs = kept
        part.evict_at = len(kept) + _slack(self.max_runs)


def lowest_free(slots: Iterable[int]) -> int:
    """The lowest slot not in use, so slots stay few and compaction keeps one record per live run or span."""
    used = set(slots)
    return next(i for i in range(len(used) + 1) if i not in used)


@dataclass
class _Spans:
    spans: list[list[int]] = field(default_factory=list)  # [start, end) target offsets, sorted, not overlapping
    slots: list[int] = field(default_factory=list)  # one per span
    high: int | None = None  # the target offset after the flow's newest write
    first: int | None = None  # where this store's first write landed, when it knew no history before it
    needed: frozenset[int] = frozenset()  # starts of spans a group's translation rests on
    dirty: set[int] = field(default_factory=set)  # slots changed since the last `take_changed`
    prehistory: int | None = None  # slot of the span below this store's first write, when it knew no history
    tombstones: set[int] = field(default_factory=set)  # slots to delete on the topic


class LocalSpans:
    """Target offsets written by others between this flow's writes, per partition (see the module docstring)."""

    def __init__(self, max_spans: int = MAX_LOCAL_SPANS) -> None:
        self.max_spans = max_spans
        self._parts: dict[Partition, _Spans] = {}

    def wrote(self, key: Partition, run: Run) -> None:
        """The flow wrote `run`: whatever landed between its previous write and this one is someone else's."""
        part = self._parts.setdefault(key, _Spans())
        if part.high is None:
            part.first = run.target
            if run.target > 0:  # the target held records before the flow's first write: someone else's
                self._add(part, 0, run.target, None)
                part.prehistory = part.slots[0]
        elif run.target > part.high:
            self._add(part, part.high, run.target, None)
        part.high = max(part.high or 0, run.target_end)

    def first_unread(self, key: Partition, read_through: int) -> int | None:
        """The first local target offset at or after `read_through`, None when none is known."""
        part = self._parts.get(key)
        if part is None:
            return None
        i = bisect.bisect_right([end for _, end in part.spans], read_through)
        return max(part.spans[i][0], read_through) if i < len(part.spans) else None

    def keep_for(self, key: Partition, read_through: Iterable[int]) -> None:
        """Keep apart the span each group resumes at, given where each has read local records through."""
        part = self._parts.get(key)
        if part is None:
            return
        ends = [end for _, end in part.spans]
        needed = {part.spans[i][0] for r in read_through if (i := bisect.bisect_right(ends, r)) < len(ends)}
        part.needed = frozenset(needed)
        self._bound(part)

    def load(self, key: Partition, slot: int, span: tuple[int, int] | None) -> None:
        """A span [start, end) read back from the topic; a slot written again replaces what it held, and a
        tombstone (None) empties it."""
        part = self._parts.setdefault(key, _Spans())
        if slot in part.slots:
            i = part.slots.index(slot)
            del part.spans[i], part.slots[i]
        if span is not None:
            self._add(part, span[0], span[1], slot)
        part.dirty.clear()

    def forget(self, topics: Collection[str]) -> None:
        """Drop the spans of every partition of `topics`; their slots get tombstones at the next `take_changed`."""
        for key in [key for key in self._parts if key[0] in topics]:
            self._parts[key] = _Spans(tombstones=set(self._parts[key].slots))

    def set_high(self, key: Partition, high: int) -> None:
        """Where the flow's newest write ended, from history read back."""
        part = self._parts.setdefault(key, _Spans())
        part.high = max(part.high or 0, high)

    def take_changed(self) -> Iterator[SlottedRun]:
        for (topic, partition), part in sorted(self._parts.items()):
            for slot in sorted(part.tombstones - set(part.slots)):
                yield SlottedRun(topic, partition, slot, None, LOCAL)
            part.tombstones.clear()
            for (start, end), slot in zip(part.spans, part.slots, strict=True):
                if slot in part.dirty:
                    yield SlottedRun(topic, partition, slot, Run(start, start, end - 1), LOCAL)
            part.dirty.clear()
        for key in [key for key, part in self._parts.items() if not part.spans and part.high is None]:
            del self._parts[key]  # forgotten, its tombstones written: nothing of it is left to keep

    def rebase(self, older: LocalSpans) -> None:
        """Put `older` spans (read back at start) under this store's; the stretch between the older history's last
        write and this store's first one is someone else's too."""
        for key, old in older._parts.items():
            part = self._parts.setdefault(key, _Spans())
            if old.high is not None and part.prehistory is not None:  # the history below the first write is known
                i = part.slots.index(part.prehistory)
                del part.spans[i], part.slots[i]
                part.dirty.discard(part.prehistory)
                part.tombstones.add(part.prehistory)
            part.prehistory = None
            if old.high is not None and part.first is not None and part.first > old.high:
                self._add(part, old.high, part.first, None)
            for (start, end), slot in zip(old.spans, old.slots, strict=True):
                if slot not in part.slots:
                    self._add(part, start, end, slot)
                    part.dirty.discard(slot)
            part.high = max(part.high or 0, old.high or 0)
            part.first = None

    def _add(self, part: _Spans, start: int, end: int, slot: int | None) -> None:
        i = bisect.bisect_left([s for s, _ in part.spans], start)
        part.spans.insert(i, [start, end])
        part.slots.insert(i, lowest_free(part.slots) if slot is None else slot)
        part.dirty.add(part.slots[i])
        self._merge_overlaps(part)
        if slot is None:
            self._bound(part)

    @staticmethod
    def _merge_overlaps(part: _Spans) -> None:
        i = 1
        while i < len(part.spans):
            if part.spans[i][0] <= part.spans[i - 1][1]:
                LocalSpans._join(part, i - 1)
            else:
                i += 1

    @staticmethod
    def _join(part: _Spans, i: int) -> None:
        """Merge span i with the next one: the mirrored records between count as local, which only re-reads."""
        part.spans[i][1] = max(part.spans[i][1], part.spans[i + 1][1])
        if part.prehistory == part.slots[i + 1]:
            part.prehistory = part.slots[i]
        part.dirty.discard(part.slots[i + 1])
        part.tombstones.add(part.slots[i + 1])
        del part.spans[i + 1], part.slots[i + 1]
        part.dirty.add(part.slots[i])

    def _bound(self, part: _Spans) -> None:
        """Merge the oldest neighbours past `max_spans`, never into a span a group resumes at."""
        i = 0
        while len(part.spans) > self.max_spans and i + 1 < len(part.spans):
            if part.spans[i + 1][0] in part.needed:
                i += 1
            else:
                self._join(part, i)


class SyncStore:
    """Where a flow's records landed, per source partition, and the translation that rests on it.

    `local_writes` is for `identity` flows whose target's records come back to the source through a flow the
    other way (spark_app.policy.echoes_back): their target topics hold local records, and the echoes tell which
    of them a group has read.
    """

    def __init__(self, max_runs: int = MAX_RUNS, local_writes: bool = False, max_trail: int = MAX_TRAIL) -> None:
        self.local_writes = local_writes
        self._mirrored = RunHistory(MIRRORED, max_runs, max_trail)
        self._echoes = RunHistory(ECHO, max_runs, max_trail)
        self._local = LocalSpans()

    def record(self, topic: str, partition: int, run: Run) -> None:
        """A run the writer reports. A run starting at or before kept history means a batch copied again: what
        it overlaps is replaced, as reading goes on from the newer copy."""
        self._mirrored.record(topic, partition, run)
        if self.local_writes:
            self._local.wrote((topic, partition), run)

    def echo(self, topic: str, partition: int, run: Run) -> None:
        """An echo run the writer reports: source offsets that were target-local records at `run.target..`."""
        self._echoes.record(topic, partition, run)

    def load(self, synced: Iterable[SlottedRun]) -> None:
        """Rebuild from the offset-syncs topic, replaying its records in the order it holds them (compacted or
        not). Nothing is evicted until `keep_for` says which runs groups need."""
        synced = list(synced)
        self._mirrored.load(s for s in synced if s.kind == MIRRORED)
        self._echoes.load(s for s in synced if s.kind == ECHO)
        for s in synced:
            if s.kind == LOCAL:
                span = None if s.run is None else (s.run.start, s.run.last + 1)
                self._local.load((s.topic, s.partition), s.slot, span)
        for key in self._mirrored.partitions():
            latest = self._mirrored.latest(*key)
            assert latest is not None  # a listed partition has a run
            self._local.set_high(key, latest.target_end)

    def reset(self, topic: str, partition: int) -> None:
        """Forget a partition whose offsets went backwards; its runs start over with the next batch (which reuse
        the freed slots, so a restart does not bring the old ones back for long: the first new run replaces them).
        Local spans stay: they are target offsets, and the target kept its records."""
        self._mirrored.reset(topic, partition)
        self._echoes.reset(topic, partition)

    def forget(self, topics: Collection[str]) -> None:
        """Drop all history of `topics`, gone from the source for good (the flow's ledger forgot them): what groups
        committed on them can no longer be read, and the offset-syncs topic gets tombstones for every slot."""
        self._mirrored.forget(topics)
        self._echoes.forget(topics)
        self._local.forget(topics)

    def keep_for(self, needed: Mapping[Partition, Iterable[int]]) -> None:
        """The committed offsets groups have now, per partition: the history they rest on outlives the bounds."""
        self._mirrored.keep_for(needed)
        self._echoes.keep_for(needed)
        if self.local_writes:
            for key, offsets in needed.items():
                self._local.keep_for(key, [self._read_through(key, c) for c in offsets])

    def translate(
        self, topic: str, partition: int, committed: int, fallback: Translation | None = None
    ) -> Translation | None:
        """The target offset to resume at for a source committed offset; `fallback` when history does not reach
        back to it."""
        mirrored = self._mirrored.translate(topic, partition, committed, fallback)
        if mirrored is None or not self.local_writes:
            return mirrored
        key = (topic, partition)
        local = self._local.first_unread(key, self._read_through(key, committed))
        if local is None or local >= mirrored.downstream_offset:
            return mirrored
        return Translation(local, mirrored.reread + mirrored.downstream_offset - local, guarded=True)

    def reread(self, topic: str, partition: int, committed: int, resume_at: int) -> int | None:
        """At most how many records a consumer resuming at target offset `resume_at` reads again; None when the
        runs to tell are gone."""
        best = self.translate(topic, partition, committed)
        if best is not None:
            return best.reread + max(0, best.downstream_offset - resume_at)
        above = [r for r in self._mirrored.runs(topic, partition) if r.start >= committed]
        # The first run above starts with a record the group has not read: fewer than target - resume_at were read.
        return max(0, above[0].target - resume_at) if above else None

    def latest(self, topic: str, partition: int) -> Run | None:
        return self._mirrored.latest(topic, partition)

    def partitions(self) -> list[Partition]:
        return self._mirrored.partitions()

    def runs(self, topic: str, partition: int) -> list[Run]:
        return self._mirrored.runs(topic, partition)

    def take_changed(self) -> Iterator[SlottedRun]:
        """The runs and spans changed since the last call, each with its slot, to write to the topic."""
        yield from self._mirrored.take_changed()
        yield from self._echoes.take_changed()
        yield from self._local.take_changed()

    def rebase(self, older: SyncStore) -> None:
        """Put `older` history (read back at start) under this store's, in place."""
        self._mirrored.rebase(older._mirrored)
        self._echoes.rebase(older._echoes)
        self._local.rebase(older._local)

    def _read_through(self, key: Partition, committed: int) -> int:
        """The target offset after the newest local record a group at `committed` has read (0: none known)."""
        echo = self._echoes.translate(key[0], key[1], committed)
        return echo.downstream_offset if echo is not None else 0
