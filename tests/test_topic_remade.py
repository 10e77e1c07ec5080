"""A source topic deleted and made again while an exactly-once flow copies it: in real time between two topic syncs,
in throughput mode in the middle of a batch (after it was planned). The copy finds the partitions gone backwards and
copies the new life. What comes after (a stop and a start, the next batch, the next run) must go on from the new
life's position: the new topic is copied once, not a second time from its log start."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, TopicPartition

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app import clients as spark_clients
from spark_app import quarantine
from spark_app.batch_log import BatchLog, Planned
from spark_app.config import parse_config
from spark_app.ledger import FlowLedger
from spark_app.mirror import Mirror
from spark_app.outbox import Cursor
from spark_app.planner import rebased, remade_within
from spark_app.policy import offset_syncs_topic
from spark_app.range_copy import RangeCopier, _end_a_later_life, _skip_committed
from spark_app.ranges import Landing, OffsetRange
from spark_app.runner import FlowRunner
from spark_app.transactions import OTHER_LIFE, PositionNote, check_transactions
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

PARTITIONS = 2


def records(tag: str, count: int, at_ms: int, first: int = 0) -> list[Record]:
    return [
        Record(i % PARTITIONS, f"k{i}".encode(), f"{tag}-{i}".encode(), timestamp_ms=at_ms + i)
        for i in range(first, first + count)
    ]


def copy_until(flow: FlowRunner, target, topic: str, count: int, within_s: float = 180.0) -> None:
    """Keep the flow going as the mirror's loop does between topic syncs (tasks that failed start again) until the
    target's read_committed reader sees `count` records of `topic`."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            read_all(target, topic, expected=count, timeout_s=5, exact=False)
            return
        except AssertionError:
            assert time.monotonic() < deadline, f"'{topic}': fewer than {count} records after {within_s:.0f} s"
            assert flow.failure() is None, flow.failure()
            flow.catch_up()


def test_exactly_once_real_time_a_topic_made_again_while_copied_is_copied_once_across_a_stop_and_start(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    topic = f"remade-live-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old, new = records("old", 1_000, now), records("new", 3_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, mode="realtime", exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)

    check_transactions(config)
    first = Mirror(spark, config)
    flow = first.flows[0]
    flow.start(flow.sync_topics(), available_now=False)
    try:
        copy_until(flow, source_cluster.client, remote, len(old))
        # Between two topic syncs: only the task sees it.
        clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
        # Left empty until the tasks found every partition gone backwards, as producers come back only later (refilled
        # past where the copy stood before it looked, the new life would be read from there on, unnoticed).
        deadline = time.monotonic() + 120
        while {r.partition for r in flow.ledger.resets} != set(range(PARTITIONS)):
            assert time.monotonic() < deadline, f"the tasks found no partition gone backwards: {flow.ledger.resets}"
            assert flow.failure() is None, flow.failure()
            flow.catch_up()
            time.sleep(0.5)
        produce(plaintext_cluster.client, topic, new)
        copy_until(flow, source_cluster.client, remote, len(old) + len(new))
    finally:
        flow.stop()  # the stop a SIGTERM makes: the tasks flush and report, the ledger files it
    assert [r.previous for r in flow.ledger.resets] == [500] * PARTITIONS, flow.ledger.resets

    check_transactions(config)
    again = Mirror(spark, config)
    again.run_available_now()
    assert again.flows[0].ledger.resets == [], "the new life was taken for the old one again"
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)


def test_real_time_a_topic_made_again_and_refilled_past_where_the_copy_stood_before_it_looked_loses_nothing(
    spark, plaintext_cluster, source_cluster, tmp_path, unique
):
    """Refilled at once, the new life may be past where a task stood before the task looks again: its consumer then
    reads on from there, and sees nothing go backwards. The flow's runner finds the topic's new id between topic
    syncs and starts the copy again, the new life from its log start: nothing of it is left out (copied twice where
    the task had read it unnoticed)."""
    topic = f"remade-unseen-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old, new = records("old", 1_000, now), records("new", 3_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, mode="realtime", exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)

    check_transactions(config)
    flow = Mirror(spark, config).flows[0]
    flow.start(flow.sync_topics(), available_now=False)
    try:
        copy_until(flow, source_cluster.client, remote, len(old))
        clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
        produce(plaintext_cluster.client, topic, new)  # at once, past where the tasks stood
        wanted = {r.value for r in new}
        deadline = time.monotonic() + 180
        while not wanted <= {r.value for r in read_all(source_cluster.client, remote, expected=1, exact=False)}:
            assert time.monotonic() < deadline, "records of the new life never reached the target"
            assert flow.failure() is None, flow.failure()
            flow.catch_up()  # as the mirror's loop does between topic syncs
            time.sleep(0.5)
    finally:
        flow.stop()
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    values = [r.value for r in got]
    assert all(values.count(r.value) == 1 for r in old), "an old record copied twice"


