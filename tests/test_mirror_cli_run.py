"""`run` with the real CLI: killed mid-stream it resumes without loss, SIGTERM stops it with exit 0, no secret shows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import yaml

from tests.support.assertions import assert_each_record_once_in_order
from tests.support.clients import Record, create_topics, produce, read_all
from tests.support.mirror_config import free_port, one_flow_config

RECORDS, WAVE = 6000, 200


def run_command(source, target, topic: str, tmp_path) -> tuple[list[str], dict[str, str]]:
    """`run` (continuous) on a one-flow config `onprem` -> `dr` for `topic`, and the environment it needs."""
    config = one_flow_config(
        source,
        target,
        [topic],
        tmp_path / "ckpt",
        emit_heartbeats=False,  # no `heartbeats` topic on the shared source cluster
        metrics_port=free_port(),
    )
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "spark_app", "run", "--config", str(path), "--master", "local[2]"]
    return command, os.environ | {"PYSPARK_PYTHON": sys.executable}


def steady_traffic(source, topic: str) -> tuple[list[Record], threading.Thread]:
    """The records for `topic`: the first wave produced now, the rest by the returned thread (not started yet), a
    wave every 0.5 s."""
    now = int(time.time() * 1000)
    sent = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (), now + i) for i in range(RECORDS)]
    produce(source.client, topic, sent[:WAVE])

    def feed() -> None:
        for i in range(WAVE, len(sent), WAVE):
            produce(source.client, topic, sent[i : i + WAVE])
            time.sleep(0.5)

    return sent, threading.Thread(target=feed)


def test_run_survives_sigkill_mid_stream_and_sigterm_stops_it_cleanly_without_printing_secrets(
    plaintext_cluster, target_cluster, tmp_path, unique
):
    topic = f"term-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    create_topics(target_cluster.admin, {f"onprem.{topic}": 2})
    sent, feeder = steady_traffic(plaintext_cluster, topic)
    command, env = run_command(plaintext_cluster, target_cluster, topic, tmp_path)
    with open(tmp_path / "out.log", "w+") as out:
        first = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            read_all(target_cluster.client, f"onprem.{topic}", expected=WAVE, timeout_s=240, exact=False)
            feeder.start()
            time.sleep(5)
            os.killpg(first.pid, signal.SIGKILL)  # mid-stream, the producer still writing
            first.wait(30)
            mirror = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            feeder.join()
            got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(sent), timeout_s=300, exact=False)
            mirror.send_signal(signal.SIGTERM)
            code = mirror.wait(120)
        finally:
            for proc in (first, mirror) if "mirror" in locals() else (first,):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        output = out.read()
    repeats = len(got) - len(set(got))
    print(f"after SIGKILL: {len(got)} records on the target for {len(sent)} sent, {repeats} duplicates")
    assert_each_record_once_in_order(f"onprem.{topic}", got, sent, at_least_once=True)  # the kill may repeat a batch
    assert code == 0, output[-3000:]
    assert "flow onprem->dr: onprem (kafka) -> dr (eventhubs)" in output
    assert f"mirroring 1 topic(s): {topic}" in output
    assert target_cluster.client.password not in output, "the Event Hubs connection string was printed"


def test_run_rides_out_its_target_broker_stopped_for_30s_mid_stream(plaintext_cluster, testbed, tmp_path, unique):
    """A dedicated target, so the shared clusters are not disturbed."""
    target = testbed.start(f"outage-{unique[-8:]}", "plaintext")
    topic = f"outage-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    create_topics(target.admin, {f"onprem.{topic}": 2})  # so the reader below can wait on it from the start
    sent, feeder = steady_traffic(plaintext_cluster, topic)
    command, env = run_command(plaintext_cluster, target, topic, tmp_path)
    with open(tmp_path / "out.log", "w+") as out:
        mirror = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            read_all(target.client, f"onprem.{topic}", expected=WAVE, timeout_s=240, exact=False)
            feeder.start()
            time.sleep(3)
            target.stop()
            time.sleep(30)
            assert mirror.poll() is None, "the mirror died while its target was down"
            target.start()
            feeder.join()
            got = read_all(target.client, f"onprem.{topic}", expected=len(sent), timeout_s=400, exact=False)
            mirror.send_signal(signal.SIGTERM)
            code = mirror.wait(120)
        finally:
            if mirror.poll() is None:
                os.killpg(mirror.pid, signal.SIGKILL)
        out.seek(0)
        output = out.read()
    repeats = len(got) - len(set(got))
    print(f"after 30s target outage: {len(got)} records on the target for {len(sent)}, {repeats} duplicates")
    assert_each_record_once_in_order(f"onprem.{topic}", got, sent, at_least_once=True)  # retries may repeat a batch
    assert code == 0, output[-3000:]
