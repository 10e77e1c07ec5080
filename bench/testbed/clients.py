"""The one place tests and benchmarks make Kafka clients, from the mirror's own cluster model (spark_app.config's
`ClusterConfig`) and profiles; and small, strict helpers on them: create topics, produce, read back exactly, run
Kafka's own tools.

Settings come from `spark_app.profiles.librdkafka_settings`, as the mirror's do; a caller's settings win over the
profile's, so a test can step outside it on purpose (a raised record cap, its own error callback). Java clients (Kafka's
console consumer, MirrorMaker 2's tools) get the same cluster in Java names through `java_settings`.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_app import clients
from spark_app.config import ClusterConfig, Profile, SecretRef
from spark_app.profiles import java_client, librdkafka_settings, read_secret

from .kafka_cluster import kafka_classpath, require_java

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


def plaintext(bootstrap: str, alias: str = "bench") -> ClusterConfig:
    """A cluster reached in PLAINTEXT at `bootstrap`, as a benchmark that has only the address names it."""
    return ClusterConfig(alias=alias, bootstrap_servers=bootstrap, profile=Profile.KAFKA)


def admin(cluster: ClusterConfig) -> AdminClient:
    """An AdminClient as the mirror makes it (spark_app.clients)."""
    return clients.admin(cluster)


def producer(cluster: ClusterConfig, settings: Mapping[str, object] | None = None) -> Producer:
    """A producer with the cluster's profile settings; `settings` win over the profile's."""
    return Producer(librdkafka_settings(cluster, "producer") | dict(settings or {}))


def consumer(cluster: ClusterConfig, group: str, settings: Mapping[str, object] | None = None) -> Consumer:
    """A consumer in `group` with the cluster's profile settings; `settings` win over the profile's."""
    return Consumer(librdkafka_settings(cluster, "consumer") | {"group.id": group} | dict(settings or {}))


def java_settings(cluster: ClusterConfig) -> dict[str, str]:
    """The cluster's client settings in the Java client's names (the mirror's JVM copier's, spark_app.profiles), with
    its SASL login in full, as in a .properties file."""
    java = java_client(cluster, "admin")
    if java is None:
        raise ValueError(f"cluster '{cluster.alias}': no Java settings for profile {cluster.profile.value}")
    conf = dict(java.settings)
    if (login := java.login) is not None:
        password = read_secret(SecretRef(env=login.env, file=login.file), f"cluster '{cluster.alias}'")
        conf["sasl.jaas.config"] = f'{login.module} required username="{login.username}" password="{password}";'
    return conf


def create_topics(
    cluster: ClusterConfig, topics: dict[str, int], config: dict[str, str] | None = None, timeout_s: float = 30
) -> None:
    _create(cluster, [NewTopic(n, p, replication_factor=1, config=config or {}) for n, p in topics.items()], timeout_s)


def create_placed_topics(
    cluster: ClusterConfig, topics: dict[str, list[int]], configs: Mapping[str, str] | None = None
) -> None:
    """Topics with replication factor 1 whose partition i lives on (is led by) broker `topics[name][i]`."""
    new = [NewTopic(n, len(bs), replica_assignment=[[b] for b in bs], config=dict(configs or {})) for n, bs in
           topics.items()]  # fmt: skip
    _create(cluster, new, 30)


def remake_topic(cluster: ClusterConfig, topic: str, partitions: int | list[int], timeout_s: float = 60) -> None:
    """Delete the topic and make it again, empty, once the broker has let go of the old one (a create fails while the
    name is still being deleted): with `partitions` partitions, or one per broker named in it, each led by that one."""
    client = admin(cluster)  # held: a client collected before its future is done destroys the request
    client.delete_topics([topic], operation_timeout=30)[topic].result()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if isinstance(partitions, int):
                create_topics(cluster, {topic: partitions})
            else:
                create_placed_topics(cluster, {topic: partitions})
            return
        except AssertionError as err:  # still being deleted
            if time.monotonic() > deadline:
                raise AssertionError(f"could not make '{topic}' again within {timeout_s:.0f} s: {err}") from err
            time.sleep(0.5)


def _create(cluster: ClusterConfig, new: list[NewTopic], timeout_s: float) -> None:
    """Create, then wait until the broker asked answers every partition with a leader: a controller's answer comes
    before each broker learns the topic, and a test that reads its metadata at once found none (seen under load)."""
    client = admin(cluster)
    for name, future in client.create_topics(new, operation_timeout=timeout_s, request_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as err:
            raise AssertionError(f"could not create topic '{name}': {err}") from err
    deadline = time.monotonic() + timeout_s
    for topic in new:
        while True:
            meta = client.list_topics(topic.topic, timeout=timeout_s).topics[topic.topic]
            led = [m for m in meta.partitions.values() if m.leader >= 0]
            if meta.error is None and len(led) == topic.num_partitions:
                break
            assert time.monotonic() < deadline, f"topic '{topic.topic}' has no leader for every partition yet: {meta}"
            time.sleep(0.1)


def produce(cluster: ClusterConfig, topic: str, records: Iterable[Record], **overrides: str) -> int:
    """Produce in order and wait for every delivery; any failed delivery fails the caller."""
    client = producer(cluster, {"linger.ms": "5", "enable.idempotence": "true"} | overrides)
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
                client.produce(topic, **kwargs)
                break
            except BufferError:
                client.poll(0.1)
        count += 1
    remaining = client.flush(60)
    if remaining or failures:
        raise AssertionError(f"{remaining} record(s) undelivered, failures: {failures[:5]}")
    return count


def commit(cluster: ClusterConfig, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit a group's offsets (partition -> next offset to read) as its consumer would, without joining it."""
    member = consumer(cluster, group, {"enable.auto.commit": False})
    request = [TopicPartition(topic, p, o) for p, o in offsets.items()]
    try:
        clients.while_coordinator_moves(lambda: member.commit(offsets=request, asynchronous=False))
    finally:
        member.close()


