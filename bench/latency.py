"""End-to-end replication latency at a steady rate: a probe producer on the source, a probe consumer on the target.

The producer sends records at a fixed rate, round-robin over every source partition, each stamped with its send
time as CreateTime (the first 8 bytes of the value carry it too); the key is the record's sequence number. The
consumer reads the candidate's target topics from the start and takes, per record, its receive wall time minus the
target record's timestamp: both mirrors keep CreateTime, so that is the send time. The consumer checks it against
the value, so a candidate that restamps records is reported, not measured. It reads with the `isolation` it is given
(`isolation.level`), never librdkafka's default (read_committed): an exactly-once candidate's records reach a
read_committed reader only when their transaction commits, and that wait is part of the latency such readers see.

Producer and consumer each run in their own spawned process, so neither waits on the other's GIL or on the
caller's /proc sampler, and both read this machine's one clock. Timestamps have 1 ms resolution, and the probe
producer's own send (linger 1 ms, acks=all) is part of each figure, as it is of any producer's view.

`measure` expects the candidate already started: it sends one warm-up record to each source partition, waits until
all have arrived (the candidate is copying), then runs the load. Records sent during the first `warmup_s` seconds
of the load are not counted, so start-up effects (first batches, JIT) stay out of the figures.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from array import array
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.sharedctypes import Synchronized
from typing import Any, cast

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, TopicPartition

from bench.testbed import clients as kafka_clients
from bench.testbed.clients import plaintext

WARMUP_KEY = b"warm-up"
SPAWN = multiprocessing.get_context("spawn")


def _slots(topics: list[str], partitions: int) -> list[tuple[str, int]]:
    return [(t, p) for t in topics for p in range(partitions)]


def _produce(bootstrap: str, topics: list[str], partitions: int, rate: float, total: int, size: int,
             conn: Connection) -> None:  # fmt: skip
    """Send `total` records at `rate` per second; report the load's wall-clock span and what was delivered."""
    failed = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal failed
        failed += err is not None

    producer = kafka_clients.producer(
        plaintext(bootstrap),
        {"linger.ms": 1, "enable.idempotence": True}
        | {"queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576},
    )
    slots = _slots(topics, partitions)
    pad = os.urandom(max(size - 8, 0))  # incompressible, like most payloads
    start, first = time.perf_counter(), time.time()
    conn.send(first)
    for seq in range(total):
        ahead = start + seq / rate - time.perf_counter()
        if ahead > 0.002:  # sleeping per record would cost more than it paces; bursts of ~2 ms are fine
            time.sleep(ahead)
        topic, partition = slots[seq % len(slots)]
        ts = int(time.time() * 1000)
        while True:
            try:
                producer.produce(topic, key=seq.to_bytes(8, "big"), value=ts.to_bytes(8, "big") + pad,
                                 partition=partition, timestamp=ts, on_delivery=on_delivery)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    last = time.time()
    left = producer.flush(120)
    conn.send({"first": first, "last": last, "sent": total - failed - left, "failed": failed + left})


def _consume(bootstrap: str, topics: list[str], partitions: int, total: int, isolation: str, warm: Synchronized,
             conn: Connection) -> None:  # fmt: skip
    """Read the target topics from the start at `isolation`; per load record keep its sequence number, send time and
    latency.

    Stops when told how many records were delivered and all have arrived, or after `quiet_s` with no new record.
    """
    consumer = kafka_clients.consumer(
        plaintext(bootstrap),
        f"latency-probe-{os.getpid()}",
        {"enable.auto.commit": False, "isolation.level": isolation},
    )
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in _slots(topics, partitions)])
    conn.send("assigned")
    seqs, sent_ms, latency_ms = array("q"), array("q"), array("d")
    got = bytearray(total)
    unique = restamped = 0
    warm_partitions: set[tuple[str | None, int | None]] = set()
    expected: int | None = None
    quiet_s = 0.0
    last_new = time.monotonic()
    while True:
        msg = consumer.poll(0.05)
        now_ms = time.time() * 1000
        if msg is not None and msg.error() is None:
            key, value = cast(bytes, msg.key()), cast(bytes, msg.value())  # the probe sends both in every record
            if key == WARMUP_KEY:
                warm_partitions.add((msg.topic(), msg.partition()))
                warm.value = len(warm_partitions)
                continue
            kind, ts = msg.timestamp()
            seq = int.from_bytes(key, "big")
            seqs.append(seq)
            sent_ms.append(ts)
            latency_ms.append(now_ms - ts)
            restamped += kind != TIMESTAMP_CREATE_TIME or int.from_bytes(value[:8], "big") != ts
            if not got[seq]:
                got[seq] = 1
                unique += 1
                last_new = time.monotonic()
            if len(seqs) % 1000:
                continue
        if expected is None and conn.poll():
            expected, quiet_s = conn.recv()
            last_new = time.monotonic()
        if expected is not None and (unique >= expected or time.monotonic() - last_new > quiet_s):
            break
    consumer.close()
    conn.send(
        {"seqs": seqs.tobytes(), "sent_ms": sent_ms.tobytes(), "latency_ms": latency_ms.tobytes()}
        | {"restamped": restamped}
    )


