"""A running mirror finds a new source topic at a topic sync, with the records written before it noticed, and follows
a partition increase at the source; the query restarts such changes cause copy each record once. How long the mirror
took is printed, not asserted (MirrorMaker 2 looks for new topics every 600 s by default)."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.ports import free_port
from spark_app.config import parse_config
from spark_app.metrics import MirrorMetrics
from spark_app.mirror import Mirror
from spark_app.throughput import ThroughputRunner
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.support.running import mirror_running

WAIT_S = 180.0


def records(prefix: str, partitions: int, count: int) -> list[Record]:
    now_ms = int(time.time() * 1000)
    return [Record(i % partitions, f"{prefix}{i}".encode(), f"v{i}".encode(), (), now_ms - i) for i in range(count)]


def wait_for_partitions(admin: AdminClient, topic: str, count: int, errors: list[BaseException]) -> float:
    """Seconds until `topic` exists on the target with `count` partitions; fails with the mirror's error if it died."""

    def grown() -> bool:
        found = admin.list_topics(timeout=10).topics.get(topic)
        return found is not None and found.error is None and len(found.partitions) >= count

    return wait_until(grown, f"'{topic}' with {count} partitions on the target", WAIT_S, 0.2, errors)


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_a_topic_created_during_run_is_mirrored_with_what_was_written_before_and_a_partition_increase_follows(
    mode, spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    first, later = f"disc-a-{unique}", f"disc-b-{unique}"
    create_topics(plaintext_cluster.admin, {first: 2})
    initial = records("a", 2, 200)
    produce(plaintext_cluster.client, first, initial)
    config = parse_config(
        one_flow_config(
            plaintext_cluster,
            source_cluster,
            [f"disc-.*-{unique}"],
            tmp_path / "ckpt",
            source_alias="dc",
            target_alias="cloud",
            emit_heartbeats=False,  # keep the shared source cluster free of a `heartbeats` topic
            topic_sync_interval_s=5,
            metrics_port=free_port(),
            mode=mode,
        )
    )
    mirror = Mirror(spark, config)
    target_admin = clients.admin(source_cluster.admin)
    with mirror_running(mirror, stop_timeout_s=120) as errors:
        wait_for_partitions(target_admin, f"dc.{first}", 2, errors)
        read_all(source_cluster.client, f"dc.{first}", expected=200, timeout_s=WAIT_S)

        # A new topic, with records written before the mirror can have noticed it.
        create_topics(plaintext_cluster.admin, {later: 3})
        created = time.monotonic()
        early = records("b", 3, 300)
        produce(plaintext_cluster.client, later, early)
        wait_for_partitions(target_admin, f"dc.{later}", 3, errors)
        got = read_all(source_cluster.client, f"dc.{later}", expected=300, timeout_s=WAIT_S)
        discovered_in = time.monotonic() - created
        print(f"\nnew topic: all 300 records on the target {discovered_in:.1f}s after the topic was created")
        assert_each_record_once_in_order(f"dc.{later}", got, early)

        # The source grows from 2 to 4 partitions; the target follows and the new partitions' records arrive.
        source_admin = clients.admin(plaintext_cluster.admin)  # kept alive until the result arrives
        source_admin.create_partitions([NewPartitions(first, 4)])[first].result()
        grown = [
            Record(p, f"g{p}-{i}".encode(), b"grown", (), int(time.time() * 1000)) for p in (2, 3) for i in range(50)
        ]
        produce(plaintext_cluster.client, first, grown)
        grew_in = wait_for_partitions(target_admin, f"dc.{first}", 4, errors)
        got = read_all(source_cluster.client, f"dc.{first}", expected=300, timeout_s=WAIT_S)
        print(f"partition increase: target grown to 4 partitions after {grew_in:.1f}s")
        assert_each_record_once_in_order(f"dc.{first}", got, initial + grown)  # grown: on the new partitions 2 and 3


def batch_ids(log_dir) -> set[int]:
    """The batch ids in one of a Spark checkpoint's logs (`offsets`: planned, `commits`: done)."""
    return {int(f.name) for f in log_dir.iterdir() if f.name.isdigit()} if log_dir.exists() else set()


def test_query_restarts_under_load_write_each_record_once_in_order(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    """A topic-set change stops the query and starts it again; stopping must never cut a batch in half.

    Records flow in all the while, so batches follow each other closely, and each stop lands next to one. After
    each stop every planned batch is committed: none is left for the next query to write again.
    """
    topic, restarts, waves = f"restart-{unique}", 8, 40
    create_topics(plaintext_cluster.admin, {topic: 2})
    config = parse_config(
        one_flow_config(
            plaintext_cluster,
            source_cluster,
            [topic],
            tmp_path / "ckpt",
            source_alias="here",
            target_alias="there",
            emit_heartbeats=False,
            trigger_interval_s=0.1,
        )
    )
    flow = ThroughputRunner(spark, config, config.flows[0], MirrorMetrics())
    sent = records("r", 2, 100 * waves)
    done = threading.Event()

    def produce_waves() -> None:
        for wave in range(waves):
            produce(plaintext_cluster.client, topic, sent[wave * 100 : (wave + 1) * 100])
            time.sleep(0.15)  # the load's pacing: records keep coming through every restart
        done.set()

    producer = threading.Thread(target=produce_waves, daemon=True)
    producer.start()
    topics = flow.sync_topics()
    stops = 0
    while stops < restarts or not done.is_set():
        flow.start(topics, available_now=False)
        time.sleep(0.5 + 0.2 * (stops % 4))  # deliberately varied, so the stops land at different points of a batch
        flow.stop()
        stops += 1
        planned, committed = batch_ids(tmp_path / "ckpt" / "offsets"), batch_ids(tmp_path / "ckpt" / "commits")
        assert planned == committed, f"stop {stops} left batch(es) {planned - committed} planned but not committed"
    producer.join()
    flow.start(topics, available_now=True)
    wait_until(lambda: not flow.running(), "the end of the final available-now run", 120, 0.1)
    assert flow.failure() is None, flow.failure()
    got = read_all(source_cluster.client, f"here.{topic}", expected=len(sent), timeout_s=WAIT_S)  # exact: no twice
    print(f"\nrestarts under load: {stops} stops, {len(got)} records read back of {len(sent)} sent")
    assert_each_record_once_in_order(f"here.{topic}", got, sent)
