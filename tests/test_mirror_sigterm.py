"""SIGTERM as a pod gets it: to spark-submit's JVM, the mirror's Python driver its child, as the image starts it.

The batch in flight commits, the mirror exits 0 within the driver pod's grace period, and no batch is written twice:
the target then holds exactly the records the checkpoint says were copied, and a resumed run copies the rest once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

from bench.testbed.clients import Record, create_topics, end_offsets, produce, read_all
from bench.testbed.kafka_cluster import cluster_entry
from bench.testbed.ports import free_port
from spark_app.config import STOP_GRACE_S
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.batches import batch_in_flight, checkpoint_logs
from tests.support.mirror_cli import MirrorCli
from tests.support.mirror_config import one_flow_config

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = ROOT / "images" / "mirror" / "entrypoint.sh"
MAIN_FILE = ROOT / "images" / "mirror" / "main.py"
SPARK_HOME = Path(pyspark.__file__).parent  # the image's /opt/spark is the pyspark install too
PARTITIONS, PER_PARTITION, BATCH = 3, 20_000, 20_000  # a 120,000-record backlog over two topics, batches of ~20,000
SOURCE_KB_S = 2_000  # real time, per connection: two tasks take over 15 s to read the backlog's ~65 MB


def backlog(topic: str) -> list[Record]:
    now = int(time.time() * 1000)
    return [
        Record(i % PARTITIONS, f"{topic}-k{i}".encode(), os.urandom(200 + i % 600), (("n", str(i).encode()),), now + i)
        for i in range(PARTITIONS * PER_PARTITION)
    ]


def test_sigterm_to_spark_submit_commits_the_batch_in_flight_exits_0_and_writes_no_batch_twice(
    plaintext_cluster, target_cluster, mirror_cli, tmp_path, unique
):
    topics = [f"sigterm-a-{unique}", f"sigterm-b-{unique}"]
    sent = {t: backlog(t) for t in topics}
    targets = [(f"onprem.{t}", p) for t in topics for p in range(PARTITIONS)]
    create_topics(plaintext_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_topics(target_cluster.admin, {f"onprem.{t}": PARTITIONS for t in topics})  # Event Hubs: made by infra
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records)
    checkpoint = tmp_path / "ckpt"
    config = one_flow_config(
        plaintext_cluster, target_cluster, topics, checkpoint,
        emit_heartbeats=False, max_records_per_trigger=BATCH, metrics_port=free_port(),
    )  # fmt: skip
    path, command, env = driver_pod(mirror_cli, config)
    with open(tmp_path / "driver.log", "w+") as out, driver_running(command, env, out) as driver:
        # SIGTERM while a batch after the first is writing: Spark's own shutdown would cancel it half written.
        in_flight = None
        while in_flight is None and driver.poll() is None:
            time.sleep(0.05)
            batch = batch_in_flight(checkpoint)
            if batch:
                offsets, _ = checkpoint_logs(checkpoint)
                landed = sum(end_offsets(target_cluster.client, targets).values())
                if landed > sum(sum(ends.values()) for ends in offsets[batch - 1].values()):
                    in_flight = batch
        assert in_flight is not None, f"the mirror exited before a batch could be interrupted:\n{_tail(out)}"
        code, took = terminate_within_grace(driver, out)
        output = _tail(out)
    assert code == 0, output
    offsets, commits = checkpoint_logs(checkpoint)
    print(f"SIGTERM during batch {in_flight}; exit {code} after {took:.1f} s; batches committed: {sorted(commits)}")
    assert in_flight in commits, f"batch {in_flight}, in flight at SIGTERM, was not committed"
    assert set(offsets) == commits, "a batch was planned and left uncommitted: the next run would write it again"
    last = offsets[max(commits)]

    # The target holds exactly what the checkpoint says was copied, each record once: no batch written twice.
    for topic, records in sent.items():
        # Produced in order to an empty topic, round robin: record i sits at offset i // PARTITIONS.
        copied = [r for i, r in enumerate(records) if i // PARTITIONS < last[topic][str(r.partition)]]
        assert 0 < len(copied) < len(records), "SIGTERM came after the whole backlog was copied"
        got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(copied), timeout_s=60)
        assert_each_record_once_in_order(f"onprem.{topic}", got, copied)

    resume_copies_the_rest_once(mirror_cli, path, target_cluster, sent)


def test_sigterm_to_spark_submit_stops_real_time_tasks_after_they_flush_exits_0_and_copies_nothing_twice(
    plaintext_cluster, target_cluster, mirror_cli, tmp_path, unique
):
    """Real-time mode: each task flushes and reports before it ends, so the saved positions are exactly what
    landed, and a resumed run copies the rest once.

    The mirror reads the source through Toxiproxy, slowed to SOURCE_KB_S, so the stop lands mid-copy whatever the
    mirror's speed: a task notices a stop at its next report (within half a second), and unthrottled the compiled
    core copies the whole backlog in about that time."""
    topics = [f"rt-sigterm-a-{unique}", f"rt-sigterm-b-{unique}"]
    sent = {t: backlog(t) for t in topics}
    targets = [(f"onprem.{t}", p) for t in topics for p in range(PARTITIONS)]
    create_topics(plaintext_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_topics(target_cluster.admin, {f"onprem.{t}": PARTITIONS for t in topics})
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records)
    config = one_flow_config(
        cluster_entry(plaintext_cluster, "onprem", proxied=True), target_cluster, topics, tmp_path / "ckpt",
        emit_heartbeats=False, metrics_port=free_port(), mode="realtime",
    )  # fmt: skip
    path, command, env = driver_pod(mirror_cli, config)
    total = sum(len(r) for r in sent.values())
    plaintext_cluster.faults.bandwidth(SOURCE_KB_S)
    try:
        with open(tmp_path / "driver.log", "w+") as out, driver_running(command, env, out) as driver:
            landed = 0
            while not landed and driver.poll() is None:  # SIGTERM as soon as the tasks are copying
                time.sleep(0.02)
                landed = sum(end_offsets(target_cluster.client, targets).values())
            assert 0 < landed < total, f"SIGTERM could not land mid-copy ({landed} of {total}):\n{_tail(out)}"
            code, took = terminate_within_grace(driver, out)
            output = _tail(out)
    finally:
        plaintext_cluster.faults.heal()
    assert code == 0, output
    copied = sum(end_offsets(target_cluster.client, targets).values())
    print(f"real time: SIGTERM with {landed} of {total} landed; exit {code} after {took:.1f} s, {copied} on the target")
    assert copied < total, "SIGTERM came after the whole backlog was copied"
    resume_copies_the_rest_once(mirror_cli, path, target_cluster, sent)


@contextlib.contextmanager
def driver_running(command: list[str], env: dict[str, str], out) -> Iterator[subprocess.Popen]:
    """The driver pod's process, writing to `out`; killed with its children if it outlives the block."""
    driver = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        yield driver
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)


