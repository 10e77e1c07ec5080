"""The copy path: copy planned source offset ranges to the target and say where each record landed.

Spark plans every micro-batch as offset ranges, one per source topic-partition (spark_app.planner), and hands
them to `RangeCopier` through `mapInArrow`, so a batch's ranges are copied in parallel, each in source order.
Each Python task reads its ranges with one librdkafka consumer and writes them with one idempotent producer:
records never cross from the JVM to Python and back, which is what made this path about twice as fast as reading
with Spark's Kafka source and writing from Arrow batches (bench/). Each record keeps its key, value, headers
(order and duplicates), partition and original timestamp. Secrets are resolved on the worker from the same env
vars and files as on the driver, so they never travel in a task.

For every range it hands back one landing row: the last source offset written and the target offset it landed at
(an offset sync), with counts and a replication-latency histogram (bucket counts and sum, measured per record in
the delivery callback). A record the target refuses for size goes to the flow's dead-letter topic when there is
one. Otherwise its partition is held from that record on: nothing after it is written (order), and the row says
which offsets were held (`held_from`, `held_until`) so the driver quarantines the topic and catches it up later.
A range of a topic that is not `ready` (quarantined, or not yet that many partitions on the target) is held whole
the same way, without reading it. So is the rest of a range whose source partition serves nothing while the source
answers (its leader offline): the batch ends, and the topic catches up once the partition is back.
"""

from __future__ import annotations

import collections
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, cast

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from . import clients
from .config import ClusterConfig, FlowConfig
from .errors import DeliveryFailed
from .policy import PROVENANCE_HEADER, drops_record, origin, provenance, target_topic
from .ranges import LATENCY_BOUNDS_MS, Landing, OffsetRange, landed_arrow_schema

DLQ_PREFIX = "mirrorkit.dlq."
# Throughput settings measured in bench/; acks=all and idempotence keep order and avoid duplicates on retry.
BATCH_BYTES = 1_000_000  # at most what Event Hubs takes in one request
PRODUCER_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 20,
    "batch.size": BATCH_BYTES,
    # A bounded queue is the back-pressure: `produce` waits for room, so a record's delivery timeout (300 s) starts
    # at most 256 MB of target writes before it is sent, about 85 s even at 3 MB/s, and a slow target slows the copy
    # instead of failing the batch's tail. (64 MB cost a fifth of the throughput on loopback: bench/harness.py.)
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 262_144,
}
# The copier assigns partitions at Spark's offsets and never joins the group or commits: Spark's checkpoint owns
# the positions. EOF events tell it where a partition's log ends (a range can end in transaction markers).
CONSUMER_DEFAULTS = {
    "group.id": "mirrorkit-copier",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",  # a start below the log start: copy what is left; the driver reports the gap
    "isolation.level": "read_committed",
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
}
CONSUME_BATCH = 10_000
CONSUME_WAIT_S = 0.1
READ_STALL_S = 300.0  # a range that makes no progress this long fails the batch (the source stopped answering)

# A partition with records left that reads nothing this long is looked up in the source's metadata, and held at once
# when it has no leader (its broker offline). A fetch waits at most 500 ms (librdkafka's fetch.wait.max.ms), so 5 s
# of silence is well past a normal fetch; the look-up alone holds nothing.
LEADER_CHECK_S = 5.0
# A partition whose named leader serves nothing this long is held too (a broker the controller sees but the mirror
# cannot reach). Well above a slow fetch across a WAN, and far below READ_STALL_S, which still fails the batch when
# the whole source stops answering (its metadata too): then no partition is held.
PARTITION_STALL_S = 60.0

METADATA_WAIT_S = 60.0
# Delivery errors that concern one topic or record, not the target: the partition holds from the refused record and
# its topic is quarantined (spark_app.quarantine) while the others go on. Any other delivery error fails the batch.
TOPIC_SCOPED_ERRORS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
    }
)


Partition = tuple[str, int]  # (topic, partition)
Headers = list[tuple[str, str | bytes | None]]  # as confluent-kafka types them; consumed values are bytes or None


