"""Transactions on the target against real brokers. A real-time task cut off from its driver, still reaching both
clusters, is fenced the moment its successor starts, and a read_committed reader of the target sees what the
successor promises: each record once with `exactly_once`, and at least once, never interleaved, without it. A
micro-batch that runs again after its commit (a crash before Spark's) writes nothing twice."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bench.testbed import clients
from bench.testbed.clients import Record
from bench.testbed.kafka_cluster import EVENTHUBS_USER, cluster_entry
from spark_app import clients as spark_clients
from spark_app import outbox, range_copy
from spark_app.config import FlowConfig, FlowMode, TopicSelection, parse_config
from spark_app.range_copy import RangeCopier
from spark_app.ranges import Landing, OffsetRange
from spark_app.realtime.task import LANDED, ON, OVER, STARTED, STOP, Assignment, CopierTask, LiveCopy
from spark_app.run_check import RunGone
from spark_app.topics import TargetRules
from spark_app.transactions import (
    Aborted,
    Fenced,
    PositionNote,
    SlotTransactions,
    TransactionsRefused,
    check_transactions,
    fence,
    python_slot,
)
from tests.support.assertions import assert_each_record_once_in_order

PARTITIONS = 2
COMMIT_S = 0.5


class DriverGone:
    """A report channel whose driver is gone once it said the slot's run is on, while its socket still takes what is
    sent (half open): a zombie's."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def send(self, message: Any) -> None:
        self.reports.append(message)

    def poll(self) -> bool:
        return False

    def recv(self) -> object:
        if self.reports and self.reports[-1][0] == STARTED:
            return ON
        raise AssertionError("a zombie hears nothing from its driver")


