"""Waiting on what a test can observe, not on the clock: a condition polled until it holds.

The deadline is there against a hang, not as a claim on speed: what fails a test is the thing that never happened,
named by `what`. The seconds a wait took are returned, for a test to print beside its figures; no test asserts on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

WAIT_S = 300.0  # long enough for a busy two-core machine; only a hang reaches it


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = WAIT_S,
    every_s: float = 0.5,
    errors: Sequence[BaseException] = (),
) -> float:
    """Seconds until `condition()` was true, asked every `every_s`. Fails with the first of `errors` (where a mirror
    running in the background puts its failure) as soon as there is one, and saying `what` never happened when
    `timeout_s` passes first."""
    began = time.monotonic()
    while True:
        assert not errors, f"the mirror failed while waiting for {what}: {errors[0]!r}"
        if condition():
            return time.monotonic() - began
        if time.monotonic() - began > timeout_s:
            raise AssertionError(f"waited {timeout_s:.0f} s for {what}, and it never happened")
        time.sleep(every_s)