class Record(Protocol):
    """A consumed record or a delivery report. confluent-kafka's stubs make every field Optional; these are always
    set on a message read from an assigned partition or reported for one."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Headers | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def error(self) -> KafkaError | None: ...


def producer_settings(max_message_bytes: int | None) -> dict[str, object]:
    """The write path's producer settings for targets whose smallest `max.message.bytes` is `max_message_bytes`."""
    settings: dict[str, object] = dict(PRODUCER_DEFAULTS)
    if max_message_bytes is not None:
        settings |= {"batch.size": min(BATCH_BYTES, max_message_bytes), "message.max.bytes": max_message_bytes}
    return settings


class RangeCopier:
    """A picklable `mapInArrow` function for one flow: its input rows are offset ranges (RANGE_SCHEMA).

    `ready` maps each source topic that may be written to its partition count on the target; ranges of other
    topics or partitions are held, not read. None writes everything. `max_message_bytes` is the smallest record
    batch the flow's target topics take (their `max.message.bytes`): the producer never builds a larger request, so
    the broker refuses a record only when it alone is too large, never a batch of records that fit.
    """

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, ready: dict[str, int] | None = None,
        max_message_bytes: int | None = None,
    ) -> None:  # fmt: skip
        self.flow = flow
        self.source = source
        self.target = target
        self.ready = ready
        self.producer_settings = producer_settings(max_message_bytes)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ranges = [OffsetRange(**row) for batch in batches for row in batch.to_pylist()]
        landings = self.copy(ranges)
        yield pa.RecordBatch.from_pylist([vars(x) for x in landings], schema=landed_arrow_schema())

    def copy(self, ranges: list[OffsetRange]) -> list[Landing]:
        """Copy every range, each partition in order; one landing per range."""
        producer = clients.shared_producer(self.target, self.producer_settings)
        landings: dict[tuple[str, int], Landing] = {}
        ends: dict[tuple[str, int], int] = {}
        for r in ranges:
            landing = Landing(r.topic, r.partition, r.end, r.end, reset_from=r.reset_from)
            landings[(r.topic, r.partition)] = landing
            if self.ready is not None and r.partition >= self.ready.get(r.topic, 0):
                landing.first_offset = r.start
                landing.hold(r.start)
            elif r.end > r.start:
                ends[(r.topic, r.partition)] = r.end
        if ends:
            self._copy_open(ranges, ends, landings, producer)
        return list(landings.values())

    def _copy_open(
        self, ranges: list[OffsetRange], ends: dict[Partition, int], landings: dict[Partition, Landing],
        producer: Producer,
    ) -> None:  # fmt: skip
        consumer = clients.shared_consumer(self.source, CONSUMER_DEFAULTS)
        assignment = [TopicPartition(r.topic, r.partition, r.start) for r in ranges if (r.topic, r.partition) in ends]
        consumer.assign(assignment)
        outbox = Outbox(self.flow, producer, landings.__getitem__)

        def close(key: Partition) -> None:
            """A partition's range is done, or held from a refused record on: what the consumer fetched past its end
            is skipped. (Pausing it instead left it paused in librdkafka when a later task assigned it again.)"""
            del open_[key]

        # (landing, range end) per source partition: one lookup per record
        open_: dict[Partition, tuple[Landing, int]] = {}
        for key, end in ends.items():
            outbox.open(key)
            open_[key] = (landings[key], end)
        first_seen: set[Partition] = set()
        reached = {(r.topic, r.partition): r.start for r in ranges if (r.topic, r.partition) in ends}  # next to read
        watch = PartitionWatch(reached, time.monotonic())
        send = outbox.send
        progress_at = time.monotonic()
        # consume() returns once it has as many messages as asked, or at its timeout: ask for no more than the
        # ranges still hold, so a small batch (continuous mode) does not wait out the timeout.
        left = sum(r.end - r.start for r in ranges if (r.topic, r.partition) in ends)
        while open_:
            # Read from assigned partitions, so topic, partition and offset are set (the stubs say Optional).
            messages = cast(list[Record], consumer.consume(max(1, min(CONSUME_BATCH, left)), CONSUME_WAIT_S))
            if time.monotonic() >= watch.look_at:  # a partition the source does not serve holds from where it is
                idle = watch.idle(open_, time.monotonic())
                for key, why in unreadable(idle, self._leaders(consumer, idle), self.source.alias).items():
                    landings[key].first_offset = min(landings[key].first_offset, reached[key])
                    landings[key].hold(reached[key], error=why)
                    close(key)
            if not messages:
                if time.monotonic() - progress_at > READ_STALL_S:
                    raise DeliveryFailed(
                        f"flow {self.flow.name}: no progress reading cluster '{self.source.alias}'"
                        f" ({self.source.bootstrap_servers}) for {READ_STALL_S:.0f}s; still open: {sorted(open_)[:3]}"
                    )
                continue
            progress_at = time.monotonic()
            for msg in messages:
                key = (msg.topic(), msg.partition())
                state = open_.get(key)
                if state is None:  # fetched past its range, or already closed
                    continue
                landing, end = state
                offset, err = msg.offset(), msg.error()
                reached[key] = offset if err is not None else offset + 1  # an event's offset is the next one to read
                if key not in first_seen:
                    first_seen.add(key)
                    landing.first_offset = min(offset, end)
                if err is not None or offset >= end:  # the log's end (EOF), or past the range
                    end_of_log(self.flow, msg)
                    if offset >= end:
                        close(key)
                    continue
                left -= 1
                if not send(msg, key, offset, landing) or offset + 1 >= end:
                    close(key)
            producer.poll(0)  # serve delivery reports as we go, so they do not pile up until the flush
        consumer.unassign()  # no fetching past the ranges while the worker waits for its next task
        outbox.flush(300)
        outbox.settle()

    @staticmethod
    def _leaders(consumer: Consumer, idle: Iterable[Partition]) -> dict[Partition, int] | None:
        """Each partition of the idle partitions' topics with its leader as the source's metadata names it now (-1:
        none); None when the source does not answer (READ_STALL_S covers that)."""
        leaders: dict[Partition, int] = {}
        try:
            for topic in {t for t, _ in idle}:
                metadata = consumer.list_topics(topic, timeout=clients.METADATA_CHECK_S).topics[topic]
                leaders |= {(topic, p): m.leader for p, m in metadata.partitions.items()}
        except KafkaException:
            return None
        return leaders


