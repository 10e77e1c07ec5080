"""Disaster recovery end to end on real brokers and real Spark: checkpoints MM2 can read, failover, group sync."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from spark_app.cli import main as cli_main
from spark_app.config import parse_config
from spark_app.dr import read_checkpoints
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
