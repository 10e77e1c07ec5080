"""The mirror image: what its Dockerfile copies exists, and its entrypoint runs the mirror in local mode."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.testbed.clients import Record, create_topics, produce, read_all
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "images" / "mirror"
ENTRYPOINT = IMAGE / "entrypoint.sh"


def test_every_path_the_dockerfile_copies_exists():
    sources = []
    for line in (IMAGE / "Dockerfile").read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        words = shlex.split(line)
        if not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    assert len(sources) >= 6
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert missing == []


def test_entrypoint_hands_spark_driver_and_executor_commands_to_spark(tmp_path):
    stub = tmp_path / "spark-entrypoint"
    stub.write_text('#!/bin/sh\necho "spark got: $*"\n')
    stub.chmod(0o755)
    for role in ("driver", "executor"):
        out = subprocess.run(
            [str(ENTRYPOINT), role, "--properties-file", "/x"],
            env=os.environ | {"SPARK_ENTRYPOINT": str(stub)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == f"spark got: {role} --properties-file /x"


def test_entrypoint_validates_and_runs_the_mirror_in_local_mode(
    plaintext_cluster, source_cluster, mirror_cli, tmp_path, unique
):
    topic = f"img-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    now = int(time.time() * 1000)  # an old timestamp would let the broker's retention delete the records mid-test
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), now + i) for i in range(500)]
    produce(plaintext_cluster.client, topic, records)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", target_alias="cloud")
    config = mirror_cli.config_file(raw)
    env = mirror_cli.env | {"MIRRORKIT_PYTHON": sys.executable}
    checked = subprocess.run([str(ENTRYPOINT), "validate", "--config", str(config)], env=env, capture_output=True)
    assert checked.returncode == 0, checked.stderr

    run = subprocess.run(
        mirror_cli.command(config, "--available-now", "--master", "local[2]", launcher=[str(ENTRYPOINT)]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "flow onprem->cloud: 500 records" in run.stderr
    assert "flow onprem->cloud: 500 of 500 records (100.0%)" in run.stderr, "the progress line's final figures"
    assert source_cluster.secret not in run.stderr + run.stdout
    got = read_all(source_cluster.client, f"onprem.{topic}", expected=500)
    assert_each_record_once_in_order(f"onprem.{topic}", got, records)