class Driver(DriverGone):
    """A live driver that says STOP once `stop` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.stop = threading.Event()

    def poll(self) -> bool:
        return self.stop.is_set()

    def recv(self) -> object:
        return ON if self.reports and self.reports[-1][0] == STARTED else STOP


def records(topic_tag: str, first: int, count: int) -> list[Record]:
    """Records i = first, first + 1, ... round the partitions, each with a value and a timestamp of its own."""
    now_ms = int(time.time() * 1000)
    return [
        Record(i % PARTITIONS, f"k{i}".encode(), f"{topic_tag}-{i}".encode(), timestamp_ms=now_ms + i)
        for i in range(first, first + count)
    ]


def a_flow(plaintext_cluster, source_cluster, unique: str, tmp_path, tag: str, partitions: int, **keys: Any):
    """A source and a target of the test's own (aliases from `unique`), a topic `<tag>-<unique>` of `partitions` on
    the source and its copy on the target, and the flow between them (`keys`: its mode, exactly_once)."""
    source = plaintext_cluster.client.model_copy(update={"alias": f"on{unique[-6:]}"})
    target = source_cluster.client.model_copy(update={"alias": f"dr{unique[-6:]}"})
    topic = f"{tag}-{unique}"
    flow = FlowConfig(source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]),
                      checkpoint_location=str(tmp_path), **keys)  # fmt: skip
    copy_topic = f"{source.alias}.{topic}"
    clients.create_topics(plaintext_cluster.admin, {topic: partitions})
    clients.create_topics(source_cluster.admin, {copy_topic: partitions})
    return source, target, topic, copy_topic, flow


def reached(conn: DriverGone) -> dict[int, int]:
    """Per partition, the end of the newest landing the task reported (committed, as it reports after commits)."""
    out: dict[int, int] = {}
    for kind, rows in list(conn.reports):
        for row in rows if kind == LANDED else ():
            out[row["partition"]] = max(out.get(row["partition"], 0), row["end_offset"])
    return out


def wait_until_reached(conn: DriverGone, ends: dict[int, int], within_s: float, errors: list[BaseException]) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not errors:
        if all(reached(conn).get(p, 0) >= end for p, end in ends.items()):
            return
        time.sleep(0.1)
    raise AssertionError(f"the task reported {reached(conn)}, short of {ends}, after {within_s:.0f} s: {errors}")


def in_thread(run, conn) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            run(conn)
        except BaseException as err:  # noqa: BLE001 - the test asserts on it
            errors.append(err)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("exactly_once", [True, False], ids=["exactly-once", "at-least-once"])
def test_a_real_time_task_cut_off_from_its_driver_is_fenced_when_its_successor_starts(
    exactly_once, plaintext_cluster, source_cluster, unique, tmp_path
):
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster,
        source_cluster,
        unique,
        tmp_path,
        "zombie",
        PARTITIONS,
        mode=FlowMode.REALTIME,
        exactly_once=exactly_once,
        exactly_once_commit_interval_s=COMMIT_S,
    )
    first = records(topic, 0, 2_000)
    clients.produce(source, topic, first)
    task = CopierTask(flow, source, target, ("127.0.0.1", 9), b"unused", TargetRules())
    starts = {(topic, p): 0 for p in range(PARTITIONS)}

    zombie_conn = DriverGone()
    zombie, zombie_errors = in_thread(LiveCopy(task, Assignment(starts, None), 0).run, zombie_conn)
    wait_until_reached(zombie_conn, {p: len(first) // PARTITIONS for p in range(PARTITIONS)}, 60, zombie_errors)

    # Its driver heard none of it: the successor starts where the driver last knew, the partitions' starts.
    successor_conn = Driver()
    successor, successor_errors = in_thread(LiveCopy(task, Assignment(starts, None), 0).run, successor_conn)
    more = records(topic, len(first), 3_000)
    for i in range(0, len(more), 300):  # records keep coming while both run
        clients.produce(source, topic, more[i : i + 300])
        time.sleep(0.05)
    zombie.join(30)
    assert not zombie.is_alive(), "the zombie still writes after its successor started"
    assert zombie_errors and isinstance(zombie_errors[0], Fenced), zombie_errors

    sent = first + more
    wait_until_reached(successor_conn, {p: len(sent) // PARTITIONS for p in range(PARTITIONS)}, 60, successor_errors)
    successor_conn.stop.set()
    successor.join(60)
    assert not successor_errors, successor_errors
    got = clients.read_all(target, copy_topic, len(sent), exact=False)  # read_committed, librdkafka's default
    if exactly_once:
        assert_each_record_once_in_order(copy_topic, got, sent)
        return
    # At least once: the zombie's committed records, then the successor's whole copy from the starts; the zombie's
    # records after the successor started were aborted, so none of them comes between the successor's.
    for partition in range(PARTITIONS):
        values = [r.value for r in got if r.partition == partition]
        expected = [r.value for r in sent if r.partition == partition]
        restart = len(values) - len(expected)
        assert restart >= 0 and values[restart:] == expected, f"partition {partition}: the copies interleave"
        assert values[:restart] == expected[:restart], f"partition {partition}: the zombie's copies are not a prefix"


class RunOver(DriverGone):
    """A report channel whose driver, asked once the slot's producer started, says the run is over (`answer`), or
    is gone (None: the connection ends). A task that never asks is told to stop once it reported a commit."""

    def __init__(self, answer: str | None) -> None:
        super().__init__()
        self.answer = answer

    def poll(self) -> bool:
        return any(kind == LANDED for kind, _ in self.reports)

    def recv(self) -> object:
        if self.reports[-1][0] != STARTED:
            return STOP
        if self.answer is None:
            raise EOFError
        return self.answer


@pytest.mark.parametrize("answer", [OVER, None], ids=["its-job-ended", "its-driver-gone"])
def test_a_real_time_slot_of_a_run_that_is_over_starting_its_producer_after_the_next_runs_fence_commits_nothing(
    answer, plaintext_cluster, source_cluster, unique, tmp_path
):
    """A Python worker paused (or slow) between its assignment and its producer's start, while its run ended and the
    next run fenced every slot id: started after that fence, the producer holds the slot's newest epoch, and only the
    driver can tell it that its run is over. Its task commits nothing, and its records never show; without asking
    (as real-time slots did before) it commits its copy."""
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster,
        source_cluster,
        unique,
        tmp_path,
        "late-rt",
        PARTITIONS,
        mode=FlowMode.REALTIME,
        exactly_once=True,
        exactly_once_commit_interval_s=COMMIT_S,
    )
    clients.produce(source, topic, records(topic, 0, 200))
    fence(flow, target, {}, 0, 1)  # the next run's start
    task = CopierTask(flow, source, target, ("127.0.0.1", 9), b"unused", TargetRules())
    conn = RunOver(answer)
    with pytest.raises(RunGone, match="commits nothing"):
        LiveCopy(task, Assignment({(topic, p): 0 for p in range(PARTITIONS)}, None), 0).run(conn)
    assert [kind for kind, _ in conn.reports] == [STARTED], "it asked, once its producer started, and said no more"
    assert clients.read_all(target, copy_topic, 0) == [], "nothing of the late task shows"


def test_a_fenced_slot_leaves_as_fenced_from_a_call_that_only_hears_the_producer_is_dead(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    """librdkafka gives the cause (fenced) to the first call that hears it; every call after that, say the produce
    a copy retries at once, only hears _FATAL. The slot still leaves as `Fenced`, not as a failure of the target."""
    target = source_cluster.client.model_copy(update={"alias": f"dr{unique[-6:]}"})
    flow = FlowConfig(source="on", target=target.alias, topics=TopicSelection(include=["t"]), exactly_once=True,
                      checkpoint_location=str(tmp_path))  # fmt: skip
    topic = f"fatal-{unique}"
    clients.create_topics(source_cluster.admin, {topic: 1})
    zombie = python_slot(flow, target, {}, 0)
    zombie.begin()
    fence(flow, target, {}, 0, 1)  # its successor starts
    heard = []
    deadline = time.monotonic() + 30
    while len(heard) < 2 and time.monotonic() < deadline:  # the cause, then "fatal"
        try:
            zombie.producer.produce(topic, b"late")
            zombie.producer.poll(0.1)
        except KafkaException as err:
            heard.append(err.args[0].name())
    assert heard == ["_FENCED", "_FATAL"], heard
    with pytest.raises(Fenced, match="taken over by a newer attempt"), zombie.fenced_raises():
        zombie.producer.produce(topic, b"later")
    zombie.close()


def test_a_micro_batch_run_again_after_its_commit_writes_nothing_twice_and_the_next_goes_on_from_it(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster, source_cluster, unique, tmp_path, "replay", PARTITIONS, exactly_once=True
    )
    sent = records(topic, 0, 4_000)  # 2,000 a partition
    clients.produce(source, topic, sent)
    copier = RangeCopier(flow, source, target)
    batch = [OffsetRange(topic, p, 0, 1_500) for p in range(PARTITIONS)]

    first = copier.copy(batch, slot=0)
    replayed = copier.copy(batch, slot=1)  # the same batch again, as Spark runs it after a crash before its commit
    following = copier.copy([OffsetRange(topic, p, 1_000, 2_000) for p in range(PARTITIONS)], slot=0)

    assert [(r.first_offset, r.end_offset, r.records) for r in first] == [(0, 1_500, 1_500)] * PARTITIONS
    # Its landings still cover the batch, so the positions move on; none of its records is written again.
    assert [(r.first_offset, r.end_offset, r.records) for r in replayed] == [(0, 1_500, 0)] * PARTITIONS
    assert [(r.first_offset, r.end_offset, r.records) for r in following] == [(1_000, 2_000, 500)] * PARTITIONS
    positions = clients.committed(target, f"mirrorkit-positions.{source.alias}.{target.alias}", copy_topic, PARTITIONS)
    assert positions == dict.fromkeys(range(PARTITIONS), 2_000)
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(sent)), sent)


def test_an_exactly_once_batch_whose_range_reaches_past_what_the_source_holds_ends_holding_that_partition(
    plaintext_cluster, source_cluster, unique, tmp_path, monkeypatch
):
    """A range planned in a life of the topic that is gone (made again, and refilled with fewer records) waits for
    records that never come, its leader serving. Each transaction of the batch lasts at most TXN_OPEN_S, and the
    partition must reach the stall bound across them and be held, or the batch never ends: a long run's task
    committed an empty transaction every 10 s for its last 15 minutes, its partition's clock started anew each time."""
    monkeypatch.setattr(outbox, "TXN_OPEN_S", 0.5)
    monkeypatch.setattr(range_copy, "LEADER_CHECK_S", 0.5)
    monkeypatch.setattr(range_copy, "PARTITION_STALL_S", 3.0)
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster, source_cluster, unique, tmp_path, "short", 1, exactly_once=True
    )
    sent = [Record(0, r.key, r.value, timestamp_ms=r.timestamp_ms) for r in records(topic, 0, 50)]
    clients.produce(source, topic, sent)
    landings: list[Landing] = []
    copy = threading.Thread(
        target=lambda: landings.extend(RangeCopier(flow, source, target).copy([OffsetRange(topic, 0, 0, 80)], 0)),
        daemon=True,
    )
    copy.start()
    copy.join(60)
    assert not copy.is_alive(), "the batch still waits for records past the source's end after 60 s"
    [landing] = landings
    assert (landing.records, landing.held_from) == (50, 50), landing
    assert "no progress reading partition" in landing.held_error, landing.held_error
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(sent)), sent)


