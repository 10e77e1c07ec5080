"""Active/active: two flows, A->B and B->A, in one config, running both ways at once."""

from __future__ import annotations

import dataclasses
import time

import pytest
from confluent_kafka.admin import AdminClient

from spark_app.clients import watermarks
from spark_app.config import parse_config
from spark_app.policy import PROVENANCE_HEADER
from spark_app.stream import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.clients import Record, create_topics, produce, read_all
from tests.support.mirror_config import cluster_entry, free_port
from tests.support.running import mirror_running

PER_SIDE = 150


@pytest.fixture(scope="module")
def pair(testbed):
    """Two clusters of their own: a running mirror writes `heartbeats` on both, which others must not inherit."""
    return testbed.start("aa-east", "plaintext"), testbed.start("aa-west", "plaintext")


def topics_on(cluster) -> set[str]:
    return set(AdminClient(cluster.admin.librdkafka()).list_topics(timeout=30).topics)


def without_timestamps(records: list[Record]) -> list[Record]:
    """As sent: the records went out without a timestamp, the producer stamped them."""
    return [dataclasses.replace(r, timestamp_ms=None) for r in records]


def count(cluster, topic: str) -> int:
    from confluent_kafka import Consumer

    consumer = Consumer(cluster.client.librdkafka() | {"group.id": "aa-count"})
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            return 0
        return sum(watermarks(consumer, topic, p)[1] for p in metadata.partitions)  # a fresh topic's leader may move
    finally:
        consumer.close()


@pytest.mark.parametrize("policy", ["default", "identity"])
def test_both_ways_each_record_lands_once_per_direction_and_names_never_grow(policy, spark, pair, tmp_path, unique):
    east, west = pair
    a, b = f"e{unique[-6:]}", f"w{unique[-6:]}"
    topic = f"orders-{unique}"
    flows = [
        {
            "source": src,
            "target": dst,
            "topics": {"include": [f"(.*\\.)?{topic}"]},  # would take remote copies too, if the loop rules let it
            "replication_policy": policy,
            "checkpoint_location": str(tmp_path / f"ckpt-{src}"),
        }
        for src, dst in ((a, b), (b, a))
    ]
    config = parse_config(
        {
            "clusters": [cluster_entry(east, a), cluster_entry(west, b)],
            "flows": flows,
            "heartbeat_interval_s": 1,
            "metrics_port": free_port(),
        }
    )
    sent = {}
    for cluster, alias in ((east, a), (west, b)):
        create_topics(cluster.admin, {topic: 2})
        sent[alias] = [Record(i % 2, None, f"{alias}-{i}".encode()) for i in range(2 * PER_SIDE)]
        produce(cluster.client, topic, sent[alias][:PER_SIDE])

    mirror = Mirror(spark, config)
    copies = [
        (west, f"{a}.{topic}" if policy == "default" else topic),
        (east, f"{b}.{topic}" if policy == "default" else topic),
    ]
    want = 2 * PER_SIDE if policy == "default" else 4 * PER_SIDE
    with mirror_running(mirror, stop_timeout_s=300) as errors:
        for cluster, alias in ((east, a), (west, b)):
            produce(cluster.client, topic, sent[alias][PER_SIDE:])  # while it runs
        deadline = time.monotonic() + 300
        while any(count(c, t) < want for c, t in copies) and time.monotonic() < deadline and not errors:
            time.sleep(2)
        if not errors:
            time.sleep(10)  # keep mirroring both ways a while longer: nothing more may arrive

    for cluster, here, there in ((east, a, b), (west, b, a)):
        names = {t for t in topics_on(cluster) if topic in t}
        if policy == "default":
            assert names == {topic, f"{there}.{topic}"}, names
            got = without_timestamps(read_all(cluster.client, f"{there}.{topic}", expected=2 * PER_SIDE))
            assert_each_record_once_in_order(f"{there}.{topic}", got, sent[there])
        else:
            assert names == {topic}, names
            got = without_timestamps(read_all(cluster.client, topic, expected=4 * PER_SIDE))
            # Its own records as produced, and the other side's, each stamped with where it came from.
            assert_each_record_once_in_order(topic, [r for r in got if not r.headers], sent[here])
            stamp = ((PROVENANCE_HEADER, there.encode()),)
            copies = [dataclasses.replace(r, headers=stamp) for r in sent[there]]
            assert_each_record_once_in_order(topic, [r for r in got if r.headers], copies)
        assert not any(t.startswith((f"{a}.{b}.", f"{b}.{a}.", f"{a}.{a}.", f"{b}.{b}.")) for t in topics_on(cluster))
    for dr in mirror.dr.values():
        assert dr.newest_heartbeat_ms is not None, f"no heartbeat of {dr.flow.name} reached its target"
