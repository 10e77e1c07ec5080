"""The refusals of `failback` and `status` that the other DR tests leave out, each with and without `--force`, on
clusters of their own and no Spark: a checkpoint not yet current, members still on the primary, and a source that
does not answer. (A forward flow still lagging and consumers still on DR: tests/test_dr_failback.py; a mirror still
running and a crashed one's lease: tests/test_dr_failover.py and tests/test_dr_failback.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from bench.testbed import clients as bed
from bench.testbed.clients import Record, commit, create_topics, produce
from bench.testbed.kafka_cluster import KafkaCluster, cluster_entry
from bench.testbed.ports import free_port
from spark_app import clients
from spark_app.cli import main as cli_main
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr import views
from spark_app.dr.formats import Checkpoint, OffsetSync
from spark_app.dr.groups import ClusterGroups
from spark_app.policy import checkpoints_topic, offset_syncs_topic


@pytest.fixture(scope="module")
def pair(testbed):
    """A primary and a DR cluster of their own."""
    yield testbed.start("fr-primary", "plaintext"), testbed.start("fr-dr", "plaintext")
    testbed.retire("fr-primary")
    testbed.retire("fr-dr")


def active_active(
    primary: KafkaCluster, dr: KafkaCluster, topic: str, group: str, tmp_path: Path, p: str, d: str
) -> MirrorConfig:
    return parse_config(
        {
            "clusters": [cluster_entry(primary, p), cluster_entry(dr, d)],
            "flows": [
                {"source": p, "target": d, "topics": {"include": [topic]}, "groups": {"include": [group]},
                 "sync_topic_acls": False, "checkpoint_location": str(tmp_path / "fwd")},
                {"source": d, "target": p, "topics": {"include": [topic]}, "groups": {"include": [group]},
                 "sync_topic_acls": False, "checkpoint_location": str(tmp_path / "back")},
            ],
        }
    )  # fmt: skip


def after_an_outage(pair, unique: str, tmp_path: Path, checkpointed: int = 5) -> tuple[MirrorConfig, list[str], str]:
    """After a failover and an outage, as the mirrors leave it (no Spark): the group read `orders` on DR to 5 on
    partition 0; the reverse flow copied DR's 5 records to `d.orders` on the primary (its offset syncs say so), and
    its newest checkpoint of the group is from when the group stood at `checkpointed`. Both flows' lag is 0."""
    primary, dr = pair
    topic, group = f"orders-{unique}", f"app-{unique}"
    p, d = f"p{unique[-6:]}", f"d{unique[-6:]}"  # the flows' internal topics are named after them
    config = active_active(primary, dr, topic, group, tmp_path, p, d)
    reverse = config.flow(f"{d}->{p}")
    create_topics(primary.admin, {topic: 1, f"{d}.{topic}": 1, checkpoints_topic(reverse): 1})
    create_topics(primary.admin, {offset_syncs_topic(reverse): 1})  # offset_syncs_location: target
    create_topics(dr.admin, {topic: 1, f"{p}.{topic}": 1})
    produce(dr.client, topic, [Record(0, None, f"d-{i}".encode()) for i in range(5)])
    produce(primary.client, f"{d}.{topic}", [Record(0, None, f"d-{i}".encode()) for i in range(5)])
    mirrored = OffsetSync(topic, 0, 0, 0, slot=0, last_offset=4)  # DR's 0..4 at the primary's 0..4
    produce(primary.client, offset_syncs_topic(reverse), [Record(0, mirrored.key(), mirrored.value())])
    commit(dr.client, group, topic, {0: 5})
    newest = Checkpoint(group, f"{d}.{topic}", 0, checkpointed, checkpointed)
    produce(primary.client, checkpoints_topic(reverse), [Record(0, newest.key(), newest.value())])
    path = tmp_path / "failback.json"
    path.write_text(json.dumps(config.model_dump(mode="json")))
    return config, ["failback", "--config", str(path), "--flow", f"{d}->{p}"], group


def test_failback_refuses_a_checkpoint_not_yet_current_and_forced_resumes_at_the_older_one(
    pair, unique: str, tmp_path: Path, capsys
):
    config, failback, group = after_an_outage(pair, unique, tmp_path, checkpointed=3)
    p, d = config.flows[0].source, config.flows[0].target
    topic = f"orders-{unique}"
    capsys.readouterr()
    assert cli_main(failback) == 1
    err = capsys.readouterr().err
    assert f"flow {d}->{p} has not yet checkpointed where these groups stopped on '{d}'" in err, err
    assert f"{group} {topic}[0]: committed 5 on DR, checkpoint 3 (re-reads from there)" in err, err
    assert ClusterGroups(config.cluster(p)).committed(group) == {}

    assert cli_main([*failback, "--force"]) == 0
    out = capsys.readouterr().out
    assert f"forced past: flow {d}->{p} has not yet checkpointed" in out, out
    assert ("where-stopped", group, f"{d}.{topic}", "0", "3", "commit") in {tuple(r.split()) for r in out.splitlines()}
    moved = ClusterGroups(config.cluster(p)).committed(group)
    assert moved[(f"{d}.{topic}", 0)].offset == 3  # re-reads two records, skips none