class ReadsBackOnce:
    """A consumer that, once it has read up to `at`, is sent back to the log's start in the same life (as a stale
    read of the log's end sends a copy's consumer there): what librdkafka hands over then starts again at 0."""

    def __init__(self, consumer, at: int) -> None:
        self._consumer, self._at, self.sent_back = consumer, at, False

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)

    def consume(self, most: int, wait_s: float):
        got = self._consumer.consume(most, wait_s)
        if self.sent_back or not any(m.error() is None and m.offset() >= self._at for m in got):
            return got
        self.sent_back = True
        self._consumer.seek(TopicPartition(got[0].topic(), got[0].partition(), 0))
        return [m for m in got if m.offset() < self._at]


@pytest.mark.parametrize("always", [False, True], ids=["once", "every-time"])
def test_an_exactly_once_batch_that_reads_its_partition_again_from_0_in_the_same_life_commits_it_once(
    always, plaintext_cluster, source_cluster, unique, tmp_path, monkeypatch
):
    """Offsets that go backwards read as the topic made again, and the copy goes on in the new life. A long run found
    them going back with the topic's id unchanged (its copy's consumer sent back to the log's start): the copy took
    that for a new life and committed the records it read again, 1,185 duplicates. The id asked before the commit now
    says whether a new life began; with the planned one, the transaction is aborted and copied again from the last
    commit, each record once; sent back every time, the partition holds there. The Python loop's consumer is the one
    sent back here (the compiled core hands such a partition to that loop, which decides as here)."""
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster, source_cluster, unique, tmp_path, "back", 1, exactly_once=True, copy_core="python"
    )
    sent = [Record(0, r.key, r.value, timestamp_ms=r.timestamp_ms) for r in records(topic, 0, 100)]
    clients.produce(source, topic, sent)
    life = spark_clients.topic_ids(spark_clients.admin(source), [topic])[topic]
    glitches: list[ReadsBackOnce] = []
    shared_consumer = spark_clients.shared_consumer

    def consumer_sent_back(cluster, defaults):  # the worker's one consumer, sent back once; or each time, `always`
        if always or not glitches:
            glitches.append(ReadsBackOnce(shared_consumer(cluster, defaults), at=60))
        return glitches[-1]

    monkeypatch.setattr(spark_clients, "shared_consumer", consumer_sent_back)
    (landing,) = RangeCopier(flow, source, target, lives={topic: life}).copy([OffsetRange(topic, 0, 0, 100)], 0)
    if always:  # no way to copy it once: held where the last commit left it, with why
        assert len(glitches) == 2 and (landing.end_offset, landing.held_from) == (0, 0), landing
        assert "went backwards with the topic's id unchanged" in landing.held_error
        assert clients.read_all(target, copy_topic, 0) == [], "nothing read twice, or at all, was committed"
        return
    assert glitches[0].sent_back, "the consumer was sent back once"
    assert (landing.first_offset, landing.end_offset, landing.held_from) == (0, 100, -1), landing
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(sent)), sent)


