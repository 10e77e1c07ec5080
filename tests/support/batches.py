"""What a flow's batch log says: the batches it planned, with their end offsets, and those it committed."""

from __future__ import annotations

import json
from pathlib import Path

from spark_app.batch_log import Planned

Offsets = dict[str, dict[str, int]]  # the mirror's source offsets: {"topic": {"partition": next offset}}


def checkpoint_logs(checkpoint: Path) -> tuple[dict[int, Offsets], set[int]]:
    """The offset log (batch id -> where the batch ends, read as the planner reads it: offsets only) and the ids of
    the committed batches; empty before the flow's first batch."""
    offsets = {
        int(f.name): Planned.parse(json.loads(f.read_text().splitlines()[-1])).offsets
        for f in (checkpoint / "offsets").glob("[0-9]*")
    }  # fmt: skip
    commits = {int(f.name) for f in (checkpoint / "commits").glob("[0-9]*")}
    return offsets, commits


def batch_in_flight(checkpoint: Path) -> int | None:
    """The first batch the flow planned (its offsets are logged) and has not committed yet."""
    offsets, commits = checkpoint_logs(checkpoint)
    return next((b for b in sorted(offsets) if b not in commits), None)
