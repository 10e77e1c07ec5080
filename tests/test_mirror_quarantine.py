"""One bad topic never stops the others, and a quarantined topic catches up later without a gap or a reorder."""

from __future__ import annotations

import json
import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from prometheus_client.parser import text_string_to_metric_families

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.kafka_cluster import cluster_entry
from spark_app.config import parse_config
from spark_app.dr.views import flow_status
from spark_app.ledger import STATE_FILE, STATE_VERSION
from spark_app.metrics import LagPoller
from spark_app.mirror import Mirror
from spark_app.policy import offset_syncs_topic
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

BIG = 1_200_000  # over the Event Hubs-like target's 1 MB cap


def small(partition: int, tag: str, count: int) -> list[Record]:
    """Records with explicit timestamps (near now), so the mirrored copy compares equal field by field."""
    now = int(time.time() * 1000)
    return [
        Record(partition, f"{tag}{i}".encode(), f"{tag}-value-{i}".encode(), (("h", tag.encode()),), now + i)
        for i in range(count)
    ]


def lag_of(mirror: Mirror, topic: str, partition: int) -> float:
    """The mirror's `mirrorkit_lag_records` for one partition of its only flow."""
    flow = mirror.flows[0].flow.name
    wanted = {"flow": flow, "topic": topic, "partition": str(partition)}
    return next(
        sample.value
        for family in text_string_to_metric_families(mirror.metrics.text())
        for sample in family.samples
        if sample.name == "mirrorkit_lag_records" and sample.labels == wanted
    )


def status_lag(raw: dict, topic: str, partition: int) -> int | None:
    """What `status` says the lag of one partition is."""
    config = parse_config(raw)
    rows = flow_status(config, config.flows[0]).partitions
    return next(p.lag for p in rows if (p.topic, p.partition) == (topic, partition))


def test_a_quarantined_topic_stops_alone_then_catches_up_in_order_and_retention_losses_are_reported(
    spark, plaintext_cluster, target_cluster, tmp_path, unique
):
    good, big, late, gone = (f"{n}-{unique}" for n in ("good", "big", "late", "gone"))
    create_topics(plaintext_cluster.admin, {good: 2, late: 1, gone: 1})
    create_topics(plaintext_cluster.admin, {big: 2}, {"max.message.bytes": "3000000"})
    sent = {
        good: small(0, "g", 20) + small(1, "g", 20),
        big: small(0, "a", 5)
        + [Record(0, b"huge", b"x" * BIG, (), int(time.time() * 1000))]
        + small(0, "b", 5)
        + small(1, "c", 8),
        late: small(0, "l", 7),
        gone: small(0, "o", 10),
    }
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records, **{"message.max.bytes": "3000000"})
    # Event Hubs topics come from infra; the hub for `late` is missing at first.
    create_topics(target_cluster.admin, {f"onprem.{good}": 2, f"onprem.{big}": 2, f"onprem.{gone}": 1})
    ckpt = tmp_path / "ckpt"

    def config(target_overrides: dict) -> dict:
        target = cluster_entry(target_cluster, "dr") | {"client_overrides": target_overrides}
        return one_flow_config(plaintext_cluster, target, [good, big, late, gone], ckpt)

    # Its offset syncs (what `status` reads) go to a hub of their own, which infra makes too.
    create_topics(
        target_cluster.admin, {offset_syncs_topic(parse_config(config({})).flows[0]): 1}, {"cleanup.policy": "compact"}
    )
    first = Mirror(spark, parse_config(config({})))
    first.run_available_now()

    ledger = first.flows[0].ledger
    assert sorted(ledger.quarantined) == sorted([big, late])
    assert f"topic '{big}' partition 0 offset 5 (1200000 bytes)" in ledger.quarantined[big]
    assert f"event hub 'onprem.{late}' does not exist" in ledger.quarantined[late]
    assert ledger.held[big] == {0: 5}
    got = read_all(target_cluster.client, f"onprem.{good}", expected=40)
    assert_each_record_once_in_order(f"onprem.{good}", got, sent[good])
    got = read_all(target_cluster.client, f"onprem.{big}", expected=5 + 8)
    # Partition 0: nothing from the refused record on; partition 1 goes on.
    assert_each_record_once_in_order(f"onprem.{big}", got, sent[big][:5] + sent[big][11:])
    state = json.loads((ckpt / STATE_FILE).read_text())
    assert state["version"] == STATE_VERSION
    assert state["quarantined"][big]["partitions"]["0"] == {"first": 5, "next": 11, "life": state["topic_ids"][big]}
    # The query read past the held records, but their lag counts from the first held offset, in the metric and in
    # `status` (offset syncs end at the last record written).
    lag = first.flows[0].lag()
    LagPoller(first.metrics, [lag]).poll()
    assert lag_of(first, big, 0) == 11 - 5 and lag_of(first, late, 0) == 7 and lag_of(first, good, 0) == 0
    assert status_lag(config({}), big, 0) == 11 - 5

    # More traffic while quarantined, then records of `gone` deleted by retention before they were mirrored.
    more = {big: small(0, "d", 4) + small(1, "e", 3), late: small(0, "m", 3), gone: small(0, "p", 10)}
    for topic, records in more.items():
        produce(plaintext_cluster.client, topic, records)
        sent[topic] += records
    LagPoller(first.metrics, [lag]).poll()  # the held lag keeps growing
    assert lag_of(first, big, 0) == 15 - 5 and lag_of(first, late, 0) == 10
    assert status_lag(config({}), big, 0) == 15 - 5
    source_admin = clients.admin(plaintext_cluster.admin)
    for future in source_admin.delete_records([TopicPartition(gone, 0, 15)], request_timeout=30).values():
        future.result()
    # The causes are fixed: the hub is created, the target's cap raised for `big`.
    create_topics(target_cluster.admin, {f"onprem.{late}": 1})
    target_admin = clients.admin(target_cluster.admin)
    raise_cap = ConfigResource(
        ResourceType.TOPIC, f"onprem.{big}",
        incremental_configs=[ConfigEntry("max.message.bytes", "3000000", incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    for future in target_admin.incremental_alter_configs([raise_cap]).values():
        future.result()

    second = Mirror(spark, parse_config(config({"message.max.bytes": "3000000"})))
    second.run_available_now()

    ledger = second.flows[0].ledger
    assert ledger.quarantined == {} and ledger.held == {}
    for topic in (big, late):
        got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(sent[topic]))
        assert_each_record_once_in_order(f"onprem.{topic}", got, sent[topic])
    got = read_all(target_cluster.client, f"onprem.{gone}", expected=15)
    assert_each_record_once_in_order(f"onprem.{gone}", got, sent[gone][:10] + sent[gone][15:])  # 10-14 deleted
    assert [(x.topic, x.partition, x.first_offset, x.last_offset, x.count) for x in ledger.data_loss] == [
        (gone, 0, 10, 14, 5)
    ]
