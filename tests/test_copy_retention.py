"""Records deleted at the source while a copy is behind them, in the middle of its run: the copy moves to the log
start in a landing of its own, so the flow's ledger reports exactly the deleted offsets, in real time as in batches.
Driven through the per-record path both modes share (`copy_some`), on real brokers, without Spark."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce
from spark_app.clients import list_offsets
from spark_app.config import FlowConfig, TopicSelection
from spark_app.ledger import FlowLedger, LedgerState
from spark_app.outbox import CONSUMER_DEFAULTS, PRODUCER_DEFAULTS, Cursor, Outbox, copy_some
from spark_app.ranges import DataLoss, Landing
from spark_app.storage import checkpoint_files


def test_records_deleted_behind_a_running_copy_are_reported_exactly_and_the_copy_goes_on_from_the_log_start(
    plaintext_cluster, tmp_path, unique
):
    topic = f"ret-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 1, f"onprem.{topic}": 1})
    flow = FlowConfig(source="onprem", target="dr", topics=TopicSelection(include=[topic]),
                      checkpoint_location=str(tmp_path))  # fmt: skip
    now = int(time.time() * 1000)
    produce(plaintext_cluster.client, topic, [Record(0, b"k", f"v{i}".encode(), (), now + i) for i in range(100)])

    key = (topic, 0)
    cursor = Cursor(Landing(topic, 0, 0, 0), 0)
    consumer = clients.consumer(plaintext_cluster.client, f"copy-{unique}", CONSUMER_DEFAULTS)
    consumer.assign([TopicPartition(topic, 0, 0)])
    outbox = Outbox(flow, clients.producer(plaintext_cluster.client, PRODUCER_DEFAULTS), lambda _k: cursor.landing)
    outbox.open(key)
    while cursor.next < 100:  # the copy reads what is there, then stands behind (its partition paused)
        copy_some(consumer, {key: cursor}, outbox, 1_000, 0.2)
    consumer.pause([TopicPartition(topic, 0)])
    produce(plaintext_cluster.client, topic, [Record(0, b"k", f"w{i}".encode(), (), now + i) for i in range(200)])
    admin = clients.admin(plaintext_cluster.admin)
    admin.delete_records([TopicPartition(topic, 0, 200)])[TopicPartition(topic, 0, 200)].result()  # "retention"
    consumer.resume([TopicPartition(topic, 0)])
    deadline = time.monotonic() + 60
    while cursor.next < 300:
        assert time.monotonic() < deadline, f"the copy stands at {cursor.next}"
        copy_some(consumer, {key: cursor}, outbox, 1_000, 0.2)
    outbox.flush(60)
    consumer.close()

    landings = [*cursor.retired, cursor.landing]
    assert [(r.first_offset, r.end_offset) for r in cursor.retired] == [(0, 100)]
    assert cursor.landing.first_offset == 200, "the new landing starts at the log start"
    assert sum(r.records for r in landings) == 200, "100 before the deletion, 100 after it, none twice"
    cursor.landing.end_offset = cursor.next
    state = LedgerState.load(checkpoint_files(str(tmp_path)))
    ledger = FlowLedger(flow, state, lambda partitions: list_offsets(admin, partitions, OffsetSpec.earliest()))
    ledger.file(landings)
    assert ledger.data_loss == [DataLoss(topic, 0, 100, 199)]
