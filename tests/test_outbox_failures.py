"""A delivery that fails for the target stops the copy at once: what the producer still queues is purged, so no
later record is written ahead of the failed one's retry, and the error says what failed by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError

from bench.testbed.clients import plaintext, producer
from spark_app import outbox as outbox_module
from spark_app.config import FlowConfig, TopicSelection
from spark_app.errors import DeliveryFailed
from spark_app.outbox import Cursor, Outbox, Refused, _outside_the_log
from spark_app.ranges import Landing

FLOW = FlowConfig(source="a", target="b", topics=TopicSelection(include=["t"]), checkpoint_location="/tmp/x")


class Consumed:
    """A consumed record, as `Outbox.send` reads it."""

    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v" * 100

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def test_a_timed_out_delivery_purges_what_is_queued_behind_it_and_fails_naming_the_error():
    # No broker answers here: the first records time out while later ones still wait in the producer's queue.
    writer = producer(plaintext("127.0.0.1:1"), {"message.timeout.ms": 300, "linger.ms": 0, "log_level": 0})
    landing = Landing("t", 0, 0, 0)
    outbox = Outbox(FLOW, writer, lambda _key: landing)
    outbox.open(("t", 0))
    for offset in range(10):
        assert outbox.send(Consumed(offset), ("t", 0), offset, landing)  # type: ignore[arg-type]
    while not outbox.failed:
        writer.poll(0.05)
    for offset in range(10, 50):  # queued behind the failed ones, their own timeout still far off
        assert outbox.send(Consumed(offset), ("t", 0), offset, landing)  # type: ignore[arg-type]
    assert len(writer) >= 40, "queued behind the failed ones"
    with pytest.raises(DeliveryFailed, match="_MSG_TIMED_OUT"):
        outbox.raise_failures()
    # The purged records' reports may still be on their way (a busy machine): serve them for a moment, far less than
    # the 300 ms a record queued behind the failed ones would wait before its own timeout emptied the queue anyway.
    assert writer.flush(0.05) == 0, "nothing is left queued to be written after the failed record"
    assert landing.last_target_offset < 0, "and none of it counts as landed"


class Watermarks:
    """A consumer as `_outside_the_log` uses it: the partition's log bounds now, and its re-assignment."""

    def __init__(self, low: int, high: int) -> None:
        self.bounds = (low, high)
        self.assigned: list[tuple[str, int, int]] = []

    def get_watermark_offsets(self, _tp, timeout, cached) -> tuple[int, int]:
        return self.bounds

    def incremental_unassign(self, _tps) -> None:
        pass

    def incremental_assign(self, tps) -> None:
        self.assigned += [(tp.topic, tp.partition, tp.offset) for tp in tps]


def test_a_refusal_settled_while_another_partition_moves_past_retention_still_holds_its_own_partition():
    """Moving a partition to its log start first delivers what was sent; a refusal among those deliveries holds its
    partition there and then, or records after it would land before its catch-up."""
    cursors = {("t", 0): Cursor(Landing("t", 0, 5, 5), 10, seen=True),
               ("t", 1): Cursor(Landing("t", 1, 0, 0), 3, seen=True)}  # fmt: skip
    outbox = SimpleNamespace(flush=lambda _timeout: 0, settle=lambda: {("t", 1)})
    consumer = Watermarks(20, 50)
    _outside_the_log(consumer, cursors, ("t", 0), outbox)  # type: ignore[arg-type]
    assert cursors[("t", 1)].done, "the refused partition reads no further"
    moved = cursors[("t", 0)]
    assert not moved.done and moved.next == 20 and consumer.assigned == [("t", 0, 20)]
    assert [(r.first_offset, r.end_offset) for r in moved.retired] == [(5, 10)] and moved.landing.first_offset == 20


class SlowTarget:
    """A producer in front of a slow target that keeps moving: each second of `poll` or `flush` delivers `rate`
    records of its queue, in order (no time passes: the target's pace is counted in the seconds asked for)."""

    def __init__(self, queued: int, rate: float) -> None:
        self.queue: list[object] = [lambda: None] * queued
        self.rate = rate
        self._owed = 0.0

    def __len__(self) -> int:
        return len(self.queue)

    def produce(self, _topic, *, on_delivery, **_record) -> None:
        self.queue.append(lambda: on_delivery(None, None))

    def poll(self, timeout: float) -> int:
        self._owed += self.rate * timeout
        served = 0
        while self.queue and self._owed >= 1:
            self._owed -= 1
            self.queue.pop(0)()
            served += 1
        return served

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self.queue)


def too_large(offset: int) -> Refused:
    return Refused("t", 0, offset, b"k", b"v" * 2_000_000, None, 1_700_000_000_000)


def test_a_dead_letter_waits_for_a_slow_target_that_keeps_moving_however_long_it_takes():
    """500 records queued ahead of the dead letter, and a target that takes 5 a second: 100 s of writes, more than any
    fixed wait; the dead letter lands, and the copy goes on."""
    dead_letters = FLOW.model_copy(update={"dead_letter_topic": "dlq"})
    landing = Landing("t", 0, 0, 0)
    target = SlowTarget(queued=500, rate=5)
    outbox = Outbox(dead_letters, target, lambda _key: landing)  # type: ignore[arg-type]
    outbox.refused(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), too_large(7), "t[0]")
    assert outbox.settle() == set(), "nothing held: the record is a dead letter"
    assert len(target) == 0 and landing.dead_lettered == 1 and landing.held_from < 0


def test_a_dead_letter_fails_the_copy_once_the_target_delivers_nothing_at_all(monkeypatch):
    monkeypatch.setattr(outbox_module, "DEAD_LETTER_STALL_S", 0.2)
    dead_letters = FLOW.model_copy(update={"dead_letter_topic": "dlq"})
    landing = Landing("t", 0, 0, 0)
    outbox = Outbox(dead_letters, SlowTarget(queued=10, rate=0), lambda _key: landing)  # type: ignore[arg-type]
    outbox.refused(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), too_large(7), "t[0]")
    with pytest.raises(DeliveryFailed, match="dead-letter writes failed"):
        outbox.settle()
