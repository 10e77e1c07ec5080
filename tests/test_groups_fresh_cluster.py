"""A group's committed offsets are read on a cluster whose group coordinator is not settled yet, without the process
dying: librdkafka's admin OffsetFetch crashes (SIGSEGV) on NOT_COORDINATOR, which a just-started cluster answers."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.testbed.kafka_cluster import cluster_entry
from spark_app.config import ClusterConfig

READ = """
import json, sys
from spark_app.config import ClusterConfig
from spark_app.dr.groups import ClusterGroups
groups = ClusterGroups(ClusterConfig.model_validate(json.loads(sys.argv[1])))
print(json.dumps([len(groups.committed(f"app-{i}")) for i in range(5)]))
"""


def test_committed_offsets_on_a_just_started_cluster_are_read_and_the_process_lives(own_cluster, unique: str):
    """Right after the cluster started, in a process of its own (a crash must fail the test, not end the suite):
    five groups never seen read as holding nothing."""
    cluster = own_cluster(f"fresh-{unique[-6:]}", "plaintext")
    entry = ClusterConfig.model_validate(cluster_entry(cluster, "fresh")).model_dump_json()
    done = subprocess.run([sys.executable, "-c", READ, entry], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert json.loads(done.stdout) == [0, 0, 0, 0, 0]
