"""Topic ACL sync, as MirrorMaker 2's `sync.topic.acls.enabled` does it, and the copies' write block.

What is copied, per MirrorMaker 2 (its source connector's ACL sync): the source's TOPIC rules with a LITERAL
pattern whose topic the flow mirrors, each renamed by the flow's replication policy to a LITERAL rule on the copy,
with its principal, host and permission kept. An ALLOW WRITE is never copied, and an ALLOW ALL is copied as ALLOW
READ, so that only the mirror writes the copies. PREFIXED rules and other resource types are not copied.

What the mirror adds:

- a rule removed on the source is removed on the target, but only one the mirror made itself;
- the write grants it kept off the copies (the source's ALLOW WRITE and ALLOW ALL, and its DENY WRITE and DENY ALL,
  which a DENY for `User:*` would turn against the mirror's own writes) are remembered, and `failover` sets them on
  the target, which lifts the copies' write block; `failback` takes them away again.

Kafka's authorizer has no DENY that spares one principal (a DENY wins over every ALLOW), so the block is an absence:
the copies carry the mirror's own ALLOW WRITE (infra/kafka/acls.py), which means `allow.everyone.if.no.acl.found`
no longer covers them, and the sync never grants WRITE on them to anyone else until failover.

What the mirror made, and what it withholds, is kept in a compacted topic on the target, one record per rule
(`ledger_topic`): it is read back from the target alone, so `failover` works with the source gone, and it holds one
record per live rule on the flow's copies, whatever the history.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from . import clients
from .config import ClusterConfig, FlowConfig
from .policy import target_topic

log = logging.getLogger(__name__)

LEDGER_PREFIX = "mirrorkit-acls."  # `mirrorkit-` topics are never mirrored (spark_app.policy.never_mirrored)
LEDGER_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}
# How often the mirror's topic-sync loop syncs ACLs (MirrorMaker 2: every 600 s): each round is one DescribeAcls on
# each cluster and one read of the ledger.
ACL_SYNC_INTERVAL_S = 60.0
_ANY = cast(str, None)  # a filter's "any" for a name, principal or host (the client's stubs say str)
_ANY_TOPIC_RULE = AclBindingFilter(
    ResourceType.TOPIC, _ANY, ResourcePatternType.ANY, _ANY, _ANY, AclOperation.ANY, AclPermissionType.ANY
)
_WRITES = frozenset({AclOperation.WRITE, AclOperation.ALL})


def ledger_topic(flow: FlowConfig) -> str:
    """The flow's compacted record, on its target, of the topic ACLs its mirror made or withholds there."""
    return f"{LEDGER_PREFIX}{flow.source}.{flow.target}"


class Phase(enum.StrEnum):
    COPIED = "copied"  # set on the target by the sync
    WITHHELD = "withheld"  # a write grant kept off the copy until failover
    LIFTED = "lifted"  # a withheld grant that failover set; failback takes it away


@dataclass(frozen=True, order=True)
class Rule:
    """One topic ACL on the target, on a copy's literal name."""

    topic: str
    principal: str
    host: str
    operation: str  # AclOperation's name: READ, WRITE, ALL, ...
    permission: str  # ALLOW or DENY

    @classmethod
    def of(cls, binding: AclBinding, topic: str | None = None, operation: AclOperation | None = None) -> Rule:
        op = cast(AclOperation, operation or binding.operation)
        permission = cast(AclPermissionType, binding.permission_type)
        return cls(topic or binding.name, binding.principal, binding.host, op.name, permission.name)

    def binding(self) -> AclBinding:
        return AclBinding(
            ResourceType.TOPIC, self.topic, ResourcePatternType.LITERAL, self.principal, self.host,
            AclOperation[self.operation], AclPermissionType[self.permission],
        )  # fmt: skip

    def matching(self) -> AclBindingFilter:
        return AclBindingFilter(
            ResourceType.TOPIC, self.topic, ResourcePatternType.LITERAL, self.principal, self.host,
            AclOperation[self.operation], AclPermissionType[self.permission],
        )  # fmt: skip

    @property
    def key(self) -> bytes:
        return json.dumps([self.topic, self.principal, self.host, self.operation, self.permission]).encode()

    @classmethod
    def from_key(cls, key: bytes) -> Rule:
        return cls(*json.loads(key))

    def __str__(self) -> str:
        return f"{self.permission} {self.operation} for {self.principal} from {self.host} on topic '{self.topic}'"


