"""A real-time task whose slot writes transactions, against a real broker that refuses some records: a record the
broker refuses fails the slot's transaction, so the task aborts it and copies again from its last commit, the
refused partition held from there; a record librdkafka refuses before sending it (too large) fails nothing, and only
its partition holds. Either way the task and its other partitions go on. No Spark: the task's copy loop runs in a
thread, with a stand-in for the driver's end of the report channel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from bench.testbed import clients
from bench.testbed.clients import Record
from spark_app import clients as spark_clients
from spark_app.config import ClusterConfig, FlowConfig, TopicSelection
from spark_app.ranges import Landing
from spark_app.realtime.task import LANDED, ON, STARTED, STOP, Assignment, CopierTask, LiveCopy
from spark_app.topics import TargetRules
from tests.support.polling import wait_until

BATCH = 40


@dataclass
class Driver:
    """The driver's end of one task's channel: it keeps the task's reports and says stop when asked."""

    sent: list[object] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # what the task raised, if it did

    def send(self, message: object) -> None:
        self.sent.append(message)

    def poll(self) -> bool:
        return self.stopping.is_set()

    def recv(self) -> object:
        return ON if self.sent and self.sent[-1][0] == STARTED else STOP  # type: ignore[index]

    def held(self, partition: int) -> list[Landing]:
        rows = [Landing.from_row(row) for kind, rows in self.sent if kind == LANDED for row in rows]  # type: ignore[misc]
        return [r for r in rows if r.partition == partition and r.held_from >= 0]


@dataclass(frozen=True)
class Flow:
    source: ClusterConfig
    target: ClusterConfig
    topic: str

    @property
    def copy_topic(self) -> str:
        return f"a.{self.topic}"

    def load(self, partition: int, start: int, count: int = BATCH, size: int = 0) -> None:
        """Records `start` .. `start + count` of a partition: on partition 0 every other one keyless, starting with
        the first (so a compacted target refuses those, and the others of their batch with them); keyed on 1. `size`
        pads them."""
        clients.produce(self.source, self.topic, [
            Record(partition, f"k{i}".encode() if partition or i % 2 else None,
                   f"p{partition}-{i}".encode() + b"." * size)
            for i in range(start, start + count)
        ])  # fmt: skip

    def copied(self, expected: int, driver: Driver) -> dict[int, list[bytes]]:
        """What the target holds, read_committed (so after a commit of the slot), by partition."""
        try:
            records = clients.read_all(self.target, self.copy_topic, expected, timeout_s=60)
        except AssertionError as err:
            raise AssertionError(f"{err}; the task: {driver.error!r}") from None
        return {p: [r.value.split(b".")[0] for r in records if r.partition == p and r.value] for p in (0, 1)}


@contextmanager
def copying(
    cluster: ClusterConfig, unique: str, rules: TargetRules, *, cap: int | None = None,
    dead_letter_topic: str | None = None, exactly_once: bool = False, before: Callable[[Flow], None] | None = None,
    target: ClusterConfig | None = None,
) -> Iterator[tuple[Flow, Driver]]:  # fmt: skip
    """A two-partition topic and its target copy (with `cap` as its max.message.bytes, on the broker only), and one
    real-time task copying it, stopped on the way out; `before` loads the source before the task starts. The target
    is `cluster` too, unless `target` says how else to reach it."""
    into = (target or cluster).model_copy(update={"alias": "b"})
    flow = Flow(cluster.model_copy(update={"alias": "a"}), into, f"rf-{unique}")
    clients.create_topics(flow.source, {flow.topic: 2})
    clients.create_topics(flow.target, {flow.copy_topic: 2}, {"max.message.bytes": str(cap)} if cap else None)
    if dead_letter_topic:
        clients.create_topics(flow.target, {dead_letter_topic: 1})
    if before is not None:
        before(flow)
    config = FlowConfig(source="a", target="b", topics=TopicSelection(include=[flow.topic]),
                        checkpoint_location="/unused", mode="realtime", dead_letter_topic=dead_letter_topic,
                        exactly_once=exactly_once)  # fmt: skip
    task = CopierTask(config, flow.source, flow.target, ("127.0.0.1", 9), b"unused", rules)
    copy, driver = LiveCopy(task, Assignment({(flow.topic, 0): 0, (flow.topic, 1): 0}, None), slot=0), Driver()

    def run() -> None:
        try:
            copy.run(driver)  # type: ignore[arg-type]
        except BaseException as err:  # noqa: BLE001 - the test's verdict
            driver.error = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield flow, driver
    finally:
        driver.stopping.set()
        thread.join(60)
    assert not thread.is_alive(), "the task did not stop"
    assert driver.error is None, f"the task failed instead of holding the refused partition: {driver.error!r}"


