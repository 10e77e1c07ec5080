"""A real-time task whose slot writes transactions, against a real broker that starts refusing one partition's
records mid-run: the refusal fails the slot's transaction, the task aborts it and copies again from its last commit,
the refused partition held from there, while the task and its other partitions go on. No Spark: the task's copy loop
runs in a thread, with a stand-in for the driver's end of the report channel."""

from __future__ import annotations

import threading
import time

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from bench.testbed import clients
from bench.testbed.clients import Record
from spark_app.config import FlowConfig, TopicSelection
from spark_app.ranges import Landing
from spark_app.realtime.task import LANDED, STOP, Assignment, CopierTask, LiveCopy
from spark_app.topics import TargetRules

BATCH = 40


class Driver:
    """The driver's end of one task's channel: it keeps the task's reports and says stop when asked."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.stopping = threading.Event()

    def send(self, message: object) -> None:
        self.sent.append(message)

    def poll(self) -> bool:
        return self.stopping.is_set()

    def recv(self) -> object:
        return STOP

    def landings(self) -> list[Landing]:
        return [Landing.from_row(row) for kind, rows in self.sent if kind == LANDED for row in rows]  # type: ignore[misc]


def test_a_record_refused_inside_a_slots_transaction_aborts_it_holds_its_partition_and_the_task_goes_on(
    plaintext_cluster, unique
):
    cluster = plaintext_cluster.client
    source, target = cluster.model_copy(update={"alias": "a"}), cluster.model_copy(update={"alias": "b"})
    topic = f"refusal-{unique}"
    copy_topic = f"a.{topic}"
    clients.create_topics(source, {topic: 2})
    clients.create_topics(target, {copy_topic: 2})
    flow = FlowConfig(source="a", target="b", topics=TopicSelection(include=[topic]), checkpoint_location="/unused",
                      mode="realtime")  # fmt: skip

    def load(start: int, partitions: tuple[int, ...] = (0, 1)) -> None:  # partition 0 keyless, 1 keyed
        records = [Record(0, None, f"p0-{i}".encode()) for i in range(start, start + BATCH) if 0 in partitions]
        records += [
            Record(1, f"k{i}".encode(), f"p1-{i}".encode()) for i in range(start, start + BATCH) if 1 in partitions
        ]
        clients.produce(source, topic, records)

    # Rules that do not know the target topic will be compacted: the broker refuses, not the mirror's own check.
    task = CopierTask(flow, source, target, ("127.0.0.1", 9), b"unused", TargetRules(), 1.0)
    copy = LiveCopy(task, Assignment({(topic, 0): 0, (topic, 1): 0}, None), slot=0)
    driver, outcome = Driver(), {}

    def run() -> None:
        try:
            outcome["copied"] = copy.run(driver)  # type: ignore[arg-type]
        except Exception as err:  # noqa: BLE001 - the test's verdict
            outcome["error"] = err

    load(0)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    clients.read_all(target, copy_topic, 2 * BATCH, timeout_s=60)  # read_committed: after the slot's first commit
    entry = ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
    admin = clients.admin(target)
    for future in admin.incremental_alter_configs(
        [ConfigResource(ResourceType.TOPIC, copy_topic, incremental_configs=[entry])]
    ).values():
        future.result()
    time.sleep(1.0)  # the broker applies the new policy to the next appends
    load(BATCH, (0,))
    time.sleep(1.5)  # refused by now, well inside the slot's transaction: the records after it come to a failed one
    load(BATCH, (1,))
    try:
        copied = clients.read_all(target, copy_topic, 3 * BATCH, timeout_s=60)
    except AssertionError as err:
        raise AssertionError(f"{err}; the task: {outcome.get('error')!r}") from None
    finally:
        driver.stopping.set()
        thread.join(60)

    assert not thread.is_alive(), "the task did not stop"
    assert "error" not in outcome, f"the task failed instead of holding the refused partition: {outcome['error']!r}"
    by_partition = {p: [r.value for r in copied if r.partition == p] for p in (0, 1)}
    assert by_partition[0] == [f"p0-{i}".encode() for i in range(BATCH)], "partition 0: only what came before"
    assert by_partition[1] == [f"p1-{i}".encode() for i in range(2 * BATCH)], "partition 1: all of it, in order"
    held = [row for row in driver.landings() if row.partition == 0 and row.held_from >= 0]
    assert held and held[0].held_from == BATCH, [vars(r) for r in driver.landings()]
    assert "INVALID_RECORD" in held[0].held_error