def end_of_log(flow: FlowConfig, msg: Record) -> None:
    """Pass a consumed event that is the end of a partition's log (or a record); any other read error fails."""
    err = msg.error()
    if err is not None and err.code() != KafkaError._PARTITION_EOF:
        raise DeliveryFailed(f"flow {flow.name}: reading {msg.topic()}[{msg.partition()}]: {err.str()}")


class Outbox:
    """One producer's records on their way to the target, as the flow's policy writes them, and what their delivery
    reports say.

    `send` takes a consumed record: it drops an echo (identity loop prevention), stamps the provenance header, and
    hands the record to the producer with the source's key, value, headers, partition and timestamp. Each delivery
    report is filed under the landing its source partition has *then* (`landing_of`): the micro-batch copier keeps
    one landing per range, the real-time copier starts a new one at every report. Reports come in order per
    partition, so the offsets in flight are a queue per source partition, and its head is the first offset not
    known to have landed. Refusals are settled by `settle`: a record too large goes to the dead-letter topic, or
    holds its partition; a topic-scoped error holds its partition; any other error fails the task at `flush`.
    """

    def __init__(self, flow: FlowConfig, producer: Producer, landing_of: Callable[[Partition], Landing]) -> None:
        self.flow = flow
        self.producer = producer
        self.landing_of = landing_of
        self.in_flight: dict[Partition, collections.deque[int]] = {}  # per source partition
        self._targets: dict[Partition, tuple[str, collections.deque[int]]] = {}  # source -> (target topic, in flight)
        self._sources: dict[Partition, Partition] = {}  # target partition -> source partition
        self._refused: list[Refused] = []
        self._blocked: list[tuple[Partition, int, str]] = []  # (source partition, offset, error): refused for its topic
        self._failures: list[str] = []
        self._identity = flow.replication_policy == "identity"
        self._stamp = self._identity and flow.provenance_header
        self._produce_now = producer.produce  # looked up once: `send` runs for every record
        self._on_delivery = self.delivered

    def open(self, source: Partition) -> None:
        """Get ready to send records of a source partition."""
        out_topic = target_topic(self.flow, source[0])
        queue = self.in_flight.setdefault(source, collections.deque())
        self._targets[source] = (out_topic, queue)
        self._sources[(out_topic, source[1])] = source

    def send(self, msg: Record, source: Partition, offset: int, landing: Landing) -> bool:
        """Send one record (at `offset`) of an open partition `source`, or drop it as an echo; False when the target's
        cap refused it and no dead-letter topic takes it, so its partition holds from it and nothing after it may be
        sent."""
        value, headers = msg.value(), msg.headers()
        if self._identity:
            came_from = next((v for k, v in headers or () if k == PROVENANCE_HEADER), None)
            if drops_record(self.flow, came_from):
                assert came_from is not None  # drops_record says it is a provenance value
                landing.dropped += 1
                landing.echoed(offset, origin(came_from)[1])
                return True
            if self._stamp and came_from is None:
                stamp_header = (PROVENANCE_HEADER, provenance(self.flow.source, offset))
                headers = [*headers, stamp_header] if headers else [stamp_header]
        key, ts = msg.key(), msg.timestamp()[1]
        out_topic, queue = self._targets[source]
        try:
            self._produce_now(
                out_topic, value=value, key=key, partition=source[1], timestamp=ts, headers=headers,
                on_delivery=self._on_delivery,
            )  # fmt: skip
        except (BufferError, KafkaException):  # queue full, or refused for size: the slow path decides
            if not self._produce(out_topic, source[1], key, value, headers, ts):
                self._refused.append(Refused(source[0], source[1], offset, key, value, headers, ts))
                if not self.flow.dead_letter_topic:
                    landing.hold(offset, len(value or b""))
                    return False
                return True
        queue.append(offset)
        landing.records += 1
        landing.bytes += (len(key) if key else 0) + (len(value) if value else 0)
        return True

    def delivered(self, err: KafkaError | None, report: Message) -> None:
        msg = cast(Record, report)
        source = self._sources[(msg.topic(), msg.partition())]
        offset = self.in_flight[source].popleft()
        landing = self.landing_of(source)
        if err is None:
            landing.landed(offset, msg.offset())
            kind, ts = msg.timestamp()
            if kind == TIMESTAMP_CREATE_TIME:  # an append-time target has replaced the source's timestamp
                latency_ms = max(0.0, time.time() * 1000 - ts)
                landing.latency_counts[bisect_left(LATENCY_BOUNDS_MS, latency_ms)] += 1
                landing.latency_sum_ms += latency_ms
        elif err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            self._refused.append(Refused.of(source[0], offset, msg))
        elif err.code() in TOPIC_SCOPED_ERRORS:
            why = f"target '{self.flow.target}' refused it ({err.name()}: {err.str()}); fix it on the target"
            self._blocked.append((source, offset, why))
        else:
            self._failures.append(f"{msg.topic()}[{msg.partition()}] offset {offset}: {err.str()}")

    def flush(self, timeout_s: float) -> None:
        """Wait for every record in flight; fail the task if one is not delivered or failed for the target."""
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise DeliveryFailed(f"flow {self.flow.name}: {remaining} undelivered; first errors: {self._failures[:3]}")
        self.raise_failures()

    def raise_failures(self) -> None:
        """Fail the task if a delivery failed for the target (not for one topic): nothing past that record may be
        reported as copied, so the task's retry resumes before it."""
        if self._failures:
            raise DeliveryFailed(f"flow {self.flow.name}: delivery failed; first errors: {self._failures[:3]}")

    def settle(self) -> set[Partition]:
        """Act on the refusals reported so far (see the class); returns the source partitions now held. Dead letters
        are flushed, and delivery reports that arrive meanwhile are settled too."""
        held: set[Partition] = set()
        while self._refused or self._blocked:
            refused, self._refused = self._refused, []
            blocked, self._blocked = self._blocked, []
            for source, offset, error in blocked:  # the partition holds from there; the topic is quarantined
                self.landing_of(source).hold(offset, error=error)
                held.add(source)
            if refused and self.flow.dead_letter_topic:
                self._dead_letter(refused)
            else:  # refused by the broker after later records were sent: held from the first refused one
                for r in refused:
                    self.landing_of((r.topic, r.partition)).hold(r.offset, len(r.value or b""))
                    held.add((r.topic, r.partition))
        return held

    def _produce(
        self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers: Headers | None, ts: int
    ) -> bool:
        """Hand one record to the producer; False when librdkafka refuses it for size before sending.

        A worker's producer outlives tasks, so its metadata can predate partitions added to the target since: on an
        unknown partition it refreshes the topic's metadata and tries again, for up to METADATA_WAIT_S.
        """
        deadline = time.monotonic() + METADATA_WAIT_S
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, partition=partition, timestamp=ts, headers=headers or None,
                    on_delivery=self.delivered,
                )  # fmt: skip
                return True
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as err:
                code = err.args[0].code()
                if code == KafkaError.MSG_SIZE_TOO_LARGE:
                    return False
                if code != KafkaError._UNKNOWN_PARTITION or time.monotonic() > deadline:
                    raise
                self.producer.list_topics(topic, timeout=10)
                time.sleep(0.2)

    def _dead_letter(self, refused: list[Refused]) -> None:
        errors: list[str] = []

        def delivered(err: KafkaError | None, _report: Message) -> None:
            if err is not None:
                errors.append(err.str())

        for r in refused:
            value = r.value or b""
            coordinates: Headers = [
                (f"{DLQ_PREFIX}topic", r.topic.encode()),
                (f"{DLQ_PREFIX}partition", str(r.partition).encode()),
                (f"{DLQ_PREFIX}offset", str(r.offset).encode()),
                (f"{DLQ_PREFIX}timestamp", str(r.timestamp).encode()),
                (f"{DLQ_PREFIX}size", str(len(value)).encode()),
                (f"{DLQ_PREFIX}error", b"MSG_SIZE_TOO_LARGE"),
            ]
            # The value itself did not fit this cluster, so the dead letter carries the coordinates to fetch it.
            self.producer.produce(
                self.flow.dead_letter_topic or "",
                key=r.key,
                value=None,
                headers=list(r.headers or []) + coordinates,
                on_delivery=delivered,
            )
            self.landing_of((r.topic, r.partition)).dead_lettered += 1
        if self.producer.flush(60) or errors:
            raise DeliveryFailed(f"flow {self.flow.name}: dead-letter writes failed: {errors[:3]}")


