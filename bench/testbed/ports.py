"""Loopback ports free right now, for the brokers, servers and mirrors a test or benchmark starts."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out; a start that still collides is retried with new ones."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    """One free port, e.g. for a mirror's `metrics_port` (the config asks for a real port number)."""
    return free_ports(1)[0]
