"""The writer's per-partition stall decision on its own: how long each partition of a copy has read nothing, and
which idle partitions it holds; and a read that never returns ending its worker. No broker: the copy loop's offsets and
the source's leaders are given."""

from __future__ import annotations

import subprocess
import sys

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


def _reads(stuck: bool) -> subprocess.CompletedProcess[str]:
    """A process that reads 30 times through `clients.consume`, with READ_STUCK_S at 1 s, from a source that refuses
    connections; `stuck`: its error callback never returns, so neither does the real consume() that serves it."""
    script = f"""
import threading
from confluent_kafka import Consumer, TopicPartition
from spark_app import clients
clients.READ_STUCK_S = 1.0
never = threading.Event()
on_error = (lambda err: never.wait()) if {stuck} else (lambda err: None)
consumer = Consumer({{"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "error_cb": on_error, "log_level": 0}})
consumer.assign([TopicPartition("t", 0, 0)])
for _ in range(30):
    clients.consume(consumer, 10, 0.1)
print("all reads returned")
"""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)


def test_a_read_that_never_returns_ends_its_process_with_the_stacks_and_reads_that_return_do_not():
    """One librdkafka consume() was seen to stay stuck for good after a source broker came back, its task and batch
    with it. A read not back within READ_STUCK_S ends the worker (status 1), its stacks in stderr, so Spark runs the
    task again on a new consumer; reads that return, 3 s of them here, leave the process alone."""
    stuck = _reads(stuck=True)
    assert stuck.returncode == 1 and "all reads returned" not in stuck.stdout, (stuck.returncode, stuck.stdout)
    assert "most recent call first" in stuck.stderr and "in consume" in stuck.stderr, stuck.stderr
    fine = _reads(stuck=False)
    assert fine.returncode == 0 and "all reads returned" in fine.stdout, (fine.returncode, fine.stderr[-2000:])