def target_rules(flow: FlowConfig, binding: AclBinding) -> list[tuple[Rule, Phase]]:
    """What one source rule on a mirrored topic becomes on the target: copied now, withheld until failover, or
    both (an ALLOW ALL: READ now, ALL at failover)."""
    copy = target_topic(flow, binding.name)
    op, allow = binding.operation, binding.permission_type is AclPermissionType.ALLOW
    if allow and op is AclOperation.ALL:
        return [(Rule.of(binding, copy, AclOperation.READ), Phase.COPIED), (Rule.of(binding, copy), Phase.WITHHELD)]
    if op in _WRITES:
        return [(Rule.of(binding, copy), Phase.WITHHELD)]
    return [(Rule.of(binding, copy), Phase.COPIED)]


@dataclass(frozen=True)
class Steps:
    """One round's changes on the target: ACLs to create and delete, ledger records to write (None: forget)."""

    create: list[Rule] = field(default_factory=list)
    delete: list[Rule] = field(default_factory=list)
    record: dict[Rule, Phase | None] = field(default_factory=dict)


def plan(wanted: dict[Rule, Phase], ledger: dict[Rule, Phase], existing: set[Rule]) -> Steps:
    """The round that brings the target to `wanted`, given what the mirror made (`ledger`) and what is there.

    A copied rule the target already has and the mirror did not make is someone else's: left alone, never recorded,
    so never removed. A grant failover lifted stays lifted while the source still has it; `failback` restores the
    block, not the sync."""
    steps = Steps()
    for rule, phase in sorted(wanted.items()):
        had = ledger.get(rule)
        if phase is Phase.COPIED:
            if had is Phase.COPIED:
                if rule not in existing:
                    steps.create.append(rule)  # removed by hand on the target: the sync puts it back, as MM2 does
            elif rule not in existing:
                steps.create.append(rule)
                steps.record[rule] = Phase.COPIED
        elif had is None:
            steps.record[rule] = Phase.WITHHELD
    for rule, had in sorted(ledger.items()):
        if rule in wanted:
            continue
        if had in (Phase.COPIED, Phase.LIFTED) and rule in existing:
            steps.delete.append(rule)
        steps.record[rule] = None
    return steps


class AclSync:
    """One flow's topic ACL sync, run from its topic-sync loop (spark_app.topics)."""

    def __init__(self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig) -> None:
        self.flow, self.source, self.target = flow, source, target
        self._source_admin = clients.admin(source)
        self._target_admin = clients.admin(target)
        self._due = 0.0
        self._said: str | None = None

    def sync_if_due(self, topics: Iterable[str]) -> Steps | None:
        """A round, when ACL_SYNC_INTERVAL_S has passed since the last; a failure is logged and the copy goes on,
        as topic ACLs never stop records."""
        if time.monotonic() < self._due:
            return None
        self._due = time.monotonic() + ACL_SYNC_INTERVAL_S
        try:
            steps = self.sync(topics)
        except KafkaException as err:
            self._say(logging.ERROR, f"topic ACLs not synced this round: {err.args[0].str()}")
            return None
        self._said = None
        return steps

    def sync(self, topics: Iterable[str]) -> Steps | None:
        """One round for these source topics; None when the source has no authorizer (nothing to copy)."""
        try:
            found = _describe(self._source_admin)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.SECURITY_DISABLED:
                raise
            self._say(logging.WARNING, f"'{self.source.alias}' has no ACL authorizer; no topic ACLs to sync")
            return None
        selected = set(topics)
        wanted: dict[Rule, Phase] = {}
        for binding in found:
            if binding.resource_pattern_type is ResourcePatternType.LITERAL and binding.name in selected:
                wanted.update(target_rules(self.flow, binding))
        ledger = read_ledger(self.target, self.flow)
        existing = {Rule.of(b) for b in _describe(self._target_admin) if b.resource_pattern_type is _LITERAL}
        steps = plan(wanted, ledger, existing)
        _apply(self._target_admin, steps)
        write_ledger(self.target, self.flow, steps.record)
        for rule in steps.create:
            log.info("flow %s: topic ACL set on '%s': %s", self.flow.name, self.target.alias, rule)
        for rule in steps.delete:
            log.info(
                "flow %s: topic ACL removed on '%s', gone on the source: %s", self.flow.name, self.target.alias, rule
            )
        return steps

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            log.log(level, "flow %s: %s", self.flow.name, message)
            self._said = message


