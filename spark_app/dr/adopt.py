"""Take a flow over from a stopped MirrorMaker 2: its positions, its offset translation and its checkpoints carry on.

MM2's MirrorSourceConnector keeps, in Connect's offsets topic on the target, one entry per source partition: key
`["<connector>", {"cluster": "<source alias>", "topic": t, "partition": p}]`, value `{"offset": N}`, the last source
offset it copied and committed (it resumes at N + 1). In dedicated mode that topic is
`mm2-offsets.<source alias>.internal` and Connect's group `<source alias>-mm2`; on Strimzi it is the Connect
cluster's `offset.storage.topic`. Adoption:

- refuses a flow whose naming is not MM2's (the remote topics MM2 made must be the flow's), naming the setting;
- refuses while MM2 still runs: its Connect group on the target has members, or its heartbeats on the target's
  `heartbeats` topic are fresh (unless forced). A killed MM2 keeps its members until Connect's session timeout
  (`session.timeout.ms`, 10 s by default) passes;
- refuses a flow whose checkpoint already holds batch positions: they are the mirror's own, newer than MM2's;
- writes N + 1 per partition into the flow's state beside the checkpoint (spark_app.ledger.LedgerState), where
  the planner starts each partition its batch log does not hold yet; a partition of an MM2 topic with no committed
  position starts at its log start (MM2 may have copied some of it: duplicates, never a gap);
- seeds the flow's offset syncs with MM2's history: each of MM2's offset syncs (with `offset-syncs.topic.location`
  `source`, MM2's default, `mm2-offset-syncs.<target>.internal` on the source; with `target`,
  `mm2-offset-syncs.<source>.internal` on the target; the flow's separator in place of the dots, as MM2 names
  them since KIP-690) as a run of one record, and the stretch from its newest sync to N as one run, once
  the record at the matching target offset is checked to be the source's record N. The mirror reads these back at
  start like its own, so a group anywhere MM2 copied translates exactly or, between MM2's syncs, as MM2 did;
- leaves MM2's checkpoints where they are: `<source>.checkpoints.internal` is the topic the mirror writes too, in the
  same format, and it reloads them at start, so each group's last checkpoint stands until the mirror writes a newer
  one and RemoteClusterUtils readers see no break.

Records MM2 copied after its last offset commit are copied again (at least once): per partition, at most the records
between N + 1 and where MM2 stopped writing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from confluent_kafka import Message
from confluent_kafka.admin import OffsetSpec

from .. import clients
from ..batch_log import OFFSETS
from ..clients import Partition
from ..config import FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..ledger import LedgerState
from ..policy import (
    HEARTBEATS_TOPIC,
    checkpoints_topic,
    connect_group,
    connect_offsets_topic,
    mm2_offset_syncs_topic,
    named_policy,
    offset_syncs_topic,
    should_mirror,
    target_topic,
)
from ..storage import CheckpointFiles, checkpoint_files
from .formats import Heartbeat, OffsetSync, decode_or_none
from .internal import ensure_topic, offset_syncs_cluster, read_checkpoints, read_offset_syncs
from .offset_syncs import OffsetSyncWriter
from .syncs import Run

# Set in the site's toolbox pod (infra.k8s.toolbox), which mounts no flow's checkpoint location unless a run adds it.
TOOLBOX_MARK = "MIRRORKIT_TOOLBOX"
CONNECTOR_SUFFIX = "MirrorSourceConnector"  # dedicated mode's name; Strimzi's is `<source>-><target>.` + this
HEARTBEAT_QUIET_S = 30.0  # MM2 counts as running while its newest heartbeat on the target is younger


@dataclass(frozen=True)
class Mm2Naming:
    """How MM2 named remote topics: `replication.policy.class` and `replication.policy.separator`."""

    policy: str = "default"  # DefaultReplicationPolicy; "identity": IdentityReplicationPolicy
    separator: str = "."

    def remote(self, flow: FlowConfig, topic: str) -> str:
        return named_policy(self.policy, flow.source, flow.target, self.separator, False).target_topic(topic)


@dataclass(frozen=True)
class AdoptOptions:
    naming: Mm2Naming = Mm2Naming()
    offsets_topic: str | None = None  # None: the flow's (policy.connect_offsets_topic)
    connector: str | None = None  # None: the one connector named *MirrorSourceConnector with entries for the source
    heartbeat_quiet_s: float = HEARTBEAT_QUIET_S
    force: bool = False  # adopt even while MM2 looks alive
    connect_group: str | None = None  # None: the flow's (policy.connect_group)


@dataclass(frozen=True)
class AdoptedPartition:
    topic: str
    partition: int
    next_offset: int  # where the mirror starts on the source
    committed: bool  # MM2 committed a position here (else the log start)
    runs: tuple[Run, ...]  # MM2's history seeded into the offset syncs


@dataclass
class Adoption:
    flow: str
    partitions: list[AdoptedPartition] = field(default_factory=list)
    checkpoints: dict[str, int] = field(default_factory=dict)  # group -> MM2 checkpoints that carry on
    skipped: list[str] = field(default_factory=list)  # MM2 topics the flow does not select
    refused: list[str] = field(default_factory=list)


def unreached_checkpoint(flow: FlowConfig, verb: str) -> list[str]:
    """In the toolbox, why `verb` cannot read and write the flow's state at its checkpoint location: the pod mounts
    the mirror's checkpoint volume only when a run adds it (the folder that holds the location is then there), and it
    has no Spark settings to reach object storage with. [] elsewhere, and in a toolbox run that mounts it."""
    if not os.environ.get(TOOLBOX_MARK):
        return []
    parts = urlsplit(flow.checkpoint_location)
    if parts.scheme in ("", "file") and Path(parts.path).parent.is_dir():
        return []
    return [
        f"{verb} reads and writes flow {flow.name}'s state at its checkpoint_location {flow.checkpoint_location},"
        " which this toolbox pod does not mount: run it in a toolbox Job that mounts the mirror's checkpoint volume,"
        " or where the mirror's checkpoint location and Spark settings are reached (docs/operations/adopt.md)"
    ]


def adopt(config: MirrorConfig, flow: FlowConfig, options: AdoptOptions) -> Adoption:
    """Check that MM2 can be taken over, then seed the flow's state and offset syncs; refusals say what to do."""
    result = Adoption(flow.name)
    result.refused += unreached_checkpoint(flow, "adopt")
    if result.refused:
        return result
    index = config.flows.index(flow)
    offsets_topic = options.offsets_topic or connect_offsets_topic(flow)
    positions = mm2_positions(config, flow, offsets_topic, options.connector)
    topics = sorted({t for t, _ in positions})
    result.skipped = [t for t in topics if not should_mirror(flow, t)]
    topics = [t for t in topics if t not in result.skipped]
    result.refused += naming_refusals(config, flow, index, options.naming, topics)
    if not options.force:
        group = options.connect_group or connect_group(flow)
        result.refused += running_refusals(config, flow, options.heartbeat_quiet_s, group)
    files = checkpoint_files(flow.checkpoint_location)
    result.refused += checkpoint_refusals(files)
    if result.refused:
        return result
    source = config.cluster(flow.source)
    counts = {t: len(m.partitions) for t, m in clients.list_topics(clients.admin(source), source).items()}
    wanted = [(t, p) for t in topics for p in range(counts.get(t, 0))]
    starts = clients.list_offsets(clients.admin(source), [tp for tp in wanted if tp not in positions],
                                  OffsetSpec.earliest())  # fmt: skip
    runs = seed_runs(config, flow, {tp: positions[tp] for tp in wanted if tp in positions})
    for tp in wanted:
        committed = tp in positions
        next_offset = positions[tp] + 1 if committed else starts[tp]
        result.partitions.append(AdoptedPartition(*tp, next_offset, committed, tuple(runs.get(tp, ()))))
    write_offset_syncs(config, flow, runs)
    state = LedgerState.load(files)
    for p in result.partitions:
        state.adopted[(p.topic, p.partition)] = p.next_offset
        state.positions[(p.topic, p.partition)] = p.next_offset
    state.save()
    for (group, _, _), _read in read_checkpoints(config, flow).items():
        if flow.groups.matches(group):
            result.checkpoints[group] = result.checkpoints.get(group, 0) + 1
    return result


