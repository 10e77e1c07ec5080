"""The test bed's clusters behave like the platforms they stand for, and real clients agree on what they hold."""

from __future__ import annotations

import dataclasses
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from bench.testbed import clients
from bench.testbed.clients import (
    Record,
    by_partition,
    console_consume,
    create_placed_topics,
    create_topics,
    produce,
    read_all,
)
from spark_app.config import SecretRef
from tests.support.assertions import assert_each_record_once_in_order

CLUSTERS = ["plaintext_cluster", "source_cluster", "target_cluster"]
SASL_CLUSTERS = ["source_cluster", "target_cluster"]


def keyed_records(count: int, partitions: int) -> list[Record]:
    return [
        Record(
            partition=i % partitions,
            key=f"key-{i}".encode(),
            value=f"value-{i}".encode(),
            headers=(("trace", f"t{i}".encode()), ("origin", b"smoke")),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_each_listener_kind_round_trips_1000_records_through_python_and_java(cluster_name, request, unique):
    cluster = request.getfixturevalue(cluster_name)
    topic = f"smoke-{unique}"
    create_topics(cluster.admin, {topic: 4})
    sent = keyed_records(1000, partitions=4)
    assert produce(cluster.client, topic, sent) == 1000

    received = [dataclasses.replace(r, timestamp_ms=None) for r in read_all(cluster.client, topic, expected=1000)]
    assert_each_record_once_in_order(topic, received, sent)

    lines = console_consume(cluster.client, topic, max_messages=1000)
    expected_lines = {
        p: [
            f"Partition:{p}\ttrace:t{r.key[4:].decode()},origin:smoke\t{r.key.decode()}\t{r.value.decode()}" for r in rs
        ]
        for p, rs in by_partition(sent).items()
    }
    java_by_partition: dict[int, list[str]] = {}
    for line in lines:
        java_by_partition.setdefault(int(line.split("\t", 1)[0].removeprefix("Partition:")), []).append(line)
    assert len(lines) == 1000
    assert java_by_partition == expected_lines


@pytest.mark.parametrize("cluster_name", SASL_CLUSTERS)
def test_wrong_credentials_are_refused_with_an_authentication_error(cluster_name, request, unique, tmp_path):
    cluster = request.getfixturevalue(cluster_name)
    topic = f"auth-{unique}"
    create_topics(cluster.admin, {topic: 1})
    errors: list[KafkaError] = []
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    signed_in_wrongly = cluster.client.model_copy(update={"password": SecretRef(file=str(wrong))})
    producer = clients.producer(signed_in_wrongly, {"error_cb": errors.append, "message.timeout.ms": "5000"})
    producer.produce(topic, value=b"must not land")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        producer.poll(0.2)
    producer.flush(10)

    auth_errors = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth_errors, f"expected an authentication error, got {[str(e) for e in errors]}"
    assert "Authentication failed" in auth_errors[0].str() or "Invalid username or password" in auth_errors[0].str()
    assert read_all(cluster.client, topic, expected=0, timeout_s=5) == []


def test_eventhubs_like_cluster_refuses_topic_creation_from_the_client(target_cluster, unique):
    client = clients.admin(target_cluster.client)
    future = client.create_topics([NewTopic(f"denied-{unique}", num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as refused:
        next(iter(future.values())).result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_eventhubs_like_cluster_rejects_a_record_over_1_mb(target_cluster, unique):
    topic = f"big-{unique}"
    create_topics(target_cluster.admin, {topic: 1})
    # Raise the client's own cap so the broker, not librdkafka, is the one that refuses.
    producer = clients.producer(target_cluster.client, {"message.max.bytes": "3000000"})
    outcomes: dict[str, KafkaError | None] = {}
    producer.produce(topic, value=b"a" * 900_000, on_delivery=lambda err, _: outcomes.__setitem__("900kB", err))
    producer.flush(30)
    producer.produce(topic, value=b"b" * 1_200_000, on_delivery=lambda err, _: outcomes.__setitem__("1.2MB", err))
    producer.flush(30)

    assert outcomes["900kB"] is None
    assert outcomes["1.2MB"] is not None and outcomes["1.2MB"].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert [len(r.value) for r in read_all(target_cluster.client, topic, expected=1)] == [900_000]


def test_stopping_one_broker_of_the_multi_broker_cluster_takes_exactly_its_partitions_offline_until_it_starts(
    multi_broker_cluster, unique
):
    cluster, topic = multi_broker_cluster, f"placed-{unique}"
    create_placed_topics(cluster.admin, {topic: [1, 2, 1]})
    admin = clients.admin(cluster.admin)

    def leaders() -> dict[int, int]:
        return {p: m.leader for p, m in admin.list_topics(topic, timeout=10).topics[topic].partitions.items()}

    assert leaders() == {0: 1, 1: 2, 2: 1}
    sent = [Record(p, None, f"{p}-before".encode()) for p in (0, 1, 2)]
    produce(cluster.client, topic, sent)
    cluster.broker(2).stop()
    try:
        deadline = time.monotonic() + 30
        while leaders() != {0: 1, 1: -1, 2: 1}:
            assert time.monotonic() < deadline, f"partition 1 still led after broker 2 stopped: {leaders()}"
            time.sleep(0.2)
        after = [Record(p, None, f"{p}-after".encode()) for p in (0, 2)]
        produce(cluster.client, topic, after)  # the partitions of broker 1 take writes meanwhile
        sent += after
    finally:
        cluster.broker(2).start()
    deadline = time.monotonic() + 30
    while leaders() != {0: 1, 1: 2, 2: 1}:
        assert time.monotonic() < deadline, f"partition 1 not led again after broker 2 started: {leaders()}"
        time.sleep(0.2)
    got = [dataclasses.replace(r, timestamp_ms=None) for r in read_all(cluster.client, topic, expected=len(sent))]
    assert_each_record_once_in_order(topic, got, sent)


def test_missing_jars_fail_at_once_naming_the_fetch_command(tmp_path, monkeypatch):
    from images.fetch_jars import cached_jars

    monkeypatch.setenv("MIRRORKIT_JAR_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as missing:
        cached_jars("kafka")
    assert "python3 images/fetch_jars.py kafka" in str(missing.value)
