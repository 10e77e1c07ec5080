"""A source partition whose leader goes offline mid-run holds its own topic only: the planner plans the other
partitions, the writer holds the range it can no longer read, that topic is quarantined and the others flow on; once
the broker is back the topic catches up in order, with nothing lost. A whole source down past the stall bound ends
the batch in flight the same way, rather than holding it (and any stop) for as long as the source is down."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from bench.testbed.clients import Record, create_placed_topics, create_topics, end_offsets, produce, read_all
from bench.testbed.kafka_cluster import KafkaCluster, MultiBrokerCluster, cluster_entry
from bench.testbed.ports import free_port
from spark_app import quarantine
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.support.running import mirror_running

PER_ROUND = 20  # records on each partition of the brokers that stay up, a round every second or so
BACKLOG = 600  # records of RECORD_BYTES on the partition that goes offline, there before the mirror starts
RECORD_BYTES = 1000
# The mirror's fetches from the source are throttled, so that after its first fetch the rest of BACKLOG waits many
# seconds: the broker is stopped then, while that range is being read, which is the case the writer must hold. Small
# fetches (librdkafka wants message.max.bytes no larger) of small producer batches keep one fetch from taking it all.
FETCH_BYTES_PER_S = 20_000
FETCH_BYTES = "16384"
SMALL_BATCHES = {"batch.size": "4000", "linger.ms": "0"}
# How long the whole source stays silent before the range being read is held: the compiled core's idle bound, then the
# Python loop's stall bound (spark_app.range_copy.PARTITION_STALL_S, in Spark's workers), then a slow machine's slack.
OUTAGE_HOLD_S = 150.0


def throttled_overrides(cluster: KafkaCluster, client_id: str) -> dict[str, str]:
    """The mirror's client overrides that make `cluster` serve its fetches slowly, in small pieces (see above)."""
    cluster.limit_consumer(client_id, FETCH_BYTES_PER_S)
    return {"client.id": client_id, "message.max.bytes": FETCH_BYTES, "fetch.max.bytes": FETCH_BYTES,
            "max.partition.fetch.bytes": FETCH_BYTES}  # fmt: skip


def send(
    source: KafkaCluster | MultiBrokerCluster, sent: dict[str, list[Record]], topic: str, partitions: tuple[int, ...],
    count: int, size: int = 10, **producer: str,
) -> None:  # fmt: skip
    """Produce `count` numbered records to each partition, noting them in `sent`."""
    now = int(time.time() * 1000)
    for p in partitions:
        at = sum(1 for r in sent[topic] if r.partition == p)
        records = [Record(p, f"{p}-{at + i}".encode(), f"{at + i}".encode().ljust(size, b"."), (), now + i)
                   for i in range(count)]  # fmt: skip
        produce(source.client, topic, records, **producer)
        sent[topic] += records


def landed_on_target(target: KafkaCluster, topic: str, partition: int) -> int:
    try:
        return end_offsets(target.client, [(topic, partition)])[(topic, partition)]
    except KafkaException:
        return 0  # not created on the target yet


def stopped_mid_range(
    stop: Callable[[], None], target: KafkaCluster, copy: str, partition: int, errors: list[BaseException]
) -> int:
    """Call `stop` once the throttled backlog's copy has started landing on `target`, and before it all has; how
    many records had landed."""
    wait_until(
        lambda: landed_on_target(target, copy, partition) > 0, f"'{copy}' [{partition}] to start landing", errors=errors
    )
    stop()
    on_target = landed_on_target(target, copy, partition)
    assert on_target < BACKLOG, f"the whole backlog ({on_target}) landed before the broker stopped"
    return on_target


