"""Quarantine: which of a flow's topics are held back, why, what each partition owes the target, and when to retry.

One bad topic never stops the others. A topic is quarantined when topic sync finds its target cannot take it (no
event hub, too few partitions, a denied ACL), or when the copy held one of its partitions (a record the target
refused, a source partition that served nothing). Per partition a `Hold` runs from the first offset not written to
the offset the flow has read up to; the flow reads on past held records, so the hold grows, and nothing of the topic
is written meanwhile, so order is kept. A topic rejoins after its holds are copied: tried when topic sync says the
target can take it, at start (so a restart retries at once), and for a refused record or a silent partition every
`RECORD_RETRY_S`.

This module decides only. The flow's ledger (spark_app.ledger) keeps the `Quarantines` with the positions, saves
them, and files what the copies report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import FlowConfig
from .ranges import Landing, OffsetRange

log = logging.getLogger(__name__)

RECORD_RETRY_S = 60.0  # how often a topic held by the copy (a refused record, an offline partition) tries again


@dataclass
class Hold:
    """Source offsets of one partition not written yet: from `first` (the first one not written) up to `next`, of the
    topic's life `life` (its id when the hold was filed; empty where that was not known). A topic deleted and made
    again takes the held records of its old life with it: its new life's offsets name other records."""

    first: int
    next: int
    life: str = ""


@dataclass
class Quarantine:
    """A topic that stopped: why, and per partition what it still owes the target."""

    reason: str
    partitions: dict[int, Hold] = field(default_factory=dict)
    retry_at: float = 0.0  # monotonic time after which a catch-up is tried; not persisted, so a restart retries


