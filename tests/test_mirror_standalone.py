"""The mirror on a Spark standalone cluster, its copies made on executor JVMs of their own, one of them lost mid-batch.

A multi-topic backlog is copied byte-exact (key, value, headers, partition, timestamp). A worker SIGKILLed while a
batch is writing loses its executor and the task it ran; Spark runs that task again on the other executor, which
writes the range again from its start, so no record is lost and each partition's first copies keep the source order.
"""

from __future__ import annotations

import os
import subprocess
import time

from bench.testbed.clients import Record, create_topics, end_offsets, produce, read_all
from bench.testbed.ports import free_port
from bench.testbed.spark_standalone import running_tasks
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.batches import Offsets, batch_in_flight, checkpoint_logs
from tests.support.mirror_config import one_flow_config

# 120,000 records, about 60 MB, in batches of about 32,000 records (16 MB), into a target whose broker lets producers
# write 2 MB/s: a batch writes for about 8 s, every partition's range a little at a time (1 MB produce requests), so
# its tasks are all in the middle of their writes for a while.
TOPICS, PARTITIONS, PER_PARTITION, BATCH, TARGET_BYTES_PER_S = 3, 2, 20_000, 32_000, 2_000_000


def backlog(topic: str) -> list[Record]:
    """Records of every shape: null keys, tombstones, headers with null values, sizes from 0 to 1 KB."""
    now = int(time.time() * 1000)
    return [
        Record(
            i % PARTITIONS,
            None if i % 7 == 0 else f"{topic}-k{i}".encode(),
            None if i % 11 == 0 else os.urandom(i % 1024),
            (("n", str(i).encode()), ("empty", None), ("n", b"again")),
            now + i,
        )
        for i in range(PARTITIONS * PER_PARTITION)
    ]


def partly_written(start: Offsets, end: Offsets, landed: dict[tuple[str, int], int]) -> list[tuple[str, str]]:
    """The batch's ranges (from `start` to `end`) that have landed some of their records and have a tenth or more
    still to write: enough left that the task is still writing when the kill lands, a moment later."""
    return [
        (t, p)
        for t, ends in end.items()
        for p, e in ends.items()
        if start[t][p] < landed[(f"onprem.{t}", int(p))] < e - (e - start[t][p]) // 10
    ]


def test_a_standalone_cluster_copies_a_backlog_byte_exact_and_survives_a_worker_killed_mid_batch(
    spark_standalone, plaintext_cluster, own_cluster, mirror_cli, tmp_path, unique
):
    target_cluster = own_cluster(f"standalone-{unique[-8:]}", "plaintext")  # its own: it is throttled
    target_cluster.limit_producers(TARGET_BYTES_PER_S)
    topics = [f"standalone-{n}-{unique}" for n in range(TOPICS)]
    remote = {t: f"onprem.{t}" for t in topics}
    targets = [(r, p) for r in remote.values() for p in range(PARTITIONS)]
    sent = {t: backlog(t) for t in topics}
    create_topics(plaintext_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_topics(target_cluster.admin, dict.fromkeys(remote.values(), PARTITIONS))  # so they can be watched early
    for topic, records in sent.items():
        produce(plaintext_cluster.client, topic, records)
    checkpoint = tmp_path / "ckpt"
    config = one_flow_config(
        plaintext_cluster, target_cluster, topics, checkpoint, emit_heartbeats=False, max_records_per_trigger=BATCH
    )
    command = mirror_cli.command(
        mirror_cli.config_file(config), "--available-now", "--master", spark_standalone.master_url
    )
    ui_port = free_port()  # the driver's, for its REST API: which executor runs which task
    env = (
        mirror_cli.env
        | spark_standalone.driver_env
        | {
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_SUBMIT_ARGS": f"--conf spark.ui.enabled=true --conf spark.ui.port={ui_port} pyspark-shell",
        }
    )
    with open(tmp_path / "driver.log", "w+") as out:
        driver = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            # Wait for a batch after the first (executors warm) that has written part of its ranges, so its tasks
            # are in the middle of their writes (a task ends once all its records landed). Then SIGKILL the worker
            # that runs one of them.
            killed_in = None
            while killed_in is None and driver.poll() is None:
                time.sleep(0.05)
                batch = batch_in_flight(checkpoint)
                if not batch:
                    continue
                offsets, _ = checkpoint_logs(checkpoint)
                try:
                    running = running_tasks(ui_port)
                    landed = end_offsets(target_cluster.client, targets)
                    if not running or not partly_written(offsets[batch - 1], offsets[batch], landed):
                        continue
                    busy = spark_standalone.cores_used()
                    killed = spark_standalone.worker_of(running[0])
                except OSError:  # a web UI did not answer in time (a busy machine): look again
                    continue
                spark_standalone.kill_worker(killed)
                killed_in = batch
            assert killed_in is not None, f"the run ended before a batch could be interrupted:\n{_tail(out)}"
            code = driver.wait(300)
        finally:
            if driver.poll() is None:
                driver.kill()
            if killed_in is not None:
                spark_standalone.start_worker(killed)  # the session's cluster stays whole for later tests
        output = _tail(out)
    assert busy == [1, 1], f"the copy did not run on both workers' executors (cores in use: {busy})"
    assert code == 0, output
    offsets, commits = checkpoint_logs(checkpoint)
    assert killed_in in commits and len(commits) >= 3, f"batches committed: {sorted(commits)}"
    repeats = 0
    for topic, records in sent.items():
        got = read_all(target_cluster.client, remote[topic], expected=len(records), timeout_s=60, exact=False)
        assert_each_record_once_in_order(remote[topic], got, records, at_least_once=True)
        repeats += len(got) - len(records)
    # Usually the killed task had written part of its ranges and its retry wrote them again from their start; on a
    # busy machine the task may have finished between the look and the kill, so repeats are reported, not required.
    print(f"worker killed during batch {killed_in} of {len(commits)}; {repeats} record(s) written again, none lost")


def _tail(out) -> str:
    out.flush()
    out.seek(0)
    return out.read()[-4000:]
