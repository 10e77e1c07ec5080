"""`run` with the real CLI: it says what it mirrors without secrets, and SIGTERM stops it cleanly with exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from images.fetch_jars import cached_jars
from tests.support.clients import Record, by_partition, create_topics, produce, read_all
from tests.support.mirror_config import cluster_entry


def test_sigterm_stops_run_cleanly_after_mirroring_and_no_secret_is_printed(
    plaintext_cluster, target_cluster, tmp_path, unique
):
    topic = f"term-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    create_topics(target_cluster.admin, {f"onprem.{topic}": 2})
    now = int(time.time() * 1000)
    sent = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (), now + i) for i in range(200)]
    produce(plaintext_cluster.client, topic, sent)
    config = {
        "clusters": [cluster_entry(plaintext_cluster, "onprem"), cluster_entry(target_cluster, "dr")],
        "flows": [{"source": "onprem", "target": "dr", "topics": {"include": [topic]},
                   "checkpoint_location": str(tmp_path / "ckpt")}],
    }  # fmt: skip
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump(config))
    env = os.environ | {
        "PYSPARK_PYTHON": sys.executable,
        "MIRRORKIT_SPARK_JARS": ",".join(str(j) for j in cached_jars("spark")),
    }
    with open(tmp_path / "out.log", "w+") as out:
        mirror = subprocess.Popen(
            [sys.executable, "-m", "spark_app", "run", "--config", str(path), "--master", "local[2]"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        try:
            got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(sent), timeout_s=240)
            mirror.send_signal(signal.SIGTERM)
            code = mirror.wait(120)
        finally:
            if mirror.poll() is None:
                mirror.kill()
        out.seek(0)
        output = out.read()
    assert by_partition(got) == by_partition(sent)
    assert code == 0, output[-3000:]
    assert "flow onprem->dr: onprem (kafka) -> dr (eventhubs)" in output
    assert f"mirroring 1 topic(s): {topic}" in output
    assert target_cluster.client.password not in output, "the Event Hubs connection string was printed"
