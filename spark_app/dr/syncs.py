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

Memory is bounded per partition: at most `MAX_RUNS` recent runs, plus the run holding each committed offset the
checkpoint task saw last (`keep_for`). So a group within MAX_RUNS runs of the head, or parked anywhere, translates
exactly, and a partition without gaps is one run, exact at any lag. A group that consumes through history older
than what is kept (possible only on a partition with more than MAX_RUNS gaps behind the head) resumes safely after
the newest run kept below it, and the re-read it gets is reported.

Each run owns a *slot*; the offset-syncs topic is keyed by (topic, partition, slot), so after compaction it holds
exactly one record per live run and a restart rebuilds the same store from it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

# Recent runs kept per partition, beside the ones groups need. A topic with few gaps needs one; a transactional
# topic breaks a run at every commit marker, so this is about MAX_RUNS transactions of exact history.
MAX_RUNS = 256

Partition = tuple[str, int]  # (source topic, partition)


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


@dataclass
class _PartitionRuns:
    runs: list[Run] = field(default_factory=list)  # sorted by start, not overlapping
    slots: dict[int, int] = field(default_factory=dict)  # run start -> slot
    needed: frozenset[int] = frozenset()  # committed offsets of the groups the checkpoint task saw last
    dirty: set[int] = field(default_factory=set)  # starts of runs changed since the last `take_changed`

    def starts(self) -> list[int]:
        return [r.start for r in self.runs]


@dataclass(frozen=True)
class SlottedRun:
    """A run as the offset-syncs topic holds it."""

    topic: str
    partition: int
    slot: int
    run: Run


class SyncStore:
    """Runs per source partition, with translation; at most `max_runs` plus one per committed offset groups hold."""

    def __init__(self, max_runs: int = MAX_RUNS) -> None:
        self.max_runs = max_runs
        self._parts: dict[Partition, _PartitionRuns] = {}

    def record(self, topic: str, partition: int, run: Run) -> None:
        """A run the writer reports. A run starting at or before kept history means a batch copied again: what
        it overlaps is replaced, as reading goes on from the newer copy."""
        self._record(topic, partition, run, slot=None)

    def _record(self, topic: str, partition: int, run: Run, slot: int | None) -> None:
        part = self._parts.setdefault((topic, partition), _PartitionRuns())
        runs = part.runs
        cut = bisect.bisect_left(part.starts(), run.start)
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
        if slot is None:
            self._evict(part)

    def load(self, synced: Iterable[SlottedRun]) -> None:
        """Rebuild from the offset-syncs topic, replaying its records in the order it holds them (compacted or
        not). Nothing is evicted until `keep_for` says which runs groups need."""
        for s in synced:
            part = self._parts.setdefault((s.topic, s.partition), _PartitionRuns())
            stale = next((start for start, slot in part.slots.items() if slot == s.slot), None)
            if stale is not None:  # the slot was written again: the newer run replaces the one it held
                part.runs = [r for r in part.runs if r.start != stale]
                del part.slots[stale]
            self._record(s.topic, s.partition, s.run, slot=s.slot)
            part.dirty.clear()

    def reset(self, topic: str, partition: int) -> None:
        """Forget a partition whose offsets went backwards; its runs start over with the next batch (which reuse
        the freed slots, so a restart does not bring the old ones back for long: the first new run replaces them)."""
        self._parts.pop((topic, partition), None)

    def keep_for(self, needed: Mapping[Partition, Iterable[int]]) -> None:
        """The committed offsets groups have now, per partition: the runs holding them outlive MAX_RUNS."""
        for key, part in self._parts.items():
            part.needed = frozenset(needed.get(key, ()))
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

    def reread(self, topic: str, partition: int, committed: int, resume_at: int) -> int | None:
        """At most how many records a consumer resuming at target offset `resume_at` reads again; None when the
        runs to tell are gone."""
        best = self.translate(topic, partition, committed)
        if best is not None:
            return best.reread + max(0, best.downstream_offset - resume_at)
        part = self._parts.get((topic, partition))
        above = [r for r in part.runs if r.start >= committed] if part else []
        # The first run above starts with a record the group has not read: fewer than target - resume_at were read.
        return max(0, above[0].target - resume_at) if above else None

    def latest(self, topic: str, partition: int) -> Run | None:
        part = self._parts.get((topic, partition))
        return part.runs[-1] if part and part.runs else None

    def partitions(self) -> list[Partition]:
        return sorted(k for k, p in self._parts.items() if p.runs)

    def runs(self, topic: str, partition: int) -> list[Run]:
        part = self._parts.get((topic, partition))
        return list(part.runs) if part else []

    def take_changed(self) -> Iterator[SlottedRun]:
        """The runs changed since the last call (new or extended), each with its slot, to write to the topic."""
        for (topic, partition), part in sorted(self._parts.items()):
            for run in part.runs:
                if run.start in part.dirty:
                    yield SlottedRun(topic, partition, part.slots[run.start], run)
            part.dirty.clear()

    def merge(self, newer: SyncStore) -> None:
        """Record `newer`'s runs after this store's own."""
        for (topic, partition), part in newer._parts.items():
            for run in part.runs:
                self.record(topic, partition, run)

    def rebase(self, older: SyncStore) -> None:
        """Put `older` history (read back at start) under this store's runs, in place."""
        merged = SyncStore(self.max_runs)
        merged.merge(older)
        merged.merge(self)
        self._parts = merged._parts

    # -- bookkeeping ------------------------------------------------------------------------------------------

    def _run_before(self, topic: str, partition: int, committed: int) -> Run | None:
        """The newest run starting at or before the last record read (committed - 1)."""
        part = self._parts.get((topic, partition))
        if part is None:
            return None
        i = bisect.bisect_right(part.starts(), committed - 1)
        return part.runs[i - 1] if i else None

    @staticmethod
    def _free_slot(part: _PartitionRuns) -> int:
        used = set(part.slots.values())
        return next(i for i in range(len(used) + 1) if i not in used)

    @staticmethod
    def _free(part: _PartitionRuns, run: Run) -> None:
        part.slots.pop(run.start, None)
        part.dirty.discard(run.start)

    def _evict(self, part: _PartitionRuns) -> None:
        """Drop the oldest runs past `max_runs`, except those kept for a needed committed offset."""
        excess = len(part.runs) - self.max_runs
        if excess <= 0:
            return
        starts = part.starts()
        held: set[int] = set()
        for offset in part.needed:
            i = bisect.bisect_right(starts, offset - 1)
            held.add(starts[max(0, i - 1)])
        kept = []
        for run in part.runs:
            if excess > 0 and run.start not in held:
                self._free(part, run)
                excess -= 1
            else:
                kept.append(run)
        part.runs = kept
