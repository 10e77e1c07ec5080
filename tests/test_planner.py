"""The planner's range math on its own: how a batch's ranges are shared among tasks, how far a read limit lets each
partition go, what a partition that does not answer gets, and how a planned task copies its ranges. No Spark session
and no broker (offsets come from a table)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from fractions import Fraction

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_app import batch_log, planner
from spark_app.batch_log import Planned
from spark_app.config import ClusterConfig
from spark_app.metrics import FlowTotals
from spark_app.planner import (
    FIRST_BATCH_RECORDS,
    OFFLINE_ASK_S,
    OFFLINE_RECHECK_S,
    TOPIC_GONE_GRACE_S,
    BatchPlanner,
    PlanningStopped,
    kept_where_unanswered,
    limit_offsets,
    split_ranges,
)
from spark_app.ranges import Landing, OffsetRange
from tests.support.running import in_background

SEED = 20261124
CASES = 3_000


@pytest.fixture(autouse=True)
def samples_read_nothing(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """No broker here: a topic's sample of records reads nothing, as from a silent source, unless a test says what
    it reads. Each sample asked for is kept: the partitions and where it starts."""
    asked: list[dict] = []
    monkeypatch.setattr(planner.clients, "mean_record_bytes", lambda _c, at, **_: asked.append(dict(at)) or {})
    return asked


def planned_end(reader: BatchPlanner, start: dict, means: dict[str, float] | None = None) -> dict:
    """Where the planner ends the next batch from `start`, both as the log keeps them; `means`: what landed says."""
    return reader.latest(Planned.parse(start), means or {}).dump()


def ranges_of(*sizes: int, start: int = 100) -> list[OffsetRange]:
    """One range per size, each on its own partition of topic `t`."""
    return [OffsetRange("t", p, start, start + size) for p, size in enumerate(sizes)]


def loads(groups: list[list[OffsetRange]]) -> list[int]:
    return [sum(r.size for r in g) for g in groups]


def assert_split_is_sound(ranges: list[OffsetRange], tasks: int, groups: list[list[OffsetRange]]) -> None:
    """Every range in exactly one group, whole; no empty group; no more groups than tasks or ranges; and balanced as
    greedy largest-first gives: the heaviest group outweighs the lightest by at most the largest range."""
    context = f"tasks={tasks}, sizes={[r.size for r in ranges]}, groups={[[r.size for r in g] for g in groups]}"
    assert Counter(r for g in groups for r in g) == Counter(ranges), context
    assert all(groups), context
    assert len(groups) <= min(tasks, len(ranges)), context
    if all(r.size > 0 for r in ranges):  # the planner makes no empty range
        assert len(groups) == min(tasks, len(ranges)), context
    if groups:
        assert max(loads(groups)) - min(loads(groups)) <= max(r.size for r in ranges), context


def test_split_balances_groups_by_record_count_not_by_range_count():
    big, *small = ranges_of(1_000, *[100] * 10)
    groups = split_ranges([*small, big], tasks=2)
    assert sorted(groups, key=len) == [[big], small]
    assert loads(groups) == [1_000, 1_000]


def test_split_gives_the_largest_range_to_the_lightest_group_first():
    ranges = ranges_of(3, 7, 1, 5, 4)
    groups = split_ranges(ranges, tasks=2)
    assert [[r.size for r in g] for g in groups] == [[7, 3], [5, 4, 1]]
    assert loads(groups) == [10, 10]
    assert_split_is_sound(ranges, 2, groups)


def test_split_makes_no_more_groups_than_tasks_or_ranges():
    ranges = ranges_of(10, 20, 30)
    assert len(split_ranges(ranges, tasks=2)) == 2
    assert len(split_ranges(ranges, tasks=3)) == 3
    assert len(split_ranges(ranges, tasks=8)) == 3  # one range a task: a range is never split to fill a task
    assert sorted(r.size for (r,) in split_ranges(ranges, tasks=8)) == [10, 20, 30]
    assert split_ranges(ranges, tasks=1) == [sorted(ranges, key=lambda r: -r.size)]


def test_split_assigns_every_range_exactly_once_and_whole():
    ranges = [OffsetRange(f"t{t}", p, 10 * p, 10 * p + 1 + 37 * t + p) for t in range(3) for p in range(5)]
    groups = split_ranges(ranges, tasks=4)
    assigned = [r for g in groups for r in g]
    assert Counter(assigned) == Counter(ranges) and len(assigned) == len(ranges)
    assert {id(r) for r in assigned} == {id(r) for r in ranges}, "a range was cut, copied or changed"
    assert_split_is_sound(ranges, 4, groups)


def test_split_of_no_ranges_is_no_groups():
    assert split_ranges([], tasks=4) == []
    assert split_ranges([], tasks=1) == []


def test_split_holds_its_guarantees_over_random_batches():
    rng = random.Random(SEED)
    for _ in range(CASES):
        count = rng.randint(0, 40)
        sizes = [rng.choice((0, 1, rng.randint(1, 50), rng.randint(1, 100_000))) for _ in range(count)]
        if rng.random() < 0.7:
            sizes = [max(1, s) for s in sizes]  # as the planner makes them: no empty range
        ranges = [OffsetRange(f"t{i % 3}", i, 1_000 + i, 1_000 + i + s) for i, s in enumerate(sizes)]
        tasks = rng.randint(1, 12)
        assert_split_is_sound(ranges, tasks, split_ranges(ranges, tasks))


def offsets(**partitions: int) -> dict[str, dict[str, int]]:
    """{"t": {"0": offset, ...}} from p0=..., p1=..."""
    return {"t": {name.removeprefix("p"): offset for name, offset in partitions.items()}}


def taken(starts: dict, ends: dict) -> dict[tuple[str, str], int]:
    """Records each partition's range holds: the planner makes no range where the end is not past the start."""
    return {(t, p): max(0, e - starts[t][p]) for t, offs in ends.items() for p, e in offs.items()}


