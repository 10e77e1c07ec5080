"""The flow's internal topics on the clusters: where each lives, making them, and reading them back."""

from __future__ import annotations

import contextlib
import gc
import logging
import struct
from collections.abc import Iterator

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from .. import clients
from ..clients import Partition, PartitionOffsets
from ..config import ClusterConfig, FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..policy import (
    HEARTBEATS_TOPIC,
    checkpoints_topic,
    echoes_back,
    internal_separator,
    offset_syncs_topic,
    target_topic,
)
from .formats import Checkpoint, Heartbeat, OffsetSync, decode_or_none
from .syncs import Run, SlottedRun, SyncStore

# Internal topics, when the mirror may create them (not on Event Hubs, where infra does): one partition, as MM2
# reads checkpoints from partition 0 only; compacted, as only the newest record per key matters. A broker compacts
# only closed segments, so a segment closes after SEGMENT_BYTES or a minute, whichever comes first, and is cleaned as
# soon as a tenth of the log is dirty: what a restart, `status` and `failover` read back is about one record per live
# key plus what was written since the broker's cleaner last ran (`log.cleaner.backoff.ms`, 15 s by default).
SEGMENT_BYTES = 4 * 1024 * 1024  # about 55,000 checkpoints
INTERNAL_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "segment.bytes": str(SEGMENT_BYTES),
    "min.cleanable.dirty.ratio": "0.1",
}
HEARTBEATS_TAIL = 50  # records read back per partition of the target's heartbeats copy

log = logging.getLogger(__name__)

CheckpointsRead = dict[tuple[str, str, int], tuple[Checkpoint, float]]  # (group, topic, partition) -> (cp, unix s)


def offset_syncs_cluster(flow: FlowConfig) -> str:
    """The alias of the cluster that holds the flow's offset syncs."""
    return flow.target if flow.offset_syncs_location == "target" else flow.source


def compacted_topics(config: MirrorConfig) -> dict[str, set[str]]:
    """Per cluster alias, the internal topics read back by key, which must be compacted: each flow's offset syncs
    where they live and its checkpoints on its target. Infra makes the Event Hubs ones so (infra/hubs.py)."""
    out: dict[str, set[str]] = {c.alias: set() for c in config.clusters}
    for flow in config.flows:
        out[offset_syncs_cluster(flow)].add(offset_syncs_topic(flow))
        out[flow.target].add(checkpoints_topic(flow))
    return out


def ensure_topic(cluster: ClusterConfig, topic: str, compacted: bool = True) -> str | None:
    """Make an internal topic where the mirror may; the reason it cannot be used, or None when it is there. One
    read back by key (`compacted`) that someone else made is checked to be compacted."""
    admin = clients.admin(cluster)
    if _exists(admin, topic):
        return _not_compacted(admin, cluster, topic) if compacted else None
    if cluster.is_eventhubs:
        return f"event hub '{topic}' does not exist on '{cluster.alias}'; infra must create it"
    new = NewTopic(topic, 1, config=INTERNAL_TOPIC_CONFIG)
    future = admin.create_topics([new], request_timeout=clients.REQUEST_TIMEOUT_S)
    try:
        future[topic].result()
    except KafkaException as err:
        if err.args[0].name() != "TOPIC_ALREADY_EXISTS":
            return f"cannot create '{topic}' on '{cluster.alias}': {err.args[0].str()}"
    return None


def topic_exists(cluster: ClusterConfig, topic: str) -> bool:
    """Whether the cluster has the topic (an internal one that cannot be used may still be there)."""
    return _exists(clients.admin(cluster), topic)


def _exists(admin: AdminClient, topic: str) -> bool:
    return topic in admin.list_topics(timeout=clients.REQUEST_TIMEOUT_S).topics


def _not_compacted(admin: AdminClient, cluster: ClusterConfig, topic: str) -> str | None:
    """Why an internal topic read back by key cannot be used: a cleanup policy that deletes old records loses the
    checkpoints of idle groups and the runs parked groups rest on. None when it is compacted, or when the cluster
    does not say (that is logged)."""
    try:
        cleanup = clients.topic_configs(admin, topic).get("cleanup.policy")
    except KafkaException as err:
        cleanup, why = None, err.args[0].str()
    else:
        why = "no cleanup.policy reported"
    if cleanup is None:
        log.warning("cannot check that '%s' on '%s' is compacted (%s); using it", topic, cluster.alias, why)
        return None
    if {p.strip() for p in cleanup.split(",")} == {"compact"}:
        return None
    if cluster.is_eventhubs:
        fix = (
            "an event hub's cleanup policy cannot be changed: delete the hub and run `pulumi up`, which makes it"
            " with cleanupPolicy Compact"
        )
    else:
        fix = (
            f"set cleanup.policy=compact on it (kafka-configs --alter --entity-type topics --entity-name {topic}"
            " --add-config cleanup.policy=compact)"
        )
    deletes = f"has cleanup.policy={cleanup}, which deletes records the mirror reads back"
    return f"'{topic}' on '{cluster.alias}' {deletes}; {fix}"