def committed(cluster: ClusterConfig, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets `group` has committed on partitions 0 .. `partitions` - 1 of `topic`; those it has none for are
    left out."""
    member = consumer(cluster, group, {"enable.auto.commit": False})
    try:
        request = [TopicPartition(topic, p) for p in range(partitions)]
        got = clients.while_coordinator_moves(lambda: member.committed(request, timeout=30))
    finally:
        member.close()
    return {tp.partition: tp.offset for tp in got if tp.offset >= 0}


def read_all(
    cluster: ClusterConfig, topic: str, expected: int, timeout_s: float = 60.0, exact: bool = True
) -> list[Record]:
    """Read a topic from the beginning until `expected` records arrived; fail on timeout, or on excess if `exact`."""
    reader = consumer(
        cluster, f"reader-{topic}-{time.monotonic_ns()}",
        {"enable.auto.commit": "false", "auto.offset.reset": "earliest", "enable.partition.eof": "true"},
    )  # fmt: skip
    metadata = reader.list_topics(topic, timeout=15).topics[topic]
    if metadata.error is not None:
        reader.close()
        raise AssertionError(f"topic '{topic}': {metadata.error}")
    partitions = sorted(metadata.partitions)
    reader.assign([TopicPartition(topic, p, 0) for p in partitions])
    records: list[Record] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = reader.poll(0.5)
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
        reader.close()
    if len(records) < expected or (exact and len(records) != expected):
        raise AssertionError(f"'{topic}': expected {expected} records, read {len(records)} in {timeout_s}s")
    return records


def end_offsets(cluster: ClusterConfig, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s end offset (high watermark) right now."""
    reader = consumer(cluster, "end-offsets")
    try:
        return {(t, p): reader.get_watermark_offsets(TopicPartition(t, p), timeout=15)[1] for t, p in partitions}
    finally:
        reader.close()


def by_partition(records: Sequence[Record]) -> dict[int, list[Record]]:
    grouped: dict[int, list[Record]] = {}
    for r in records:
        grouped.setdefault(r.partition, []).append(r)
    return grouped


def console_consume(cluster: ClusterConfig, topic: str, max_messages: int, timeout_s: int = 60) -> list[str]:
    """Read with Kafka's own Java console consumer; lines are `Partition:<p>\\t<headers>\\t<key>\\t<value>`."""
    with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as props:
        props.write("".join(f"{k}={v}\n" for k, v in java_settings(cluster).items()))
    try:
        cmd = [
            require_java(), "-Xmx256m", "-cp", kafka_classpath(),
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            "--bootstrap-server", cluster.bootstrap_servers, "--topic", topic, "--from-beginning",
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
