"""A real-time slot catching up, exactly once, into a slow target: its transactions are bounded (what they carry,
how long they are open, how much its producer queues), so the slot keeps committing at the target's pace instead of
outliving the broker's transaction timeout and starting over from the same place. No Spark: the task's copy loop
runs in a thread, as in tests/test_realtime_refusals.py."""

from __future__ import annotations

from bench.testbed.toxiproxy import Stream
from spark_app import outbox, transactions
from spark_app.topics import TargetRules
from tests.test_realtime_refusals import Flow, copying

RECORDS = 2_000  # per partition, 1 KB each: 4 MB, 20 s at 200 KB/s


def backlog(flow: Flow) -> None:
    for partition in (0, 1):
        flow.load(partition, 0, RECORDS, size=1_000)


def test_a_slow_target_slows_a_catching_up_exactly_once_slot_down_instead_of_outliving_its_transactions(
    plaintext_cluster, unique, monkeypatch
):
    """A transaction timeout of 8 s: one transaction of the whole backlog, or of what a 256 MB queue holds, would
    outlive it at 200 KB/s."""
    monkeypatch.setattr(transactions, "TRANSACTION_TIMEOUT_MS", 8_000)
    monkeypatch.setattr(outbox, "TXN_OPEN_S", 1.0, raising=False)
    monkeypatch.setattr(outbox, "TXN_QUEUE_KBYTES", 256, raising=False)
    cluster = plaintext_cluster
    slot = copying(cluster.client, unique, TargetRules(max_message_bytes=100_000), exactly_once=True, before=backlog,
                   target=cluster.proxied)  # fmt: skip
    cluster.faults.bandwidth(200, Stream.UPSTREAM)  # what the slot's producer sends to the target, in KB/s
    try:
        with slot as (flow, driver):
            copied = flow.copied(2 * RECORDS, driver)
    finally:
        cluster.faults.heal()
    for partition in (0, 1):
        assert copied[partition] == [f"p{partition}-{i}".encode() for i in range(RECORDS)], partition
