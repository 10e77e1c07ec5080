"""Disaster recovery end to end on real brokers and real Spark: checkpoints MM2 can read, failover, group sync."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from spark_app.cli import main as cli_main
from spark_app.config import parse_config
from spark_app.dr import read_checkpoints, read_offset_syncs
from spark_app.policy import event_hubs_topics
from spark_app.stream import Mirror
from tests.support.clients import Record, create_topics, produce
from tests.support.kafka_cluster import ClientSettings, kafka_classpath, require_java
from tests.support.mirror_config import cluster_entry

TRANSLATE_OFFSETS = Path(__file__).parent / "support" / "TranslateOffsets.java"


def mm2_translate(target: ClientSettings, source_alias: str, groups: list[str], folder: Path) -> dict:
    """{(group, topic, partition): offset} as MM2's RemoteClusterUtils.translateOffsets reads them on the target."""
    props = folder / "target.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in target.java().items()))
    cmd = [require_java(), "-cp", kafka_classpath(), str(TRANSLATE_OFFSETS), str(props), source_alias, *groups]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = {}
    for line in run.stdout.splitlines():
        group, topic, partition, offset = line.split("\t")
        out[(group, topic, int(partition))] = int(offset)
    return out


def commit(settings: ClientSettings, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(settings.librdkafka() | {"group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def committed(settings: ClientSettings, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer(settings.librdkafka() | {"group.id": group, "enable.auto.commit": False})
    got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    consumer.close()
    return {tp.partition: tp.offset for tp in got if tp.offset >= 0}


def values_from(settings: ClientSettings, topic: str, partition: int, offset: int) -> list[bytes]:
    consumer = Consumer(settings.librdkafka() | {"group.id": "dr-test-reader", "enable.auto.commit": False})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
    consumer.assign([TopicPartition(topic, partition, offset)])
    values = []
    deadline = time.monotonic() + 60
    while offset + len(values) < high and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    return values


def test_checkpoints_read_by_mm2_match_failover_and_group_sync_spares_a_live_group(
    spark, source_cluster, target_cluster, tmp_path, unique, capsys
):
    """MSK-like -> Event Hubs-like. Three groups: one caught up, one lagging far behind, one with a consumer live
    on the target. MM2's RemoteClusterUtils reads the same offsets `failover --dry-run` prints; none of them skips
    a record; group sync and failover commit the idle groups and leave the live one alone."""
    topic, alias = f"orders-{unique}", f"src{unique[-8:]}"
    remote = f"{alias}.{topic}"
    groups = {"caught-up": f"caught-up-{unique}", "lagging": f"lagging-{unique}", "live": f"live-{unique}"}
    config = parse_config(
        {
            "clusters": [cluster_entry(source_cluster, alias), cluster_entry(target_cluster, "eh")],
            "flows": [
                {
                    "source": alias,
                    "target": "eh",
                    "topics": {"include": [topic]},
                    "groups": {"include": [f".*-{unique}"]},
                    "sync_group_offsets": True,
                    "checkpoint_location": str(tmp_path / "ckpt"),
                }
            ],
        }
    )
    create_topics(source_cluster.admin, {topic: 2})
    create_topics(target_cluster.admin, dict.fromkeys(event_hubs_topics(config)["eh"], 1) | {remote: 2})
    produce(source_cluster.client, topic, [Record(i % 2, str(i).encode(), str(i).encode()) for i in range(400)])
    commit(source_cluster.client, groups["caught-up"], topic, {0: 200, 1: 200})
    commit(source_cluster.client, groups["lagging"], topic, {0: 7, 1: 150})
    commit(source_cluster.client, groups["live"], topic, {0: 100, 1: 100})
    # A consumer of the live group is a member on the target, where it committed its own position.
    live = Consumer(target_cluster.client.librdkafka() | {"group.id": groups["live"], "enable.auto.commit": False})
    live.subscribe([remote])
    deadline = time.monotonic() + 60
    while not live.assignment() and time.monotonic() < deadline:
        live.poll(0.5)
    assert live.assignment(), "the live consumer never joined its group on the target"
    live.commit(offsets=[TopicPartition(remote, 0, 3)], asynchronous=False)
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))

    try:
        Mirror(spark, config).run_available_now()
        checkpoints = {k: cp for k, (cp, _) in read_checkpoints(config, config.flows[0]).items()}

        assert cli_main(["failover", "--config", str(config_file), "--flow", f"{alias}->eh", "--dry-run"]) == 0
        printed = {}
        for line in capsys.readouterr().out.splitlines()[1:]:
            group, topic_, partition, source_offset, target_offset, reread = line.split()
            printed[(group, topic_, int(partition))] = (int(source_offset), int(target_offset), int(reread))
        assert sorted(printed) == sorted((g, remote, p) for g in groups.values() for p in (0, 1))
        # MirrorMaker 2's own client library reads our checkpoints and gets the very same offsets.
        mm2 = mm2_translate(target_cluster.client, alias, list(groups.values()), tmp_path)
        assert mm2 == {k: v[1] for k, v in printed.items()}
        for (group, _, partition), (source_offset, target_offset, reread) in printed.items():
            assert checkpoints[(group, remote, partition)].upstream_offset == source_offset
            # Never skips: the next unread source record is among those read from the translated offset on,
            # and no more than `reread` records come before it.
            resumed = values_from(target_cluster.client, remote, partition, target_offset)
            if source_offset == 200:  # consumed all: resumes at the end, nothing read again
                assert (resumed, reread) == ([], 0), (group, partition)
                continue
            next_unread = str(2 * source_offset + partition).encode()
            assert next_unread in resumed, (group, partition)
            assert resumed.index(next_unread) <= reread, (group, partition)
        assert printed[(groups["caught-up"], remote, 0)][1:] == (200, 0)
        assert printed[(groups["lagging"], remote, 0)][0] == 7  # far behind, translated all the same

        # Group sync committed the idle groups on the target, and left the live one as its consumer set it.
        assert committed(target_cluster.client, groups["caught-up"], remote, 2) == {0: 200, 1: 200}
        lagging = committed(target_cluster.client, groups["lagging"], remote, 2)
        assert lagging == {p: printed[(groups["lagging"], remote, p)][1] for p in (0, 1)}
        assert committed(target_cluster.client, groups["live"], remote, 2) == {0: 3}

        # Failover refuses the live group by name and reports the others as done.
        assert cli_main(["failover", "--config", str(config_file), "--flow", f"{alias}->eh"]) == 1
        out = capsys.readouterr()
        assert f"group '{groups['live']}' has 1 active member(s) on 'eh'" in out.err
        assert f"kept {groups['caught-up']} {remote}[0] = 200" in out.out
        assert committed(target_cluster.client, groups["live"], remote, 2) == {0: 3}

        assert cli_main(["status", "--config", str(config_file), "--json"]) == 0
        (flow,) = json.loads(capsys.readouterr().out)["flows"]
        assert [(p["topic"], p["partition"], p["lag"]) for p in flow["partitions"]] == [(topic, 0, 0), (topic, 1, 0)]
        assert all(p["checkpoint_age_s"] is not None and p["checkpoint_age_s"] < 600 for p in flow["partitions"])
    finally:
        live.close()


def test_dr_drill_primary_lost_group_resumes_on_dr_without_loss(spark, testbed, target_cluster, tmp_path, unique):
    """Steady producer, committing consumer, running mirror; the primary's broker is killed; failover; the same
    group resumes on DR. No record it had not processed (and that reached DR) is lost; duplicates stay within the
    records since the last checkpoint plus the re-read failover printed."""
    primary = testbed.start(f"drill-{unique[-8:]}", "plaintext")
    topic, group = f"orders-{unique}", f"app-{unique}"
    remote = f"primary.{topic}"
    config = parse_config(
        {
            "clusters": [cluster_entry(primary, "primary"), cluster_entry(target_cluster, "dr")],
            "flows": [
                {
                    "source": "primary",
                    "target": "dr",
                    "topics": {"include": [topic]},
                    "groups": {"include": [group]},
                    "checkpoint_location": str(tmp_path / "ckpt"),
                }
            ],
            "checkpoint_interval_s": 2,
            "heartbeat_interval_s": 1,
            "trigger_interval_s": 1,
        }
    )
    create_topics(primary.admin, {topic: 2})
    create_topics(target_cluster.admin, dict.fromkeys(event_hubs_topics(config)["dr"], 1) | {remote: 2})
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))

    stop = threading.Event()
    acked: dict[bytes, float] = {}  # value -> when the primary acknowledged it
    processed: list[tuple[int, int, bytes]] = []  # (partition, offset, value) the application handled on primary

    def producer_loop() -> None:
        producer = Producer(primary.client.librdkafka() | {"linger.ms": 5, "message.timeout.ms": 5000})
        i = 0
        while not stop.is_set():
            value = str(i).encode()
            producer.produce(topic, value=value, partition=i % 2, on_delivery=lambda e, m: e or acked.__setitem__(
                m.value(), time.time()))  # fmt: skip
            producer.poll(0)
            i += 1
            time.sleep(0.01)
        producer.flush(5)

    def consumer_loop() -> None:
        consumer = Consumer(
            primary.client.librdkafka()
            | {"group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            processed.append((msg.partition(), msg.offset(), msg.value()))
            time.sleep(0.02)  # slower than the producer: the application lags, as real ones do
            if len(processed) % 25 == 0:
                with contextlib.suppress(Exception):
                    consumer.commit(asynchronous=False)

    mirror = Mirror(spark, config)
    threads = [threading.Thread(target=f, daemon=True) for f in (producer_loop, consumer_loop, mirror.run_forever)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(
        cp.group == group for cp, _ in read_checkpoints(config, config.flows[0]).values()
    ):
        time.sleep(2)
    time.sleep(8)  # a few more batches and checkpoints under load
    primary.kill()
    killed_at = time.time()
    stop.set()
    mirror.stopping.set()
    for t in threads:
        t.join(300)
    for flow in mirror.flows:  # the loop may have ended on the unreachable source; stop what is left
        flow.stop_between_batches()
    for dr in mirror.dr.values():
        dr.stop()

    on_dr = {p: values_from(target_cluster.client, remote, p, 0) for p in (0, 1)}
    mirrored = {v for values in on_dr.values() for v in values}
    unmirrored = [at for v, at in acked.items() if v not in mirrored]
    rpo_s = killed_at - min(unmirrored) if unmirrored else 0.0

    checkpoints = {
        cp.partition: cp for cp, _ in read_checkpoints(config, config.flows[0]).values() if cp.group == group
    }
    began = time.time()
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr"]) == 0
    resumed = Consumer(
        target_cluster.client.librdkafka() | {"group.id": group, "enable.auto.commit": False,
                                               "auto.offset.reset": "earliest"}
    )  # fmt: skip
    resumed.subscribe([remote])
    consumed: list[bytes] = []
    first_at = None
    end = time.monotonic() + 120
    while len(set(consumed) | {v for _, _, v in processed}) < len(mirrored | {v for _, _, v in processed}):
        assert time.monotonic() < end, "the group did not reach the end of the DR copy"
        msg = resumed.poll(0.5)
        if msg is not None and msg.error() is None:
            first_at = first_at or time.time()
            consumed.append(msg.value())
    resumed.close()

    done = {v for _, _, v in processed}
    assert first_at is not None and mirrored - done, "the drill needs records mirrored but not yet processed"
    assert mirrored - done <= set(consumed), "a record that reached DR and was never processed was not consumed"
    duplicates = set(consumed) & done
    since_checkpoint = sum(1 for p, o, _ in processed if o >= checkpoints[p].upstream_offset)
    store = read_offset_syncs(config, config.flows[0])
    reread = sum(store.reread(topic, p, cp.upstream_offset, cp.downstream_offset) or 0 for p, cp in checkpoints.items())
    assert len(duplicates) <= since_checkpoint + reread, (len(duplicates), since_checkpoint, reread)
    print(
        f"\nDR drill: {len(acked)} produced, {len(mirrored)} mirrored, {len(done)} processed on primary;"
        f" RPO {len(unmirrored)} records / {rpo_s:.1f}s; RTO {first_at - began:.1f}s;"
        f" {len(duplicates)} duplicates (bound {since_checkpoint} since checkpoint + {reread} re-read)"
    )
