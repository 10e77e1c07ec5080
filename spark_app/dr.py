"""Disaster-recovery bookkeeping: offset syncs, MM2-format checkpoints, group offset sync, heartbeats, failover.

- Offset syncs. After every batch the stream hands over, per source partition, the last source offset written and
  the target offset it landed at. Each pair is kept in memory for translation and written to the flow's offset-syncs
  topic, so that a restarted mirror, `status` and `failover` can read them back.
- Checkpoints. Every `checkpoint_interval_s` the committed offsets of the flow's selected groups are read on the
  source, translated, and written to `<source>.checkpoints.internal` on the target in MirrorMaker 2's binary
  format, one partition, keyed by (group, target topic, partition): MM2's `RemoteClusterUtils.translateOffsets`
  reads them as they are.
- Translation never skips a record. For a committed offset C (the next record the group reads), with the newest
  sync (u, d) at or below it: C == u gives d exactly; u < C gives d + 1, which re-reads at most the C - 1 - u
  records between the sync and C (syncs come at every batch boundary, so that is under one batch; for a group
  ahead of the mirror, it is the mirror's lag behind the group). With no sync at or below C, the group's own
  previous checkpoint is used if it is not ahead of C, else the start of the target partition. Lagging groups are
  translated like any other: the kept history thins out with age, it never stops.
- Group offset sync (`sync_group_offsets`) commits the translations on the target for groups with no member there,
  and only where the target's own committed offset is behind: a group used on the target is never overwritten.
- Heartbeats, in MM2's format, go to `heartbeats` on the source every `heartbeat_interval_s` and are mirrored like
  any topic; the newest one seen on the target gives end-to-end liveness.

Offset syncs are written in MM2's OffsetSync format, but not under MM2's topic name. We name the topic
`mirrorkit-offset-syncs.<alias>.internal`, after the other cluster's alias as MM2 does (the target's when it lives on
the source, the source's when on the target). Three reasons: nothing outside MM2's own connectors reads offset
syncs (RemoteClusterUtils reads checkpoints only), so MM2's name buys no interop; an MM2 running on the same
clusters, as during a migration or a side-by-side benchmark, would mix its syncs with ours under one key and
corrupt both translations; and the name stays internal (never mirrored) under both tools' rules.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from .config import ClusterConfig, FlowConfig, MirrorConfig
from .metrics import MirrorMetrics
from .policy import HEARTBEATS_TOPIC, checkpoints_topic, offset_syncs_topic, should_mirror, target_topic
from .profiles import librdkafka_settings

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 30.0
# The dense tail of syncs kept per partition; older ones are thinned to every other one, so the history spans
# an exponentially growing range of offsets in bounded memory.
DENSE_SYNCS = 64
# Internal topics, when the mirror may create them (not on Event Hubs, where infra does): one partition, as MM2
# reads checkpoints from partition 0 only; compacted, as only the newest record per key matters.
INTERNAL_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": "3600000"}
HEARTBEATS_TAIL = 50  # records read back per partition of the target's heartbeats copy


# -- MirrorMaker 2's binary formats (connect-mirror-client 4.1.1: Checkpoint, Heartbeat; connect-mirror: OffsetSync).
# Kafka's protocol types: INT16/INT32/INT64 big-endian, STRING an INT16 length then UTF-8.


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.take(">h")
        if size < 0 or self.at + size > len(self.data):
            raise ValueError("bad STRING length")
        value = self.data[self.at : self.at + size].decode()
        self.at += size
        return value

    def version(self) -> None:
        version = self.take(">h")
        if version != 0:
            raise ValueError(f"unknown record version {version}")


@dataclass(frozen=True)
class Checkpoint:
    """key {group, topic, partition}; value header {version=0} + {upstreamOffset, offset, metadata}."""

    group: str
    topic: str  # the target (renamed) topic
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">hqq", 0, self.upstream_offset, self.downstream_offset) + _string(self.metadata)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Checkpoint:
        k, v = _Reader(key), _Reader(value)
        group, topic, partition = k.string(), k.string(), k.take(">i")
        v.version()
        return cls(group, topic, partition, v.take(">q"), v.take(">q"), v.string())


@dataclass(frozen=True)
class OffsetSync:
    """key {topic, partition} (the source topic); value {upstreamOffset, offset}, no version header."""

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int

    def key(self) -> bytes:
        return _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">qq", self.upstream_offset, self.downstream_offset)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> OffsetSync:
        k, v = _Reader(key), _Reader(value)
        return cls(k.string(), k.take(">i"), v.take(">q"), v.take(">q"))


@dataclass(frozen=True)
class Heartbeat:
    """key {sourceClusterAlias, targetClusterAlias}; value header {version=0} + {timestamp}."""

    source: str
    target: str
    timestamp_ms: int

    def key(self) -> bytes:
        return _string(self.source) + _string(self.target)

    def value(self) -> bytes:
        return struct.pack(">hq", 0, self.timestamp_ms)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Heartbeat:
        k, v = _Reader(key), _Reader(value)
        source, target = k.string(), k.string()
        v.version()
        return cls(source, target, v.take(">q"))


# -- translation ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Translation:
    downstream_offset: int
    reread: int  # at most this many records a consumer reads again on the target


class SyncStore:
    """(source offset, target offset) pairs per source partition, newest dense, older thinned."""

    def __init__(self) -> None:
        self._syncs: dict[tuple[str, int], list[tuple[int, int]]] = {}

    def record(self, topic: str, partition: int, upstream: int, downstream: int) -> None:
        syncs = self._syncs.setdefault((topic, partition), [])
        while syncs and syncs[-1][0] >= upstream:  # a replayed batch: the newer copy is where reading goes on
            syncs.pop()
        syncs.append((upstream, downstream))
        if len(syncs) > 2 * DENSE_SYNCS:
            old, dense = syncs[:-DENSE_SYNCS], syncs[-DENSE_SYNCS:]
            syncs[:] = old[::2] + dense

    def merge(self, newer: SyncStore) -> None:
        for (topic, partition), syncs in newer._syncs.items():
            for upstream, downstream in syncs:
                self.record(topic, partition, upstream, downstream)

    def reread(self, topic: str, partition: int, committed: int, resume_at: int) -> int | None:
        """At most how many records a consumer resuming at target offset `resume_at` reads again."""
        best = self.translate(topic, partition, committed)
        if best is not None:
            return best.reread + max(0, best.downstream_offset - resume_at)
        above = [s for s in self._syncs.get((topic, partition), []) if s[0] > committed]
        # The sync's own record is unread, so fewer than all of resume_at..d were read before.
        return max(0, above[0][1] - resume_at) if above else None

    def latest(self, topic: str, partition: int) -> tuple[int, int] | None:
        syncs = self._syncs.get((topic, partition))
        return syncs[-1] if syncs else None

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._syncs)

    def translate(
        self, topic: str, partition: int, committed: int, fallback: Translation | None = None
    ) -> Translation | None:
        """The target offset to resume at for a source committed offset; `fallback` when no sync is at or below it."""
        syncs = self._syncs.get((topic, partition), [])
        below = [s for s in syncs if s[0] <= committed]
        if not below:
            return fallback
        upstream, downstream = below[-1]
        if upstream == committed:
            return Translation(downstream, 0)
        return Translation(downstream + 1, committed - 1 - upstream)


# -- cluster access -------------------------------------------------------------------------------------------


def _admin(cluster: ClusterConfig) -> AdminClient:
    return AdminClient(librdkafka_settings(cluster, "admin"))


def _consumer(cluster: ClusterConfig) -> Consumer:
    return Consumer(
        librdkafka_settings(cluster, "consumer")
        | {"group.id": "mirrorkit-dr-reader", "enable.auto.commit": False, "enable.partition.eof": True}
    )


# What a partition answers while its leader is being elected, e.g. just after the topic was created.
LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def watermarks(consumer: Consumer, topic: str, partition: int, timeout_s: float = ADMIN_TIMEOUT_S) -> tuple[int, int]:
    """A partition's (log start, end), waiting out a leader that is still moving, up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=max(left, 1.0))
        except KafkaException as err:
            if err.args[0].code() not in LEADER_MOVING or left <= 0:
                raise
            time.sleep(0.2)