def by_records(starts: dict, latest: dict, max_rows: int) -> dict[str, dict[str, int]]:
    """`limit_offsets` where only the record bound counts: 1-byte records, and a byte bound far above them."""
    return limit_offsets(starts, latest, max_rows, 2**62, dict.fromkeys(latest, 1.0))


def test_limit_returns_latest_unchanged_when_the_backlog_fits():
    starts, latest = offsets(p0=10, p1=0), offsets(p0=15, p1=5)
    assert by_records(starts, latest, max_rows=10) == latest
    assert by_records(starts, latest, max_rows=11) == latest


def test_limit_shares_max_rows_in_proportion_to_each_partitions_backlog():
    starts = {"a": {"0": 0, "1": 500}, "b": {"0": 7}}
    latest = {"a": {"0": 600, "1": 800}, "b": {"0": 107}}  # backlogs 600, 300, 100
    assert by_records(starts, latest, max_rows=100) == {"a": {"0": 60, "1": 530}, "b": {"0": 17}}


def test_limit_takes_at_most_max_rows_when_every_backlogged_partitions_share_is_one_or_more():
    starts, latest = offsets(p0=0, p1=0, p2=0), offsets(p0=1_000, p1=333, p2=100)
    ends = by_records(starts, latest, max_rows=100)
    assert ends == offsets(p0=69, p1=23, p2=6)  # each backlog * 100 // 1433, rounded down
    assert sum(taken(starts, ends).values()) == 98


