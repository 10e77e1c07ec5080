"""The write path: copy one Spark partition (= one source topic-partition) to the target and say where it landed.

It runs inside Spark's Python workers through `mapInArrow`, so a batch's Kafka partitions are written in parallel,
each in source order. Each record keeps its key, value, headers (order and duplicates), partition and original
timestamp; Spark's built-in Kafka sink cannot set the timestamp, which is why this path exists. Secrets are
resolved on the worker from the same env vars and files as on the driver, so they never travel in a task.

For every source partition it hands back one landing row: the last source offset written and the target offset it
landed at (an offset sync), with counts and a replication-latency histogram (bucket counts and sum, measured per
record in the delivery callback). A record the target refuses for size goes to the flow's dead-letter
topic when there is one. Otherwise its partition is held from that record on: nothing after it is written (order),
and the row says which offsets were held (`held_from`, `held_until`) so the driver quarantines the topic and
catches it up later. A partition of a topic that is not `ready` (quarantined, or not yet that many partitions on
the target) is held whole the same way.
"""

from __future__ import annotations

import collections
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException, Producer

from .config import ClusterConfig, FlowConfig
from .metrics import LATENCY_BOUNDS_MS
from .policy import PROVENANCE_HEADER, drops_record, target_topic
from .profiles import librdkafka_settings

# What the Spark query selects from the Kafka source, in this order.
SOURCE_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "key",
    "value",
    "headers",
    "unix_millis(timestamp) AS timestamp_ms",
)
LANDED_SCHEMA = (
    "topic string, partition int, first_offset long, last_offset long, last_target_offset long,"
    " records long, bytes long, dropped long, dead_lettered long, latency_counts array<long>, latency_sum_ms double,"
    " held_from long, held_until long, refused_bytes long"
)
DLQ_PREFIX = "mirrorkit.dlq."
# Throughput settings measured in bench/; acks=all and idempotence keep order and avoid duplicates on retry.
PRODUCER_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
}

METADATA_WAIT_S = 60.0
_producers: dict[tuple, Producer] = {}  # a changed override (e.g. a raised cap) gets its own


class DeliveryFailed(RuntimeError):
    pass


def _producer(cluster: ClusterConfig) -> Producer:
    """One producer per target per Python worker: connections outlive tasks, as Spark reuses workers."""
    key = (cluster.alias, cluster.bootstrap_servers, tuple(sorted(cluster.client_overrides.items())))
    if key not in _producers:
        _producers[key] = Producer(PRODUCER_DEFAULTS | librdkafka_settings(cluster, "producer"))
    return _producers[key]


@dataclass
class _Landing:
    topic: str
    partition: int
    first_offset: int
    last_offset: int = -1
    last_target_offset: int = -1
    records: int = 0
    bytes: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    # Replication latency per bucket of LATENCY_BOUNDS_MS (not cumulative; the last slot is +Inf), and the sum.
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    latency_sum_ms: float = 0.0
    held_from: int = -1  # first source offset not written (held), -1 when all were
    held_until: int = -1  # the offset after the last held one
    refused_bytes: int = 0  # size of the record refused at `held_from`, 0 when held for another reason

    def hold(self, offset: int, size: int = 0) -> None:
        if self.held_from < 0 or offset < self.held_from:
            self.held_from, self.refused_bytes = offset, size
        self.held_until = max(self.held_until, offset + 1, self.last_offset + 1)


