"""`run` with the real CLI: killed mid-stream it resumes without loss, SIGTERM stops it with exit 0, no secret shows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import pytest

from bench.testbed.clients import Record, create_topics, end_offsets, produce, read_all
from bench.testbed.ports import free_port
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_cli import MirrorCli
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until

RECORDS, WAVE = 6000, 200


def run_command(cli: MirrorCli, source, target, topic: str, mode: str = "throughput") -> list[str]:
    """`run` (continuous) on a one-flow config `onprem` -> `dr` for `topic` in `mode`."""
    config = one_flow_config(
        source,
        target,
        [topic],
        cli.folder / "ckpt",
        emit_heartbeats=False,  # no `heartbeats` topic on the shared source cluster
        metrics_port=free_port(),
        mode=mode,
    )
    return cli.command(cli.config_file(config), "--master", "local[2]")


def steady_traffic(source, topic: str) -> tuple[list[Record], threading.Thread]:
    """The records for `topic`: the first wave produced now, the rest by the returned thread (not started yet), a
    wave every 0.5 s."""
    now = int(time.time() * 1000)
    sent = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (), now + i) for i in range(RECORDS)]
    produce(source.client, topic, sent[:WAVE])

    def feed() -> None:
        for i in range(WAVE, len(sent), WAVE):
            produce(source.client, topic, sent[i : i + WAVE])
            time.sleep(0.5)  # steady traffic's pacing

    return sent, threading.Thread(target=feed)


def wait_mid_stream(target, topic: str) -> None:
    """Until the target holds more than the first wave: the mirror is copying the traffic still coming."""
    remote = f"onprem.{topic}"
    wait_until(
        lambda: sum(end_offsets(target.client, [(remote, 0), (remote, 1)]).values()) > WAVE,
        f"records of the steady traffic on '{remote}'",
    )


Start = Callable[[], subprocess.Popen]
Disrupt = Callable[[subprocess.Popen, Start], subprocess.Popen]


def run_under_traffic(
    cli: MirrorCli,
    source,
    target,
    topic: str,
    disrupt: Disrupt,
    what: str,
    read_timeout_s: float,
    mode: str = "throughput",
) -> tuple[int, str, int]:
    """`run` on `topic` in `mode` while traffic keeps coming, disrupted mid-stream by `disrupt(mirror, start)`, which
    returns the run that goes on (`start()` starts another); then SIGTERM. Checks that every record reached the target
    at least once, in order; returns the exit code after SIGTERM, the output of every run and the duplicates."""
    remote = f"onprem.{topic}"
    create_topics(source.admin, {topic: 2})
    create_topics(target.admin, {remote: 2})  # so the reader below can wait on it from the start
    sent, feeder = steady_traffic(source, topic)
    command = run_command(cli, source, target, topic, mode)
    runs: list[subprocess.Popen] = []
    with open(cli.folder / "out.log", "w+") as out:

        def start() -> subprocess.Popen:
            run = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=cli.env, start_new_session=True)
            runs.append(run)
            return run

        try:
            mirror = start()
            read_all(target.client, remote, expected=WAVE, timeout_s=240, exact=False)
            feeder.start()
            mirror = disrupt(mirror, start)
            feeder.join()
            got = read_all(target.client, remote, expected=len(sent), timeout_s=read_timeout_s, exact=False)
            mirror.send_signal(signal.SIGTERM)
            code = mirror.wait(120)
        finally:
            for proc in runs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        output = out.read()
    print(f"after {what}: {len(got)} records on the target for {len(sent)} sent, {len(got) - len(set(got))} duplicates")
    assert_each_record_once_in_order(remote, got, sent, at_least_once=True)  # a disruption may repeat a batch
    return code, output, len(got) - len(set(got))


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_run_survives_sigkill_mid_stream_and_sigterm_stops_it_cleanly_without_printing_secrets(
    mode, plaintext_cluster, target_cluster, mirror_cli, unique
):
    topic = f"term-{unique}"

    def kill_and_restart(mirror: subprocess.Popen, start: Start) -> subprocess.Popen:
        wait_mid_stream(target_cluster, topic)
        os.killpg(mirror.pid, signal.SIGKILL)  # mid-stream, the producer still writing
        mirror.wait(30)
        return start()

    code, output, duplicates = run_under_traffic(
        mirror_cli, plaintext_cluster, target_cluster, topic, kill_and_restart, "SIGKILL", 300, mode
    )
    assert code == 0, output[-3000:]
    assert "flow onprem->dr: onprem (kafka) -> dr (eventhubs)" in output
    if mode == "realtime":
        assert f"mirroring 1 topic(s) in real time with 1 task(s): {topic}" in output
        # What landed after the last saved positions is copied again, and the restart says how much.
        reported = [int(n) for n in re.findall(r"(\d+) record\(s\) landed after the last save", output)]
        print(f"realtime restart reported {sum(reported)} record(s) to copy again; the target has {duplicates}")
        assert duplicates <= sum(reported)
    else:
        assert f"mirroring 1 topic(s): {topic}" in output
    assert target_cluster.secret not in output, "the Event Hubs connection string was printed"


def test_run_rides_out_its_target_broker_stopped_for_30s_mid_stream(plaintext_cluster, own_cluster, mirror_cli, unique):
    """A dedicated target, so the shared clusters are not disturbed."""
    target = own_cluster(f"outage-{unique[-8:]}", "plaintext")

    def stop_the_target_for_30s(mirror: subprocess.Popen, start: Start) -> subprocess.Popen:
        wait_mid_stream(target, topic)
        target.stop()
        time.sleep(30)  # the outage itself: the mirror must ride it out, however long it waits
        assert mirror.poll() is None, "the mirror died while its target was down"
        target.start()
        return mirror

    topic, what = f"outage-{unique}", "30s target outage"
    code, output, _ = run_under_traffic(
        mirror_cli, plaintext_cluster, target, topic, stop_the_target_for_30s, what, 400
    )
    assert code == 0, output[-3000:]
