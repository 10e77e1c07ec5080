"""The local demo: mirror an MSK-like source into an Event Hubs-like target with the real CLI, then check it.

It starts both clusters on loopback, produces sample traffic on a few topics, pre-creates the target event hubs
(as infra does through ARM), runs `mirrorkit run --available-now`, and prints what was mirrored, the lag
left and a byte-exact comparison. Run it with `bash .ci/demo`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.testbed.clients import Record, by_partition, create_topics, produce, read_all
from bench.testbed.kafka_cluster import ListenerKind
from bench.testbed.testbed import TestBed

from .mirror_config import one_flow_config

TOPICS = {"orders": 4, "payments": 2, "audit": 1}
PER_TOPIC = 5_000


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
        create_topics(target.admin, {f"msk.{t}": p for t, p in TOPICS.items()})  # what infra makes through ARM
        print(f"produced {PER_TOPIC} records on each of {', '.join(TOPICS)}")

        config = one_flow_config(
            source, target, list(TOPICS), work / "checkpoint", source_alias="msk", target_alias="eh"
        )
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
            got = read_all(target.client, f"msk.{topic}", expected=len(records))
            exact = by_partition(got) == by_partition(records)
            all_exact &= exact
            size = sum(len(r.key or b"") + len(r.value or b"") for r in got)
            lag = len(records) - len(got)
            print(f"{topic:14} {'msk.' + topic:16} {len(got):>8} {size:>10} {lag:>4}  {'yes' if exact else 'NO'}")
        print("\nkey, value, headers, partition, order and timestamp identical:", "yes" if all_exact else "NO")
        return 0 if all_exact else 1
    finally:
        bed.close()


if __name__ == "__main__":
    raise SystemExit(main())
