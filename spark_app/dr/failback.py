"""Failback: the steps of the README's failback a program can do, for a reverse flow DR->PRIMARY.

Given an active/active config with the original flow PRIMARY->DR and the reverse flow DR->PRIMARY, it first checks
what the operator must have done: no consumer of the reverse flow's selected groups runs on DR, and both flows have
lag 0 (every selected partition with records mirrored to its end; the mirror's own `heartbeats` aside, as they
keep moving, and under `identity` a tail of records the flow drops as they came from its target). Then, for each
of those groups on DR:

- where it stopped, for the data written on DR: the reverse flow's checkpoints put the group on the primary's
  `dr.<topic>` where it stopped on DR, as `failover` of the reverse flow does; each checkpoint must carry the
  group's committed offset on DR, or the failback waits for the next one. Skipped under `identity`, where the
  records written on DR land in the original topics on the primary;
- at the end, for the original topics: a group that consumed their copy on DR has read them all (or is refused),
  so it goes to their end on the primary.

Every commit goes through `ClusterGroups.commit`: a group with members on the primary is refused by name, and a
partition already at or past the offset is kept, never moved back.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from .. import clients
from ..clients import Partition
from ..config import ClusterConfig, ConfigError, FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..policy import HEARTBEATS_TOPIC, PROVENANCE_HEADER, drops_record, origin, should_mirror, target_topic
from .groups import ClusterGroups, GroupCommit
from .views import failover_plan, flow_status


class FailbackRefused(MirrorFailed):
    """The operator must act first; the message names each group, flow and partition in the way."""


class Move(enum.StrEnum):
    WHERE_STOPPED = "where-stopped"  # on `dr.<topic>`: where the group stopped on DR, through the checkpoints
    AT_END = "at-end"  # on an original topic, which the group read to the end via DR


@dataclass(frozen=True)
class FailbackAction:
    move: Move
    group: str
    topic: str  # on the primary
    partition: int
    offset: int
    done: str  # "commit", or "keep" (already at or past it); "would commit" / "would keep" on a dry run


@dataclass(frozen=True)
class FailbackResult:
    primary: str
    dr: str
    groups: list[str]
    actions: list[FailbackAction] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # groups refused by the primary (members there)


def original_flow(config: MirrorConfig, reverse: FlowConfig) -> FlowConfig:
    name = f"{reverse.target}->{reverse.source}"
    try:
        return config.flow(name)
    except ConfigError:
        raise ConfigError(
            f"flows: failback of {reverse.name} needs the original flow {name} in the same config (an active/active"
            " config: the original flow and the reverse one)"
        ) from None


def lag_problems(config: MirrorConfig, flow: FlowConfig) -> list[str]:
    """Why the flow's lag is not 0, per partition; [] when every selected partition is mirrored to its end."""
    status = flow_status(config, flow)
    if not status.source_reachable:
        return [f"flow {flow.name}: its source '{flow.source}' does not answer, so its lag is unknown"]
    source = config.cluster(flow.source)
    problems = [
        f"flow {flow.name}: {p.topic}[{p.partition}] lag {p.lag}"
        for p in status.partitions
        if p.topic != HEARTBEATS_TOPIC
        and p.lag
        and p.source_end_offset is not None
        and not dropped_tail(source, flow, p.topic, p.partition, p.mirrored_offset, p.source_end_offset)
    ]
    admin = clients.admin(source)
    selected = [
        (name, p)
        for name, meta in sorted(clients.list_topics(admin, source).items())
        if meta.error is None and name != HEARTBEATS_TOPIC and should_mirror(flow, name)
        for p in sorted(meta.partitions)
    ]
    synced = {(p.topic, p.partition) for p in status.partitions}
    unsynced = [tp for tp in selected if tp not in synced]
    if unsynced:
        first = clients.list_offsets(admin, unsynced, OffsetSpec.earliest())
        end = clients.list_offsets(admin, unsynced, OffsetSpec.latest())
        problems += [
            f"flow {flow.name}: {t}[{p}] has {end[(t, p)] - first[(t, p)]} record(s), none mirrored yet"
            for t, p in unsynced
            if end[(t, p)] > first[(t, p)]
        ]
    return problems


def dropped_tail(cluster: ClusterConfig, flow: FlowConfig, topic: str, partition: int, start: int, end: int) -> bool:
    """Whether every record in [start, end) is one the flow drops (under `identity`, a record that came from its
    target): the offset syncs end at the last record copied, so such a tail shows as lag that is none."""
    if flow.replication_policy != "identity" or not flow.provenance_header:
        return False
    reader = clients.consumer(cluster)
    try:
        reader.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + clients.REQUEST_TIMEOUT_S
        while time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            headers = msg.headers() or []  # a consumed record's headers come as a list of (key, value)
            pairs = headers.items() if isinstance(headers, dict) else headers
            stamp = next((v for k, v in pairs if k == PROVENANCE_HEADER), None)
            if not drops_record(flow, origin(stamp) if stamp is not None else None):
                return False
            if (msg.offset() or 0) + 1 >= end:
                return True
        return False
    finally:
        reader.close()


