"""A clock a test moves by hand: what the code under test reads as now is whatever the test set last."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
