"""Real-time mode's bookkeeping without brokers: what a task reports, and how a job splits partitions into tasks."""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import cast

from spark_app.config import ClusterConfig, FlowConfig, TopicSelection, parse_config
from spark_app.ledger import LedgerState
from spark_app.metrics import MirrorMetrics
from spark_app.ranges import DataLoss, Landing
from spark_app.realtime import flow as realtime_flow
from spark_app.realtime.flow import RealtimeRunner
from spark_app.realtime.task import Assignment, CopierTask, LiveCopy
from spark_app.storage import checkpoint_files
from spark_app.topics import TargetRules, TopicPlan

SOURCE = ClusterConfig(alias="a", bootstrap_servers="127.0.0.1:9", profile="kafka")
TARGET = ClusterConfig(alias="b", bootstrap_servers="127.0.0.1:9", profile="kafka")
FLOW = FlowConfig(source="a", target="b", topics=TopicSelection(include=["t"]), checkpoint_location="/tmp/x")


def live_copy(starts: dict[tuple[str, int], int]) -> LiveCopy:
    task = CopierTask(FLOW, SOURCE, TARGET, ("127.0.0.1", 9), b"key", TargetRules())
    return LiveCopy(task, Assignment(starts, None), 0)


def outbox(in_flight: dict[tuple[str, int], list[int]]) -> SimpleNamespace:
    return SimpleNamespace(in_flight={k: collections.deque(v) for k, v in in_flight.items()})


def test_a_report_ends_each_partition_at_its_first_record_not_yet_delivered_and_then_only_what_changed():
    copy = live_copy({("t", 0): 10, ("t", 1): 20, ("t", 2): 30})
    copy.cursors[("t", 0)].next = 15  # read 10..14, 12..14 still in flight
    copy.cursors[("t", 1)].next = 25  # read and delivered 20..24
    first = {
        (r.topic, r.partition): (r.first_offset, r.end_offset) for r in copy._report(outbox({("t", 0): [12, 13, 14]}))
    }
    # Every partition once, so an idle one's start is saved too; none past a record that may not have landed.
    assert first == {("t", 0): (10, 12), ("t", 1): (20, 25), ("t", 2): (30, 30)}
    # Then only partitions that moved: t[0]'s records landed; t[1] and t[2] stood still.
    again = copy._report(outbox({("t", 0): []}))
    assert [(r.partition, r.first_offset, r.end_offset) for r in again] == [(0, 12, 15)]
    assert copy._report(outbox({})) == []


def test_a_held_partition_reports_its_hold_once_and_its_end_never_passes_the_held_record():
    copy = live_copy({("t", 0): 0})
    part = copy.cursors[("t", 0)]
    part.next = 8
    part.landing.hold(5, size=2_000_000)  # refused for size at 5 while 6 and 7 were read
    (row,) = copy._report(outbox({("t", 0): [5, 6, 7]}))
    assert (row.end_offset, row.held_from, row.held_until, row.refused_bytes) == (5, 5, 5, 2_000_000)
    assert copy._report(outbox({("t", 0): []})) == []  # the hold is reported once; nothing more moves


def test_a_held_partition_goes_on_from_its_first_held_offset_before_and_after_its_report():
    """What a transaction commits as a held partition's position: never past the held record, or an exactly-once
    restart would skip it (records read past it were sent before the hold, or skipped after it)."""
    copy = live_copy({("t", 0): 0, ("t", 1): 0})
    copy.cursors[("t", 0)].next = 8
    copy.cursors[("t", 0)].landing.hold(5, error="refused")
    copy.cursors[("t", 1)].next = 3
    assert (copy._next_to_copy(("t", 0)), copy._next_to_copy(("t", 1))) == (5, 3)
    copy._report(outbox({("t", 0): [], ("t", 1): []}))  # each partition goes on with a new landing
    assert (copy._next_to_copy(("t", 0)), copy._next_to_copy(("t", 1))) == (5, 3)


