"""MM2's own classes read the records the DR loop writes and name the internal topics as the mirror does."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from bench.testbed.kafka_cluster import kafka_classpath
from spark_app.config import FlowConfig
from spark_app.dr.formats import Checkpoint, Heartbeat, OffsetSync
from spark_app.policy import (
    HEARTBEATS_TOPIC,
    checkpoints_topic,
    mm2_offset_syncs_topic,
    never_mirrored,
    offset_syncs_topic,
    should_mirror,
    target_topic,
)

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
System.out.println(OffsetSync.deserializeRecord(rec("%s", "%s")));
/exit
"""


NAMES = """
import org.apache.kafka.connect.mirror.*;
for (String line : new String[] {%s}) {
    String[] f = line.split(" ", -1);
    var policy = new DefaultReplicationPolicy();
    policy.configure(java.util.Map.of("replication.policy.separator", f[0],
                                      "replication.policy.internal.topic.separator.enabled", f[1]));
    System.out.println(String.join(" ", "names", policy.checkpointsTopic("src"), policy.offsetSyncsTopic("dst"),
        policy.offsetSyncsTopic("src"), policy.formatRemoteTopic("src", policy.heartbeatsTopic()),
        String.valueOf(policy.isInternalTopic(policy.checkpointsTopic("src")))));
}
/exit
"""


def jshell(script: str) -> subprocess.CompletedProcess:
    """Run a jshell script with Kafka's jars, MM2's among them, on the class path."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsh", delete=False) as f:
        f.write(script)
    try:
        return subprocess.run(
            ["jshell", "-J-Dfile.encoding=UTF-8", "-R-Dstdout.encoding=UTF-8", "--class-path", kafka_classpath(),
             f.name],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        Path(f.name).unlink()


def test_internal_topics_are_named_as_mirrormakers_own_policy_names_them_for_every_separator():
    """KIP-690: DefaultReplicationPolicy joins the checkpoints and offset-syncs names with the separator unless
    `replication.policy.internal.topic.separator.enabled` is false. With `offset-syncs.topic.location` source MM2
    names its syncs after the target (`offsetSyncsTopic("dst")`), with target after the source."""
    cases = [(sep, enabled) for sep in (".", "_", "-", "__") for enabled in (True, False)]
    out = jshell(NAMES % ", ".join(f'"{sep} {str(enabled).lower()}"' for sep, enabled in cases))
    mm2 = [line.split(" ")[1:] for line in out.stdout.splitlines() if line.startswith("names ")]
    ours = []
    for sep, enabled in cases:
        flow = FlowConfig(source="src", target="dst", topics={"include": ["orders"]}, checkpoint_location="/c",
                          separator=sep, internal_topic_separator=enabled)  # fmt: skip
        ours.append([checkpoints_topic(flow), mm2_offset_syncs_topic(flow, "source"),
                     mm2_offset_syncs_topic(flow, "target"), target_topic(flow, HEARTBEATS_TOPIC), "true"])  # fmt: skip
        mirrorkit = offset_syncs_topic(flow)  # on the target by default: after the source, with our prefix
        assert mirrorkit == mm2_offset_syncs_topic(flow, "target").replace("mm2-", "mirrorkit-", 1)
        for topic in (checkpoints_topic(flow), mirrorkit, mm2_offset_syncs_topic(flow, "source")):
            assert never_mirrored(topic, sep) and not should_mirror(flow, topic), topic
    assert mm2 == ours, out.stderr
    assert ours[2] == ["src_checkpoints_internal", "mm2-offset-syncs_dst_internal", "mm2-offset-syncs_src_internal",
                       "src_heartbeats", "true"]  # fmt: skip
    assert ours[3][:3] == ["src.checkpoints.internal", "mm2-offset-syncs.dst.internal", "mm2-offset-syncs.src.internal"]


def test_mirrormakers_own_classes_decode_our_checkpoint_heartbeat_and_offset_syncs():
    records = (
        Checkpoint("orders-app", "primary.orders", 3, 1234, 987, "mé"),
        Heartbeat("primary", "dr", 1_700_000_000_123),
        OffsetSync("orders", 11, 2**40, 5, slot=3, last_offset=2**40 + 7),
    )
    handed_back = OffsetSync("orders", 12, 77, 33).mm2_record()  # what `handback` writes for MM2
    parts = [part for r in records for part in (r.key().hex(), r.value().hex())] + [b.hex() for b in handed_back]
    out = jshell(DECODE % tuple(parts))
    lines = [line for line in out.stdout.splitlines() if "{" in line]
    assert lines == [
        "Checkpoint{consumerGroupId=orders-app, topicPartition=primary.orders-3, upstreamOffset=1234,"
        " downstreamOffset=987, metadata=mé}",
        "Heartbeat{sourceClusterAlias=primary, targetClusterAlias=dr, timestamp=1700000000123}",
        f"OffsetSync{{topicPartition=orders-11, upstreamOffset={2**40}, downstreamOffset=5}}",
        "OffsetSync{topicPartition=orders-12, upstreamOffset=77, downstreamOffset=33}",
    ], out.stderr
    assert OffsetSync.decode(*handed_back) == OffsetSync("orders", 12, 77, 33)
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
