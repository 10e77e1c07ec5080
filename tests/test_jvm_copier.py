"""The real-time JVM copier against the Python task it stands in for: the same generated input, copied by a real-time
job of each, gives the same target records and the same reports.

Both run as the mirror runs them, a `CopyJob` of three slots on the session's Spark (`run --available-now`), from the
SCRAM source into the `$ConnectionString` target with `exactly_once` (so the JVM slots log in with both profiles and
commit positions with their records); only the flow's `copy_core` differs. The input has keys and null keys,
tombstones, duplicate, binary and null-valued headers, old and new timestamps, a record over the target's cap (held:
no dead-letter topic), a record the target topic refuses (a null key on a compacted topic) and a range that ends in
transaction markers with an aborted transaction inside it: the JVM slots copy until their first event, hand their
slot back, and the Python task goes on from their last commit. A second input comes from a source topic that stamps
its broker's append time, with a 20-digit provenance value among its headers: replication latency is timed alike.
"""

from __future__ import annotations

import contextlib
import json
import random
import struct
import threading
import time
from dataclasses import fields

import pytest

import spark_app.realtime.job
from bench.testbed.clients import Record, by_partition, create_topics, end_offsets, produce, read_all
from bench.testbed.kafka_cluster import ListenerKind
from spark_app import channel
from spark_app.config import ClusterConfig, FlowConfig, FlowMode, TopicSelection
from spark_app.copy_wing.choice import Core, choose
from spark_app.policy import PROVENANCE_HEADER, target_topic
from spark_app.ranges import Landing
from spark_app.realtime.job import CopyJob
from spark_app.realtime.jvm import SLOT_CONFIG_FIELDS, SlotConfig
from spark_app.realtime.task import LANDED, OVER, STARTED, STOP, Assignment, CopierTask
from spark_app.topics import TargetRule, TargetRules
from spark_app.transactions import fence
from tests.test_copy_cores import CAP, PER_PARTITION, _bytes, _generated, _transactional

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.parametrize("policy", ["default", "identity"])
def test_the_jvm_copier_writes_and_reports_what_the_python_task_does(
    spark, source_cluster, target_cluster, unique, tmp_path, monkeypatch, policy
):
    """Under the `identity` policy both cores drop the echoes of the target's own records (with their runs) and stamp
    the others' provenance; under `default` they copy those headers as they came."""
    source, target = source_cluster, target_cluster
    now_ms = int(time.time() * 1000)
    records = _generated(random.Random(5), target.client.alias, now_ms)  # its provenance headers are headers here
    refusing = [Record(0, None if i == 700 else f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(900)]
    slots: list[bool] = []  # per JVM slot run: whether it copied all (False: handed back)
    run_slot = spark_app.realtime.job.jvm.run_slot
    monkeypatch.setattr(spark_app.realtime.job.jvm, "run_slot", lambda *a: slots.append(run_slot(*a)) or slots[-1])

    results = {}
    for core in ("python", "compiled"):
        a, b, c = (f"{name}-{core}-{policy}-{unique}" for name in ("a", "b", "c"))
        create_topics(source.admin, {a: 2, b: 1, c: 1})
        flow = FlowConfig(
            source=source.client.alias, target=target.client.alias, topics=TopicSelection(include=[a, b, c]),
            checkpoint_location=str(tmp_path / core), copy_core=core, mode=FlowMode.REALTIME,
            exactly_once=True, replication_policy=policy,
        )  # fmt: skip
        copies = {t: target_topic(flow, t) for t in (a, b, c)}
        create_topics(target.admin, {copies[a]: 2, copies[c]: 1}, {"max.message.bytes": str(CAP)})
        create_topics(target.admin, {copies[b]: 1}, {"max.message.bytes": str(CAP), "cleanup.policy": "compact"})
        produce(source.admin, a, records)
        produce(source.admin, b, refusing)
        _transactional(source, c, f"{unique}-jvm", now_ms)
        ends = end_offsets(source.admin, [(a, 0), (a, 1), (b, 0), (c, 0)])
        rules = TargetRules(max_message_bytes=CAP, topics={b: TargetRule(compacted=True)})
        assert (choose(flow, source.client, target.client).core is Core.JVM) == (core == "compiled")

        rows: list[Landing] = []
        job = CopyJob(spark, flow, source.client, target.client, Assignment(dict.fromkeys(ends, 0), ends), 3, rules,
                      1.0, rows.extend).start()  # fmt: skip
        job.wait()
        assert job.error is None, job.error
        copied = [read_all(target.admin, copies[t], _landed(rows, t)) for t in (a, b, c)]
        results[core] = (copied, _per_partition(rows))

    # Slots a/0 + c/0, a/1 and b/0: the two with an event handed back, the other copied all.
    assert sorted(slots) == [False, False, True], "every slot ran on the JVM first"
    python, compiled = results["python"], results["compiled"]
    for got, want in zip(compiled[0], python[0], strict=True):
        assert _in_order(got) == _in_order(want)
    assert compiled[1] == python[1], "the same reports, partition by partition"
    # And the reference did what the input asks, so the two cannot agree on a wrong answer.
    assert python[1][("b", 0)]["held_from"] == 700 and python[1][("b", 0)]["records"] == 700
    held = python[1][("a", 1)]  # from the last commit before the record over the cap: its transaction was aborted
    assert 0 <= held["held_from"] <= PER_PARTITION and held["records"] + held["dropped"] == held["held_from"]
    whole = python[1][("a", 0)]
    assert whole["records"] == whole["timed"] == PER_PARTITION - whole["dropped"]
    assert python[1][("c", 0)]["records"] == 80 and python[1][("c", 0)]["end_offset"] > 90, "aborted ones skipped"
    echoes = [r for r in records if (PROVENANCE_HEADER, f"{target.client.alias}:".encode()) in _stamp_prefixes(r)]
    dropped = sum(python[1][("a", p)]["dropped"] for p in (0, 1))
    if policy == "identity":
        assert 0 < dropped <= len(echoes) and python[1][("a", 0)]["echoes"], "echoes dropped up to the held record"
        stamps = [dict(r.headers)[PROVENANCE_HEADER] for r in python[0][0]]
        ours = f"{source.client.alias}:".encode()
        assert b"elsewhere:17" in stamps, "a third cluster's stamp kept"
        assert all(v == b"elsewhere:17" or v.startswith(ours) for v in stamps), "every other record stamped"
    else:
        assert dropped == 0, "the default policy drops nothing"


def test_the_jvm_copier_times_what_the_python_task_times_from_an_append_time_source(
    spark, source_cluster, target_cluster, unique, tmp_path, monkeypatch
):
    """Records from a source topic that stamps its broker's append time land on a create-time target with that time:
    the Python task times every one of them (its delivery reports say the target kept their timestamp), and so must
    the JVM slot. Headers, a 20-digit provenance value among them, are copied as they came (the `default` policy).
    The target's client_overrides are tuning keys, which reach the JVM slot by their Java names: it copies them all."""
    source, target = source_cluster, target_cluster
    tuning = {"linger.ms": "5", "message.max.bytes": "900000", "request.timeout.ms": "61000", "fetch.wait.max.ms": "50"}
    tuned = target.client.model_copy(update={"client_overrides": tuning})
    now_ms = int(time.time() * 1000)
    twenty = f"{target.client.alias}:{'9' * 20}".encode()
    records = [
        Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), ((PROVENANCE_HEADER, twenty), ("n", str(i).encode())),
               now_ms)
        for i in range(200)
    ]  # fmt: skip
    slots: list[bool] = []
    run_slot = spark_app.realtime.job.jvm.run_slot
    monkeypatch.setattr(spark_app.realtime.job.jvm, "run_slot", lambda *a: slots.append(run_slot(*a)) or slots[-1])

    results = {}
    for core in ("python", "compiled"):
        topic = f"appended-{core}-{unique}"
        create_topics(source.admin, {topic: 2}, {"message.timestamp.type": "LogAppendTime"})
        flow = FlowConfig(
            source=source.client.alias, target=target.client.alias, topics=TopicSelection(include=[topic]),
            checkpoint_location=str(tmp_path / f"appended-{core}"), copy_core=core, mode=FlowMode.REALTIME,
            exactly_once=True,
        )  # fmt: skip
        copy = f"{source.client.alias}.{topic}"
        create_topics(target.admin, {copy: 2})
        produce(source.admin, topic, records)
        ends = end_offsets(source.admin, [(topic, 0), (topic, 1)])
        assert (choose(flow, source.client, tuned).core is Core.JVM) == (core == "compiled")

        rows: list[Landing] = []
        job = CopyJob(spark, flow, source.client, tuned, Assignment(dict.fromkeys(ends, 0), ends), 1,
                      TargetRules(), 1.0, rows.extend).start()  # fmt: skip
        job.wait()
        assert job.error is None, job.error
        copied = read_all(target.admin, copy, len(records))
        stamped = {r.key: r.timestamp_ms for r in read_all(source.admin, topic, len(records))}
        assert all(r.timestamp_ms == stamped[r.key] for r in copied), "each with its source broker's append time"
        # Without their timestamps: each core's run has a source topic of its own, stamped when it was loaded.
        results[core] = ([r[:-1] for r in _in_order(copied)], _per_partition(rows))

    assert slots == [True], "the JVM slot copied it all"
    python, compiled = results["python"], results["compiled"]
    assert compiled[0] == python[0]
    timed = {core: [row["timed"] for row in results[core][1].values()] for core in results}
    assert timed["compiled"] == timed["python"], timed
    assert compiled[1] == python[1], "the same reports, partition by partition"
    assert [row["timed"] for row in python[1].values()] == [100, 100], "the reference timed every record"
    assert all(r[-1][0] == (PROVENANCE_HEADER, twenty) for r in python[0]), "the header copied as it came"


