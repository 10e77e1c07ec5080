"""A flow's first topic sync outlives a transient error, as later rounds do, and stops at once on any other."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from spark_app import mirror


class Flow:
    """Answers topic sync with the errors given, then with its subscription."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors = list(errors)
        self.flow = SimpleNamespace(name="f")
        self.calls = 0

    def sync_topics(self) -> Any:
        self.calls += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))
        return (("orders", 4),)


def test_a_first_topic_sync_that_waits_for_a_controller_is_tried_again(monkeypatch):
    monkeypatch.setattr(mirror, "FIRST_SYNC_RETRY_S", 0.01)
    waiting = KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller: Local: Timed out")
    flow = Flow(waiting, waiting)
    assert mirror.first_topic_sync(flow, threading.Event()) == (("orders", 4),)  # type: ignore[arg-type]
    assert flow.calls == 3


def test_a_first_topic_sync_refused_for_good_stops_at_once():
    flow = Flow(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed"))
    with pytest.raises(KafkaException, match="not allowed"):
        mirror.first_topic_sync(flow, threading.Event())  # type: ignore[arg-type]
    assert flow.calls == 1


def test_a_first_topic_sync_still_failing_past_the_give_up_time_stops(monkeypatch):
    monkeypatch.setattr(mirror, "FIRST_SYNC_RETRY_S", 0.01)
    monkeypatch.setattr(mirror, "UNREACHABLE_GIVE_UP_S", 0.05)
    flow = Flow(*[KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for controller")] * 1_000)
    with pytest.raises(KafkaException, match="waiting for controller"):
        mirror.first_topic_sync(flow, threading.Event())  # type: ignore[arg-type]
    assert 1 < flow.calls < 1_000
