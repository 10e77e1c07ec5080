"""Hub planning: every event hub an Event Hubs cluster needs, named by spark_app's policy and sized from the
source topic it copies."""

from __future__ import annotations

from dataclasses import dataclass

from infra.schema import ClusterSpec, SourceTopic
from spark_app.config import MirrorConfig
from spark_app.policy import checkpoints_topic, event_hubs_topics, offset_syncs_topic, target_topic


@dataclass(frozen=True)
class HubSpec:
    """One event hub to create: a mirrored topic's copy, or one of the mirror's internal topics."""

    name: str
    partitions: int
    compacted: bool
    own: bool = False  # one of the mirror's own topics (heartbeats, checkpoints, offset syncs, dead letters)


def plan_hubs(mirror: MirrorConfig, clusters: list[ClusterSpec], alias: str) -> list[HubSpec]:
    """The hubs of Event Hubs cluster `alias`: a copy is sized like its source topic (the stack's `topics` key of
    the source cluster), the mirror's own topics get one partition."""
    copied_from: dict[str, SourceTopic | None] = {}  # hub name -> the size of the source topic it copies
    sizes = {c.alias: c.source_topic_sizes for c in clusters}
    for flow in mirror.flows:
        if flow.target == alias:
            for topic in flow.topics.literal_names() or []:
                copied_from[target_topic(flow, topic)] = sizes[flow.source].get(topic)
    read_by_key = {name for f in mirror.flows for name in (checkpoints_topic(f), offset_syncs_topic(f))}
    hubs = []
    for name in event_hubs_topics(mirror)[alias]:
        size = copied_from.get(name)
        if size is not None:
            hubs.append(HubSpec(name, size.partitions, size.compacted))
        else:
            # The mirror's own topics (heartbeats, checkpoints, offset syncs, dead letters): one partition, like
            # MM2's; checkpoints and offset syncs are read back by key, so they are compacted.
            hubs.append(HubSpec(name, 1, name in read_by_key, own=True))
    return hubs