def test_the_jvm_copier_signs_in_with_a_client_certificate_whose_key_it_reads_on_the_executor(
    spark, testbed, unique, tmp_path, monkeypatch
):
    """The `mtls` profile on the JVM: the slot's consumer and transactional producer both present the client
    certificate, with the key read from the file the config names, to a listener that refuses a TLS client without
    one; the slot copies every record whole and hands nothing back."""
    cluster = testbed.start(f"jmtls-{unique}"[:40], ListenerKind.MTLS)
    source = cluster.client
    target = source.model_copy(update={"alias": "mtls-dr"})  # the same broker, written as another cluster
    topic = f"jcerts-{unique}"
    flow = FlowConfig(source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]),
                      checkpoint_location=str(tmp_path), mode=FlowMode.REALTIME, exactly_once=True)  # fmt: skip
    create_topics(cluster.admin, {topic: 2, target_topic(flow, topic): 2})
    now_ms = int(time.time() * 1000)
    records = [
        Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("h", bytes([i % 256])),), now_ms + i) for i in range(300)
    ]
    produce(source, topic, records)
    slots: list[bool] = []
    run_slot = spark_app.realtime.job.jvm.run_slot
    monkeypatch.setattr(spark_app.realtime.job.jvm, "run_slot", lambda *a: slots.append(run_slot(*a)) or slots[-1])
    assert choose(flow, source, target).core is Core.JVM
    ends = end_offsets(cluster.admin, [(topic, 0), (topic, 1)])
    rows: list[Landing] = []
    job = CopyJob(spark, flow, source, target, Assignment(dict.fromkeys(ends, 0), ends), 1, TargetRules(), 1.0,
                  rows.extend).start()  # fmt: skip
    job.wait()
    assert job.error is None, job.error
    assert slots == [True], "the JVM slot copied it all"
    copied = read_all(cluster.admin, target_topic(flow, topic), len(records))
    assert by_partition(copied) == by_partition(records), "each record whole, in its partition's order"
    testbed.retire(f"jmtls-{unique}"[:40])


