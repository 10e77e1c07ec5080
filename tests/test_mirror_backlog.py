"""A backlog behind a slow target: batches no larger than the flow's bound, each planned and committed once (none
retried), bounded memory, every record byte-exact, and a SIGTERM in the middle of a batch that stops after it commits.

The target is a cluster of its own with a broker quota on produce (`producer_byte_rate`), as a busy or throttled
target is. Before batches were bounded, the first batch was the whole backlog and its tail timed out in the
producer's queue, so the batch failed, was planned again, and never committed. No batch size reaches that timeout
now: the writer's producer queue is bounded (spark_app/outbox.py), so a record's delivery timeout starts at most a
queue's worth of writes before it is sent, whatever the batch holds. What the bound still buys is what a stop, a
topic-set change or a retry costs: one batch, not the whole backlog (spark_app/config.py). So the backlog is sized to
that: a few batches of a bound set here, each a few seconds behind the quota, so the SIGTERM lands inside one after
the first and the next run starts in the middle of the backlog.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time

from confluent_kafka import TopicPartition

from bench.testbed import clients
from bench.testbed.clients import create_topics
from bench.testbed.kafka_cluster import KafkaCluster, ListenerKind
from bench.testbed.ports import free_port
from bench.testbed.proc import TreeMonitor
from spark_app.clients import watermarks
from spark_app.config import STOP_GRACE_S
from tests.support.batches import batch_in_flight, checkpoint_logs
from tests.support.mirror_config import one_flow_config

RECORDS = 400_000
PER_BATCH = 100_000  # the flow's max_records_per_trigger: four batches of about 7 MB
PARTITIONS = 4
RATE = 2 << 20  # the target's produce quota, bytes/s: a few seconds a batch
PEAK_RSS_BOUND = 3.5e9  # the mirror's whole process tree (driver JVM, Python driver and workers), bytes


def produce_backlog(cluster: KafkaCluster, topic: str) -> dict[int, str]:
    """RECORDS records with explicit timestamps, spread over the partitions; each partition's digest."""
    producer = clients.producer(cluster.client, {"linger.ms": "20", "batch.size": "1000000"})
    digests = {p: hashlib.sha256() for p in range(PARTITIONS)}
    now = int(time.time() * 1000)
    for i in range(RECORDS):
        p, key, value = i % PARTITIONS, f"k{i}".encode(), f"value-{i:010d}-{'x' * 24}".encode()
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=p, timestamp=now + i // 1000)
                break
            except BufferError:
                producer.poll(0.1)
        digests[p].update(record_bytes(key, value, now + i // 1000))
    assert producer.flush(120) == 0
    return {p: d.hexdigest() for p, d in digests.items()}


def record_bytes(key: bytes | None, value: bytes | None, timestamp: int) -> bytes:
    return b"%d|%s|%s|%d;" % (len(key or b""), key or b"", value or b"", timestamp)


def read_digests(cluster: KafkaCluster, topic: str) -> tuple[dict[int, str], dict[int, int]]:
    """Each partition's digest and record count, read to its end."""
    consumer = clients.consumer(cluster.client, "backlog-check", {"enable.auto.commit": False})
    ends = {p: watermarks(consumer, topic, p)[1] for p in range(PARTITIONS)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    digests, counts = {p: hashlib.sha256() for p in range(PARTITIONS)}, dict.fromkeys(range(PARTITIONS), 0)
    deadline = time.monotonic() + 300
    while any(counts[p] < ends[p] for p in counts):
        assert time.monotonic() < deadline, f"reading back stalled at {counts} of {ends}"
        for msg in consumer.consume(10_000, 1.0):
            if msg.error() is None:
                p = msg.partition()
                digests[p].update(record_bytes(msg.key(), msg.value(), msg.timestamp()[1]))
                counts[p] += 1
    consumer.close()
    return {p: d.hexdigest() for p, d in digests.items()}, counts


def test_a_backlog_behind_a_throttled_target_lands_byte_exact_in_bounded_batches_none_retried(
    own_cluster, plaintext_cluster, mirror_cli, tmp_path, unique
):
    target = own_cluster(f"throttled-{unique[-8:]}", ListenerKind.PLAINTEXT)
    target.limit_producers(RATE)
    topic = f"backlog-{unique}"
    create_topics(plaintext_cluster.admin, {topic: PARTITIONS})
    create_topics(target.admin, {f"onprem.{topic}": PARTITIONS})
    sent = produce_backlog(plaintext_cluster, topic)
    ckpt = tmp_path / "ckpt"
    config = one_flow_config(plaintext_cluster, target, [topic], ckpt, emit_heartbeats=False,
                             metrics_port=free_port(), max_records_per_trigger=PER_BATCH)  # fmt: skip
    command = mirror_cli.command(mirror_cli.config_file(config), "--available-now", "--master", "local[2]")
    log = (tmp_path / "run.log").open("w")
    started = time.monotonic()
    peaks, stopped_in = [], 0.0
    for run in ("until SIGTERM", "the rest"):
        proc = subprocess.Popen(command, env=mirror_cli.env, stdout=log, stderr=subprocess.STDOUT)
        monitor = TreeMonitor(proc.pid)
        try:
            if run == "until SIGTERM":  # in the middle of a batch after the first (bounded by the mean record size)
                while (batch_in_flight(ckpt) or 0) < 1 and proc.poll() is None:
                    time.sleep(0.1)
                assert proc.poll() is None, "the run ended before its second batch"
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                rc = proc.wait(timeout=STOP_GRACE_S)  # then Kubernetes would SIGKILL it
                stopped_in = time.monotonic() - signalled
                left_at = batch_in_flight(ckpt)
            else:
                rc = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
            peaks.append(monitor.stop()[1])
        assert rc == 0, (run, (tmp_path / "run.log").read_text()[-3000:])
    log.close()
    peak_mb = max(peaks)
    took = time.monotonic() - started
    # The batch in flight at SIGTERM committed before the run exited: none was left for the next run to repeat.
    assert left_at is None, f"batch {left_at} was planned and left uncommitted by the SIGTERM'd run"

    got, counts = read_digests(target, f"onprem.{topic}")
    assert sum(counts.values()) == RECORDS, counts  # none lost, none written twice (a retried or cut batch would)
    assert got == sent  # byte-exact, in order, per partition
    ends, committed = checkpoint_logs(ckpt)
    batches = sorted(ends)
    assert batches == sorted(committed), (batches, committed)  # every planned batch committed once: none replanned
    sizes, before = [], dict.fromkeys(map(str, range(PARTITIONS)), 0)
    for batch in batches:
        after = ends[batch][topic]
        sizes.append(sum(after[p] - before[p] for p in before))
        before = after
    assert sum(sizes) == RECORDS and max(sizes) <= PER_BATCH, sizes  # bounded: no batch took more than its share
    assert peak_mb * 1e6 < PEAK_RSS_BOUND, peak_mb
    print(f"backlog: {RECORDS:,} records in batches of {sizes}, {took:.0f} s behind a {RATE >> 20} MiB/s quota,"
          f" peak RSS {peak_mb:,.0f} MB; SIGTERM in batch 1 stopped the run in {stopped_in:.1f} s,"
          " 0 copied twice")  # fmt: skip
