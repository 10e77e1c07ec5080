"""What operators run: `status` (lag, checkpoint and heartbeat ages) and `failover` (where groups resume).

Both read only what the mirror wrote on the clusters, so they work beside a running mirror or without one; the
failover plan reads the target only, so it works with the source gone.

Lag is counted for the topics the flow mirrors now (selected, and still on the source), from the flow's position
(the record after the last one it wrote) to the source's last stable offset, read committed as the mirror reads.
Offsets that hold nothing the flow copies (transaction markers, aborted records, and under `identity` records that
came from the flow's target) are no lag: a partition whose tail is only those shows 0, so a transactional topic
ending in a commit marker does not show a lag of 1 forever.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import OffsetSpec

from .. import clients
from ..clients import Partition, PartitionOffsets
from ..config import ClusterConfig, FlowConfig, MirrorConfig
from ..errors import AuthenticationFailed, ClusterUnreachable, MirrorFailed
from ..policy import PROVENANCE_HEADER, drops_record, origin, replication_policy, should_mirror, target_topic
from ..topic_acls import Phase, Rule, lift_write_block, read_ledger
from .groups import ClusterGroups, GroupCommit, mark
from .internal import newest_heartbeat_ms, read_checkpoints, read_offset_syncs
from .lease import SESSION_S, DrLease, holder
from .syncs import SyncStore

log = logging.getLogger(__name__)

STATUS_SOURCE_TIMEOUT_S = 10.0


class Refused(MirrorFailed):
    """The operator must act first; the message names what is in the way, and `--force` goes past it."""


@dataclass
class Checks:
    """The checks of one operator command: a failed one refuses it, or under `--force` is logged and kept, so the
    command can say what it went past."""

    command: str
    force: bool = False
    forced: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        if not self.force:
            raise Refused(f"{reason}\n(--force goes ahead anyway)")
        log.warning("%s --force goes past: %s", self.command, reason)
        self.forced.append(reason)


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
    # The translated offset, when it lay below the target partition's log start (records deleted there by
    # retention or deleteRecords): the group resumes at the log start instead, as a consumer would.
    clamped_from: int | None = None


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
    # Why the flow's DR state (offset syncs, checkpoints, heartbeats) could not be read, or None: in an
    # active/active pair with a region down, the reverse flow's target is the lost one.
    unreadable: str | None = None


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
    return clamped(config.cluster(flow.target), rows)


def clamped(target: ClusterConfig, rows: list[FailoverRow]) -> list[FailoverRow]:
    """The rows with each target offset below its partition's log start moved up to it; what remains below was
    deleted on the target and cannot be read again."""
    partitions = sorted({(r.topic, r.partition) for r in rows})
    starts, _ = clients.list_offsets_each(clients.admin(target), partitions, OffsetSpec.earliest())
    out = []
    for r in rows:
        start = starts.get((r.topic, r.partition), r.target_offset)  # a partition that did not answer stays
        out.append(replace(r, target_offset=start, clamped_from=r.target_offset) if r.target_offset < start else r)
    return out


def running_mirror(config: MirrorConfig, flow: FlowConfig, wait_s: float = SESSION_S + 2.0) -> str | None:
    """Why a failover must wait, or None: a mirror of the flow that still runs (it holds the flow's DR lease) would
    go on checkpointing and syncing the groups the failover moves. A mirror that stops releases it; one that
    crashed holds it until its session lapses, so this waits up to `wait_s` for that."""
    began = time.monotonic()
    while True:
        running = holder(config, flow)
        if running is None:
            return None
        if time.monotonic() - began >= wait_s:
            break
        time.sleep(1.0)
    return (
        f"the mirror of flow {flow.name} still runs ({running}; it holds the flow's DR lease on '{flow.target}');"
        " stop it first (a mirror that stops releases it), or fail over with --force, which fences it"
    )


def fence(config: MirrorConfig, flow: FlowConfig) -> None:
    """Take the flow's DR lease and let it lapse: a mirror of the flow that still runs is fenced, and writes no
    more offset syncs, checkpoints or group commits."""
    lease = DrLease(config.cluster(flow.target), flow)
    lease.acquire()
    lease.release()
    log.warning("flow %s: fenced its running mirror by taking its DR lease", flow.name)


def translate_groups(config: MirrorConfig, flow: FlowConfig, plan: list[FailoverRow]) -> list[GroupCommit]:
    """Commit the plan on the target, group by group, marked as this flow's failover so the mirror's group sync
    leaves the groups alone from then on; a group with members there is refused by name."""
    target = ClusterGroups(config.cluster(flow.target))
    by_group: dict[str, dict[Partition, int]] = {}
    for row in plan:
        by_group.setdefault(row.group, {})[(row.topic, row.partition)] = row.target_offset
    move = mark("failover", flow.name)
    return [target.commit(group, offsets, move) for group, offsets in sorted(by_group.items())]


def withheld_grants(config: MirrorConfig, flow: FlowConfig) -> list[Rule]:
    """The write grants the flow's topic ACL sync keeps off its copies, which `lift` would set: read on the target."""
    if not flow.sync_topic_acls:
        return []
    return sorted(r for r, phase in read_ledger(config.cluster(flow.target), flow).items() if phase is Phase.WITHHELD)


def lift(config: MirrorConfig, flow: FlowConfig) -> list[Rule]:
    """Failover's step after the groups: the copies become writable where the source granted it
    (spark_app.topic_acls); the grants set. Nothing for a flow that does not sync topic ACLs."""
    if not flow.sync_topic_acls:
        return []
    return lift_write_block(config.cluster(flow.target), flow)


def status_of(config: MirrorConfig, flow: FlowConfig) -> FlowStatus:
    """`flow_status`, or, when a cluster holding the flow's DR state does not answer, a status that says so (the
    source then counts as not reached: it was not asked), so `status` still reports the other flows."""
    try:
        return flow_status(config, flow)
    except ClusterUnreachable as err:
        return FlowStatus(flow.name, False, None, [], unreadable=str(err))


def flow_status(config: MirrorConfig, flow: FlowConfig) -> FlowStatus:
    """Lag, checkpoint age and heartbeat age per topic-partition the flow mirrors now, from what the mirror wrote
    on the clusters and the source's last stable offsets."""
    now = time.time()
    syncs = read_offset_syncs(config, flow)
    checkpoints = read_checkpoints(config, flow)
    heartbeat = newest_heartbeat_ms(config, flow)
    checkpoint_at: dict[Partition, float] = {}
    for (_, topic, partition), (_, written) in checkpoints.items():
        checkpoint_at[(topic, partition)] = max(written, checkpoint_at.get((topic, partition), 0.0))
    source = config.cluster(flow.source)
    selected = [(t, p) for t, p in syncs.partitions() if should_mirror(flow, t)]
    mirrored = {tp: run.last + 1 for tp in selected if (run := syncs.latest(*tp)) is not None}
    ends: PartitionOffsets | None
    try:
        admin = clients.admin(source)
        on_source = clients.list_topics(admin, source, STATUS_SOURCE_TIMEOUT_S)
        selected = [(t, p) for t, p in selected if t in on_source and p in on_source[t].partitions]
        ends, _ = clients.list_offsets_each(
            admin, selected, OffsetSpec.latest(), read_committed=True, timeout_s=STATUS_SOURCE_TIMEOUT_S
        )
    except AuthenticationFailed:
        raise
    except (KafkaException, ClusterUnreachable):
        ends = None  # the source is down: lag cannot be known
    behind = {} if ends is None else {tp: (mirrored[tp], e) for tp, e in ends.items() if e > mirrored[tp]}
    copies = copied_in(source, flow, behind)
    rows = []
    for topic, partition in selected:
        at = checkpoint_at.get((target_topic(flow, topic), partition))
        end = None if ends is None else ends.get((topic, partition))
        lag = None if end is None else end - mirrored[(topic, partition)] if (topic, partition) in copies else 0
        rows.append(
            PartitionStatus(
                topic, partition, mirrored[(topic, partition)], end, lag, None if at is None else round(now - at, 3)
            )
        )
    heartbeat_age = None if heartbeat is None else round(now - heartbeat / 1000, 3)
    return FlowStatus(flow.name, ends is not None, heartbeat_age, rows)


def copied_in(cluster: ClusterConfig, flow: FlowConfig, spans: dict[Partition, tuple[int, int]]) -> set[Partition]:
    """The partitions whose span [start, end) of source offsets holds a record the flow copies, read committed as
    the mirror reads; a span not read through within the request timeout counts as holding one. Reading stops at
    each partition's first such record, so a partition that truly lags costs one fetch."""
    todo = {tp: end for tp, (start, end) in spans.items() if end > start}
    found: set[Partition] = set()
    if not todo:
        return found
    reader = clients.consumer(cluster)
    try:
        reader.assign([TopicPartition(t, p, spans[(t, p)][0]) for t, p in todo])
        deadline = time.monotonic() + clients.REQUEST_TIMEOUT_S
        while todo and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is None:  # a tail of markers or aborted records yields nothing: the position passes it
                positions = reader.position([TopicPartition(t, p) for t, p in todo])
                for tp in positions:
                    if tp.offset >= todo[(tp.topic, tp.partition)]:
                        todo.pop((tp.topic, tp.partition))
                continue
            key = (msg.topic() or "", msg.partition() or 0)
            if key not in todo:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    todo.pop(key)
                continue
            if (msg.offset() or 0) >= todo[key]:
                todo.pop(key)
            elif copies(flow, msg):
                found.add(key)
                todo.pop(key)
            elif (msg.offset() or 0) + 1 >= todo[key]:
                todo.pop(key)
        return found | set(todo)
    finally:
        reader.close()


def copies(flow: FlowConfig, msg: Message) -> bool:
    """Whether the flow copies this source record: every record, but under `identity` one that came from its target
    (its provenance header says so)."""
    if not replication_policy(flow).stamps:
        return True
    headers = msg.headers() or []  # a consumed record's headers come as a list of (key, value)
    pairs = headers.items() if isinstance(headers, dict) else headers
    stamp = next((v for k, v in pairs if k == PROVENANCE_HEADER), None)
    return not drops_record(flow, origin(stamp) if stamp is not None else None)