def _in_order(records: list[Record]) -> list[tuple]:
    """Target records whole, in partition and offset order, without their offsets: each slot's aborted transactions
    and commit markers take target offsets of their own."""
    return [t[:1] + t[2:] for t in sorted(map(_bytes, records))]


def _per_partition(rows: list[Landing]) -> dict[tuple[str, int], dict]:
    """What a job's reports add up to for each partition (topic named by role): records, drops and dead letters,
    where it ended, where it first held, and how many landed with a create time."""
    out: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row.topic.split("-", 1)[0], row.partition)
        got = out.setdefault(key, {"records": 0, "dropped": 0, "dead_lettered": 0, "end_offset": 0, "held_from": -1,
                                   "timed": 0, "echoes": []})  # fmt: skip
        got["records"] += row.records
        got["dropped"] += row.dropped
        got["echoes"] += row.echoes
        got["dead_lettered"] += row.dead_lettered
        got["timed"] += sum(row.latency_counts)
        got["end_offset"] = max(got["end_offset"], row.end_offset)
        if row.held_from >= 0 and got["held_from"] < 0:
            got["held_from"] = row.held_from
    return out


def _stamp_prefixes(record: Record) -> set[tuple[str, bytes]]:
    """A record's provenance headers as (name, alias and colon), for telling echoes from other stamps."""
    return {(k, v.partition(b":")[0] + b":") for k, v in record.headers if k == PROVENANCE_HEADER and v}


