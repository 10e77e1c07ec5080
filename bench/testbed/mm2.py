"""MirrorMaker 2 in dedicated mode (org.apache.kafka.connect.mirror.MirrorMaker) from the jars in the manifest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .kafka_cluster import LOG4J2_CONFIG, kafka_classpath, require_java
from .ports import free_port


def exactly_once_properties(source_alias: str, target_alias: str) -> dict[str, str]:
    """KIP-618 exactly-once source support as MirrorMaker's dedicated mode takes it (Kafka 3.5 and later): records and
    source offsets in one transaction per task poll (Connect's default `transaction.boundary`).

    A worker setting reaches the flow's Connect workers only with the target's prefix (MirrorMakerConfig.workerConfig
    copies `<target>.*` and a few storage and converter prefixes, nothing else). The upstream docs also ask for the
    internal REST server, over which followers reach the leader that fences zombie tasks, and for a read_committed
    source consumer, so aborted source transactions are not copied (MirrorSourceConnector reports exactly-once
    support only then)."""
    return {
        f"{target_alias}.exactly.once.source.support": "enabled",
        "dedicated.mode.enable.internal.rest": "true",
        "listeners": f"http://127.0.0.1:{free_port()}",
        f"{source_alias}.consumer.isolation.level": "read_committed",
    }


def target_topics(source_alias: str) -> dict[str, int]:
    """The topics dedicated-mode MM2 keeps on the target of a flow from `source_alias`, by partition count, all
    compacted: the worker's configs, offsets and status, the checkpoints, the heartbeats, and the copy of the source's
    heartbeats (MM2 copies any it finds there, the mirror's own among them). Where topics cannot be made from Kafka
    (Event Hubs), an operator makes them first."""
    worker = {f"mm2-{kind}.{source_alias}.internal": n for kind, n in (("configs", 1), ("offsets", 25), ("status", 5))}
    return worker | {f"{source_alias}.checkpoints.internal": 1, "heartbeats": 1, f"{source_alias}.heartbeats": 1}


def mm2_command(
    source_alias: str,
    source_bootstrap: str,
    target_alias: str,
    target_bootstrap: str,
    topics: Sequence[str],
    work: Path,
    extra: Mapping[str, str] | None = None,
    exactly_once: bool = False,
) -> list[str]:
    """The command that runs one MM2 flow `source_alias -> target_alias` (the reverse disabled), every internal
    topic with replication factor 1, `exactly_once` as `exactly_once_properties` says; `extra` adds or overrides MM2
    properties. The properties file goes to `work`."""
    props = {
        "clusters": f"{source_alias}, {target_alias}",
        f"{source_alias}.bootstrap.servers": source_bootstrap,
        f"{target_alias}.bootstrap.servers": target_bootstrap,
        f"{source_alias}->{target_alias}.enabled": "true",
        f"{source_alias}->{target_alias}.topics": ",".join(topics),
        f"{target_alias}->{source_alias}.enabled": "false",
        "tasks.max": "2",
        "replication.factor": "1",
        "sync.topic.acls.enabled": "false",
        **{
            f"{t}.replication.factor": "1"
            for t in ("checkpoints.topic", "heartbeats.topic", "offset-syncs.topic")
            + ("offset.storage", "status.storage", "config.storage")
        },
        **(exactly_once_properties(source_alias, target_alias) if exactly_once else {}),
        **(extra or {}),
    }
    path = work / f"mm2-{source_alias}-{target_alias}.properties"
    path.write_text("".join(f"{k} = {v}\n" for k, v in props.items()))
    return [require_java(), "-Xms256m", "-Xmx1g", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp", kafka_classpath(), "org.apache.kafka.connect.mirror.MirrorMaker", str(path),
            "--clusters", target_alias]  # fmt: skip
