"""A record the target refuses as invalid (a null key into a compacted topic) quarantines its topic alone; once the
target takes such records, the topic catches up in order, none lost and none twice. The refused record sits in the
middle of many produce batches: nothing after it may land before it."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, end_offsets, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

PER_TOPIC = 12_000
NO_KEY = 6_000  # the offset of the record without a key


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_a_record_the_target_refuses_as_invalid_quarantines_its_topic_alone_and_it_catches_up_after_the_fix(
    mode, spark, plaintext_cluster, target_cluster, tmp_path, unique
):
    good, bad = f"good-{unique}", f"nokey-{unique}"
    create_topics(plaintext_cluster.admin, {good: 1, bad: 1})
    # Event Hubs-like target: the mirror neither makes nor alters its topics, so the compacted one stays so.
    create_topics(target_cluster.admin, {f"onprem.{good}": 1})
    create_topics(target_cluster.admin, {f"onprem.{bad}": 1}, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    sent = {
        topic: [
            Record(0, None if topic == bad and i == NO_KEY else f"k{i}".encode(), f"{topic}-{i}".encode(), (), now + i)
            for i in range(PER_TOPIC)
        ]
        for topic in (good, bad)
    }
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records)
    config = parse_config(
        one_flow_config(
            plaintext_cluster, target_cluster, [good, bad], tmp_path / "ckpt", emit_heartbeats=False, mode=mode
        )  # fmt: skip
    )

    first = Mirror(spark, config)
    first.run_available_now()
    reason = first.flows[0].ledger.quarantined.get(bad, "")
    assert "INVALID_RECORD" in reason and f"topic '{bad}'" in reason, first.flows[0].ledger.quarantined
    assert good not in first.flows[0].ledger.quarantined
    got = read_all(target_cluster.client, f"onprem.{good}", expected=PER_TOPIC)
    assert_each_record_once_in_order(f"onprem.{good}", got, sent[good])  # the other topic went on
    landed = end_offsets(target_cluster.client, [(f"onprem.{bad}", 0)])[(f"onprem.{bad}", 0)]
    held = read_all(target_cluster.client, f"onprem.{bad}", expected=landed)  # what landed before the refusal
    assert landed == NO_KEY, "held at the refused record: all before it landed, nothing after it"
    assert [r.value for r in held] == [r.value for r in sent[bad][:landed]]

    # The fix: the target topic takes records without a key now. A restart tries the quarantined topic at once.
    allow = ConfigResource(
        ResourceType.TOPIC, f"onprem.{bad}",
        incremental_configs=[ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)],
    )  # fmt: skip
    admin = clients.admin(target_cluster.admin)  # kept alive until the answer arrives
    for future in admin.incremental_alter_configs([allow]).values():
        future.result()
    second = Mirror(spark, config)
    second.run_available_now()
    assert second.flows[0].ledger.quarantined == {}
    got = read_all(target_cluster.client, f"onprem.{bad}", expected=PER_TOPIC)
    assert_each_record_once_in_order(f"onprem.{bad}", got, sent[bad])  # 0 lost, none twice, in order
