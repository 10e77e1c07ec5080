"""The per-record path: each source record written to the target as the flow's policy says, and where it landed.

Both modes drive it (spark_app.range_copy for micro-batches, spark_app.realtime for long-running tasks) through one
narrow function, `copy_some`: take what the consumer has, pass each record through the `Outbox`, and account every
delivery into its partition's `Landing`. The two compiled cores do the same where spark_app.copy_wing.choice gives
them a flow: the Rust core (spark_app.compiled_copy) for throughput batches and real-time slots without transactions,
the Java copier (spark_app.realtime.jvm) for real-time slots in transactions. Each keeps this loop's behaviour, which
spark_app.copy_wing.contract hands them as data: per source partition a `Cursor` (its landing, its next offset, where
it stops); records written in source order with the source's key, value, headers (order and duplicates), partition
and timestamp, and the identity policy's provenance header; echoes dropped; a record the target refuses held, or
dead-lettered. This loop stays the reference, and takes over from either compiled core at every rare event.
"""

from __future__ import annotations

import collections
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

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
from .clients import Partition
from .config import FlowConfig
from .errors import DeliveryFailed
from .policy import PROVENANCE_HEADER, origin, provenance, replication_policy, target_topic
from .ranges import LATENCY_BOUNDS_MS, Landing
from .topics import TargetRule, TargetRules
from .transactions import FENCED_ERRORS, Fenced, TransactionFailed

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
# What one transaction of a slot carries at most: it commits (with its positions) once it has carried TXN_BYTES of
# records or been open TXN_OPEN_S, and the next one begins. Its producer queues at most TXN_QUEUE_KBYTES (or two of
# the largest record the target takes), so a send waits for room instead of queueing more than the target can take
# before the commit: a transaction is open for about TXN_OPEN_S plus the queue's time to drain, within the broker's
# transaction timeout (spark_app.transactions.TRANSACTION_TIMEOUT_MS, 60 s) down to about 0.4 MB/s, and a record's
# delivery timeout (librdkafka lowers it to the transaction timeout) never expires on a target that is slow but
# moving at that rate.
TXN_BYTES = 64 * 1024 * 1024
TXN_OPEN_S = 10.0
TXN_QUEUE_KBYTES = 16_384
# How long dead letters may wait for their delivery while nothing at all of the producer's is delivered: on a slow
# target they queue behind up to 256 MB of records, so only a producer that stopped moving fails the copy.
DEAD_LETTER_STALL_S = 60.0
# A copy assigns partitions at the positions the flow's runner gives it and never joins the group or commits: the
# batch log or the flow's ledger owns the positions. EOF events tell it where a partition's log ends (a range can
# end in transaction markers).
CONSUMER_DEFAULTS = {
    "group.id": "mirrorkit-copier",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    # A position outside the log comes back as an error event, not a silent reset: below the log start (retention
    # deleted records not yet read) the copy moves to the log start in a landing of its own, so the ledger sees and
    # reports the gap even in the middle of a real-time run; past the log end (the topic made again) its offsets
    # went backwards.
    "auto.offset.reset": "error",
    "isolation.level": "read_committed",
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
}
FLUSH_S = 300.0  # how long a copy waits for what it sent to be delivered
# How long a produce to a partition the producer's metadata does not know yet waits for the partition to appear.
METADATA_WAIT_S = 60.0
# A record purged from the producer by the mirror itself: after a failure (the records after it must not land ahead
# of its retry), or with a transaction it aborts. Its report says so.
PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Delivery errors that concern one topic or record, not the target: the partition holds from the refused record and
# its topic is quarantined (spark_app.quarantine) while the others go on. Any other delivery error fails the batch.
TOPIC_SCOPED_ERRORS = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_DIFFERENT_RECORD,  # refused for another record of its batch (INVALID_RECORD's neighbours)
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
    }
)
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


def producer_settings(rules: TargetRules) -> dict[str, object]:
    """The write path's producer settings for the flow's target topics."""
    settings: dict[str, object] = dict(PRODUCER_DEFAULTS)
    cap = rules.max_message_bytes
    if cap is not None:
        settings |= {"batch.size": min(BATCH_BYTES, cap), "message.max.bytes": cap}
    return settings


