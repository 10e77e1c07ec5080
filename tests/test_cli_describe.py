"""`describe` shows what a config resolves to, from the live clusters, and never a secret."""

from __future__ import annotations

import json

import yaml

from bench.testbed.clients import create_topics
from bench.testbed.kafka_cluster import cluster_entry
from spark_app.cli import main as cli_main
from spark_app.config import ClusterConfig, FlowConfig, load_config
from spark_app.copy_wing.choice import choose


def test_describe_lists_each_flows_topics_as_named_on_the_target_with_secrets_redacted(
    source_cluster, target_cluster, tmp_path, capsys, unique
):
    topic, other = f"orders-{unique}", f"skipped-{unique}"
    create_topics(source_cluster.admin, {topic: 2, other: 1})
    config = tmp_path / "mirror.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "clusters": [cluster_entry(source_cluster, "msk"), cluster_entry(target_cluster, "eh")],
                "flows": [
                    {"source": "msk", "target": "eh", "topics": {"include": [topic]}, "checkpoint_location": "/c"}
                ],
            }
        )
    )
    assert cli_main(["describe", "--config", str(config)]) == 0
    printed = capsys.readouterr().out
    described = json.loads(printed)
    copy = {"copies": "throughput batches", "core": "rust", "reason": choose(*flow_and_clusters(config)).reason}
    assert described["flows"] == [
        {"flow": "msk->eh", "replication_policy": "default", "copy": copy, "topics": {topic: f"msk.{topic}"}}
    ]
    assert described["clusters"]["msk"]["profile"] == "msk-scram"
    assert described["clusters"]["msk"]["settings"]["sasl.password"] == "***"
    assert described["clusters"]["eh"]["settings"]["sasl.username"] == "$ConnectionString"
    for secret in (source_cluster.secret, target_cluster.secret):
        assert secret not in printed


def flow_and_clusters(path) -> tuple[FlowConfig, ClusterConfig, ClusterConfig]:
    config = load_config(str(path))
    (flow,) = config.flows
    return flow, config.cluster(flow.source), config.cluster(flow.target)
