"""The benchmark harness's configs: what each candidate is given is a config the mirror accepts, and says what ran.

The harness's figures are only as good as what it launches: a mirror config the mirror refuses fails a run late, and
one that silently writes transactions where the harness says it does not would mislabel a row of the README's
benchmark table or of the benchmark journal (bench/results/JOURNAL.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness import (
    LATENCY_CANDIDATES,
    ROOT,
    copy_loop_latency_command,
    mirror_commits,
    mirror_config,
    mm2_command,
)
from spark_app.config import ClusterConfig, FlowMode, MirrorConfig, Profile, SecretRef
from spark_app.realtime.task import LIBRDKAFKA_LINGER_MS

SOURCE = "127.0.0.1:9092"
KAFKA = ClusterConfig(alias="tgt", bootstrap_servers="127.0.0.1:9093", profile=Profile.KAFKA)
EVENTHUBS = ClusterConfig(
    alias="tgt", bootstrap_servers="127.0.0.1:9094", profile=Profile.EVENTHUBS, password=SecretRef(env="EH_CONN")
)


def test_real_time_into_kafka_writes_fencing_transactions_and_into_event_hubs_none(tmp_path: Path) -> None:
    seen = {}
    for target in (KAFKA, EVENTHUBS):
        config = mirror_config("src", SOURCE, target, ["orders"], tmp_path, FlowMode.REALTIME, realtime_tasks=2)
        flow = MirrorConfig.model_validate(config).flows[0]
        assert (flow.target, flow.realtime_tasks, flow.copy_core) == ("tgt", 2, "compiled")
        seen[target.profile] = mirror_commits(config)
    assert seen == {Profile.KAFKA: "every 5.0 s", Profile.EVENTHUBS: "none"}
    exactly_once = mirror_config("src", SOURCE, KAFKA, ["orders"], tmp_path, FlowMode.REALTIME, exactly_once=True)
    assert mirror_commits(exactly_once) == "every 1.0 s"
    assert mirror_commits(mirror_config("src", SOURCE, KAFKA, ["orders"], tmp_path)) == "none"


def test_mm2_signs_in_to_the_target_as_the_mirror_does_and_its_secret_stays_in_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Endpoint=sb://bench/;SharedAccessKeyName=mirror;SharedAccessKey=placeholder"
    monkeypatch.setenv("EH_CONN", secret)
    command = mm2_command("src", SOURCE, EVENTHUBS, ["orders"], tuned=True, work=tmp_path)
    assert not any(secret in arg for arg in command)
    props = dict(
        line.split(" = ", 1) for line in Path(command[command.index("org.apache.kafka.connect.mirror.MirrorMaker") + 1])
        .read_text().splitlines()
    )  # fmt: skip
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
            LATENCY_CANDIDATES[name], tmp_path, SOURCE, "127.0.0.1:9093", "lat0.", ["a", "b"], slots=2
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
