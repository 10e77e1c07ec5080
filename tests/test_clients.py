"""The Kafka client module: which errors mean the credentials were refused, whole-topic reads in bulk, a sample of
record sizes, offsets listed per partition, and the shared clients a worker keeps, within their bound."""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from concurrent.futures import Future

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ListOffsetsResultInfo, OffsetSpec

from bench.testbed.clients import Record, create_topics, produce
from bench.testbed.kafka_cluster import cluster_entry
from spark_app import clients, profiles
from spark_app.clients import auth_error_callback, list_offsets_each, read_topic
from spark_app.config import ClusterConfig
from spark_app.errors import AuthenticationFailed

CLUSTER = ClusterConfig(alias="dr", bootstrap_servers="127.0.0.1:9093", profile="kafka")


def test_a_refused_password_raises_naming_the_cluster_but_never_the_secret():
    on_error = auth_error_callback(CLUSTER)
    for code, reason in (
        (KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed: Invalid username or password"),
        (KafkaError.SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication due to invalid creds"),
    ):
        with pytest.raises(AuthenticationFailed, match=r"authentication failed for cluster 'dr' \(127.0.0.1:9093\)"):
            on_error(KafkaError(code, reason))


def test_a_connection_lost_during_the_sasl_handshake_is_not_a_refusal():
    """Seen while a consumer closed during a reconnect: librdkafka reports it as _AUTHENTICATION."""
    on_error = auth_error_callback(CLUSTER)
    on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: SaslAuthenticateRequest failed: Local:"
                        " Broker transport failure (after 0ms in state DOWN)"))  # fmt: skip
    on_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "2/2 brokers are down"))


def test_a_whole_internal_topic_is_read_in_bulk_to_its_end_and_its_tail_alone_on_request(plaintext_cluster, unique):
    """200,000 records over 3 partitions (a busy checkpoints or offset-syncs topic); with one poll per record under
    one deadline, the old reader gave up on topics like this."""
    topic = f"internal-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 3})
    sent = [Record(i % 3, f"k{i}".encode(), f"v{i}".encode()) for i in range(200_000)]
    produce(plaintext_cluster.client, topic, sent)
    cluster = ClusterConfig.model_validate(cluster_entry(plaintext_cluster, "onprem"))
    got = read_topic(cluster, topic)
    assert len(got) == len(sent)
    for partition in range(3):
        values = [m.value() for m in got if m.partition() == partition]
        assert values == [r.value for r in sent if r.partition == partition]  # each partition whole, in order
    tail = read_topic(cluster, topic, tail=5)
    assert sorted((m.partition(), m.value()) for m in tail) == sorted(
        (r.partition, r.value) for p in range(3) for r in [r for r in sent if r.partition == p][-5:]
    )
    assert read_topic(cluster, f"absent-{unique}") == []


def test_a_sample_of_records_gives_each_topics_mean_key_and_value_size_from_where_it_starts(plaintext_cluster, unique):
    """Topic a holds 100 small records, then 1,000 of 1 KB keys and values, null keys and tombstones among them; the
    sample starts past the small ones and reads SAMPLE_RECORDS records, headers not counted. Topic b is empty where
    the sample starts: it gets no mean, so the planner falls back to its first-batch bound."""
    a, b = f"sample-a-{unique}", f"sample-b-{unique}"
    create_topics(plaintext_cluster.admin, {a: 2, b: 1})
    small = [Record(0, b"k", b"v") for _ in range(100)]
    big = [
        Record(0, None if i % 7 == 0 else b"k" * 24, None if i % 11 == 0 else b"v" * 1000, ((f"h{i}", b"x" * 500),))
        for i in range(1_000)
    ]
    produce(plaintext_cluster.client, a, small + big)
    produce(plaintext_cluster.client, b, [Record(0, b"k", b"v")])
    cluster = ClusterConfig.model_validate(cluster_entry(plaintext_cluster, "onprem"))

    got = clients.mean_record_bytes(cluster, {(a, 0): 100, (a, 1): 0, (b, 0): 1}, timeout_s=10.0)
    read = big[: clients.SAMPLE_RECORDS]
    assert got == {a: sum(len(r.key or b"") + len(r.value or b"") for r in read) / len(read)}


