"""The checker: reads both clusters at the end, trusting none of the mirror's own reports, and says per partition
what was lost, out of order or copied twice; and checks DR translation for the groups that consumed the source.

Per source partition, the records the source still holds (read_committed) must each be on the target, and their
first copies in source order. Copies past the first are duplicates (at-least-once allows them within a bound).
Records the generator had acknowledged that are on neither side were deleted at the source before they were
mirrored: each must lie in a range the mirror reported as lost (its log), or belong to an earlier life of a topic made
again (records of a life that ended before the mirror read them are gone with it). Only an earlier life is excused:
a record's sequence number, below the first one the partition's present life holds, says it was written before the
topic was made again, since a producer's writes to one partition land in the order they were sent. A group's
checkpoint must never point past the first copy of the first source record the group had not read: that would skip
it after a failover.

A flow without transactions cannot keep order past a record only the target's broker refuses, nor past the start of a
topic's new life a real-time copy read on unnoticed (spark_app.ledger): the mirror reports each range of records that
landed, or may have landed, ahead of such an offset. A first copy out of order is excused only inside a range the
mirror reported for its partition since the partition last went backwards (a range reported before concerns an
earlier life), and counted apart (`reported_ahead`); any other is a failure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, TopicPartition

from bench.testbed import clients
from spark_app.config import ClusterConfig

# The mirror's report of records deleted at the source before it read them (spark_app.ledger).
LOSS_LINE = re.compile(
    r"(\d+) record\(s\) of '([^']+)' partition (\d+), offsets (\d+)\.\.(\d+), were deleted at the source before they"
)

# The mirror's report of records that landed on the target ahead of an earlier record it refused, or may have landed
# ahead of the start of a topic's new life (spark_app.ledger), and of a partition whose offsets went backwards.
AHEAD_LINE = re.compile(
    r"\d+ record\(s\) of '([^']+)' partition (\d+), offsets (\d+)\.\.(\d+), (?:may have )?landed on the target"
    r" ahead of offset (\d+), (?:which the target refused|the start of the topic's new life)"
)
BACKWARDS_LINE = re.compile(r"offsets of '([^']+)' partition (\d+) went backwards")


@dataclass
class DuplicateRun:
    """Records of consecutive sequence numbers copied a second time, the second copies consecutive on the target."""

    first_sequence: int
    last_sequence: int
    first_copies: tuple[int, int]  # the target offsets of the first copies, lowest and highest
    again: tuple[int, int]  # and of the copies again

    def __str__(self) -> str:
        return (
            f"sequences {self.first_sequence}..{self.last_sequence} copied first at target offsets"
            f" {self.first_copies[0]}..{self.first_copies[1]}, again at {self.again[0]}..{self.again[1]}"
        )


@dataclass
class PartitionVerdict:
    topic: str
    partition: int
    on_source: int = 0
    on_target: int = 0
    lost: int = 0  # held by the source, not on the target
    out_of_order: int = 0  # first copies that came before an earlier source record's first copy
    reported_ahead: int = 0  # such first copies inside a range the mirror reported as landed ahead of a refused record
    duplicates: int = 0  # copies past the first
    deleted_unmirrored: int = 0  # acknowledged, on neither side, reported by the mirror or of an earlier life
    silent_losses: int = 0  # acknowledged, on neither side, and not reported
    # Reported as deleted before they were mirrored, yet on the target: a false alarm, not a loss. A mirror killed
    # after records landed but before it saved their positions reports them when retention took their source.
    reported_but_copied: int = 0
    # Where the duplicates are, to read the mirror's log for: runs of the generator's sequence numbers copied again,
    # each with the target offsets of its first copies and of its copies again.
    duplicate_runs: list[DuplicateRun] = field(default_factory=list)


@dataclass
class Report:
    partitions: list[PartitionVerdict] = field(default_factory=list)
    translation_checks: int = 0
    translation_skips: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(getattr(v, name) for v in self.partitions)

    @property
    def ok(self) -> bool:
        return not (self.total("lost") or self.total("out_of_order") or self.total("silent_losses")
                    or self.translation_skips)  # fmt: skip

    def summary(self) -> dict[str, int]:
        names = ("on_source", "on_target", "lost", "out_of_order", "reported_ahead", "duplicates", "deleted_unmirrored",
                 "silent_losses", "reported_but_copied")  # fmt: skip
        return {n: self.total(n) for n in names} | {
            "translation_checks": self.translation_checks,
            "translation_skips": len(self.translation_skips),
        }


# How long a read of a partition may go without an answer: past a transaction's timeout (60 s), for which an open
# transaction of a mirror killed in its middle holds a read_committed reader until the broker aborts it.
READ_WAIT_S = 90.0


def read_partition(cluster: ClusterConfig, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """Every record (offset, value) the partition holds now, read_committed, from its log start to its end."""
    reader = clients.consumer(cluster, f"chaos-check-{topic}-{partition}",
                              {"enable.auto.commit": False, "enable.partition.eof": True,
                               "isolation.level": "read_committed", "auto.offset.reset": "earliest"})  # fmt: skip
    out: list[tuple[int, bytes]] = []
    try:
        reader.assign([TopicPartition(topic, partition, 0)])
        silent_since = time.monotonic()
        while True:
            msg = reader.poll(1)
            if msg is None:
                if time.monotonic() - silent_since > READ_WAIT_S:
                    raise AssertionError(f"reading {topic}[{partition}]: no answer in {READ_WAIT_S:.0f} s")
                continue
            silent_since = time.monotonic()
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"reading {topic}[{partition}]: {err.str()}")
            out.append((msg.offset() or 0, msg.value() or b""))
    finally:
        reader.close()


def reported_losses(log_text: str) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """The offset ranges the mirror reported as deleted before they were mirrored, per partition."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for match in LOSS_LINE.finditer(log_text):
        _count, topic, partition, first, last = match.groups()
        out.setdefault((topic, int(partition)), []).append((int(first), int(last)))
    return out


