"""Worker-side code of the Python write paths measured by bench/write_paths.py.

It lives in its own importable module so that Spark's Python workers import it by reference: a module-level
producer then survives across tasks of a reused worker, as it would in the mirror, instead of being rebuilt from a
pickled copy for every task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from confluent_kafka import KafkaError, Producer
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

LANDED_SCHEMA = "topic string, partition int, last_offset long, last_target_offset long, records long"
LANDED_ARROW_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("last_offset", pa.int64()),
        ("last_target_offset", pa.int64()),
        ("records", pa.int64()),
    ]
)

Header = tuple[str, bytes | None]
_producers: dict[str, Producer] = {}


class DeliveryFailed(RuntimeError):
    pass


def producer(conf: dict[str, object]) -> Producer:
    """One producer per configuration per Python worker: connections and the idempotent PID outlive tasks."""
    key = json.dumps(conf, sort_keys=True)
    if key not in _producers:
        _producers[key] = Producer(conf)
    return _producers[key]


def header_lists(column: pa.ListArray) -> list[list[Header] | None]:
    """Headers per row without building a dict per header, which `to_pylist` on the struct column would do."""
    flat = column.flatten()
    pairs = list(zip(flat.field("key").to_pylist(), flat.field("value").to_pylist(), strict=True))
    offsets = column.offsets.to_pylist()
    base = offsets[0]
    valid = column.is_valid().to_pylist()
    return [pairs[offsets[i] - base : offsets[i + 1] - base] if valid[i] else None for i in range(len(column))]


@dataclass
class Landing:
    """Where one source partition's records of this task landed: the last source offset and its target offset."""

    topic: str
    partition: int
    last_offset: int = -1
    last_target_offset: int = -1
    records: int = 0


def write_batches(batches: Iterable[pa.RecordBatch], conf: dict[str, object], prefix: str) -> list[Landing]:
    """Produce every row in source order with its timestamp and headers; wait for all deliveries before returning.

    Each Spark task holds whole Kafka partitions, and one producer with idempotence keeps their order, so the
    delivery reports of a partition arrive in source order: the n-th report is the n-th record sent.
    """
    out = producer(conf)
    landings: dict[tuple[str, int], Landing] = {}
    by_target: dict[tuple[str, int], Landing] = {}
    delivered: dict[tuple[str, int], int] = {}
    failures: list[str] = []

    def on_delivery(err: KafkaError | None, msg) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")
            return
        where = (msg.topic(), msg.partition())
        delivered[where] = msg.offset()

    for batch in batches:
        topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        keys = batch.column("key").to_pylist()
        values = batch.column("value").to_pylist()
        stamps = batch.column("timestamp_ms").to_pylist()
        headers = header_lists(batch.column("headers"))
        produce = out.produce
        for topic, partition, offset, key, value, ts, hdrs in zip(
            topics, partitions, offsets, keys, values, stamps, headers, strict=True
        ):
            landing = landings.get((topic, partition))
            if landing is None:
                landing = landings[(topic, partition)] = Landing(topic, partition)
                by_target[(prefix + topic, partition)] = landing
            while True:
                try:
                    produce(
                        prefix + topic,
                        value=value,
                        key=key,
                        partition=partition,
                        timestamp=ts,
                        headers=hdrs,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    out.poll(0.05)
            landing.last_offset = offset
            landing.records += 1
        out.poll(0)
    remaining = out.flush(300)
    if remaining or failures:
        raise DeliveryFailed(f"{remaining} undelivered; first errors: {failures[:3]}")
    for where, landing in by_target.items():
        landing.last_target_offset = delivered.get(where, -1)
    return list(landings.values())


def landing_rows(landings: list[Landing]) -> list[dict[str, object]]:
    return [
        {
            "topic": x.topic,
            "partition": x.partition,
            "last_offset": x.last_offset,
            "last_target_offset": x.last_target_offset,
            "records": x.records,
        }
        for x in landings
    ]


class ArrowPartitionWriter:
    """A picklable `mapInArrow` function: write this task's partitions, yield one landing row per partition."""

    def __init__(self, conf: dict[str, object], prefix: str) -> None:
        self.conf = conf
        self.prefix = prefix

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        landings = write_batches(batches, self.conf, self.prefix)
        yield pa.RecordBatch.from_pylist(landing_rows(landings), schema=LANDED_ARROW_SCHEMA)


class RowPartitionWriter:
    """A picklable `rdd.mapPartitions` function: the same writer fed with pickled Rows instead of Arrow."""

    def __init__(self, conf: dict[str, object], prefix: str) -> None:
        self.conf = conf
        self.prefix = prefix

    def __call__(self, rows: Iterator) -> Iterator[dict[str, object]]:
        def batches() -> Iterator[pa.RecordBatch]:
            chunk: list[dict[str, object]] = []
            for row in rows:
                d = row.asDict(recursive=True)
                chunk.append(d)
                if len(chunk) == 10_000:
                    yield _rows_to_batch(chunk)
                    chunk = []
            if chunk:
                yield _rows_to_batch(chunk)

        yield from landing_rows(write_batches(batches(), self.conf, self.prefix))


def _rows_to_batch(rows: list[dict[str, object]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("key", pa.binary()),
                ("value", pa.binary()),
                ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
                ("timestamp_ms", pa.int64()),
            ]
        ),
    )


@dataclass
class LandedMessage(WriterCommitMessage):
    rows: list[dict[str, object]]


class KafkaArrowSink(DataSource):
    """A Python streaming sink (DataSourceStreamArrowWriter) that writes to Kafka with confluent-kafka."""

    @classmethod
    def name(cls) -> str:
        return "mirrorkit_bench_kafka"

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaArrowStreamWriter:
        return KafkaArrowStreamWriter(dict(self.options))


class KafkaArrowStreamWriter(DataSourceStreamArrowWriter):
    """Tasks write and return landings; `commit` sees them all on the driver side and appends them to a file."""

    def __init__(self, options: dict[str, str]) -> None:
        self.conf = json.loads(options["producer"])
        self.prefix = options["prefix"]
        self.landed_file = options["landed_file"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LandedMessage:
        return LandedMessage(landing_rows(write_batches(iterator, self.conf, self.prefix)))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = [r for m in messages if m is not None for r in m.rows]
        with Path(self.landed_file).open("a") as f:
            f.write(json.dumps({"batch": batchId, "rows": rows}) + "\n")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