def _landed(rows: list[Landing], topic: str) -> int:
    return sum(row.records - row.dead_lettered for row in rows if row.topic == topic)


def test_the_jvm_copier_reads_every_rule_of_the_report_channel_as_python_made_them(spark):
    """The channel's labels, sizes and limits are Python's (ChannelRules), read by name: a field added on either side
    and not the other, or one missing, fails here."""
    job = spark._jvm.io.mirrorkit.copier.CopierJob
    rules = channel.RULES.to_json()
    assert json.loads(job.checkChannel(json.dumps(rules))) == {"read": rules}
    assert {f.name for f in fields(channel.ChannelRules)} == set(rules)
    refused = json.loads(job.checkChannel(json.dumps(rules | {"cipher": "none"})))
    assert "`cipher`, which the JVM copier does not know" in refused["refused"]
    missing = {k: v for k, v in rules.items() if k != "session_label"}
    assert json.loads(job.checkChannel(json.dumps(missing))) == {
        "refused": "the channel's rules lack the field `session_label`"
    }


def test_the_jvm_slots_side_of_the_channel_speaks_pythons_wire_format_and_drops_a_forged_stop(spark, tmp_path):
    """A JVM slot's channel, on the driver's JVM, against the driver's side in Python: messages cross both ways
    exactly, MAC'd and numbered alike; a STOP a man in the middle forged (its MAC a guess) ends the connection."""
    secret = channel.new_key()
    (tmp_path / "secret").write_bytes(secret)
    source = channel.KeySource("run-1", file=str(tmp_path / "secret"))
    listener = channel.Listener()
    config = {
        "driver": {"host": "127.0.0.1", "port": listener.port},
        "channel": channel.RULES.to_json(),
        "key_source": source.to_json(),
    }
    job = spark._jvm.io.mirrorkit.copier.CopierJob
    ended: list[str] = []
    echo = threading.Thread(target=lambda: ended.append(job.echoChannel(json.dumps(config))), daemon=True)
    echo.start()
    try:
        with channel.challenge(listener.accept(), channel.run_key(secret, source.run)) as conn:
            assert conn.recv() == ["hello", -1]
            for message in (STOP, ["tópico.ü", 2**40, None, {"a": [1.5, True]}], "x" * 100_000):
                conn.send(message)
                assert conn.recv() == message
            payload = json.dumps(STOP).encode()
            conn._sock.sendall(struct.pack(">I", len(payload)) + payload + b"\xff" * channel.RULES.mac_bytes)
            echo.join(60)
    finally:
        listener.close()
    assert ended and "failed authentication" in ended[0], ended
    assert secret.hex() not in ended[0]


def test_a_jvm_slot_of_a_run_that_is_over_starting_its_producer_after_the_next_runs_fence_commits_nothing(
    spark, source_cluster, target_cluster, unique, tmp_path
):
    """A JVM slot paused (or slow) between its assignment and its producer's start, while its run ended and the next
    run fenced every slot id: its driver, asked once the producer started, says the run is over, and the slot ends
    having committed nothing; every attempt Spark makes of it asks the same."""
    source, target = source_cluster, target_cluster
    topic = f"late-jvm-{unique}"
    flow = FlowConfig(
        source=source.client.alias, target=target.client.alias, topics=TopicSelection(include=[topic]),
        checkpoint_location=str(tmp_path), mode=FlowMode.REALTIME, exactly_once=True,
    )  # fmt: skip
    copy = target_topic(flow, topic)
    create_topics(source.admin, {topic: 2})
    create_topics(target.admin, {copy: 2})
    now_ms = int(time.time() * 1000)
    produce(source.admin, topic, [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(100)])
    fence(flow, target.client, {}, 0, 1)  # the next run's start
    secret = channel.new_key()
    (tmp_path / "secret").write_bytes(secret)
    key_source = channel.KeySource("run-over", file=str(tmp_path / "secret"))
    listener = channel.Listener()
    task = CopierTask(flow, source.client, target.client, ("127.0.0.1", listener.port), key_source.encode(),
                      TargetRules())  # fmt: skip
    asked: list[object] = []

    def driver_of_a_run_that_is_over() -> None:
        while True:
            try:
                sock = listener.accept()
            except OSError:
                return
            with channel.challenge(sock, channel.run_key(secret, key_source.run)) as conn:
                asked.append(conn.recv())
                conn.send(Assignment({(topic, 0): 0, (topic, 1): 0}, None).to_json())
                asked.append(conn.recv())
                conn.send(OVER)
                with contextlib.suppress(EOFError, OSError):
                    asked.append(conn.recv())

    threading.Thread(target=driver_of_a_run_that_is_over, daemon=True).start()
    try:
        with pytest.raises(Exception, match="commits nothing"):
            spark_app.realtime.job.jvm.run_slot(spark, SlotConfig.of(task, [topic]).dumps(), 0)
    finally:
        listener.close()
    assert asked[:2] == [["hello", 0], [STARTED, 0]], asked
    assert not any(isinstance(m, list) and m[0] in (LANDED, "reached") for m in asked), asked
    assert read_all(target.client, copy, 0) == [], "nothing of the late slot shows"


