"""A cluster the mirror cannot reach, or that refuses its password, stops `run` with a message naming it: an unreachable
one once the reachability check gives up, a refused password at the refusal itself, without waiting out a timeout. The
time each took is printed, not asserted."""

from __future__ import annotations

import subprocess
import time

from bench.testbed.kafka_cluster import cluster_entry
from bench.testbed.ports import free_ports
from tests.support.mirror_cli import CONSOLE_SCRIPT, MirrorCli
from tests.support.mirror_config import one_flow_config


def run_cli(cli: MirrorCli, config: dict) -> tuple[subprocess.CompletedProcess, float]:
    """`run` through the console script, as `mirrorkit` is on PATH in the image."""
    command = cli.command(cli.config_file(config), "--master", "local[2]", launcher=CONSOLE_SCRIPT)
    began = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    return result, time.monotonic() - began


def test_unreachable_cluster_and_wrong_password_fail_fast_naming_the_cluster(source_cluster, mirror_cli, tmp_path):
    (closed,) = free_ports(1)
    good_source = cluster_entry(source_cluster, "msk")
    unreachable = {"alias": "gone", "bootstrap_servers": f"127.0.0.1:{closed}", "profile": "kafka"}
    result, took = run_cli(mirror_cli, one_flow_config(good_source, unreachable, ["t"], tmp_path / "c"))
    print(f"unreachable cluster: exit {result.returncode} after {took:.1f}s")
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cluster 'gone' (127.0.0.1:{closed}) is unreachable" in result.stderr

    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password")
    bad_source = good_source | {"password": {"file": str(wrong)}}
    target = {"alias": "other", "bootstrap_servers": f"127.0.0.1:{closed}", "profile": "kafka"}
    result, took = run_cli(mirror_cli, one_flow_config(bad_source, target, ["t"], tmp_path / "c"))
    print(f"wrong password: exit {result.returncode} after {took:.1f}s")
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"authentication failed for cluster 'msk' ({source_cluster.client.bootstrap_servers})" in result.stderr
    assert "unreachable" not in result.stderr, "a refused password was reported as a timeout, after waiting one out"
    assert source_cluster.secret not in result.stdout + result.stderr
