"""A throughput batch copied in the slot's transactions, against a real broker, when the target refuses what no rule
the mirror knows could judge before sending, and when the target is slow: every record lands once for a
read_committed reader, in order, and the copy never gets stuck.

The target topic's `max.message.bytes` is set on the broker while the mirror's rules do not know it (a cap lowered
between topic syncs), so librdkafka sends the record and the broker refuses it (with the records of its batch), which
fails the open transaction: the copy aborts it and copies again, the record sent alone in its batch, and the one the
broker still refuses goes to the dead-letter topic, or holds its partition from itself. No Spark: `RangeCopier.copy`
runs in a thread of the test, as a task runs it, bounded so a stuck copy fails the test instead of hanging it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from bench.testbed import clients
from bench.testbed.clients import Record
from bench.testbed.toxiproxy import Stream
from spark_app import outbox, transactions
from spark_app.config import ClusterConfig, FlowConfig, TopicSelection
from spark_app.outbox import DLQ_PREFIX
from spark_app.policy import positions_group
from spark_app.range_copy import RangeCopier
from spark_app.ranges import Landing, OffsetRange
from spark_app.topics import TargetRules
from tests.support.assertions import assert_each_record_once_in_order

SMALL = 20  # records before and after the one the broker refuses, on partition 0
CAP = 10_000  # the target topic's max.message.bytes, on the broker only
BIG = 9_990  # alone under the cap by its value, over it with the batch's and the record's overhead


def bounded(copy: Callable[[], list[Landing]], timeout_s: float) -> list[Landing]:
    """Run a copy as a task would, failing the test with what it raised, or if it has not ended in `timeout_s`."""
    result: list[list[Landing]] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(copy())
        except BaseException as err:  # noqa: BLE001 - the test's verdict
            error.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the copy did not end in {timeout_s} s"
    assert not error, f"the copy failed: {error[0]!r}"
    return result[0]


@dataclass(frozen=True)
class Flow:
    source: ClusterConfig
    target: ClusterConfig
    topic: str
    config: FlowConfig

    @property
    def copy_topic(self) -> str:
        return f"a.{self.topic}"


def exactly_once_flow(
    cluster: ClusterConfig, unique: str, target: ClusterConfig | None = None, dead_letter_topic: str | None = None
) -> Flow:
    topic = f"tx-{unique}"
    config = FlowConfig(source="a", target="b", topics=TopicSelection(include=[topic]), checkpoint_location="/unused",
                        exactly_once=True, dead_letter_topic=dead_letter_topic)  # fmt: skip
    source = cluster.model_copy(update={"alias": "a"})
    return Flow(source, (target or cluster).model_copy(update={"alias": "b"}), topic, config)


def sized(partition: int, tag: str, count: int, size: int = 100) -> list[Record]:
    return [Record(partition, f"{tag}{i}".encode(), f"{tag}{i}.".encode().ljust(size, b"x")) for i in range(count)]


def with_a_refused_record(flow: Flow) -> list[Record]:
    """Partition 0: SMALL records, one the target refuses, SMALL more; partition 1: 2 * SMALL records."""
    clients.create_topics(flow.source, {flow.topic: 2})
    clients.create_topics(flow.target, {flow.copy_topic: 2}, {"max.message.bytes": str(CAP)})
    sent = [*sized(0, "a", SMALL), Record(0, b"big", b"b" * BIG), *sized(0, "c", SMALL), *sized(1, "d", 2 * SMALL)]
    clients.produce(flow.source, flow.topic, sent)
    return sent


def ranges(flow: Flow, ends: dict[int, int]) -> list[OffsetRange]:
    return [OffsetRange(flow.topic, p, 0, end) for p, end in ends.items()]


def copied(flow: Flow, expected: list[Record]) -> list[Record]:
    """What a read_committed reader of the target topic reads: each record once, in order, with nothing else."""
    got = clients.read_all(flow.target, flow.copy_topic, expected=len(expected))
    assert_each_record_once_in_order(flow.copy_topic, [Record(r.partition, r.key, r.value) for r in got], expected)
    return got


def test_a_record_the_broker_refuses_for_size_in_a_transaction_is_dead_lettered_and_the_rest_lands_once_in_order(
    plaintext_cluster, unique
):
    dlq = f"dlq-{unique}"
    flow = exactly_once_flow(plaintext_cluster.client, unique, dead_letter_topic=dlq)
    sent = with_a_refused_record(flow)
    clients.create_topics(flow.target, {dlq: 1})
    copier = RangeCopier(flow.config, flow.source, flow.target, None, TargetRules())

    landings = bounded(lambda: copier.copy(ranges(flow, {0: 2 * SMALL + 1, 1: 2 * SMALL})), 120)

    copied(flow, [r for r in sent if r.key != b"big"])
    (letter,) = clients.read_all(flow.target, dlq, expected=1)
    assert letter.key == b"big" and letter.value is None
    assert dict(letter.headers)[f"{DLQ_PREFIX}offset"] == str(SMALL).encode()
    by_partition = {r.partition: r for r in landings}
    assert by_partition[0].dead_lettered == 1 and by_partition[0].held_from < 0, by_partition[0]
    assert by_partition[1].held_from < 0


def test_a_record_the_broker_refuses_for_size_in_a_transaction_holds_its_partition_from_itself_with_its_size(
    plaintext_cluster, unique
):
    flow = exactly_once_flow(plaintext_cluster.client, unique)
    sent = with_a_refused_record(flow)
    copier = RangeCopier(flow.config, flow.source, flow.target, None, TargetRules())

    landings = bounded(lambda: copier.copy(ranges(flow, {0: 2 * SMALL + 1, 1: 2 * SMALL})), 120)

    # The good records of the refused one's batch land: the partition holds from the refused record, not before it.
    copied(flow, sent[:SMALL] + [r for r in sent if r.partition == 1])
    held = next(r for r in landings if r.partition == 0)
    assert held.held_from == SMALL and held.refused_bytes >= BIG, held
    assert "MSG_SIZE_TOO_LARGE" in held.held_error or not held.held_error, held


def test_a_slow_target_slows_an_exactly_once_copy_down_instead_of_outliving_its_transaction(
    plaintext_cluster, unique, monkeypatch
):
    """With a transaction timeout of 8 s and 4 MB to write at 200 KB/s, one transaction for the whole batch would
    outlive it; the copy commits bounded transactions instead, each with its positions."""
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_MS", 8_000)
    monkeypatch.setattr(outbox, "TXN_OPEN_S", 1.0, raising=False)
    monkeypatch.setattr(outbox, "TXN_QUEUE_KBYTES", 256, raising=False)
    cluster = plaintext_cluster
    flow = exactly_once_flow(cluster.client, unique, target=cluster.proxied)
    clients.create_topics(flow.source, {flow.topic: 2})
    clients.create_topics(flow.target, {flow.copy_topic: 2})
    sent = sized(0, "e", 2_000, 1_000) + sized(1, "f", 2_000, 1_000)
    clients.produce(flow.source, flow.topic, sent)
    copier = RangeCopier(flow.config, flow.source, flow.target, None, TargetRules(max_message_bytes=100_000))

    cluster.faults.bandwidth(200, Stream.UPSTREAM)  # what the producer sends to the target, in KB/s
    try:
        landings = bounded(lambda: copier.copy(ranges(flow, {0: 2_000, 1: 2_000})), 240)
    finally:
        cluster.faults.heal()

    copied(flow, sent)
    assert sorted((r.partition, r.first_offset, r.end_offset, r.records) for r in landings) == [
        (0, 0, 2_000, 2_000), (1, 0, 2_000, 2_000)
    ]  # fmt: skip
    positions = clients.committed(flow.target, positions_group(flow.config), flow.copy_topic, 2)
    assert positions == {0: 2_000, 1: 2_000}


@pytest.fixture(autouse=True)
def _no_toxic_left(plaintext_cluster):
    yield
    assert not any(plaintext_cluster.faults.toxics().values()), "a toxic was left on the target's proxy"