def test_a_commit_that_answered_abort_is_not_taken_for_an_older_one_at_the_same_offsets(monkeypatch):
    """The positions read back after a commit that answered abort may be an older commit's at the same offsets (the
    topic made again, its new life copied up to where the old one stood): the notes say whose they are. Without notes
    (real time), positions that did not move from the slot's last commit cannot say, and are taken as failed."""
    slot = SlotTransactions.__new__(SlotTransactions)
    key = ("t", 0)
    found = {key: (500, PositionNote("life-1"))}
    monkeypatch.setattr(slot, "committed_notes", lambda _partitions: found, raising=False)
    assert not slot.went_through({key: 500}, {key: PositionNote("life-2")}), "another life's commit"
    assert slot.went_through({key: 500}, {key: PositionNote("life-1")})
    assert not slot.went_through({key: 500}, before={key: 500}), "where the last commit left it: cannot say"
    assert slot.went_through({key: 500}, before={key: 300})
    assert not slot.went_through({key: 600}, before={key: 300}), "not these offsets"


@pytest.mark.parametrize("core", ["python", "compiled"])
def test_an_exactly_once_commit_that_went_through_though_its_end_answered_abort_is_not_copied_again(
    core, plaintext_cluster, source_cluster, unique, tmp_path, monkeypatch
):
    """A transaction's end retried after its answer was lost can be refused (INVALID_TXN_STATE) when the first went
    through, and librdkafka then says the transaction must be aborted though its records and positions are committed
    (a long run: 184 records copied twice, back to back). The slot reads its positions back: the ones it committed
    mean the transaction went through, and nothing of it is copied again."""
    source, target, topic, copy_topic, flow = a_flow(
        plaintext_cluster, source_cluster, unique, tmp_path, f"through-{core}", 1, exactly_once=True, copy_core=core
    )
    sent = [Record(0, r.key, r.value, timestamp_ms=r.timestamp_ms) for r in records(topic, 0, 200)]
    clients.produce(source, topic, sent)
    commit = SlotTransactions.commit
    lost: list[int] = []

    def commit_and_lose_the_answer(self: SlotTransactions, positions, notes=None) -> None:  # type: ignore[type-arg]
        commit(self, positions, notes)
        if not lost:
            lost.append(1)
            raise Aborted(f"flow {flow.name}: the transaction of slot 0 was aborted: INVALID_TXN_STATE (a retried end)")

    monkeypatch.setattr(SlotTransactions, "commit", commit_and_lose_the_answer)
    (landing,) = RangeCopier(flow, source, target).copy([OffsetRange(topic, 0, 0, 200)], 0)
    assert lost, "no commit answered abort"
    assert (landing.end_offset, landing.held_from) == (200, -1), landing
    assert_each_record_once_in_order(copy_topic, clients.read_all(target, copy_topic, len(sent)), sent)