def mm2_positions(
    config: MirrorConfig, flow: FlowConfig, offsets_topic: str, connector: str | None
) -> dict[Partition, int]:
    """The last source offset MM2 copied and committed, per partition of the flow's source (newest entry per key)."""
    target = config.cluster(flow.target)
    entries: dict[tuple[str, str, str, int], int | None] = {}  # (connector, cluster, topic, partition) -> offset
    records = clients.read_topic(target, offsets_topic)
    if not records:
        raise MirrorFailed(
            f"no MirrorMaker 2 offsets in '{offsets_topic}' on '{flow.target}': pass --offsets-topic (dedicated mode:"
            f" mm2-offsets.<source alias>.internal; Connect or Strimzi: the Connect cluster's offset.storage.topic)"
        )
    for msg in records:
        entry = _offsets_entry(msg)
        if entry is not None:
            entries[entry[0]] = entry[1]
    connectors: dict[str, set[str]] = {}  # source alias -> connector names
    for name, cluster, _, _ in entries:
        connectors.setdefault(cluster, set()).add(name)
    names = sorted(connectors.get(flow.source, ()))
    if not names:
        aliases = ", ".join(sorted(connectors)) or "none"
        raise MirrorFailed(
            f"'{offsets_topic}' holds MirrorSourceConnector positions for source alias(es) {aliases}, none for"
            f" '{flow.source}': name the flow's source cluster as MM2 did (its alias names the remote topics and"
            " the checkpoints topic)"
        )
    chosen = connector or (names[0] if len(names) == 1 else None)
    if chosen not in names:
        raise MirrorFailed(f"pick one connector with --connector; '{offsets_topic}' holds: {', '.join(names)}")
    return {
        (topic, partition): offset
        for (name, cluster, topic, partition), offset in entries.items()
        if offset is not None and (name, cluster) == (chosen, flow.source)
    }