def test_a_report_over_thousands_of_rounds_never_goes_back_and_covers_every_offset_once():
    """Positions a driver saves must only grow, and consecutive landings must tile the partition's offsets."""
    import random

    rng = random.Random(7)
    copy = live_copy({("t", 0): 0})
    part = copy.cursors[("t", 0)]
    delivered = 0
    covered_to = 0
    for _ in range(5_000):
        part.next += rng.randint(0, 50)  # read some
        delivered = rng.randint(delivered, part.next)  # delivery reports come in order
        for row in copy._report(outbox({("t", 0): list(range(delivered, part.next))})):
            assert row.first_offset == covered_to, "landings must tile the offsets"
            assert row.end_offset >= row.first_offset
            covered_to = row.end_offset
    assert covered_to <= part.next


class FailedJob:
    """A copy job whose tasks failed past Spark's retries."""

    def __init__(self, error: str, terminal: bool = False) -> None:
        self.error, self.terminal, self.reached = error, terminal, {}

    def running(self) -> bool:
        return False

    def held_any(self) -> bool:
        return False


def test_tasks_that_fail_are_started_again_with_a_backoff_and_only_a_terminal_cause_stops_the_flow(tmp_path):
    clusters = [{"alias": a, "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"} for a in ("a", "b")]
    flow = {"source": "a", "target": "b", "topics": {"include": ["t"]}, "checkpoint_location": str(tmp_path),
            "mode": "realtime"}  # fmt: skip
    config = parse_config({"clusters": clusters, "flows": [flow]})
    sync = SimpleNamespace(
        earliest_offsets=lambda partitions: dict.fromkeys(partitions, 0), topic_ids=lambda topics: {}
    )
    run = RealtimeRunner(None, config, config.flows[0], MirrorMetrics(), topic_sync=sync)  # type: ignore[arg-type]
    now = [1000.0]
    run.clock = lambda: now[0]  # type: ignore[method-assign]
    starts: list[float] = []

    def start(subscription, available_now):
        run._available_now = available_now
        starts.append(now[0])
        run.job = FailedJob("DeliveryFailed: flow a->b: delivery failed")  # and they fail again at once

    run.start = start  # type: ignore[method-assign]
    run.job = FailedJob("DeliveryFailed: flow a->b: delivery failed")
    for _ in range(400):  # 400 s of topic-sync rounds a second apart: far more failures than Spark's 4 retries
        assert run.failure() is None, "a continuous run's failed tasks never stop the mirror"
        run.catch_up()
        now[0] += 1.0
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert starts[0] == 1000.0, "the first restart is at once"
    # Each failure is seen at the next round (a second on), then waits out a backoff that doubles up to 60 s.
    assert gaps[:6] == [3.0, 5.0, 9.0, 17.0, 33.0, 61.0] and set(gaps[6:]) == {61.0}, gaps
    assert 'mirrorkit_errors_total{flow="a->b",kind="tasks_restarted"}' in run.metrics.text()

    run.job = FailedJob("AuthenticationFailed: authentication failed for cluster 'b'", terminal=True)
    assert run.failure() is not None, "bad credentials would fail again at once: the mirror stops, naming them"
    run.job, run._available_now = FailedJob("DeliveryFailed: x"), True
    assert run.failure() == "DeliveryFailed: x", "an available-now run that failed says so"