def test_limit_exceeds_max_rows_by_at_most_one_record_per_partition_whose_share_rounds_to_zero():
    """A partition with backlog always moves, so one whose proportional share rounds down to 0 still takes 1.
    Those are the only records over `max_rows`, and this can happen with fewer backlogged partitions than
    `max_rows`, not only with more."""
    starts, latest = offsets(p0=0, p1=0, p2=0, p3=0, p4=0, p5=0), offsets(p0=1_000, p1=1, p2=1, p3=1, p4=1, p5=1)
    ends = by_records(starts, latest, max_rows=10)
    assert ends == offsets(p0=9, p1=1, p2=1, p3=1, p4=1, p5=1)  # 9 is p0's share: 1000 * 10 // 1005
    assert sum(taken(starts, ends).values()) == 10 + 4  # four of the five one-record partitions are over budget
    many = {"t": {str(p): 0 for p in range(20)}}
    ends = by_records(many, {"t": {str(p): 5 for p in range(20)}}, max_rows=10)
    assert set(ends["t"].values()) == {1} and sum(taken(many, ends).values()) == 20


def test_limit_never_goes_past_latest_nor_below_start_and_keeps_every_backlogged_partition_moving():
    starts, latest = offsets(p0=100, p1=200, p2=300, p3=400), offsets(p0=100, p1=201, p2=1_300, p3=100_400)
    ends = by_records(starts, latest, max_rows=50)
    for p in ("0", "1", "2", "3"):
        assert starts["t"][p] <= ends["t"][p] <= latest["t"][p], p
    assert ends["t"]["0"] == 100, "no backlog: stays"
    assert ends["t"]["1"] == 201 and ends["t"]["2"] == 301, "backlog 1, and a share below 1: still moves by 1"
    assert ends["t"]["3"] == 449, "its share: 100000 * 50 // 101001"


def test_limit_takes_nothing_from_a_partition_whose_end_is_below_its_start():
    """A topic recreated under the mirror lists an end below the checkpoint's start: no backlog there. Limited, the
    end stays at the start; when the rest fits, latest comes back as it is. Either way the range is empty."""
    starts, latest = offsets(p0=500, p1=0), offsets(p0=20, p1=1_000)
    ends = by_records(starts, latest, max_rows=10)
    assert ends == offsets(p0=500, p1=10)
    assert by_records(starts, latest, max_rows=1_000) == latest
    assert taken(starts, latest)[("t", "0")] == 0


