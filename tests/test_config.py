"""A bad mirror config is refused before Spark starts, with a message that names the key."""

from __future__ import annotations

import copy

import pytest

from infra.hubs import HubSpec, plan_hubs
from infra.schema import ClusterSpec, SourceTopic
from spark_app.cli import main as cli_main
from spark_app.config import ConfigError, parse_config
from spark_app.policy import event_hubs_topics, should_mirror, target_topic

GOOD = {
    "clusters": [
        {"alias": "a", "bootstrap_servers": "a.example:9096", "profile": "msk-scram", "username": "m",
         "password": {"env": "A_PASSWORD"}},
        {"alias": "b", "bootstrap_servers": "b.example:9092", "profile": "kafka"},
        {"alias": "eh", "bootstrap_servers": "ns.servicebus.windows.net:9093", "profile": "eventhubs",
         "password": {"file": "/var/run/secrets/eh"}},
    ],
    "flows": [{"source": "a", "target": "b", "topics": {"include": ["orders.*"]}, "checkpoint_location": "/c/ab"}],
}  # fmt: skip


def variant(**changes) -> dict:
    raw = copy.deepcopy(GOOD)
    for path, value in changes.items():
        node = raw
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (variant(flows__0__target="dr2"), "config:flows[0].target: unknown cluster 'dr2'"),
        (variant(flows__0__topics={"include": []}), "config:flows[0].topics.include: select at least one topic"),
        (variant(flows__0__topics={"include": ["orders("]}), "is not a valid regex"),
        (variant(flows__0__target="a"), "config:flows[0]: source and target are the same cluster 'a'"),
        (
            variant(flows__0__replication_policy="identity", flows__0__provenance_header=False)
            | {
                "flows": [
                    {"source": "a", "target": "b", "topics": {"include": ["x"]}, "checkpoint_location": "/1",
                     "replication_policy": "identity", "provenance_header": False},
                    {"source": "b", "target": "a", "topics": {"include": ["x"]}, "checkpoint_location": "/2",
                     "replication_policy": "identity"},
                ]
            },
            "identity flows a->b and b->a would loop records forever",
        ),
        (variant(clusters__2__client_overrides={"compression.type": "lz4"}), "'lz4' is refused by Event Hubs"),
        (
            variant(clusters__2__client_overrides={"max.request.size": "2000000"}),
            "client_overrides.max.request.size: a Kafka Java client name; the mirror's clients are librdkafka, which"
            " calls it 'message.max.bytes'",
        ),
        (variant(flows__0__target="eh"), "a flow into Event Hubs cluster 'eh' must list topic names"),
        (variant(clusters__0__password=None), "config:clusters[0]: profile 'msk-scram' needs 'password'"),
        (variant(clusters__1__bootstrap_servers="a:1,nohost"), "bootstrap_servers: entry 2 of 2 is not host:port"),
        (variant(clusters__1__alias="a"), "config:clusters[1].alias: 'a' is used twice"),
        (
            variant(flows__0__target="eh", flows__0__topics={"include": ["orders"]},
                    flows__0__exactly_once_commit_interval_s=0.1),
            "config:flows[0].exactly_once_commit_interval_s: 0.1 s is too often for Event Hubs cluster 'eh', which"
            " takes at most 4 offset commits per second per partition; give 0.25 or more",
        ),
    ],
    ids=["unknown-alias", "empty-selection", "bad-regex", "same-cluster", "identity-loop", "eh-codec",
         "java-client-name", "eh-pattern", "missing-secret", "bad-bootstrap", "duplicate-alias", "eh-commit-often"],
)  # fmt: skip
def test_bad_config_is_refused_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as refused:
        parse_config(raw)
    assert message in str(refused.value)


def test_a_connection_string_pasted_as_bootstrap_servers_is_refused_without_its_key_in_the_message():
    key = "k3yThatMustNotLeak/+="
    pasted = f"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey={key}"
    with pytest.raises(ConfigError) as refused:
        parse_config(variant(clusters__2__bootstrap_servers=pasted))
    message = str(refused.value)
    assert "config:clusters[2].bootstrap_servers: entry 1 of 1 is not host:port" in message and "'password'" in message
    assert key not in message and "SharedAccessKey" not in message, message


def test_identity_pair_with_provenance_headers_is_accepted():
    raw = variant()
    raw["flows"] = [
        {"source": s, "target": t, "topics": {"include": ["x"]}, "checkpoint_location": f"/{s}{t}",
         "replication_policy": "identity"}
        for s, t in (("a", "b"), ("b", "a"))
    ]  # fmt: skip
    assert [f.name for f in parse_config(raw).flows] == ["a->b", "b->a"]


def test_exclusions_win_and_internal_topics_and_remote_copies_never_mirror():
    raw = variant(flows__0__topics={"include": [".*"], "exclude": ["orders\\.secret"]})
    flow = parse_config(raw).flows[0]
    assert should_mirror(flow, "orders.eu")
    assert not should_mirror(flow, "orders.secret")
    for internal in ("__consumer_offsets", "__transaction_state", "mm2-offset-syncs.b.internal",
                     "a.checkpoints.internal", "mirrorkit-status", "connect-offsets"):  # fmt: skip
        assert not should_mirror(flow, internal), internal
    assert not should_mirror(flow, "b.orders"), "a copy that came from the target must not go back"
    assert target_topic(flow, "orders.eu") == "a.orders.eu"