def read_topic(cluster: ClusterConfig, topic: str, tail: int | None = None, timeout_s: float = ADMIN_TIMEOUT_S) -> list:
    """Every record of a topic (or the last `tail` of each partition) up to its end now; [] if it does not exist."""
    consumer = _consumer(cluster)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return []
        assignment, ends = [], {}
        for p in metadata.partitions:
            low, high = watermarks(consumer, topic, p, timeout_s)
            if high > low:
                start = max(low, high - tail) if tail else low
                assignment.append(TopicPartition(topic, p, start))
                ends[p] = high
        if not assignment:
            return []
        consumer.assign(assignment)
        records, deadline = [], time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is None:
                records.append(msg)
            if msg.error() is None and msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
            elif msg.error() is not None and msg.error().code() != -191:  # -191: partition EOF
                raise KafkaException(msg.error())
        if ends:
            raise TimeoutError(f"reading '{topic}' on '{cluster.alias}' did not reach its end in {timeout_s:.0f}s")
        return records
    finally:
        consumer.close()


def read_checkpoints(config: MirrorConfig, flow: FlowConfig) -> dict[tuple[str, str, int], tuple[Checkpoint, float]]:
    """The newest checkpoint per (group, target topic, partition), with when it was written (unix s)."""
    out = {}
    for msg in read_topic(config.cluster(flow.target), checkpoints_topic(flow)):
        try:
            cp = Checkpoint.decode(msg.key(), msg.value())
        except (ValueError, struct.error, TypeError):
            continue  # a foreign record: MM2 skips it too
        out[(cp.group, cp.topic, cp.partition)] = (cp, msg.timestamp()[1] / 1000)
    return out


