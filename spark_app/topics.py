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
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec, ResourceType

from . import clients
from .clients import Partition, PartitionOffsets
from .config import ClusterConfig, FlowConfig
from .policy import should_mirror, target_topic
from .topic_acls import AclSync

log = logging.getLogger(__name__)

# The configs MirrorMaker 2 users rely on to make a DR copy behave like its source.
COPIED_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes", "min.compaction.lag.ms")
# The target's configs that say which records it refuses before they are sent (spark_app.outbox.TargetRule).
JUDGED_CONFIGS = ("message.timestamp.type", "message.timestamp.before.max.ms", "message.timestamp.after.max.ms")
CONFIGS_SETTLE_S = 10.0  # how long a topic may be listed but not yet described (just made) before it is an error


# A timestamp is judged out of a target topic's bounds only this far past them: the broker's clock, not the mirror's,
# decides, and a record near the bound is sent and left to the broker.
CLOCK_SLACK_MS = 60_000


@dataclass(frozen=True)
class TargetRule:
    """What one target topic refuses that a record shows before it is sent.

    The broker refuses such a record with its whole produce batch (INVALID_RECORD, INVALID_TIMESTAMP), while later
    batches of the partition, already on their way, land: judged here, the partition holds at the record and nothing
    after it is written first.
    """

    compacted: bool = False  # a record without a key
    before_max_ms: int | None = None  # a create-time timestamp further in the past than this
    after_max_ms: int | None = None  # or further in the future

    @classmethod
    def of(cls, configs: Mapping[str, str]) -> TargetRule | None:
        """From the target topic's configs; None when it refuses nothing a record shows."""
        log_append = configs.get("message.timestamp.type") == "LogAppendTime"  # the broker stamps its own time

        def bound(key: str) -> int | None:
            value = int(configs.get(key, str(_NO_BOUND)))
            return None if log_append or value >= _NO_BOUND else value

        rule = cls(
            "compact" in configs.get("cleanup.policy", ""),
            bound("message.timestamp.before.max.ms"),
            bound("message.timestamp.after.max.ms"),
        )
        return rule if rule != cls() else None

    def refusal(self, key: bytes | None, timestamp_ms: int) -> str | None:
        """Why the target topic would refuse this record, or None."""
        if self.compacted and key is None:
            return "it has no key and the target topic is compacted (INVALID_RECORD)"
        if self.before_max_ms is None and self.after_max_ms is None:
            return None
        skew = time.time() * 1000 - timestamp_ms
        if self.before_max_ms is not None and skew > self.before_max_ms + CLOCK_SLACK_MS:
            return f"its timestamp {timestamp_ms} is past the target topic's message.timestamp.before.max.ms"
        if self.after_max_ms is not None and -skew > self.after_max_ms + CLOCK_SLACK_MS:
            return f"its timestamp {timestamp_ms} is past the target topic's message.timestamp.after.max.ms"
        return None


_NO_BOUND = 2**63 - 1  # Kafka's "no bound" for the timestamp configs


@dataclass(frozen=True)
class TargetRules:
    """What the flow's target topics take, as topic sync found them (picklable, for the tasks)."""

    # The smallest `max.message.bytes` of the target topics, None where the target does not say (Event Hubs: the
    # profile's cap holds). The producer never builds a larger request, so the broker refuses a record only when it
    # alone is too large, never a batch of records that fit.
    max_message_bytes: int | None = None
    topics: Mapping[str, TargetRule] = field(default_factory=dict)  # by source topic, where one refuses something


@dataclass(frozen=True)
class TopicPlan:
    """The topics a flow mirrors now: source name -> partition count, and the quarantined ones with reasons.

    `wanted` is every source topic the flow selects (mirrored or quarantined), with its partition count.
    """

    mirrored: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, str] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)
    rules: TargetRules = field(default_factory=TargetRules)  # what the mirrored topics' targets take


class TopicSync:
    """One flow's topic sync, from its source cluster to its target cluster."""

    def __init__(self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig) -> None:
        self.flow = flow
        self.source = source
        self.target = target
        self._source_admin = clients.admin(source)
        self._target_admin = clients.admin(target)
        self.acls = AclSync(flow, source, target) if flow.sync_topic_acls else None  # spark_app.topic_acls

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
        if plan.mirrored:
            plan = dataclasses.replace(plan, rules=self._rules(list(plan.mirrored)))
        if self.acls is not None:
            self.acls.sync_if_due(wanted)
        return plan

    def _rules(self, sources: list[str]) -> TargetRules:
        """What the target topics of these source topics take: the smallest record cap, and per topic what it
        refuses that a record shows. An Event Hubs namespace's cap is the profile's; its hubs' configs are read
        where it answers (a compacted hub refuses records without a key), and judged by the broker alone where not."""
        targets = {target_topic(self.flow, s): s for s in sources}
        try:
            configs = self._configs(self._target_admin, list(targets), (*COPIED_CONFIGS, *JUDGED_CONFIGS))
        except KafkaException as err:
            if not self.target.is_eventhubs:
                raise
            log.info("flow %s: '%s' does not describe its hubs (%s); the broker alone judges records",
                     self.flow.name, self.target.alias, err.args[0].str())  # fmt: skip
            return TargetRules()
        caps = [int(c["max.message.bytes"]) for c in configs.values() if "max.message.bytes" in c]
        rules = {targets[name]: rule for name, c in configs.items() if (rule := TargetRule.of(c)) is not None}
        return TargetRules(None if self.target.is_eventhubs or not caps else min(caps), rules)

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
    def _configs(
        admin: AdminClient, names: list[str], keys: tuple[str, ...] = COPIED_CONFIGS
    ) -> dict[str, dict[str, str]]:
        """The configs `keys` of each topic, in one request. A topic made a moment ago can be listed before its
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
                    k: entries[k].value for k in keys if k in entries and entries[k].value is not None
                }
            names = unknown
            if names:
                time.sleep(0.5)
        return configs

    def topic_ids(self, topics: set[str]) -> dict[str, str]:
        """The source's ids of `topics` now, of those that answer."""
        return clients.topic_ids(self._source_admin, topics)

    def earliest_offsets(self, partitions: list[Partition]) -> PartitionOffsets:
        """The source's first available offset of each partition that answers (its log start, moved on by
        retention); one whose leader is offline is left out."""
        return clients.list_offsets_each(self._source_admin, partitions, OffsetSpec.earliest())[0]
