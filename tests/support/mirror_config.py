"""Mirror configs that point at test-bed clusters, with secrets in files as a Kubernetes Secret mount would give."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.testbed.clients import ClusterConfig, create_topics
from bench.testbed.kafka_cluster import KafkaCluster, MultiBrokerCluster, cluster_entry
from spark_app.config import FlowConfig, MirrorConfig
from spark_app.dr.internal import compacted_topics
from spark_app.policy import event_hubs_topics

Cluster = KafkaCluster | MultiBrokerCluster

FLOW_KEYS = frozenset(FlowConfig.model_fields) - {"source", "target", "topics", "checkpoint_location"}
MIRROR_KEYS = frozenset(MirrorConfig.model_fields) - {"clusters", "flows"}


def create_event_hubs(admin: ClusterConfig, config: MirrorConfig, alias: str, sizes: dict[str, int]) -> None:
    """Every hub infra makes on Event Hubs cluster `alias` for `config`, as infra makes them: the internal ones read
    back by key compacted, each hub with the partitions `sizes` gives it (else one)."""
    hubs, compacted = event_hubs_topics(config)[alias], compacted_topics(config)[alias]
    create_topics(admin, {h: sizes.get(h, 1) for h in hubs if h not in compacted})
    create_topics(admin, dict.fromkeys(compacted & set(hubs), 1), {"cleanup.policy": "compact"})


def one_flow_config(
    source: Cluster | dict,
    target: Cluster | dict,
    topics: Sequence[str] | dict,
    checkpoint_location: Path | str,
    *,
    source_alias: str | None = None,
    target_alias: str | None = None,
    **keys: object,
) -> dict:
    """The raw config (as a YAML file would give it) of one flow `source -> target`.

    `source` and `target` are test-bed clusters, entered under `source_alias` and `target_alias` (`onprem` and `dr`
    unless given), or ready `clusters[]` entries, which keep their own alias. `topics` is the flow's selection, or
    just the names or patterns it includes. Every other keyword is a key of the flow (`emit_heartbeats=False`) or of
    the config itself (`metrics_port=...`), as the schema places it; an unknown key fails here, naming it.
    """
    unknown = set(keys) - FLOW_KEYS - MIRROR_KEYS
    if unknown:
        raise TypeError(f"one_flow_config: {', '.join(sorted(unknown))} is neither a flow key nor a config key")
    clusters = [_entry(source, source_alias, "onprem"), _entry(target, target_alias, "dr")]
    flow = {
        "source": clusters[0]["alias"],
        "target": clusters[1]["alias"],
        "topics": dict(topics) if isinstance(topics, dict) else {"include": list(topics)},
        "checkpoint_location": str(checkpoint_location),
    }
    flow |= {k: v for k, v in keys.items() if k in FLOW_KEYS}
    return {"clusters": clusters, "flows": [flow]} | {k: v for k, v in keys.items() if k in MIRROR_KEYS}


def _entry(cluster: Cluster | dict, alias: str | None, default: str) -> dict:
    if not isinstance(cluster, dict):
        return cluster_entry(cluster, alias or default)
    if alias is not None:
        raise TypeError(f"one_flow_config: the entry '{cluster['alias']}' keeps its alias; '{alias}' is not used")
    return cluster
