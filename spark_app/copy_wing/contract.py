"""The per-record contract every copy core obeys for one flow and target: built once here, in Python, and handed to
the Rust core (spark_app.compiled_copy) and the Java copier (spark_app.realtime.jvm) as JSON they read by name.

The Python loop (spark_app.outbox) is the reference: the contract is made from the very constants and rules it
follows (its refusal rules, error classes, provenance rule, caps, landing row), so a rule changed there reaches the
other cores with the next contract, and never has to be written again in their languages. Each of them refuses a
contract with a field it does not know or without one it needs, naming the field (tests/test_copy_contract.py holds
them to it), and hands its landings back keyed by `landing_fields`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from confluent_kafka import KafkaError

from ..config import ClusterConfig, FlowConfig
from ..outbox import TOPIC_SCOPED_ERRORS
from ..policy import MAX_OFFSET, PROVENANCE_HEADER, replication_policy, transactional, transactional_id_prefix
from ..ranges import LATENCY_BOUNDS_MS, MAX_RUNS_PER_RANGE, Landing
from ..topics import CLOCK_SLACK_MS, TargetRules
from ..transactions import TRANSACTIONAL_ID_RULE


@dataclass(frozen=True)
class TopicRefusal:
    """What one target topic refuses that a record shows before it is sent (spark_app.topics.TargetRule): a core
    that meets such a record leaves it to the Python loop, which holds its partition with the rule's own words."""

    compacted: bool  # a record without a key
    before_max_ms: int | None  # a timestamp further in the past than this (past `clock_slack_ms`)
    after_max_ms: int | None  # or further in the future


@dataclass(frozen=True)
class CopyContract:
    """What every copy core obeys for one flow and target: built once, sent to Rust and Java as JSON."""

    flow: str
    # Refusal rules, by source topic: what its target topic refuses that a record shows; a topic not here refuses
    # nothing a record shows. A timestamp is judged out of bounds only `clock_slack_ms` past them.
    refusals: Mapping[str, TopicRefusal]
    clock_slack_ms: int
    # Error classes: the delivery errors (librdkafka's codes, which are Kafka's protocol codes where positive) that
    # hold the record's partition only (spark_app.quarantine); any other fails the copy for the target.
    partition_errors: tuple[int, ...]
    # Provenance (the identity policy's loop prevention): a record without the header gets `<source alias>:<source
    # offset>` when `stamp_provenance`; one whose header says it came from `target_alias` is an echo, dropped when
    # `drop_echoes`. A value whose offset is not a non-negative 64-bit offset (up to `max_provenance_offset`) is not a
    # stamp of ours: neither an echo nor stamped again.
    provenance_header: str
    stamp_provenance: bool
    drop_echoes: bool
    source_alias: str
    target_alias: str
    max_provenance_offset: int
    # Size cap: the largest record (key, value and headers) the target topics take; None where the target does not
    # say (the profile's cap holds). A core leaves a larger record to the Python loop, which dead-letters or holds it.
    max_record_bytes: int | None
    # A slot's transactional.id: `transactional_id_rule` with `{prefix}` and `{slot}` filled in; no prefix when the
    # flow's copies write no transactions. Every attempt of a slot, in any language, must make the same id to fence
    # the ones before it.
    transactional_id_prefix: str | None
    transactional_id_rule: str
    # The landing row: replication latency is timed when the delivery report says the target kept the record's own
    # timestamp, into buckets with these upper bounds (and +Inf); at most `max_runs` runs per landing; rows by these
    # names (spark_app.ranges.Landing).
    latency_bounds_ms: tuple[float, ...]
    max_runs: int
    landing_fields: tuple[str, ...]

    @classmethod
    def of(cls, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, rules: TargetRules) -> CopyContract:
        """The contract of `flow` from `source` into `target`, whose topics take what `rules` say."""
        if (source.alias, target.alias) != (flow.source, flow.target):
            raise ValueError(
                f"flow {flow.name}: the contract's clusters are '{source.alias}' -> '{target.alias}', not the flow's"
            )
        stamps = replication_policy(flow).stamps  # stamps, and drops the target's echoes
        return cls(
            flow=flow.name,
            refusals={
                topic: TopicRefusal(rule.compacted, rule.before_max_ms, rule.after_max_ms)
                for topic, rule in sorted(rules.topics.items())
            },
            clock_slack_ms=CLOCK_SLACK_MS,
            partition_errors=tuple(sorted({KafkaError.MSG_SIZE_TOO_LARGE, *TOPIC_SCOPED_ERRORS})),
            provenance_header=PROVENANCE_HEADER,
            stamp_provenance=stamps,
            drop_echoes=stamps,
            source_alias=flow.source,
            target_alias=flow.target,
            max_provenance_offset=MAX_OFFSET,
            max_record_bytes=rules.max_message_bytes,
            transactional_id_prefix=transactional_id_prefix(flow) if transactional(flow, target.is_eventhubs) else None,
            transactional_id_rule=TRANSACTIONAL_ID_RULE,
            latency_bounds_ms=tuple(LATENCY_BOUNDS_MS),
            max_runs=MAX_RUNS_PER_RANGE,
            landing_fields=LANDING_FIELDS,
        )

    def transactional_id(self, slot: int) -> str:
        """Slot `slot`'s transactional.id (spark_app.transactions.transactional_id for the flow)."""
        if self.transactional_id_prefix is None:
            raise ValueError(f"flow {self.flow}: its copies write no transactions")
        return self.transactional_id_rule.format(prefix=self.transactional_id_prefix, slot=slot)

    def to_json(self) -> dict[str, Any]:
        """The contract by field name, as the Rust and Java cores read it (lists for tuples, as JSON has them)."""
        row = asdict(self) | {"refusals": {topic: asdict(rule) for topic, rule in self.refusals.items()}}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in row.items()}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


# The landing row's fields, by name: what `Landing.to_row` gives and the report channel carries.
LANDING_FIELDS = tuple(f.name for f in fields(Landing))
CONTRACT_FIELDS = tuple(f.name for f in fields(CopyContract))
REFUSAL_FIELDS = tuple(f.name for f in fields(TopicRefusal))