def test_a_partition_whose_leader_goes_offline_mid_run_quarantines_its_topic_alone_and_it_catches_up_in_order(
    spark, multi_broker_cluster, plaintext_cluster, tmp_path, unique, monkeypatch
):
    monkeypatch.setattr(quarantine, "RECORD_RETRY_S", 2.0)  # try a held topic again every 2 s, not every 60 s
    source = multi_broker_cluster
    steady, bad = f"steady-{unique}", f"bad-{unique}"
    # Every partition on broker 1 (the controller, which stays up) but bad's partition 1, which broker 2 alone holds.
    create_placed_topics(source.admin, {steady: [1, 1], bad: [1, 2]})
    overrides = throttled_overrides(source.broker(1), f"mirror-{unique}")
    config = parse_config(
        one_flow_config(
            cluster_entry(source, "multi") | {"client_overrides": overrides},
            plaintext_cluster,
            [steady, bad],
            tmp_path / "ckpt",
            emit_heartbeats=False,
            metrics_port=free_port(),
        )  # fmt: skip
    )
    sent: dict[str, list[Record]] = {steady: [], bad: []}
    send(source, sent, bad, (1,), BACKLOG, RECORD_BYTES, **SMALL_BATCHES)
    send(source, sent, bad, (0,), PER_ROUND)
    send(source, sent, steady, (0, 1), PER_ROUND)
    mirror = Mirror(spark, config)
    flow = mirror.flows[0]
    try:
        with mirror_running(mirror) as errors:
            on_target = stopped_mid_range(source.broker(2).stop, plaintext_cluster, f"multi.{bad}", 1, errors)
            stopped_at = time.monotonic()

            for _ in range(3):  # the other topic, and bad's partition on the broker that stays up, go on
                send(source, sent, steady, (0, 1), PER_ROUND)
                send(source, sent, bad, (0,), PER_ROUND)
                time.sleep(1)
            wait_until(lambda: bad in flow.ledger.quarantined, f"'{bad}' to be quarantined", errors=errors)
            reason = flow.ledger.quarantined[bad]
            assert f"topic '{bad}' partition 1" in reason and "no progress reading partition" in reason, reason
            assert flow.ledger.held[bad].get(1, -1) >= on_target, flow.ledger.held
            wait_until(
                lambda: flow.totals.records.get(steady, 0) >= len(sent[steady]),
                f"'{steady}' to keep flowing",
                errors=errors,
            )
            assert steady not in flow.ledger.quarantined
            print(f"'{steady}' caught up {time.monotonic() - stopped_at:.1f} s after broker 2 stopped")

            source.broker(2).start()
            send(source, sent, bad, (0, 1), PER_ROUND)
            send(source, sent, steady, (0, 1), PER_ROUND)
            wait_until(lambda: bad not in flow.ledger.quarantined, f"'{bad}' to catch up and rejoin", errors=errors)
            wait_until(
                lambda: flow.totals.records.get(bad, 0) >= len(sent[bad]), f"every '{bad}' record", errors=errors
            )
            wait_until(
                lambda: flow.totals.records.get(steady, 0) >= len(sent[steady]), "every steady record", errors=errors
            )
    finally:
        source.broker(2).start()  # the session's cluster stays whole for the tests after this one

    for topic in (steady, bad):
        got = read_all(plaintext_cluster.client, f"multi.{topic}", expected=len(sent[topic]))
        assert_each_record_once_in_order(f"multi.{topic}", got, sent[topic])  # 0 lost, none twice, in order
        print(f"'{topic}': {len(sent[topic])} records sent, {len(got)} on the target, in order")


