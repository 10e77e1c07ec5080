"""Real-time mode's bookkeeping without brokers: what a task reports, and how a job splits partitions into tasks."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from spark_app.config import ClusterConfig, FlowConfig, TopicSelection
from spark_app.realtime.task import Assignment, CopierTask, LiveCopy
from spark_app.topics import TargetRules

SOURCE = ClusterConfig(alias="a", bootstrap_servers="127.0.0.1:9", profile="kafka")
TARGET = ClusterConfig(alias="b", bootstrap_servers="127.0.0.1:9", profile="kafka")
FLOW = FlowConfig(source="a", target="b", topics=TopicSelection(include=["t"]), checkpoint_location="/tmp/x")


def live_copy(starts: dict[tuple[str, int], int]) -> LiveCopy:
    task = CopierTask(FLOW, SOURCE, TARGET, ("127.0.0.1", 9), b"key", TargetRules())
    return LiveCopy(task, Assignment(starts, None))


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