def test_a_start_saves_where_new_partitions_start_so_a_crash_before_the_first_report_still_reports_retention(
    tmp_path, monkeypatch
):
    """Found by the fault checker: killed between its first records landing and its first report, a real-time mirror
    met its partitions as new at the restart, started at their log start, and said nothing of the records retention
    had deleted meanwhile."""
    clusters = [{"alias": a, "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"} for a in ("a", "b")]
    flow = {"source": "a", "target": "b", "topics": {"include": ["t"]}, "checkpoint_location": str(tmp_path),
            "mode": "realtime"}  # fmt: skip
    config = parse_config({"clusters": clusters, "flows": [flow]})
    log_start = [40]
    monkeypatch.setattr(realtime_flow.clients, "admin", lambda cluster: None)
    monkeypatch.setattr(realtime_flow.clients, "topic_ids", lambda admin, topics: {"t": "id-1"})
    monkeypatch.setattr(realtime_flow, "OffsetSpec", SimpleNamespace(latest=lambda: "end", earliest=lambda: "start"))
    monkeypatch.setattr(realtime_flow, "_answered", lambda admin, partitions, spec, wait_s, read_committed=True: {
        tp: log_start[0] if spec == "start" else 100 for tp in partitions})  # fmt: skip
    sync = SimpleNamespace(
        earliest_offsets=lambda partitions: dict.fromkeys(partitions, log_start[0]), topic_ids=lambda topics: {}
    )

    first = RealtimeRunner(None, config, config.flows[0], MirrorMetrics(), topic_sync=sync)  # type: ignore[arg-type]
    first.plan = TopicPlan(mirrored={"t": 2}, wanted={"t": 2})
    assert first._assign((("t", 2),), available_now=False).starts == {("t", 0): 40, ("t", 1): 40}
    # Killed before a task reported anything: only what was saved survives.
    assert LedgerState.load(checkpoint_files(str(tmp_path))).positions == {("t", 0): 40, ("t", 1): 40}

    log_start[0] = 70  # retention, while the mirror was down
    again = RealtimeRunner(None, config, config.flows[0], MirrorMetrics(), topic_sync=sync)  # type: ignore[arg-type]
    again.plan = first.plan
    assert again._assign((("t", 2),), available_now=False).starts == {("t", 0): 40, ("t", 1): 40}
    # Each task's consumer finds 40 below the log start and moves there (spark_app.outbox): its first report.
    again.ledger.file([Landing("t", p, 70, 75, records=5) for p in (0, 1)])
    assert again.ledger.data_loss == [DataLoss("t", 0, 40, 69), DataLoss("t", 1, 40, 69)]


def test_a_new_partition_whose_log_start_did_not_answer_is_started_at_0_but_not_saved_there(tmp_path, monkeypatch):
    """Its consumer moves from 0 to the real log start; saved at 0, that move would read as a gap, and a topic kept
    for years would report millions of records lost that were never the flow's."""
    clusters = [{"alias": a, "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"} for a in ("a", "b")]
    flow = {"source": "a", "target": "b", "topics": {"include": ["t"]}, "checkpoint_location": str(tmp_path),
            "mode": "realtime"}  # fmt: skip
    config = parse_config({"clusters": clusters, "flows": [flow]})
    monkeypatch.setattr(realtime_flow.clients, "admin", lambda cluster: None)
    monkeypatch.setattr(realtime_flow.clients, "topic_ids", lambda admin, topics: {"t": "id-1"})
    monkeypatch.setattr(realtime_flow, "OffsetSpec", SimpleNamespace(latest=lambda: "end", earliest=lambda: "start"))
    monkeypatch.setattr(realtime_flow, "_answered", lambda admin, partitions, spec, wait_s, read_committed=True: {
        tp: 500 if spec == "start" else 900 for tp in partitions if spec == "end" or tp == ("t", 0)})  # fmt: skip
    sync = SimpleNamespace(
        earliest_offsets=lambda partitions: dict.fromkeys(partitions, 500), topic_ids=lambda topics: {}
    )
    run = RealtimeRunner(None, config, config.flows[0], MirrorMetrics(), topic_sync=sync)  # type: ignore[arg-type]
    run.plan = TopicPlan(mirrored={"t": 2}, wanted={"t": 2})
    assert run._assign((("t", 2),), available_now=False).starts == {("t", 0): 500, ("t", 1): 0}
    assert LedgerState.load(checkpoint_files(str(tmp_path))).positions == {("t", 0): 500}
    run.ledger.file([Landing("t", 1, 500, 510, records=10)])  # its task found the log start
    assert run.ledger.data_loss == []


def test_a_jvm_slots_producer_queues_no_more_than_the_python_loops_transactions_do():
    """Both languages bound what a slot's transactional producer queues by one rule, so a slow target slows either
    slot instead of outliving its transactions."""
    from spark_app.channel import KeySource
    from spark_app.outbox import transaction_settings
    from spark_app.realtime.jvm import SlotConfig

    for cap in (None, 20_000_000):
        rules = TargetRules(max_message_bytes=cap)
        task = CopierTask(FLOW, SOURCE, TARGET, ("127.0.0.1", 9), KeySource("r").encode(), rules)
        java = SlotConfig.of(task, ["t"]).producer
        python = transaction_settings(task.producer_settings)
        assert int(java["buffer.memory"]) == int(cast(int, python["queue.buffering.max.kbytes"])) * 1024, cap