def landed_uncommitted(target, topic: str, prefix: bytes) -> int:
    """How many records of `topic` whose value starts with `prefix` the target holds, committed or not."""
    reader = clients.consumer(target, f"peek-{time.monotonic_ns()}", {
        "isolation.level": "read_uncommitted", "enable.partition.eof": "true", "auto.offset.reset": "earliest",
    })  # fmt: skip
    reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    count, at_eof = 0, set()
    try:
        while at_eof != set(range(PARTITIONS)):
            msg = reader.poll(5)
            assert msg is not None, f"'{topic}': no end of partition within 5 s"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                at_eof.add(msg.partition())
            elif (msg.value() or b"").startswith(prefix):
                count += 1
    finally:
        reader.close()
    return count


class RemadeAfterPlanning:
    """The source topic made again right after the first batch is planned (in its old life), with `new` of the new
    life in it: fewer records than the old life's offsets the batch reads, so its copy finds them gone backwards."""

    def __init__(self, source, topic: str, new: list[Record]) -> None:
        self.source, self.topic, self.new = source, topic, new
        self.made = False

    def hook(self, monkeypatch: pytest.MonkeyPatch) -> None:
        plan = BatchLog.plan

        def plan_then_make_the_topic_again(log: BatchLog, batch: int, end) -> None:
            plan(log, batch, end)
            if not self.made:
                self.made = True
                clients.remake_topic(self.source.admin, self.topic, PARTITIONS)
                produce(self.source.client, self.topic, self.new)

        monkeypatch.setattr(BatchLog, "plan", plan_then_make_the_topic_again)

    def assert_made(self) -> None:
        assert self.made, "no batch was planned"


def test_exactly_once_throughput_a_topic_made_again_in_the_middle_of_a_batch_is_copied_once(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    """The batch is planned in the old life (offsets 1,000 to 1,500 a partition); the topic is made again before its
    copy reads, with 3,000 records a partition, so the copy finds its partitions gone backwards at 1,000 and ends them
    there (a range reads one life). The batch commits the new life's start; the next batches, planned in the new
    life, copy it from there, once."""
    topic = f"remade-batch-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old, lost = records("old", 2_000, now), records("old", 1_000, now, first=2_000)  # lost: deleted before copied
    new = records("new", 6_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)
    check_transactions(config)
    Mirror(spark, config).run_available_now()
    produce(plaintext_cluster.client, topic, lost)

    remade = RemadeAfterPlanning(plaintext_cluster, topic, new[:600])  # 300 a partition
    with monkeypatch.context() as hooked:
        remade.hook(hooked)
        check_transactions(config)
        during = Mirror(spark, config)
        during.run_available_now()
    remade.assert_made()
    produce(plaintext_cluster.client, topic, new[600:])  # the rest of the new life
    assert [(r.previous, r.restart) for r in during.flows[0].ledger.resets] == [(1_000, 0)] * PARTITIONS

    check_transactions(config)
    after = Mirror(spark, config)
    after.run_available_now()
    assert after.flows[0].ledger.resets == [], "the new life was taken for the old one again"
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)


def test_exactly_once_throughput_a_batch_that_found_a_topic_made_again_run_again_after_a_crash_copies_it_once(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    """As above, the batch planned in the old life (1,000 to 1,500 a partition) finds its partitions gone backwards
    and ends them there, and its slots commit (the new life's start, noted as a life after the planned one); then the
    driver dies before the flow files the batch. The batch runs again as planned, in the old life's offsets: it must
    end where the copy before it did, not read the new life at the old offsets, and the next batches copy the new life
    once."""
    topic = f"remade-crash-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old = records("old", 2_000, now)
    new = records("new", 6_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)
    check_transactions(config)
    Mirror(spark, config).run_available_now()
    produce(plaintext_cluster.client, topic, records("old", 1_000, now, first=2_000))  # deleted before copied

    remade = RemadeAfterPlanning(plaintext_cluster, topic, new[:600])  # 300 a partition

    def crash(*args, **kwargs) -> None:
        raise RuntimeError("the driver died after the batch's slots committed")

    with monkeypatch.context() as hooked:
        remade.hook(hooked)
        hooked.setattr(FlowLedger, "file", crash)
        check_transactions(config)
        with pytest.raises(Exception, match="driver died"):
            Mirror(spark, config).run_available_now()
    remade.assert_made()
    produce(plaintext_cluster.client, topic, new[600:])  # the rest of the new life
    on_target = landed_uncommitted(source_cluster.client, remote, b"new-")
    assert on_target == 0, f"the crashed batch wrote {on_target} records of the new life"

    check_transactions(config)
    Mirror(spark, config).run_available_now()
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)