def test_a_record_the_broker_refuses_aborts_the_slots_transaction_holds_its_partition_and_the_task_goes_on(
    plaintext_cluster, unique
):
    # Rules that do not know the target topic will be compacted: the broker refuses, not the mirror's own check.
    with copying(plaintext_cluster.client, unique, TargetRules()) as (flow, driver):
        flow.load(0, 0)
        flow.load(1, 0)
        flow.copied(2 * BATCH, driver)
        entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
        admin = clients.admin(flow.target)  # held until its answer: a dropped client fails it
        topic = ConfigResource(ResourceType.TOPIC, flow.copy_topic, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([topic]).values():
            future.result()
        wait_until(
            lambda: spark_clients.topic_configs(admin, flow.copy_topic).get("cleanup.policy") == "compact",
            f"the broker to describe '{flow.copy_topic}' as compacted",
        )
        flow.load(0, BATCH)  # refused now
        # The refusal aborted the slot's transaction, and the next commit reports partition 0 held: the records that
        # come next go to a transaction of their own.
        wait_until(lambda: driver.held(0) or driver.error, "partition 0 reported held", timeout_s=60)
        flow.load(1, BATCH)
        copied = flow.copied(3 * BATCH, driver)
    assert copied[0] == [f"p0-{i}".encode() for i in range(BATCH)], "partition 0: only what came before"
    assert copied[1] == [f"p1-{i}".encode() for i in range(2 * BATCH)], "partition 1: all of it, in order"
    held = driver.held(0)
    assert held and held[0].held_from == BATCH and "INVALID_RECORD" in held[0].held_error, held


def test_a_record_too_large_to_send_holds_only_its_partition_and_the_slot_still_commits(plaintext_cluster, unique):
    """librdkafka refuses it at produce (over the target's cap), so the open transaction has not failed: aborting it
    would only meet the same record again, for ever."""
    with copying(plaintext_cluster.client, unique, TargetRules(max_message_bytes=10_000)) as (flow, driver):
        flow.load(0, 0, 20)
        flow.load(0, 20, 1, size=20_000)
        flow.load(0, 21, 20)
        flow.load(1, 0)
        copied = flow.copied(20 + BATCH, driver)
    assert copied[0] == [f"p0-{i}".encode() for i in range(20)], "partition 0: up to the record too large"
    assert copied[1] == [f"p1-{i}".encode() for i in range(BATCH)]
    held = driver.held(0)
    assert held and held[0].held_from == 20 and held[0].refused_bytes > 20_000, held


CAP = 10_000  # the target topic's max.message.bytes, set on the broker: the mirror's rules do not know it
BIG = 9_990  # alone under the cap by its value, over it with the batch's and the record's overhead


def one_too_big(flow: Flow) -> None:
    """Partition 0: 20 records, one the broker refuses at 20, 20 more; partition 1: BATCH records. One produce, before
    the task starts: the refused record shares its transaction (and its producer batch) with good ones."""
    flow.load(0, 0, 20)
    flow.load(0, 20, 1, size=BIG)
    flow.load(0, 21, 20)
    flow.load(1, 0)


@pytest.mark.parametrize("exactly_once", [False, True])
def test_a_record_the_broker_refuses_for_size_in_a_transaction_goes_to_the_dead_letter_topic_and_the_slot_goes_on(
    exactly_once, plaintext_cluster, unique
):
    dlq = f"dlq-{unique}"
    with copying(plaintext_cluster.client, unique, TargetRules(), cap=CAP, dead_letter_topic=dlq,
                 exactly_once=exactly_once, before=one_too_big) as (flow, driver):  # fmt: skip
        copied = flow.copied(40 + BATCH, driver)
        (letter,) = clients.read_all(flow.target, dlq, expected=1)
        flow.load(1, BATCH)  # the slot goes on
        copied = flow.copied(40 + 2 * BATCH, driver)
    assert copied[0] == [f"p0-{i}".encode() for i in range(41) if i != 20], "partition 0: all but the refused one"
    assert copied[1] == [f"p1-{i}".encode() for i in range(2 * BATCH)]
    assert dict(letter.headers)["mirrorkit.dlq.offset"] == b"20" and letter.value is None
    assert not driver.held(0) and not driver.held(1)


def test_a_record_the_broker_refuses_for_size_in_a_transaction_holds_from_itself_with_its_size(
    plaintext_cluster, unique
):
    """Not from the slot's last commit, and not as a partition missing on the target: the records before it land."""
    with copying(plaintext_cluster.client, unique, TargetRules(), cap=CAP, before=one_too_big) as (flow, driver):
        copied = flow.copied(20 + BATCH, driver)
        wait_until(lambda: driver.held(0) or driver.error, "partition 0 reported held", timeout_s=60)
    assert copied[0] == [f"p0-{i}".encode() for i in range(20)], "partition 0: up to the refused record"
    assert copied[1] == [f"p1-{i}".encode() for i in range(BATCH)]
    held = driver.held(0)
    assert held and held[0].held_from == 20 and held[0].refused_bytes >= BIG, held
