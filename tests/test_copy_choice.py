"""One function picks the core that copies each flow, says why, and every copy path asks it rather than decide."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from spark_app.cli import main as cli_main
from spark_app.config import MirrorConfig, parse_config
from spark_app.copy_wing.choice import Core, choices, choose
from spark_app.metrics import MirrorMetrics
from spark_app.range_copy import RangeCopier
from spark_app.realtime.task import CopierTask
from spark_app.topics import TargetRules

PACKAGE = Path(__file__).resolve().parent.parent / "spark_app"
CLUSTERS = [
    {"alias": "kafka", "bootstrap_servers": "k.example:9092", "profile": "kafka"},
    {"alias": "scram", "bootstrap_servers": "s.example:9096", "profile": "msk-scram", "username": "m",
     "password": {"env": "SCRAM_PASSWORD"}},
    {"alias": "eh", "bootstrap_servers": "ns.servicebus.windows.net:9093", "profile": "eventhubs",
     "password": {"file": "/var/run/secrets/eh"}},
    {"alias": "iam", "bootstrap_servers": "b.example:9098", "profile": "msk-iam", "region": "eu-west-1"},
    {"alias": "entra", "bootstrap_servers": "e.servicebus.windows.net:9093", "profile": "eventhubs-entra"},
    {"alias": "mtls", "bootstrap_servers": "m.example:9094", "profile": "mtls", "client_cert_file": "/c.pem",
     "client_key": {"file": "/k.pem"}},
    {"alias": "tuned", "bootstrap_servers": "t.example:9092", "profile": "kafka",
     "client_overrides": {"fetch.wait.max.ms": "100"}},
    {"alias": "raw", "bootstrap_servers": "r.example:9092", "profile": "kafka",
     "client_overrides": {"linger.ms": "5", "queue.buffering.max.messages": "1000"}},
]  # fmt: skip


def config(source: str, target: str, **flow: object) -> MirrorConfig:
    topics = ["orders"] if target in ("eh", "entra") else ["orders.*"]
    entry = {"source": source, "target": target, "topics": {"include": topics}, "checkpoint_location": "/c"}
    return parse_config({"clusters": CLUSTERS, "flows": [entry | flow]}, source="test")


@pytest.mark.parametrize(
    ("source", "target", "flow", "core", "why"),
    [
        ("scram", "eh", {}, Core.RUST, "librdkafka without Python per record"),
        ("scram", "kafka", {"copy_core": "python"}, Core.PYTHON, "the flow's copy_core is 'python'"),
        ("scram", "kafka", {"exactly_once": True}, Core.RUST, "a slot's transactions with librdkafka"),
        ("iam", "kafka", {"exactly_once": True}, Core.RUST, "a slot's transactions with librdkafka"),  # token logins
        ("iam", "eh", {}, Core.RUST, "librdkafka without Python per record"),  # the token callback's, called by it
        ("scram", "entra", {}, Core.RUST, "librdkafka without Python per record"),
        ("mtls", "eh", {}, Core.RUST, "librdkafka"),
        ("scram", "kafka", {"mode": "realtime"}, Core.JVM, "a slot's transactions with Kafka's Java clients"),
        ("scram", "eh", {"mode": "realtime", "exactly_once": True}, Core.JVM, "Kafka's Java clients"),
        ("scram", "eh", {"mode": "realtime"}, Core.RUST, "librdkafka"),  # no transactions into Event Hubs
        ("iam", "eh", {"mode": "realtime"}, Core.RUST, "librdkafka"),
        ("mtls", "kafka", {"mode": "realtime"}, Core.JVM, "Kafka's Java clients"),  # the key read on the executor
        ("iam", "kafka", {"mode": "realtime"}, Core.RUST, "cluster 'iam': no Java client settings for profile"),
        ("iam", "kafka", {"mode": "realtime", "exactly_once": True}, Core.RUST, "transactions with librdkafka"),
        ("scram", "tuned", {"mode": "realtime"}, Core.JVM, "Kafka's Java clients"),  # tuning overrides, by Java names
        ("scram", "raw", {"mode": "realtime"}, Core.RUST,
         "cluster 'raw': client_overrides.queue.buffering.max.messages is a librdkafka setting"),
        ("kafka", "scram", {"mode": "realtime", "replication_policy": "identity"}, Core.JVM,
         "Kafka's Java clients"),  # it drops the echoes and stamps the rest as the Python loop does
        ("kafka", "scram", {"mode": "realtime", "replication_policy": "identity", "provenance_header": False},
         Core.JVM, "Kafka's Java clients"),  # names kept, nothing stamped: the JVM copier copies it as it is
        ("scram", "kafka", {"mode": "realtime", "copy_core": "python"}, Core.PYTHON, "copy_core is 'python'"),
    ],
)  # fmt: skip
def test_each_flow_gets_one_core_and_the_reason_for_it(source, target, flow, core, why):
    cfg = config(source, target, **flow)
    (choice,) = choices(cfg)
    assert (choice.core, choice.flow) == (core, f"{source}->{target}")
    assert why in choice.reason, choice
    assert (core is Core.PYTHON) == (flow.get("copy_core") == "python"), "the Python loop only where asked for"
    assert str(choice).startswith(f"flow {source}->{target}: {choice.copies} copy with the {core.value} core")


def test_what_a_flow_copies_names_its_mode_and_how_it_commits():
    assert choices(config("scram", "eh"))[0].copies == "throughput batches"
    assert choices(config("scram", "kafka", mode="realtime"))[0].copies == "real-time slots (transactions)"
    eo = choices(config("scram", "kafka", mode="realtime", exactly_once=True))[0]
    assert eo.copies == "real-time slots (transactions, exactly once)"


def test_the_throughput_copy_and_the_real_time_task_copy_with_the_core_chosen():
    for flow_keys, core in (({}, Core.RUST), ({"copy_core": "python"}, Core.PYTHON)):
        cfg = config("scram", "kafka", **flow_keys)
        flow, source, target = cfg.flows[0], cfg.cluster("scram"), cfg.cluster("kafka")
        assert RangeCopier(flow, source, target).core is core is choose(flow, source, target).core
    cfg = config("scram", "eh", mode="realtime")
    flow, source, target = cfg.flows[0], cfg.cluster("scram"), cfg.cluster("eh")
    task = CopierTask(flow, source, target, ("127.0.0.1", 1), b"k", TargetRules())
    assert task.core is Core.RUST is choose(flow, source, target).core


def test_no_module_but_the_choice_reads_a_flows_copy_core():
    """The choice lives once: a copy path that read `copy_core` itself would decide beside it."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "copy_core":
                readers.append(str(path.relative_to(PACKAGE)))
    assert set(readers) == {"copy_wing/choice.py"}, readers