def test_exactly_once_throughput_a_topic_made_again_while_a_batch_reads_one_of_its_partitions_is_copied_once(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    """The batch is planned in the old life with a range of partition 0 alone (offsets 1,000 to 1,500; partition 1
    has nothing new). The topic is made again before the copy reads: partition 0 goes back and ends there, partition 1
    is not read. The flow files the new life for both, partition 1 at its new log
    start, so the next run copies neither partition's new life a second time, and skips none of partition 1's
    (whose committed position, 1,000, is the old life's). The next run copies in batches of at most 1,000 records, so
    partition 1's first batch of the new life ends below 1,000: the old life's position must not be carried into its
    commit (before, it was, as a position never goes back, and the next batch skipped the new life's records up to it:
    chaos-20261207-143946, 3,915 records)."""
    topic = f"remade-one-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old = records("old", 2_000, now)
    lost = [Record(0, f"l{i}".encode(), f"lost-{i}".encode(), timestamp_ms=now + 5_000 + i) for i in range(500)]
    new = records("new", 6_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)
    check_transactions(config)
    Mirror(spark, config).run_available_now()
    produce(plaintext_cluster.client, topic, lost)  # of the old life, partition 0 alone: deleted before copied

    remade = RemadeAfterPlanning(plaintext_cluster, topic, new[:600])  # 300 a partition
    with monkeypatch.context() as hooked:
        remade.hook(hooked)
        check_transactions(config)
        during = Mirror(spark, config)
        during.run_available_now()
    remade.assert_made()
    produce(plaintext_cluster.client, topic, new[600:])  # the rest of the new life
    resets = [(r.partition, r.previous, r.restart) for r in during.flows[0].ledger.resets]
    assert resets == [(0, 1_000, 0), (1, 1_000, 0)], "partition 1 was not started over in the new life"

    raw["flows"][0]["max_records_per_trigger"] = 1_000
    check_transactions(config)
    after = Mirror(spark, parse_config(raw))
    after.run_available_now()
    assert after.flows[0].totals.batches > 2, "the new life was copied in too few batches to tell"
    assert after.flows[0].ledger.resets == [], "the new life was taken for the old one again"
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)


def test_exactly_once_throughput_a_batch_that_reads_a_new_life_past_where_it_was_planned_commits_none_of_it(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, monkeypatch
):
    """The batch is planned in the old life (offsets 1,000 to 1,500 a partition); before its copy reads, the topic is
    made again and refilled past that, to 2,000 a partition. Nothing goes backwards where the copy reads, so only the
    topic's id, asked before the commit, tells that offsets 1,000 to 1,500 are the new life's: none of them may commit
    as the old life's, or the next batch, planned in the new life, copies them again from its log start (duplicates,
    and out of order). The next run copies the whole new life, once and in order."""
    topic = f"remade-past-{unique}"
    remote = f"primary.{topic}"
    now = int(time.time() * 1000)
    old = records("old", 2_000, now)
    new = records("new", 4_000, now + 10_000)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary",
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    produce(plaintext_cluster.client, topic, old)
    check_transactions(config)
    Mirror(spark, config).run_available_now()
    produce(plaintext_cluster.client, topic, records("old", 1_000, now, first=2_000))  # deleted before copied

    plan = BatchLog.plan
    made_again: list[bool] = []

    def plan_then_make_the_topic_again_past_the_plan(log: BatchLog, batch: int, end) -> None:
        plan(log, batch, end)
        if not made_again:
            made_again.append(True)
            clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
            produce(plaintext_cluster.client, topic, new)

    with monkeypatch.context() as hooked:
        hooked.setattr(BatchLog, "plan", plan_then_make_the_topic_again_past_the_plan)
        check_transactions(config)
        Mirror(spark, config).run_available_now()
    assert made_again, "no batch was planned"
    written = landed_uncommitted(source_cluster.client, remote, b"new-")
    committed = [r for r in read_all(source_cluster.client, remote, expected=len(old), exact=False)
                 if r.value.startswith(b"new-")]  # fmt: skip
    assert committed == [], f"{len(committed)} of the new life's records ({written} written) committed as the old's"

    check_transactions(config)
    after = Mirror(spark, config)
    after.run_available_now()
    assert [(r.previous, r.restart) for r in after.flows[0].ledger.resets] == [(1_500, 0)] * PARTITIONS
    got = read_all(source_cluster.client, remote, expected=len(old) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, old + new)