def _offsets_entry(msg: Message) -> tuple[tuple[str, str, str, int], int | None] | None:
    """A MirrorSourceConnector entry: ((connector, cluster, topic, partition), offset, or None once deleted)."""
    try:
        name, part = json.loads(msg.key() or b"")
        if not (isinstance(name, str) and name.endswith(CONNECTOR_SUFFIX)):
            return None
        key = (name, str(part["cluster"]), str(part["topic"]), int(part["partition"]))
        value = msg.value()
        return key, None if value is None else int(json.loads(value)["offset"])
    except (ValueError, TypeError, KeyError):
        return None  # another connector's entry, or not Connect's JSON


def naming_refusals(
    config: MirrorConfig, flow: FlowConfig, index: int, naming: Mm2Naming, topics: list[str]
) -> list[str]:
    """Why the flow would not write where MM2 wrote, naming the setting to change; [] when they agree."""
    refused = []
    if flow.replication_policy != naming.policy:
        mm2 = "IdentityReplicationPolicy" if naming.policy == "identity" else "DefaultReplicationPolicy"
        refused.append(
            f"flows[{index}].replication_policy is '{flow.replication_policy}' but MirrorMaker 2 named its remote"
            f" topics with {mm2}: set replication_policy: {naming.policy}"
        )
    elif naming.policy == "default" and flow.separator != naming.separator:
        refused.append(
            f"flows[{index}].separator is '{flow.separator}' but MirrorMaker 2's replication.policy.separator is"
            f" '{naming.separator}': set separator: '{naming.separator}'"
        )
    target = config.cluster(flow.target)
    present = clients.list_topics(clients.admin(target), target)
    other = flow.model_copy(update={"internal_topic_separator": not flow.internal_topic_separator})
    if checkpoints_topic(other) in present and checkpoints_topic(flow) not in present:
        refused.append(
            f"MirrorMaker 2's checkpoints are in '{checkpoints_topic(other)}' on '{flow.target}', the flow's would be"
            f" '{checkpoints_topic(flow)}': set flows[{index}].internal_topic_separator:"
            f" {str(other.internal_topic_separator).lower()} (MM2's"
            " replication.policy.internal.topic.separator.enabled)"
        )
    missing = [naming.remote(flow, t) for t in topics if naming.remote(flow, t) not in present]
    if missing:
        refused.append(
            f"MirrorMaker 2's copies {', '.join(missing)} are not on '{flow.target}': give --mm2-policy and"
            " --mm2-separator as MM2 ran (replication.policy.class, replication.policy.separator)"
        )
    return refused


