"""`pytest -m "not kafka and not spark and not kube"` selects the tests that need neither brokers, Spark nor the
Kubernetes API server, and only those; a test that runs the mirror's `run` in a subprocess says so with the
`mirror_cli` fixture, which marks it `spark`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import CLUSTER_FIXTURES, FAST_SELECTION, KUBE_FIXTURES, SPARK_FIXTURES

ROOT = Path(__file__).resolve().parent.parent
# What a command line that runs the mirror looks like when a test module builds it itself: `python -m spark_app`, or
# `run --config <a path>` behind any launcher (the console script, the image's entrypoint, cli.main in process).
RUNS_THE_MIRROR = re.compile(r'"-m",\s*"spark_app"|"run",\s*"--config",\s*str\(')
# Collects as `pytest --collect-only -q -m EXPR` does, and writes each selected test's fixtures and string parameters.
COLLECT = """
import json, sys
import pytest

class Record:
    def pytest_collection_finish(self, session):
        selected = {}
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            params = [v for v in callspec.params.values() if isinstance(v, str)] if callspec else []
            selected[item.nodeid] = sorted(set(getattr(item, "fixturenames", ())) | set(params))
        with open(sys.argv[2], "w") as out:
            json.dump(selected, out)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", sys.argv[1]], plugins=[Record()]))
"""


def collect(expression: str, tmp_path: Path) -> dict[str, list[str]]:
    out = tmp_path / "selected.json"
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, expression, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_the_fast_selection_holds_the_unit_tests_and_nothing_that_needs_brokers_spark_or_the_api_server(tmp_path):
    fast = collect(FAST_SELECTION, tmp_path)
    assert any(node.startswith("tests/test_dr_formats.py::") for node in fast)
    assert any(node.startswith("tests/infra/") for node in fast)  # the workflow's unit job relies on it
    assert {n: f for n, f in fast.items() if set(f) & (CLUSTER_FIXTURES | KUBE_FIXTURES | SPARK_FIXTURES)} == {}
    slow = collect("kafka or spark or kube", tmp_path)
    assert slow and not set(slow) & set(fast)
    kube = collect("kube", tmp_path)
    assert kube and all(set(f) & KUBE_FIXTURES for f in kube.values())


def test_spark_marks_the_spark_fixture_users_and_the_tests_that_run_the_mirror_cli(tmp_path):
    spark = collect("spark", tmp_path)
    everything = collect("kafka or not kafka", tmp_path)
    assert {n for n, f in everything.items() if set(f) & SPARK_FIXTURES} == set(spark)
    cli_runs = [n for n in spark if n.startswith("tests/test_mirror_cli_run.py::")]
    assert cli_runs and all("mirror_cli" in spark[n] and "spark" not in spark[n] for n in cli_runs)
    assert any(n.startswith("tests/test_mirror_backlog.py::") for n in spark)
    assert "tests/test_image.py::test_every_path_the_dockerfile_copies_exists" not in spark


def test_no_test_module_builds_the_mirrors_run_command_itself_so_none_escapes_the_spark_mark():
    """Only tests/support/mirror_cli.py (behind the `mirror_cli` fixture) builds a command line that runs the mirror."""
    assert RUNS_THE_MIRROR.search('[sys.executable, "-m", "spark_app", "run", "--config", str(path)]')
    assert RUNS_THE_MIRROR.search('[str(ENTRYPOINT), "run", "--config", str(config), "--available-now"]')
    assert not RUNS_THE_MIRROR.search('mirror_cli.command(path, "--available-now")')
    modules = sorted((ROOT / "tests").rglob("test_*.py")) + [ROOT / "tests" / "conftest.py"]
    found = [str(m.relative_to(ROOT)) for m in modules if m != Path(__file__) and RUNS_THE_MIRROR.search(m.read_text())]
    assert found == [], "build the command with the `mirror_cli` fixture, which marks the test `spark`"