def test_exactly_once_a_range_that_found_its_topic_made_again_ends_there_and_reads_no_later_life(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    """A range planned in the old life (1,000 to 1,500 a partition) meets the topic made again with 300 records a
    partition and nothing more coming. It ends where its partition went backwards, committed, not held, and copies
    nothing of the new life (the next batch, planned in it, does). Before, it copied the new life up to the old
    life's offset 1,500, waiting for it: held after 60 s of no progress here, a batch open 34 minutes in a long run
    (every other topic's copy with it), and, with the topic made again once more meanwhile, a later life read on
    unnoticed and filed under the wrong id (2,637 records lost)."""
    topic = f"remade-end-{unique}"
    remote = f"primary.{topic}"
    config = parse_config(one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path, source_alias="primary",
                                          emit_heartbeats=False, exactly_once=True))  # fmt: skip
    flow = config.flows[0]
    source, target = config.cluster(flow.source), config.cluster(flow.target)
    now = int(time.time() * 1000)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    create_topics(source_cluster.admin, {remote: PARTITIONS})
    produce(plaintext_cluster.client, topic, records("old", 3_000, now))
    old_life = spark_clients.topic_ids(spark_clients.admin(source), [topic])[topic]
    clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
    new = records("new", 600, now + 10_000)
    produce(plaintext_cluster.client, topic, new)
    copier = RangeCopier(flow, source, target, lives={topic: old_life})
    landed = copier.copy([OffsetRange(topic, p, 1_000, 1_500) for p in range(PARTITIONS)], 0)
    last = {(row.partition): row for row in landed}
    assert [(r.held_from, r.reset_from, r.end_offset) for r in last.values()] == [(-1, 1_000, 0)] * PARTITIONS
    assert read_all(source_cluster.client, remote, expected=0) == [], "a later life copied"  # read_committed


def test_at_least_once_a_range_that_went_backwards_with_its_topics_id_unchanged_reads_on_to_its_planned_stop(
    plaintext_cluster, source_cluster, unique, tmp_path
):
    """A partition's offsets can go backwards with its topic's id unchanged (a log truncated, a stale read of its
    end): here a range planned from 1,000 to 1,500 a partition finds 300 records there, and 1,200 more come. The next
    batch starts at the planned stop, so the range reads on to it (copying from the log start), not end where its
    partition went backwards, which skipped 1,500 records a partition without a word. Planned under another id (the
    topic made again since), it ends there and copies nothing: the next batch copies the new life."""
    topic = f"back-same-{unique}"
    remote = f"primary.{topic}"
    config = parse_config(one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path, source_alias="primary",
                                          emit_heartbeats=False))  # fmt: skip
    flow = config.flows[0]
    source, target = config.cluster(flow.source), config.cluster(flow.target)
    now = int(time.time() * 1000)
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    create_topics(source_cluster.admin, {remote: PARTITIONS})
    sent = records("r", 600, now)
    produce(plaintext_cluster.client, topic, sent)
    life = spark_clients.topic_ids(spark_clients.admin(source), [topic])[topic]
    ranges = [OffsetRange(topic, p, 1_000, 1_500) for p in range(PARTITIONS)]

    landed = RangeCopier(flow, source, target, lives={topic: "id-of-an-older-life"}).copy(ranges)
    assert [(r.reset_from, r.end_offset) for r in landed if r.reset_from >= 0] == [(1_000, 0)] * PARTITIONS
    assert read_all(source_cluster.client, remote, expected=0) == []

    more = records("r", 2_400, now, first=600)
    later = threading.Timer(2.0, lambda: produce(plaintext_cluster.client, topic, more))
    later.start()
    try:
        landed = RangeCopier(flow, source, target, lives={topic: life}).copy(ranges)
    finally:
        later.join()
    assert [(r.reset_from, r.first_offset, r.end_offset) for r in landed if r.reset_from >= 0] == [
        (1_000, 0, 1_500)
    ] * PARTITIONS  # fmt: skip
    assert_each_record_once_in_order(remote, read_all(source_cluster.client, remote, expected=3_000), sent + more)


