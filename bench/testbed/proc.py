"""A process tree's CPU seconds, peak RSS and peak PSS, sampled from /proc: for benchmarks and for tests that bound
memory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


class TreeMonitor:
    """Samples a process and all its descendants from /proc: CPU seconds (last value seen per pid), peak RSS, and peak
    PSS. RSS summed over a tree counts a page each process shares (a shared library, what a forked Python worker
    shares with its daemon) once per process; PSS splits it between them, so a tree of many processes is not
    overstated beside a single JVM."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self.pid, self.interval = pid, interval
        self.cpu: dict[int, float] = {}
        self.peak_rss = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, ()))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = pss = 0
            for pid in self._tree():
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK
                    rss += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
                    pss += _pss(pid)
                except (OSError, IndexError, ValueError):
                    continue
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(self.interval)

    def cpu_s(self) -> float:
        """CPU seconds of the tree so far, as of the last sample; differences give the CPU of a window."""
        return sum(list(self.cpu.values()))

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return self.cpu_s(), self.peak_rss / 1e6


def _pss(pid: int) -> int:
    """The process's proportional set size in bytes (its `Pss:` line of smaps_rollup, in kB)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0