def read_offset_syncs(config: MirrorConfig, flow: FlowConfig) -> SyncStore:
    store = SyncStore()
    for msg in read_topic(config.cluster(offset_syncs_cluster(flow)), offset_syncs_topic(flow)):
        try:
            sync = OffsetSync.decode(msg.key(), msg.value())
        except (ValueError, struct.error, TypeError):
            continue
        store.record(sync.topic, sync.partition, sync.upstream_offset, sync.downstream_offset)
    return store


def newest_heartbeat_ms(config: MirrorConfig, flow: FlowConfig) -> int | None:
    """The timestamp of the newest heartbeat of this flow that reached its target."""
    newest = None
    for msg in read_topic(config.cluster(flow.target), target_topic(flow, HEARTBEATS_TOPIC), tail=HEARTBEATS_TAIL):
        try:
            beat = Heartbeat.decode(msg.key(), msg.value())
        except (ValueError, struct.error, TypeError):
            continue
        if (beat.source, beat.target) == (flow.source, flow.target):
            newest = max(newest or 0, beat.timestamp_ms)
    return newest


def offset_syncs_cluster(flow: FlowConfig) -> str:
    return flow.target if flow.offset_syncs_location == "target" else flow.source


def ensure_topic(cluster: ClusterConfig, topic: str) -> str | None:
    """Make an internal topic where the mirror may; the reason it cannot be used, or None when it is there."""
    admin = _admin(cluster)
    if topic in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics:
        return None
    if cluster.is_eventhubs:
        return f"event hub '{topic}' does not exist on '{cluster.alias}'; infra must create it"
    future = admin.create_topics([NewTopic(topic, 1, config=INTERNAL_TOPIC_CONFIG)], request_timeout=ADMIN_TIMEOUT_S)
    try:
        future[topic].result()
    except KafkaException as err:
        if err.args[0].name() != "TOPIC_ALREADY_EXISTS":
            return f"cannot create '{topic}' on '{cluster.alias}': {err.args[0].str()}"
    return None


def group_is_active(admin: AdminClient, group: str) -> int:
    """How many members the group has on this cluster (0 for an empty or unknown group)."""
    description = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[group].result()
    return len(description.members)


def committed_offsets(admin: AdminClient, group: str) -> dict[tuple[str, int], TopicPartition]:
    request = [ConsumerGroupTopicPartitions(group)]
    result = admin.list_consumer_group_offsets(request, request_timeout=ADMIN_TIMEOUT_S)[group].result()
    return {(tp.topic, tp.partition): tp for tp in result.topic_partitions if tp.offset >= 0}


@dataclass(frozen=True)
class GroupCommit:
    """What committing translated offsets did for one group: committed, kept (target ahead), or refused."""

    group: str
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    kept: dict[tuple[str, int], int] = field(default_factory=dict)
    refused: str | None = None


