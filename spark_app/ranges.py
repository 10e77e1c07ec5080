"""The copy path's units of work: the offset ranges the planner hands out, and the landings the writer hands back.

A batch is a list of `OffsetRange`s, one per source topic-partition. Copying a range yields one `Landing`: where
its last record landed on the target (an offset sync), what was written, dropped, dead-lettered or held back, and
a replication-latency histogram. Both travel between the driver and the tasks pickled, and landings as JSON rows
on the real-time report channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Upper bounds of the replication-latency buckets: sub-second for a mirror that keeps up, up to an hour for one
# catching up; anything older lands in +Inf.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# The same bounds in milliseconds, as Kafka timestamps are, for the writer's `bisect_left`; a landing's counts list
# has one more slot, for +Inf.
LATENCY_BOUNDS_MS = tuple(b * 1000 for b in LATENCY_BUCKETS_S)
# Runs a landing carries for one range. A range breaks into runs at every gap in the source (transaction markers,
# compaction, dropped records) and at every foreign record between ours on the target; past this many, the middle
# ones are dropped, which only makes translation inside them re-read (spark_app.dr.syncs).
MAX_RUNS_PER_RANGE = 64


@dataclass(frozen=True)
class OffsetRange:
    """Source offsets [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int
    # The position the mirror had reached when the partition's offsets went backwards (the topic deleted and made
    # again, or truncated): this range starts over from the log start. -1 when they did not.
    reset_from: int = -1

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class Landing:
    """What copying one range did."""

    topic: str
    partition: int
    first_offset: int  # the first source offset found in the range (a record, or the log's end), else its end
    end_offset: int  # the range's end: the next offset this flow will copy
    last_offset: int = -1  # the last source offset written (or dropped), -1 when none
    last_target_offset: int = -1  # where `last_offset` landed on the target, -1 when nothing was written
    records: int = 0
    bytes: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    # Replication latency per bucket of LATENCY_BOUNDS_MS (not cumulative; the last slot is +Inf), and the sum.
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    latency_sum_ms: float = 0.0
    held_from: int = -1  # first source offset not written (held), -1 when all were
    held_until: int = -1  # the offset after the last held one
    refused_bytes: int = 0  # size of the record refused at `held_from`, 0 when held for another reason
    # Why the partition holds from `held_from` when not for a record's size: the target's topic-scoped refusal, or
    # the source serving nothing (its leader offline); it names the side and the cause. Else "".
    held_error: str = ""
    # Where the range landed, as runs [first source offset, its target offset, last source offset] of records
    # copied one after another on both sides (spark_app.dr.syncs); at most MAX_RUNS_PER_RANGE, the newest kept.
    runs: list[list[int]] = field(default_factory=list)
    # Identity only: the echoes of target-local records the range dropped, as runs [first source offset, the
    # target offset it came from, last source offset] (the provenance header carries the target offset).
    echoes: list[list[int]] = field(default_factory=list)
    reset_from: int = -1  # the range's `reset_from`

    def landed(self, offset: int, target_offset: int) -> None:
        """Source `offset` landed at `target_offset`; delivery reports come in order, so runs grow at their end."""
        self.last_offset, self.last_target_offset = offset, target_offset
        extend_runs(self.runs, offset, target_offset)

    def hold(self, offset: int, size: int = 0, error: str = "") -> None:
        """Hold the partition from `offset` to the range's end: nothing from there on is written."""
        if self.held_from < 0 or offset < self.held_from:
            self.held_from, self.refused_bytes, self.held_error = offset, size, error
        self.held_until = max(self.held_until, self.end_offset)

    def echoed(self, offset: int, target_offset: int) -> None:
        """Source `offset` is a dropped echo of the record at `target_offset` on the target (-1: not known)."""
        self.last_offset = max(self.last_offset, offset)
        if target_offset >= 0:
            extend_runs(self.echoes, offset, target_offset)

    def to_row(self) -> dict[str, Any]:
        """The landing's fields by name, as the real-time report channel's JSON carries them."""
        return vars(self)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Landing:
        """A landing from a row `to_row` made."""
        return cls(**row)


def extend_runs(runs: list[list[int]], offset: int, target_offset: int) -> None:
    """Add `offset` -> `target_offset` to runs that grow in order; past MAX_RUNS_PER_RANGE the newest replaces the
    last, which only makes translation inside the replaced one re-read."""
    if runs:
        run = runs[-1]
        if offset == run[2] + 1 and target_offset == run[1] + offset - run[0]:
            run[2] = offset
            return
        if len(runs) >= MAX_RUNS_PER_RANGE:
            runs[-1] = [offset, target_offset, offset]
            return
    runs.append([offset, target_offset, offset])


@dataclass(frozen=True)
class DataLoss:
    """Source offsets [first_offset, last_offset] deleted (by retention) before the mirror read them."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass(frozen=True)
class OffsetsReset:
    """A source partition whose offsets went backwards: the mirror had reached `previous`, the partition now starts
    over at `restart` (the topic was deleted and made again, or truncated)."""

    topic: str
    partition: int
    previous: int
    restart: int
