"""Offset syncs: record where each batch landed in the sync store, and write what changed to the offset-syncs topic.

Each landing carries its runs (spark_app.dr.syncs); they go into the store at once, so checkpoints translate
exactly. The topic is written only when the DR service asks (`flush`): before each checkpoint round and at stop,
one record per run that started or grew since the last flush. So a partition that copies without gaps writes one
sync per checkpoint interval (5 s by default) however many batches it ran, and each gap adds one: the topic is what
a restart, `status` and `failover` read back, and it never lags the checkpoints that rest on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..ranges import Landing
from .formats import OffsetSync
from .syncs import Run, SyncStore


class OffsetSyncWriter:
    """The stream's after-batch hook, and the writer of changed runs; `emit` writes one sync to the topic."""

    def __init__(self, syncs: SyncStore, lock: threading.Lock, emit: Callable[[OffsetSync], None]) -> None:
        self.syncs = syncs
        self._lock = lock
        self._emit = emit

    def on_landed(self, rows: Iterable[Landing]) -> None:
        """Record the runs and echoes of each range; a partition whose offsets went backwards starts over."""
        with self._lock:
            for row in rows:
                if row.reset_from >= 0:
                    self.syncs.reset(row.topic, row.partition)
                for start, target, last in row.runs:
                    self.syncs.record(row.topic, row.partition, Run(start, target, last))
                for start, target, last in row.echoes:
                    self.syncs.echo(row.topic, row.partition, Run(start, target, last))

    def flush(self) -> list[OffsetSync]:
        """Write one sync per run changed since the last flush (after the tombstones of a reset partition's
        slots); returns them."""
        with self._lock:
            changed = [
                OffsetSync.tombstone(s.topic, s.partition, s.slot, s.kind)
                if s.run is None
                else OffsetSync(s.topic, s.partition, s.run.start, s.run.target, s.slot, s.run.last, s.kind)
                for s in self.syncs.take_changed()
            ]
        for sync in changed:
            self._emit(sync)
        return changed
