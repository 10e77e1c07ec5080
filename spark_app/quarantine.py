"""Quarantine: one flow's held-back topics, what each partition owes the target, and how it catches up.

One bad topic never stops the others. The writer is told which topics are ready on the target; it holds back every
record of the others, and of a partition from the first record the target refused, and says per partition which
source offsets it held (`held_from` to `held_until`). `FlowQuarantine.after_batch` merges those into the flow's
`FlowState`: per quarantined topic, per partition, a `Hold` from the first offset not written to the offset the
query has read up to. The query itself goes on, so it keeps advancing past held records and the hold keeps
growing; nothing of the topic is written meanwhile, so order is kept. To rejoin, `catch_up` copies each hold as
one offset range (through the copy function it is given), then the topic is ready again: the next batch writes its
records after the hold. A catch-up is tried when topic sync says the target can take the topic, at start (so a
restart retries at once), and for a refused record or a source partition that served nothing (its leader offline)
every `RECORD_RETRY_S`. The state is saved after every batch, before Spark commits it, so a crash replays a batch at
most (at least once, never a gap).

Data loss. Per partition the state keeps the next offset the query expects. When a batch starts further on, the
source's log start is checked: records below it that were never read were deleted by retention. They are reported
(log, `data_loss`) and mirroring goes on, unless the flow sets `fail_on_data_loss`.

`FlowState` is a small versioned JSON file in the flow's Spark checkpoint folder, local or in object storage
(spark_app.storage), so it survives exactly when the checkpoint does. A mirror before object-storage support wrote
the file for an `s3a://` (or other scheme's) checkpoint to a local path relative to its working directory; when the
checkpoint holds no state yet and that file exists, it is read and saved where it belongs.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .config import FlowConfig
from .errors import MirrorFailed, StateError
from .ranges import DataLoss, Landing, OffsetRange, OffsetsReset
from .storage import CheckpointFiles

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILE = "mirrorkit-state.json"
RECORD_RETRY_S = 60.0  # how often a topic held by the writer (a refused record, an offline partition) tries again

# Copy these ranges with a writer that may write the given topics (name -> partitions on the target).
CopyRanges = Callable[[list[OffsetRange], dict[str, int]], list[Landing]]
# The source's log start per (topic, partition).
EarliestOffsets = Callable[[list[tuple[str, int]]], dict[tuple[str, int], int]]


@dataclass
class Hold:
    """Source offsets of one partition not written yet: from `first` (the first one not written) up to `next`."""

    first: int
    next: int


@dataclass
class Quarantine:
    """A topic that stopped: why, and per partition what it still owes the target."""

    reason: str
    partitions: dict[int, Hold] = field(default_factory=dict)
    retry_at: float = 0.0  # monotonic time after which a catch-up is tried; not persisted, so a restart retries


@dataclass
class FlowState:
    """Quarantines and read positions of one flow, persisted as `mirrorkit-state.json` in its checkpoint folder."""

    files: CheckpointFiles
    quarantined: dict[str, Quarantine] = field(default_factory=dict)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)  # next source offset to read
    # Where to start a partition the Spark checkpoint does not hold: MirrorMaker 2's next offset (spark_app.dr.adopt).
    adopted: dict[tuple[str, int], int] = field(default_factory=dict)
    # Per partition, the target offset after the last record written before `positions`: a real-time restart counts
    # what landed after the save (spark_app.realtime).
    landed: dict[tuple[str, int], int] = field(default_factory=dict)
    # The mode whose copies saved `positions` last: a throughput run after a real-time one starts past its older Spark
    # checkpoint, at `positions` (spark_app.planner).
    mode: str = "throughput"

    @property
    def where(self) -> str:
        return self.files.where(STATE_FILE)

    @classmethod
    def load(cls, files: CheckpointFiles) -> FlowState:
        state = cls(files)
        data, where = files.read(STATE_FILE), state.where
        legacy = Path(files.location.removeprefix("file:")) / STATE_FILE  # where an older mirror wrote it
        if data is None and not files.local and legacy.is_file():
            data, where = legacy.read_bytes(), str(legacy.resolve())
        if data is None:
            return state
        raw = json.loads(data)
        if raw.get("version") != STATE_VERSION:
            raise StateError(
                f"{where}: state version {raw.get('version')!r}, this mirror reads version {STATE_VERSION};"
                " run the mirror version that wrote it to drain its quarantines, or move the file away to accept"
                " that its held offsets are not caught up"
            )
        for topic, q in raw["quarantined"].items():
            holds = {int(p): Hold(h["first"], h["next"]) for p, h in q["partitions"].items()}
            state.quarantined[topic] = Quarantine(q["reason"], holds)
        state.positions = {(t, int(p)): o for t, parts in raw["positions"].items() for p, o in parts.items()}
        state.adopted = {(t, int(p)): o for t, parts in raw.get("adopted", {}).items() for p, o in parts.items()}
        state.landed = {(t, int(p)): o for t, parts in raw.get("landed", {}).items() for p, o in parts.items()}
        state.mode = raw.get("mode", "throughput")
        if where != state.where:
            state.save()
            log.warning("flow state moved from %s to %s, beside the Spark checkpoint; the old file can be deleted",
                        where, state.where)  # fmt: skip
        return state

    def save(self) -> None:
        """Replace the file whole: a crash leaves the old state or the new one, never half of one."""
        raw = {
            "version": STATE_VERSION,
            "quarantined": {
                t: {"reason": q.reason, "partitions": {str(p): vars(h) for p, h in sorted(q.partitions.items())}}
                for t, q in sorted(self.quarantined.items())
            },
            "positions": by_topic(self.positions),
            "adopted": by_topic(self.adopted),
            "landed": by_topic(self.landed),
            "mode": self.mode,
        }
        self.files.write(STATE_FILE, json.dumps(raw, indent=1).encode())


def by_topic(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """{(topic, partition): offset} as `{"topic": {"partition": offset}}`, the shape of the file and of Spark's."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


