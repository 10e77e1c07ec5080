"""Offset syncs: record where each batch landed in the sync store, and write what changed to the offset-syncs topic.

Each landing carries its runs (spark_app.dr.syncs); they go into the store at once, so checkpoints translate
exactly. The topic is written only when the DR service asks (`flush`): before each checkpoint round and at stop,
one record per run that started or grew since the last flush. So a partition that copies without gaps writes one
sync per checkpoint interval (5 s by default) however many batches it ran, and each gap adds one: the topic is what
a restart, `status` and `failover` read back, and it never lags the checkpoints that rest on it.

A write is confirmed by its delivery report (`delivered`): one the cluster did not take is written again at the next
flush, unless a newer sync for the same slot replaced it, so a slot is never silently left stale on the topic. What
waits for its report is at most one sync per slot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError

from ..ranges import Landing
from .formats import OffsetSync
from .syncs import Run, SyncStore

log = logging.getLogger(__name__)


class OffsetSyncWriter:
    """The copy's after-landing hook, and the writer of changed runs; `emit` hands one sync to the topic's producer,
    whose delivery report comes back through `delivered`."""

    def __init__(self, syncs: SyncStore, lock: threading.Lock, emit: Callable[[OffsetSync], None]) -> None:
        self.syncs = syncs
        self._lock = lock
        self._emit = emit
        self._unconfirmed: dict[bytes, OffsetSync] = {}  # slot key -> the newest sync handed over, not yet reported
        self._failed: dict[bytes, OffsetSync] = {}  # slot key -> a sync the cluster did not take: written again
        self._last_error = ""

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
        """Write the syncs the cluster did not take last time, then one per run changed since the last flush (after
        the tombstones of a reset partition's slots); returns them."""
        with self._lock:
            changed = {
                sync.key(): sync
                for s in self.syncs.take_changed()
                for sync in [
                    OffsetSync.tombstone(s.topic, s.partition, s.slot, s.kind)
                    if s.run is None
                    else OffsetSync(s.topic, s.partition, s.run.start, s.run.target, s.slot, s.run.last, s.kind)
                ]
            }
            again = [sync for key, sync in self._failed.items() if key not in changed]
            if self._failed:
                log.warning("%d offset sync(s) not taken by the cluster (%s): writing them again", len(self._failed),
                            self._last_error)  # fmt: skip
            self._failed.clear()
            out = [*again, *changed.values()]
            self._unconfirmed.update((sync.key(), sync) for sync in out)
        for sync in out:
            self._emit(sync)
        return out

    def delivered(self, sync: OffsetSync, error: KafkaError | None) -> None:
        """The delivery report of a sync `emit` handed over: a failed one is written again at the next flush, unless
        a newer sync of its slot was handed over since."""
        with self._lock:
            key = sync.key()
            if self._unconfirmed.get(key) is not sync:
                return  # a newer sync of the slot is on its way
            del self._unconfirmed[key]
            if error is not None:
                self._failed[key] = sync
                self._last_error = error.str()
