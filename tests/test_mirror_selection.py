"""What the mirror copies, what it never copies, and what it does with a record the target cannot take."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from spark_app.outbox import DLQ_PREFIX
from tests.support.mirror_config import one_flow_config


def test_exclusions_internal_topics_and_remote_copies_stay_home_and_configs_travel(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    keep, secret, remote = f"keep-{unique}", f"keep-secret-{unique}", f"dr.keep-{unique}"
    create_topics(plaintext_cluster.admin, {keep: 3, secret: 1, remote: 1})
    compact = f"compact-{unique}"
    create_topics(plaintext_cluster.admin, {compact: 2}, {"cleanup.policy": "compact", "retention.ms": "7200000"})
    for topic in (keep, secret, remote, compact):
        produce(plaintext_cluster.client, topic, [Record(0, b"k", topic.encode())])

    topics = {
        "include": [f"keep.*-{unique}", f"dr\\.keep-{unique}", f"compact-{unique}", "__consumer_offsets"],
        "exclude": [f"keep-secret-{unique}"],
    }
    config = parse_config(one_flow_config(plaintext_cluster, source_cluster, topics, tmp_path / "ckpt"))
    mirror = Mirror(spark, config)
    mirror.run_available_now()

    assert sorted(mirror.flows[0].totals.records) == sorted([keep, compact])
    target_admin = clients.admin(source_cluster.admin)
    on_target = target_admin.list_topics(timeout=10).topics
    assert f"onprem.{keep}" in on_target and len(on_target[f"onprem.{keep}"].partitions) == 3
    for never in (f"onprem.{secret}", f"onprem.{remote}", "onprem.__consumer_offsets"):
        assert never not in on_target, never
    described = target_admin.describe_configs([ConfigResource(ResourceType.TOPIC, f"onprem.{compact}")])
    entries = next(iter(described.values())).result()
    assert entries["cleanup.policy"].value == "compact"
    assert entries["retention.ms"].value == "7200000"
    assert [r.value for r in read_all(source_cluster.client, f"onprem.{keep}", expected=1)] == [keep.encode()]


@pytest.mark.parametrize("dead_letters", [False, True], ids=["stops", "dead-letters"])
def test_a_record_over_the_targets_cap_quarantines_its_topic_with_its_coordinates_or_goes_to_dead_letters(
    dead_letters, spark, plaintext_cluster, target_cluster, tmp_path, unique
):
    topic = f"big-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 1}, {"max.message.bytes": "3000000"})
    records = [Record(0, b"a", b"small"), Record(0, b"b", b"x" * 1_200_000), Record(0, b"c", b"after")]
    produce(plaintext_cluster.client, topic, records, **{"message.max.bytes": "3000000"})
    create_topics(
        target_cluster.admin, {f"onprem.{topic}": 1, "mirror.dlq": 1} if dead_letters else {f"onprem.{topic}": 1}
    )
    dead_letter_topic = "mirror.dlq" if dead_letters else None  # None: the schema's default, no dead letters
    config = one_flow_config(
        plaintext_cluster, target_cluster, [topic], tmp_path / "ckpt", dead_letter_topic=dead_letter_topic
    )
    mirror = Mirror(spark, parse_config(config))

    mirror.run_available_now()
    if not dead_letters:  # the topic is quarantined with the record's coordinates; nothing after it is written
        assert f"topic '{topic}' partition 0 offset 1 (1200000 bytes)" in mirror.flows[0].ledger.quarantined[topic]
        assert mirror.flows[0].ledger.held == {topic: {0: 1}}
        assert [r.value for r in read_all(target_cluster.client, f"onprem.{topic}", expected=1)] == [b"small"]
        return
    assert [r.value for r in read_all(target_cluster.client, f"onprem.{topic}", expected=2)] == [b"small", b"after"]
    (letter,) = read_all(target_cluster.client, "mirror.dlq", expected=1)
    headers = dict(letter.headers)
    assert letter.key == b"b" and letter.value is None
    assert headers[f"{DLQ_PREFIX}topic"] == topic.encode()
    assert headers[f"{DLQ_PREFIX}partition"] == b"0" and headers[f"{DLQ_PREFIX}offset"] == b"1"
    assert headers[f"{DLQ_PREFIX}size"] == b"1200000"
    assert mirror.flows[0].totals.dead_lettered == 1