def test_a_source_down_past_the_stall_bound_ends_the_batch_in_flight_and_its_topic_catches_up_in_order_once_back(
    spark, own_cluster, plaintext_cluster, tmp_path, unique, monkeypatch
):
    """The source's only broker stops while a range is being read, and stays down past the stall bound. The batch in
    flight ends holding what it could not read (so a stop meanwhile would not wait for the source) and the topic is
    quarantined saying the source does not answer; the mirror itself keeps running. Once the source is back, the
    topic catches up in order, with nothing lost or copied twice."""
    monkeypatch.setattr(quarantine, "RECORD_RETRY_S", 2.0)  # try a held topic again every 2 s, not every 60 s
    source = own_cluster(f"outage-{unique[-8:]}", "plaintext")
    topic = f"outage-{unique}"
    create_topics(source.admin, {topic: 1})
    config = parse_config(
        one_flow_config(
            cluster_entry(source, "down") | {"client_overrides": throttled_overrides(source, f"mirror-{unique}")},
            plaintext_cluster,
            [topic],
            tmp_path / "ckpt",
            emit_heartbeats=False,
            metrics_port=free_port(),
        )  # fmt: skip
    )
    sent: dict[str, list[Record]] = {topic: []}
    send(source, sent, topic, (0,), BACKLOG, RECORD_BYTES, **SMALL_BATCHES)
    mirror = Mirror(spark, config)
    flow = mirror.flows[0]
    try:
        with mirror_running(mirror) as errors:
            on_target = stopped_mid_range(source.stop, plaintext_cluster, f"down.{topic}", 0, errors)
            wait_until(lambda: topic in flow.ledger.quarantined, f"'{topic}' to be held", OUTAGE_HOLD_S, errors=errors)
            reason = flow.ledger.quarantined[topic]
            assert "does not answer" in reason and "no progress reading partition" in reason, reason
            assert flow.ledger.held[topic].get(0, -1) >= on_target, flow.ledger.held

            source.start()
            send(source, sent, topic, (0,), PER_ROUND)
            wait_until(lambda: topic not in flow.ledger.quarantined, f"'{topic}' to catch up and rejoin", errors=errors)
            wait_until(
                lambda: flow.totals.records.get(topic, 0) >= len(sent[topic]), f"every '{topic}' record", errors=errors
            )
    finally:
        source.start()

    got = read_all(plaintext_cluster.client, f"down.{topic}", expected=len(sent[topic]))
    assert_each_record_once_in_order(f"down.{topic}", got, sent[topic])  # 0 lost, none twice, in order


def test_a_real_time_mirror_started_while_a_leader_is_offline_copies_the_rest_and_that_partition_once_it_is_back(
    spark, multi_broker_cluster, plaintext_cluster, tmp_path, unique
):
    """The real-time job asks every partition where to start; one that does not answer must not stop the others
    (nor make the mirror fail and restart over and over): it is assigned from its log start and read once it is
    back."""
    source = multi_broker_cluster
    steady, bad = f"steady-{unique}", f"bad-{unique}"
    create_placed_topics(source.admin, {steady: [1, 1], bad: [1, 2]})  # bad's partition 1 on broker 2 alone
    now = int(time.time() * 1000)
    sent = {
        (topic, p): [Record(p, f"{p}-{i}".encode(), f"{topic}-{p}-{i}".encode(), (), now + i) for i in range(50)]
        for topic in (steady, bad)
        for p in (0, 1)
    }
    for (topic, _p), records in sent.items():
        produce(source.client, topic, records)
    config = parse_config(
        one_flow_config(
            cluster_entry(source, "multi"),
            plaintext_cluster,
            [steady, bad],
            tmp_path / "ckpt",
            emit_heartbeats=False,
            metrics_port=free_port(),
            mode="realtime",
        )  # fmt: skip
    )
    mirror = Mirror(spark, config)
    flow = mirror.flows[0]
    source.broker(2).stop()
    try:
        with mirror_running(mirror) as errors:
            wait_until(lambda: flow.totals.records.get(steady, 0) >= 100, f"'{steady}' to be copied", errors=errors)
            wait_until(
                lambda: flow.totals.records.get(bad, 0) >= 50, f"'{bad}' partition 0 to be copied", errors=errors
            )
            source.broker(2).start()
            wait_until(lambda: flow.totals.records.get(bad, 0) >= 100, f"'{bad}' partition 1, once back", errors=errors)
    finally:
        source.broker(2).start()
    for topic in (steady, bad):
        got = read_all(plaintext_cluster.client, f"multi.{topic}", expected=100)
        assert_each_record_once_in_order(f"multi.{topic}", got, sent[(topic, 0)] + sent[(topic, 1)])