def commit_on_target(target: ClusterConfig, group: str, offsets: dict[tuple[str, int], int]) -> GroupCommit:
    """Commit target offsets for a group with no member on the target, never moving a partition backwards."""
    admin = _admin(target)
    members = group_is_active(admin, group)
    if members:
        return GroupCommit(
            group,
            refused=f"group '{group}' has {members} active member(s) on '{target.alias}'; stop its consumers there"
            " first, the mirror never overwrites a group in use",
        )
    current = committed_offsets(admin, group)
    committed, kept = {}, {}
    for tp, offset in offsets.items():
        have = current.get(tp)
        if have is not None and have.offset >= offset:
            kept[tp] = have.offset
        else:
            committed[tp] = offset
    if committed:
        partitions = [TopicPartition(t, p, o) for (t, p), o in sorted(committed.items())]
        request = [ConsumerGroupTopicPartitions(group, partitions)]
        try:
            admin.alter_consumer_group_offsets(request, request_timeout=ADMIN_TIMEOUT_S)[group].result()
        except KafkaException as err:  # a member joined between the check and the commit: the broker refused
            return GroupCommit(group, refused=f"group '{group}' on '{target.alias}': {err.args[0].str()}")
    return GroupCommit(group, committed, kept)


# -- the running loop -----------------------------------------------------------------------------------------