class FakeAdmin:
    """An AdminClient that answers ListOffsets from a table: an offset, librdkafka's -1001 (a leader it could not
    reach), or an error; and whose metadata answers unless told the cluster is down."""

    def __init__(self, answers: dict[tuple[str, int], int | KafkaError], cluster_down: bool = False) -> None:
        self.answers, self.cluster_down = answers, cluster_down
        self.metadata_asked = 0

    def list_offsets(self, request, **_kwargs):
        futures = {}
        for tp in request:
            future: Future = Future()
            answer = self.answers[(tp.topic, tp.partition)]
            if isinstance(answer, KafkaError):
                future.set_exception(KafkaException(answer))
            else:
                future.set_result(ListOffsetsResultInfo(answer, -1, -1))
            futures[tp] = future
        return futures

    def list_topics(self, timeout: float):
        self.metadata_asked += 1
        if self.cluster_down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "all brokers down"))
        return None


def test_list_offsets_each_says_which_partitions_did_not_answer_and_why_and_raises_only_for_a_cluster_down():
    leaderless = KafkaError(KafkaError.LEADER_NOT_AVAILABLE, "Broker: Leader not available")
    admin = FakeAdmin({("a", 0): 10, ("a", 1): -1001, ("b", 0): leaderless})
    found, failed = list_offsets_each(admin, [("a", 0), ("a", 1), ("b", 0)], OffsetSpec.latest(), timeout_s=7)
    assert found == {("a", 0): 10}
    assert failed == {("a", 1): "its leader did not answer within 7 s", ("b", 0): "Broker: Leader not available"}
    assert admin.metadata_asked == 1, "a failure refreshes the client's leaders"
    assert list_offsets_each(admin, [("a", 0)], OffsetSpec.latest()) == ({("a", 0): 10}, {})
    assert admin.metadata_asked == 1, "no failure, no metadata request"
    # Some partitions answered: a metadata request that fails does not make the cluster down.
    flapping = FakeAdmin({("a", 0): 10, ("b", 0): leaderless}, cluster_down=True)
    assert list_offsets_each(flapping, [("a", 0), ("b", 0)], OffsetSpec.latest())[0] == {("a", 0): 10}
    # Nothing answered but the cluster's metadata does: the partitions are offline, not the cluster.
    assert list_offsets_each(FakeAdmin({("a", 1): -1001}), [("a", 1)], OffsetSpec.latest())[0] == {}
    with pytest.raises(KafkaException, match="all brokers down"):
        list_offsets_each(FakeAdmin({("a", 1): leaderless}, cluster_down=True), [("a", 1)], OffsetSpec.latest())


