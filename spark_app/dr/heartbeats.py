"""The heartbeat task: emit MM2-format heartbeats on the source and watch them arrive on the target.

Heartbeats go to `heartbeats` on the source every `heartbeat_interval_s` and are mirrored like any topic; the
newest one seen on the target gives end-to-end liveness. Emitting and reading are injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..config import FlowConfig
from .formats import Heartbeat


class HeartbeatTask:
    """`emit` writes one heartbeat on the source; `newest_seen` reads the newest one of this flow on the target."""

    def __init__(
        self,
        flow: FlowConfig,
        emit: Callable[[Heartbeat], None],
        newest_seen: Callable[[], int | None],
        on_seen: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.flow = flow
        self.newest_ms: int | None = None
        self._emit = emit
        self._newest_seen = newest_seen
        self._on_seen = on_seen
        self._clock = clock

    def run_once(self) -> None:
        self._emit(Heartbeat(self.flow.source, self.flow.target, int(self._clock() * 1000)))
        self.observe()

    def observe(self) -> None:
        """Look for the newest heartbeat on the target; the newest ever seen only moves forward."""
        seen = self._newest_seen()
        if seen is not None:
            self.newest_ms = max(self.newest_ms or 0, seen)
            if self._on_seen is not None:
                self._on_seen(self.newest_ms / 1000)