class PartitionWriter:
    """A picklable `mapInArrow` function for one flow.

    `ready` maps each source topic that may be written to its partition count on the target; records of other
    topics or partitions are held, not written. None writes everything.
    """

    def __init__(self, flow: FlowConfig, target: ClusterConfig, ready: dict[str, int] | None = None) -> None:
        self.flow = flow
        self.target = target
        self.ready = ready

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        producer = _producer(self.target)
        landings: dict[tuple[str, int], _Landing] = {}
        in_flight: dict[tuple[str, int], collections.deque[int]] = collections.defaultdict(collections.deque)
        refused: list[tuple[int, object, str]] = []  # (source offset, refused message, source topic)
        failures: list[str] = []
        stamp = self.flow.replication_policy == "identity" and self.flow.provenance_header
        provenance = (PROVENANCE_HEADER, self.flow.source.encode())

        def delivered(err: KafkaError | None, msg) -> None:
            source_key = (msg.topic(), msg.partition())  # target topic; mapped back below
            offset = in_flight[source_key].popleft()
            landing = landings[target_to_source[source_key]]
            if err is None:
                landing.last_offset = offset
                landing.last_target_offset = msg.offset()
                kind, ts = msg.timestamp()
                if kind == TIMESTAMP_CREATE_TIME:  # an append-time target has replaced the source's timestamp
                    latency_ms = max(0.0, time.time() * 1000 - ts)
                    landing.latency_counts[bisect_left(LATENCY_BOUNDS_MS, latency_ms)] += 1
                    landing.latency_sum_ms += latency_ms
            elif err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                refused.append((offset, msg, target_to_source[source_key][0]))
            else:
                failures.append(f"{msg.topic()}[{msg.partition()}] offset {offset}: {err.str()}")

        target_to_source: dict[tuple[str, int], tuple[str, int]] = {}
        # (landing, target topic, offsets in flight) per source partition: one lookup per record
        per_partition: dict[tuple[str, int], tuple[_Landing, str, collections.deque[int]]] = {}
        identity = self.flow.replication_policy == "identity"
        produce = producer.produce
        for batch in batches:
            # Plain Python lists per column: to_pydict would build a dict per header, the loop's biggest cost.
            for topic, partition, offset, key, value, headers, ts in zip(
                batch.column("topic").to_pylist(),
                batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(),
                batch.column("key").to_pylist(),
                batch.column("value").to_pylist(),
                _header_lists(batch.column("headers")),
                batch.column("timestamp_ms").to_pylist(),
                strict=True,
            ):
                state = per_partition.get((topic, partition))
                if state is None:
                    landing = landings[(topic, partition)] = _Landing(topic, partition, offset)
                    out_topic = target_topic(self.flow, topic)
                    target_to_source[(out_topic, partition)] = (topic, partition)
                    state = per_partition[(topic, partition)] = (landing, out_topic, in_flight[(out_topic, partition)])
                    if self.ready is not None and partition >= self.ready.get(topic, 0):
                        landing.hold(offset)
                landing, out_topic, queue = state
                if landing.held_from >= 0:  # held: nothing after the first record not written goes before it
                    landing.held_until = offset + 1
                    continue
                if identity:
                    origin = next((v for k, v in headers or () if k == PROVENANCE_HEADER), None)
                    if drops_record(self.flow, origin):
                        landing.dropped += 1
                        landing.last_offset = max(landing.last_offset, offset)
                        continue
                    if stamp and origin is None:
                        headers = [*headers, provenance] if headers else [provenance]
                try:
                    produce(
                        out_topic,
                        value=value,
                        key=key,
                        partition=partition,
                        timestamp=ts,
                        headers=headers,
                        on_delivery=delivered,
                    )
                except (BufferError, KafkaException):  # queue full, or refused for size: the slow path decides
                    if not self._produce(producer, out_topic, partition, key, value, headers, ts, delivered):
                        refused.append((offset, _Refused(out_topic, partition, key, value, headers, ts), topic))
                        if not self.flow.dead_letter_topic:
                            landing.hold(offset, len(value or b""))
                        continue
                queue.append(offset)
                landing.records += 1
                landing.bytes += (len(key) if key else 0) + (len(value) if value else 0)
            producer.poll(0)  # serve delivery reports as we go, so they do not pile up until the flush
        remaining = producer.flush(300)
        if remaining or failures:
            raise DeliveryFailed(f"flow {self.flow.name}: {remaining} undelivered; first errors: {failures[:3]}")
        if refused and self.flow.dead_letter_topic:
            self._dead_letter(producer, refused, landings)
        elif refused:  # refused by the broker after later records were sent: held from the first refused one
            for offset, msg, source_topic in refused:
                landings[(source_topic, msg.partition())].hold(offset, len(msg.value() or b""))
        yield pa.RecordBatch.from_pylist([vars(x) for x in landings.values()], schema=_landed_arrow_schema())

    def _produce(self, producer: Producer, topic, partition, key, value, headers, ts, on_delivery) -> bool:
        """Hand one record to the producer; False when librdkafka refuses it for size before sending.

        A worker's producer outlives tasks, so its metadata can predate partitions added to the target since: on an
        unknown partition it refreshes the topic's metadata and tries again, for up to METADATA_WAIT_S.
        """
        deadline = time.monotonic() + METADATA_WAIT_S
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    partition=partition,
                    timestamp=ts,
                    headers=headers or None,
                    on_delivery=on_delivery,
                )
                return True
            except BufferError:
                producer.poll(0.05)
            except KafkaException as err:
                code = err.args[0].code()
                if code == KafkaError.MSG_SIZE_TOO_LARGE:
                    return False
                if code != KafkaError._UNKNOWN_PARTITION or time.monotonic() > deadline:
                    raise
                producer.list_topics(topic, timeout=10)
                time.sleep(0.2)

    def _dead_letter(self, producer: Producer, refused, landings: dict[tuple[str, int], _Landing]) -> None:
        errors: list[str] = []
        for offset, msg, source_topic in refused:
            value = msg.value() or b""
            coordinates = [
                (f"{DLQ_PREFIX}topic", source_topic.encode()),
                (f"{DLQ_PREFIX}partition", str(msg.partition()).encode()),
                (f"{DLQ_PREFIX}offset", str(offset).encode()),
                (f"{DLQ_PREFIX}timestamp", str(msg.timestamp()[1]).encode()),
                (f"{DLQ_PREFIX}size", str(len(value)).encode()),
                (f"{DLQ_PREFIX}error", b"MSG_SIZE_TOO_LARGE"),
            ]
            # The value itself did not fit this cluster, so the dead letter carries the coordinates to fetch it.
            producer.produce(
                self.flow.dead_letter_topic,
                key=msg.key(),
                value=None,
                headers=list(msg.headers() or []) + coordinates,
                on_delivery=lambda err, _m: errors.append(err.str()) if err else None,
            )
            landings[(source_topic, msg.partition())].dead_lettered += 1
        if producer.flush(60) or errors:
            raise DeliveryFailed(f"flow {self.flow.name}: dead-letter writes failed: {errors[:3]}")


