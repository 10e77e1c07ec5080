"""A mirror running continuously in a background thread, as `run` runs it, for tests that watch it work."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from spark_app.mirror import Mirror


@contextlib.contextmanager
def mirror_running(mirror: Mirror, stop_timeout_s: float = 180.0) -> Iterator[list[BaseException]]:
    """Yields the list the mirror's failure lands in; on exit, stops the mirror and fails if it failed or hung."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            mirror.run_forever()
        except BaseException as err:  # noqa: BLE001 - handed to the test thread, which fails with it
            errors.append(err)

    thread = threading.Thread(target=run, name="mirror", daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        mirror.stopping.set()
        thread.join(stop_timeout_s)
    assert not thread.is_alive(), f"the mirror did not stop within {stop_timeout_s:.0f} s of being asked"
    assert not errors, f"the mirror failed: {errors[0]!r}"
