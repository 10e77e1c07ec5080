"""One flow's DR service: it makes the internal topics, reloads their history, and runs the DR tasks beside the copy.

The copy (either mode) hands its landings to `on_landed` (offset syncs). A daemon thread runs the checkpoint task
every `checkpoint_interval_s` and the heartbeat task every `heartbeat_interval_s`; a failed round is logged and
tried again at the next interval, as a DR hiccup must not stop the data plane. `stop` ends with a final offset sync
flush and checkpoint, so a finished run is exact. The Kafka side of each task is wired here.

Nothing is written before the flow's DR lease is held (spark_app.dr.lease), and each round looks at it first: a
service whose lease another mirror of the flow took over writes nothing more, and `fenced` says why, so the mirror
stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException, Producer

from .. import clients
from ..clients import Partition
from ..config import FlowConfig, MirrorConfig
from ..metrics import MirrorMetrics
from ..policy import HEARTBEATS_TOPIC, checkpoints_topic, echoes_back, offset_syncs_topic
from ..ranges import Landing
from .checkpoints import CheckpointTask
from .formats import Checkpoint, Heartbeat, OffsetSync
from .groups import ClusterGroups, GroupCommit
from .heartbeats import HeartbeatTask
from .internal import (
    ensure_topic,
    newest_heartbeat_ms,
    offset_syncs_cluster,
    read_checkpoints,
    read_offset_syncs,
    refuse_dotted_history,
    target_start,
    topic_exists,
)
from .lease import DrLease
from .offset_syncs import OffsetSyncWriter
from .syncs import SyncStore

log = logging.getLogger(__name__)

PRODUCER_SETTINGS = {"acks": "all", "linger.ms": 5}


class DrSync:
    """One flow's DR loop. It reports each checkpoint write and the newest heartbeat seen on the target to the
    mirror's metrics."""

    def __init__(self, config: MirrorConfig, flow: FlowConfig, metrics: MirrorMetrics | None = None) -> None:
        self.config = config
        self.flow = flow
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.emit_heartbeats = False  # only a running mirror beats: an available-now run is not a live service
        self.disabled: dict[str, str] = {}  # internal topic -> why it cannot be used
        self.syncs = SyncStore(local_writes=echoes_back(config, flow))
        self._lock = threading.Lock()  # the copy's landings and the checkpoint task share the store
        self.offset_syncs = OffsetSyncWriter(self.syncs, self._lock, self._emit_sync)
        self.producers = _Producers(config)
        self.checkpoints = CheckpointTask(
            flow, self.syncs, self._lock, ClusterGroups(self.source), _Target(self, self.producers),
            on_written=None if metrics is None else lambda group, at: metrics.checkpoint_written(flow.name, group, at),
        )  # fmt: skip
        self.heartbeats = HeartbeatTask(
            flow, self._emit_heartbeat, lambda: newest_heartbeat_ms(config, flow),
            on_seen=None if metrics is None else lambda at: metrics.heartbeat_seen(flow.name, at),
        )  # fmt: skip
        self.lease = DrLease(self.target, flow)
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._topics_made = False
        self._prepared = False
        self._leaseless = False  # the flow has no topic to hold its lease on: its DR writes are not fenced

    @property
    def fenced(self) -> str | None:
        """Why this service writes no more DR state (another mirror of the flow took its lease), or None."""
        return self.lease.fenced

    @property
    def newest_heartbeat_ms(self) -> int | None:
        """The newest heartbeat of this flow seen on its target."""
        return self.heartbeats.newest_ms

    def prepare(self, emit_heartbeats: bool = False) -> None:
        """Make the internal topics, take the flow's DR lease and reload the syncs and checkpoints a previous run left.

        A cluster that does not answer leaves translation safe but coarse (no history: resume points fall back to
        the start of the target partition); it is retried at the next checkpoint. The copy may land meanwhile: its
        landings wait in memory, as nothing is written before this is done.
        """
        if self._prepared or not self.make_topics(emit_heartbeats):
            return
        try:
            checkpoints = checkpoints_topic(self.flow)
            if checkpoints not in self.disabled or topic_exists(self.target, checkpoints):
                self.lease.acquire()  # before reading back: a mirror it fences writes no more after its round
            else:
                self._leaseless = True
                log.warning("flow %s: its DR writes are not fenced: one writer per flow is held on '%s', which"
                            " cannot be used", self.flow.name, checkpoints)  # fmt: skip
            stored = SyncStore()
            if offset_syncs_topic(self.flow) not in self.disabled:
                stored = read_offset_syncs(self.config, self.flow)
            if checkpoints_topic(self.flow) not in self.disabled:
                read = read_checkpoints(self.config, self.flow)
                self.checkpoints.checkpoints = {k: cp for k, (cp, _) in read.items()}
        except (KafkaException, TimeoutError) as err:
            log.warning("flow %s: cannot read DR state yet: %s", self.flow.name, err)
            return
        with self._lock:
            self.syncs.rebase(stored)  # batches that landed while the history was read stay the newest
        self._prepared = True

    def make_topics(self, emit_heartbeats: bool = False) -> bool:
        """Refuse a history the flow's internal topic names would lose (raises), and make the internal topics; False
        while a cluster does not answer (`prepare` tries again). Quick, so the mirror does it before its flows start
        (their first topic sync finds `heartbeats`) and the rest of `prepare` (a group join for the lease, which a
        broker may hold for its initial rebalance delay, and the history's reads) goes on beside the copy."""
        if self._topics_made:
            return True
        self.emit_heartbeats = emit_heartbeats and self.flow.emit_heartbeats
        syncs_cluster = self.config.cluster(offset_syncs_cluster(self.flow))
        wanted = [
            (syncs_cluster, offset_syncs_topic(self.flow), True),
            (self.target, checkpoints_topic(self.flow), True),
        ]
        if self.emit_heartbeats:
            wanted.append((self.source, HEARTBEATS_TOPIC, False))  # read by its tail: any cleanup policy does
        self.disabled.clear()  # as this attempt finds them
        self._leaseless = False
        try:
            refuse_dotted_history(self.config, self.flow)
            for cluster, topic, compacted in wanted:
                reason = ensure_topic(cluster, topic, compacted)
                if reason:
                    self.disabled[topic] = reason
                    log.warning("flow %s: %s", self.flow.name, reason)
        except (KafkaException, TimeoutError) as err:
            log.warning("flow %s: cannot make its DR topics yet: %s", self.flow.name, err)
            return False
        if self._metrics is not None:  # an alert fires on it: a log line alone goes unread
            self._metrics.dr_topics_unusable(self.flow.name, self.disabled)
        self._topics_made = True
        return True

    def on_landed(self, rows: Iterable[Landing]) -> None:
        """The copy's after-landing hook: record where each range landed (written to the topic at the next round)."""
        self.offset_syncs.on_landed(rows)

    def forget(self, topics: list[str]) -> None:
        """Topics the flow's ledger forgot, gone from the source for good: their history goes, and the offset-syncs
        topic gets its tombstones at the next round, so neither grows with every topic ever mirrored."""
        with self._lock:
            self.syncs.forget(topics)

    def checkpoint_once(self) -> list[Checkpoint]:
        """Write the offset syncs that changed, then the checkpoints that changed (after the syncs they rest on)."""
        self.prepare(self.emit_heartbeats)
        if not self._may_write():
            return []
        self.offset_syncs.flush()
        return self.checkpoints.run_once()

    def heartbeat_once(self) -> None:
        if self._may_write():
            self.heartbeats.run_once()

    def _may_write(self) -> bool:
        """Whether this service holds the flow's DR lease, or the flow has no topic to hold it on (its writes are then
        not fenced, as logged at `prepare`)."""
        return self._leaseless or self.lease.held()

    def _emit_sync(self, sync: OffsetSync) -> None:
        topic = offset_syncs_topic(self.flow)
        if topic not in self.disabled:
            producer = self.producers.get(offset_syncs_cluster(self.flow))
            delivered = self.offset_syncs.delivered
            clients.produce(producer, topic, sync.key(), sync.record_value(), lambda err, _: delivered(sync, err))

    def _emit_heartbeat(self, beat: Heartbeat) -> None:
        if self.emit_heartbeats and HEARTBEATS_TOPIC not in self.disabled:
            producer = self.producers.get(self.flow.source)
            clients.produce(producer, HEARTBEATS_TOPIC, beat.key(), beat.value())

    # -- the loop ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run checkpoints and heartbeats on their intervals in a daemon thread until `stop`. The internal topics are
        made first, so the flows' first topic sync finds `heartbeats`; the thread's first round prepares the rest
        while the flows start, then beats."""
        self.make_topics(emit_heartbeats=True)
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
            log.warning("flow %s: %s failed: %s", self.flow.name, getattr(task, "__name__", task), err)

    def stop(self) -> None:
        """Stop the loop, then write the final offset syncs and checkpoints, so a finished run is exact."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(clients.REQUEST_TIMEOUT_S * 3)
        self.prepare()
        try:
            self.checkpoint_once()
            self.producers.flush_all()
            self.heartbeats.observe()
        except (KafkaException, RuntimeError, TimeoutError) as err:
            log.warning("flow %s: final checkpoint failed: %s", self.flow.name, err)
        self.lease.release()