MB = 1 << 20
# Per partition: its start and how far behind it is (none, a few or a million records; now and then the end fell
# below the start). Per topic: its mean record size, from empty records to 2 MB ones, or none (not seen yet).
PARTITION = st.tuples(
    st.integers(0, 10**9),
    st.one_of(st.sampled_from((0, 1)), st.integers(1, 100), st.integers(1, 10**6)),
    st.sampled_from((False,) * 32 + (True,)),
    st.integers(1, 1_000),
)
TOPIC = st.tuples(
    st.lists(PARTITION, min_size=1, max_size=12),
    st.one_of(st.none(), st.sampled_from((0.0, 1024.0, MB)), st.floats(1.0, 2 * MB)),
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[dict, dict, dict[str, float]]:
    """Starts, latest offsets and per-topic mean record sizes of 1 to 4 topics."""
    starts: dict[str, dict[str, int]] = {}
    latest: dict[str, dict[str, int]] = {}
    means: dict[str, float] = {}
    for t, (partitions, mean) in enumerate(draw(st.lists(TOPIC, min_size=1, max_size=4))):
        for p, (start, behind, fell_back, below) in enumerate(partitions):
            starts.setdefault(f"t{t}", {})[str(p)] = start
            latest.setdefault(f"t{t}", {})[str(p)] = start - below if fell_back else start + behind
        if mean is not None:
            means[f"t{t}"] = mean
    return starts, latest, means


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(batch=batches(), max_rows=st.integers(1, 10**6), max_bytes=st.integers(1, 1 << 34))
def test_limit_holds_its_bounds_over_random_mixes_of_topics_backlogs_and_record_sizes(batch, max_rows, max_bytes):
    """Per partition: the end is never past latest nor below the start (where latest is not below it), and a
    partition with backlog takes at least 1. In all, counting each record at its topic's mean (a topic without one
    at max_bytes / FIRST_BATCH_RECORDS): at most max_rows records and max_bytes bytes, each bound exceeded only by
    the one record of a backlogged partition whose share rounds down to 0; at most FIRST_BATCH_RECORDS records of
    topics without a mean, plus one per partition; and one bound nearly reached (each share loses under one record
    to rounding)."""
    starts, latest, means = batch
    ends = limit_offsets(starts, latest, max_rows, max_bytes, means)

    cost = {t: Fraction(means[t]) if t in means else Fraction(max_bytes, FIRST_BATCH_RECORDS) for t in latest}
    backlog = taken(starts, latest)
    got = taken(starts, ends)
    assert {t: set(o) for t, o in ends.items()} == {t: set(o) for t, o in latest.items()}
    if sum(backlog.values()) <= max_rows and sum(b * cost[t] for (t, _), b in backlog.items()) <= max_bytes:
        assert ends == latest
        return
    for (t, p), behind in backlog.items():
        start, end = starts[t][p], ends[t][p]
        assert start <= end
        assert got[(t, p)] <= behind
        if latest[t][p] >= start:
            assert end <= latest[t][p]
        if behind:
            assert got[(t, p)] >= 1, "a partition with backlog always moves"
    backlogged = [(t, p) for (t, p), b in backlog.items() if b]
    records = sum(got.values())
    planned = sum(n * cost[t] for (t, _), n in got.items())
    over = [(t, p) for t, p in backlogged if got[(t, p)] == 1]  # the only ones a rounded-down share can put over
    assert records <= max_rows + len(over)
    assert planned <= max_bytes + sum(cost[t] for t, _ in over)
    assert sum(got[(t, p)] for t, p in backlogged if t not in means) <= FIRST_BATCH_RECORDS + len(backlogged)
    assert records > max_rows - len(backlogged) or planned >= max_bytes - sum(cost[t] for t, _ in backlogged)


def test_a_batch_of_a_1_mb_topic_keeps_to_the_byte_bound_in_a_flow_whose_mean_is_1_kb_records(monkeypatch):
    """Most of what the flow copied so far is 1 KB records: its mean record size is about 2 KB. The backlog is all
    on the 1 MB topic: 256 MB of it is 256 records, not the 129,644 (127 GB) that the flow's mean planned."""
    totals = FlowTotals()
    totals.add([Landing("small", 0, 0, 1_000_000, records=1_000_000, bytes=1_000_000 * 1024)])
    totals.add([Landing("big", p, 0, 250, records=250, bytes=250 * MB) for p in range(4)])
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    reader = BatchPlanner(source, {"small": 1, "big": 4}, "earliest", 2, 250_000, 256 * MB)
    reader._admin = object()  # type: ignore[assignment]  # never used: the table answers
    ends = {("small", 0): 1_000_000} | {("big", p): 100_250 for p in range(4)}
    monkeypatch.setattr(planner.clients, "list_offsets_each", OffsetTable(ends))
    monkeypatch.setattr(planner.clients, "topic_ids", lambda *_, **__: {})  # ids are another test's
    start = {"small": {"0": 1_000_000}, "big": dict.fromkeys("0123", 250)}

    end = planned_end(reader, start, totals.mean_record_bytes())  # what the driver hands after each batch
    assert end == {"small": {"0": 1_000_000}, "big": dict.fromkeys("0123", 250 + 64)}, "64 records of 1 MB each"


def test_a_topic_without_a_mean_takes_at_most_a_first_batch_until_its_records_land():
    starts, latest = {"a": {"0": 0}, "b": {"0": 0}}, {"a": {"0": 10**6}, "b": {"0": 10**6}}

    def planned(means: dict[str, float]) -> dict[str, dict[str, int]]:
        return limit_offsets(starts, latest, 250_000, 256 * MB, means)

    assert planned({}) == {"a": {"0": 5_000}, "b": {"0": 5_000}}, "no record landed yet: FIRST_BATCH_RECORDS, shared"
    # a's records landed, none of b's yet (b joined the flow since). b's records count 256 MB / 10,000 each: 9,962 of
    # them and as many of a's 100 B ones fill 256 MB.
    assert planned({"a": 100.0}) == {"a": {"0": 9_962}, "b": {"0": 9_962}}
    assert planned({"a": 100.0, "b": 100.0}) == {"a": {"0": 125_000}, "b": {"0": 125_000}}, "the record bound holds"


def test_a_first_batch_is_held_to_the_byte_bound_by_a_sample_of_the_records_it_is_about_to_copy(
    monkeypatch, samples_read_nothing
):
    """Nothing has landed yet. Topic a's sample reads 512 B records, b's 64 KB ones, c's nothing (its source was
    silent). A batch of 256 MB then counts a's and b's records at those sizes, and c's as FIRST_BATCH_RECORDS says:
    it takes far more of a than a first batch without a sample could (10,000 records), and stays within 256 MB. Each
    topic is sampled once per planner, at the start of its partition furthest behind; once its records land, the
    driver's mean wins."""
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    reader = BatchPlanner(source, {"a": 2, "b": 1, "c": 1}, "earliest", 2, 10**6, 256 * MB)
    reader._admin = object()  # type: ignore[assignment]  # never used: the table answers
    ends = {("a", 0): 300_000, ("a", 1): 200_000, ("b", 0): 1_000, ("c", 0): 1_000}
    monkeypatch.setattr(planner.clients, "list_offsets_each", OffsetTable(ends))
    monkeypatch.setattr(planner.clients, "topic_ids", lambda *_, **__: {})  # ids are another test's
    sizes = {"a": 512.0, "b": 64.0 * 1024}

    def sample(_cluster, at, **_):
        samples_read_nothing.append(dict(at))
        return {t: sizes[t] for t, _ in at if t in sizes}

    monkeypatch.setattr(planner.clients, "mean_record_bytes", sample)
    start = {"a": {"0": 0, "1": 0}, "b": {"0": 0}, "c": {"0": 0}}
    latest = {t: {str(p): e for (topic, p), e in ends.items() if topic == t} for t in "abc"}

    end = Planned.parse(planned_end(reader, start)).offsets
    assert samples_read_nothing == [{("a", 0): 0, ("b", 0): 0, ("c", 0): 0}]
    assert end == limit_offsets(start, latest, 10**6, 256 * MB, sizes)
    taken = {t: sum(end[t].values()) for t in "abc"}
    assert taken["a"] > 10 * FIRST_BATCH_RECORDS
    cost = sizes | {"c": 256 * MB / FIRST_BATCH_RECORDS}
    assert sum(taken[t] * cost[t] for t in "abc") <= 256 * MB
    assert Planned.parse(planned_end(reader, start)).offsets == end
    assert len(samples_read_nothing) == 1, "sampled once per planner"
    small = {"a": 100.0, "b": 100.0, "c": 100.0}  # what landed says they are small
    assert Planned.parse(planned_end(reader, start, small)).offsets == latest


def test_adopted_positions_start_partitions_the_checkpoint_does_not_hold_and_never_override_it():
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    adopted = {"t": {"0": 70, "1": 5}}
    reader = BatchPlanner(source, {"t": 3, "u": 1}, "latest", 2, 1000, 1 << 28, adopted=adopted)
    asked: list = []

    def earliest(spec, partitions=None):
        asked.extend(partitions or [])
        return {t: {p: 0 for tp, p in partitions if tp == t} for t, _ in partitions}

    reader._list = earliest  # type: ignore[method-assign]  # no broker: only the log starts are asked
    end = Planned({"t": {"0": 100, "1": 100, "2": 100}, "u": {"0": 100}})
    # The first batch: adopted partitions start where MM2 stopped; the one MM2 never committed (t[2]) starts at its
    # log start, as t is no new topic; u, which MM2 never copied, follows start_from (latest).
    assert reader._starts(Planned({}), end) == {"t": {"0": 70, "1": 5, "2": 0}, "u": {"0": 100}}
    # Once the checkpoint holds a partition, its position wins.
    start = Planned({"t": {"0": 90, "1": 95, "2": 3}, "u": {"0": 100}})
    assert reader._starts(start, end)["t"] == {"0": 90, "1": 95, "2": 3}


def test_a_throughput_run_after_a_real_time_one_starts_where_that_got_to_unless_the_log_is_shorter_now(tmp_path):
    """A real-time run keeps its positions in the flow's state, not in the Spark checkpoint, which it leaves behind."""
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    resume = {"t": {"0": 80, "1": 40, "2": 500}}
    reader = BatchPlanner(source, {"t": 3}, "latest", 2, 1000, 1 << 28, resume=resume)
    reader._list = lambda spec, partitions=None: {"t": {p: 0 for _, p in partitions or []}}  # type: ignore[method-assign]
    end = Planned({"t": {"0": 100, "1": 100, "2": 100}})
    # Past the old checkpoint (t[0]) or where it holds nothing (t[1]): the real-time position. t[2]'s log is shorter
    # than where the real-time run got to (made again since): the checkpoint's position stands, and the planner
    # reports the offsets going backwards from it as it would without the real-time run.
    assert reader._starts(Planned({"t": {"0": 10, "2": 7}}), end) == {"t": {"0": 80, "1": 40, "2": 7}}
    # A checkpoint already past the real-time position keeps its own.
    assert reader._starts(Planned({"t": {"0": 90, "1": 95, "2": 3}}), end)["t"] == {"0": 90, "1": 95, "2": 3}


class OffsetTable:
    """`clients.list_offsets_each` over a table of end offsets: a partition missing from it does not answer."""

    def __init__(self, ends: dict[tuple[str, int], int]) -> None:
        self.ends = ends
        self.asked: list[tuple[list[tuple[str, int]], float]] = []  # (partitions, timeout) per request

    def __call__(self, _admin, partitions, _spec, read_committed=False, timeout_s=30.0):
        wanted = list(partitions)
        self.asked.append((wanted, timeout_s))
        found = {tp: self.ends[tp] for tp in wanted if tp in self.ends}
        return found, {tp: "Broker: Leader not available" for tp in wanted if tp not in self.ends}


def test_a_partition_that_does_not_answer_gets_no_range_and_keeps_its_position_while_the_others_are_planned(
    monkeypatch, caplog
):
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    reader = BatchPlanner(source, {"a": 2, "b": 1}, "earliest", 2, 1000, 1 << 28)
    reader._admin = object()  # type: ignore[assignment]  # never used: the table answers
    table = OffsetTable({("a", 0): 10, ("b", 0): 8})  # a[1]'s leader is offline
    monkeypatch.setattr(planner.clients, "list_offsets_each", table)
    monkeypatch.setattr(planner.clients, "topic_ids", lambda *_, **__: {})  # ids are another test's
    start = {"a": {"0": 5, "1": 7}, "b": {"0": 3}}

    end = planned_end(reader, start)
    assert end == {"a": {"0": 10, "1": 7}, "b": {"0": 8}}, "a[1] stays where the checkpoint has it"
    ranges = [r for g in reader.ranges(Planned.parse(start), Planned.parse(end)) for r in g]
    assert sorted(ranges, key=lambda r: r.topic) == [OffsetRange("a", 0, 5, 10), OffsetRange("b", 0, 3, 8)]
    assert [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()] == [
        "cluster 'src': topic 'a' partition 1 did not answer (Broker: Leader not available); it gets no new range"
        " until it does, the other partitions go on"
    ]

    table.asked.clear()
    planned_end(reader, end)  # before OFFLINE_RECHECK_S: a[1] is not asked, nothing waits on it
    assert table.asked == [([("a", 0), ("b", 0)], 30.0)]

    assert reader._offline[("a", 1)] > time.monotonic() + OFFLINE_RECHECK_S - 5
    reader._offline[("a", 1)] = time.monotonic()  # OFFLINE_RECHECK_S later
    table.ends[("a", 1)] = 12  # its leader is back
    table.asked.clear()
    assert planned_end(reader, end) == {"a": {"0": 10, "1": 12}, "b": {"0": 8}}
    assert table.asked == [([("a", 0), ("b", 0)], 30.0), ([("a", 1)], OFFLINE_ASK_S)], "asked again alone, briefly"
    assert len([r for r in caplog.records if "did not answer" in r.getMessage()]) == 1, "said once, not per batch"


def test_a_partition_without_an_answer_keeps_its_checkpoint_position_only_while_its_topic_is_planned():
    start = {"a": {"0": 5, "1": 7}, "gone": {"0": 4}}
    assert kept_where_unanswered({"a": {"0": 9}}, start, {"a": 2}) == {"a": {"0": 9, "1": 7}}
    assert kept_where_unanswered({}, start, {"a": 1}) == {"a": {"0": 5}}, "a partition past the count is not kept"
    assert kept_where_unanswered({"b": {"0": 1}}, {}, {"a": 1, "b": 1}) == {"b": {"0": 1}}, "no position: nothing"


def test_a_source_that_does_not_answer_at_all_plans_no_batch(monkeypatch):
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    reader = BatchPlanner(source, {"a": 1}, "earliest", 2, 1000, 1 << 28)
    reader._admin = object()  # type: ignore[assignment]

    def down(*_args, **_kwargs):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))

    monkeypatch.setattr(planner.clients, "list_offsets_each", down)
    assert planned_end(reader, {"a": {"0": 5}}) == {"a": {"0": 5}}
    assert reader._down_since is not None, "the cluster-down clock runs (UNREACHABLE_GIVE_UP_S)"


