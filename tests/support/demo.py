"""The local demo: mirror an MSK-like source into an Event Hubs-like target with the real CLI, then check it.

It starts both clusters on loopback, produces sample traffic on a few topics, commits a consumer group's offsets on
the source, makes the target's event hubs as infra would through ARM (the copies and the mirror's own hubs, planned
by infra's `plan_hubs` from the same config), runs `mirrorkit run --available-now`, and prints what was mirrored, the
lag left, a byte-exact comparison and the group's checkpoints on the target. Run it with `bash .ci/demo`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.testbed.clients import Record, by_partition, commit, create_topics, produce, read_all
from bench.testbed.kafka_cluster import KafkaCluster, ListenerKind
from bench.testbed.testbed import TestBed
from infra.hubs import HubSpec, plan_hubs
from infra.schema import ClusterSpec
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr.internal import read_checkpoints
from spark_app.policy import target_topic

from .mirror_config import one_flow_config

TOPICS = {"orders": 4, "payments": 2, "audit": 1}
PER_TOPIC = 5_000
GROUP = ("billing", "orders")  # a consumer group of the source, halfway through this topic


def sample(topic: str, partitions: int) -> list[Record]:
    now = int(time.time() * 1000)
    return [
        Record(
            i % partitions,
            None if i % 9 == 0 else f"{topic}-{i}".encode(),
            None if i % 13 == 0 else f'{{"{topic}": {i}, "pad": "{"x" * 200}"}}'.encode(),
            (("trace-id", os.urandom(8)), ("region", b"eu-west-1")),
            now - 60_000 + i,
        )
        for i in range(PER_TOPIC)
    ]


def hubs_infra_makes(mirror: MirrorConfig, source: KafkaCluster) -> list[HubSpec]:
    """The event hubs infra would make on the flow's target for this config, the copies sized like the source
    topics (the stack's `topics` key of the source cluster)."""
    (flow,) = mirror.flows
    sizes = {t: {"partitions": p} for t, p in TOPICS.items()}
    kafka = {"bootstrap_servers": source.client.bootstrap_servers}
    spec = ClusterSpec.model_validate({"alias": flow.source, "region": "local", "kafka": kafka, "topics": sizes})
    return plan_hubs(mirror, [spec], flow.target)


def main() -> int:
    bed = TestBed()
    work = Path(tempfile.mkdtemp(prefix="mirrorkit-demo-"))
    try:
        source = bed.start("msk-demo", ListenerKind.MSK_SCRAM)
        target = bed.start("eventhubs-demo", ListenerKind.EVENTHUBS)
        for cluster in (source, target):
            print(
                f"{cluster.kind.value:10} {cluster.client.bootstrap_servers:22} profile {cluster.client.profile.value}"
            )

        create_topics(source.admin, TOPICS)
        sent = {t: sample(t, p) for t, p in TOPICS.items()}
        for topic, records in sent.items():
            produce(source.client, topic, records)
        print(f"produced {PER_TOPIC} records on each of {', '.join(TOPICS)}")
        group, read = GROUP
        halfway = {p: PER_TOPIC // TOPICS[read] // 2 for p in range(TOPICS[read])}
        commit(source.client, group, read, halfway)
        print(f"group {group} committed {read} at {halfway}")

        config = one_flow_config(
            source, target, list(TOPICS), work / "checkpoint", source_alias="msk", target_alias="eh"
        )
        mirror = parse_config(config)
        (flow,) = mirror.flows
        for hub in hubs_infra_makes(mirror, source):
            compacted = {"cleanup.policy": "compact"} if hub.compacted else None
            create_topics(target.admin, {hub.name: hub.partitions}, compacted)
            kind = "the mirror's own" + (", compacted" if hub.compacted else "") if hub.own else "a copy"
            print(f"event hub {hub.name:36} {hub.partitions} partition(s), {kind}: as infra makes it")
        config_file = work / "mirror.yaml"
        config_file.write_text(yaml.safe_dump(config))
        env = os.environ | {
            "PYSPARK_PYTHON": sys.executable,
        }
        began = time.monotonic()
        mirrorkit = Path(sys.executable).parent / "mirrorkit"  # the console script set-up installed
        cmd = [str(mirrorkit), "run", "--config", str(config_file), "--available-now"]
        run = subprocess.run([*cmd, "--master", "local[2]"], env=env, capture_output=True, text=True)
        took = time.monotonic() - began
        for line in run.stderr.splitlines():
            if " spark_app" in line or "error:" in line:
                print("  " + line.split(" ", 2)[-1])
        if run.returncode != 0:
            print(f"the mirror failed with exit code {run.returncode}")
            return 1

        print(f"\nmirror run took {took:.1f}s (including Spark start-up)\n")
        print(f"{'source topic':14} {'target topic':16} {'records':>8} {'bytes':>10} {'lag':>4}  byte-exact")
        all_exact = True
        for topic, records in sent.items():
            copy = target_topic(flow, topic)
            got = read_all(target.client, copy, expected=len(records))
            exact = by_partition(got) == by_partition(records)
            all_exact &= exact
            size = sum(len(r.key or b"") + len(r.value or b"") for r in got)
            lag = len(records) - len(got)
            print(f"{topic:14} {copy:16} {len(got):>8} {size:>10} {lag:>4}  {'yes' if exact else 'NO'}")
        print("\nkey, value, headers, partition, order and timestamp identical:", "yes" if all_exact else "NO")

        checkpoints = {k: cp for k, (cp, _) in read_checkpoints(mirror, flow).items() if k[0] == group}
        print(f"\ncheckpoints of group {group} on the target (what `mirrorkit failover` would commit there):")
        for (_, topic, partition), cp in sorted(checkpoints.items()):
            print(f"  {topic}[{partition}]: source offset {cp.upstream_offset} -> target offset {cp.downstream_offset}")
        all_checkpointed = {(t, p) for _, t, p in checkpoints} == {(target_topic(flow, read), p) for p in halfway}
        print("a checkpoint for each partition the group committed:", "yes" if all_checkpointed else "NO")
        return 0 if all_exact and all_checkpointed else 1
    finally:
        bed.close()


if __name__ == "__main__":
    raise SystemExit(main())