class Quarantines:
    """One flow's quarantined topics, by name."""

    def __init__(
        self, flow: FlowConfig, topics: dict[str, Quarantine], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.flow = flow
        self.topics = topics  # the ledger's, which saves them
        self._clock = clock

    def reasons(self) -> dict[str, str]:
        """Each quarantined topic with why it stopped."""
        return {t: q.reason for t, q in self.topics.items()}

    def held(self) -> dict[str, dict[int, int]]:
        """Per quarantined topic, per partition, the first source offset not written."""
        return {t: {p: h.first for p, h in sorted(q.partitions.items())} for t, q in self.topics.items()}

    def refused(self, reasons: dict[str, str]) -> None:
        """Topic sync found targets that cannot take these topics: hold them (all their records) with the reason."""
        for topic, reason in reasons.items():
            self.topics.setdefault(topic, Quarantine(reason)).reason = reason

    def ready(self, mirrored: dict[str, int]) -> dict[str, int]:
        """The topics the copy may write now, with their partition counts on the target."""
        return {t: n for t, n in mirrored.items() if t not in self.topics}

    def lives(self, topic: str) -> set[str]:
        """The lives a quarantined topic's holds are of, where known."""
        q = self.topics.get(topic)
        return {h.life for h in q.partitions.values() if h.life} if q is not None else set()

    def file(self, row: Landing, life: str = "") -> None:
        """File a hold the copy made (`Landing.hold`: `row.held_from` to `row.held_until`) in the topic's life `life`:
        quarantine the partition's topic, or grow the partition's hold; a hold of another life is given up first."""
        q = self.topics.get(row.topic)
        if q is None:
            reason = refused_reason(self.flow, row) or f"partition {row.partition} is not on the target yet"
            q = self.topics[row.topic] = Quarantine(reason, retry_at=self._clock() + RECORD_RETRY_S)
            log.error("flow %s: topic '%s' quarantined: %s", self.flow.name, row.topic, reason)
        if life:
            self.outlived(row.topic, life)
        hold = q.partitions.get(row.partition)
        if hold is None:
            q.partitions[row.partition] = Hold(row.held_from, row.held_until, life)
        else:
            hold.first, hold.next = min(hold.first, row.held_from), max(hold.next, row.held_until)

    def started_over(self, topic: str, partition: int) -> None:
        """The partition's offsets went backwards (its topic made again, or its log truncated): what it held is of the
        old log, and is given up."""
        q = self.topics.get(topic)
        if q is not None and partition in q.partitions:
            self._give_up(topic, partition, "its offsets went backwards")

    def outlived(self, topic: str, life: str) -> None:
        """The topic is in its life `life` now: the holds of another one are given up."""
        q = self.topics.get(topic)
        for p in sorted(p for p, h in (q.partitions.items() if q is not None else ()) if h.life and h.life != life):
            self._give_up(topic, p, "the topic was deleted and made again")

    def _give_up(self, topic: str, partition: int, why: str) -> None:
        hold = self.topics[topic].partitions.pop(partition)
        log.error("flow %s: topic '%s' partition %d was held from offset %d, but %s: what it held went with the old"
                  " log and is given up; the partition is copied from its new start", self.flow.name, topic,
                  partition, hold.first, why)  # fmt: skip

    def due(self, mirrored: dict[str, int]) -> list[str]:
        """The quarantined topics to try again now: the target can take them (`mirrored`: name -> partitions on the
        target, enough for every held partition) and their retry time has come."""
        now = self._clock()
        return [
            t
            for t, q in self.topics.items()
            if t in mirrored and now >= q.retry_at and all(p < mirrored[t] for p in q.partitions)
        ]

    def owed(self, topic: str, most: int) -> list[OffsetRange]:
        """What a quarantined topic owes the target next, as one range per held partition, about `most` records in
        all (at least one per partition): a hold spans the whole time its topic was quarantined, and a catch-up is
        bounded like a batch, so other topics do not wait on it and a stop loses at most one step."""
        q = self.topics[topic]
        held = [(p, h) for p, h in sorted(q.partitions.items()) if h.next > h.first]
        share = max(1, most // max(1, len(held)))
        return [OffsetRange(topic, p, h.first, min(h.next, h.first + share)) for p, h in held]

    def caught_up(self, topic: str, owed: list[OffsetRange], landed: list[Landing]) -> int:
        """After copying `owed`: each partition's hold moves past what was copied; the topic rejoins once nothing is
        owed, and stays quarantined from where the copy held it again (tried in RECORD_RETRY_S) or, with more owed,
        goes on at the next step. Returns the records copied."""
        # Per partition the row it held at first, if it held, else its last: a copy that moved past retention has two.
        q, rows = self.topics[topic], {row.partition: row for row in landed}
        for held in sorted((r for r in landed if r.held_from >= 0), key=lambda r: r.held_from, reverse=True):
            rows[held.partition] = held
        copied = sum(r.records for r in landed)
        again: dict[int, Hold] = {}
        for r in owed:
            hold, row = q.partitions[r.partition], rows.get(r.partition)
            if row is not None and row.held_from >= 0:
                again[r.partition] = Hold(row.held_from, hold.next, hold.life)
            elif r.end < hold.next:
                again[r.partition] = Hold(r.end, hold.next, hold.life)  # more owed: the next step goes on from here
        refused = sorted(p for p in again if rows.get(p) is not None and rows[p].held_from >= 0)
        q.partitions = again
        if refused:
            q.reason = refused_reason(self.flow, rows[refused[0]]) or q.reason
            q.retry_at = self._clock() + RECORD_RETRY_S
            log.error("flow %s: topic '%s' still quarantined after copying %d: %s", self.flow.name, topic,
                      copied, q.reason)  # fmt: skip
        elif again:
            q.retry_at = 0.0
            log.info("flow %s: topic '%s' caught up %d record(s); %d more owed", self.flow.name, topic, copied,
                     sum(h.next - h.first for h in again.values()))  # fmt: skip
        else:
            del self.topics[topic]
            log.info("flow %s: topic '%s' caught up %d record(s) and rejoins", self.flow.name, topic, copied)
        return copied

    def release(self, topic: str) -> dict[int, int]:
        """Let a quarantined topic be written again; returns its held partitions' first offsets, from which a
        real-time copy reads them again in order (a new refusal quarantines it again)."""
        q = self.topics.pop(topic)
        starts = {p: h.first for p, h in q.partitions.items()}
        log.info("flow %s: topic '%s' rejoins; copying from its first held offsets %s", self.flow.name, topic,
                 starts or "(none held)")  # fmt: skip
        return starts


def refused_reason(flow: FlowConfig, row: Landing) -> str | None:
    """Why the copy held a partition (a record the target refused for size or with a topic-scoped error, or a
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