def test_a_target_that_refuses_the_flows_transactional_ids_stops_the_mirror_at_start_naming_the_key_and_cluster(
    plaintext_cluster, target_cluster, unique, tmp_path
):
    """The Event Hubs-like target has an authorizer: a DENY on the flow's transactional-id prefix is what a cluster
    whose ACLs lack TransactionalId Write looks like to the mirror."""
    source_alias, target_alias = f"on{unique[-6:]}", f"eh{unique[-6:]}"
    config = parse_config({
        "clusters": [cluster_entry(plaintext_cluster, source_alias), cluster_entry(target_cluster, target_alias)],
        "flows": [{"source": source_alias, "target": target_alias, "topics": {"include": ["t"]},
                   "checkpoint_location": str(tmp_path), "exactly_once": True}],
    })  # fmt: skip
    deny = AclBinding(ResourceType.TRANSACTIONAL_ID, f"mirrorkit.{source_alias}.{target_alias}.",
                      ResourcePatternType.PREFIXED, f"User:{EVENTHUBS_USER}", "*", AclOperation.WRITE,
                      AclPermissionType.DENY)  # fmt: skip
    admin = clients.admin(target_cluster.admin)
    for future in admin.create_acls([deny]).values():
        future.result()
    try:
        with pytest.raises(TransactionsRefused) as refused:
            check_transactions(config)
    finally:
        match = AclBindingFilter(deny.restype, deny.name, deny.resource_pattern_type, deny.principal, deny.host,
                                 deny.operation, deny.permission_type)  # fmt: skip
        for future in admin.delete_acls([match]).values():
            future.result()
    message = str(refused.value)
    assert message.startswith("flows[0].exactly_once: "), message
    assert f"target '{target_alias}'" in message and "TransactionalId Write" in message, message
    assert target_cluster.secret not in message
    deadline = time.monotonic() + 30
    while True:  # the DENY gone, the flow starts (once the brokers' authorizer has heard of it)
        try:
            check_transactions(config)
            return
        except TransactionsRefused:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
