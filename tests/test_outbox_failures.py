"""A delivery that fails for the target stops the copy at once: what the producer still queues is purged, so no
later record is written ahead of the failed one's retry, and the error says what failed by name."""

from __future__ import annotations

import pytest

from bench.testbed.clients import plaintext, producer
from spark_app.config import FlowConfig, TopicSelection
from spark_app.errors import DeliveryFailed
from spark_app.outbox import Outbox
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
    assert len(writer) == 0, "nothing is left queued to be written after the failed record"
    assert landing.last_target_offset < 0, "and none of it counts as landed"
