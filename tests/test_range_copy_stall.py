"""The writer's per-partition stall decision on its own: how long each partition of a copy has read nothing, and
which idle partitions it holds; and a copy stuck past its bound saying where. No broker: the copy loop's offsets and
the source's leaders are given."""

from __future__ import annotations

import time

from spark_app import range_copy
from spark_app.config import ClusterConfig, FlowConfig, TopicSelection
from spark_app.range_copy import LEADER_CHECK_S, PARTITION_STALL_S, PartitionWatch, unreadable

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def test_a_partition_is_idle_from_its_last_read_and_looked_at_no_more_than_once_a_second():
    reached = {A0: 100, A1: 50}
    watch = PartitionWatch(reached, now=0.0)
    assert watch.look_at == LEADER_CHECK_S, "nothing is idle before LEADER_CHECK_S"
    reached[A0] = 180  # a0 reads on, a1 reads nothing
    assert watch.idle(reached, now=LEADER_CHECK_S) == {A1: LEADER_CHECK_S}
    assert watch.look_at == LEADER_CHECK_S + 1.0
    assert watch.idle(reached, now=LEADER_CHECK_S + 3) == {A1: LEADER_CHECK_S + 3}, "a0 read 3 s ago"
    assert watch.idle(reached, now=2 * LEADER_CHECK_S) == {A0: LEADER_CHECK_S, A1: 2 * LEADER_CHECK_S}
    reached[A1] = 51
    assert watch.idle({A1: reached[A1]}, now=20.0) == {}, (
        "a read restarts its clock; only the partitions asked about count"
    )


def test_an_idle_partition_is_held_at_once_without_a_leader_and_after_the_stall_bound_with_one():
    idle = {A0: LEADER_CHECK_S, A1: LEADER_CHECK_S, B0: PARTITION_STALL_S}
    held = unreadable(idle, {A0: 1, A1: -1, B0: 2}, "src")
    assert held == {
        A1: "no progress reading partition for 5 s: source 'src' names no leader for it (leader offline?)",
        B0: "no progress reading partition for 60 s from source 'src' (leader 2 unreachable?)",
    }, "a0 has a leader and has been idle briefly: it waits"
    assert unreadable({("gone", 0): 9.0}, {}, "src") == {
        ("gone", 0): "no progress reading partition for 9 s: source 'src' names no leader for it (leader offline?)"
    }, "a partition the metadata no longer lists has no leader"


def test_a_source_that_does_not_answer_at_all_holds_its_idle_partitions_after_the_stall_bound_not_before():
    """The whole source down (its metadata silent too) ends the batch after PARTITION_STALL_S: a batch that waited on
    it longer would hold up a stop past the pod's grace period. A broker's restart, shorter than that, is ridden out."""
    assert unreadable({A0: LEADER_CHECK_S, A1: PARTITION_STALL_S - 1}, None, "src") == {}
    assert unreadable({A0: PARTITION_STALL_S, A1: LEADER_CHECK_S}, None, "src") == {
        A0: "no progress reading partition for 60 s: source 'src' does not answer"
    }


def test_a_copy_that_runs_past_the_dump_bound_writes_its_threads_stacks_to_the_workers_stderr(capfd, monkeypatch):
    """A copy stuck in a task leaves no word in the executor's log unless it says where it is: past STACK_DUMP_S it
    dumps every thread's stack to file descriptor 2, the worker's stderr, and stops once the copy returns."""
    monkeypatch.setattr(range_copy, "STACK_DUMP_S", 0.3)
    flow = FlowConfig(source="a", target="b", topics=TopicSelection(include=["t"]), checkpoint_location="/c")
    cluster = ClusterConfig(alias="a", bootstrap_servers="127.0.0.1:9", profile="kafka")
    copier = range_copy.RangeCopier(flow, cluster, cluster.model_copy(update={"alias": "b"}))
    monkeypatch.setattr(copier, "_copy", lambda ranges, slot: time.sleep(0.8) or [])
    assert copier.copy([], 0) == []
    stuck = capfd.readouterr().err
    assert "most recent call first" in stuck and "in copy" in stuck, stuck
    time.sleep(0.8)
    assert "most recent call first" not in capfd.readouterr().err, "no dump once the copy returned"
