"""Failback: the steps of the runbook (docs/operations/failback.md) a program can do, for a reverse flow DR->PRIMARY.

Given an active/active config with the original flow PRIMARY->DR and the reverse flow DR->PRIMARY, it first checks
what the operator must have done: no consumer of the reverse flow's selected groups runs on DR, and both flows have
lag 0 (every partition they mirror now copied to its last stable offset, as `status` counts it; the mirror's own
`heartbeats` aside, as they keep moving). Then, for each of those groups on DR:

- where it stopped, for the data written on DR: the reverse flow's checkpoints put the group on the primary's
  `dr.<topic>` where it stopped on DR, as `failover` of the reverse flow does; each checkpoint must carry the
  group's committed offset on DR, or the failback waits for the next one. Skipped under `identity`, where the
  records written on DR land in the original topics on the primary;
- at the end, for the original topics: a group that consumed their copy on DR has read them all (or is refused),
  so it goes to their end on the primary.

Every commit goes through `ClusterGroups.commit`: a group with members on the primary is refused by name, a
partition already at or past the offset is kept, never moved back, and every partition moved or kept carries the
failback's mark, so the reverse flow's group sync leaves the group alone on the primary. `force` goes past the
checks above, each logged and returned: never past a group with members on the primary, and never so that a group
skips a record (see `where_stopped` and `at_end`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import OffsetSpec

from .. import clients
from ..clients import Partition
from ..config import ConfigError, FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..policy import HEARTBEATS_TOPIC, replication_policy, should_mirror, target_topic
from ..topic_acls import restore_write_block
from .groups import ClusterGroups, GroupCommit, mark
from .views import Checks, copied_in, failover_plan, flow_status


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
    forced: list[str] = field(default_factory=list)  # the checks `--force` went past


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
    """Why the flow's lag is not 0, per partition it mirrors now; [] when each is mirrored to its last stable offset
    (spark_app.dr.views says what counts)."""
    status = flow_status(config, flow)
    if not status.source_reachable:
        return [f"flow {flow.name}: its source '{flow.source}' does not answer, so its lag is unknown"]
    problems = [
        f"flow {flow.name}: {p.topic}[{p.partition}] lag {'unknown' if p.lag is None else p.lag}"
        for p in status.partitions
        if p.topic != HEARTBEATS_TOPIC and p.lag != 0
    ]
    source = config.cluster(flow.source)
    admin = clients.admin(source)
    selected = [
        (name, p)
        for name, meta in sorted(clients.list_topics(admin, source).items())
        if meta.error is None and name != HEARTBEATS_TOPIC and should_mirror(flow, name)
        for p in sorted(meta.partitions)
    ]
    synced = {(p.topic, p.partition) for p in status.partitions}
    unsynced = [tp for tp in selected if tp not in synced]
    first = clients.list_offsets(admin, unsynced, OffsetSpec.earliest())
    end = clients.list_offsets(admin, unsynced, OffsetSpec.latest(), read_committed=True)
    copies = copied_in(source, flow, {tp: (first[tp], end[tp]) for tp in unsynced})
    problems += [
        f"flow {flow.name}: {t}[{p}] has {end[(t, p)] - first[(t, p)]} record(s), none mirrored yet"
        for t, p in unsynced
        if (t, p) in copies
    ]
    return problems


def failback(config: MirrorConfig, reverse: FlowConfig, dry_run: bool = False, force: bool = False) -> FailbackResult:
    """Check, then move the reverse flow's groups to the primary; on a dry run, only say what. A failed check
    refuses (spark_app.dr.views.Refused), or with `force` is logged, kept in the result, and gone past."""
    original = original_flow(config, reverse)
    checks = Checks("failback", force)
    dr, primary = config.cluster(reverse.source), config.cluster(reverse.target)
    on_dr, on_primary = ClusterGroups(dr), ClusterGroups(primary)
    try:
        groups = on_dr.groups(reverse.groups)
    except KafkaException as err:  # a slow or half-down DR cluster: one line naming it, not a traceback
        raise MirrorFailed(
            f"failback could not list the consumer groups on '{dr.alias}' ({dr.bootstrap_servers}):"
            f" {err.args[0].str()}; nothing was moved, run failback again"
        ) from None
    live = [f"{g} ({n} member(s))" for g in groups if (n := on_dr.members(g))]
    if live:
        checks.fail(
            f"consumers still run on '{dr.alias}' in group(s) {', '.join(live)}: let them finish (their lag 0) and stop"
            " them first (failback step 3)"
        )
    lagging = lag_problems(config, reverse) + lag_problems(config, original)
    if lagging:
        checks.fail(
            "lag is not 0; stop producers on DR and wait until `mirrorkit status` shows lag 0 on both flows"
            " (failback step 3):\n  " + "\n  ".join(lagging)
        )
    committed = {g: {tp: c.offset for tp, c in on_dr.committed(g).items()} for g in groups}
    wanted: dict[str, dict[Partition, tuple[Move, int]]] = {g: {} for g in groups}  # group -> tp -> (move, offset)
    if replication_policy(reverse).renames:
        for g, tp_offset in where_stopped(config, reverse, committed, checks).items():
            wanted[g] |= {tp: (Move.WHERE_STOPPED, o) for tp, o in tp_offset.items()}
    for g, tp_offset in at_end(config, original, on_primary, on_dr, committed, checks).items():
        wanted[g] |= {tp: (Move.AT_END, o) for tp, o in tp_offset.items()}
    result = FailbackResult(primary.alias, dr.alias, groups, forced=checks.forced)
    marked = mark("failback", reverse.name)
    for group, plan in sorted(wanted.items()):
        if not plan:
            continue
        offsets = {tp: o for tp, (_, o) in plan.items()}
        outcome: GroupCommit = (on_primary.plan_commit if dry_run else on_primary.commit)(group, offsets, marked)
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
    # The original flow's copies on DR read-only again, once every group moved back: a refused failback leaves DR's
    # producers their grants until it runs again.
    if original.sync_topic_acls and not dry_run and not result.refused:
        restore_write_block(dr, original)
    return result


def where_stopped(
    config: MirrorConfig, reverse: FlowConfig, committed: dict[str, dict[Partition, int]], checks: Checks
) -> dict[str, dict[Partition, int]]:
    """Where each group resumes on the primary's `dr.<topic>`: the reverse flow's checkpoints, which must carry
    the group's committed offset on DR (else a check fails: the next checkpoint round will). Forced, an older
    checkpoint is used (the group reads again what it read since), and a partition with none is not moved."""
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
                at = "none (not moved)" if row is None else f"{row.source_offset} (re-reads from there)"
                stale.append(f"{group} {topic}[{partition}]: committed {offset} on DR, checkpoint {at}")
            if row is not None:
                out.setdefault(group, {})[(remote, partition)] = row.target_offset
    if stale:
        checks.fail(
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
    checks: Checks,
) -> dict[str, dict[Partition, int]]:
    """The end of each original topic on the primary, for each group that consumed its copy on DR; a group that
    has not read its copy on DR to the end fails a check (at the end it would skip what it did not read). Forced,
    such a group is not moved on that topic: it stays where it was on the primary, and reads again, never skips."""
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
            (group, remote, p, committed[group].get((remote, p), first[(remote, p)]), end[(remote, p)])
            for group, names in consumed.items()
            for remote, p in copies
            if remote in {target_topic(original, t) for t in names}
            and committed[group].get((remote, p), first[(remote, p)]) < end[(remote, p)]
        ]
        if unread:
            checks.fail(
                f"consumers on '{original.target}' have not finished the primary's records; let them read to the end"
                " (their lag 0 on DR) before failing back (failback step 3):\n  "
                + "\n  ".join(f"{g} {remote}[{p}] at {at} of {e}" for g, remote, p, at, e in unread)
            )
        for group, remote, _, _, _ in unread:  # forced: left where it is on the primary
            consumed[group] = [t for t in consumed[group] if target_topic(original, t) != remote]
    partitions = sorted({(t, p) for names in consumed.values() for t in names for p in topics[t]})
    ends = on_primary.latest(partitions) if partitions else {}
    return {group: {(t, p): ends[(t, p)] for t in names for p in topics[t]} for group, names in consumed.items()}