def reported_ahead(log_text: str) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """The ranges the mirror reported as landed ahead of an offset, per partition, since its offsets last went
    backwards: (that offset, the first and the last source offset that landed ahead of it)."""
    out: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for line in log_text.splitlines():
        if back := BACKWARDS_LINE.search(line):
            out.pop((back[1], int(back[2])), None)
        elif match := AHEAD_LINE.search(line):
            topic, partition, first, last, refused = match.groups()
            out.setdefault((topic, int(partition)), []).append((int(refused), int(first), int(last)))
    return out


def sequence(value: bytes) -> int:
    """The generator's sequence number of a record in its partition (`<topic>:<partition>:<seq>[|padding]`)."""
    return int(value.split(b"|", 1)[0].rsplit(b":", 1)[1])


def _note_duplicate(runs: list[DuplicateRun], seq: int, first_at: int, again_at: int) -> None:
    """Add a record copied again to the last run where it follows on, else start a run (at most 20 are kept)."""
    last = runs[-1] if runs else None
    if last is not None and seq == last.last_sequence + 1 and again_at > last.again[1]:
        last.last_sequence = seq
        last.first_copies = (min(last.first_copies[0], first_at), max(last.first_copies[1], first_at))
        last.again = (last.again[0], again_at)
    elif len(runs) < 20:
        runs.append(DuplicateRun(seq, seq, (first_at, first_at), (again_at, again_at)))


def check_partition(
    topic: str, partition: int, source: list[tuple[int, bytes]], target: list[tuple[int, bytes]],
    acked: dict[bytes, int], reported: Iterable[tuple[int, int]], remade: bool,
    ahead: Iterable[tuple[int, int, int]] = (),
) -> tuple[PartitionVerdict, dict[bytes, int]]:  # fmt: skip
    """One partition's verdict, and where each value's first copy is on the target (value -> target offset).
    `ahead`: the ranges the mirror reported as landed ahead of a refused record (`reported_ahead`), by source offset.
    """
    verdict = PartitionVerdict(topic, partition, len(source), len(target))
    first: dict[bytes, int] = {}
    for offset, value in target:
        if value in first:
            verdict.duplicates += 1
            _note_duplicate(verdict.duplicate_runs, sequence(value), first[value], offset)
        else:
            first[value] = offset
    excused = [(lo, hi) for _refused, lo, hi in ahead]
    previous = -1
    for offset, value in source:
        at = first.get(value)
        if at is None:
            verdict.lost += 1
        elif at < previous and any(lo <= offset <= hi for lo, hi in excused):
            verdict.reported_ahead += 1
        elif at < previous:
            verdict.out_of_order += 1
        else:
            previous = at
    held = {value for _, value in source}
    ranges = list(reported)
    # On a topic made again, what was written before its present life's first record: gone with an earlier life.
    life_starts = min((sequence(value) for value in held), default=None) if remade else None
    for value, offset in acked.items():
        if value in first and value not in held and any(lo <= offset <= hi for lo, hi in ranges):
            verdict.reported_but_copied += 1
        if value in held or value in first:
            continue
        earlier_life = remade and (life_starts is None or sequence(value) < life_starts)
        if earlier_life or any(lo <= offset <= hi for lo, hi in ranges):
            verdict.deleted_unmirrored += 1
        else:
            verdict.silent_losses += 1
    return verdict, first
