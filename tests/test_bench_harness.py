"""The benchmark harness's configs: what each candidate is given is a config the mirror accepts, and says what ran.

The harness's figures are only as good as what it launches: a mirror config the mirror refuses fails a run late, and
one that silently writes transactions where the harness says it does not would mislabel a row of the README's
benchmark table or of the benchmark journal (bench/results/JOURNAL.md).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from bench import startup
from bench.harness import (
    LATENCY_CANDIDATES,
    ROOT,
    LatencyCandidate,
    copy_loop_latency_command,
    eos_commit_interval_s,
    latency_lines,
    mirror_commits,
    mirror_config,
    mm2_command,
)
from spark_app.config import EXACTLY_ONCE_COMMIT_S, ClusterConfig, FlowMode, MirrorConfig, Profile, SecretRef
from spark_app.policy import PROVENANCE_HEADER, replication_policy, target_topic
from spark_app.realtime.task import LIBRDKAFKA_LINGER_MS

SOURCE = "127.0.0.1:9092"
KAFKA = ClusterConfig(alias="tgt", bootstrap_servers="127.0.0.1:9093", profile=Profile.KAFKA)
EVENTHUBS = ClusterConfig(
    alias="tgt", bootstrap_servers="127.0.0.1:9094", profile=Profile.EVENTHUBS, password=SecretRef(env="EH_CONN")
)
MSK_SCRAM = ClusterConfig(
    alias="tgt", bootstrap_servers="127.0.0.1:9095", profile=Profile.MSK_SCRAM, username="mirror",
    password=SecretRef(env="MSK_PASSWORD"), ca_file="/tls/ca.pem",
)  # fmt: skip


def mm2_properties(command: list[str]) -> dict[str, str]:
    """The properties file MM2 is started with, as a dict."""
    path = Path(command[command.index("org.apache.kafka.connect.mirror.MirrorMaker") + 1])
    return dict(line.split(" = ", 1) for line in path.read_text().splitlines())


def test_real_time_into_kafka_writes_fencing_transactions_and_into_event_hubs_none(tmp_path: Path) -> None:
    seen = {}
    for target in (KAFKA, EVENTHUBS, MSK_SCRAM):
        config = mirror_config("src", SOURCE, target, ["orders"], tmp_path, FlowMode.REALTIME, realtime_tasks=2)
        flow = MirrorConfig.model_validate(config).flows[0]
        assert (flow.target, flow.realtime_tasks, flow.copy_core) == ("tgt", 2, "compiled")
        seen[target.profile] = mirror_commits(config)
    assert seen == {Profile.KAFKA: "every 5.0 s", Profile.EVENTHUBS: "none", Profile.MSK_SCRAM: "every 5.0 s"}
    exactly_once = mirror_config("src", SOURCE, KAFKA, ["orders"], tmp_path, FlowMode.REALTIME, exactly_once=True)
    assert mirror_commits(exactly_once) == f"every {EXACTLY_ONCE_COMMIT_S} s"
    assert mirror_commits(mirror_config("src", SOURCE, KAFKA, ["orders"], tmp_path)) == "none"


def test_mm2_signs_in_to_the_target_as_the_mirror_does_and_its_secret_stays_in_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Endpoint=sb://bench/;SharedAccessKeyName=mirror;SharedAccessKey=placeholder"
    monkeypatch.setenv("EH_CONN", secret)
    command = mm2_command("src", SOURCE, EVENTHUBS, ["orders"], tuned=True, work=tmp_path)
    assert not any(secret in arg for arg in command)
    props = mm2_properties(command)
    assert props["target.bootstrap.servers"] == "127.0.0.1:9094"
    assert (props["target.security.protocol"], props["target.sasl.mechanism"]) == ("SASL_SSL", "PLAIN")
    assert "$ConnectionString" in props["target.sasl.jaas.config"] and secret in props["target.sasl.jaas.config"]
    assert props["target.producer.linger.ms"] == "20"


def test_copy_loops_run_as_a_real_time_slot_does_with_and_without_its_transactions(tmp_path: Path) -> None:
    (tmp_path / "copy-loop.jar").touch()  # built by javac on first use; the command is what is checked here
    seen = {}
    lingers = {
        "limit": LIBRDKAFKA_LINGER_MS,
        "limit-txn": LIBRDKAFKA_LINGER_MS,
        "limit-txn-mm2-linger": 20,
    }  # 20: tuned MM2's, above
    for name in ("limit", "limit-txn", "limit-txn-mm2-linger", "loop", "loop-txn"):
        cmd, commits = copy_loop_latency_command(
            LATENCY_CANDIDATES[name], tmp_path, SOURCE, "127.0.0.1:9093", "lat0.", ["a", "b"], slots=2, eos_commit_s=0.2
        )
        if name.startswith("limit"):  # CopyLoop's arguments: ... expected records, topics, linger, commit ms, slots
            assert cmd[cmd.index("io.mirrorkit.bench.CopyLoop") + 1 :] == [
                SOURCE, "127.0.0.1:9093", "lat0.", "0", "a,b", str(lingers[name]), cmd[-2], "2"
            ]  # fmt: skip
            seen[name] = (cmd[-2], commits)
        else:
            assert cmd[1:6] == [str(ROOT / "bench" / "copy_loop.py"), SOURCE, "127.0.0.1:9093", "lat0.", "a,b"]
            assert cmd[cmd.index("--slots") + 1] == "2"
            seen[name] = (cmd[cmd.index("--commit-ms") + 1], commits)
    assert seen == {
        "limit": ("0", "none"),
        "limit-txn": ("5000", "every 5.0 s"),
        "limit-txn-mm2-linger": ("5000", "every 5.0 s"),
        "loop": ("0", "none"),
        "loop-txn": ("5000", "every 5.0 s"),
    }


def test_the_exactly_once_floor_commits_as_often_as_the_mirrors_exactly_once_slots_and_is_read_so(
    tmp_path: Path,
) -> None:
    (tmp_path / "copy-loop.jar").touch()
    spec = LATENCY_CANDIDATES["limit-eos"]
    assert spec.isolation == LATENCY_CANDIDATES["mirror-realtime-eos"].isolation == "read_committed"
    for given in (None, 0.2):
        mirror = mirror_config("src", SOURCE, KAFKA, ["a"], tmp_path, FlowMode.REALTIME, exactly_once=True,
                               eos_commit_interval_s=given)  # fmt: skip
        interval = eos_commit_interval_s(mirror)
        cmd, commits = copy_loop_latency_command(spec, tmp_path, SOURCE, "127.0.0.1:9093", "lat0.", ["a"], 2, interval)
        assert commits == mirror_commits(mirror) == f"every {interval} s"
        assert cmd[-2] == str(round(interval * 1000))
    assert interval == 0.2


def test_identity_candidates_keep_topic_names_and_stamp_provenance_as_their_default_twins_copy(
    tmp_path: Path,
) -> None:
    for name in ("mirror-realtime", "mirror-realtime-eos"):
        twin, identity = LATENCY_CANDIDATES[name], LATENCY_CANDIDATES[f"{name}-identity"]
        assert identity == LatencyCandidate(**(vars(twin) | {"policy": "identity"}))
        config = mirror_config("lat0", SOURCE, MSK_SCRAM, ["lat0-0"], tmp_path, identity.mode, 2,
                               identity.exactly_once, policy=identity.policy)  # fmt: skip
        flow = MirrorConfig.model_validate(config).flows[0]
        assert (flow.replication_policy, flow.provenance_header) == ("identity", True)
        assert replication_policy(flow).stamps, f"the copies carry {PROVENANCE_HEADER}"
        assert target_topic(flow, "lat0-0") == "lat0-0"
        assert mirror_commits(config) == (
            f"every {EXACTLY_ONCE_COMMIT_S} s" if identity.exactly_once else "every 5.0 s"
        )
    default = MirrorConfig.model_validate(mirror_config("lat0", SOURCE, KAFKA, ["lat0-0"], tmp_path)).flows[0]
    assert target_topic(default, "lat0-0") == "lat0.lat0-0"


def test_mm2_into_msk_signs_in_with_scram_and_copies_exactly_once_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSK_PASSWORD", "placeholder-password")
    props = mm2_properties(mm2_command("src", SOURCE, MSK_SCRAM, ["orders"], tuned=True, work=tmp_path,
                                       exactly_once=True))  # fmt: skip
    assert (props["target.security.protocol"], props["target.sasl.mechanism"]) == ("SASL_SSL", "SCRAM-SHA-512")
    assert 'username="mirror"' in props["target.sasl.jaas.config"]
    assert props["target.ssl.truststore.location"] == "/tls/ca.pem"
    assert props["target.exactly.once.source.support"] == "enabled"
    assert props["src.consumer.isolation.level"] == "read_committed"


def test_mm2_into_mtls_reads_its_client_certificate_and_key_from_one_private_pem_file(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----\n")
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n")
    mtls = ClusterConfig(
        alias="tgt", bootstrap_servers="127.0.0.1:9096", profile=Profile.MTLS, ca_file="/tls/ca.pem",
        client_cert_file=str(tmp_path / "cert.pem"), client_key=SecretRef(file=str(tmp_path / "key.pem")),
    )  # fmt: skip
    props = mm2_properties(mm2_command("src", SOURCE, mtls, ["orders"], tuned=True, work=tmp_path))
    assert (props["target.security.protocol"], props["target.ssl.keystore.type"]) == ("SSL", "PEM")
    keystore = Path(props["target.ssl.keystore.location"])
    assert keystore.read_text() == (tmp_path / "key.pem").read_text() + (tmp_path / "cert.pem").read_text()
    assert keystore.stat().st_mode & 0o077 == 0


def test_each_latency_row_is_compared_with_mm2_read_at_the_same_isolation_level() -> None:
    def row(candidate: str, p99: float) -> dict:
        spec = LATENCY_CANDIDATES[candidate]
        return {"candidate": candidate, "rate": 10_000, "scenario": "4x16", "isolation": spec.isolation,
                "exactly_once": spec.exactly_once, "commits": "-", "send_rate": 10_000, "sent": 1, "received": 1,
                "duplicates": 0, "p50_ms": 1, "p99_ms": p99, "p999_ms": 1, "max_ms": 1, "cpu_s": 1,
                "window_s": 1}  # fmt: skip

    meta = {"size": 512, "latency": {"seconds": 60, "warmup_s": 15, "mirror_trigger_interval_s": 0.25}}
    rows = [row("mm2", 10.0), row("mm2-eos", 400.0), row("limit-txn", 5.0), row("limit-eos", 200.0)]
    table = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in latency_lines(rows, meta) if "|" in line}
    assert table["limit-txn"][9] == "0.50" and table["limit-eos"][9] == "0.50"


def test_the_start_up_profile_reads_each_phase_from_the_first_line_that_marks_it(tmp_path: Path) -> None:
    log = tmp_path / "mirror.log"
    log.write_text(
        "2026-12-07 10:00:00,400 INFO spark_app: flow a->b: a (kafka) -> b (kafka), policy default\n"
        "WARNING: Using incubator modules: jdk.incubator.vector\n"
        "2026-12-07 10:00:02,900 INFO spark_app.mirror: flow a->b: throughput batches copy with the rust core (...)\n"
        "2026-12-07 10:00:03,350 INFO spark_app.throughput: flow a->b: mirroring 4 topic(s): t0, t1, t2, t3\n"
        "2026-12-07 10:00:09,000 INFO spark_app.throughput: flow a->b: mirroring 5 topic(s): t0, t1, t2, t3, t4\n"
    )
    launched = datetime.datetime(2026, 12, 7, 10, 0, 0).timestamp()
    assert startup.phases(log, launched) == {"config": 0.4, "spark": 2.9, "flow": 3.35}