def running_refusals(config: MirrorConfig, flow: FlowConfig, quiet_s: float, group: str) -> list[str]:
    """MM2 still runs while its Connect group has members, or its heartbeats for this flow reach the target."""
    target = config.cluster(flow.target)
    members = clients.group_members(target, group)
    refused = []
    if members:
        refused.append(
            f"MirrorMaker 2 is running: its Connect group '{group}' on '{flow.target}' has {members}"
            " member(s); stop it first (a killed one leaves after Connect's session.timeout.ms), or pass --force"
        )
    newest = None
    for msg in clients.read_topic(config.cluster(flow.target), HEARTBEATS_TOPIC, tail=50):
        beat = decode_or_none(Heartbeat, msg.key(), msg.value())
        if beat is not None and (beat.source, beat.target) == (flow.source, flow.target):
            newest = max(newest or 0, beat.timestamp_ms)
    age = None if newest is None else time.time() - newest / 1000
    if age is not None and age < quiet_s:
        refused.append(
            f"MirrorMaker 2 is running: its heartbeat {flow.source}->{flow.target} reached '{HEARTBEATS_TOPIC}' on"
            f" '{flow.target}' {age:.1f} s ago (less than {quiet_s:.0f} s); stop it first, or pass --force"
        )
    return refused


def checkpoint_refusals(files: CheckpointFiles) -> list[str]:
    """A checkpoint with logged batches is the mirror's own history: adopting MM2's older one would go back."""
    if files.names(OFFSETS):
        return [
            f"the flow's checkpoint {files.where(OFFSETS)} already holds positions (the mirror has run on"
            " it); point checkpoint_location at an empty path to adopt MM2's"
        ]
    return []


def seed_runs(config: MirrorConfig, flow: FlowConfig, positions: dict[Partition, int]) -> dict[Partition, list[Run]]:
    """MM2's copy history per partition as runs: its offset syncs, and its newest sync stretched to its position
    once the target's record there is checked to be the source's."""
    syncs: dict[Partition, dict[int, int]] = {}
    for location, alias in (("source", flow.source), ("target", flow.target)):  # MM2's offset-syncs.topic.location
        for msg in clients.read_topic(config.cluster(alias), mm2_offset_syncs_topic(flow, location)):
            sync = decode_or_none(OffsetSync, msg.key(), msg.value())
            if sync is not None and (sync.topic, sync.partition) in positions:
                syncs.setdefault((sync.topic, sync.partition), {})[sync.upstream_offset] = sync.downstream_offset
    runs = {tp: [Run(u, d, u) for u, d in sorted(s.items()) if u <= positions[tp]] for tp, s in syncs.items()}
    newest = {tp: r[-1] for tp, r in runs.items() if r}
    source_at = clients.read_at(config.cluster(flow.source), {tp: positions[tp] for tp in newest})
    target_at = clients.read_at(
        config.cluster(flow.target),
        {(target_topic(flow, t), p): run.target + positions[(t, p)] - run.start for (t, p), run in newest.items()},
    )
    for (topic, partition), run in newest.items():
        src, dst = source_at[(topic, partition)], target_at[(target_topic(flow, topic), partition)]
        if src is not None and dst is not None and _same_record(src, dst):
            runs[(topic, partition)][-1] = Run(run.start, run.target, positions[(topic, partition)])
    return runs


def _same_record(a: Message, b: Message) -> bool:
    return (a.key(), a.value(), a.headers() or [], a.timestamp()[1]) == (
        b.key(), b.value(), b.headers() or [], b.timestamp()[1]
    )  # fmt: skip


def write_offset_syncs(config: MirrorConfig, flow: FlowConfig, runs: dict[Partition, list[Run]]) -> None:
    """Add the runs to the flow's offset syncs, after what is there, as the mirror writes them."""
    cluster = config.cluster(offset_syncs_cluster(flow))
    topic = offset_syncs_topic(flow)
    reason = ensure_topic(cluster, topic)
    if reason:
        raise MirrorFailed(f"flow {flow.name}: {reason}")
    store = read_offset_syncs(config, flow)
    for (t, p), partition_runs in sorted(runs.items()):
        for run in partition_runs:
            store.record(t, p, run)
    producer = clients.producer(cluster, {"acks": "all"})
    OffsetSyncWriter(
        store, threading.Lock(), lambda s: clients.produce(producer, topic, s.key(), s.record_value())
    ).flush()
    if producer.flush(clients.REQUEST_TIMEOUT_S):
        raise MirrorFailed(f"flow {flow.name}: offset syncs not acknowledged by '{cluster.alias}'")
