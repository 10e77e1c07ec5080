"""Topic sync: which source topics a flow mirrors, target topics that can take them, and what is held back.

On Kafka and MSK targets the mirror creates each target topic with the source's partition count and the configs
that matter, and adds partitions when the source grows. Event Hubs topics are made by infra; there the mirror only
checks them. A topic whose target cannot take it is quarantined with the reason; the other topics go on.

`FlowState` is the flow's own bookkeeping next to its Spark checkpoint: per quarantined topic the reason and, per
partition, the source offsets not yet written (`Hold`), and per partition the offset the mirror has read up to
(to tell records deleted by retention from offsets that never held a record). It is a small versioned JSON file, so
`status` can read it without a running mirror.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec, ResourceType

from .config import ClusterConfig, FlowConfig
from .policy import should_mirror, target_topic
from .profiles import librdkafka_settings

log = logging.getLogger(__name__)

# The configs MirrorMaker 2 users rely on to make a DR copy behave like its source.
COPIED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes", "min.compaction.lag.ms")
ADMIN_TIMEOUT_S = 30.0
STATE_VERSION = 1
STATE_FILE = "mirrorkit-state.json"


@dataclass(frozen=True)
class TopicPlan:
    """The topics a flow mirrors now: source name -> partition count, and the quarantined ones with reasons.

    `wanted` is every source topic the flow selects (mirrored or quarantined), with its partition count.
    """

    mirrored: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)


@dataclass
class Hold:
    """Source offsets of one partition not written yet: from `first` (the first one not written) up to `next`."""

    first: int
    next: int


@dataclass
class Quarantine:
    """A topic that stopped: why, and per partition what it still owes the target."""

    reason: str
    partitions: dict[int, Hold] = field(default_factory=dict)
    retry_at: float = 0.0  # time.monotonic() after which a catch-up is tried; not persisted, so a restart retries


@dataclass(frozen=True)
class DataLoss:
    """Records deleted at the source (by retention) before the mirror read them."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int

    @property
    def count(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass
class FlowState:
    """Quarantines and read positions of one flow, persisted in `<checkpoint_location>/mirrorkit-state.json`."""

    path: Path
    quarantined: dict[str, Quarantine] = field(default_factory=dict)
    positions: dict[tuple[str, int], int] = field(default_factory=dict)  # next source offset to read

    @classmethod
    def load(cls, checkpoint_location: str) -> FlowState:
        path = Path(checkpoint_location.removeprefix("file:")) / STATE_FILE
        if not path.exists():
            return cls(path)
        raw = json.loads(path.read_text())
        if raw.get("version") != STATE_VERSION:
            raise StateError(
                f"{path}: state version {raw.get('version')!r}, this mirror reads version {STATE_VERSION};"
                " run the mirror version that wrote it to drain its quarantines, or move the file away to accept"
                " that its held offsets are not caught up"
            )
        state = cls(path)
        for topic, q in raw["quarantined"].items():
            holds = {int(p): Hold(h["first"], h["next"]) for p, h in q["partitions"].items()}
            state.quarantined[topic] = Quarantine(q["reason"], holds)
        state.positions = {(t, int(p)): o for t, parts in raw["positions"].items() for p, o in parts.items()}
        return state

    def save(self) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one."""
        positions: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(self.positions.items()):
            positions.setdefault(topic, {})[str(partition)] = offset
        raw = {
            "version": STATE_VERSION,
            "quarantined": {
                t: {"reason": q.reason, "partitions": {str(p): vars(h) for p, h in sorted(q.partitions.items())}}
                for t, q in sorted(self.quarantined.items())
            },
            "positions": positions,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(raw, indent=1))
        os.replace(tmp, self.path)


class TopicSync:
    def __init__(self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig) -> None:
        self.flow = flow
        self.target = target
        self._source_admin = _admin(source)
        self._target_admin = _admin(target)
        self.source = source

    def source_topics(self) -> dict[str, int]:
        """Source topics this flow selects, with their partition counts."""
        metadata = self._list(self._source_admin, self.source)
        return {
            name: len(t.partitions)
            for name, t in metadata.items()
            if t.error is None and should_mirror(self.flow, name)
        }

    def sync(self) -> TopicPlan:
        wanted = self.source_topics()
        existing = {n: len(t.partitions) for n, t in self._list(self._target_admin, self.target).items()}
        plan = TopicPlan(wanted=wanted)
        to_create = [s for s in wanted if target_topic(self.flow, s) not in existing]
        created = self._create(to_create, wanted) if to_create and not self.target.is_eventhubs else {}
        for source_name, partitions in sorted(wanted.items()):
            name = target_topic(self.flow, source_name)
            if name in existing:
                reason = self._grow(name, existing[name], partitions) if existing[name] < partitions else None
            elif self.target.is_eventhubs:
                reason = f"event hub '{name}' does not exist on '{self.target.alias}'; infra must create it"
            else:
                reason = created[source_name]
            if reason is None:
                plan.mirrored[source_name] = partitions
            else:
                plan.quarantined[source_name] = reason
        for source_name, reason in plan.quarantined.items():
            log.error("flow %s: topic '%s' quarantined: %s", self.flow.name, source_name, reason)
        return plan

    def _create(self, names: list[str], partitions: dict[str, int]) -> dict[str, str | None]:
        """Create target topics like their sources; returns a failure reason per topic (None when created)."""
        configs = self._source_configs(names)
        new = [
            NewTopic(target_topic(self.flow, n), num_partitions=partitions[n], config=configs.get(n, {})) for n in names
        ]
        outcome: dict[str, str | None] = {}
        futures = self._target_admin.create_topics(new, request_timeout=ADMIN_TIMEOUT_S)
        for source_name in names:
            try:
                futures[target_topic(self.flow, source_name)].result()
                outcome[source_name] = None
                log.info("flow %s: created '%s'", self.flow.name, target_topic(self.flow, source_name))
            except KafkaException as err:
                kafka_error = err.args[0]
                if kafka_error.name() == "TOPIC_ALREADY_EXISTS":
                    outcome[source_name] = None
                else:
                    outcome[source_name] = f"cannot create target topic: {kafka_error.str()}"
        return outcome

    def _grow(self, name: str, have: int, want: int) -> str | None:
        if self.target.is_eventhubs:
            return f"event hub '{name}' has {have} partitions, the source has {want}; raise it in infra"
        try:
            self._target_admin.create_partitions([NewPartitions(name, want)])[name].result()
            log.info("flow %s: '%s' grown from %d to %d partitions", self.flow.name, name, have, want)
            return None
        except KafkaException as err:
            return f"cannot add partitions to '{name}' ({have} -> {want}): {err.args[0].str()}"

    def _source_configs(self, names: list[str]) -> dict[str, dict[str, str]]:
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
        configs: dict[str, dict[str, str]] = {}
        for resource, future in self._source_admin.describe_configs(resources).items():
            entries = future.result()
            configs[resource.name] = {
                k: entries[k].value for k in COPIED_CONFIGS if k in entries and entries[k].value is not None
            }
        return configs

    def earliest_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The source's first available offset per partition (its log start, moved on by retention)."""
        request = {TopicPartition(t, p): OffsetSpec.earliest() for t, p in partitions}
        futures = self._source_admin.list_offsets(request, request_timeout=ADMIN_TIMEOUT_S)
        return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

    @staticmethod
    def _list(admin: AdminClient, cluster: ClusterConfig, timeout_s: float = ADMIN_TIMEOUT_S):
        """Topic metadata; fails at once on bad credentials, and after `timeout_s` when nothing answers."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return admin.list_topics(timeout=min(2.0, timeout_s)).topics
            except KafkaException as err:
                admin.poll(0)  # serves error_cb, which raises on an authentication failure
                if time.monotonic() >= deadline:
                    raise ClusterUnreachable(cluster, timeout_s, err.args[0].str()) from None


def _admin(cluster: ClusterConfig) -> AdminClient:
    """An AdminClient whose bad credentials raise at once: librdkafka reports them only on error_cb."""

    def on_error(err: KafkaError) -> None:
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            raise AuthenticationFailed(cluster)

    return AdminClient(librdkafka_settings(cluster, "admin") | {"error_cb": on_error})


def check_reachable(clusters: list[ClusterConfig], timeout_s: float) -> None:
    """Before Spark starts: every cluster answers with these credentials, or a clear error naming it."""
    for cluster in clusters:
        TopicSync._list(_admin(cluster), cluster, timeout_s)


class ClusterUnreachable(RuntimeError):
    """A cause that affects every topic: the mirror stops, naming the cluster."""

    def __init__(self, cluster: ClusterConfig, waited_s: float, detail: str) -> None:
        super().__init__(
            f"cluster '{cluster.alias}' ({cluster.bootstrap_servers}) is unreachable after {waited_s:.0f}s: {detail}"
        )


class AuthenticationFailed(ClusterUnreachable):
    def __init__(self, cluster: ClusterConfig) -> None:
        RuntimeError.__init__(
            self,
            f"authentication failed for cluster '{cluster.alias}' ({cluster.bootstrap_servers}):"
            " check its username and the secret it names",
        )


class StateError(RuntimeError):
    """The flow's state file is from another mirror version."""
