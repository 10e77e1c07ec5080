"""What operators run: `status` (lag, checkpoint and heartbeat ages) and `failover` (where groups resume).

Both read only what the mirror wrote on the clusters, so they work beside a running mirror or without one; the
failover plan reads the target only, so it works with the source gone.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from confluent_kafka import KafkaException

from ..clients import Partition
from ..config import FlowConfig, MirrorConfig
from ..policy import target_topic
from .groups import ClusterGroups, GroupCommit
from .internal import newest_heartbeat_ms, read_checkpoints, read_offset_syncs, source_ends
from .syncs import SyncStore

STATUS_SOURCE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class FailoverRow:
    group: str
    topic: str  # on the target
    partition: int
    source_offset: int
    target_offset: int
    reread: int | None  # records read again, at most; None when the syncs to tell are gone
    # Held back to a record written locally on the target that the group may not have read (identity
    # active/active): exact when the flow the other way has copied it back, else a conservative re-read.
    held_for_local: bool = False


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    mirrored_offset: int
    source_end_offset: int | None  # None when the source is down
    lag: int | None
    checkpoint_age_s: float | None


@dataclass(frozen=True)
class FlowStatus:
    flow: str
    source_reachable: bool
    heartbeat_age_s: float | None
    partitions: list[PartitionStatus]


def failover_plan(config: MirrorConfig, flow: FlowConfig, groups: str | None = None) -> list[FailoverRow]:
    """Per group and partition, where a group resumes on the target: read on the target only."""
    pattern = re.compile(groups) if groups else None
    syncs = read_offset_syncs(config, flow) if flow.offset_syncs_location == "target" else SyncStore()
    by_remote = {(target_topic(flow, t), p): (t, p) for t, p in syncs.partitions()}
    rows = []
    for (group, topic, partition), (cp, _) in sorted(read_checkpoints(config, flow).items()):
        if not flow.groups.matches(group) or (pattern and not pattern.fullmatch(group)):
            continue
        source_tp = by_remote.get((topic, partition))
        reread = syncs.reread(*source_tp, cp.upstream_offset, cp.downstream_offset) if source_tp else None
        now = syncs.translate(*source_tp, cp.upstream_offset) if source_tp else None
        held = now is not None and now.guarded and now.downstream_offset >= cp.downstream_offset
        rows.append(FailoverRow(group, topic, partition, cp.upstream_offset, cp.downstream_offset, reread, held))
    return rows


def failover(config: MirrorConfig, flow: FlowConfig, plan: list[FailoverRow]) -> list[GroupCommit]:
    """Commit the plan on the target, group by group; a group with members there is refused by name."""
    target = ClusterGroups(config.cluster(flow.target))
    by_group: dict[str, dict[Partition, int]] = {}
    for row in plan:
        by_group.setdefault(row.group, {})[(row.topic, row.partition)] = row.target_offset
    return [target.commit(group, offsets) for group, offsets in sorted(by_group.items())]


def flow_status(config: MirrorConfig, flow: FlowConfig) -> FlowStatus:
    """Lag, checkpoint age and heartbeat age per topic-partition, from what the mirror wrote on the clusters."""
    now = time.time()
    syncs = read_offset_syncs(config, flow)
    checkpoint_at: dict[Partition, float] = {}
    for (_, topic, partition), (_, written) in read_checkpoints(config, flow).items():
        checkpoint_at[(topic, partition)] = max(written, checkpoint_at.get((topic, partition), 0.0))
    heartbeat = newest_heartbeat_ms(config, flow)
    ends: dict[Partition, int] | None
    try:
        ends = source_ends(config.cluster(flow.source), syncs.partitions(), STATUS_SOURCE_TIMEOUT_S)
    except KafkaException:
        ends = None  # the source is down: lag cannot be known
    rows = []
    for topic, partition in syncs.partitions():
        latest = syncs.latest(topic, partition)
        assert latest is not None  # every listed partition has a run
        mirrored = latest.last + 1
        end = None if ends is None else ends[(topic, partition)]
        at = checkpoint_at.get((target_topic(flow, topic), partition))
        rows.append(
            PartitionStatus(
                topic, partition, mirrored, end, None if end is None else max(0, end - mirrored),
                None if at is None else round(now - at, 3),
            )
        )  # fmt: skip
    heartbeat_age = None if heartbeat is None else round(now - heartbeat / 1000, 3)
    return FlowStatus(flow.name, ends is not None, heartbeat_age, rows)
