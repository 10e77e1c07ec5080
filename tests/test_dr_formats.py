"""MM2's own classes read the records the DR loop writes; translation never lands past an unread record."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from spark_app.dr.formats import Checkpoint, Heartbeat, OffsetSync
from spark_app.dr.syncs import DENSE_SYNCS, SyncStore, Translation
from tests.support.kafka_cluster import kafka_classpath

DECODE = """
import org.apache.kafka.connect.mirror.*;
import org.apache.kafka.clients.consumer.ConsumerRecord;
var hex = java.util.HexFormat.of();
ConsumerRecord<byte[], byte[]> rec(String k, String v) {
    return new ConsumerRecord<>("t", 0, 0L, hex.parseHex(k), hex.parseHex(v));
}
System.out.println(Checkpoint.deserializeRecord(rec("%s", "%s")));
System.out.println(Heartbeat.deserializeRecord(rec("%s", "%s")));
System.out.println(OffsetSync.deserializeRecord(rec("%s", "%s")));
/exit
"""


def test_mirrormakers_own_classes_decode_our_checkpoint_heartbeat_and_offset_sync():
    records = (
        Checkpoint("orders-app", "primary.orders", 3, 1234, 987, "mé"),
        Heartbeat("primary", "dr", 1_700_000_000_123),
        OffsetSync("orders", 11, 2**40, 5),
    )
    script = DECODE % tuple(part for r in records for part in (r.key().hex(), r.value().hex()))
    with tempfile.NamedTemporaryFile("w", suffix=".jsh", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(
            ["jshell", "-J-Dfile.encoding=UTF-8", "-R-Dstdout.encoding=UTF-8", "--class-path", kafka_classpath(),
             f.name],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        Path(f.name).unlink()
    lines = [line for line in out.stdout.splitlines() if "{" in line]
    assert lines == [
        "Checkpoint{consumerGroupId=orders-app, topicPartition=primary.orders-3, upstreamOffset=1234,"
        " downstreamOffset=987, metadata=mé}",
        "Heartbeat{sourceClusterAlias=primary, targetClusterAlias=dr, timestamp=1700000000123}",
        f"OffsetSync{{topicPartition=orders-11, upstreamOffset={2**40}, downstreamOffset=5}}",
    ], out.stderr
    for r in records:
        assert type(r).decode(r.key(), r.value()) == r


def test_translation_is_exact_at_a_sync_and_rereads_at_most_the_gap_after_one():
    store = SyncStore()
    store.record("orders", 0, 99, 40)  # source offset 99 landed at target offset 40
    store.record("orders", 0, 199, 140)
    assert store.translate("orders", 0, 199) == Translation(140, 0)  # next to read is 199 itself
    assert store.translate("orders", 0, 200) == Translation(141, 0)  # consumed through the sync
    assert store.translate("orders", 0, 150) == Translation(41, 50)  # 100..149 may be read again, nothing skipped
    assert store.translate("orders", 0, 10_000) == Translation(141, 9_800)  # ahead of the mirror: its next write
    assert store.translate("orders", 0, 50) is None  # below every sync: the caller falls back
    assert store.translate("orders", 0, 50, Translation(7, 3)) == Translation(7, 3)
    assert store.translate("orders", 1, 50) is None


def test_a_replayed_batch_moves_translation_to_the_newer_copy_and_old_history_thins_but_stays():
    store = SyncStore()
    store.record("t", 0, 9, 9)
    store.record("t", 0, 19, 19)
    store.record("t", 0, 19, 29)  # the same batch written again after a retry
    assert store.translate("t", 0, 20) == Translation(30, 0)
    for i in range(1, 10 * DENSE_SYNCS):
        store.record("t", 0, 19 + 10 * i, 29 + 10 * i)
    assert len(store._syncs[("t", 0)]) <= 2 * DENSE_SYNCS
    far_behind = store.translate("t", 0, 25)  # a lagging group still translates, with a longer re-read
    assert far_behind is not None and far_behind.downstream_offset <= 30 + 5
