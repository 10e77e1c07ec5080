"""The processes of a session, read from /proc, and killing them all: what a pod or a node lost takes with it.

A session, not a process group: PySpark's worker daemon leads a process group of its own, so a group kill leaves it
and its workers behind for a moment.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

DAEMON = "pyspark.daemon"  # the module Spark runs to fork Python workers


def kill_session(session: int, spare: frozenset[int] = frozenset()) -> None:
    """SIGKILL every process of `session` (its leader first) but those in `spare`."""
    if not spare:  # the leader's process group at once, before it can start more
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session, signal.SIGKILL)
    for pid, _, _ in session_processes(session):
        if pid not in spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def python_workers(session: int) -> list[int]:
    """The Python workers Spark forked for tasks in `session`: forks of PySpark's daemon, which show its command line,
    as their parent does. (Spark's JVM shows the pyspark install in its class path: not a worker.)"""
    return [pid for pid, cmd, parent in session_processes(session) if DAEMON in cmd and DAEMON in parent]


def session_processes(session: int) -> list[tuple[int, str, str]]:
    """(pid, command line, parent's command line) of every process in `session`, from /proc."""

    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getsid(pid) != session:
                continue
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.append((pid, cmdline(pid), cmdline(parent)))
    return out