def read_checkpoints(config: MirrorConfig, flow: FlowConfig) -> CheckpointsRead:
    """The newest checkpoint per (group, target topic, partition), with when it was written (unix s). Only the
    newest record per key is decoded, and a group's tombstones leave it out. None at all where an older mirror left
    some under its dotted name refuses (`status` and `failover` read here too)."""
    out: CheckpointsRead = {}
    with _no_cycle_collection():
        for msg in clients.read_latest(config.cluster(flow.target), checkpoints_topic(flow)).values():
            cp = decode_or_none(Checkpoint, msg.key(), msg.value())
            if cp is not None:
                out[(cp.group, cp.topic, cp.partition)] = (cp, msg.timestamp()[1] / 1000)
    if not out:
        refuse_dotted_history(config, flow, checkpoints_only=True)
    return out


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Pause Python's cycle collector while a read-back decodes hundreds of thousands of records: they hold no
    cycles, and each collection would scan the whole heap of a running mirror again (it doubled the decode time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_offset_syncs(config: MirrorConfig, flow: FlowConfig) -> SyncStore:
    """The flow's offset-sync history, as a store (see spark_app.dr.syncs for how runs and slots rebuild it)."""
    store = SyncStore(local_writes=echoes_back(config, flow))
    synced = []
    for msg in clients.read_topic(config.cluster(offset_syncs_cluster(flow)), offset_syncs_topic(flow)):
        key = msg.key()
        if key is not None and msg.value() is None:  # a tombstone: the slot holds nothing any more
            try:
                topic, partition, slot, kind = OffsetSync.decode_key(key)
            except (ValueError, struct.error):
                continue
            synced.append(SlottedRun(topic, partition, slot, None, kind))
            continue
        sync = decode_or_none(OffsetSync, key, msg.value())
        if sync is not None:
            last = sync.upstream_offset if sync.last_offset is None else sync.last_offset
            run = Run(sync.upstream_offset, sync.downstream_offset, last)
            synced.append(SlottedRun(sync.topic, sync.partition, sync.slot, run, sync.kind))
    store.load(synced)
    return store


def newest_heartbeat_ms(config: MirrorConfig, flow: FlowConfig) -> int | None:
    """The timestamp of the newest heartbeat of this flow that reached its target."""
    newest = None
    remote = target_topic(flow, HEARTBEATS_TOPIC)
    for msg in clients.read_topic(config.cluster(flow.target), remote, tail=HEARTBEATS_TAIL):
        beat = decode_or_none(Heartbeat, msg.key(), msg.value())
        if beat is not None and (beat.source, beat.target) == (flow.source, flow.target):
            newest = max(newest or 0, beat.timestamp_ms)
    return newest


def target_start(target: AdminClient, topic: str, partition: int) -> int:
    """The first offset of a target partition: where a group with nothing better to go on resumes."""
    return clients.log_ranges(target, [(topic, partition)])[(topic, partition)][0]


def source_ends(source: ClusterConfig, partitions: list[Partition], timeout_s: float) -> PartitionOffsets:
    """End offsets of source partitions, in one batched request answered within `timeout_s`."""
    return clients.list_offsets(clients.admin(source), partitions, OffsetSpec.latest(), timeout_s=timeout_s)


def refuse_dotted_history(config: MirrorConfig, flow: FlowConfig, checkpoints_only: bool = False) -> None:
    """Mirrors before MM2's KIP-690 naming named the internal topics with dots whatever the separator. A flow with
    another separator whose history is only under those names would start over on new (or new, empty, infra-made)
    topics and lose it: refuse, naming the setting that keeps the old names. `checkpoints_only` asks the target
    alone, which is all a failover may reach."""
    if internal_separator(flow) == ".":
        return
    dotted = flow.model_copy(update={"internal_topic_separator": False})
    pairs = [(flow.target, checkpoints_topic(flow), checkpoints_topic(dotted)),
             (offset_syncs_cluster(flow), offset_syncs_topic(flow), offset_syncs_topic(dotted))]  # fmt: skip
    for alias, new, old in pairs[: 1 if checkpoints_only else 2]:
        cluster = config.cluster(alias)
        admin = clients.admin(cluster)
        present = clients.list_topics(admin, cluster)
        held = clients.list_offsets(admin, [(t, 0) for t in (new, old) if t in present], OffsetSpec.latest())
        if held.get((old, 0), 0) > 0 and held.get((new, 0), 0) == 0:
            raise MirrorFailed(
                f"flow {flow.name}: its DR history is in '{old}' on '{alias}', as an older mirror named it; with"
                f" separator '{flow.separator}' the mirror now names it '{new}', as MirrorMaker 2 does. Set"
                f" flows[{config.flows.index(flow)}].internal_topic_separator: false to keep the dotted names"
                " (MM2 and RemoteClusterUtils read them with replication.policy.internal.topic.separator.enabled"
                " = false)"
            )
