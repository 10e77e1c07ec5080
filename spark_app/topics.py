"""Topic sync: which source topics a flow mirrors, and target topics that can take them.

On Kafka and MSK targets the mirror creates each target topic with the source's partition count and the configs
that matter, and adds partitions when the source grows. Event Hubs topics are made by infra; there the mirror only
checks them. A topic whose target cannot take it comes back in `TopicPlan.quarantined` with the reason
(spark_app.quarantine holds it); the other topics go on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec, ResourceType

from . import clients
from .clients import Partition, PartitionOffsets
from .config import ClusterConfig, FlowConfig
from .policy import should_mirror, target_topic

log = logging.getLogger(__name__)

# The configs MirrorMaker 2 users rely on to make a DR copy behave like its source.
COPIED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes", "min.compaction.lag.ms")
CONFIGS_SETTLE_S = 10.0  # how long a topic may be listed but not yet described (just made) before it is an error


@dataclass(frozen=True)
class TopicPlan:
    """The topics a flow mirrors now: source name -> partition count, and the quarantined ones with reasons.

    `wanted` is every source topic the flow selects (mirrored or quarantined), with its partition count.
    """

    mirrored: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)
    # The smallest `max.message.bytes` of the mirrored topics' targets, None where the target does not say (Event
    # Hubs: the profile's cap holds).
    max_message_bytes: int | None = None


class TopicSync:
    """One flow's topic sync, from its source cluster to its target cluster."""

    def __init__(self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig) -> None:
        self.flow = flow
        self.source = source
        self.target = target
        self._source_admin = clients.admin(source)
        self._target_admin = clients.admin(target)

    def source_topics(self) -> dict[str, int]:
        """Source topics this flow selects, with their partition counts."""
        metadata = clients.list_topics(self._source_admin, self.source)
        return {
            name: len(t.partitions)
            for name, t in metadata.items()
            if t.error is None and should_mirror(self.flow, name)
        }

    def sync(self) -> TopicPlan:
        wanted = self.source_topics()
        existing = {n: len(t.partitions) for n, t in clients.list_topics(self._target_admin, self.target).items()}
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
        if plan.mirrored and not self.target.is_eventhubs:
            caps = self._configs(self._target_admin, [target_topic(self.flow, s) for s in plan.mirrored])
            found = [int(c["max.message.bytes"]) for c in caps.values() if "max.message.bytes" in c]
            plan = dataclasses.replace(plan, max_message_bytes=min(found) if found else None)
        return plan

    def _create(self, names: list[str], partitions: dict[str, int]) -> dict[str, str | None]:
        """Create target topics like their sources; returns a failure reason per topic (None when created)."""
        configs = self._configs(self._source_admin, names)
        new = [
            NewTopic(target_topic(self.flow, n), num_partitions=partitions[n], config=configs.get(n, {})) for n in names
        ]
        outcome: dict[str, str | None] = {}
        futures = self._target_admin.create_topics(new, request_timeout=clients.REQUEST_TIMEOUT_S)
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

    @staticmethod
    def _configs(admin: AdminClient, names: list[str]) -> dict[str, dict[str, str]]:
        """The COPIED_CONFIGS of each topic, in one request. A topic made a moment ago can be listed before its
        configs can be described: such topics are asked again, for up to CONFIGS_SETTLE_S."""
        configs: dict[str, dict[str, str]] = {}
        deadline = time.monotonic() + CONFIGS_SETTLE_S
        while names:
            resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
            answers = admin.describe_configs(resources, request_timeout=clients.REQUEST_TIMEOUT_S)
            unknown = []
            for resource, future in answers.items():
                try:
                    entries = future.result()
                except KafkaException as err:
                    if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                        raise
                    unknown.append(resource.name)
                    continue
                configs[resource.name] = {
                    k: entries[k].value for k in COPIED_CONFIGS if k in entries and entries[k].value is not None
                }
            names = unknown
            if names:
                time.sleep(0.5)
        return configs

    def earliest_offsets(self, partitions: list[Partition]) -> PartitionOffsets:
        """The source's first available offset per partition (its log start, moved on by retention)."""
        return clients.list_offsets(self._source_admin, partitions, OffsetSpec.earliest())