def driver_pod(cli: MirrorCli, config: dict) -> tuple[Path, list[str], dict[str, str]]:
    """The config file, command and environment of what the Spark Operator's driver pod runs: the image's entrypoint
    with `driver` and spark-submit's arguments."""
    path = cli.config_file(config)
    env = cli.env | {
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_DRIVER_BIND_ADDRESS": "127.0.0.1",  # the pod's IP, which Spark's Kubernetes backend sets
        "PYTHONPATH": str(ROOT),  # the image's PYTHONPATH=/opt/mirrorkit
    }
    submit = [str(ENTRYPOINT), "driver", "--master", "local[2]", "--class", "org.apache.spark.deploy.PythonRunner"]
    return path, cli.command(path, launcher=[*submit, str(MAIN_FILE)]), env


def terminate_within_grace(driver: subprocess.Popen, out) -> tuple[int, float]:
    """SIGTERM to spark-submit's JVM, as Kubernetes sends it; the exit code and the seconds it took."""
    cmdline = Path(f"/proc/{driver.pid}/cmdline").read_bytes().split(b"\0")
    assert b"org.apache.spark.deploy.SparkSubmit" in cmdline, "the signal must go to spark-submit's JVM"
    driver.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        code = driver.wait(STOP_GRACE_S)  # then Kubernetes would SIGKILL it
    except subprocess.TimeoutExpired:
        raise AssertionError(f"not stopped within the {STOP_GRACE_S} s grace period:\n{_tail(out)}") from None
    return code, time.monotonic() - signalled


def resume_copies_the_rest_once(cli: MirrorCli, path: Path, target_cluster, sent: dict[str, list[Record]]) -> None:
    """A resumed run (available-now) copies what the stopped one had not: every record once, in order."""
    resumed = subprocess.run(
        cli.command(path, "--available-now", "--master", "local[2]"),
        env=cli.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for topic, records in sent.items():
        got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(records), timeout_s=60)
        assert_each_record_once_in_order(f"onprem.{topic}", got, records)


def _tail(out) -> str:
    out.flush()
    out.seek(0)
    return out.read()[-4000:]