A, B = "id-of-the-old-life", "id-of-the-new-life"


def test_a_start_is_rebased_on_a_topic_filed_in_its_new_life_and_a_batch_planned_in_the_old_one_is_not():
    start = Planned({"t": {"0": 1_500, "1": 1_500}, "u": {"0": 7}}, {"t": A, "u": "u-id"})
    filed = {("t", 0): 400, ("t", 1): 0, ("u", 0): 7}
    moved = rebased(start, None, {"t": B, "u": "u-id"}, filed)
    assert moved == Planned({"t": {"0": 400, "1": 0}, "u": {"0": 7}}, {"t": B, "u": "u-id"})
    # Run again as planned: in the new life it goes on from the filed positions, in the old one from the old start.
    assert rebased(start, Planned({"t": {"0": 3_000, "1": 3_000}}, {"t": B}), {"t": B}, filed) == Planned(
        {"t": {"0": 400, "1": 0}, "u": {"0": 7}}, {"t": B, "u": "u-id"}
    )
    assert rebased(start, Planned({"t": {"0": 1_700, "1": 1_700}}, {"t": A}), {"t": B}, filed) == start
    assert rebased(start, None, {"t": A}, filed) == start  # nothing filed in another life


def test_a_range_that_went_back_in_its_middle_ends_its_new_life_at_its_stop_unless_held():
    """A range copied in a later life of its partition ends at its stop: the range's, or the later life's log end it
    read first (the copy lowers the stop there, `in_a_later_life`), so its landing ends there, not where the new life
    began; one held keeps its hold, and a range that never went back is left as it is."""

    def cursor(landing: Landing, stop: int, *retired: Landing) -> Cursor:
        return Cursor(landing, 0, stop, done=True, retired=list(retired))

    whole = cursor(Landing("t", 0, 0, 0, reset_from=1_000), 1_500, Landing("t", 0, 1_000, 1_000))
    short = cursor(Landing("t", 1, 0, 0, reset_from=1_000), 300, Landing("t", 1, 1_000, 1_000))
    held = cursor(Landing("t", 2, 0, 0, reset_from=1_000), 1_500, Landing("t", 2, 1_000, 1_000))
    held.landing.hold(200)
    plain = cursor(Landing("t", 3, 10, 20), 20)
    for c in (whole, short, held, plain):
        _end_a_later_life(c)
    assert [(c.landing.first_offset, c.landing.end_offset) for c in (whole, short, held, plain)] == [
        (0, 1_500), (0, 300), (0, 0), (10, 20)
    ]  # fmt: skip


def test_a_batch_that_starts_a_life_over_and_found_the_topic_made_again_once_more_goes_on_in_that_life_when_run_again():
    """A batch planned from a new life's start (its range 0 to 300, reset from the old life's 1,000) finds the topic
    made again once more while it copies, copies that newer life from 0 to 300 and commits there, noting the life it
    left; the driver dies before filing it. Run again as planned, the range goes on from that position in the newer
    life, as a range planned in an old life does, and still files its own reset: before, it copied the newer life's
    300 records a second time (chaos-20261207-073210: 501 records copied twice, back to back)."""
    start_over = OffsetRange("t", 0, 0, 300, reset_from=1_000)
    cursors = {("t", 0): Cursor(Landing("t", 0, 300, 300, reset_from=1_000), 0, 300)}
    committed = {("t", 0): (300, PositionNote(OTHER_LIFE, left=A))}
    _skip_committed(cursors, [start_over], committed, {"t": A})
    cursor = cursors[("t", 0)]
    assert (cursor.next, cursor.done) == (300, True), "nothing of the newer life copied again"
    assert [(r.first_offset, r.end_offset, r.reset_from) for r in cursor.retired] == [(0, 0, 1_000)]
    assert (cursor.landing.first_offset, cursor.landing.end_offset) == (0, 300)
    assert cursor.landing.reset_from >= 0, "filed as a life started over, as the copy before it would have"
    other = {("t", 0): Cursor(Landing("t", 0, 300, 300, reset_from=1_000), 0, 300)}
    _skip_committed(other, [start_over], {("t", 0): (300, PositionNote(OTHER_LIFE, left=B))}, {"t": A})
    assert other[("t", 0)].next == 0, "a position that left another life says nothing of this range"


