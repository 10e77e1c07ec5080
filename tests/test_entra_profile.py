"""The eventhubs-entra profile: OAUTHBEARER settings librdkafka accepts, the workload identity token exchange run
against a real HTTP token endpoint on loopback, and a broker that validates the token it hands out."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from bench.testbed import clients
from bench.testbed.kafka_cluster import ListenerKind
from spark_app import profiles
from spark_app.config import ClusterConfig, FlowConfig, FlowMode, TopicSelection, parse_config
from spark_app.copy_wing.choice import Core, choose
from spark_app.errors import AuthenticationFailed
from spark_app.profiles import SecretError, librdkafka_settings
from spark_app.range_copy import RangeCopier
from spark_app.ranges import OffsetRange
from spark_app.realtime.task import Assignment, CopierTask, LiveCopy
from spark_app.topics import TargetRules
from tests.support.mirror_config import one_flow_config
from tests.support.report_channel import AvailableNowDriver

ENTRA = {"alias": "dr", "bootstrap_servers": "dr-ns.servicebus.windows.net:9093", "profile": "eventhubs-entra"}


class TokenEndpoint(BaseHTTPRequestHandler):
    """Entra ID's token endpoint as far as the client sees it: a form POST in, a JSON token out."""

    posts: list[tuple[str, dict[str, str]]] = []
    status = 200
    access_token = "entra-access-token"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
        TokenEndpoint.posts.append((self.path, form))
        body = (
            {"access_token": TokenEndpoint.access_token, "expires_in": 3599, "token_type": "Bearer"}
            if TokenEndpoint.status == 200
            else {"error": "invalid_client", "error_description": "AADSTS700213: no matching federated identity"}
        )
        payload = json.dumps(body).encode()
        self.send_response(TokenEndpoint.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def workload_identity(tmp_path, monkeypatch) -> Iterator[str]:
    """The env the workload identity webhook injects, pointing at a loopback token endpoint."""
    server = HTTPServer(("127.0.0.1", 0), TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token_file = tmp_path / "azure-identity-token"
    token_file.write_text("federated-sa-token\n")
    monkeypatch.setenv("AZURE_CLIENT_ID", "client-1")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant-1")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", f"http://127.0.0.1:{server.server_port}/")
    TokenEndpoint.posts, TokenEndpoint.status, TokenEndpoint.access_token = [], 200, "entra-access-token"
    yield str(token_file)
    server.shutdown()
    thread.join(timeout=10)


def test_producer_settings_speak_oauthbearer_with_event_hubs_limits_in_names_librdkafka_accepts(workload_identity):
    cluster = ClusterConfig(**ENTRA, client_overrides={"linger.ms": "20"})
    conf = librdkafka_settings(cluster, "producer")
    assert (conf["security.protocol"], conf["sasl.mechanism"]) == ("SASL_SSL", "OAUTHBEARER")
    assert (conf["connections.max.idle.ms"], conf["metadata.max.age.ms"], conf["message.max.bytes"]) == (
        "180000",
        "180000",
        "1000000",
    )
    assert conf["linger.ms"] == "20"  # an override wins
    assert not any("jaas" in k or "password" in k for k in conf)
    # librdkafka refuses an unknown property at construction: every name here is one of its own.
    clients.producer(cluster).flush(0)


def test_librdkafka_trades_the_federated_token_for_an_entra_token_for_the_namespace(workload_identity):
    conf = librdkafka_settings(ClusterConfig(**ENTRA), "producer")
    assert (conf["security.protocol"], conf["sasl.mechanism"]) == ("SASL_SSL", "OAUTHBEARER")
    assert "sasl.jaas.config" not in conf  # a Java name: librdkafka would refuse it
    assert conf["socket.keepalive.enable"] is True and conf["connections.max.idle.ms"] == "180000"
    token, expiry = conf["oauth_cb"]("")
    assert token == "entra-access-token"
    ((path, form),) = TokenEndpoint.posts
    assert path == "/tenant-1/oauth2/v2.0/token"
    assert form == {
        "grant_type": "client_credentials",
        "client_id": "client-1",
        "scope": "https://dr-ns.servicebus.windows.net/.default",
        "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
        "client_assertion": "federated-sa-token",
    }
    assert 3000 < expiry - time.time() <= 3599


def test_a_refused_token_exchange_names_the_cluster_and_the_error_not_the_token(workload_identity):
    TokenEndpoint.status = 401
    conf = librdkafka_settings(ClusterConfig(**ENTRA), "admin")
    with pytest.raises(SecretError) as err:
        conf["oauth_cb"]("")
    assert "cluster 'dr'" in str(err.value) and "HTTP 401 invalid_client" in str(err.value)
    assert "federated-sa-token" not in str(err.value)


def test_a_pod_without_workload_identity_is_told_what_it_lacks(monkeypatch):
    for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(SecretError, match=r"cluster 'dr'.*AZURE_CLIENT_ID.*azure.workload.identity/use=true"):
        librdkafka_settings(ClusterConfig(**ENTRA), "producer")


def test_an_entra_cluster_is_a_valid_source_and_target_without_a_java_login_handler(workload_identity):
    """The copier reads and writes through librdkafka, whose OAUTHBEARER callback signs in; no Java client."""
    kafka = {"alias": "k", "bootstrap_servers": "k:9092", "profile": "kafka"}
    assert parse_config(one_flow_config(ENTRA, kafka, ["orders"], "/c")).flows[0].source == "dr"
    conf = librdkafka_settings(ClusterConfig(**ENTRA), "consumer")
    assert conf["sasl.mechanism"] == "OAUTHBEARER" and callable(conf["oauth_cb"])
    # Written to through librdkafka only: no Java handler needed; its hubs are made ahead, so it is Event Hubs.
    config = parse_config(one_flow_config(kafka, ENTRA, ["orders"], "/c"))
    assert config.cluster("dr").is_eventhubs


def test_the_mirror_copies_into_a_broker_that_signs_it_in_with_the_token_the_endpoint_handed_out(
    workload_identity, own_cluster, plaintext_cluster, unique, tmp_path
):
    """A token-callback login end to end: the copy's producer (the compiled core's, which calls the profile's
    callback for each token librdkafka asks for) gets its token from the endpoint and a real OAUTHBEARER listener
    accepts it; a token the broker refuses stops the copy at once, naming the login."""
    target = own_cluster(f"oauth-{unique}"[:40], ListenerKind.OAUTHBEARER)
    now = int(time.time())
    claims = {"sub": "mirror", "iat": now, "exp": now + 3600}
    TokenEndpoint.access_token = ".".join(_b64url(part) for part in ({"alg": "none"}, claims)) + "."  # unsigned
    topic = f"entra-{unique}"
    clients.create_topics(plaintext_cluster.admin, {topic: 1})
    clients.create_topics(target.admin, {f"{plaintext_cluster.client.alias}.{topic}": 1})
    records = [clients.Record(0, f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), now * 1000 + i) for i in range(50)]
    clients.produce(plaintext_cluster.admin, topic, records)
    flow = FlowConfig(source=plaintext_cluster.client.alias, target=target.client.alias,
                      topics=TopicSelection(include=[topic]), checkpoint_location=str(tmp_path))  # fmt: skip
    assert choose(flow, plaintext_cluster.client, target.client).core is Core.RUST

    (landing,) = RangeCopier(flow, plaintext_cluster.client, target.client).copy([OffsetRange(topic, 0, 0, 50)])

    assert landing.records == 50
    assert clients.read_all(target.admin, f"{plaintext_cluster.client.alias}.{topic}", 50) == records
    assert TokenEndpoint.posts and TokenEndpoint.posts[0][1]["scope"] == "https://127.0.0.1/.default"

    claims["exp"] = now - 60  # a token the broker must refuse: the copy stops, saying which login failed
    TokenEndpoint.access_token = ".".join(_b64url(part) for part in ({"alg": "none"}, claims)) + "."
    # Another client id, so the copy gets a producer of its own (shared ones are kept per cluster and settings) and
    # signs in again rather than reuse the one the good token signed in.
    fresh = target.client.model_copy(update={"client_overrides": {"client.id": f"refused-{unique}"}})
    with pytest.raises(AuthenticationFailed, match=f"cluster '{fresh.alias}'.*Entra ID token"):
        RangeCopier(flow, plaintext_cluster.client, fresh).copy([OffsetRange(topic, 0, 0, 50)])