def failback(config: MirrorConfig, reverse: FlowConfig, dry_run: bool = False) -> FailbackResult:
    """Check, then move the reverse flow's groups to the primary; on a dry run, only say what."""
    original = original_flow(config, reverse)
    dr, primary = config.cluster(reverse.source), config.cluster(reverse.target)
    on_dr, on_primary = ClusterGroups(dr), ClusterGroups(primary)
    groups = on_dr.groups(reverse.groups)
    live = [f"{g} ({n} member(s))" for g in groups if (n := on_dr.members(g))]
    if live:
        raise FailbackRefused(
            f"consumers still run on '{dr.alias}' in group(s) {', '.join(live)}: let them finish (their lag 0) and stop"
            " them first (failback step 3)"
        )
    lagging = lag_problems(config, reverse) + lag_problems(config, original)
    if lagging:
        raise FailbackRefused(
            "lag is not 0; stop producers on DR and wait until `mirrorkit status` shows lag 0 on both flows"
            " (failback step 3):\n  " + "\n  ".join(lagging)
        )
    committed = {g: {tp: c.offset for tp, c in on_dr.committed(g).items()} for g in groups}
    wanted: dict[str, dict[Partition, tuple[Move, int]]] = {g: {} for g in groups}  # group -> tp -> (move, offset)
    if reverse.replication_policy == "default":
        for g, tp_offset in where_stopped(config, reverse, committed).items():
            wanted[g] |= {tp: (Move.WHERE_STOPPED, o) for tp, o in tp_offset.items()}
    for g, tp_offset in at_end(config, original, on_primary, on_dr, committed).items():
        wanted[g] |= {tp: (Move.AT_END, o) for tp, o in tp_offset.items()}
    result = FailbackResult(primary.alias, dr.alias, groups)
    for group, plan in sorted(wanted.items()):
        if not plan:
            continue
        offsets = {tp: o for tp, (_, o) in plan.items()}
        outcome: GroupCommit = (on_primary.plan_commit if dry_run else on_primary.commit)(group, offsets)
        if outcome.refused:
            result.refused.append(outcome.refused)
            continue
        verb = "would " if dry_run else ""
        for (topic, partition), offset in sorted(outcome.committed.items()):
            move = plan[(topic, partition)][0]
            result.actions.append(FailbackAction(move, group, topic, partition, offset, f"{verb}commit"))
        for (topic, partition), offset in sorted(outcome.kept.items()):
            move = plan[(topic, partition)][0]
            result.actions.append(FailbackAction(move, group, topic, partition, offset, f"{verb}keep"))
    result.actions.sort(key=lambda a: (a.move != Move.WHERE_STOPPED, a.group, a.topic, a.partition))
    return result


def where_stopped(
    config: MirrorConfig, reverse: FlowConfig, committed: dict[str, dict[Partition, int]]
) -> dict[str, dict[Partition, int]]:
    """Where each group resumes on the primary's `dr.<topic>`: the reverse flow's checkpoints, which must carry
    the group's committed offset on DR (else it is refused: the next checkpoint round will)."""
    plan = failover_plan(config, reverse)
    rows = {(r.group, r.topic, r.partition): r for r in plan}
    out: dict[str, dict[Partition, int]] = {}
    stale = []
    for group, offsets in committed.items():
        for (topic, partition), offset in sorted(offsets.items()):
            if not should_mirror(reverse, topic):
                continue
            remote = target_topic(reverse, topic)
            row = rows.get((group, remote, partition))
            if row is None or row.source_offset != offset:
                at = "none" if row is None else str(row.source_offset)
                stale.append(f"{group} {topic}[{partition}]: committed {offset} on DR, checkpoint {at}")
                continue
            out.setdefault(group, {})[(remote, partition)] = row.target_offset
    if stale:
        raise FailbackRefused(
            f"flow {reverse.name} has not yet checkpointed where these groups stopped on '{reverse.source}'; keep it"
            f" running a checkpoint interval ({config.checkpoint_interval_s:g} s) longer and run again:\n  "
            + "\n  ".join(stale)
        )
    return out


def at_end(
    config: MirrorConfig,
    original: FlowConfig,
    on_primary: ClusterGroups,
    on_dr: ClusterGroups,
    committed: dict[str, dict[Partition, int]],
) -> dict[str, dict[Partition, int]]:
    """The end of each original topic on the primary, for each group that consumed its copy on DR; a group that
    has not read its copy on DR to the end is refused (it would skip what it did not read)."""
    primary = config.cluster(original.source)
    topics = {
        name: sorted(meta.partitions)
        for name, meta in clients.list_topics(on_primary.admin, primary).items()
        if meta.error is None and name != HEARTBEATS_TOPIC and should_mirror(original, name)
    }
    consumed = {
        group: sorted({t for t in topics for remote, _ in offsets if remote == target_topic(original, t)})
        for group, offsets in committed.items()
    }
    copies = sorted({(target_topic(original, t), p) for names in consumed.values() for t in names for p in topics[t]})
    if copies:
        first = clients.list_offsets(on_dr.admin, copies, OffsetSpec.earliest())
        end = on_dr.latest(copies)
        unread = [
            f"{group} {remote}[{p}] at {committed[group].get((remote, p), first[(remote, p)])} of {end[(remote, p)]}"
            for group, names in consumed.items()
            for remote, p in copies
            if remote in {target_topic(original, t) for t in names}
            and committed[group].get((remote, p), first[(remote, p)]) < end[(remote, p)]
        ]
        if unread:
            raise FailbackRefused(
                f"consumers on '{original.target}' have not finished the primary's records; let them read to the end"
                " (their lag 0 on DR) before failing back (failback step 3):\n  " + "\n  ".join(unread)
            )
    partitions = sorted({(t, p) for names in consumed.values() for t in names for p in topics[t]})
    ends = on_primary.latest(partitions) if partitions else {}
    return {group: {(t, p): ends[(t, p)] for t in names for p in topics[t]} for group, names in consumed.items()}