def test_describe_offline_shows_each_flows_core_and_why_without_reading_a_secret(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SCRAM_PASSWORD", raising=False)  # offline reads no secret: a missing one must not matter
    path = tmp_path / "mirror.json"
    path.write_text(json.dumps({"clusters": CLUSTERS, "flows": [
        {"source": "scram", "target": "eh", "topics": {"include": ["orders"]}, "checkpoint_location": "/1"},
        {"source": "iam", "target": "kafka", "topics": {"include": ["x.*"]}, "checkpoint_location": "/2",
         "mode": "realtime"},
    ]}))  # fmt: skip
    assert cli_main(["describe", "--config", str(path), "--offline"]) == 0
    described = json.loads(capsys.readouterr().out)
    copies = {f["flow"]: (f["copy"]["core"], f["copy"]["copies"]) for f in described["flows"]}
    assert copies == {"scram->eh": ("rust", "throughput batches"),
                      "iam->kafka": ("rust", "real-time slots (transactions)")}  # fmt: skip
    assert "no Java client settings for profile 'msk-iam'" in described["flows"][1]["copy"]["reason"]
    assert all(f["topics"] is None for f in described["flows"])
    assert all(c["settings"] is None for c in described["clusters"].values())


def test_the_metrics_carry_each_flows_core_as_a_label():
    metrics = MirrorMetrics()
    for choice in choices(config("scram", "kafka", mode="realtime")):
        metrics.core_chosen(choice.flow, choice.core.value, choice.copies)
    exposition = generate_latest(metrics.registry).decode()
    line = 'mirrorkit_copy_core_info{copies="real-time slots (transactions)",core="jvm",flow="scram->kafka"} 1.0'
    assert line in exposition
