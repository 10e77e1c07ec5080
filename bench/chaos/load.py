"""The generator: keyed records with a sequence number per partition, on plain, transactional and compacted topics,
at a steady rate, and what each topic's partitions acknowledged.

Each record's value names it (`<topic>:<partition>:<seq>`), so the checker finds every copy on the target by value,
whatever offsets it landed at. A few records of the plain topic carry padding after the name (`|xxx…`), large
enough for a target cap the nemesis lowers to refuse them; while the nemesis asks, a share of them carry a timestamp
from the past, as a backlog's records do, for a timestamp bound it lowers on the target to refuse. A record counts as
sent once its delivery report (or, on the transactional topic, its transaction's commit) says so; aborted
transactions put records the source never shows to read_committed readers.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Self

from confluent_kafka import KafkaException, Message, Producer

from bench.testbed import clients
from spark_app.config import ClusterConfig

TXN_RECORDS = 20  # records per transaction: a commit marker after each, as Kafka Streams' exactly-once leaves
ABORT_EVERY = 7  # one transaction in this many is aborted
NO_KEY_SHARE = 0.05  # records of the plain topic without a key
PADDED_SHARE = 0.02  # records of the plain topic padded to PADDED_BYTES (over the cap the nemesis may lower)
PADDED_BYTES = 20_000
AGED_SHARE = 0.2  # records of the plain topic stamped in the past while the nemesis asks (`age`)
PLAIN_PRODUCER = {"linger.ms": 5, "enable.idempotence": True, "message.timeout.ms": 20_000}


@dataclass(frozen=True)
class Topics:
    """The topics the generator writes, each with its partition count and role."""

    plain: str
    transactional: str
    compacted: str
    remade: str  # the one the nemesis deletes and makes again
    partitions: int = 2

    @property
    def all(self) -> list[str]:
        return [self.plain, self.transactional, self.compacted, self.remade]


def value_of(topic: str, partition: int, seq: int, padded: bool = False) -> bytes:
    name = f"{topic}:{partition}:{seq}".encode()
    return name + b"|" + b"x" * (PADDED_BYTES - len(name) - 1) if padded else name


class Background:
    """A loop (`_write`) on a thread of its own from `with` until `stop`; `error` says why it ended early."""

    thread_name = "chaos"
    error: str | None = None

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)

    def _run(self) -> None:
        try:
            self._write()
        except BaseException as err:  # noqa: BLE001 - the run's outcome says the loop stopped, and why
            self.error = repr(err)

    def _write(self) -> None:
        raise NotImplementedError


@dataclass
class Load(Background):
    """Writes `rate` records/s across `topics` from a thread until `stop`; `sent` counts what was acknowledged."""

    source: ClusterConfig
    topics: Topics
    rate: int
    seed: int
    # Per partition, each acknowledged record's value with the source offset it was written at.
    sent: dict[tuple[str, int], dict[bytes, int]] = field(default_factory=dict)
    failed: int = 0  # records whose delivery failed (e.g. to the topic while it was deleted)
    txn_restarts: int = 0  # transactional producers replaced after a fatal error
    # Topics the loop leaves alone for now (one made again, left empty), and records per partition to write at once
    # on the loop's next round (its refill), both set by the nemesis.
    paused: set[str] = field(default_factory=set)
    bursts: dict[str, int] = field(default_factory=dict)
    aged_ms: dict[str, int] = field(default_factory=dict)  # topics a share of whose records are stamped this far back
    thread_name = "chaos-load"
    _seq: dict[tuple[str, int], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _in_txn: list[tuple[int, bytes, int]] = field(default_factory=list)  # (partition, value, offset) delivered so far

    def _next(self, topic: str, partition: int, padded: bool = False) -> bytes:
        seq = self._seq.get((topic, partition), 0)
        self._seq[(topic, partition)] = seq + 1
        return value_of(topic, partition, seq, padded)

    def _acked(self, topic: str, partition: int, value: bytes, offset: int) -> None:
        with self._lock:
            self.sent.setdefault((topic, partition), {})[value] = offset

    def acknowledged(self) -> dict[tuple[str, int], dict[bytes, int]]:
        with self._lock:
            return {key: dict(values) for key, values in self.sent.items()}

    def _write(self) -> None:
        rng = random.Random(self.seed)
        plain = clients.producer(self.source, PLAIN_PRODUCER)
        txn: Producer | None = None
        t = self.topics
        per_tick, tick_s = max(1, self.rate // 20), 0.05
        next_tick = time.monotonic()
        in_txn, txn_n = 0, 0
        while not self._stop.is_set():
            for _ in range(per_tick):
                kind = rng.random()
                p = rng.randrange(t.partitions)
                if kind < 0.4:
                    key = None if rng.random() < NO_KEY_SHARE else f"k{rng.randrange(1000)}".encode()
                    age_ms = self.aged_ms.get(t.plain)
                    stamp = int(time.time() * 1000) - age_ms if age_ms and rng.random() < AGED_SHARE else None
                    self._produce(plain, t.plain, p, key, padded=rng.random() < PADDED_SHARE, timestamp_ms=stamp)
                elif kind < 0.6:
                    self._produce(plain, t.compacted, p, f"k{rng.randrange(50)}".encode())
                elif kind < 0.75:
                    if t.remade not in self.paused:
                        self._produce(plain, t.remade, p, f"k{rng.randrange(1000)}".encode())
                else:
                    try:
                        if txn is None:  # a new one fences the one before, and aborts what it left open
                            txn = self._transactional()
                        if not in_txn:
                            txn.begin_transaction()
                            txn_n += 1
                        self._produce(txn, t.transactional, p, f"k{p}".encode())
                        in_txn += 1
                        if in_txn >= TXN_RECORDS:
                            in_txn = 0
                            self._end_transaction(txn, abort=txn_n % ABORT_EVERY == 0)
                    except KafkaException:  # the source down past the transaction's timeout: start over
                        txn, in_txn = None, 0
                        self._in_txn.clear()
                        self.txn_restarts += 1
            self._burst(plain, rng)
            plain.poll(0)
            next_tick += tick_s
            time.sleep(max(0.0, next_tick - time.monotonic()))
        if txn is not None and in_txn:
            self._end_transaction(txn, abort=False)
        plain.flush(60)

    def _burst(self, producer: Producer, rng: random.Random) -> None:
        """Write the refills asked for: `count` records to each partition of the topic, then resume it."""
        with self._lock:
            bursts, self.bursts = self.bursts, {}
        for topic, count in bursts.items():
            for p in range(self.topics.partitions):
                for _ in range(count):
                    self._produce(producer, topic, p, f"k{rng.randrange(1000)}".encode())
                    producer.poll(0)
            self.paused.discard(topic)

    def refill(self, topic: str, count: int) -> None:
        """Ask the loop to write `count` records to each of the topic's partitions at once, and resume it."""
        with self._lock:
            self.bursts[topic] = count

    def age(self, topic: str, by_ms: int | None) -> None:
        """Stamp a share (AGED_SHARE) of the topic's next records `by_ms` in the past, or none again (None)."""
        if by_ms is None:
            self.aged_ms.pop(topic, None)
        else:
            self.aged_ms[topic] = by_ms

    def _transactional(self) -> Producer:
        txn = clients.producer(self.source, {"transactional.id": f"chaos-{self.topics.transactional}",
                                             "linger.ms": 5, "transaction.timeout.ms": 60_000})  # fmt: skip
        txn.init_transactions(60)
        return txn

    def _produce(self, producer: Producer, topic: str, partition: int, key: bytes | None, padded: bool = False,
                 timestamp_ms: int | None = None) -> None:  # fmt: skip
        value = self._next(topic, partition, padded)

        def delivered(err: object, msg: Message) -> None:
            if err is not None:
                self.failed += 1
            elif topic == self.topics.transactional:
                self._in_txn.append((partition, value, msg.offset() or 0))  # sent once its transaction commits
            else:
                self._acked(topic, partition, value, msg.offset() or 0)

        try:
            producer.produce(topic, value, key, partition=partition, on_delivery=delivered, timestamp=timestamp_ms or 0)
        except (BufferError, KafkaException):
            self.failed += 1

    def _end_transaction(self, txn: Producer, abort: bool) -> None:
        """Commit (or abort) the open transaction; its records count as sent once the commit succeeded. A commit
        that fails is aborted, its records never show; one that cannot be aborted either raises, and the caller
        starts over with a new producer."""
        try:
            if abort:
                txn.abort_transaction(60)
            else:
                txn.commit_transaction(60)  # serves every delivery report of the transaction first
        except KafkaException:
            self._in_txn.clear()
            txn.abort_transaction(60)
            return
        if not abort:
            for p, value, offset in self._in_txn:
                self._acked(self.topics.transactional, p, value, offset)
        self._in_txn.clear()


@dataclass
class Groups(Background):
    """Consumer groups of the source that move on at random, committing offsets the mirror's checkpoints translate:
    each commits, every couple of seconds, a random offset between its last one and the partition's end."""

    source: ClusterConfig
    topics: list[str]
    partitions: int
    names: list[str]
    seed: int
    commits: int = 0
    thread_name = "chaos-groups"

    def _write(self) -> None:
        rng = random.Random(self.seed)
        at: dict[tuple[str, str, int], int] = {}
        while not self._stop.wait(2.0):
            try:
                ends = clients.end_offsets(self.source, [(t, p) for t in self.topics for p in range(self.partitions)])
                for group in self.names:
                    for topic in self.topics:
                        offsets = {}
                        for p in range(self.partitions):
                            low = at.get((group, topic, p), 0)
                            end = ends[(topic, p)]
                            if end > low:
                                offsets[p] = at[(group, topic, p)] = rng.randint(low, end)
                        if offsets:
                            clients.commit(self.source, group, topic, offsets)
                            self.commits += 1
            except (KafkaException, AssertionError):  # a broker the nemesis stopped; the next round tries again
                continue