_LITERAL = ResourcePatternType.LITERAL


def _describe(admin: AdminClient) -> list[AclBinding]:
    found: list[AclBinding] = admin.describe_acls(_ANY_TOPIC_RULE, request_timeout=clients.REQUEST_TIMEOUT_S).result()
    return found


def _apply(admin: AdminClient, steps: Steps) -> None:
    """Create and delete the round's ACLs; the first refusal is raised, after every request was answered."""
    failures: list[KafkaException] = []
    if steps.create:
        for future in admin.create_acls(
            [r.binding() for r in steps.create], request_timeout=clients.REQUEST_TIMEOUT_S
        ).values():
            try:
                future.result()
            except KafkaException as err:
                failures.append(err)
    if steps.delete:
        for future in admin.delete_acls(
            [r.matching() for r in steps.delete], request_timeout=clients.REQUEST_TIMEOUT_S
        ).values():
            try:
                future.result()
            except KafkaException as err:
                failures.append(err)
    if failures:
        raise failures[0]


def read_ledger(target: ClusterConfig, flow: FlowConfig) -> dict[Rule, Phase]:
    """What the flow's mirror made or withholds on its target; {} when it never synced ACLs there."""
    latest = clients.read_latest(target, ledger_topic(flow))
    return {Rule.from_key(key): Phase(json.loads(msg.value() or b"{}")["phase"]) for key, msg in latest.items()}


def write_ledger(target: ClusterConfig, flow: FlowConfig, records: dict[Rule, Phase | None]) -> None:
    """File these rules' phases (None: a tombstone) in the flow's ledger on its target, making it the first time."""
    if not records:
        return
    topic = ledger_topic(flow)
    admin = clients.admin(target)
    created = admin.create_topics([NewTopic(topic, 1, config=LEDGER_CONFIG)], request_timeout=clients.REQUEST_TIMEOUT_S)
    try:
        created[topic].result()
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    producer = clients.producer(target, {"acks": "all", "enable.idempotence": True})
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for rule, phase in sorted(records.items()):
        value = None if phase is None else json.dumps({"phase": phase.value}).encode()
        clients.produce(producer, topic, rule.key, value, delivered)
    left = producer.flush(clients.REQUEST_TIMEOUT_S)
    if failed or left:
        raise KafkaException(failed[0] if failed else KafkaError(KafkaError._TIMED_OUT, f"{left} ledger record(s)"))


def lift_write_block(target: ClusterConfig, flow: FlowConfig) -> list[Rule]:
    """Failover's step: set on the target every write grant the sync withheld from the flow's copies (the source's
    ALLOW WRITE and ALLOW ALL, and its DENY WRITE and DENY ALL), from the target's ledger alone. Returns them."""
    withheld = sorted(r for r, phase in read_ledger(target, flow).items() if phase is Phase.WITHHELD)
    _apply(clients.admin(target), Steps(create=withheld))
    write_ledger(target, flow, dict.fromkeys(withheld, Phase.LIFTED))
    for rule in withheld:
        log.info("flow %s: write block lifted on '%s': %s", flow.name, target.alias, rule)
    return withheld


def restore_write_block(target: ClusterConfig, flow: FlowConfig) -> list[Rule]:
    """Failback's step: take the grants failover lifted off the flow's copies again. Returns them."""
    lifted = sorted(r for r, phase in read_ledger(target, flow).items() if phase is Phase.LIFTED)
    _apply(clients.admin(target), Steps(delete=lifted))
    write_ledger(target, flow, dict.fromkeys(lifted, Phase.WITHHELD))
    for rule in lifted:
        log.info("flow %s: write block restored on '%s': %s", flow.name, target.alias, rule)
    return lifted