def transaction_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """A slot's transactional producer's settings: the write path's, with the queue bounded (TXN_QUEUE_KBYTES) so a
    transaction never holds more than the target takes before its timeout."""
    largest = int(cast(int, settings.get("message.max.bytes", 1_000_000)))
    return dict(settings) | {"queue.buffering.max.kbytes": transaction_queue_kbytes(largest)}


def transaction_queue_kbytes(largest_record: int) -> int:
    """What a slot's transactional producer queues at most, in either language: TXN_QUEUE_KBYTES, or two of the
    largest record the target takes."""
    return max(TXN_QUEUE_KBYTES, 2 * largest_record // 1024 + 1)


@dataclass
class Retries:
    """What the broker's refusals inside a slot's transactions taught it, kept from one attempt of a transaction to the
    next: the broker refuses a whole producer batch for a record too large, and the refusal fails the transaction, so
    the copy aborts it and copies again from its last commit. The largest record of a refused batch is sent `alone` in
    its batch then; a record refused alone is too large for the target, and is written to the dead-letter topic
    (`dead`) in its place, or holds its partition from itself (the caller cuts the partition there)."""

    alone: dict[Partition, set[int]] = field(default_factory=dict)  # source offsets, by source partition
    dead: dict[Partition, set[int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.alone or self.dead)

    def forget_below(self, positions: Mapping[Partition, int]) -> None:
        """Drop what concerns records before each partition's committed position: they are not copied again."""
        for offsets in (self.alone, self.dead):
            for key, below in positions.items():
                if key in offsets:
                    offsets[key] = {o for o in offsets[key] if o >= below}
                    if not offsets[key]:
                        del offsets[key]


@dataclass
class Cursor:
    """One source partition a copy reads: the landing its records go to now, the offset after the last one read
    (or the log end an end-of-log event gave), and where it stops (None: it never does)."""

    landing: Landing
    next: int
    stop: int | None = None
    seen: bool = False  # an event of it was read: the first one fixes where its landing starts
    done: bool = False  # its stop reached, or held from a refused record: what the consumer fetched past is skipped
    # Landings ended early because the partition's offsets went backwards, to be filed before the current one.
    retired: list[Landing] = field(default_factory=list)
    # A range planned in one life of its topic (throughput mode): it ends where its partition went backwards, and
    # never reads a later life, whose id nothing read can tell (a later life made again once more would be read on
    # unnoticed); the next batch, planned in that life, copies it from its log start.
    one_life: bool = False


def copy_some(consumer: Consumer, cursors: Mapping[Partition, Cursor], outbox: Outbox, most: int, wait_s: float) -> int:
    """Read what the consumer has (at most `most` events, waiting at most `wait_s`), write each record of a partition
    not done through `outbox`, and move the cursors; returns how many records it passed on (written, dropped as
    echoes, or held).

    A partition is done once it reaches its stop or a record of it is refused (its cursor's `done`): before it is
    sent where the target topic's rules show it (`TargetRule`), else as soon as a delivery report says so, so only
    records already in flight land past it. The caller stops fetching it.

    An offset below where a partition stood means its offsets went backwards (the topic deleted and made
    again, or truncated): what was sent is delivered first, its landing is retired, and a new one says where it
    started over.
    """
    taken = 0
    # Read from assigned partitions, so topic, partition and offset are set (the stubs say Optional).
    consumed = cast(list[Record], clients.consume(consumer, max(1, most), wait_s))
    for i, msg in enumerate(consumed):
        if outbox.full:  # the transaction carried what it may: what was fetched past is read again in the next one
            _rewind(consumer, cursors, consumed[i:])
            break
        key = (msg.topic(), msg.partition())
        cursor = cursors.get(key)
        if cursor is None or cursor.done:  # fetched past its stop, or already held
            continue
        offset, stop = msg.offset(), cursor.stop
        if (err := msg.error()) is not None and err.code() == KafkaError._AUTO_OFFSET_RESET:
            _outside_the_log(consumer, cursors, key, outbox)
            continue
        if err is not None:  # the log's end: no record, but the position moves past markers
            end_of_log(outbox.flow, msg)
            _first_event(cursor, offset)
            cursor.next = max(cursor.next, offset)
            cursor.done = stop is not None and cursor.next >= stop
            continue
        if stop is not None and offset >= stop:
            cursor.done = True
            continue
        if cursor.seen and offset < cursor.next:
            went_back(cursors, key, offset, outbox)
            if cursor.done:  # a range of one life ends there
                continue
        _first_event(cursor, offset)
        cursor.next = offset + 1
        taken += 1
        if not outbox.send(msg, key, offset, cursor.landing) or (stop is not None and cursor.next >= stop):
            cursor.done = True
    outbox.producer.poll(0)  # serve delivery reports as we go, so they do not pile up until the flush
    outbox.raise_failures()  # a delivery failed for the target: stop sending before later records land ahead of it
    # A partition refused mid-copy sends no more: only what was in flight lands past the refused record.
    if outbox.refusals_pending:
        _hold_refused(cursors, outbox)
    return taken


def _rewind(consumer: Consumer, cursors: Mapping[Partition, Cursor], unread: list[Record]) -> None:
    """Move each partition of records fetched but not passed on back to its cursor, so they are read again."""
    for key in {(m.topic(), m.partition()) for m in unread}:
        cursor = cursors.get(key)
        if cursor is not None and not cursor.done:
            consumer.seek(TopicPartition(key[0], key[1], cursor.next))


def _first_event(cursor: Cursor, offset: int) -> None:
    """The first event read fixes where the landing starts: past its start, retention deleted what lay between (the
    ledger reports it)."""
    if not cursor.seen:
        cursor.seen = True
        cursor.landing.first_offset = offset if cursor.stop is None else min(offset, cursor.stop)


def _outside_the_log(consumer: Consumer, cursors: Mapping[Partition, Cursor], key: Partition, outbox: Outbox) -> None:
    """The partition's position lies outside its log now: move to the log start. Below it, retention deleted what
    lay between: a landing of its own starts at the log start (the ledger reports the gap from the one before). Past
    the log's end, its offsets went backwards."""
    cursor = cursors[key]
    low, high = consumer.get_watermark_offsets(TopicPartition(*key), timeout=METADATA_WAIT_S, cached=False)
    if cursor.next > high:
        went_back(cursors, key, low, outbox)
    elif cursor.seen:
        _deliver_sent(cursors, outbox)
        cursor.landing.end_offset = cursor.next
        cursor.retired.append(cursor.landing)
        cursor.landing = Landing(key[0], key[1], low, low)
    else:
        _first_event(cursor, low)
    cursor.next = low
    cursor.done = cursor.done or (cursor.stop is not None and low >= cursor.stop)
    if not cursor.done:  # a partition stopped by this error takes no seek: it is assigned again where it goes on
        consumer.incremental_unassign([TopicPartition(*key)])
        consumer.incremental_assign([TopicPartition(key[0], key[1], low)])


def went_back(cursors: Mapping[Partition, Cursor], key: Partition, offset: int, outbox: Outbox) -> None:
    """Deliver what was sent, retire the partition's landing where it stood, and start one that says it went back."""
    cursor = cursors[key]
    _deliver_sent(cursors, outbox)
    cursor.landing.end_offset = cursor.next
    cursor.retired.append(cursor.landing)
    cursor.landing = Landing(key[0], key[1], offset, offset, reset_from=cursor.next)
    if cursor.one_life:
        cursor.next = cursor.stop = offset
        cursor.done = True


def _deliver_sent(cursors: Mapping[Partition, Cursor], outbox: Outbox) -> None:
    """Let what was sent land in the landings it was sent under, before one is retired; a partition a refusal among
    them holds reads no further (as after `copy_some`'s own settling), so nothing of it lands past the refusal."""
    outbox.flush(300)
    _hold_refused(cursors, outbox)


def _hold_refused(cursors: Mapping[Partition, Cursor], outbox: Outbox) -> None:
    """Settle the refusals reported so far; the partitions they hold read no further."""
    for held in outbox.settle():
        if held in cursors:
            cursors[held].done = True


def end_of_log(flow: FlowConfig, msg: Record) -> None:
    """Pass a consumed event that is the end of a partition's log (or a record); any other read error fails."""
    err = msg.error()
    if err is not None and err.code() != KafkaError._PARTITION_EOF:
        raise DeliveryFailed(read_error(flow, (msg.topic(), msg.partition()), err.str()))


def read_error(flow: FlowConfig, source: Partition, reason: str) -> str:
    """What a failed read of a source partition says."""
    return f"flow {flow.name}: reading {source[0]}[{source[1]}]: {reason}"


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
    In a slot's transaction (`in_transaction`), a record the broker refuses for size fails the transaction instead:
    the caller aborts it and copies again as `Retries` says; and a transaction reports when it is `full`.
    """

    def __init__(
        self, flow: FlowConfig, producer: Producer, landing_of: Callable[[Partition], Landing],
        rules: TargetRules | None = None, *, in_transaction: bool = False, retries: Retries | None = None,
    ) -> None:  # fmt: skip
        self.flow = flow
        # Whether `producer` writes in a slot's transactions: then a refusal by the broker fails the open transaction,
        # and `retries` (the caller's, kept across its attempts) say how the next attempt writes the refused records.
        self.in_transaction = in_transaction
        self.retries = retries if retries is not None else Retries()
        self.carried = 0  # bytes of records sent in the open transaction, since `began`
        self.opened = time.monotonic()
        self._suspects: dict[Partition, tuple[int, int]] = {}  # the largest record of a refused batch: (size, offset)
        self._doomed: set[Partition] = set()  # refused in the open transaction, which can only be aborted now
        self._lost = False  # the open transaction failed without a refusal of its own (see `refused`)
        self._dead_letters_waiting = 0  # dead letters sent, their delivery not reported yet
        self._dead_letter_errors: list[str] = []
        self.producer = producer
        self.landing_of = landing_of
        self.rules = rules or TargetRules()
        self.in_flight: dict[Partition, collections.deque[int]] = {}  # per source partition
        # The headers each record in flight was sent with, beside `in_flight`: a delivery report carries none, and a
        # record it refuses is dead-lettered with them (as every core does, by the contract).
        self._sent_headers: dict[Partition, collections.deque[Headers | None]] = {}
        # source -> (target topic, in flight, their headers, what the target topic refuses that a record shows)
        self._targets: dict[
            Partition, tuple[str, collections.deque[int], collections.deque[Headers | None], TargetRule | None]
        ] = {}
        self._sources: dict[Partition, Partition] = {}  # target partition -> source partition
        self._refused: list[Refused] = []
        self._blocked: list[tuple[Partition, int, str]] = []  # (source partition, offset, error): refused for its topic
        self._failures: list[str] = []
        # Source partitions a delivery report refused a record of since `take_refused`: in a transaction any such
        # report aborts all of it (spark_app.transactions), so the slot knows which partitions to hold.
        self._refused_partitions: set[Partition] = set()
        self._fatal = False  # a failure librdkafka calls fatal: the producer is unusable from then on
        self._fenced = False  # a newer attempt of the slot started (spark_app.transactions): this one is a zombie
        self._replication = replication_policy(flow)
        self._stamp = self._replication.stamps  # and drop the target's echoes
        self._produce_now = producer.produce  # looked up once: `send` runs for every record
        self._on_delivery = self.delivered

    def open(self, source: Partition) -> None:
        """Get ready to send records of a source partition."""
        out_topic = target_topic(self.flow, source[0])
        queue = self.in_flight.setdefault(source, collections.deque())
        sent_headers = self._sent_headers.setdefault(source, collections.deque())
        self._targets[source] = (out_topic, queue, sent_headers, self.rules.topics.get(source[0]))
        self._sources[(out_topic, source[1])] = source

    def send(self, msg: Record, source: Partition, offset: int, landing: Landing) -> bool:
        """Send one record (at `offset`) of an open partition `source`, or drop it as an echo; False when the target's
        cap refused it and no dead-letter topic takes it, so its partition holds from it and nothing after it may be
        sent."""
        value, headers = msg.value(), msg.headers()
        if self._stamp:
            stamp = next((v for k, v in headers or () if k == PROVENANCE_HEADER), None)
            came_from = origin(stamp) if stamp is not None else None
            if self._replication.drops(came_from):
                assert came_from is not None  # drops says it is a provenance value
                landing.dropped += 1
                landing.echoed(offset, came_from[1])
                return True
            if stamp is None:
                stamp_header = (PROVENANCE_HEADER, provenance(self.flow.source, offset))
                headers = [*headers, stamp_header] if headers else [stamp_header]
        key, ts = msg.key(), msg.timestamp()[1]
        out_topic, queue, sent_headers, rule = self._targets[source]
        if rule is not None and (refusal := rule.refusal(key, ts)) is not None:
            landing.hold(offset, error=f"target '{self.flow.target}' would refuse it: {refusal}; fix it on the target")
            return False
        alone = False
        if self.retries:  # what an earlier attempt of the transaction learnt from the broker's refusals
            if offset in self.retries.dead.get(source, ()):
                self._dead_letter_one(Refused(source[0], source[1], offset, key, value, headers, ts))
                landing.dead_lettered += 1
                return True
            alone = offset in self.retries.alone.get(source, ())
            if alone:  # what was sent before it goes in batches of its own
                self.flush(FLUSH_S)
        try:
            self._produce_now(
                out_topic, value=value, key=key, partition=source[1], timestamp=ts, headers=headers,
                on_delivery=self._on_delivery,
            )  # fmt: skip
        except (BufferError, KafkaException):  # queue full, or refused at once: the slow path decides
            refused = self._produce(out_topic, source[1], key, value, headers, ts)
            if refused is not None and refused.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                landing.hold(offset, error=self._refusal(refused))  # for its topic: the others go on
                return False
            if refused is not None:
                self._refused.append(Refused(source[0], source[1], offset, key, value, headers, ts))
                if not self.flow.dead_letter_topic:
                    landing.hold(offset, len(value or b""))
                    return False
                return True
        queue.append(offset)
        sent_headers.append(headers)
        size = (len(key) if key else 0) + (len(value) if value else 0)
        landing.records += 1
        landing.bytes += size
        self.carried += size
        if alone:  # and nothing sent after it joins its batch
            self.flush(FLUSH_S)
        return True

    @property
    def full(self) -> bool:
        """Whether the open transaction carried what one may (TXN_BYTES, or TXN_OPEN_S since `began`): it is to be
        committed before more is sent. Never without transactions."""
        return self.in_transaction and (self.carried >= TXN_BYTES or time.monotonic() - self.opened >= TXN_OPEN_S)

    def transaction_room(self) -> tuple[float, int]:
        """What the open transaction may still carry before it is `full`: seconds, and bytes of records (the compiled
        core copies a transaction's worth by them)."""
        return max(0.0, TXN_OPEN_S - (time.monotonic() - self.opened)), max(0, TXN_BYTES - self.carried)

    def began(self) -> None:
        """A new transaction of the slot began: it has carried nothing yet."""
        self.carried, self.opened = 0, time.monotonic()

    def delivered(self, err: KafkaError | None, report: Message) -> None:
        msg = cast(Record, report)
        source = self._sources[(msg.topic(), msg.partition())]
        offset = self.in_flight[source].popleft()
        headers = self._sent_headers[source].popleft()
        landing = self.landing_of(source)
        if err is None:
            landing.landed(offset, msg.offset())
            kind, ts = msg.timestamp()
            if kind == TIMESTAMP_CREATE_TIME:  # an append-time target has replaced the source's timestamp
                latency_ms = max(0.0, time.time() * 1000 - ts)
                landing.latency_counts[bisect_left(LATENCY_BOUNDS_MS, latency_ms)] += 1
                landing.latency_sum_ms += latency_ms
        else:
            self.refused(err, Refused.of(source[0], offset, msg, headers), f"{msg.topic()}[{msg.partition()}]")

    def refused(self, err: KafkaError, record: Refused, where: str) -> None:
        """File a delivery report's error for `record` (written to `where` on the target): a record too large or
        refused for its topic waits for `settle`; any other error fails the task at the next `raise_failures`. The
        compiled core (spark_app.compiled_copy) files its producer's errors here too."""
        source = (record.topic, record.partition)
        if err.code() in PURGED:  # the mirror's own doing: not landed, and no failure of its own
            return
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE and self.in_transaction:
            self._refused_partitions.add(source)
            self._refused_in_transaction(record)
        elif err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            self._refused.append(record)
            self._refused_partitions.add(source)
        elif err.code() in TOPIC_SCOPED_ERRORS:
            self._blocked.append((source, record.offset, self._refusal(err)))
            self._refused_partitions.add(source)
        elif self.in_transaction and err.code() == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER:
            # The transaction after one the broker refused a batch of: librdkafka's sequence numbers went past the
            # refused batch, which the broker never took. Aborting it bumps the producer's epoch; it is copied again.
            self._lost = True
            self._doomed.add(source)
        else:
            self._failures.append(f"{where} offset {record.offset}: {err.name()}: {err.str()}")
            self._fatal = self._fatal or err.fatal()
            self._fenced = self._fenced or err.code() in FENCED_ERRORS

    def _refused_in_transaction(self, record: Refused) -> None:
        """The broker refused a record for size inside a transaction, which failed the transaction: the record and its
        batch are to be copied again (`Retries`). Refused alone, it is too large for the target: the next attempt
        dead-letters it, or its partition holds from it (`settle`). Refused in a batch, it may only have been too large
        with the others: the largest record of the batch goes alone next time."""
        source = (record.topic, record.partition)
        self._doomed.add(source)
        if record.offset in self.retries.alone.get(source, ()):
            if self.flow.dead_letter_topic:
                self.retries.dead.setdefault(source, set()).add(record.offset)
            else:
                self._refused.append(record)
            return
        size = len(record.key or b"") + len(record.value or b"")
        if source not in self._suspects or size > self._suspects[source][0]:
            self._suspects[source] = (size, record.offset)

    def _refusal(self, err: KafkaError) -> str:
        return f"target '{self.flow.target}' refused it ({err.name()}: {err.str()}); fix it on the target"

    def flush(self, timeout_s: float) -> None:
        """Wait for every record in flight; fail the task if one is not delivered or failed for the target."""
        remaining = self.producer.flush(timeout_s)
        if remaining:
            raise DeliveryFailed(f"flow {self.flow.name}: {remaining} undelivered; first errors: {self._failures[:3]}")
        self.raise_failures()

    @property
    def failed(self) -> bool:
        """Whether a delivery failed for the target (not for one topic)."""
        return bool(self._failures)

    def raise_failures(self) -> None:
        """Fail the task if a delivery failed for the target (not for one topic): nothing past that record may be
        reported as copied, so the task's retry resumes before it.

        What the producer still queues is purged first, so records after the failed one (a timeout after a long
        target outage, an idempotence error) are not written ahead of its retry; only those already in flight can
        be. A producer whose error was fatal (librdkafka stops it: an idempotence sequence it cannot recover) is
        dropped from the process's clients, so the retry gets a new one."""
        if not self._failures:
            return
        self.producer.purge(in_queue=True, in_flight=False)
        self.producer.poll(0)  # the purged records' reports: none of them counts as landed
        if self._fatal:
            clients.discard_producer(self.producer)
        failed = Fenced if self._fenced else DeliveryFailed
        raise failed(f"flow {self.flow.name}: delivery failed; first errors: {self._failures[:3]}")

    def take_refused(self) -> set[Partition]:
        """The source partitions a delivery report refused a record of since the last call."""
        for source, (_, offset) in self._suspects.items():
            self.retries.alone.setdefault(source, set()).add(offset)
        self._suspects = {}
        taken, self._refused_partitions, self._lost = self._refused_partitions, set(), False
        return taken

    @property
    def transaction_lost(self) -> bool:
        """Whether a delivery report since the last `take_refused` failed the open transaction: a record refused, or
        the producer's sequence out of order after such a refusal (the transaction is to be aborted and copied
        again)."""
        return bool(self._refused_partitions) or self._lost

    @property
    def delivery_refused(self) -> bool:
        """Whether a delivery report refused a record since the last `take_refused`: in a transaction, that failed it
        (a record librdkafka refuses before sending it fails nothing)."""
        return bool(self._refused_partitions)

    @property
    def refusals_pending(self) -> bool:
        """Whether a delivery report refused a record that `settle` has not acted on yet."""
        return bool(self._refused or self._blocked or self._doomed)

    def settle(self) -> set[Partition]:
        """Act on the refusals reported so far (see the class); returns the source partitions now held. Dead letters
        are flushed, and delivery reports that arrive meanwhile are settled too."""
        held, self._doomed = self._doomed, set()  # their transaction is lost: they read no further in it
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
    ) -> KafkaError | None:
        """Hand one record to the producer; the error when librdkafka refuses it before sending, for size or for its
        topic (TOPIC_SCOPED_ERRORS: a write ACL removed shows here once the metadata says so).

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
                return None
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as err:
                code = err.args[0].code()
                if code == KafkaError.MSG_SIZE_TOO_LARGE or code in TOPIC_SCOPED_ERRORS:
                    return cast(KafkaError, err.args[0])
                if code == KafkaError._STATE:  # only a transactional producer has a state that refuses records
                    raise TransactionFailed(f"flow {self.flow.name}: {err.args[0].str()}") from None
                if code != KafkaError._UNKNOWN_PARTITION or time.monotonic() > deadline:
                    raise
                self.producer.list_topics(topic, timeout=10)
                time.sleep(0.2)

    def _dead_letter(self, refused: list[Refused]) -> None:
        """Write each refused record's dead letter. In a transaction its commit waits for them; without, they are
        waited for here (their partitions' positions may be reported next), as long as the producer delivers
        anything: on a slow target they queue behind what was sent before them."""
        for r in refused:
            self._dead_letter_one(r)
            self.landing_of((r.topic, r.partition)).dead_lettered += 1
        if self.in_transaction:
            return
        queued, moved = len(self.producer), time.monotonic()
        while self._dead_letters_waiting > 0 and not self._dead_letter_errors:
            self.producer.poll(0.1)
            now_queued = len(self.producer)
            if now_queued < queued:
                moved = time.monotonic()
            queued = now_queued
            if time.monotonic() - moved > DEAD_LETTER_STALL_S:
                raise DeliveryFailed(f"flow {self.flow.name}: dead-letter writes failed: nothing was delivered for"
                                     f" {DEAD_LETTER_STALL_S:.0f} s")  # fmt: skip
        if self._dead_letter_errors:
            raise DeliveryFailed(f"flow {self.flow.name}: dead-letter writes failed: {self._dead_letter_errors[:3]}")

    def _dead_letter_one(self, r: Refused) -> None:
        """Send the dead letter of one record too large for the target, waiting for room in the producer's queue.
        In a transaction the broker refused something of already, it waits for the transaction's next attempt
        (`Retries`), and its partition reads no further in this one."""
        value = r.value or b""
        coordinates: Headers = [
            (f"{DLQ_PREFIX}topic", r.topic.encode()),
            (f"{DLQ_PREFIX}partition", str(r.partition).encode()),
            (f"{DLQ_PREFIX}offset", str(r.offset).encode()),
            (f"{DLQ_PREFIX}timestamp", str(r.timestamp).encode()),
            (f"{DLQ_PREFIX}size", str(len(value)).encode()),
            (f"{DLQ_PREFIX}error", b"MSG_SIZE_TOO_LARGE"),
        ]
        self._dead_letters_waiting += 1
        while True:
            try:
                # The value itself did not fit this cluster, so the dead letter carries the coordinates to fetch it.
                self.producer.produce(
                    self.flow.dead_letter_topic or "", key=r.key, value=None,
                    headers=list(r.headers or []) + coordinates, on_delivery=self._dead_letter_delivered,
                )  # fmt: skip
                return
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as err:
                self._dead_letters_waiting -= 1
                if err.args[0].code() != KafkaError._STATE or not self.in_transaction:
                    raise
                # The transaction failed already (or was aborted): it is copied again, with this dead letter in it.
                source = (r.topic, r.partition)
                self.retries.dead.setdefault(source, set()).add(r.offset)
                self._refused_partitions.add(source)
                self._doomed.add(source)
                return

    def _dead_letter_delivered(self, err: KafkaError | None, _report: Message) -> None:
        self._dead_letters_waiting -= 1
        if err is not None and err.code() not in PURGED:
            self._dead_letter_errors.append(err.str())
            self._failures.append(f"dead letter: {err.name()}: {err.str()}")


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
    def of(cls, source_topic: str, offset: int, report: Record, headers: Headers | None) -> Refused:
        """From a delivery report the broker refused, and the headers its record was sent with (the report has
        none)."""
        return cls(source_topic, report.partition(), offset, report.key(), report.value(), headers,
                   report.timestamp()[1])  # fmt: skip
