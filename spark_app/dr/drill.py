"""The DR drill: measure a running flow's RPO, RTO and re-read with a probe topic and group of its own.

Against a flow whose mirror is already running, `drill` touches only its probe topic (made on the source if absent,
and left there) and a probe group with a fresh name (deleted on both clusters at the end, its checkpoints
tombstoned). It produces numbered
probe records at a steady rate; meanwhile the probe group consumes part of them on the source and commits. At the
cut it stops producing and notes what the source acknowledged and what had reached the target at that instant:
the RPO is the records (and seconds of production) not yet there. It then waits for the mirror to checkpoint the
probe group, fails over that group alone (the same plan and commit as `mirrorkit failover`), and consumes on the
target: the RTO runs from the failover's start to the group's first record there; the re-read counts records it
reads again that it had consumed on the source; a record it had not consumed and never reads is skipped.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from .. import clients
from ..config import ClusterConfig, ConfigError, FlowConfig, MirrorConfig
from ..errors import MirrorFailed
from ..policy import PROBE_TOPIC, checkpoints_topic, never_mirrored, should_mirror, target_topic
from .formats import Checkpoint
from .groups import ClusterGroups
from .internal import read_checkpoints
from .views import failover_plan, translate_groups

DEFAULT_PROBE_TOPIC = PROBE_TOPIC  # not `mirrorkit-...`: that prefix is internal, never mirrored
PROBE_PARTITIONS = 2  # when the drill makes the probe topic
WARMUP_TIMEOUT_S = 300.0  # for a running mirror to notice a new topic (a restart of its copy) and copy a first record
CATCH_UP_TIMEOUT_S = 120.0  # for the probe group to read on the target what it had not consumed on the source
POLL_S = 0.2

Partitions = dict[int, int]  # partition -> offset


class DrillRefused(MirrorFailed):
    """The drill cannot run against this flow or cluster as it is; the message names what to change."""


@dataclass(frozen=True)
class DrillReport:
    """What a drill measured. Probe records are counted from the drill's first (warm-up) record on."""

    flow: str
    probe_topic: str  # on the source; left there
    target_topic: str
    probe_group: str
    produced: int  # probe records the source acknowledged
    on_target_at_cut: int  # of those, already on the target when production stopped
    rpo_records: int  # produced - on_target_at_cut
    rpo_seconds: float  # the cut minus the produce time of the oldest record not yet on the target; 0 if none
    consumed_on_source: int  # records the probe group consumed (and committed) on the source
    checkpoint_wait_s: float  # from the cut until the mirror's checkpoint carried the group's committed offsets
    rto_seconds: float  # from the failover's start to the group's first record on the target
    read_on_target: int  # records the group read on the target until it had every record it had not consumed
    reread: int  # of those, records it had consumed on the source already
    reread_bound: int | None  # the re-read the failover plan predicted (None when the syncs to tell are gone)
    skipped: int  # records it had not consumed on the source and did not read on the target
    cleanup: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DrillOptions:
    probe_topic: str = DEFAULT_PROBE_TOPIC
    records: int = 1000
    seconds: float = 20.0


def check_probe(config: MirrorConfig, flow: FlowConfig, probe_topic: str, probe_group: str) -> None:
    """Refuse, naming the setting, a flow that would not mirror the probe topic or checkpoint the probe group."""
    where = f"flows[{config.flows.index(flow)}]"
    if never_mirrored(probe_topic, flow.separator):
        raise ConfigError(f"--probe-topic: '{probe_topic}' is an internal name the mirror never copies; pick another")
    if not should_mirror(flow, probe_topic):
        raise ConfigError(
            f"{where}.topics: flow {flow.name} does not mirror the probe topic '{probe_topic}'; add it to"
            f" {where}.topics.include (and keep it out of exclude), or pass --probe-topic with a name it selects"
        )
    if not flow.groups.matches(probe_group):
        raise ConfigError(
            f"{where}.groups: flow {flow.name} does not checkpoint the probe group '{probe_group}'; let"
            f" {where}.groups.include match '{probe_group.rsplit('-', 1)[0]}-.*'"
        )