def test_event_hubs_topics_come_from_the_flows_naming_policy():
    raw = variant(flows__0__target="eh", flows__0__topics={"include": ["orders", "payments"]})
    raw["flows"][0]["dead_letter_topic"] = "mirror.dlq"
    assert event_hubs_topics(parse_config(raw)) == {
        "eh": ["a.checkpoints.internal", "a.heartbeats", "a.orders", "a.payments", "mirror.dlq",
               "mirrorkit-offset-syncs.a.internal"]
    }  # fmt: skip


def test_event_hubs_internal_hubs_follow_the_flows_separator_as_mm2_names_them():
    """Infra creates what the mirror will write: with separator `_` MM2's names (KIP-690), or the dotted ones the
    flow keeps with internal_topic_separator: false."""
    raw = variant(flows__0__target="eh", flows__0__topics={"include": ["orders"]}, flows__0__separator="_")
    assert event_hubs_topics(parse_config(raw)) == {
        "eh": ["a_checkpoints_internal", "a_heartbeats", "a_orders", "mirrorkit-offset-syncs_a_internal"]
    }
    sizes = [ClusterSpec.model_construct(alias="a", source_topic_sizes={"orders": SourceTopic(partitions=3)})]
    assert plan_hubs(parse_config(raw), sizes, "eh") == [
        HubSpec("a_checkpoints_internal", 1, compacted=True, own=True),
        HubSpec("a_heartbeats", 1, compacted=False, own=True),
        HubSpec("a_orders", 3, compacted=False),
        HubSpec("mirrorkit-offset-syncs_a_internal", 1, compacted=True, own=True),
    ]
    raw["flows"][0]["internal_topic_separator"] = False
    assert event_hubs_topics(parse_config(raw)) == {
        "eh": ["a.checkpoints.internal", "a_heartbeats", "a_orders", "mirrorkit-offset-syncs.a.internal"]
    }


def test_validate_command_reports_the_file_and_key(tmp_path, capsys):
    bad = tmp_path / "mirror.yaml"
    bad.write_text(
        "clusters: []\nflows:\n  - {source: a, target: b, topics: {include: [x]}, checkpoint_location: /c}\n"
    )
    assert cli_main(["validate", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:flows[0].source: unknown cluster 'a'" in err


@pytest.mark.parametrize(
    "key",
    ["sasl.password", "ssl.key.password", "SSL.Key.Password", "ssl.key.pem", "ssl.key.location",
     "ssl.keystore.location", "ssl.keystore.password", "sasl.jaas.config", "sasl.oauthbearer.client.secret",
     "sasl.oauthbearer.assertion.private.key.passphrase"],
)  # fmt: skip
def test_a_secret_in_client_overrides_is_refused_by_its_key_pointing_to_a_secret_ref(key):
    secret_value = "hunter2-do-not-echo"
    with pytest.raises(ConfigError) as refused:
        parse_config(variant(clusters__1__client_overrides={"linger.ms": "20", key: secret_value}))
    message = str(refused.value)
    assert message.startswith(f"config:clusters[1].client_overrides: '{key}' carries a secret"), message
    assert "'password: {file: ...}' or '{env: ...}'" in message and "'client_key: {file: ...}'" in message
    assert secret_value not in message
    assert "linger.ms" not in message, "only the secret keys are named"


def test_settings_that_only_look_near_a_secret_pass():
    overrides = {"sasl.username": "m", "ssl.ca.location": "/ca.pem", "ssl.certificate.location": "/c.pem"}
    assert parse_config(variant(clusters__1__client_overrides=overrides)).clusters[1].client_overrides == overrides


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("auto.offset.reset", "earliest", "never be reset silently"),
        ("isolation.level", "read_uncommitted", "would copy aborted transactions"),
        ("acks", "1", "every in-sync replica has it"),
        ("enable.idempotence", "false", "keeps each partition's order through retries"),
        ("enable.partition.eof", "false", "where each partition's log ends"),
        ("enable.auto.commit", "true", "owns the positions"),
        ("transactional.id", "mine", "fences its zombies"),
    ],
)
def test_an_override_of_a_setting_the_guarantees_rest_on_is_refused_naming_the_key_and_why(key, value, why):
    tuning = {"linger.ms": "50", "fetch.wait.max.ms": "100", "client.id": "mirror-dc1"}
    assert parse_config(variant(clusters__1__client_overrides=tuning)).clusters[1].client_overrides == tuning
    with pytest.raises(ConfigError) as refused:
        parse_config(variant(clusters__1__client_overrides=tuning | {key: value}))
    message = str(refused.value)
    assert message.startswith(f"config:clusters[1]: client_overrides.{key}: the mirror sets it"), message
    assert why in message and message.endswith("remove it"), message
    assert "linger.ms" not in message, "tuning keys pass"
