"""An exactly-once micro-batch run again after its slot committed and before the driver filed it (a crash between
the two), against real brokers: it skips what the committed positions say was copied, and its landings still say
what the first run's did. Records retention deleted before the first run read them are reported by the run again,
as the first run would have; and a batch that starts a topic made again over (its offsets gone backwards) writes
nothing twice, since the position it committed names the topic's life."""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from bench.testbed import clients
from bench.testbed.clients import Record
from spark_app import clients as spark_clients
from spark_app.clients import list_offsets
from spark_app.config import FlowConfig, TopicSelection
from spark_app.ledger import FlowLedger, LedgerState
from spark_app.range_copy import RangeCopier
from spark_app.ranges import DataLoss, Landing, OffsetRange
from spark_app.storage import checkpoint_files
from tests.support.assertions import assert_each_record_once_in_order

PARTITIONS = 2


def records(tag: str, count: int) -> list[Record]:
    now_ms = int(time.time() * 1000)
    return [
        Record(i % PARTITIONS, f"k{i}".encode(), f"{tag}-{i}".encode(), timestamp_ms=now_ms + i) for i in range(count)
    ]


def flow_between(plaintext_cluster, source_cluster, unique, tmp_path, topic):
    source = plaintext_cluster.client.model_copy(update={"alias": f"on{unique[-6:]}"})
    target = source_cluster.client.model_copy(update={"alias": f"dr{unique[-6:]}"})
    flow = FlowConfig(
        source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]), exactly_once=True,
        checkpoint_location=str(tmp_path),
    )  # fmt: skip
    clients.create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    clients.create_topics(source_cluster.admin, {f"{source.alias}.{topic}": PARTITIONS})
    return flow, source, target


def life_of(cluster, topic: str) -> dict[str, str]:
    """The topic's id now (KIP-516), as the planner gives a batch's copy the life its ranges were planned in."""
    admin = clients.admin(cluster.admin)
    return spark_clients.topic_ids(admin, [topic])


def losses_filed(flow: FlowConfig, source_admin, landed: list[Landing], folder) -> list[DataLoss]:
    """What a ledger that expected every partition at offset 0 reports when it files `landed`."""
    admin = clients.admin(source_admin)
    ledger = FlowLedger(flow, LedgerState.load(checkpoint_files(str(folder))),
                        lambda partitions: list_offsets(admin, partitions, OffsetSpec.earliest()))  # fmt: skip
    ledger.expect({(flow.topics.include[0], p): 0 for p in range(PARTITIONS)})
    ledger.file(landed)
    return ledger.data_loss


def test_a_micro_batch_run_again_after_its_commit_reports_what_retention_deleted_before_its_first_run_read_it(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    """Partition 0's whole range [0, 1,500) is gone before the first run reads it (its log starts at 1,800), partition
    1's first 600 records are. The first run copies what is left and commits; the run again copies nothing and files
    the same losses."""
    topic = f"replay-gone-{unique}"
    flow, source, target = flow_between(plaintext_cluster, source_cluster, unique, tmp_path, topic)
    sent = records(topic, 4_000)  # 2,000 a partition
    clients.produce(source, topic, sent)
    admin = clients.admin(plaintext_cluster.admin)
    gone = [TopicPartition(topic, 0, 1_800), TopicPartition(topic, 1, 600)]  # "retention", while the mirror was down
    for future in admin.delete_records(gone).values():
        future.result()
    copier = RangeCopier(flow, source, target)
    batch = [OffsetRange(topic, p, 0, 1_500) for p in range(PARTITIONS)]

    first = copier.copy(batch, slot=0)
    again = copier.copy(batch, slot=1)  # as Spark runs it after a crash between the slot's commit and the filing

    expected = [DataLoss(topic, 0, 0, 1_499), DataLoss(topic, 1, 0, 599)]
    assert losses_filed(flow, plaintext_cluster.admin, first, tmp_path / "first") == expected
    assert sum(r.records for r in again) == 0, "the run again wrote records the first run had committed"
    assert losses_filed(flow, plaintext_cluster.admin, again, tmp_path / "again") == expected, (
        "the run again did not report what the first run found deleted"
    )
    copy_topic = f"{source.alias}.{topic}"
    kept = [r for r in sent if r.partition == 1 and 600 <= int(r.value.rsplit(b"-", 1)[1]) // PARTITIONS < 1_500]
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(kept)), kept)


def test_a_micro_batch_that_starts_a_topic_made_again_over_run_again_after_its_commit_writes_nothing_twice(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    """The batch was planned in the topic's new life (its ranges start over at the log start: their offsets went
    backwards from 3,000). Run again, it skips what its slot committed, since the position names that life; a range
    of a later life (the topic made again once more) is not skipped on that position."""
    topic = f"replay-remade-{unique}"
    flow, source, target = flow_between(plaintext_cluster, source_cluster, unique, tmp_path, topic)
    sent = records(topic, 3_000)  # 1,500 a partition
    clients.produce(source, topic, sent)
    copier = RangeCopier(flow, source, target, lives=life_of(plaintext_cluster, topic))
    batch = [OffsetRange(topic, p, 0, 1_500, reset_from=3_000) for p in range(PARTITIONS)]

    first = copier.copy(batch, slot=0)
    again = copier.copy(batch, slot=1)

    assert [(r.first_offset, r.end_offset, r.records) for r in first] == [(0, 1_500, 1_500)] * PARTITIONS
    assert [(r.first_offset, r.end_offset, r.records) for r in again] == [(0, 1_500, 0)] * PARTITIONS, (
        "the batch run again copied the new life a second time"
    )
    copy_topic = f"{source.alias}.{topic}"
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(sent)), sent)
    # A range planned in yet another life reads from its start: the positions are not that life's.
    clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
    clients.produce(source, topic, [r for r in records(topic, 200) if r.partition == 0])
    later = RangeCopier(flow, source, target, lives=life_of(plaintext_cluster, topic))
    assert [r.records for r in later.copy([OffsetRange(topic, 0, 0, 100)], slot=0)] == [100]
