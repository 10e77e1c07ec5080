"""Client profiles: every profile's settings are librdkafka's own names (librdkafka refuses an unknown one when a
client is made), Event Hubs' limits are set, overrides win, and secrets come from where the config points."""

from __future__ import annotations

import time

import pytest

from bench.testbed import clients
from bench.testbed.tls import make_loopback_tls
from spark_app import profiles
from spark_app.config import ClusterConfig
from spark_app.profiles import SecretError, librdkafka_settings, redacted

SECRET = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0"


@pytest.fixture
def clusters(tmp_path, monkeypatch) -> dict[str, ClusterConfig]:
    """One cluster per profile, with secrets in an env var and in files, and token callbacks that sign nothing."""
    monkeypatch.setenv("EH_CONNECTION_STRING", SECRET)
    (tmp_path / "pw").write_text("scram-secret\n")
    tls = make_loopback_tls(tmp_path)  # librdkafka loads certificates and keys when a client is made
    monkeypatch.setattr(profiles, "_msk_iam_token", lambda region: lambda _cfg: ("iam-token", time.time() + 3600))
    monkeypatch.setattr(profiles, "_entra_token", lambda cluster: lambda _cfg: ("entra-token", time.time() + 3600))
    base = {"bootstrap_servers": "127.0.0.1:1"}
    return {
        c["profile"]: ClusterConfig.model_validate(base | c)
        for c in (
            {"alias": "k", "profile": "kafka", "tls": True, "ca_file": str(tls.ca_pem)},
            {"alias": "eh", "profile": "eventhubs", "password": {"env": "EH_CONNECTION_STRING"}},
            {"alias": "ehe", "profile": "eventhubs-entra"},
            {"alias": "ms", "profile": "msk-scram", "username": "mirror", "password": {"file": str(tmp_path / "pw")}},
            {"alias": "mi", "profile": "msk-iam", "region": "eu-west-1"},
            {"alias": "mt", "profile": "mtls", "client_cert_file": str(tls.server_pem),
             "client_key": {"file": str(tls.server_pem)}},
        )
    }  # fmt: skip


def test_every_profile_gives_settings_librdkafka_accepts_for_every_role(clusters):
    for cluster in clusters.values():
        # Each raises KafkaException "No such configuration property" on a Java name.
        clients.producer(cluster)
        clients.consumer(cluster, "profile-check")
        clients.admin(cluster)


def test_protocols_mechanisms_and_secrets_per_profile(clusters):
    def conf(profile: str) -> dict[str, object]:
        return librdkafka_settings(clusters[profile], "consumer")

    assert conf("kafka")["security.protocol"] == "SSL" and str(conf("kafka")["ssl.ca.location"]).endswith("ca.pem")
    eh = conf("eventhubs")
    assert (eh["security.protocol"], eh["sasl.mechanism"], eh["sasl.username"]) == (
        "SASL_SSL",
        "PLAIN",
        "$ConnectionString",
    )
    assert eh["sasl.password"] == SECRET
    scram = conf("msk-scram")
    assert (scram["sasl.mechanism"], scram["sasl.username"], scram["sasl.password"]) == (
        "SCRAM-SHA-512", "mirror", "scram-secret",
    )  # fmt: skip
    assert conf("msk-iam")["sasl.mechanism"] == "OAUTHBEARER" and callable(conf("msk-iam")["oauth_cb"])
    assert conf("mtls")["security.protocol"] == "SSL" and str(conf("mtls")["ssl.key.location"]).endswith("server.pem")


def test_event_hubs_producers_stay_under_the_services_limits_and_overrides_win(clusters):
    producer = librdkafka_settings(clusters["eventhubs"], "producer")
    assert producer["message.max.bytes"] == "1000000" and producer["compression.type"] == "none"
    assert producer["connections.max.idle.ms"] == producer["metadata.max.age.ms"] == "180000"
    assert producer["request.timeout.ms"] == "60000" and producer["socket.keepalive.enable"] is True
    consumer = librdkafka_settings(clusters["eventhubs"], "consumer")
    assert "message.max.bytes" not in consumer and "request.timeout.ms" not in consumer  # a consumer ignores them
    assert consumer["connections.max.idle.ms"] == consumer["metadata.max.age.ms"] == "180000"
    assert librdkafka_settings(clusters["eventhubs"], "admin")["request.timeout.ms"] == "60000"
    tuned = clusters["eventhubs"].model_copy(update={"client_overrides": {"compression.type": "gzip"}})
    assert librdkafka_settings(tuned, "producer")["compression.type"] == "gzip"