def test_a_stop_ends_an_available_now_run_that_waits_for_a_silent_source(monkeypatch):
    """Fixing an available-now run's end waits for the source to answer, up to UNREACHABLE_GIVE_UP_S; a stop asked
    for meanwhile ends the wait, so a SIGTERM during an outage is not held up for minutes."""
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    stopping = threading.Event()
    reader = BatchPlanner(source, {"a": 1}, "earliest", 2, 1000, 1 << 28, stopping=stopping)
    reader._admin = object()  # type: ignore[assignment]
    asked = threading.Event()

    def down(*_args, **_kwargs):
        asked.set()
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))

    monkeypatch.setattr(planner.clients, "list_offsets_each", down)
    thread, outcome = in_background(reader.prepare_available_now, "planner")
    assert asked.wait(30), "the planner asked the source"
    assert thread.is_alive(), "the planner waits while the source is silent"
    stopping.set()
    thread.join(30)
    assert not thread.is_alive(), "the stop ended the wait"
    assert len(outcome) == 1 and isinstance(outcome[0], PlanningStopped), outcome


def planned_ranges(reader: BatchPlanner, start: dict, end: dict) -> list[OffsetRange]:
    ranges = [r for g in reader.ranges(Planned.parse(start), Planned.parse(end)) for r in g]
    return sorted(ranges, key=lambda r: (r.topic, r.partition))