def _receive(conn: Connection, proc: BaseProcess, timeout: float, what: str) -> Any:
    """The next message from a probe process; fails at once if the process died instead of waiting out `timeout`."""
    deadline = time.monotonic() + timeout
    while not conn.poll(1):
        if not proc.is_alive():
            raise RuntimeError(f"the probe {what} exited with code {proc.exitcode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the probe {what} did not answer in {timeout:.0f}s")
    return conn.recv()


def _wait_warm(warm: Synchronized, slots: int, alive: Callable[[], bool], timeout: float) -> float:
    """Seconds until a warm-up record arrived on every partition; raises if the candidate dies or never copies."""
    began = time.monotonic()
    while warm.value < slots:
        if not alive():
            raise RuntimeError("the candidate exited before copying the warm-up records")
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"warm-up records copied on {warm.value} of {slots} partitions in {timeout:.0f}s")
        time.sleep(0.1)
    return time.monotonic() - began


def measure(source: str, target: str, source_topics: list[str], target_topics: list[str], partitions: int,
            rate: float, seconds: float, warmup_s: float, size: int, isolation: str,
            cpu: Mapping[str, Callable[[], float]], alive: Callable[[], bool], timeout: float,
            quiet_s: float = 30.0) -> dict:  # fmt: skip
    """Latency figures of the candidate copying `source_topics` to `target_topics` (same order, same partitions),
    read at `isolation` (read_committed or read_uncommitted).

    `cpu` reads CPU seconds so far, by name (the candidate's `cpu_s`, and each broker's): the result has each over
    the measured window (the load after the warm-up period). `alive` says whether the candidate still runs.
    """
    total = int(rate * seconds)
    warm = SPAWN.Value("i", 0)
    to_consumer, consumer_end = SPAWN.Pipe()
    consumer = SPAWN.Process(
        target=_consume, args=(target, target_topics, partitions, total, isolation, warm, consumer_end), daemon=True
    )
    consumer.start()
    producer: BaseProcess | None = None
    try:
        _receive(to_consumer, consumer, 60, "consumer")
        warmup = kafka_clients.producer(plaintext(source))
        for topic, partition in _slots(source_topics, partitions):
            warmup.produce(topic, key=WARMUP_KEY, value=b"", partition=partition)
        if warmup.flush(30):
            raise RuntimeError("the warm-up records were not delivered to the source")
        ready_s = _wait_warm(warm, partitions * len(source_topics), alive, timeout)

        from_producer, producer_end = SPAWN.Pipe()
        producer = SPAWN.Process(
            target=_produce, args=(source, source_topics, partitions, rate, total, size, producer_end), daemon=True
        )
        producer.start()
        first = _receive(from_producer, producer, 60, "producer")
        time.sleep(max(0.0, first + warmup_s - time.time()))
        cpu_before = {name: read() for name, read in cpu.items()}
        load = _receive(from_producer, producer, seconds + 180, "producer")
        cpu_window = {name: read() - cpu_before[name] for name, read in cpu.items()}
        to_consumer.send((load["sent"], quiet_s))
        got = _receive(to_consumer, consumer, timeout, "consumer")
    finally:
        for proc in (producer, consumer):
            if proc is not None:
                proc.join(10)
                if proc.is_alive():
                    proc.kill()
    return summarize(load, got, warmup_s, ready_s, cpu_window, rate, seconds)


def summarize(load: dict, got: dict, warmup_s: float, ready_s: float, cpu_window: Mapping[str, float], rate: float,
              seconds: float) -> dict:  # fmt: skip
    """Percentiles over each record's first arrival, for records sent after the warm-up period."""
    seqs = np.frombuffer(got["seqs"], dtype=np.int64)
    sent_ms = np.frombuffer(got["sent_ms"], dtype=np.int64)
    latency = np.frombuffer(got["latency_ms"], dtype=np.float64)
    _, first = np.unique(seqs, return_index=True)
    window_start_ms = (load["first"] + warmup_s) * 1000
    measured = latency[first][sent_ms[first] >= window_start_ms]
    figures = dict.fromkeys(("p50_ms", "p99_ms", "p999_ms", "max_ms"))
    if measured.size:
        values = [*np.percentile(measured, [50, 99, 99.9]), measured.max()]
        figures = {k: round(float(v), 1) for k, v in zip(figures, values, strict=True)}
    span = max(load["last"] - load["first"], 1e-3)
    result = {
        "rate": rate,
        "seconds": seconds,
        "warmup_s": warmup_s,
        "ready_s": round(ready_s, 1),
        "send_rate": round((load["sent"] + load["failed"]) / span),
        "sent": load["sent"],
        "send_failed": load["failed"],
        "received": int(first.size),
        "duplicates": int(seqs.size - first.size),
        "measured": int(measured.size),
        "restamped": got["restamped"],
        **figures,
        "window_s": round(load["last"] - load["first"] - warmup_s, 1),
        **{name: round(seconds_, 1) for name, seconds_ in cpu_window.items()},
    }
    problems = []
    if result["received"] != result["sent"]:
        problems.append(f"received {result['received']:,} of {result['sent']:,} sent")
    if load["failed"]:
        problems.append(f"{load['failed']:,} probe records not delivered to the source")
    if got["restamped"]:
        problems.append(f"{got['restamped']:,} records arrived without their send time as CreateTime")
    if problems:
        result["warning"] = "; ".join(problems)
    return result
