"""The shared test helpers: the record assertion fails on every way a copy can go wrong and says where; the one-flow
config is what the mirror parses; a cluster's Java settings say what its profile says. No broker needed."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from bench.testbed.clients import Record, java_settings
from spark_app.config import ClusterConfig, parse_config
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

SENT = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), 1_000 + i) for i in range(8)]


def read_back(records: list[Record], first_offset: int = 0) -> list[Record]:
    """`records` as read_all gives them: each with the offset it has on its partition."""
    next_offset: dict[int, int] = {}
    out = []
    for r in records:
        offset = next_offset.get(r.partition, first_offset)
        next_offset[r.partition] = offset + 1
        out.append(dataclasses.replace(r, offset=offset))
    return out


def failure(got: list[Record], sent: list[Record] = SENT, **options) -> str:
    with pytest.raises(AssertionError) as failed:
        assert_each_record_once_in_order("orders", got, sent, **options)
    return str(failed.value)


def test_an_exact_copy_passes_in_any_interleaving_of_partitions():
    assert_each_record_once_in_order("orders", read_back(SENT), SENT)
    odd_first = [r for r in SENT if r.partition == 1] + [r for r in SENT if r.partition == 0]
    assert_each_record_once_in_order("orders", read_back(odd_first), SENT)
    assert_each_record_once_in_order("orders", [], [])


def test_a_lost_record_is_named_by_topic_partition_and_offset():
    message = failure(read_back([r for r in SENT if r.key != b"k2"]))
    assert "topic 'orders': 7 record(s) read for 8 sent" in message
    assert "partition 0: at offset 1, expected its record #1 as sent (key=b'k2'" in message
    assert "found (key=b'k4'" in message and "one before it was lost or comes later" in message
    assert "partition 1" not in message


def test_a_missing_tail_says_where_the_partition_ends():
    message = failure(read_back(SENT[:-2], first_offset=40))
    assert "partition 0: 1 record(s) missing (the partition ends at offset 43), from its record #3" in message
    assert "partition 1: 1 record(s) missing (the partition ends at offset 43)" in message
    assert "nothing was read from it" in failure([r for r in read_back(SENT) if r.partition == 0])


def test_a_duplicate_fails_unless_at_least_once_and_then_first_copies_must_be_in_order():
    again = read_back([*SENT[:5], SENT[2], SENT[4], *SENT[5:]])
    assert "partition 0: at offset 3, expected its record #3 as sent" in failure(again)
    assert "a repeat of a record read before it" in failure(again)
    assert_each_record_once_in_order("orders", again, SENT, at_least_once=True)
    message = failure(again[:-1], at_least_once=True)
    assert "2 repeat(s) allowed" in message and "partition 1: 1 record(s) missing" in message


def test_a_reordered_or_changed_record_fails():
    swapped = read_back([SENT[2], SENT[0], *SENT[1:2], *SENT[3:]])
    assert "partition 0: at offset 0, expected its record #0 as sent (key=b'k0'" in failure(swapped)
    assert "partition 0" in failure(swapped, at_least_once=True)
    changed = read_back([*SENT[:3], dataclasses.replace(SENT[3], timestamp_ms=0), *SENT[4:]])
    assert "partition 1: at offset 1" in failure(changed) and "a field differs" in failure(changed)


def test_records_on_a_partition_nothing_was_sent_to_fail():
    stray = read_back([*SENT, Record(5, b"k", b"v")])
    assert "partition 5: 1 record(s) more than sent, the first at offset 0: (key=b'k', value=b'v'" in failure(stray)


def test_long_values_are_shortened_in_the_message():
    big = [Record(0, b"huge", b"x" * 1_200_000)]
    message = failure(read_back([Record(0, b"huge", b"y" * 1_200_000)]), big)
    assert "...(1200000 bytes)" in message and len(message) < 1_000


def test_at_least_once_refuses_sent_records_that_repeat():
    with pytest.raises(ValueError, match="differ from each other"):
        assert_each_record_once_in_order("orders", [], [SENT[0], SENT[0]], at_least_once=True)


def test_one_flow_config_places_each_key_where_the_schema_has_it_and_parses():
    onprem = SimpleNamespace(client=ClusterConfig(alias="bed", bootstrap_servers="127.0.0.1:19092", profile="kafka"))
    target = {"alias": "eh", "bootstrap_servers": "ns.servicebus.windows.net:9093", "profile": "kafka"}
    raw = one_flow_config(onprem, target, ["orders"], "/ckpt", emit_heartbeats=False, metrics_port=9500)
    assert raw == {
        "clusters": [{"alias": "onprem", "bootstrap_servers": "127.0.0.1:19092", "profile": "kafka"}, target],
        "flows": [
            {"source": "onprem", "target": "eh", "topics": {"include": ["orders"]}, "checkpoint_location": "/ckpt",
             "emit_heartbeats": False}
        ],
        "metrics_port": 9500,
    }  # fmt: skip
    config = parse_config(raw)
    assert (config.flows[0].name, config.metrics_port, config.flows[0].emit_heartbeats) == ("onprem->eh", 9500, False)
    named = one_flow_config(onprem, onprem, {"include": ["a"], "exclude": ["b"]}, "/c", target_alias="cloud")
    assert [c["alias"] for c in named["clusters"]] == ["onprem", "cloud"]
    assert named["flows"][0]["topics"] == {"include": ["a"], "exclude": ["b"]}


def test_one_flow_config_refuses_an_unknown_key_and_an_alias_for_a_ready_entry():
    entry = {"alias": "k", "bootstrap_servers": "k:9092", "profile": "kafka"}
    with pytest.raises(TypeError, match="metrics_prot is neither a flow key nor a config key"):
        one_flow_config(entry, entry | {"alias": "j"}, ["t"], "/c", metrics_prot=1)
    with pytest.raises(TypeError, match="the entry 'k' keeps its alias"):
        one_flow_config(entry, entry | {"alias": "j"}, ["t"], "/c", source_alias="other")


def test_java_settings_name_the_cluster_as_the_mirrors_profile_does_in_the_java_clients_words(tmp_path):
    (tmp_path / "pw").write_text("s3cret\n")
    secret = {"file": str(tmp_path / "pw")}
    plain = ClusterConfig(alias="p", bootstrap_servers="h:9092", profile="kafka")
    assert java_settings(plain) == {"bootstrap.servers": "h:9092", "security.protocol": "PLAINTEXT"}
    scram = ClusterConfig.model_validate(
        {"alias": "m", "bootstrap_servers": "h:9096", "profile": "msk-scram", "username": "mirror", "password": secret,
         "ca_file": "/ca.pem"}
    )  # fmt: skip
    assert java_settings(scram) == {
        "bootstrap.servers": "h:9096",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="mirror"'
        ' password="s3cret";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/ca.pem",
    }
    hubs = ClusterConfig.model_validate(
        {"alias": "e", "bootstrap_servers": "h:9093", "profile": "eventhubs", "password": secret}
    )
    assert java_settings(hubs)["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required username="$ConnectionString"'
        ' password="s3cret";'
    )
    assert "ssl.truststore.location" not in java_settings(hubs)  # the system store, as librdkafka's default
    iam = ClusterConfig(alias="i", bootstrap_servers="h:9098", profile="msk-iam", region="eu-west-1")
    with pytest.raises(ValueError, match="cluster 'i': no Java settings for profile msk-iam"):
        java_settings(iam)
