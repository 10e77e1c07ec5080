"""Worker-side adapters that feed other Spark write APIs into the mirror's own `PartitionWriter`.

bench/write_paths.py measures how Spark hands records to Python (Arrow batches through `mapInArrow`, pickled Rows
through `rdd.mapPartitions`, or a Python streaming sink). The per-record loop and the producer are always the
mirror's (`spark_app.writer`), so a figure here is a figure of the code that ships. The module is importable so
Spark's workers import it by reference and reuse the writer's module-level producer across tasks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_app.config import ClusterConfig, FlowConfig
from spark_app.writer import PartitionWriter

# The columns of spark_app.writer.SOURCE_COLUMNS, for Rows that arrive without a schema.
SOURCE_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("timestamp_ms", pa.int64()),
    ]
)


def partition_writer(spec: str) -> PartitionWriter:
    """The mirror's writer from a JSON {flow, target} spec (plain data travels to workers, not models)."""
    data = json.loads(spec)
    return PartitionWriter(FlowConfig.model_validate(data["flow"]), ClusterConfig.model_validate(data["target"]))


def landing_dicts(batches: Iterator[pa.RecordBatch]) -> list[dict[str, object]]:
    return [row for batch in batches for row in batch.to_pylist()]


class RowPartitionWriter:
    """A picklable `rdd.mapPartitions` function: Rows regrouped into Arrow batches for the mirror's writer."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __call__(self, rows: Iterator) -> Iterator[dict[str, object]]:
        def batches() -> Iterator[pa.RecordBatch]:
            chunk: list[dict[str, object]] = []
            for row in rows:
                chunk.append(row.asDict(recursive=True))
                if len(chunk) == 10_000:
                    yield pa.RecordBatch.from_pylist(chunk, schema=SOURCE_ARROW_SCHEMA)
                    chunk = []
            if chunk:
                yield pa.RecordBatch.from_pylist(chunk, schema=SOURCE_ARROW_SCHEMA)

        yield from landing_dicts(partition_writer(self.spec)(batches()))


@dataclass
class LandedMessage(WriterCommitMessage):
    rows: list[dict[str, object]]


class KafkaArrowSink(DataSource):
    """A Python streaming sink (DataSourceStreamArrowWriter) around the mirror's writer."""

    @classmethod
    def name(cls) -> str:
        return "mirrorkit_bench_kafka"

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaArrowStreamWriter:
        return KafkaArrowStreamWriter(dict(self.options))


class KafkaArrowStreamWriter(DataSourceStreamArrowWriter):
    """Tasks write and return landings; `commit` sees them all on the driver side and appends them to a file."""

    def __init__(self, options: dict[str, str]) -> None:
        self.spec = options["writer"]
        self.landed_file = options["landed_file"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LandedMessage:
        return LandedMessage(landing_dicts(partition_writer(self.spec)(iterator)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = [r for m in messages if m is not None for r in m.rows]
        with Path(self.landed_file).open("a") as f:
            f.write(json.dumps({"batch": batchId, "rows": rows}) + "\n")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
