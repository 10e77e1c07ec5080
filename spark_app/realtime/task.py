"""A real-time copier task: what each long-running Spark task runs, and its side of the report channel.

A task asks the driver which source partitions it copies and from where (an `Assignment`), reads them with one
librdkafka consumer, and writes each record as it comes through the per-record path (spark_app.outbox) with a
producer linger of a few milliseconds. Every REPORT_S it sends the driver one landing per partition, covering its
offsets since the last report up to the first record not delivered yet, until the driver says STOP or (an
available-now run) every partition reached its stop. The channel (spark_app.realtime.channel) carries JSON messages,
authenticated with a key made for the job's run.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from .. import clients
from ..clients import Partition
from ..config import ClusterConfig, FlowConfig
from ..outbox import CONSUMER_DEFAULTS, Cursor, Outbox, copy_some, producer_settings
from ..ranges import Landing
from ..topics import TargetRules
from . import channel
from .channel import Channel

REPORT_S = 0.5  # how often a task tells the driver where its partitions stand
# A task's consumer returns what it has after at most this long, so a record waits for at most that before it is sent.
CONSUME_WAIT_S = 0.005
CONSUME_BATCH = 2_000
# The producer sends what it holds after this long: a few ms buys batches of a few records per partition at
# 10,000 records/s (bench/) without adding latency users see.
LINGER_MS = 2
# End-of-log events tell an available-now run where each partition ends (past transaction markers); a continuous run
# has no use for them, and they cost about a tenth more events at a steady rate.
CONSUMER_SETTINGS = CONSUMER_DEFAULTS | {"group.id": "mirrorkit-realtime", "enable.partition.eof": False}
# The channel's messages, as JSON. Task to driver: [HELLO, slot], then [LANDED, rows] per report and [DONE, rows] at
# the end, each row a landing's `to_row`. Driver to task: the `Assignment`'s `to_json`, then at most STOP.
HELLO, LANDED, DONE, STOP = "hello", "landed", "done", "stop"


@dataclass(frozen=True)
class Assignment:
    """What one task copies: per source partition where it starts, and for `run --available-now` where it stops."""

    starts: dict[Partition, int]
    stops: dict[Partition, int] | None

    def to_json(self) -> dict[str, Any]:
        """As the channel carries it: each partition as [[topic, partition], offset]."""
        stops = None if self.stops is None else _offsets_to_json(self.stops)
        return {"starts": _offsets_to_json(self.starts), "stops": stops}

    @classmethod
    def from_json(cls, value: Any) -> Assignment:
        stops = value["stops"]
        return cls(_offsets_from_json(value["starts"]), None if stops is None else _offsets_from_json(stops))


def _offsets_to_json(offsets: dict[Partition, int]) -> list[list[Any]]:
    return [[list(key), offset] for key, offset in offsets.items()]


def _offsets_from_json(pairs: Any) -> dict[Partition, int]:
    return {(topic, partition): offset for (topic, partition), offset in pairs}


class CopierTask:
    """What each real-time Spark task runs (picklable): copy what the driver assigns until it says stop."""

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, address: tuple[str, int],
        key: bytes, rules: TargetRules,
    ) -> None:  # fmt: skip
        self.flow = flow
        self.source = source
        self.target = target
        self.address = address
        self.key = key
        self.rules = rules
        self.producer_settings = producer_settings(rules) | {"linger.ms": LINGER_MS}

    def __call__(self, slot: int, _rows: Iterable[int]) -> Iterator[int]:
        with channel.connect(self.address, self.key) as conn:
            yield LiveCopy(self, hello(conn, slot)).run(conn)


def hello(conn: Channel, slot: int) -> Assignment:
    """Tell the driver which task this is, and hear what it copies."""
    conn.send([HELLO, slot])
    return Assignment.from_json(conn.recv())


class LiveCopy:
    """One task's copy loop over its assigned partitions."""

    def __init__(self, task: CopierTask, assignment: Assignment) -> None:
        self.flow = task.flow
        self.task = task
        stops = assignment.stops or {}
        self.cursors = {
            key: Cursor(
                Landing(key[0], key[1], start, start), start, stops.get(key), done=start >= stops.get(key, start + 1)
            )
            for key, start in assignment.starts.items()
        }
        self.copied = 0
        self._reported: set[Partition] = set()
        self._held_from: dict[Partition, int] = {}  # the first offset held back: nothing from there on is reported

    def run(self, conn: Channel) -> int:
        """Copy until every partition reached its stop (available-now) or the driver says stop; returns the count."""
        producer = clients.shared_producer(self.task.target, self.task.producer_settings)
        eof = {"enable.partition.eof": any(c.stop is not None for c in self.cursors.values())}
        consumer = clients.consumer(self.task.source, CONSUMER_SETTINGS | eof)  # its own: a task pauses what it holds
        outbox = Outbox(self.flow, producer, lambda key: self.cursors[key].landing, self.task.rules)
        for key in self.cursors:
            outbox.open(key)
        open_ = {key: c for key, c in sorted(self.cursors.items()) if not c.done}
        consumer.assign([TopicPartition(t, p, c.next) for (t, p), c in open_.items()])
        report_at = time.monotonic() + REPORT_S
        stopped = False
        try:
            while open_ and not stopped:
                self.copied += copy_some(consumer, open_, outbox, CONSUME_BATCH, CONSUME_WAIT_S)
                if time.monotonic() >= report_at:
                    report_at = time.monotonic() + REPORT_S
                    self._hold(outbox.settle())
                    outbox.raise_failures()
                    self._send_report(conn, LANDED, outbox)
                    stopped = conn.poll() and conn.recv() == STOP
                open_ = _still_open(open_, consumer)
            outbox.flush(300)
            self._hold(outbox.settle())
        finally:
            consumer.close()
        self._send_report(conn, DONE, outbox)
        return self.copied

    def _send_report(self, conn: Channel, kind: str, outbox: Outbox) -> None:
        conn.send([kind, [row.to_row() for row in self._report(outbox)]])

    def _hold(self, held: set[Partition]) -> None:
        """Partitions refused by the target after later records were sent: read no further."""
        for key in held:
            self.cursors[key].done = True

    def _report(self, outbox: Outbox) -> list[Landing]:
        """Each partition's landing up to its first record not delivered yet; each goes on with a new landing."""
        rows = []
        for key, cursor in self.cursors.items():
            rows += cursor.retired
            cursor.retired = []
            landing = cursor.landing
            in_flight = outbox.in_flight.get(key)
            landing.end_offset = in_flight[0] if in_flight else cursor.next
            if landing.held_from >= 0:  # nothing from there on is read: the hold is its first offset only
                self._held_from[key] = min(landing.held_from, self._held_from.get(key, landing.held_from))
                landing.held_until = self._held_from[key]
            if key in self._held_from:
                landing.end_offset = min(landing.end_offset, self._held_from[key])
            if key not in self._reported or _changed(landing):
                rows.append(landing)
                cursor.landing = Landing(key[0], key[1], landing.end_offset, landing.end_offset)
            self._reported.add(key)
        return rows


def _still_open(open_: dict[Partition, Cursor], consumer: Consumer) -> dict[Partition, Cursor]:
    """The open partitions that are not done; the consumer stops fetching those that are."""
    done = [TopicPartition(*key) for key, c in open_.items() if c.done]
    if not done:
        return open_
    consumer.pause(done)
    return {key: c for key, c in open_.items() if not c.done}


def _changed(landing: Landing) -> bool:
    """Whether a landing says anything a position, a count or a hold does not already."""
    return (
        landing.end_offset != landing.first_offset
        or landing.records + landing.dropped + landing.dead_lettered > 0
        or bool(landing.runs)
        or landing.held_from >= 0
        or landing.reset_from >= 0
    )
