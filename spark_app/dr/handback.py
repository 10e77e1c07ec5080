"""Hand a flow back to MirrorMaker 2: MM2 resumes where the mirror stopped, without a re-copy, and translates on.

The reverse of `adopt`. With the mirror and MM2 both stopped, it writes:

- MM2's source positions: in Connect's offsets topic on the target (dedicated mode `mm2-offsets.<source>.internal`,
  or the Connect cluster's `offset.storage.topic`), per partition the flow has copied, key
  `["<connector>",{"cluster":"<source>","partition":p,"topic":t}]` and value `{"offset":N}`. MirrorSourceTask stores
  the last source offset it copied and seeks to N + 1 on start, so N is the mirror's next offset - 1; a partition
  where that is nothing gets a tombstone, so an older MM2 position there does not copy again what the mirror did.
  Connect looks a position up by its key's bytes and reads the newest record per key in partition order, so the
  key is JSON as Connect's converter writes it (no spaces, the fields in Java's HashMap order) and goes to the
  partition Java's producer would choose (murmur2);
- MM2-format offset syncs where MM2's checkpoint connector reads them (`offset-syncs.topic.location`: on the source
  `mm2-offset-syncs.<target>.internal`, on the target `mm2-offset-syncs.<source>.internal`): for each mirrored run
  the mirror keeps, its first and last record. MM2 translates a group exactly at a sync and one past it elsewhere,
  so a group at the end of a run (where a caught-up group is) resumes exactly, and MM2's own syncs follow once it
  copies.

The checkpoints stay where they are: the mirror writes `<source>.checkpoints.internal` in MM2's format, and MM2's
checkpoint connector reads it at start and goes on from it. It refuses while MM2 runs (its Connect group has members
or its heartbeats are fresh) or the mirror does (a mirror of the flow holds its DR lease), unless forced, and a flow the
mirror never ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from .. import clients
from ..clients import PartitionOffsets
from ..config import ClusterConfig, FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..ledger import FlowLedger, LedgerState
from ..policy import connect_group, connect_offsets_topic, mm2_offset_syncs_topic
from ..storage import checkpoint_files
from .adopt import HEARTBEAT_QUIET_S, running_refusals, unreached_checkpoint
from .formats import OffsetSync
from .internal import ensure_topic, read_offset_syncs
from .lease import SESSION_S, holder

CONNECTOR = "MirrorSourceConnector"  # dedicated mode's name; Strimzi's is `<source>-><target>.` + this


@dataclass(frozen=True)
class HandbackOptions:
    offsets_topic: str | None = None  # None: the flow's (policy.connect_offsets_topic)
    connector: str = CONNECTOR
    syncs_location: Literal["source", "target"] = "source"  # MM2's offset-syncs.topic.location (its default)
    heartbeat_quiet_s: float = HEARTBEAT_QUIET_S
    force: bool = False  # hand back even while MM2 or the mirror looks alive
    connect_group: str | None = None  # None: the flow's (policy.connect_group)


@dataclass
class Handback:
    flow: str
    positions: PartitionOffsets = field(default_factory=dict)  # where MM2 starts each partition
    syncs: int = 0  # MM2-format offset syncs written
    syncs_topic: str = ""
    refused: list[str] = field(default_factory=list)


def handback(config: MirrorConfig, flow: FlowConfig, options: HandbackOptions) -> Handback:
    """Check that MM2 can take the flow over, then write its positions and offset syncs; refusals say what to do."""
    result = Handback(flow.name, syncs_topic=mm2_offset_syncs_topic(flow, options.syncs_location))
    result.refused += unreached_checkpoint(flow, "handback")
    if result.refused:
        return result
    target = config.cluster(flow.target)
    offsets_topic = options.offsets_topic or connect_offsets_topic(flow)
    if not options.force:
        result.refused += running_refusals(config, flow, options.heartbeat_quiet_s,
                                           options.connect_group or connect_group(flow))  # fmt: skip
        result.refused += mirror_running(config, flow)
    result.positions = dict(FlowLedger(flow, LedgerState.load(checkpoint_files(flow.checkpoint_location)),
                                       lambda partitions: {}).resume_points())  # fmt: skip
    if not result.positions:
        result.refused.append(
            f"flow {flow.name} has no positions in {flow.checkpoint_location}: the mirror never ran it, so MM2 has"
            " nothing to take over from it; start MM2 as it was"
        )
    offsets_meta = clients.list_topics(clients.admin(target), target).get(offsets_topic)
    if offsets_meta is None:
        result.refused.append(
            f"Connect's offsets topic '{offsets_topic}' is not on '{flow.target}': pass --offsets-topic (dedicated"
            " mode: mm2-offsets.<source alias>.internal; Connect or Strimzi: offset.storage.topic), or start and"
            " stop MM2 once so that it makes it"
        )
    if result.refused or offsets_meta is None:
        return result
    write_positions(target, offsets_topic, options.connector, flow, result.positions)
    result.syncs = write_mm2_syncs(config, flow, options.syncs_location, result.positions)
    return result


def mirror_running(config: MirrorConfig, flow: FlowConfig) -> list[str]:
    """The mirror runs while a mirror of the flow holds its DR lease (spark_app.dr.lease)."""
    who = holder(config, flow)
    if who is not None:
        return [
            f"the mirror of flow {flow.name} is running ({who}): stop it first (a crashed one's lease lapses"
            f" {SESSION_S} s after it died), or pass --force"
        ]
    return []


def connect_key(connector: str, source: str, topic: str, partition: int) -> bytes:
    """A MirrorSourceConnector position's key, byte for byte as Connect's JSON converter writes it."""
    part = {"cluster": source, "partition": partition, "topic": topic}  # HashMap order of MirrorUtils.wrapPartition
    return json.dumps([connector, part], separators=(",", ":"), ensure_ascii=False).encode()


def write_positions(
    target: ClusterConfig, topic: str, connector: str, flow: FlowConfig, next_offsets: PartitionOffsets
) -> None:
    """Each partition's last copied offset (next - 1) as MM2's position; a tombstone where nothing was copied."""
    producer = clients.producer(target, {"acks": "all", "partitioner": "murmur2_random"})
    for (t, p), next_offset in sorted(next_offsets.items()):
        value = json.dumps({"offset": next_offset - 1}, separators=(",", ":")).encode() if next_offset > 0 else None
        clients.produce(producer, topic, connect_key(connector, flow.source, t, p), value)
    if producer.flush(clients.REQUEST_TIMEOUT_S):
        raise MirrorFailed(f"flow {flow.name}: MM2's positions not acknowledged by '{target.alias}' ({topic})")


def write_mm2_syncs(config: MirrorConfig, flow: FlowConfig, location: str, next_offsets: PartitionOffsets) -> int:
    """The first and last record of each mirrored run below the mirror's positions, as MM2's own OffsetSyncs,
    ascending per partition as MM2 writes them (an older upstream offset after a newer one reads as a reset)."""
    cluster = config.cluster(flow.source if location == "source" else flow.target)
    topic = mm2_offset_syncs_topic(flow, location)
    reason = ensure_topic(cluster, topic)
    if reason:
        raise MirrorFailed(f"flow {flow.name}: {reason}")
    store = read_offset_syncs(config, flow)
    producer = clients.producer(cluster, {"acks": "all"})
    written = 0
    for t, p in store.partitions():
        points: dict[int, int] = {}
        for run in store.runs(t, p):
            for upstream in (run.start, run.last):
                if upstream < next_offsets.get((t, p), 0):
                    points[upstream] = run.target + upstream - run.start
        for upstream, downstream in sorted(points.items()):
            key, value = OffsetSync(t, p, upstream, downstream).mm2_record()
            clients.produce(producer, topic, key, value)
            written += 1
    if producer.flush(clients.REQUEST_TIMEOUT_S):
        raise MirrorFailed(f"flow {flow.name}: MM2's offset syncs not acknowledged by '{cluster.alias}' ({topic})")
    return written
