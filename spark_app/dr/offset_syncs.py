"""Offset syncs: after each batch, record where each partition's last record landed, in the store and on the topic.

One sync per partition that landed, per batch, as MirrorSourceTask emits them; a restarted mirror, `status` and
`failover` read them back from the offset-syncs topic (spark_app.dr.internal).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..ranges import Landing
from .formats import OffsetSync
from .syncs import SyncStore


class OffsetSyncWriter:
    """The stream's after-batch hook; `emit` writes one sync to the offset-syncs topic (None: keep it in memory)."""

    def __init__(self, syncs: SyncStore, lock: threading.Lock, emit: Callable[[OffsetSync], None] | None) -> None:
        self.syncs = syncs
        self._lock = lock
        self._emit = emit

    def on_landed(self, rows: Iterable[Landing]) -> list[OffsetSync]:
        """Record a sync for each range that wrote something; returns them."""
        written = []
        with self._lock:
            for row in rows:
                if row.last_target_offset < 0:
                    continue
                sync = OffsetSync(row.topic, row.partition, row.last_offset, row.last_target_offset)
                self.syncs.record(sync.topic, sync.partition, sync.upstream_offset, sync.downstream_offset)
                if self._emit is not None:
                    self._emit(sync)
                written.append(sync)
        return written
