"""Topic naming and loop rules, shared by the mirror and by infra (which pre-creates Event Hubs hubs).

- `default` (MirrorMaker 2's DefaultReplicationPolicy): `orders` from alias `A` becomes `A.orders`; a topic that is
  already a remote copy from the flow's target is never mirrored back, so active/active cannot cycle.
- `identity`: names are kept; each record carries a provenance header, `<source alias>:<source offset>`, and a flow
  drops records whose provenance is its own target. The offset lets the flow that drops such an echo of a
  target-local record tell which of them a source group has read (spark_app.dr.syncs).
"""

from __future__ import annotations

from .config import FlowConfig, MirrorConfig

PROVENANCE_HEADER = "mirrorkit.source"
HEARTBEATS_TOPIC = "heartbeats"
# Never mirrored, whatever a flow's patterns say: Kafka's own topics, MM2's and ours.
_INTERNAL_PREFIXES = ("__", "mm2-", "mirrorkit-")
_INTERNAL_SUFFIXES = (".internal", "-internal")
_CONNECT_TOPICS = ("connect-configs", "connect-offsets", "connect-status")


def is_internal(topic: str) -> bool:
    return (
        topic.startswith(_INTERNAL_PREFIXES)
        or topic.endswith(_INTERNAL_SUFFIXES)
        or topic in _CONNECT_TOPICS
        or topic.endswith(tuple(f".{t}" for t in _CONNECT_TOPICS))
    )


def target_topic(flow: FlowConfig, source_topic: str) -> str:
    if flow.replication_policy == "identity":
        return source_topic
    return f"{flow.source}{flow.separator}{source_topic}"


def origin_alias(flow: FlowConfig, topic: str) -> str | None:
    """The alias a `default`-policy remote copy came from (`B.orders` -> `B`), or None for a local topic."""
    alias, sep, rest = topic.partition(flow.separator)
    return alias if sep and rest else None


def should_mirror(flow: FlowConfig, source_topic: str) -> bool:
    """Whether a topic on the flow's source cluster is copied by this flow."""
    if is_internal(source_topic):
        return False
    if source_topic == HEARTBEATS_TOPIC:
        return True  # heartbeats always travel, like MM2's, to measure end-to-end liveness
    if flow.replication_policy == "default" and origin_alias(flow, source_topic) == flow.target:
        return False  # a copy that came from our target: mirroring it back would cycle
    return flow.topics.matches(source_topic)


def provenance(alias: str, offset: int) -> bytes:
    """The provenance header's value for a record copied from `alias` at source `offset`."""
    return f"{alias}:{offset}".encode()


def origin(value: str | bytes) -> tuple[bytes, int]:
    """A provenance value's alias and source offset; -1 for a value without one (an older mirror's bare alias)."""
    alias, _, offset = (value.encode() if isinstance(value, str) else value).partition(b":")
    return alias, int(offset) if offset.isdigit() else -1


def drops_record(flow: FlowConfig, value: str | bytes | None) -> bool:
    """Identity loop prevention: a record that came from the flow's target must not go back there."""
    return (
        flow.replication_policy == "identity"
        and flow.provenance_header
        and value is not None
        and origin(value)[0] == flow.target.encode()
    )


def echoes_back(config: MirrorConfig, flow: FlowConfig) -> bool:
    """Whether records written locally on the flow's target come back to its source, stamped, through an identity
    flow the other way: then its translation can tell which of them a group has read (spark_app.dr.syncs)."""
    return flow.replication_policy == "identity" and any(
        back.source == flow.target and back.target == flow.source and back.replication_policy == "identity"
        and back.provenance_header
        for back in config.flows
    )  # fmt: skip


def checkpoints_topic(flow: FlowConfig) -> str:
    """MM2's name, on the target, so RemoteClusterUtils.translateOffsets reads our checkpoints."""
    return f"{flow.source}.checkpoints.internal"


def offset_syncs_topic(flow: FlowConfig) -> str:
    """Named after the other cluster's alias, as MM2 does, but not MM2's name: see spark_app/dr.py for why."""
    other = flow.source if flow.offset_syncs_location == "target" else flow.target
    return f"mirrorkit-offset-syncs.{other}.internal"


def event_hubs_topics(config: MirrorConfig) -> dict[str, list[str]]:
    """Every topic the mirror writes to on each Event Hubs cluster, which infra must therefore create.

    Derived from the same flows and naming policy the mirror uses, so the two cannot disagree.
    """
    needed: dict[str, set[str]] = {c.alias: set() for c in config.clusters if c.is_eventhubs}
    for flow in config.flows:
        names = flow.topics.literal_names() or []
        if flow.target in needed:
            target = needed[flow.target]
            target.update(target_topic(flow, t) for t in names if should_mirror(flow, t))
            target.add(target_topic(flow, HEARTBEATS_TOPIC))
            target.add(checkpoints_topic(flow))
            if flow.dead_letter_topic:
                target.add(flow.dead_letter_topic)
            if flow.offset_syncs_location == "target":
                target.add(offset_syncs_topic(flow))
        if flow.source in needed:
            if flow.emit_heartbeats:
                needed[flow.source].add(HEARTBEATS_TOPIC)
            if flow.offset_syncs_location == "source":
                needed[flow.source].add(offset_syncs_topic(flow))
    return {alias: sorted(topics) for alias, topics in needed.items()}