class Drill:
    """One drill of one flow. `run` does it all and returns the report; `log` hears each step."""

    def __init__(
        self, config: MirrorConfig, flow: FlowConfig, options: DrillOptions, log: Callable[[str], None] = print
    ) -> None:
        self.config = config
        self.flow = flow
        self.options = options
        self.log = log
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.run_id = uuid.uuid4().hex[:12]
        self.group = f"{options.probe_topic}-{self.run_id}"
        self.remote = target_topic(flow, options.probe_topic)
        self.produce_ms: dict[int, int] = {}  # seq -> produce time (ms), for acknowledged records
        self.failed: list[str] = []
        self._seq = 0
        check_probe(config, flow, options.probe_topic, self.group)

    # -- the steps ---------------------------------------------------------------------------------------------

    def run(self) -> DrillReport:
        partitions = self.prepare()
        source_start = self._ends(self.source, self.options.probe_topic, partitions)
        target_start = self._ends(self.target, self.remote, partitions, missing_ok=True)
        producer = clients.producer(self.source, {"acks": "all", "enable.idempotence": True, "linger.ms": 5})
        try:
            self.warm_up(producer, partitions, target_start)
            consumed, committed, cut_at, on_target = self.produce_and_consume(
                producer, partitions, source_start, target_start
            )
        finally:
            producer.flush(clients.REQUEST_TIMEOUT_S)
        produced = len(self.produce_ms)
        missing = [self.produce_ms[s] for s in self.produce_ms if s not in on_target]
        rpo_seconds = max(0.0, cut_at - min(missing) / 1000) if missing else 0.0
        self.log(f"cut: {produced} acknowledged on the source, {len(on_target)} on the target")
        try:
            checkpoint_wait = self.wait_for_checkpoint(committed, cut_at)
            rto, reads, bound = self.fail_over_and_consume(consumed)
        except BaseException:
            for line in self.clean_up():  # the probe group must not outlive a failed drill
                self.log(line)
            raise
        unconsumed = set(self.produce_ms) - consumed
        report = DrillReport(
            flow=self.flow.name,
            probe_topic=self.options.probe_topic,
            target_topic=self.remote,
            probe_group=self.group,
            produced=produced,
            on_target_at_cut=len(on_target),
            rpo_records=produced - len(on_target),
            rpo_seconds=round(rpo_seconds, 3),
            consumed_on_source=len(consumed),
            checkpoint_wait_s=round(checkpoint_wait, 3),
            rto_seconds=round(rto, 3),
            read_on_target=len(reads),
            reread=sum(1 for s in reads if s in consumed),
            reread_bound=bound,
            skipped=len(unconsumed - set(reads)),
            cleanup=self.clean_up(),
        )
        return report

    def prepare(self) -> list[int]:
        """The probe topic's partitions on the source, made if absent (not on Event Hubs, where infra makes hubs)."""
        admin = clients.admin(self.source)
        topic = self.options.probe_topic
        metadata = clients.list_topics(admin, self.source).get(topic)
        if metadata is None or metadata.error is not None:
            if self.source.is_eventhubs:
                raise DrillRefused(
                    f"event hub '{topic}' does not exist on '{self.source.alias}'; infra must create it before a drill"
                )
            future = admin.create_topics([NewTopic(topic, PROBE_PARTITIONS)], request_timeout=clients.REQUEST_TIMEOUT_S)
            try:
                future[topic].result()
                self.log(f"created probe topic '{topic}' on '{self.source.alias}'")
            except KafkaException as err:
                if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    reason = f"{err.args[0].str()} ({err.args[0].name()})"
                    raise DrillRefused(f"cannot create '{topic}' on '{self.source.alias}': {reason}") from None
            deadline = time.monotonic() + clients.REQUEST_TIMEOUT_S
            while (metadata := clients.list_topics(admin, self.source).get(topic)) is None or metadata.error:
                if time.monotonic() > deadline:
                    raise DrillRefused(f"probe topic '{topic}' did not appear on '{self.source.alias}'")
                time.sleep(0.5)
        if self.target.is_eventhubs:
            on_target = clients.list_topics(clients.admin(self.target), self.target).get(self.remote)
            if on_target is None or on_target.error is not None:
                raise DrillRefused(
                    f"event hub '{self.remote}' does not exist on '{self.target.alias}'; infra must create it"
                    " (list the probe topic in the flow's topics.include)"
                )
        return sorted(metadata.partitions)

    def warm_up(self, producer: Producer, partitions: list[int], target_start: Partitions) -> None:
        """One probe record per partition every second until the mirror has copied one of each: it is running
        and copying the probe topic."""
        deadline = time.monotonic() + WARMUP_TIMEOUT_S
        while True:
            for p in partitions:
                self._produce(producer, p)
            producer.flush(clients.REQUEST_TIMEOUT_S)
            ends = self._ends(self.target, self.remote, partitions, missing_ok=True)
            if all(ends[p] > target_start[p] for p in partitions):
                return
            if time.monotonic() > deadline:
                raise DrillRefused(
                    f"flow {self.flow.name}: nothing of '{self.options.probe_topic}' reached '{self.remote}' on"
                    f" '{self.target.alias}' in {WARMUP_TIMEOUT_S:.0f}s; is its mirror running?"
                )
            time.sleep(1.0)

    def produce_and_consume(
        self, producer: Producer, partitions: list[int], source_start: Partitions, target_start: Partitions
    ) -> tuple[set[int], Partitions, float, set[int]]:
        """Produce at a steady rate while the probe group consumes about half on the source and commits; then cut.

        Returns the seqs consumed, the group's committed offsets, the cut's time, and the seqs on the target then.
        """
        warm = self._seq  # warm-up records so far
        total, interval = self.options.records, self.options.seconds / max(1, self.options.records)

        def steady() -> None:
            began = time.monotonic()
            for i in range(total):
                time.sleep(max(0.0, began + i * interval - time.monotonic()))
                self._produce(producer, partitions[i % len(partitions)])
                producer.poll(0)

        thread = threading.Thread(target=steady, name="drill producer", daemon=True)
        thread.start()
        consumer = clients.consumer(self.source, {"group.id": self.group, "enable.auto.commit": False})
        consumed: set[int] = set()
        position = dict(source_start)
        try:
            consumer.assign([TopicPartition(self.options.probe_topic, p, o) for p, o in source_start.items()])
            half = (warm + total) // 2
            deadline = time.monotonic() + self.options.seconds + clients.REQUEST_TIMEOUT_S
            while len(consumed) < half and time.monotonic() < deadline:
                msg = consumer.poll(POLL_S)
                seq = self._seq_of(msg)
                if msg is not None and seq is not None:
                    consumed.add(seq)
                    position[msg.partition() or 0] = (msg.offset() or 0) + 1
            committed = dict(position)
            offsets = [TopicPartition(self.options.probe_topic, p, o) for p, o in sorted(committed.items())]
            consumer.commit(offsets=offsets, asynchronous=False)
        finally:
            consumer.close()
        self.log(f"probe group '{self.group}' consumed {len(consumed)} records on the source and committed")
        thread.join()
        producer.flush(clients.REQUEST_TIMEOUT_S)
        cut_at = time.time()
        target_ends = self._ends(self.target, self.remote, partitions, missing_ok=True)
        if self.failed:
            raise MirrorFailed(f"the source refused probe records: {'; '.join(self.failed[:3])}")
        on_target = set(self._read(self.target, self.remote, target_start, target_ends))
        return consumed, committed, cut_at, on_target & set(self.produce_ms)

    def wait_for_checkpoint(self, committed: Partitions, since: float) -> float:
        """Seconds from `since` until the target holds a checkpoint of the probe group at its committed offsets."""
        wait_s = clients.REQUEST_TIMEOUT_S * 4 + 3 * self.config.checkpoint_interval_s
        deadline = time.monotonic() + wait_s
        wanted = {(self.group, self.remote, p): o for p, o in committed.items()}
        while True:
            read = read_checkpoints(self.config, self.flow)
            if all(k in read and read[k][0].upstream_offset == o for k, o in wanted.items()):
                self.log(f"checkpoint of '{self.group}' written on '{self.target.alias}'")
                return time.time() - since
            if time.monotonic() > deadline:
                raise MirrorFailed(
                    f"flow {self.flow.name}: no checkpoint of the probe group '{self.group}' in {wait_s:.0f}s;"
                    " is the mirror running, with checkpoints on?"
                )
            time.sleep(min(1.0, self.config.checkpoint_interval_s / 2))

    def fail_over_and_consume(self, consumed: set[int]) -> tuple[float, list[int], int | None]:
        """Fail over the probe group alone, then consume on the target until every record it had not consumed
        on the source is read. Returns the RTO, the seqs read (in order), and the plan's re-read bound."""
        began = time.monotonic()
        plan = failover_plan(self.config, self.flow, re.escape(self.group))
        if not plan:
            raise MirrorFailed(f"flow {self.flow.name}: the failover plan has no row for '{self.group}'")
        self.log(self._delete_group(self.source))  # planned: the mirror need not checkpoint the group any more
        # The groups alone: a drill on a live standby leaves its copies' write block in place.
        for result in translate_groups(self.config, self.flow, plan):
            if result.refused:
                raise MirrorFailed(result.refused)
        bounds = [r.reread for r in plan]
        bound = None if any(b is None for b in bounds) else sum(b or 0 for b in bounds)
        where = ", ".join(f"{r.topic}[{r.partition}]={r.target_offset}" for r in plan)
        self.log(f"failed over '{self.group}': {where}")
        wanted = set(self.produce_ms) - consumed
        reads: list[int] = []
        rto: float | None = None
        consumer = clients.consumer(
            self.target, {"group.id": self.group, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        )
        try:
            consumer.subscribe([self.remote])
            deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
            while not wanted <= set(reads) and time.monotonic() < deadline:
                msg = consumer.poll(POLL_S)
                seq = self._seq_of(msg)
                if seq is None:
                    continue
                rto = rto if rto is not None else time.monotonic() - began
                reads.append(seq)
        finally:
            consumer.close()
        if rto is None:
            raise MirrorFailed(f"the probe group read nothing on '{self.target.alias}' in {CATCH_UP_TIMEOUT_S:.0f}s")
        return rto, reads, bound

    def clean_up(self) -> list[str]:
        """Delete the probe group on both clusters (the source first, so the mirror stops checkpointing it) and
        write tombstones for its checkpoints, so no later `failover` or group sync brings it back on the target."""
        done = [self._delete_group(cluster) for cluster in (self.source, self.target)]
        try:
            done.append(self._forget_checkpoints())
        except (KafkaException, MirrorFailed) as err:
            done.append(f"could not write tombstones for the checkpoints of '{self.group}': {err}")
        done.append(f"left topic '{self.options.probe_topic}' on '{self.source.alias}' and '{self.remote}' on"
                    f" '{self.target.alias}' for the next drill")  # fmt: skip
        return done

    def _delete_group(self, cluster: ClusterConfig) -> str:
        try:
            ClusterGroups(cluster).delete(self.group)
        except KafkaException as err:
            if err.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return f"group '{self.group}' is gone from '{cluster.alias}'"
            return f"could not delete group '{self.group}' on '{cluster.alias}': {err.args[0].str()}"
        return f"deleted group '{self.group}' on '{cluster.alias}'"

    def _forget_checkpoints(self) -> str:
        """A tombstone (null value) for each of the probe group's checkpoint keys on the target."""
        tombstones = [
            Checkpoint.tombstone(group, topic, partition)
            for group, topic, partition in read_checkpoints(self.config, self.flow)
            if group == self.group
        ]
        producer = clients.producer(self.target, {"acks": "all"})
        for cp in tombstones:
            clients.produce(producer, checkpoints_topic(self.flow), cp.key(), cp.record_value())
        if producer.flush(clients.REQUEST_TIMEOUT_S):
            raise MirrorFailed(f"'{self.target.alias}' did not acknowledge them")
        return f"wrote tombstones for the {len(tombstones)} checkpoint(s) of '{self.group}' on '{self.target.alias}'"

    # -- helpers -----------------------------------------------------------------------------------------------

    def _produce(self, producer: Producer, partition: int) -> None:
        seq, now_ms = self._seq, int(time.time() * 1000)
        self._seq += 1

        def delivered(err: KafkaError | None, _: Message) -> None:
            if err is None:
                self.produce_ms[seq] = now_ms
            else:
                self.failed.append(err.str())

        value = f"{self.run_id}:{seq}".encode()
        producer.produce(self.options.probe_topic, value=value, partition=partition, timestamp=now_ms,
                         on_delivery=delivered)  # fmt: skip

    def _seq_of(self, msg: Message | None) -> int | None:
        """The seq of one of this drill's probe records; None for anything else (another drill's, an error)."""
        if msg is None or msg.error() is not None:
            return None
        run, _, seq = (msg.value() or b"").decode(errors="replace").partition(":")
        return int(seq) if run == self.run_id and seq.isdigit() else None

    def _ends(self, cluster: ClusterConfig, topic: str, partitions: list[int], missing_ok: bool = False) -> Partitions:
        """End offsets now, in one batched request; 0 for a topic not there yet when `missing_ok` (the mirror makes
        it on a Kafka target)."""
        client = clients.admin(cluster)
        if missing_ok:
            metadata = clients.list_topics(client, cluster, clients.REQUEST_TIMEOUT_S).get(topic)
            if metadata is None or metadata.error is not None:
                return dict.fromkeys(partitions, 0)
        ranges = clients.log_ranges(client, [(topic, p) for p in partitions])
        return {p: ranges[(topic, p)][1] for p in partitions}

    def _read(self, cluster: ClusterConfig, topic: str, start: Partitions, end: Partitions) -> list[int]:
        """The seqs of this drill's records in [start, end) of each partition."""
        todo = {p: e for p, e in end.items() if e > start[p]}
        if not todo:
            return []
        reader = clients.consumer(cluster)
        seqs: list[int] = []
        try:
            reader.assign([TopicPartition(topic, p, start[p]) for p in todo])
            deadline = time.monotonic() + clients.REQUEST_TIMEOUT_S
            while todo and time.monotonic() < deadline:
                msg = reader.poll(POLL_S)
                if msg is None or msg.error() is not None:
                    continue
                seq = self._seq_of(msg)
                if seq is not None:
                    seqs.append(seq)
                p, offset = msg.partition() or 0, msg.offset() or 0
                if offset + 1 >= todo.get(p, 0):
                    todo.pop(p, None)
        finally:
            reader.close()
        if todo:
            raise MirrorFailed(f"reading '{topic}' on '{cluster.alias}' did not reach the cut's end offsets")
        return seqs