def test_a_topic_deleted_and_made_again_past_its_old_position_is_copied_from_its_log_start_and_reported(monkeypatch):
    """Offsets that only went forward cannot tell a topic made again from the same one; its id can."""
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")
    reader = BatchPlanner(source, {"t": 2, "u": 1}, "latest", 2, 10**6, 1 << 40)
    reader._admin = object()  # type: ignore[assignment]  # never used: the tables answer
    means = {"t": 100.0, "u": 100.0}  # past the first batch: the record bound is the only one
    ends = OffsetTable({("t", 0): 12_000, ("t", 1): 12_000, ("u", 0): 50})
    monkeypatch.setattr(planner.clients, "list_offsets_each", lambda admin, partitions, spec, **kwargs: (
        {tp: 0 for tp in partitions} if type(spec).__name__ == "EarliestSpec" else ends(admin, partitions, spec)[0], {}
    ))  # fmt: skip  # the new t's log starts at 0
    ids = {"t": "id-new", "u": "id-u"}
    monkeypatch.setattr(planner.clients, "topic_ids", lambda *_, **__: dict(ids))
    # The mirror had copied the old t up to 8,000; t was deleted, made again and refilled to 12,000 meanwhile.
    start = Planned({"t": {"0": 8_000, "1": 8_000}, "u": {"0": 40}}, {"t": "id-old", "u": "id-u"}).dump()
    end = planned_end(reader, start, means)
    assert Planned.parse(end).ids == ids, "the new id goes into the offset log with the positions"
    assert planned_ranges(reader, start, end) == [
        OffsetRange("t", 0, 0, 12_000, reset_from=8_000),
        OffsetRange("t", 1, 0, 12_000, reset_from=8_000),
        OffsetRange("u", 0, 40, 50),
    ]
    # A batch Spark runs again after a crash reads the same two entries, and plans the same.
    assert planned_ranges(reader, start, end) == planned_ranges(reader, start, end)
    # Once the new id is in the log, the topic is the same one again.
    assert all(r.reset_from < 0 for r in planned_ranges(reader, end, planned_end(reader, end, means)))
    # An offset log written before ids were kept compares none: no reset is made up.
    old = {"t": {"0": 8_000, "1": 8_000}, "u": {"0": 40}}
    assert all(r.reset_from < 0 for r in planned_ranges(reader, old, planned_end(reader, old, means)))


