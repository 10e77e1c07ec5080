"""The Rust copy core behind both modes' copy: ranges handed to it, and its results as cursors and landings.

`copy_compiled` hands a micro-batch's open cursors to the Rust core (spark_app/copy_core, a `Copier` made by
spark_app.clients), which does what `copy_some` and the `Outbox` do per record with no Python per record. It takes
the common case only: at the first event the Python loop treats with more care (a record the target refuses or
would refuse, offsets that went back, a position outside the log, a partition that reads nothing) it stops, lets
what it sent land, and hands back every cursor as far as it got. Its delivery refusals are filed into an `Outbox`,
and the Python loop (spark_app.range_copy) goes on from there with its own consumer and producer: so each rare path
has one implementation, and a differential test holds the two cores to the same output. What the core obeys per
record comes with each copy as the flow's contract (spark_app.copy_wing.contract), JSON it reads by name; ranges go
in, and cursors, landings and refused records come back, as dicts keyed by name too.

Real-time tasks use it too, each with a copier of its own (`live_copier`), whose consumer keeps its assignment from
one copy to the next: a task copies until its next report (`copy_with`), and goes on with the Python loop for good
once the core stopped at an event. A slot in transactions (a throughput batch's, or a real-time task's) copies with a
copier of its own whose producer is the slot's transactional one (`CoreTransactions`): the slot's transactions
(spark_app.transactions.SlotTransactions) begin, commit with their positions and abort through it, at most one
transaction's worth of records per copy, and after the transaction its first event fell in, the slot goes on with
the Python loop's producer, which fences the core's. Which flows it copies, spark_app.copy_wing.choice decides (a
real-time slot in transactions copies with the Java copier on the executor's JVM, spark_app.realtime.jvm, where its
flow and clusters allow).
A cluster that logs in with a token (Entra ID, MSK IAM) gives the core its profile's callback, which it calls for
each token librdkafka asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from . import clients
from .clients import Partition
from .config import ClusterConfig, FlowConfig
from .copy_wing.contract import CopyContract
from .errors import AuthenticationFailed, DeliveryFailed
from .outbox import (
    CONSUMER_DEFAULTS,
    Cursor,
    Headers,
    Outbox,
    Refused,
    read_error,
    went_back,
)
from .policy import target_topic
from .topics import TargetRules

if TYPE_CHECKING:
    from mirrorkit_copy_core import Copier, RangeIn, RangeOut, TxnError

# A partition with records left that reads nothing this long goes to the Python loop, which looks up its leader
# (spark_app.range_copy.LEADER_CHECK_S) and holds it when the source does not serve it.
IDLE_S = 5.0
FLUSH_S = 300.0  # as long as the Python loop waits for its records in flight


def copy_compiled(
    flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, cursors: Mapping[Partition, Cursor],
    rules: TargetRules, producer_settings: Mapping[str, object], outbox: Outbox,
) -> None:  # fmt: skip
    """Copy the open cursors with the compiled core, as far as it goes. Refusals it heard are filed in `outbox` and
    settled: the partitions they hold are done. A delivery failure for the target, a refused login or a read error
    raises, as in the Python loop."""
    copier = clients.shared_copier(source, target, CONSUMER_DEFAULTS, producer_settings, IDLE_S)
    copy_with(copier, flow, source, target, cursors, rules, outbox)


def live_copier(
    source: ClusterConfig, target: ClusterConfig, consumer_settings: Mapping[str, object],
    producer_settings: Mapping[str, object],
) -> Copier:  # fmt: skip
    """A real-time task's own copier, for a flow spark_app.copy_wing.choice gives the Rust core (no partition of it
    ever counts as idle: a quiet source is normal there)."""
    return clients.copier(source, target, consumer_settings, producer_settings, None)


class CoreTransactions:
    """A copier's producer as a slot's transactions make their calls on it (spark_app.transactions.SlotTransactions),
    confluent-kafka's Producer's calls: each raises KafkaException with the KafkaError librdkafka gave, so one slot
    logic reads every error, whichever core wrote the transaction. Its producer settings carry the slot's
    transactional id."""

    def __init__(self, copier: Copier) -> None:
        self.copier = copier

    def init_transactions(self, timeout: float) -> None:
        _raise(self.copier.init_transactions(timeout))

    def begin_transaction(self) -> None:
        _raise(self.copier.begin_transaction())

    def send_offsets_to_transaction(self, positions: list[TopicPartition], group_metadata: Any, timeout: float) -> None:
        rows = [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in positions]
        _raise(self.copier.send_offsets_to_transaction(rows, bytes(group_metadata), timeout))

    def commit_transaction(self, timeout: float) -> None:
        _raise(self.copier.commit_transaction(timeout))

    def abort_transaction(self, timeout: float) -> None:
        _raise(self.copier.abort_transaction(timeout))

    def purge(self, in_queue: bool, in_flight: bool) -> None:
        self.copier.purge(in_queue, in_flight)

    def poll(self, timeout: float) -> int:
        self.copier.poll()
        return 0

    def flush(self, timeout: float) -> int:
        return self.copier.flush(timeout)


def transactional_copier(
    source: ClusterConfig, target: ClusterConfig, producer_settings: Mapping[str, object],
    consumer_settings: Mapping[str, object] = CONSUMER_DEFAULTS, idle_s: float | None = IDLE_S,
) -> CoreTransactions:  # fmt: skip
    """A slot's own copier, its producer transactional by `producer_settings` (they name the slot's id); a real-time
    slot's reads with the task's consumer settings and never counts a partition idle (`live_copier`)."""
    return CoreTransactions(clients.copier(source, target, consumer_settings, producer_settings, idle_s))


def _raise(error: TxnError) -> None:
    if error is not None:
        code, reason, fatal, retriable, abort = error
        raise KafkaException(KafkaError(code, reason, fatal=fatal, retriable=retriable, txn_requires_abort=abort))


def copy_with(
    copier: Copier, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, cursors: Mapping[Partition, Cursor],
    rules: TargetRules, outbox: Outbox, until_s: float | None = None, until_bytes: int | None = None,
) -> tuple[int, bool]:  # fmt: skip
    """Copy the open cursors with `copier` as `copy_compiled` does, for at most `until_s` (None: until they are
    done) and `until_bytes` read: how many records it passed on, and whether it stopped at an event the Python loop
    goes on from."""
    contract = CopyContract.of(flow, source, target, rules)
    keys = [key for key, c in cursors.items() if not c.done]
    ranges: list[RangeIn] = [
        {"topic": t, "partition": p, "target": target_topic(flow, t), "next": cursors[t, p].next,
         "stop": _stop(cursors[t, p])}
        for t, p in keys
    ]  # fmt: skip
    copied = copier.copy(contract.dumps(), ranges, FLUSH_S, until_s, until_bytes)
    taken = 0
    for key, out in zip(keys, copied["ranges"], strict=True):
        taken += out["landing"]["records"] + out["landing"]["dropped"]  # records sent and echoes dropped
        _file(cursors[key], out, contract)
    for r in copied["refused"]:
        source_topic, partition = keys[r["range"]]
        headers: Headers | None = None if r["headers"] is None else [(k, v) for k, v in r["headers"]]
        record = Refused(source_topic, partition, r["offset"], r["key"], r["value"], headers, r["timestamp"])
        outbox.refused(KafkaError(r["code"]), record, f"{target_topic(flow, source_topic)}[{partition}]")
    stopped, undelivered = copied["stopped"], copied["undelivered"]
    kind, index, offset, detail = stopped["kind"], stopped["range"], stopped["offset"], stopped["detail"]
    if copier.fatal():
        clients.discard_copier(copier)
    if kind == "auth_source":
        raise AuthenticationFailed(source)
    if kind == "auth_target":  # what did not land, for that reason
        raise AuthenticationFailed(target)
    if undelivered:
        raise DeliveryFailed(f"flow {flow.name}: {undelivered} undelivered (compiled core)")
    outbox.raise_failures()
    if kind == "read_error":
        where = keys[index] if index >= 0 else ("?", -1)
        raise DeliveryFailed(read_error(flow, where, detail))
    if kind == "went_back":
        went_back(cursors, keys[index], offset, outbox)
        cursors[keys[index]].next = offset  # the Python loop reads it again, under the landing that says so
    for held in outbox.settle():
        if held in cursors:
            cursors[held].done = True
    return taken, bool(kind or copied["refused"])


def _stop(cursor: Cursor) -> int:
    return cursor.stop if cursor.stop is not None else 2**63 - 1


def _file(cursor: Cursor, out: RangeOut, contract: CopyContract) -> None:
    """What the core did to one cursor, and what landed, into the cursor and its landing (fresh from the planner's
    range: the core is the first to write it), field by field by the landing's names."""
    landed = out["landing"]
    if unknown := set(landed) - set(contract.landing_fields):
        raise DeliveryFailed(f"flow {contract.flow}: the compiled core handed back landing fields {sorted(unknown)}")
    landing = cursor.landing
    if out["seen"] and not cursor.seen:
        cursor.seen = True
        landing.first_offset = landed["first_offset"]
    cursor.next, cursor.done = out["next"], out["done"]
    landing.records += landed["records"]
    landing.bytes += landed["bytes"]
    landing.dropped += landed["dropped"]
    landing.last_offset = max(landing.last_offset, landed["last_offset"])
    if landed["last_target_offset"] >= 0:
        landing.last_target_offset = landed["last_target_offset"]
    landing.runs.extend(landed["runs"])
    landing.echoes.extend(landed["echoes"])
    landing.latency_counts = [a + b for a, b in zip(landing.latency_counts, landed["latency_counts"], strict=True)]
    landing.latency_sum_ms += landed["latency_sum_ms"]
