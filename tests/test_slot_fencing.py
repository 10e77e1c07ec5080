"""Zombies of slots a run leaves idle. Slot ids are dealt anew each run (a throughput batch's tasks, a real-time
flow's `realtime_tasks`), and a run after an executor was lost usually deals fewer: a zombie of a higher slot, still
writing with that slot's transactional id, must be fenced when the mirror starts, or its commit stands beside the
records and positions of the slot now copying its partitions; and a task of a run that is over, which starts its
producer only after the next run's fence, must find its run gone. Against real brokers, as the CLI runs the mirror."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from confluent_kafka import KafkaException
from pyspark import SparkContext

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.ledger import LedgerState
from spark_app.mirror import Mirror
from spark_app.range_copy import RangeCopier
from spark_app.ranges import OffsetRange
from spark_app.run_check import RunGone, RunWitness
from spark_app.storage import checkpoint_files
from spark_app.transactions import FENCED_ERRORS, check_transactions, fence, transactional_id
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

PARTITIONS = 4
ZOMBIE_SLOT = 3


def records(tag: str, first: int, count: int) -> list[Record]:
    now_ms = int(time.time() * 1000)
    return [
        Record(i % PARTITIONS, f"k{i}".encode(), f"{tag}-{i}".encode(), timestamp_ms=now_ms + i)
        for i in range(first, first + count)
    ]


def run_as_the_cli(spark, config) -> None:
    check_transactions(config)  # what `run` does before Spark starts the flows
    Mirror(spark, config).run_available_now()


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_a_zombie_of_a_slot_the_next_run_leaves_idle_is_fenced_at_its_start_and_its_records_never_show(
    mode, spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    topic = f"slots-{unique}"
    remote = f"primary.{topic}"
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    first, second = records(topic, 0, 400), records(topic, 400, 400)

    def config(slots: int):
        keys = {"mode": mode, "exactly_once": True} | ({"realtime_tasks": slots} if mode == "realtime" else {})
        raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                              emit_heartbeats=False, **keys)  # fmt: skip
        return parse_config(raw)

    # A run with 4 slots: a throughput run on 4 cores (4 partitions, 4 tasks), or real time with 4 tasks.
    produce(plaintext_cluster.client, topic, first)
    with monkeypatch.context() as wider:
        if mode == "throughput":
            wider.setattr(SparkContext, "defaultParallelism", property(lambda _: PARTITIONS))
        run_as_the_cli(spark, config(PARTITIONS))
    flow = config(2).flows[0]

    # Slot 3 of that run lives on (its executor lost to the driver, its Python worker still writing): it opens a
    # transaction and writes a record, to commit it later.
    zombie = clients.producer(source_cluster.client, {"transactional.id": transactional_id(flow, ZOMBIE_SLOT)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(remote, b"zombie", b"zombie", partition=ZOMBIE_SLOT)
    assert zombie.flush(30) == 0

    # The next run deals 2 slots (2 cores, or `realtime_tasks` lowered to 2) and copies slot 3's partition itself.
    produce(plaintext_cluster.client, topic, second)
    run_as_the_cli(spark, config(2))

    with pytest.raises(KafkaException) as late:
        zombie.commit_transaction(30)
    assert late.value.args[0].code() in FENCED_ERRORS, late.value.args[0]
    sent = first + second
    got = read_all(source_cluster.client, remote, expected=len(sent))  # read_committed: exactly these, no zombie's
    assert_each_record_once_in_order(remote, got, sent)
    # The mark the first run filed stays: one integer, never lowered by a run with fewer slots.
    assert LedgerState.load(checkpoint_files(flow.checkpoint_location)).slots == PARTITIONS


def test_a_batch_task_of_a_run_that_is_over_starting_after_the_next_runs_fence_commits_nothing(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    """A Python worker paused (or slow) before it started its slot's producer, while its driver died and the next run
    fenced every slot id: started after that fence, it holds the slot's newest epoch, and only its run's driver can
    tell it that its run is over. With the run's witness closed (its driver gone) it commits nothing; the same copy
    without asking (as batches did before) commits its records beside the next run's."""
    topic = f"late-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 1})
    sent = records(topic, 0, 50)
    produce(plaintext_cluster.client, topic, [replace(r, partition=0) for r in sent])
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    flow, source, target = config.flows[0], config.cluster("primary"), config.cluster(config.flows[0].target)
    create_topics(source_cluster.admin, {f"primary.{topic}": 1})
    witness = RunWitness(spark, "the test's run")
    witness.close()  # its driver is gone
    fence(flow, target, {}, 0, 1)  # the next run's start
    ranges = [OffsetRange(topic, 0, 0, len(sent))]
    with pytest.raises(RunGone, match="commits nothing"):
        RangeCopier(flow, source, target, run=witness.address).copy(ranges, 0)
    assert read_all(source_cluster.client, f"primary.{topic}", expected=0) == [], "nothing of the late task shows"
    live = RunWitness(spark, "the next run")
    try:
        RangeCopier(flow, source, target, run=live.address).copy(ranges, 0)  # a task of a run that is on copies
    finally:
        live.close()
    assert len(read_all(source_cluster.client, f"primary.{topic}", expected=len(sent))) == len(sent)