def test_failback_refuses_a_group_with_members_on_the_primary_even_forced(pair, unique: str, tmp_path: Path, capsys):
    config, failback, group = after_an_outage(pair, unique, tmp_path)
    p, d = config.flows[0].source, config.flows[0].target
    primary, _ = pair
    live = bed.consumer(primary.client, group, {"enable.auto.commit": False})
    live.subscribe([f"{d}.orders-{unique}"])
    try:
        for _ in range(120):
            if live.assignment():
                break
            live.poll(0.5)
        assert live.assignment(), "the consumer on the primary never joined its group"
        capsys.readouterr()
        for forced in ([], ["--force"]):
            assert cli_main([*failback, *forced]) == 1
            err = capsys.readouterr().err
            assert f"group '{group}' has 1 active member(s) on '{p}'" in err, err
            assert ClusterGroups(config.cluster(p)).committed(group) == {}
    finally:
        live.close()


def test_with_the_primary_down_status_reports_each_flow_and_failback_refuses_forced_or_not_naming_it(
    pair, unique: str, tmp_path: Path, capsys, monkeypatch
):
    """The primary gone (its address answers nothing). `status` reads what the forward flow's mirror wrote on DR and
    shows its lag as unknown, and says the reverse flow's state (on the primary) cannot be read, instead of failing
    whole; it exits 0. `failback` needs the primary: it stops, forced or not, naming it, with nothing moved."""
    config, failback, group = after_an_outage(pair, unique, tmp_path)
    # The dead address refuses at once, so every wait for it runs to its end: shorter ones prove the same.
    monkeypatch.setattr(clients, "REQUEST_TIMEOUT_S", 4.0)
    monkeypatch.setattr(views, "STATUS_SOURCE_TIMEOUT_S", 4.0)
    p, d = config.flows[0].source, config.flows[0].target
    forward = config.flow(f"{p}->{d}")
    _, dr = pair
    synced = OffsetSync(f"orders-{unique}", 0, 0, 0, slot=0, last_offset=0)
    create_topics(dr.admin, {offset_syncs_topic(forward): 1})
    produce(dr.client, offset_syncs_topic(forward), [Record(0, synced.key(), synced.value())])
    gone = config.model_dump(mode="json")
    dead = f"127.0.0.1:{free_port()}"
    gone["clusters"][0]["bootstrap_servers"] = dead
    path = tmp_path / "gone.json"
    path.write_text(json.dumps(gone))
    capsys.readouterr()

    assert cli_main(["status", "--config", str(path), "--json"]) == 0
    flows = {f["flow"]: f for f in json.loads(capsys.readouterr().out)["flows"]}
    assert not flows[f"{p}->{d}"]["source_reachable"] and flows[f"{p}->{d}"]["unreadable"] is None
    assert [(p["partition"], p["lag"]) for p in flows[f"{p}->{d}"]["partitions"]] == [(0, None)]
    assert f"cluster '{p}' ({dead}) is unreachable" in flows[f"{d}->{p}"]["unreadable"], flows[f"{d}->{p}"]

    down = [*failback[:2], str(path), *failback[3:]]
    for forced in ([], ["--force"]):
        assert cli_main([*down, *forced]) == 1
        err = capsys.readouterr().err
        assert f"error: cluster '{p}' ({dead}) is unreachable" in err, err
    assert ClusterGroups(config.cluster(p)).committed(group) == {}


def test_failback_puts_the_primarys_profile_back_once_every_group_moved(pair, unique: str, tmp_path: Path, capsys):
    """The profile failback writes: the primary, each topic by its own name there, and where the group resumes."""
    config, failback, group = after_an_outage(pair, unique, tmp_path)
    p, d = config.flows[0].source, config.flows[0].target
    topic = f"orders-{unique}"
    path = tmp_path / "profile.json"
    capsys.readouterr()
    assert cli_main([*failback, "--profile-out", str(path)]) == 0
    assert f"publish profile: wrote {path}" in capsys.readouterr().out
    profile = json.loads(path.read_text())
    assert (profile["verb"], profile["cluster"], profile["flow"]) == ("failback", p, f"{p}->{d}")
    assert profile["bootstrap_servers"] == config.cluster(p).bootstrap_servers
    assert profile["topics"] == [{"source_topic": topic, "topic": topic}]
    assert profile["groups"] == [{"group": group, "topic": f"{d}.{topic}", "partition": 0, "offset": 5}]


def test_failback_with_the_dr_clusters_groups_not_listed_stops_naming_it_and_moves_nothing(
    monkeypatch, tmp_path: Path, capsys
):
    """DR's brokers too slow to list their groups (seen on a loaded machine): one line naming DR, exit 1, no
    traceback; nothing is read from or written to the primary before it."""

    def timed_out(self: ClusterGroups, selection: object) -> list[str]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    monkeypatch.setattr(ClusterGroups, "groups", timed_out)
    dead = {"bootstrap_servers": f"127.0.0.1:{free_port()}", "profile": "kafka"}
    config = {
        "clusters": [{"alias": "p", **dead}, {"alias": "d", **dead}],
        "flows": [
            {"source": "p", "target": "d", "topics": {"include": ["orders"]}, "checkpoint_location": str(tmp_path)},
            {"source": "d", "target": "p", "topics": {"include": ["orders"]}, "checkpoint_location": str(tmp_path)},
        ],
    }
    path = tmp_path / "mirror.json"
    path.write_text(json.dumps(config))
    assert cli_main(["failback", "--config", str(path), "--flow", "d->p"]) == 1
    err = capsys.readouterr().err
    assert f"error: failback could not list the consumer groups on 'd' ({dead['bootstrap_servers']})" in err, err
    assert "Local: Timed out" in err and "Traceback" not in err and "nothing was moved" in err, err