class _Refused:
    """Quacks like a confluent-kafka Message for a record librdkafka refused before sending."""

    def __init__(self, topic, partition, key, value, headers, ts) -> None:
        self._fields = (topic, partition, key, value, headers, ts)

    def topic(self):
        return self._fields[0]

    def partition(self):
        return self._fields[1]

    def key(self):
        return self._fields[2]

    def value(self):
        return self._fields[3]

    def headers(self):
        return self._fields[4]

    def timestamp(self):
        return (1, self._fields[5])

    def offset(self):
        return -1


def _header_lists(column: pa.ListArray) -> list[list[tuple[str, bytes | None]] | None]:
    """Each row's headers as (key, value) pairs, order and duplicates kept; None for a row without headers.

    Two flat lists and one slice per row, instead of the dict per header that `to_pylist` on the struct builds.
    """
    flat = column.flatten()
    pairs = list(zip(flat.field(0).to_pylist(), flat.field(1).to_pylist(), strict=True))
    bounds = column.offsets.to_pylist()
    base = bounds[0]
    return [
        pairs[start - base : end - base] or None if valid else None
        for start, end, valid in zip(bounds, bounds[1:], column.is_valid().to_pylist(), strict=False)
    ]


def _landed_arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("first_offset", pa.int64()),
            ("last_offset", pa.int64()),
            ("last_target_offset", pa.int64()),
            ("records", pa.int64()),
            ("bytes", pa.int64()),
            ("dropped", pa.int64()),
            ("dead_lettered", pa.int64()),
            ("latency_counts", pa.list_(pa.int64())),
            ("latency_sum_ms", pa.float64()),
            ("held_from", pa.int64()),
            ("held_until", pa.int64()),
            ("refused_bytes", pa.int64()),
        ]
    )