class FlowQuarantine:
    """One flow's quarantines over its `FlowState`; the source's log starts and the copy path are injected."""

    def __init__(
        self, flow: FlowConfig, state: FlowState, earliest: EarliestOffsets, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.flow = flow
        self.state = state
        self.data_loss: list[DataLoss] = []
        self.resets: list[OffsetsReset] = []
        self._earliest = earliest
        self._clock = clock

    def reasons(self) -> dict[str, str]:
        """Each quarantined topic with why it stopped."""
        return {t: q.reason for t, q in self.state.quarantined.items()}

    def held(self) -> dict[str, dict[int, int]]:
        """Per quarantined topic, per partition, the first source offset not written."""
        return {t: {p: h.first for p, h in sorted(q.partitions.items())} for t, q in self.state.quarantined.items()}

    def refused(self, reasons: dict[str, str]) -> None:
        """Topic sync found targets that cannot take these topics: hold them (all their records) with the reason."""
        for topic, reason in reasons.items():
            self.state.quarantined.setdefault(topic, Quarantine(reason)).reason = reason

    def ready(self, mirrored: dict[str, int]) -> dict[str, int]:
        """The topics the writer may write now, with their partition counts on the target."""
        return {t: n for t, n in mirrored.items() if t not in self.state.quarantined}

    def after_batch(self, landed: Iterable[Landing]) -> list[OffsetsReset]:
        """Quarantine what the writer held, check for records deleted before they were read, save the state.
        Returns the partitions whose offsets went backwards in this batch (each is also logged and kept)."""
        lost, resets = [], []
        for row in landed:
            key = (row.topic, row.partition)
            if row.reset_from >= 0:
                reset = OffsetsReset(row.topic, row.partition, row.reset_from, min(row.first_offset, row.end_offset))
                resets.append(reset)
                log.error(
                    "flow %s: offsets of '%s' partition %d went backwards (deleted and made again, or truncated): the"
                    " mirror had copied up to offset %d, the partition now starts over at %d; it is copied again from"
                    " there and its offset translation restarts", self.flow.name, row.topic, row.partition,
                    reset.previous, reset.restart,
                )  # fmt: skip
                self.state.positions.pop(key, None)
            expected = self.state.positions.get(key)
            if expected is not None and row.first_offset > expected:
                lost.append((row.topic, row.partition, expected, row.first_offset))
            self.state.positions[key] = max(row.end_offset, expected or 0)
            if row.last_target_offset >= 0:
                self.state.landed[key] = row.last_target_offset + 1
            if row.held_from >= 0:
                self._hold(row)
        self._report_loss(lost)
        self.resets += resets
        self.state.mode = self.flow.mode
        self.state.save()
        return resets

    def _hold(self, row: Landing) -> None:
        q = self.state.quarantined.get(row.topic)
        if q is None:
            reason = refused_reason(self.flow, row)
            reason = reason or f"partition {row.partition} is not on the target yet"
            q = self.state.quarantined[row.topic] = Quarantine(reason, retry_at=self._clock() + RECORD_RETRY_S)
            log.error("flow %s: topic '%s' quarantined: %s", self.flow.name, row.topic, reason)
        hold = q.partitions.get(row.partition)
        if hold is None:
            q.partitions[row.partition] = Hold(row.held_from, row.held_until)
        else:
            hold.first, hold.next = min(hold.first, row.held_from), max(hold.next, row.held_until)

    def catch_up(self, mirrored: dict[str, int], copy: CopyRanges) -> None:
        """Copy (with `copy`) the holds of each quarantined topic the target can take now (`mirrored`), then let it
        rejoin."""
        now = self._clock()
        for topic in self.due(mirrored):
            q, partitions = self.state.quarantined[topic], mirrored[topic]
            owed = {p: h for p, h in q.partitions.items() if h.next > h.first}
            ranges = [OffsetRange(topic, p, h.first, h.next) for p, h in sorted(owed.items())]
            landed = copy(ranges, {topic: partitions}) if ranges else []
            rows = {row.partition: row for row in landed}
            lost = [(topic, p, h.first, rows[p].first_offset if p in rows else h.next) for p, h in owed.items()]
            self._report_loss(lost)
            still = {p: Hold(rows[p].held_from, owed[p].next) for p in owed if p in rows and rows[p].held_from >= 0}
            copied = sum(r.records for r in landed)
            if still:
                p = min(still)
                row = rows[p]
                q.reason = refused_reason(self.flow, row) or q.reason
                q.partitions, q.retry_at = still, now + RECORD_RETRY_S
                log.error("flow %s: topic '%s' still quarantined after copying %d: %s", self.flow.name, topic,
                          copied, q.reason)  # fmt: skip
            else:
                del self.state.quarantined[topic]
                log.info("flow %s: topic '%s' caught up %d record(s) from %s and rejoins", self.flow.name, topic,
                         copied, {p: h.first for p, h in owed.items()} or "its start")  # fmt: skip
        self.state.save()

    def due(self, mirrored: dict[str, int]) -> list[str]:
        """The quarantined topics to try again now: the target can take them (`mirrored`: name -> partitions on the
        target, enough for every held partition) and their retry time has come."""
        now = self._clock()
        return [
            t
            for t, q in self.state.quarantined.items()
            if t in mirrored and now >= q.retry_at and all(p < mirrored[t] for p in q.partitions)
        ]

    def release(self, topic: str) -> None:
        """Let a quarantined topic be written again from its first held offsets: the real-time copier reads each
        held partition from there, in order, and a new refusal quarantines it again."""
        q = self.state.quarantined.pop(topic)
        for p, h in q.partitions.items():
            self.state.positions[(topic, p)] = min(h.first, self.state.positions.get((topic, p), h.first))
        self.state.save()
        log.info("flow %s: topic '%s' rejoins; copying from its first held offsets %s", self.flow.name, topic,
                 {p: h.first for p, h in q.partitions.items()} or "(none held)")  # fmt: skip

    def _report_loss(self, gaps: list[tuple[str, int, int, int]]) -> None:
        """Gaps (topic, partition, expected, first read) below the source's log start are records lost to retention.

        Only real gaps are looked up: a partition held before it read anything (its leader offline) is no gap, and
        its log start would not answer."""
        gaps = [gap for gap in gaps if gap[3] > gap[2]]
        if not gaps:
            return
        earliest = self._earliest([(t, p) for t, p, _, _ in gaps])
        for topic, partition, expected, first_read in gaps:
            end = min(earliest[(topic, partition)], first_read)
            if end <= expected:
                continue  # offsets that never held a record (compaction, transaction markers)
            loss = DataLoss(topic, partition, expected, end - 1)
            self.data_loss.append(loss)
            log.error(
                "flow %s: %d record(s) of '%s' partition %d, offsets %d..%d, were deleted at the source before they"
                " were mirrored%s", self.flow.name, loss.count, topic, partition, loss.first_offset, loss.last_offset,
                "" if self.flow.fail_on_data_loss else "; mirroring goes on",
            )  # fmt: skip
            if self.flow.fail_on_data_loss:
                raise MirrorFailed(f"flow {self.flow.name}: records deleted before they were mirrored: {loss}")


def refused_reason(flow: FlowConfig, row: Landing) -> str | None:
    """Why the writer held a partition (a record the target refused for size or with a topic-scoped error, or a
    source partition that served nothing), and what to do; None when it held nothing for such a cause."""
    topic, partition, offset, size, error = row.topic, row.partition, row.held_from, row.refused_bytes, row.held_error
    if error:
        return (
            f"topic '{topic}' partition {partition} held from offset {offset}: {error} (the topic catches up, in"
            f" order, within {RECORD_RETRY_S:.0f} s of that being fixed)"
        )
    if not size:
        return None
    return (
        f"record too large for target '{flow.target}': topic '{topic}' partition {partition} offset {offset}"
        f" ({size} bytes); raise the target's cap, or set dead_letter_topic to divert such records"
    )