def test_a_topic_made_again_within_a_batch_starts_its_other_partitions_over_at_zero_even_where_no_log_start_answers():
    """Partition 0 went back in the copy; partition 1 had no range (its leader offline) and partition 2 ended before
    the topic was made again. Both start over at offset 0, asking no log start (one whose leader is offline would not
    answer, and the flow would take the topic as made again once more, copying partition 0's new life twice). A log
    truncated (the same id) starts nothing over; a topic whose id does not answer is left as it was."""
    start = Planned({"t": {"0": 100, "1": 100, "2": 100}, "u": {"0": 5}}, {"t": A, "u": "u-id"})
    end = Planned({"t": {"0": 150, "1": 100, "2": 120}, "u": {"0": 9}}, {"t": A, "u": "u-id"})
    landed = [Landing("t", 0, 0, 30, reset_from=100), Landing("t", 2, 100, 120), Landing("u", 0, 2, 9, reset_from=5)]
    ids, restarts = remade_within(start, end, landed, lambda topics: {"t": B, "u": "u-id"})
    assert ids == {"t": B}, "a truncated log keeps its id: it is no new life"
    assert [(r.topic, r.partition, r.first_offset, r.end_offset, r.reset_from) for r in restarts] == [
        ("t", 1, 0, 0, 100),
        ("t", 2, 0, 0, 120),
    ]
    assert remade_within(start, end, landed, lambda topics: {}) == ({}, [])


def test_exactly_once_a_topic_made_again_while_a_partition_is_held_gives_up_the_hold_and_copies_the_new_life_once(
    spark, plaintext_cluster, target_cluster, tmp_path, unique, monkeypatch
):
    """Partition 1 is held from offset 50 (a record over the Event Hubs-like target's 1 MB cap) when the topic is
    deleted and made again, then refilled past where the hold ended. The hold is of the old life: its catch-up must
    not read the new log at the old offsets (copying 50 to 200 of the new life beside the batches that copy it from
    its start), so it is given up, and the new life is copied once."""
    monkeypatch.setattr(quarantine, "RECORD_RETRY_S", 0.0)  # a held topic tries to catch up at each batch
    topic, alias = f"remade-held-{unique}", f"p{unique[-8:]}"  # its own offset syncs hub on the shared target
    remote = f"{alias}.{topic}"
    now = int(time.time() * 1000)
    big = Record(1, b"big", b"x" * 1_200_000, (), now + 50)
    old = records("old", 200, now) + [r for r in records("old", 300, now, first=200) if r.partition == 0]
    old_p1 = [r for r in old if r.partition == 1]
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS}, {"max.message.bytes": "3000000"})
    raw = one_flow_config(plaintext_cluster, target_cluster, [topic], tmp_path / "ckpt", source_alias=alias,
                          emit_heartbeats=False, exactly_once=True)  # fmt: skip
    config = parse_config(raw)
    create_topics(target_cluster.admin, {remote: PARTITIONS})  # an event hub comes from infra
    create_topics(target_cluster.admin, {offset_syncs_topic(config.flows[0]): 1}, {"cleanup.policy": "compact"})
    produce(plaintext_cluster.client, topic, [r for r in old if r.partition == 0] + old_p1[:50])
    produce(plaintext_cluster.client, topic, [big], **{"message.max.bytes": "3000000"})
    produce(plaintext_cluster.client, topic, old_p1[50:])
    check_transactions(config)
    first = Mirror(spark, config)
    first.run_available_now()
    assert first.flows[0].ledger.held == {topic: {1: 50}}, first.flows[0].ledger.held

    clients.remake_topic(plaintext_cluster.admin, topic, PARTITIONS)
    new = records("new", 800, now + 10_000)  # 400 a partition: past the old hold's end (201)
    produce(plaintext_cluster.client, topic, new)
    check_transactions(config)
    again = Mirror(spark, config)
    again.run_available_now()
    assert again.flows[0].ledger.quarantined == {}, again.flows[0].ledger.quarantined

    kept = [r for r in old if r.partition == 0] + old_p1[:50]  # the old life up to the hold; its rest went with it
    got = read_all(target_cluster.client, remote, expected=len(kept) + len(new), exact=False)  # read_committed
    assert_each_record_once_in_order(remote, got, kept + new)