class DrSync:
    """One flow's DR loop. It reports each checkpoint write and the newest heartbeat seen on the target to the
    mirror's metrics, and keeps them as `checkpoint_written_at` (group -> unix s) and `newest_heartbeat_ms`."""

    def __init__(self, config: MirrorConfig, flow: FlowConfig, metrics: MirrorMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.flow = flow
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.emit_heartbeats = False  # only a running mirror beats: an available-now run is not a live service
        self.syncs = SyncStore()
        self.checkpoints: dict[tuple[str, str, int], Checkpoint] = {}
        self.checkpoint_written_at: dict[str, float] = {}
        self.newest_heartbeat_ms: int | None = None
        self.group_commits: dict[str, GroupCommit] = {}
        self.disabled: dict[str, str] = {}  # internal topic -> why it cannot be used
        self._lock = threading.Lock()
        self._producers: dict[str, Producer] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prepared = False

    # state for the metrics endpoint
    def heartbeat_age_s(self) -> float | None:
        return None if self.newest_heartbeat_ms is None else time.time() - self.newest_heartbeat_ms / 1000

    def prepare(self, emit_heartbeats: bool = False) -> None:
        """Make the internal topics and reload the syncs and checkpoints a previous run left.

        A cluster that does not answer leaves translation safe but coarse (no history: resume points fall back to
        the start of the target partition); it is retried at the next checkpoint.
        """
        if self._prepared:
            return
        self.emit_heartbeats = emit_heartbeats and self.flow.emit_heartbeats
        syncs_cluster = self.config.cluster(offset_syncs_cluster(self.flow))
        wanted = [(syncs_cluster, offset_syncs_topic(self.flow)), (self.target, checkpoints_topic(self.flow))]
        if self.emit_heartbeats:
            wanted.append((self.source, HEARTBEATS_TOPIC))
        try:
            for cluster, topic in wanted:
                reason = ensure_topic(cluster, topic)
                if reason:
                    self.disabled[topic] = reason
                    log.warning("flow %s: %s", self.flow.name, reason)
            stored = SyncStore()
            if offset_syncs_topic(self.flow) not in self.disabled:
                stored = read_offset_syncs(self.config, self.flow)
            if checkpoints_topic(self.flow) not in self.disabled:
                self.checkpoints = {k: cp for k, (cp, _) in read_checkpoints(self.config, self.flow).items()}
        except (KafkaException, TimeoutError) as err:
            log.warning("flow %s: cannot read DR state yet: %s", self.flow.name, err)
            return
        with self._lock:
            stored.merge(self.syncs)  # batches that landed while the history was read come last
            self.syncs = stored
        self._prepared = True

    def on_landed(self, flow: FlowConfig, rows: Iterable) -> None:
        """The stream's after-batch hook: record and write one offset sync per partition that landed."""
        topic = offset_syncs_topic(self.flow)
        producer = None if topic in self.disabled else self._producer(offset_syncs_cluster(self.flow))
        with self._lock:
            for row in rows:
                if row.last_target_offset < 0:
                    continue
                self.syncs.record(row.topic, row.partition, row.last_offset, row.last_target_offset)
                if producer is not None:
                    sync = OffsetSync(row.topic, row.partition, row.last_offset, row.last_target_offset)
                    producer.produce(topic, key=sync.key(), value=sync.value())
        if producer is not None:
            producer.poll(0)

    def checkpoint_once(self) -> list[Checkpoint]:
        """Translate every selected group's committed offsets, write the checkpoints, sync groups if asked."""
        self.prepare(self.emit_heartbeats)
        source_admin = _admin(self.source)
        listing = source_admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result()
        groups = sorted(g.group_id for g in listing.valid if self.flow.groups.matches(g.group_id))
        written: list[Checkpoint] = []
        for group in groups:
            offsets = committed_offsets(source_admin, group)
            group_cps = [cp for tp, c in sorted(offsets.items()) if (cp := self._checkpoint(group, tp, c)) is not None]
            written += group_cps
            if self.flow.sync_group_offsets and group_cps:
                offsets_on_target = {(cp.topic, cp.partition): cp.downstream_offset for cp in group_cps}
                self.group_commits[group] = commit_on_target(self.target, group, offsets_on_target)
        if written and checkpoints_topic(self.flow) not in self.disabled:
            self._flush(offset_syncs_cluster(self.flow))
            producer = self._producer(self.flow.target)
            for cp in written:
                producer.produce(checkpoints_topic(self.flow), key=cp.key(), value=cp.value())
            if producer.flush(ADMIN_TIMEOUT_S):
                raise RuntimeError(f"flow {self.flow.name}: checkpoints not acknowledged by '{self.flow.target}'")
            now = time.time()
            for cp in written:
                self.checkpoints[(cp.group, cp.topic, cp.partition)] = cp
                self.checkpoint_written_at[cp.group] = now
                if self.metrics is not None:
                    self.metrics.checkpoint_written(self.flow.name, cp.group, now)
        return written

    def _checkpoint(self, group: str, tp: tuple[str, int], committed: TopicPartition) -> Checkpoint | None:
        topic, partition = tp
        if not should_mirror(self.flow, topic):
            return None
        remote = target_topic(self.flow, topic)
        previous = self.checkpoints.get((group, remote, partition))
        fallback = None
        if previous is not None and previous.upstream_offset <= committed.offset:
            fallback = Translation(previous.downstream_offset, committed.offset - previous.upstream_offset)
        with self._lock:
            translation = self.syncs.translate(topic, partition, committed.offset, fallback)
        if translation is None:
            if self.syncs.latest(topic, partition) is None:
                return None  # nothing of this partition mirrored yet
            translation = Translation(self._target_start(remote, partition), committed.offset)
        metadata = committed.metadata or ""
        return Checkpoint(group, remote, partition, committed.offset, translation.downstream_offset, metadata)

    def _target_start(self, topic: str, partition: int) -> int:
        consumer = _consumer(self.target)
        try:
            return watermarks(consumer, topic, partition)[0]
        finally:
            consumer.close()

    def heartbeat_once(self) -> None:
        if self.emit_heartbeats and HEARTBEATS_TOPIC not in self.disabled:
            beat = Heartbeat(self.flow.source, self.flow.target, int(time.time() * 1000))
            producer = self._producer(self.flow.source)
            producer.produce(HEARTBEATS_TOPIC, key=beat.key(), value=beat.value())
            producer.poll(0)
        self.observe_heartbeats()

    def observe_heartbeats(self) -> None:
        seen = newest_heartbeat_ms(self.config, self.flow)
        if seen is not None:
            self.newest_heartbeat_ms = max(self.newest_heartbeat_ms or 0, seen)
            if self.metrics is not None:
                self.metrics.heartbeat_seen(self.flow.name, self.newest_heartbeat_ms / 1000)

    def _producer(self, alias: str) -> Producer:
        if alias not in self._producers:
            settings = librdkafka_settings(self.config.cluster(alias), "producer")
            self._producers[alias] = Producer(settings | {"acks": "all", "linger.ms": 5})
        return self._producers[alias]

    def _flush(self, alias: str) -> None:
        if alias in self._producers:
            self._producers[alias].flush(ADMIN_TIMEOUT_S)

    # -- the loop ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run checkpoints and heartbeats on their intervals in a daemon thread until `stop`."""
        self.prepare(emit_heartbeats=True)
        self._attempt(self.heartbeat_once)  # before topic sync runs, so `heartbeats` is there to be mirrored
        self._thread = threading.Thread(target=self._run, name=f"dr {self.flow.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tasks: list[tuple[float, Callable[[], object]]] = [
            (self.config.checkpoint_interval_s, self.checkpoint_once),
            (self.config.heartbeat_interval_s, self.heartbeat_once),
        ]
        due = [time.monotonic()] * len(tasks)
        while not self._stop.is_set():
            for i, (interval, task) in enumerate(tasks):
                if time.monotonic() >= due[i]:
                    due[i] = time.monotonic() + interval
                    self._attempt(task)
            self._stop.wait(max(0.05, min(due) - time.monotonic()))

    def _attempt(self, task: Callable[[], object]) -> None:
        """Run one DR task; a failure is logged and the next interval tries again."""
        try:
            task()
        except Exception as err:  # noqa: BLE001 - a DR hiccup must not stop the data plane
            log.warning("flow %s: %s failed: %s", self.flow.name, task.__name__, err)

    def stop(self) -> None:
        """Stop the loop, then write a final offset sync flush and checkpoint, so a finished run is exact."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(ADMIN_TIMEOUT_S * 3)
        self.prepare()
        for alias in list(self._producers):
            self._flush(alias)
        try:
            self.checkpoint_once()
            self.observe_heartbeats()
        except (KafkaException, RuntimeError) as err:
            log.warning("flow %s: final checkpoint failed: %s", self.flow.name, err)


# -- operator views -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverRow:
    group: str
    topic: str  # on the target
    partition: int
    source_offset: int
    target_offset: int
    reread: int | None  # records read again, at most; None when the syncs to tell are gone


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
        rows.append(FailoverRow(group, topic, partition, cp.upstream_offset, cp.downstream_offset, reread))
    return rows


def failover(config: MirrorConfig, flow: FlowConfig, plan: list[FailoverRow]) -> list[GroupCommit]:
    target = config.cluster(flow.target)
    by_group: dict[str, dict[tuple[str, int], int]] = {}
    for row in plan:
        by_group.setdefault(row.group, {})[(row.topic, row.partition)] = row.target_offset
    return [commit_on_target(target, group, offsets) for group, offsets in sorted(by_group.items())]


def flow_status(config: MirrorConfig, flow: FlowConfig) -> dict:
    """Lag, checkpoint age and heartbeat age per topic-partition, from what the mirror wrote on the clusters."""
    now = time.time()
    syncs = read_offset_syncs(config, flow)
    checkpoint_at: dict[tuple[str, int], float] = {}
    for (_, topic, partition), (_, written) in read_checkpoints(config, flow).items():
        checkpoint_at[(topic, partition)] = max(written, checkpoint_at.get((topic, partition), 0.0))
    heartbeat = newest_heartbeat_ms(config, flow)
    ends: dict[tuple[str, int], int] | None = {}
    consumer = _consumer(config.cluster(flow.source))
    try:
        for topic, partition in syncs.partitions():
            ends[(topic, partition)] = watermarks(consumer, topic, partition, timeout_s=10)[1]
    except KafkaException:
        ends = None  # the source is down: lag cannot be known
    finally:
        consumer.close()
    rows = []
    for topic, partition in syncs.partitions():
        mirrored = syncs.latest(topic, partition)[0] + 1
        at = checkpoint_at.get((target_topic(flow, topic), partition))
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "mirrored_offset": mirrored,
                "source_end_offset": None if ends is None else ends[(topic, partition)],
                "lag": None if ends is None else max(0, ends[(topic, partition)] - mirrored),
                "checkpoint_age_s": None if at is None else round(now - at, 3),
            }
        )
    return {
        "flow": flow.name,
        "source_reachable": ends is not None,
        "heartbeat_age_s": None if heartbeat is None else round(now - heartbeat / 1000, 3),
        "partitions": rows,
    }
