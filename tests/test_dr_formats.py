"""MM2's own classes read the records the DR loop writes; translation never lands past an unread record."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from bench.testbed.kafka_cluster import kafka_classpath
from spark_app.dr.formats import Checkpoint, Heartbeat, OffsetSync

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
        OffsetSync("orders", 11, 2**40, 5, slot=3, last_offset=2**40 + 7),
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


def test_an_offset_sync_in_mirrormakers_own_layout_reads_as_a_run_of_one_record():
    """What an older mirror wrote (MM2's key and value, no slot, no run end; or a slot but no kind) still loads after
    an upgrade, as a mirrored run."""
    mm2_key = OffsetSync("orders", 11, 0, 0).key()[:-5]
    mm2_value = OffsetSync("orders", 11, 99, 40).value()[:16]
    assert OffsetSync.decode(mm2_key, mm2_value) == OffsetSync("orders", 11, 99, 40, slot=-1, last_offset=None)
    slotted_key = OffsetSync("orders", 11, 0, 0, slot=3, kind=1).key()[:-1]
    assert OffsetSync.decode(slotted_key, mm2_value) == OffsetSync("orders", 11, 99, 40, slot=3, kind=0)
