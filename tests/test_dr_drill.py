"""`mirrorkit drill` against a running mirror: RPO, RTO and re-read measured with a probe topic and group of its own."""

from __future__ import annotations

import json

import pytest

from bench.testbed import clients
from bench.testbed.clients import Record, commit, committed, create_topics, produce
from bench.testbed.ports import free_port
from spark_app.cli import main as cli_main
from spark_app.clients import read_topic, watermarks
from spark_app.config import ClusterConfig, parse_config
from spark_app.dr.formats import Checkpoint
from spark_app.mirror import Mirror
from spark_app.policy import checkpoints_topic
from tests.support.mirror_config import create_event_hubs, one_flow_config
from tests.support.running import mirror_running


def ends(settings: ClusterConfig, topic: str, partitions: int) -> dict[int, int]:
    consumer = clients.consumer(settings, "drill-test-ends")
    try:
        return {p: watermarks(consumer, topic, p)[1] for p in range(partitions)}
    finally:
        consumer.close()


def groups_on(settings: ClusterConfig) -> set[str]:
    admin = clients.admin(settings)  # held: the futures of a client already freed never complete
    listing = admin.list_consumer_groups(request_timeout=30).result()
    return {g.group_id for g in listing.valid}


def test_drill_measures_rpo_rto_and_reread_and_touches_no_user_topic_or_group(
    spark, source_cluster, target_cluster, tmp_path, unique, capsys
):
    """MSK-like -> Event Hubs-like, the mirror running in a thread. The drill makes its probe topic, fails over its
    probe group alone, and reports figures that add up: RPO records are produced minus on-target at the cut, the
    re-read is within what the failover plan predicted, nothing is skipped. The user's topic and group are as they
    were, and the probe group is gone from both clusters."""
    alias = f"src{unique[-8:]}"
    user_topic, user_group, probe = f"orders-{unique}", f"app-{unique}", f"drill_{unique}"
    config = parse_config(
        one_flow_config(
            source_cluster,
            target_cluster,
            [user_topic, probe],
            tmp_path / "ckpt",
            source_alias=alias,
            target_alias="eh",
            groups={"include": [f".*{unique}.*"]},
            checkpoint_interval_s=1,
            emit_heartbeats=False,  # a `heartbeats` topic on the shared source would reach every later test's flow
            topic_sync_interval_s=2,
            metrics_port=free_port(),
        )
    )
    remotes = {f"{alias}.{user_topic}", f"{alias}.{probe}"}
    create_topics(source_cluster.admin, {user_topic: 2})
    create_event_hubs(target_cluster.admin, config, "eh", dict.fromkeys(remotes, 2))
    produce(source_cluster.client, user_topic, [Record(i % 2, None, str(i).encode()) for i in range(100)])
    commit(source_cluster.client, user_group, user_topic, {0: 20, 1: 30})
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    groups_before = {g for g in groups_on(source_cluster.client) if unique in g}

    with mirror_running(Mirror(spark, config), stop_timeout_s=300):
        args = ["drill", "--config", str(config_file), "--flow", f"{alias}->eh", "--probe-topic", probe]
        assert cli_main([*args, "--records", "300", "--seconds", "6", "--json"]) == 0
        out = capsys.readouterr()
        report = json.loads(out.out)
    with capsys.disabled():
        print("\ndrill report:", json.dumps({k: v for k, v in report.items() if k != "cleanup"}))

    assert report["probe_topic"] == probe and report["target_topic"] == f"{alias}.{probe}"
    assert report["produced"] >= 300  # the steady records, and the warm-up ones before them
    assert 0 <= report["rpo_records"] == report["produced"] - report["on_target_at_cut"]
    assert report["rpo_seconds"] >= 0 and (report["rpo_records"] == 0) == (report["rpo_seconds"] == 0)
    assert 0 < report["consumed_on_source"] < report["produced"]
    assert report["skipped"] == 0
    assert report["reread_bound"] is not None and 0 <= report["reread"] <= report["reread_bound"]
    unconsumed = report["produced"] - report["consumed_on_source"]
    assert report["read_on_target"] >= unconsumed + report["reread"]
    assert report["rto_seconds"] > 0  # measured and printed above, not bounded: its length is the machine's

    # The probe group is gone from both clusters; the probe topic stays (the report says so).
    probe_group = report["probe_group"]
    assert probe_group.startswith(f"{probe}-")
    assert probe_group not in groups_on(source_cluster.client) | groups_on(target_cluster.client)
    # Its checkpoints end in tombstones, so no later failover brings it back on the target.
    keys = {Checkpoint(probe_group, f"{alias}.{probe}", p, -1, -1).key() for p in (0, 1)}
    newest = {m.key(): m.value() for m in read_topic(config.cluster("eh"), checkpoints_topic(config.flows[0]))}
    assert keys <= set(newest) and all(newest[k] is None for k in keys)
    assert any(f"left topic '{probe}'" in line for line in report["cleanup"])
    # The user's topic and group are untouched: same records, same committed offsets, nothing committed on DR.
    assert ends(source_cluster.client, user_topic, 2) == {0: 50, 1: 50}
    assert ends(target_cluster.client, f"{alias}.{user_topic}", 2) == {0: 50, 1: 50}
    assert committed(source_cluster.client, user_group, user_topic, 2) == {0: 20, 1: 30}
    assert committed(target_cluster.client, user_group, f"{alias}.{user_topic}", 2) == {}
    assert {g for g in groups_on(source_cluster.client) if unique in g} == groups_before


def _config_file(tmp_path, **flow: object) -> str:
    """A config whose clusters are never reached: the drill refuses before it connects."""
    raw = {
        "clusters": [
            {"alias": "primary", "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"},
            {"alias": "dr", "bootstrap_servers": "127.0.0.1:2", "profile": "kafka"},
        ],
        "flows": [{"source": "primary", "target": "dr", "checkpoint_location": str(tmp_path / "c")} | flow],
    }
    path = tmp_path / "mirror.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize(
    ("flow", "probe", "named"),
    [
        ({"topics": {"include": ["orders"]}}, "mirrorkit_drill", "flows[0].topics.include"),
        ({"topics": {"include": [".*"], "exclude": ["mirrorkit_.*"]}}, "mirrorkit_drill", "flows[0].topics"),
        ({"topics": {"include": [".*"]}}, "mirrorkit-drill", "--probe-topic: 'mirrorkit-drill' is an internal name"),
        ({"topics": {"include": [".*"]}, "groups": {"include": ["app-.*"]}}, "mirrorkit_drill", "flows[0].groups"),
    ],
)
def test_drill_refuses_a_flow_that_would_not_mirror_its_probe_naming_the_setting(tmp_path, capsys, flow, probe, named):
    args = ["drill", "--config", _config_file(tmp_path, **flow), "--flow", "primary->dr", "--probe-topic", probe]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert named in err, err


def test_drill_refuses_an_event_hubs_source_without_the_probe_hub_naming_it(
    source_cluster, target_cluster, tmp_path, unique, capsys
):
    """Topics on Event Hubs are made by infra: the drill never creates the probe there, it names the missing hub."""
    probe = f"drill_{unique}"
    raw = one_flow_config(
        target_cluster, source_cluster, [probe], tmp_path / "ckpt", source_alias="eh", target_alias="msk"
    )
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(raw))
    assert cli_main(["drill", "--config", str(config_file), "--flow", "eh->msk", "--probe-topic", probe]) == 1
    err = capsys.readouterr().err
    assert f"event hub '{probe}' does not exist on 'eh'; infra must create it" in err, err
