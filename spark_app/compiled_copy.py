"""The compiled copy core behind throughput mode's copy: which flows it serves, and its results as cursors and landings.

`copy_compiled` hands a micro-batch's open cursors to the Rust core (spark_app/copy_core, a `Copier` made by
spark_app.clients), which does what `copy_some` and the `Outbox` do per record with no Python per record. It takes
the common case only: at the first event the Python loop treats with more care (a record the target refuses or
would refuse, offsets that went back, a position outside the log, a partition that reads nothing) it stops, lets
what it sent land, and hands back every cursor as far as it got. Its delivery refusals are filed into an `Outbox`,
and the Python loop (spark_app.range_copy) goes on from there with its own consumer and producer: so each rare path
has one implementation, and a differential test holds the two cores to the same output.

Real-time tasks that write no transactions use it too, each with a copier of its own (`live_copier`), whose
consumer keeps its assignment from one copy to the next: a task copies until its next report (`copy_with`), and goes
on with the Python loop for good once the core stopped at an event. A flow's transactions (a slot's producer; every
real-time flow into Kafka writes in them), and a cluster whose login needs a token callback (Entra ID, MSK IAM), go
elsewhere: a real-time slot's transactions copy on the executors' JVM (spark_app.realtime.jvm) where it serves the
flow, else with confluent-kafka's clients, as a token callback's login does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError

from . import clients
from .clients import Partition
from .config import ClusterConfig, FlowConfig
from .errors import AuthenticationFailed, DeliveryFailed
from .outbox import (
    CONSUMER_DEFAULTS,
    TOPIC_SCOPED_ERRORS,
    Cursor,
    Outbox,
    Refused,
    read_error,
    went_back,
)
from .policy import PROVENANCE_HEADER, target_topic
from .ranges import LATENCY_BOUNDS_MS, MAX_RUNS_PER_RANGE
from .topics import CLOCK_SLACK_MS, TargetRules

if TYPE_CHECKING:
    from mirrorkit_copy_core import Copier, Landed

# A partition with records left that reads nothing this long goes to the Python loop, which looks up its leader
# (spark_app.range_copy.LEADER_CHECK_S) and holds it when the source does not serve it.
IDLE_S = 5.0
FLUSH_S = 300.0  # as long as the Python loop waits for its records in flight
_REFUSALS = [KafkaError.MSG_SIZE_TOO_LARGE, *TOPIC_SCOPED_ERRORS]  # delivery errors that hold a partition only


def copy_compiled(
    flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, cursors: Mapping[Partition, Cursor],
    rules: TargetRules, producer_settings: Mapping[str, object], outbox: Outbox,
) -> bool:  # fmt: skip
    """Copy the open cursors with the compiled core, as far as it goes; False when it does not serve the flow's
    clusters (nothing copied). Refusals it heard are filed in `outbox` and settled: the partitions they hold are
    done. A delivery failure for the target, a refused login or a read error raises, as in the Python loop."""
    policy = _policy(flow, source, target, IDLE_S)
    copier = clients.shared_copier(source, target, CONSUMER_DEFAULTS, producer_settings, policy)
    if copier is None:
        return False
    copy_with(copier, flow, source, target, cursors, rules, outbox)
    return True


def live_copier(
    flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, consumer_settings: Mapping[str, object],
    producer_settings: Mapping[str, object],
) -> Copier | None:  # fmt: skip
    """A real-time task's own copier, for a flow spark_app.copy_wing.choice gives the Rust core (no partition of it
    ever counts as idle: a quiet source is normal there)."""
    return clients.copier(source, target, consumer_settings, producer_settings, _policy(flow, source, target, None))


def copy_with(
    copier: Copier, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, cursors: Mapping[Partition, Cursor],
    rules: TargetRules, outbox: Outbox, until_s: float | None = None,
) -> tuple[int, bool]:  # fmt: skip
    """Copy the open cursors with `copier` as `copy_compiled` does, for at most `until_s` (None: until they are
    done): how many records it passed on, and whether it stopped at an event the Python loop goes on from."""
    keys = [key for key, c in cursors.items() if not c.done]
    ranges = [
        (key[0], key[1], target_topic(flow, key[0]), cursors[key].next, _stop(cursors[key]), _rule(rules, key[0]))
        for key in keys
    ]
    results, (kind, index, offset, detail), refused, undelivered = copier.copy(ranges, FLUSH_S, until_s)
    taken = 0
    for key, ((next_, seen, done, first_offset), landed) in zip(keys, results, strict=True):
        taken += landed[0] + landed[2]  # records sent and echoes dropped
        _file(cursors[key], next_, seen, done, first_offset, landed)
    for i, at, code, key_bytes, value, ts in refused:
        record = Refused(keys[i][0], keys[i][1], at, key_bytes, value, None, ts)
        outbox.refused(KafkaError(code), record, f"{target_topic(flow, keys[i][0])}[{keys[i][1]}]")
    if copier.fatal():
        clients.discard_copier(copier)
    if undelivered:
        raise DeliveryFailed(f"flow {flow.name}: {undelivered} undelivered (compiled core)")
    outbox.raise_failures()
    if kind == "auth_source":
        raise AuthenticationFailed(source)
    if kind == "auth_target":
        raise AuthenticationFailed(target)
    if kind == "read_error":
        where = keys[index] if index >= 0 else ("?", -1)
        raise DeliveryFailed(read_error(flow, where, detail))
    if kind == "went_back":
        went_back(cursors, keys[index], offset, outbox)
        cursors[keys[index]].next = offset  # the Python loop reads it again, under the landing that says so
    for held in outbox.settle():
        if held in cursors:
            cursors[held].done = True
    return taken, bool(kind or refused)


def _policy(flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, idle_s: float | None) -> tuple[Any, ...]:
    """The flow's per-record policy, as the core's constructor takes it after the clients' settings."""
    identity = flow.replication_policy == "identity"
    return (
        source.alias, target.alias, identity, identity and flow.provenance_header, PROVENANCE_HEADER,
        list(LATENCY_BOUNDS_MS), MAX_RUNS_PER_RANGE, idle_s, _REFUSALS,
    )  # fmt: skip


def _stop(cursor: Cursor) -> int:
    return cursor.stop if cursor.stop is not None else 2**63 - 1


def _rule(rules: TargetRules, topic: str) -> tuple[bool, int | None, int | None, int] | None:
    rule = rules.topics.get(topic)
    if rule is None:
        return None
    return rule.compacted, rule.before_max_ms, rule.after_max_ms, CLOCK_SLACK_MS


def _file(cursor: Cursor, next_: int, seen: bool, done: bool, first_offset: int, landed: Landed) -> None:
    """What the core did to one cursor, and what landed, into the cursor and its landing (fresh from the planner's
    range: the core is the first to write it)."""
    records, size, dropped, last_offset, last_target_offset, runs, echoes, latency_counts, latency_sum_ms = landed
    landing = cursor.landing
    if seen and not cursor.seen:
        cursor.seen = True
        landing.first_offset = first_offset
    cursor.next, cursor.done = next_, done
    landing.records += records
    landing.bytes += size
    landing.dropped += dropped
    landing.last_offset = max(landing.last_offset, last_offset)
    if last_target_offset >= 0:
        landing.last_target_offset = last_target_offset
    landing.runs.extend(runs)
    landing.echoes.extend(echoes)
    landing.latency_counts = [a + b for a, b in zip(landing.latency_counts, latency_counts, strict=True)]
    landing.latency_sum_ms += latency_sum_ms