def _b64url(part: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()


def test_the_compiled_core_reads_from_a_token_login_and_writes_to_another_each_with_its_profiles_callback(
    workload_identity, own_cluster, plaintext_cluster, unique, tmp_path, monkeypatch
):
    """Both sides of the compiled core log in with tokens: its consumer from an Entra ID source (the workload identity
    exchange against the loopback endpoint), its producer into an MSK IAM target (the profile's callback, its AWS
    signer stood in for by one that hands out what the test broker checks). Both callbacks are Python, called by the
    Rust core; a copy with the Python loop shows the same records, and so does a real-time exactly-once slot, whose
    transactions the Rust core writes."""
    broker = own_cluster(f"oauth2-{unique}"[:40], ListenerKind.OAUTHBEARER)
    now = int(time.time())
    token = (
        ".".join(_b64url(part) for part in ({"alg": "none"}, {"sub": "mirror", "iat": now, "exp": now + 3600})) + "."
    )
    TokenEndpoint.access_token = token
    signed: list[str] = []
    monkeypatch.setattr(
        profiles, "_msk_iam_token", lambda region: lambda _config: signed.append(region) or (token, now + 3600.0)
    )
    source = broker.client  # eventhubs-entra
    target = ClusterConfig(alias="msk", bootstrap_servers=source.bootstrap_servers, profile="msk-iam",
                           region="eu-west-1", ca_file=source.ca_file)  # fmt: skip
    records = [clients.Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (), now * 1000 + i) for i in range(60)]
    got = {}
    for core, expected in (("compiled", Core.RUST), ("python", Core.PYTHON)):
        topic = f"tokens-{core}-{unique}"
        copy = f"{source.alias}.{topic}"
        clients.create_topics(broker.admin, {topic: 2, copy: 2})
        clients.produce(broker.admin, topic, records)
        flow = FlowConfig(source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]),
                          checkpoint_location=str(tmp_path / core), copy_core=core)  # fmt: skip
        assert choose(flow, source, target).core is expected
        landings = RangeCopier(flow, source, target).copy([OffsetRange(topic, p, 0, 30) for p in range(2)])
        assert [landing.records for landing in landings] == [30, 30]
        got[core] = clients.read_all(broker.admin, copy, 60)
    # Real time, exactly once: a slot's transactions over the same logins, which Kafka's Java clients cannot make, so
    # the compiled core writes them (its producer the slot's transactional one) and commits the slot's positions.
    topic = f"tokens-rt-{unique}"
    copy = f"{source.alias}.{topic}"
    clients.create_topics(broker.admin, {topic: 2, copy: 2})
    clients.produce(broker.admin, topic, records)
    flow = FlowConfig(source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]),
                      checkpoint_location=str(tmp_path / "rt"), mode=FlowMode.REALTIME, exactly_once=True)  # fmt: skip
    assert choose(flow, source, target).core is Core.RUST
    task = CopierTask(flow, source, target, ("127.0.0.1", 9), b"unused", TargetRules())
    keys = [(topic, 0), (topic, 1)]
    driver = AvailableNowDriver()
    LiveCopy(task, Assignment(dict.fromkeys(keys, 0), dict.fromkeys(keys, 30)), 0).run(driver)
    assert sum(row["records"] for row in driver.rows) == 60
    got["real time"] = clients.read_all(broker.admin, copy, 60)  # read_committed
    for partition in (0, 1):
        expected = [r for r in records if r.partition == partition]
        for core, copied in got.items():
            assert [r for r in copied if r.partition == partition] == expected, f"{core}, partition {partition}"
    assert TokenEndpoint.posts, "the source's token came from the Entra ID exchange"
    assert signed and set(signed) == {"eu-west-1"}, "the target's token came from the MSK IAM callback"