def test_a_topic_missing_from_one_topic_sync_round_resumes_where_it_stood_and_is_forgotten_only_after_a_week(
    monkeypatch,
):
    """Topic sync leaves out a topic whose metadata failed, or that was not allowed for a moment; the query runs
    without it. When it returns it is no new topic: `start_from: latest` would skip what it got meanwhile, and
    `earliest` would copy its whole log again."""
    source = ClusterConfig(alias="src", bootstrap_servers="127.0.0.1:9", profile="kafka")

    def reader_on(subscription: dict[str, int]) -> BatchPlanner:
        reader = BatchPlanner(source, subscription, "latest", 2, 10**6, 1 << 40)
        reader._admin = object()  # type: ignore[assignment]
        return reader

    ends = {("a", 0): 100, ("b", 0): 500}
    monkeypatch.setattr(planner.clients, "list_offsets_each", OffsetTable(ends))
    monkeypatch.setattr(planner.clients, "topic_ids", lambda _admin, topics, **__: {t: f"id-{t}" for t in topics})
    start = Planned({"a": {"0": 90}, "b": {"0": 300}}, {"a": "id-a", "b": "id-b"}).dump()

    without_b = reader_on({"a": 1})  # the query restarted without b
    end = planned_end(without_b, start)
    assert Planned.parse(end).offsets == {"a": {"0": 100}, "b": {"0": 300}}, "b's position stays in the log"
    assert planned_ranges(without_b, start, end) == [OffsetRange("a", 0, 90, 100)], "and b gets no range"
    again = planned_end(without_b, end)
    assert again == end, "nothing new: no batch (an available-now run can end)"

    with_b = reader_on({"a": 1, "b": 1})  # b is back
    back = planned_end(with_b, end)
    assert planned_ranges(with_b, end, back) == [OffsetRange("b", 0, 300, 500)], "from where it stood"
    assert batch_log.GONE_KEY not in back

    forgotten = Planned.parse(end)
    forgotten.gone["b"] -= TOPIC_GONE_GRACE_S + 1
    assert "b" not in Planned.parse(planned_end(without_b, forgotten.dump())).offsets
