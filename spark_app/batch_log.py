"""A throughput flow's batch log: each batch's end offsets before it runs, and its commit after, in the checkpoint.

The log is what a restart resumes from: the end of the last committed batch, or, when the last batch was planned and
not committed (a crash, or a stop that cancelled it), that batch again with the same end offsets, so it is copied
again whole (at least once) and never cut in a new place. Entries are files in the flow's checkpoint folder, local or
in object storage (spark_app.storage), written whole or not at all: `offsets/<batch>` before the batch runs,
`commits/<batch>` after its landings are filed. Their format is the one Spark's offset and commit logs have, so a
checkpoint a Structured Streaming query of an earlier release wrote is read as it stands, and its next batch follows
on. The newest KEEP_BATCHES of each are kept; older ones are deleted as batches commit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import StateError
from .storage import CheckpointFiles

LogOffsets = dict[str, dict[str, int]]  # {"topic": {"partition": offset}}: the positions as the log keeps them
# Keys of an entry that are no topic names (Kafka's names hold only letters, digits, '.', '_' and '-').
IDS_KEY = "#ids"  # per topic, the id of the topic its positions belong to
GONE_KEY = "#gone"  # per topic the flow no longer selects, since when (epoch seconds)

OFFSETS, COMMITS = "offsets", "commits"
KEEP_BATCHES = 100  # as many as Spark's offset log keeps (spark.sql.streaming.minBatchesToRetain)
VERSION_LINE = "v1"


@dataclass(frozen=True)
class Planned:
    """One entry of the log: positions, the ids of their topics, and topics no longer selected."""

    offsets: LogOffsets
    ids: dict[str, str] = field(default_factory=dict)
    gone: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Planned:
        """Read an entry; one written before ids were kept has none (then none is compared)."""
        offsets = {t: {p: int(o) for p, o in parts.items()} for t, parts in raw.items() if not t.startswith("#")}
        return cls(offsets, dict(raw.get(IDS_KEY, {})), dict(raw.get(GONE_KEY, {})))

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {t: dict(parts) for t, parts in self.offsets.items()}
        if self.ids:
            out[IDS_KEY] = dict(sorted(self.ids.items()))
        if self.gone:
            out[GONE_KEY] = dict(sorted(self.gone.items()))
        return out


@dataclass(frozen=True)
class Resume:
    """Where a run of the flow's batches begins: the next batch's id, where it starts, and its end when it was
    planned and not committed (it runs again as planned)."""

    batch: int
    start: Planned
    planned: Planned | None


class BatchLog:
    """The offset and commit entries of one flow's checkpoint folder."""

    def __init__(self, files: CheckpointFiles) -> None:
        self.files = files

    def resume(self) -> Resume:
        planned, committed = self._ids(OFFSETS), self._ids(COMMITS)
        if not planned:
            return Resume(0, Planned({}), None)
        last = max(planned)
        if committed and max(committed) >= last:
            return Resume(last + 1, self.entry(last), None)
        return Resume(last, self.entry(last - 1) if last > 0 else Planned({}), self.entry(last))

    def entry(self, batch: int) -> Planned:
        """The end offsets batch `batch` was planned with; an entry that is missing stops the flow rather than let it
        start over."""
        data = self.files.read(f"{OFFSETS}/{batch}")
        if data is None:
            raise StateError(f"{self.files.where(f'{OFFSETS}/{batch}')}: the batch log has no such entry, and a later"
                             " batch needs it to resume; restore the checkpoint folder whole")  # fmt: skip
        return Planned.parse(json.loads(data.decode().splitlines()[-1]))

    def plan(self, batch: int, end: Planned) -> None:
        """Log where `batch` ends, before it runs."""
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000)}
        self._write(OFFSETS, batch, [json.dumps(meta), json.dumps(end.dump(), separators=(",", ":"))])

    def commit(self, batch: int) -> None:
        """Log that `batch` landed and was filed, and let go of the entries older than KEEP_BATCHES."""
        self._write(COMMITS, batch, [json.dumps({"nextBatchWatermarkMs": 0})])
        for folder in (OFFSETS, COMMITS):
            self.files.delete(f"{folder}/{batch - KEEP_BATCHES}")

    def _write(self, folder: str, batch: int, lines: list[str]) -> None:
        self.files.write(f"{folder}/{batch}", "\n".join([VERSION_LINE, *lines]).encode())

    def _ids(self, folder: str) -> list[int]:
        return [int(name) for name in self.files.names(folder) if name.isdigit()]