class PartitionWatch:
    """How long each partition of a copy has read nothing: `reached` (each partition's next offset to read, which the
    copy loop keeps) is compared with what it was at the previous look, at most once a second."""

    def __init__(self, reached: dict[Partition, int], now: float) -> None:
        self.reached = reached
        self._seen = dict(reached)
        self._since = dict.fromkeys(reached, now)
        self.look_at = now + LEADER_CHECK_S

    def idle(self, partitions: Iterable[Partition], now: float) -> dict[Partition, float]:
        """Those of `partitions` that read nothing for LEADER_CHECK_S or more, with for how many seconds."""
        self.look_at = now + 1.0
        out: dict[Partition, float] = {}
        for key in partitions:
            if self.reached[key] != self._seen[key]:
                self._seen[key], self._since[key] = self.reached[key], now
            elif now - self._since[key] >= LEADER_CHECK_S:
                out[key] = now - self._since[key]
        return out


def unreadable(idle: dict[Partition, float], leaders: dict[Partition, int] | None, source: str) -> dict[Partition, str]:
    """Which idle partitions (seconds without a read) to hold, with why: those the source's metadata gives no leader,
    and those whose named leader served nothing for PARTITION_STALL_S. None of them when the source's metadata did not
    answer either (`leaders` None): the whole source is down, and the batch waits (READ_STALL_S)."""
    if leaders is None:
        return {}
    out: dict[Partition, str] = {}
    for key, seconds in idle.items():
        leader, stalled = leaders.get(key, -1), f"no progress reading partition for {seconds:.0f} s"
        if leader < 0:
            out[key] = f"{stalled}: source '{source}' names no leader for it (leader offline?)"
        elif seconds >= PARTITION_STALL_S:
            out[key] = f"{stalled} from source '{source}' (leader {leader} unreachable?)"
    return out


@dataclass(frozen=True)
class Refused:
    """A record the target refused for size, by its source coordinates, for the dead-letter topic or a hold."""

    topic: str  # the source topic
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    timestamp: int

    @classmethod
    def of(cls, source_topic: str, offset: int, report: Record) -> Refused:
        """From a delivery report the broker refused."""
        return cls(source_topic, report.partition(), offset, report.key(), report.value(), report.headers(),
                   report.timestamp()[1])  # fmt: skip