class _Producers:
    """One producer per cluster the service writes to (offset syncs, checkpoints, heartbeats)."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self._by_alias: dict[str, Producer] = {}

    def get(self, alias: str) -> Producer:
        if alias not in self._by_alias:
            self._by_alias[alias] = clients.producer(self.config.cluster(alias), PRODUCER_SETTINGS)
        return self._by_alias[alias]

    def flush(self, alias: str) -> None:
        if alias in self._by_alias:
            self._by_alias[alias].flush(clients.REQUEST_TIMEOUT_S)

    def flush_all(self) -> None:
        for alias in list(self._by_alias):
            self.flush(alias)


class _Target:
    """The flow's target for the checkpoint task: checkpoints go out after the offset syncs they rest on."""

    def __init__(self, service: DrSync, producers: _Producers) -> None:
        self.flow = service.flow
        self.target = service.target
        self.disabled = service.disabled
        self.producers = producers
        self.groups = ClusterGroups(service.target)

    def start_offset(self, topic: str, partition: int) -> int:
        return target_start(self.groups.admin, topic, partition)

    def write(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        topic = checkpoints_topic(self.flow)
        if topic in self.disabled:
            return []
        self.producers.flush(offset_syncs_cluster(self.flow))
        producer = self.producers.get(self.flow.target)
        refused: dict[int, str] = {}  # index in `checkpoints` -> why the cluster did not take it

        def report(i: int) -> clients.Delivered:
            return lambda err, _: None if err is None else refused.__setitem__(i, err.str())

        for i, cp in enumerate(checkpoints):
            clients.produce(producer, topic, cp.key(), cp.record_value(), report(i))
        if producer.flush(clients.REQUEST_TIMEOUT_S):
            raise RuntimeError(f"flow {self.flow.name}: checkpoints not acknowledged by '{self.flow.target}'")
        if refused:
            log.warning("flow %s: %d checkpoint(s) not taken by '%s' (%s); written again at the next round",
                        self.flow.name, len(refused), self.flow.target, next(iter(refused.values())))  # fmt: skip
        return [cp for i, cp in enumerate(checkpoints) if i not in refused]

    def commit(self, group: str, offsets: dict[Partition, int]) -> GroupCommit:
        return self.groups.commit(group, offsets)