def test_redacted_settings_hide_every_secret_and_callback(clusters):
    for cluster in clusters.values():
        shown = repr(redacted(librdkafka_settings(cluster, "producer")))
        assert SECRET not in shown and "scram-secret" not in shown and "function" not in shown


def test_a_missing_secret_names_where_it_was_looked_for_not_its_value(clusters, monkeypatch):
    monkeypatch.delenv("EH_CONNECTION_STRING")
    with pytest.raises(SecretError, match="cluster 'eh': env var EH_CONNECTION_STRING is not set"):
        librdkafka_settings(clusters["eventhubs"], "producer")
    env_key = ClusterConfig.model_validate(clusters["mtls"].model_dump() | {"client_key": {"env": "KEY"}})
    with pytest.raises(SecretError, match="client_key: librdkafka reads the client key from a file, not env KEY"):
        librdkafka_settings(env_key, "consumer")


def test_java_settings_name_where_each_login_secret_lives_and_never_carry_it(clusters):
    """The JVM copier's settings (spark_app.realtime.jvm): Java names for the profiles it serves, the password read on
    the executor from where the config says, and None where the Java clients would need more (a token callback, a
    librdkafka setting with no Java name)."""
    java = {profile: profiles.java_client(cluster, "producer") for profile, cluster in clusters.items()}
    assert {p for p, j in java.items() if j is None} == {"eventhubs-entra", "msk-iam"}
    mtls = java["mtls"]
    assert mtls is not None and mtls.login is None and mtls.client_key is not None
    key = clusters["mtls"].client_key
    assert (mtls.client_key.cert_file, mtls.client_key.env, mtls.client_key.file) == (
        clusters["mtls"].client_cert_file,
        key.env,
        key.file,
    ), "where the key is, never the key"
    assert mtls.settings["security.protocol"] == "SSL"
    assert java["kafka"] is not None and java["kafka"].settings["ssl.truststore.type"] == "PEM"
    assert java["kafka"].login is None
    eh, scram = java["eventhubs"], java["msk-scram"]
    assert eh is not None and eh.login is not None and scram is not None and scram.login is not None
    assert eh.login.username == "$ConnectionString" and eh.login.env == "EH_CONNECTION_STRING"
    assert eh.settings["max.request.size"] == "1000000" and eh.settings["sasl.mechanism"] == "PLAIN"
    assert scram.login.file == clusters["msk-scram"].password.file and scram.login.env is None
    assert scram.login.module.endswith("ScramLoginModule")
    for settings in java.values():
        assert "scram-secret" not in str(settings) and SECRET not in str(settings)
    overridden = clusters["kafka"].model_copy(update={"client_overrides": {"socket.timeout.ms": 1000}})
    assert profiles.java_client(overridden, "consumer") is None
    assert profiles.why_no_java_client(overridden) == (
        "cluster 'k': client_overrides.socket.timeout.ms is a librdkafka setting the Java clients have no name for here"
    )


def test_tuning_overrides_reach_the_java_clients_by_their_java_names_for_the_roles_that_have_them(clusters):
    """A cluster's tuning overrides do not keep it off the JVM: each goes to the roles that take it, by its Java
    name, last (over the profile's own, as in librdkafka's settings)."""
    tuning = {
        "linger.ms": "20",
        "message.max.bytes": "900000",
        "fetch.wait.max.ms": "50",
        "request.timeout.ms": "70000",
    }
    tuned = clusters["eventhubs"].model_copy(update={"client_overrides": tuning})
    producer, consumer = profiles.java_client(tuned, "producer"), profiles.java_client(tuned, "consumer")
    assert producer is not None and consumer is not None
    assert producer.settings["linger.ms"] == "20" and producer.settings["max.request.size"] == "900000"
    assert producer.settings["request.timeout.ms"] == consumer.settings["request.timeout.ms"] == "70000"
    assert consumer.settings["fetch.max.wait.ms"] == "50"
    assert "fetch.max.wait.ms" not in producer.settings and "linger.ms" not in consumer.settings
    assert not {"message.max.bytes", "fetch.wait.max.ms"} & (set(producer.settings) | set(consumer.settings))
