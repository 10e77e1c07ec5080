"""The offset-sync store and translation: where a consumer group resumes on the target, never skipping a record.

For a committed offset C (the next record the group reads), with the newest sync (u, d) at or below it: C == u
gives d exactly; u < C gives d + 1, which re-reads at most the C - 1 - u records between the sync and C (syncs
come at every batch boundary, so that is under one batch; for a group ahead of the mirror, it is the mirror's lag
behind the group). With no sync at or below C, the caller's fallback is used. Lagging groups are translated like
any other: the kept history thins out with age, it never stops.
"""

from __future__ import annotations

from dataclasses import dataclass

# The dense tail of syncs kept per partition; older ones are thinned to every other one, so the history spans
# an exponentially growing range of offsets in bounded memory.
DENSE_SYNCS = 64


@dataclass(frozen=True)
class Translation:
    downstream_offset: int
    reread: int  # at most this many records a consumer reads again on the target


class SyncStore:
    """(source offset, target offset) pairs per source partition, newest dense, older thinned."""

    def __init__(self) -> None:
        self._syncs: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def record(self, topic: str, partition: int, upstream: int, downstream: int) -> None:
        syncs = self._syncs.setdefault((topic, partition), [])
        while syncs and syncs[-1][0] >= upstream:  # a replayed batch: the newer copy is where reading goes on
            syncs.pop()
        syncs.append((upstream, downstream))
        if len(syncs) > 2 * DENSE_SYNCS:
            old, dense = syncs[:-DENSE_SYNCS], syncs[-DENSE_SYNCS:]
            syncs[:] = old[::2] + dense

    def merge(self, newer: SyncStore) -> None:
        """Record `newer`'s syncs after this store's own."""
        for (topic, partition), syncs in newer._syncs.items():
            for upstream, downstream in syncs:
                self.record(topic, partition, upstream, downstream)

    def rebase(self, older: SyncStore) -> None:
        """Put `older` history (read back at start) under this store's syncs, in place."""
        merged = SyncStore()
        merged.merge(older)
        merged.merge(self)
        self._syncs = merged._syncs

    def reread(self, topic: str, partition: int, committed: int, resume_at: int) -> int | None:
        """At most how many records a consumer resuming at target offset `resume_at` reads again."""
        best = self.translate(topic, partition, committed)
        if best is not None:
            return best.reread + max(0, best.downstream_offset - resume_at)
        above = [s for s in self._syncs.get((topic, partition), []) if s[0] > committed]
        # The sync's own record is unread, so fewer than all of resume_at..d were read before.
        return max(0, above[0][1] - resume_at) if above else None

    def latest(self, topic: str, partition: int) -> tuple[int, int] | None:
        syncs = self._syncs.get((topic, partition))
        return syncs[-1] if syncs else None

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._syncs)

    def translate(
        self, topic: str, partition: int, committed: int, fallback: Translation | None = None
    ) -> Translation | None:
        """The target offset to resume at for a source committed offset; `fallback` when no sync is at or below it."""
        syncs = self._syncs.get((topic, partition), [])
        below = [s for s in syncs if s[0] <= committed]
        if not below:
            return fallback
        upstream, downstream = below[-1]
        if upstream == committed:
            return Translation(downstream, 0)
        return Translation(downstream + 1, committed - 1 - upstream)
