"""Active/active: two flows, A->B and B->A, in one config, running both ways at once."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from bench.testbed import clients
from bench.testbed.clients import Record, commit, create_topics, produce, read_all
from bench.testbed.kafka_cluster import cluster_entry
from bench.testbed.ports import free_port
from spark_app.cli import main as cli_main
from spark_app.clients import watermarks
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order, stamped_at
from tests.support.polling import wait_until
from tests.support.running import mirror_running

PER_SIDE = 150


@pytest.fixture(scope="module")
def pair(testbed):
    """Two clusters of their own: a running mirror writes `heartbeats` on both, which others must not inherit."""
    yield testbed.start("aa-east", "plaintext"), testbed.start("aa-west", "plaintext")
    testbed.retire("aa-east")
    testbed.retire("aa-west")


def topics_on(cluster) -> set[str]:
    return set(clients.admin(cluster.admin).list_topics(timeout=30).topics)


def without_timestamps(records: list[Record]) -> list[Record]:
    """As sent: the records went out without a timestamp, the producer stamped them."""
    return [dataclasses.replace(r, timestamp_ms=None) for r in records]


def count(cluster, topic: str) -> int:

    consumer = clients.consumer(cluster.client, "aa-count")
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            return 0
        return sum(watermarks(consumer, topic, p)[1] for p in metadata.partitions)  # a fresh topic's leader may move
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("policy", "mode"), [("default", "throughput"), ("identity", "throughput"), ("identity", "realtime")]
)
def test_both_ways_each_record_lands_once_per_direction_and_names_never_grow(
    policy, mode, spark, pair, tmp_path, unique
):
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
            "mode": mode,
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

        def done() -> bool:  # every record copied, and each flow's heartbeats seen on its target
            heartbeats = all(dr.newest_heartbeat_ms is not None for dr in mirror.dr.values())
            return heartbeats and all(count(c, t) >= want for c, t in copies)

        while not done() and time.monotonic() < deadline and not errors:
            time.sleep(2)
        if not errors:
            # Keep mirroring both ways until each flow has copied what its source held 3 heartbeats after every
            # record was counted (its newest heartbeat on the target is that new): a record sent round again would
            # have come back by then, and nothing more may arrive.
            since_ms = int(time.time() * 1000) + 3000
            wait_until(
                lambda: all((dr.newest_heartbeat_ms or 0) >= since_ms for dr in mirror.dr.values()),
                "each flow's heartbeats from 3 s after the last record was counted on its target",
                errors=errors,
            )

    held = {}  # identity: each cluster's topic, its own records and the other side's copies interleaved
    if policy == "identity":
        held = {c.name: without_timestamps(read_all(c.client, topic, expected=4 * PER_SIDE)) for c in (east, west)}
    for cluster, other, here, there in ((east, west, a, b), (west, east, b, a)):
        names = {t for t in topics_on(cluster) if topic in t}
        if policy == "default":
            assert names == {topic, f"{there}.{topic}"}, names
            got = without_timestamps(read_all(cluster.client, f"{there}.{topic}", expected=2 * PER_SIDE))
            assert_each_record_once_in_order(f"{there}.{topic}", got, sent[there])
        else:
            assert names == {topic}, names
            got = held[cluster.name]
            # Its own records as produced, and the other side's, each stamped with where it came from: its offset
            # there, where the copies of this side's records may have landed between them.
            assert_each_record_once_in_order(topic, [r for r in got if not r.headers], sent[here])
            theirs = [r for r in held[other.name] if not r.headers]  # checked as that side's own in its turn
            assert_each_record_once_in_order(topic, [r for r in got if r.headers], stamped_at(theirs, there))
        assert not any(t.startswith((f"{a}.{b}.", f"{b}.{a}.", f"{a}.{a}.", f"{b}.{b}.")) for t in topics_on(cluster))
    for dr in mirror.dr.values():
        assert dr.newest_heartbeat_ms is not None, f"no heartbeat of {dr.flow.name} reached its target"


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_identity_failover_never_skips_a_record_written_locally_between_mirrored_ones(
    mode, spark, pair, tmp_path, unique, capsys
):
    """Identity both ways, local writes on B between A's records copied there. A's group has read A's newest
    records but not yet the copies of B's records that landed below them on B; failing over must resume at B's
    first record it has not read, and `failover --dry-run` says the position was held back for it."""
    east, west = pair
    a, b = f"e{unique[-6:]}", f"w{unique[-6:]}"
    topic, group = f"local-{unique}", f"app-{unique}"
    flows = [
        {
            "source": src,
            "target": dst,
            "topics": {"include": [topic]},
            "groups": {"include": [group]},
            "replication_policy": "identity",
            "checkpoint_location": str(tmp_path / f"ckpt-{src}"),
            "mode": mode,
        }
        for src, dst in ((a, b), (b, a))
    ]
    config = parse_config({"clusters": [cluster_entry(east, a), cluster_entry(west, b)], "flows": flows})
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    for cluster in (east, west):
        create_topics(cluster.admin, {topic: 1})
    # Each round: two records written on B, three on A, then both flows copy what is there. B then holds
    # B's two, A's three; A holds A's three, then B's two (stamped with their offsets on B).
    for r in range(3):
        produce(west.client, topic, [Record(0, None, f"{b}-{r}-{i}".encode()) for i in range(2)])
        produce(east.client, topic, [Record(0, None, f"{a}-{r}-{i}".encode()) for i in range(3)])
        Mirror(spark, config).run_available_now()
    on_a = read_all(east.client, topic, expected=15)
    # Read through A's last three records, not the two copied from B after them. An offset, not an index: a real-time
    # flow writes in transactions, whose commit markers take offsets of their own.
    committed_at = (on_a[12].offset or 0) + 1
    assert [r.value for r in on_a[10:15]] == [f"{a}-2-{i}".encode() for i in range(3)] + [
        f"{b}-2-{i}".encode() for i in range(2)
    ]
    commit(east.client, group, topic, {0: committed_at})
    Mirror(spark, config).run_available_now()  # its last checkpoint round translates the group

    assert cli_main(["failover", "--config", str(config_file), "--flow", f"{a}->{b}", "--dry-run"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert row[:3] == [group, topic, "0"] and row[6] == "held-for-local-records", row
    resume, reread = int(row[4]), int(row[5])
    assert cli_main(["failover", "--config", str(config_file), "--flow", f"{a}->{b}"]) == 0
    capsys.readouterr()

    read = {r.value for r in on_a if (r.offset or 0) < committed_at}
    on_b = read_all(west.client, topic, expected=15)
    assert len(on_b) == 15
    unread = [r.value for r in on_b if r.value not in read]
    resumed = [r.value for r in on_b if (r.offset or 0) >= resume]
    assert unread and all(v in resumed for v in unread), (resume, unread)  # nothing it had not read is skipped
    again = [v for v in resumed if v in read]
    assert len(again) <= reread, (again, reread)
    print(f"identity failover: resumed at B offset {resume}, {len(unread)} unread kept, {len(again)} read again")