class FakeClient:
    """A Producer or Consumer that only notes whether it was closed (a producer's close flushes it first)."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings
        self.closed = False

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


def test_shared_clients_stay_within_their_bound_over_thousands_of_changed_overrides(monkeypatch):
    """What runs for days: 5,000 copy tasks in one worker, each taking the shared producer and consumer of one of 3
    flows, while one flow's target cap changes every 20 tasks (a new producer key each time). At most SHARED_CLIENTS
    of each kind stay open; every one dropped is closed once; a flow in steady use keeps its clients."""
    monkeypatch.setattr(clients, "Producer", FakeClient)
    monkeypatch.setattr(clients, "Consumer", FakeClient)
    monkeypatch.setattr(clients._producers, "_clients", OrderedDict())  # this test's cache, not the process's
    monkeypatch.setattr(clients._consumers, "_clients", OrderedDict())
    rng = random.Random(3)
    targets = [ClusterConfig(alias=f"t{i}", bootstrap_servers=f"127.0.0.1:{i + 1}", profile="kafka") for i in range(3)]
    made: list[FakeClient] = []
    steady: dict[int, tuple[FakeClient, FakeClient]] = {}
    for task in range(5000):
        flow = rng.randrange(3)
        cap = 1_000_000 + task // 20 if flow == 0 else 1_000_000  # flow 0's cap keeps changing
        producer = clients.shared_producer(targets[flow], {"message.max.bytes": cap})
        consumer = clients.shared_consumer(CLUSTER, {"group.id": "copier"})
        for client in (producer, consumer):
            if client not in made:
                made.append(client)
        assert not producer.closed and not consumer.closed
        if flow:
            assert steady.setdefault(flow, (producer, consumer)) == (producer, consumer), "reused, not made again"
        assert sum(not c.closed for c in made) <= clients.SHARED_CLIENTS + 1  # producers, plus the one consumer
    assert len(made) > 200  # a producer per cap, all closed but the few kept


def test_a_client_dropped_from_the_shared_ones_keeps_what_its_cluster_refused_to_itself():
    """A client pushed out of the shared ones is closed, and closing serves its last callbacks: its cluster's
    refusal (here every error counts as one) must not fail the caller who only asked for another client."""

    def refused(err: KafkaError) -> None:
        raise AuthenticationFailed(CLUSTER)

    shared: clients._Shared[Consumer] = clients._Shared(bound=1)
    gone = shared.get(("gone",), lambda: Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g",
                                                   "error_cb": refused, "log_level": 0}))  # fmt: skip
    gone.assign([TopicPartition("t", 0, 0)])
    time.sleep(1.0)  # its connection refused, the error waits for a call that serves callbacks
    wanted = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "log_level": 0})
    assert shared.get(("wanted",), lambda: wanted) is wanted
    with pytest.raises(RuntimeError, match="closed"):
        gone.assign([TopicPartition("t", 0, 0)])  # it was closed all the same
    wanted.close()


def test_the_compiled_core_gets_librdkafka_strings_and_a_token_logins_callback_apart(compiled_core, monkeypatch):
    """A Copier takes librdkafka's settings as strings; a token login (MSK IAM, Entra ID) gives it the profile's own
    callback apart, for the side that logs in so, which the core calls for each token librdkafka asks for."""
    made: list[tuple[list[tuple[str, str]], list[tuple[str, str]], object, object]] = []

    class FakeCopier:
        def __init__(self, consumer_settings, producer_settings, idle_s, consumer_token=None, producer_token=None):
            made.append((consumer_settings, producer_settings, consumer_token, producer_token))

    monkeypatch.setattr(compiled_core, "Copier", FakeCopier)
    monkeypatch.setattr(clients._copiers, "_clients", OrderedDict())
    monkeypatch.setattr(profiles, "_msk_iam_token", lambda region: lambda _config: (f"token-for-{region}", 1.0))
    iam = ClusterConfig(alias="msk", bootstrap_servers="b-1.msk:9098", profile="msk-iam", region="us-east-1")
    clients.shared_copier(iam, CLUSTER, {"enable.auto.commit": False}, {"acks": "all"}, 5.0)
    clients.shared_copier(CLUSTER, iam, {"enable.auto.commit": False}, {"acks": "all"}, 5.0)
    (from_iam, _, source_token, none), (_, to_iam, none_either, target_token) = made
    assert none is None and none_either is None, "a password login has no callback"
    assert source_token("") == target_token("") == ("token-for-us-east-1", 1.0)
    assert ("sasl.mechanism", "OAUTHBEARER") in from_iam and ("sasl.mechanism", "OAUTHBEARER") in to_iam
    assert not any(k == "oauth_cb" for k, _ in from_iam + to_iam), "the callback is not a librdkafka string"
    made.clear()

    copier = clients.shared_copier(CLUSTER, CLUSTER, {"enable.auto.commit": False}, {"linger.ms": 20}, 5.0)
    assert clients.shared_copier(CLUSTER, CLUSTER, {"enable.auto.commit": False}, {"linger.ms": 20}, 5.0) is copier
    consumer_settings, producer_settings, _, _ = made[0]
    assert ("enable.auto.commit", "false") in consumer_settings and ("linger.ms", "20") in producer_settings
    assert ("bootstrap.servers", "127.0.0.1:9093") in consumer_settings
    assert all(isinstance(v, str) for _, v in consumer_settings + producer_settings)
