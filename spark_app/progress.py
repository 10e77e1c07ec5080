"""Progress of `run --available-now`: per flow, the records done of the backlog it started with, the rate, an ETA.

On a terminal (stderr a tty) one line is redrawn in place every second; otherwise each flow logs a line every
`LOG_EVERY_S`, and once more at the end. The backlog is counted once per flow, as soon as its copy has its topics:
per source partition, the end offset then minus where the flow resumes, taken from its state before the run (the
saved position, a held partition's first held offset, a position adopted from MirrorMaker 2), else the log start
(the end, for a new topic under `start_from: latest`). It is an estimate: the batch log may be one batch behind the
saved positions, and offsets of transaction markers or compacted records count but never land. Done is
`FlowTotals.handled`; the rate is taken over the last `RATE_WINDOW_S`, and the ETA is what remains at that rate.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TextIO

from confluent_kafka import KafkaException
from confluent_kafka.admin import OffsetSpec

from . import clients
from .config import ClusterConfig
from .metrics import Positions
from .runner import FlowRunner

log = logging.getLogger(__name__)

RATE_WINDOW_S = 30.0
TICK_S = 1.0
LOG_EVERY_S = 30.0


def count_backlog(cluster: ClusterConfig, topics: Mapping[str, int], resume: Positions, start_from: str) -> int:
    """Records from where each partition of `topics` (name -> partitions) resumes to its end now, read committed
    as the planner reads it."""
    admin = clients.admin(cluster)
    partitions = [(t, p) for t, n in sorted(topics.items()) for p in range(n)]
    ends = clients.list_offsets(admin, partitions, OffsetSpec.latest(), read_committed=True)
    fresh = [tp for tp in partitions if tp not in resume]
    known_topics = {t for t, _ in resume}
    starts = dict(resume) | {tp: ends[tp] for tp in fresh if start_from == "latest" and tp[0] not in known_topics}
    from_log_start = [tp for tp in fresh if tp not in starts]
    starts |= clients.list_offsets(admin, from_log_start, OffsetSpec.earliest())
    return sum(max(0, ends[tp] - starts[tp]) for tp in partitions)


def progress_line(flow: str, done: int, backlog: int | None, rate: float | None, eta_s: float | None) -> str:
    """`flow a->b: 1,200 of 4,000 records (30.0%), 400 records/s, ETA 0:00:07`; `-` where not known yet."""
    speed = "-" if rate is None else f"{rate:,.0f}"
    if backlog is None:
        return f"flow {flow}: {done:,} records, {speed} records/s"
    share = 100.0 * min(done, backlog) / backlog if backlog else 100.0
    eta = "-" if eta_s is None else str(timedelta(seconds=round(eta_s)))
    return f"flow {flow}: {done:,} of {backlog:,} records ({share:.1f}%), {speed} records/s, ETA {eta}"


class FlowProgress:
    """One flow's records done over time, and its backlog once `count` can tell it (None until then)."""

    def __init__(self, flow: str, done: Callable[[], int], count: Callable[[], int | None]) -> None:
        self.flow = flow
        self.backlog: int | None = None
        self._done = done
        self._count = count
        self._counting = True  # until counted, or given up on
        self._samples: deque[tuple[float, int]] = deque()  # (time, done), spanning about RATE_WINDOW_S

    @classmethod
    def of(cls, flow: FlowRunner) -> FlowProgress:
        """Take where `flow` resumes now, before its run; its end offsets are read once its copy has topics."""
        resume = flow.ledger.resume_points()

        def count() -> int | None:
            subscribed = dict(flow.subscription)
            return count_backlog(flow.source, subscribed, resume, flow.flow.start_from) if subscribed else None

        return cls(flow.flow.name, lambda: flow.totals.handled, count)

    def sample(self, now: float) -> None:
        if self._counting:
            try:
                self.backlog = self._count()
                self._counting = self.backlog is None
            except KafkaException as err:
                self._counting = False
                log.warning("flow %s: backlog unknown, end offsets unreadable: %s", self.flow, err.args[0].str())
        self._samples.append((now, self._done()))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()

    @property
    def done(self) -> int:
        return self._samples[-1][1] if self._samples else 0

    def rate(self) -> float | None:
        """Records per second over the window; None before two samples."""
        if len(self._samples) < 2:
            return None
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None

    def eta_s(self) -> float | None:
        """Seconds left at the current rate; None while the backlog or a rate above 0 is not known."""
        rate = self.rate()
        if self.backlog is None:
            return None
        left = max(0, self.backlog - self.done)
        if not left:
            return 0.0
        return left / rate if rate else None

    def line(self) -> str:
        return progress_line(self.flow, self.done, self.backlog, self.rate(), self.eta_s())


class ProgressReport:
    """Shows the flows' progress from a daemon thread while a run goes on; a context manager around the run."""

    def __init__(
        self,
        flows: Sequence[FlowProgress],
        out: TextIO = sys.stderr,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.flows = flows
        self.out = out
        self.live = out.isatty() if live is None else live
        self._clock = clock
        self._logged_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mirrorkit-progress", daemon=True)

    def __enter__(self) -> ProgressReport:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._logged_at = None  # the final figures, whenever the last ones were logged
        self.tick()
        if self.live:  # left on their own line
            self.out.write("\n")
            self.out.flush()

    def _loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - progress is a display: the run must not fail for it
                log.exception("progress report failed")

    def tick(self) -> None:
        """Sample every flow; redraw the live line, or log each flow's line every LOG_EVERY_S."""
        now = self._clock()
        for flow in self.flows:
            flow.sample(now)
        if self.live:
            # Redrawn from the line's start, and the cursor left there, so a log line overwrites it, not follows it.
            self.out.write("\r\x1b[K" + " | ".join(f.line() for f in self.flows) + "\r")
            self.out.flush()
        elif self._logged_at is None or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            for flow in self.flows:
                log.info("%s", flow.line())
