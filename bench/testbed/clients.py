"""Small, strict Kafka client helpers for tests: create topics, produce, read back exactly, run Kafka's own tools."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .kafka_cluster import ClientSettings, kafka_classpath, require_java

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Record:
    """Everything a mirror must carry over, in a comparable form; where a read found it is not compared."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None
    offset: int | None = field(default=None, compare=False)  # set by `read_all`


def create_topics(admin: ClientSettings, topics: dict[str, int], config: dict[str, str] | None = None) -> None:
    _create(admin, [NewTopic(n, p, replication_factor=1, config=config or {}) for n, p in topics.items()])


def create_placed_topics(admin: ClientSettings, topics: dict[str, list[int]]) -> None:
    """Topics with replication factor 1 whose partition i lives on (is led by) broker `topics[name][i]`."""
    _create(admin, [NewTopic(n, len(bs), replica_assignment=[[b] for b in bs]) for n, bs in topics.items()])


def _create(admin: ClientSettings, new: list[NewTopic]) -> None:
    client = AdminClient(admin.librdkafka())
    for name, future in client.create_topics(new, operation_timeout=30, request_timeout=30).items():
        try:
            future.result()
        except KafkaException as err:
            raise AssertionError(f"could not create topic '{name}': {err}") from err


def produce(settings: ClientSettings, topic: str, records: Iterable[Record], **overrides: str) -> int:
    """Produce in order and wait for every delivery; any failed delivery fails the caller."""
    producer = Producer(settings.librdkafka() | {"linger.ms": "5", "enable.idempotence": "true"} | overrides)
    failures: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            failures.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    count = 0
    for r in records:
        kwargs = {"partition": r.partition, "key": r.key, "value": r.value, "on_delivery": on_delivery}
        if r.headers:
            kwargs["headers"] = list(r.headers)
        if r.timestamp_ms is not None:
            kwargs["timestamp"] = r.timestamp_ms
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    remaining = producer.flush(60)
    if remaining or failures:
        raise AssertionError(f"{remaining} record(s) undelivered, failures: {failures[:5]}")
    return count


def commit(settings: ClientSettings, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit a group's offsets (partition -> next offset to read) as its consumer would, without joining it."""
    consumer = Consumer(settings.librdkafka() | {"group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    consumer.close()


def read_all(
    settings: ClientSettings, topic: str, expected: int, timeout_s: float = 60.0, exact: bool = True
) -> list[Record]:
    """Read a topic from the beginning until `expected` records arrived; fail on timeout, or on excess if `exact`."""
    consumer = Consumer(
        settings.librdkafka()
        | {"group.id": f"reader-{topic}-{time.monotonic_ns()}", "enable.auto.commit": "false",
           "auto.offset.reset": "earliest", "enable.partition.eof": "true"}
    )  # fmt: skip
    metadata = consumer.list_topics(topic, timeout=15).topics[topic]
    if metadata.error is not None:
        consumer.close()
        raise AssertionError(f"topic '{topic}': {metadata.error}")
    partitions = sorted(metadata.partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records: list[Record] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                    if len(records) >= expected and at_eof >= set(partitions):
                        break
                    continue
                raise AssertionError(f"reading '{topic}': {msg.error()}")
            at_eof.discard(msg.partition())
            headers = tuple(msg.headers() or ())
            records.append(Record(msg.partition(), msg.key(), msg.value(), headers, msg.timestamp()[1], msg.offset()))
    finally:
        consumer.close()
    if len(records) < expected or (exact and len(records) != expected):
        raise AssertionError(f"'{topic}': expected {expected} records, read {len(records)} in {timeout_s}s")
    return records


def end_offsets(settings: ClientSettings, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s end offset (high watermark) right now."""
    consumer = Consumer(settings.librdkafka() | {"group.id": "end-offsets"})
    try:
        return {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=15)[1] for t, p in partitions}
    finally:
        consumer.close()


def by_partition(records: Sequence[Record]) -> dict[int, list[Record]]:
    grouped: dict[int, list[Record]] = {}
    for r in records:
        grouped.setdefault(r.partition, []).append(r)
    return grouped


def console_consume(settings: ClientSettings, topic: str, max_messages: int, timeout_s: int = 60) -> list[str]:
    """Read with Kafka's own Java console consumer; lines are `Partition:<p>\\t<headers>\\t<key>\\t<value>`."""
    with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as props:
        props.write("".join(f"{k}={v}\n" for k, v in settings.java().items()))
    try:
        cmd = [
            require_java(), "-Xmx256m", "-cp", kafka_classpath(),
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server", settings.bootstrap, "--topic", topic, "--from-beginning",
            "--max-messages", str(max_messages), "--timeout-ms", str(timeout_s * 1000),
            "--consumer.config", props.name,
            "--property", "print.partition=true",
            "--property", "print.headers=true",
            "--property", "print.key=true",
        ]  # fmt: skip
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + 60)
    finally:
        Path(props.name).unlink()
    if result.returncode != 0:
        raise AssertionError(f"console consumer failed ({result.returncode}):\n{result.stderr[:2000]}")
    return [line for line in result.stdout.splitlines() if line.startswith("Partition:")]
