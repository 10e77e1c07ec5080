"""The report channel's key on a Spark standalone cluster with Spark's authentication on, as a platform secures one:
a task on an executor finds Spark's secret where Spark put it (its executor's environment, which its Python worker
inherits), derives the run's key and passes the driver's challenge, though its closure carries no key.

The session's standalone cluster runs with `spark.authenticate` and its secret in a spark-defaults.conf only this user
can read (bench/testbed/spark_standalone.py). The driver runs in a process of its own: a test process may hold the
session's local Spark already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parent.parent

# The driver: a channel listener, one task that connects back with the run's KeySource alone, and what it saw.
DRIVER = r"""
import json, os, sys, threading
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from spark_app import channel

spark = SparkSession.builder.master(sys.argv[1]).appName("mirrorkit-channel-key").getOrCreate()
secret = spark.sparkContext._jvm.org.apache.spark.SparkEnv.get().securityManager().getSecretKey()
source = channel.KeySource("a-run-on-a-cluster")
key = channel.run_key(secret.encode(), source.run)
listener = channel.Listener()
address, carried = ("127.0.0.1", listener.port), source.encode()
heard = []


def serve():
    with channel.challenge(listener.accept(), key) as conn:
        heard.append(conn.recv())
        conn.send("heard you")


def task(_rows):
    import os
    from spark_app import channel as task_channel

    with task_channel.connect(address, carried) as conn:
        conn.send(["hello", task_channel.SPARK_SECRET_ENV in os.environ, os.getpid()])
        yield conn.recv()


server = threading.Thread(target=serve, daemon=True)
server.start()
answer = spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()
server.join(60)
closure = cloudpickle.dumps(task)
print(json.dumps({
    "answer": answer,
    "heard": heard,
    "driver_pid": os.getpid(),
    "closure_has_a_secret": secret.encode() in closure or key in closure or key.hex().encode() in closure,
}))
spark.stop()
"""


def test_a_task_on_an_authenticated_cluster_finds_the_channels_key_through_sparks_own_secret(spark_standalone):
    driver_env = os.environ | spark_standalone.driver_env | {
        "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, spark_standalone.master_url],
        env=driver_env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["answer"] == ["heard you"], said
    (hello,) = said["heard"]
    assert hello[0] == "hello"
    assert hello[1] is True, "Spark put its secret in the executor's environment, and its Python worker has it"
    assert hello[2] != said["driver_pid"], "the task ran in an executor's Python worker, not the driver's process"
    assert said["closure_has_a_secret"] is False