def _slot_config() -> SlotConfig:
    """A slot's config as a real-time exactly-once job makes it: a SCRAM source (password in a file) into an mTLS
    target (its client key in an env var), two topics."""
    source = ClusterConfig.model_validate(
        {"alias": "a", "bootstrap_servers": "127.0.0.1:9", "profile": "msk-scram", "username": "mirror",
         "password": {"file": "/run/secrets/scram"}, "ca_file": "/ca.pem"}
    )  # fmt: skip
    target = ClusterConfig.model_validate(
        {"alias": "b", "bootstrap_servers": "127.0.0.1:9", "profile": "mtls", "client_cert_file": "/cert.pem",
         "client_key": {"env": "CLIENT_KEY"}, "ca_file": "/ca.pem"}
    )  # fmt: skip
    flow = FlowConfig.model_validate(
        {"source": "a", "target": "b", "topics": {"include": ["t", "u"]}, "checkpoint_location": "/c",
         "mode": "realtime", "exactly_once": True, "exactly_once_commit_interval_s": 2.5}
    )  # fmt: skip
    key = channel.KeySource("run-1", file="/run/key").encode()
    task = CopierTask(flow, source, target, ("127.0.0.1", 7077), key, TargetRules(1_000_000))
    return SlotConfig.of(task, ["t", "u"])


def test_the_jvm_copier_reads_every_field_of_the_slots_config_as_python_made_it(spark):
    """What a slot is told (SlotConfig) is read by name, every field and nested field of it: one added on either side
    and not the other, one missing or one of the wrong type fails here, naming it."""
    job = spark._jvm.io.mirrorkit.copier.CopierJob
    config = _slot_config().to_json()
    assert tuple(config) == SLOT_CONFIG_FIELDS == tuple(f.name for f in fields(SlotConfig))
    assert config["source"]["login"]["file"] == "/run/secrets/scram", "where the password is, never the password"
    assert config["target"]["client_key"] == {"cert_file": "/cert.pem", "env": "CLIENT_KEY", "file": None}
    assert json.loads(job.checkSlotConfig(json.dumps(config))) == {"read": config}
    login, key = config["source"]["login"], config["target"]["client_key"]
    changed = [
        config | {"spare": 1},
        *({k: v for k, v in config.items() if k != name} for name in SLOT_CONFIG_FIELDS),
        config | {"driver": {"host": "127.0.0.1"}},
        config | {"source": config["source"] | {"spare": 1}},
        config | {"source": config["source"] | {"login": {k: v for k, v in login.items() if k != "module"}}},
        config | {"source": config["source"] | {"login": login | {"file": None}}},
        config | {"target": config["target"] | {"client_key": {k: v for k, v in key.items() if k != "cert_file"}}},
        config | {"target": config["target"] | {"client_key": key | {"file": "/k.pem"}}},
        config | {"target": {k: v for k, v in config["target"].items() if k != "client_key"}},
        config | {"producer": config["producer"] | {"linger.ms": 20}},
        config | {"commit_ms": "2500"},
        config | {"contract": {k: v for k, v in config["contract"].items() if k != "max_runs"}},
    ]
    names = ["spare", *SLOT_CONFIG_FIELDS, "port", "spare", "module", "file", "cert_file", "env", "client_key",
             "producer", "commit_ms", "max_runs"]  # fmt: skip
    for name, got in zip(names, (json.loads(job.checkSlotConfig(json.dumps(c))) for c in changed), strict=True):
        assert "read" not in got and f"`{name}`" in got["refused"], (name, got)
