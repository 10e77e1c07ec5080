"""Work running in a background thread while a test watches it: a mirror running continuously, as `run` runs it,
or any call that blocks."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from spark_app.mirror import Mirror


def in_background(call: Callable[[], object], name: str = "background") -> tuple[threading.Thread, list[BaseException]]:
    """Start `call` in a daemon thread; the list its exception lands in, for the test thread to fail with."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread, which fails with it
            errors.append(err)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, errors


@contextlib.contextmanager
def mirror_running(mirror: Mirror, stop_timeout_s: float = 180.0) -> Iterator[list[BaseException]]:
    """Yields the list the mirror's failure lands in; on exit, stops the mirror and fails if it failed or hung."""
    thread, errors = in_background(mirror.run_forever, "mirror")
    try:
        yield errors
    finally:
        mirror.stopping.set()
        thread.join(stop_timeout_s)
    assert not thread.is_alive(), f"the mirror did not stop within {stop_timeout_s:.0f} s of being asked"
    assert not errors, f"the mirror failed: {errors[0]!r}"
