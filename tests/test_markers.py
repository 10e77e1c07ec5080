"""`pytest -m "not kafka and not spark and not kube"` selects the tests that need neither brokers, Spark nor the
Kubernetes API server, nor anything else only `.ci/setup` builds, and only those; a test that runs the mirror's `run`
in a subprocess says so with the `mirror_cli` fixture, which marks it `spark`."""

from __future__ import annotations

import dis
import functools
import inspect
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, ModuleType

from _pytest.mark.expression import Expression  # what `-m` parses with; pytest is pinned in the lock

from tests.conftest import CLUSTER_FIXTURES, FAST_SELECTION, KUBE_FIXTURES, SPARK_FIXTURES

ROOT = Path(__file__).resolve().parent.parent
# What a command line that runs the mirror looks like when a test module builds it itself: `python -m spark_app`, or
# `run --config <a path>` behind any launcher (the console script, the image's entrypoint, cli.main in process).
RUNS_THE_MIRROR = re.compile(r'"-m",\s*"spark_app"|"run",\s*"--config",\s*str\(')
# What `.ci/setup` builds that the pipeline's unit job (.github/workflows/infra.yml), which runs the fast selection
# from a clean checkout, does not: everything in `.cache` but actionlint and Kafka's jars, which that job fetches and
# builds too, and the compiled copy core, which it does not install. The JVM copier's jar is in `.cache/jvm-copier`.
SET_UP = ROOT / ".cache"
UNIT_JOB_BUILDS = (SET_UP / "bin" / "actionlint", SET_UP / "jars" / "kafka")
COMPILED_CORE = "mirrorkit_copy_core"
# Test-side helpers are followed into their own code; the shipped code (spark_app) is looked at one call deep, as a
# mirror module that imports the compiled core or reads `.cache` where it stands is what the test asks for.
FOLLOWED = ("tests", "bench")
SHIPPED = ("spark_app",)
# Collects the whole suite once, as `pytest --collect-only -q` does, and writes each test's marks, its fixtures and
# string parameters, and what of set-up's products its code and its fixtures' code reach (`set_up_needs`). Each
# selection below is then pytest's own `-m` expression evaluated on those marks, not another collection.
COLLECT = """
import json, sys
import pytest
from tests.test_markers import set_up_needs

class Record:
    def pytest_collection_finish(self, session):
        found = {}
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            params = [v for v in callspec.params.values() if isinstance(v, str)] if callspec else []
            fixtures = [defs[-1].func for defs in item._fixtureinfo.name2fixturedefs.values() if defs]
            found[item.nodeid] = {
                "marks": sorted({mark.name for mark in item.iter_markers()}),
                "fixtures": sorted(set(getattr(item, "fixturenames", ())) | set(params)),
                "needs": sorted(set_up_needs(item.function, *fixtures)),
            }
        with open(sys.argv[1], "w") as out:
            json.dump(found, out)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[Record()]))
"""


@functools.cache
def _collected() -> dict[str, dict[str, list[str]]]:
    """What COLLECT writes; the suite is collected once per run of this module."""
    with tempfile.TemporaryDirectory(prefix="mirrorkit-markers-") as folder:
        out = Path(folder) / "collected.json"
        done = subprocess.run(
            [sys.executable, "-c", COLLECT, str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(out.read_text())


def collect(expression: str, what: str = "fixtures") -> dict[str, list[str]]:
    """Each test `pytest -m expression` selects, with its fixtures and string parameters, or (`what="needs"`) what of
    set-up's products it reaches. The expression is evaluated by pytest's own `-m` parser on each test's marks."""
    selects = Expression.compile(expression)
    return {node: found[what] for node, found in _collected().items() if selects.evaluate(_has_mark(found["marks"]))}


def _has_mark(marks: list[str]) -> Callable[..., bool]:
    """A matcher for pytest's expression: a bare mark name is true when the test carries that mark."""
    return lambda name, /, **kwargs: not kwargs and name in marks


def _codes(code: CodeType) -> Iterator[CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _named(code: CodeType, names: dict) -> Iterator[tuple[object, str | None]]:
    """What `code` names: its globals, attributes of the modules among them, what it imports (a module, or `(name,)`
    for one not imported yet); each with the string constant that follows it, if one does (`setattr(module, "NAME",
    ...)` names what a test puts something else in the place of)."""
    last: object = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            last = names.get(ins.argval)
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM") and isinstance(last, ModuleType):
            last = getattr(last, ins.argval, None)
        elif ins.opname == "IMPORT_NAME":
            last = sys.modules.get(ins.argval, (ins.argval,))
        elif ins.opname == "LOAD_CONST" and isinstance(last, ModuleType) and isinstance(ins.argval, str):
            yield getattr(last, ins.argval, None), ins.argval
            last = None
            continue
        else:
            last = None
            continue
        yield last, None


def _needs_of(value: object) -> str | None:
    """The set-up product `value` is, if it is one."""
    if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(SET_UP):
        return None if any(value.is_relative_to(built) for built in UNIT_JOB_BUILDS) else str(value.relative_to(ROOT))
    name = value.__name__ if isinstance(value, ModuleType) else value[0] if isinstance(value, tuple) else None
    if isinstance(name, str) and name.split(".")[0] == COMPILED_CORE:
        return COMPILED_CORE
    return None


def set_up_needs(*functions: object) -> set[str]:
    """What of set-up's products (paths in `.cache` beyond UNIT_JOB_BUILDS, the compiled core) the code of `functions`
    names, through the test-side functions and classes it names (FOLLOWED) and one call into the shipped code; less
    what `functions` themselves put something else in the place of (`monkeypatch.setattr(module, "NAME", ...)`)."""
    needs: set[str] = set()
    replaced: set[str] = set()
    todo, seen = [(f, True, True) for f in functions], set()
    while todo:
        obj, follow, given = todo.pop()
        if isinstance(obj, type):
            members = [m.__func__ if isinstance(m, staticmethod | classmethod) else m for m in vars(obj).values()]
            members += [m.fget for m in vars(obj).values() if isinstance(m, property)]
            todo += [(m, follow, False) for m in members]
            continue
        function = inspect.unwrap(obj) if callable(obj) else obj
        code = getattr(function, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        for inner in _codes(code):
            for value, attribute in _named(inner, getattr(function, "__globals__", {})):
                found = _needs_of(value)
                if found and attribute is not None and given:
                    replaced.add(found)
                elif found:
                    needs.add(found)
                module = (getattr(value, "__module__", None) or "").split(".")[0]
                if not follow or attribute is not None or getattr(value, "__module__", None) == __name__:
                    continue  # the scan's own code names `.cache`: it is what it looks for
                if inspect.isfunction(value) or isinstance(value, type):
                    if module in FOLLOWED:
                        todo.append((value, True, False))
                    elif module in SHIPPED:
                        todo.append((value, False, False))
    return needs - replaced


def test_the_fast_selection_holds_the_unit_tests_and_nothing_that_needs_brokers_spark_or_the_api_server():
    fast = collect(FAST_SELECTION)
    assert any(node.startswith("tests/test_dr_formats.py::") for node in fast)
    assert any(node.startswith("tests/infra/") for node in fast)  # the workflow's unit job relies on it
    assert {n: f for n, f in fast.items() if set(f) & (CLUSTER_FIXTURES | KUBE_FIXTURES | SPARK_FIXTURES)} == {}
    slow = collect("kafka or spark or kube")
    assert slow and not set(slow) & set(fast)
    kube = collect("kube")
    assert kube and all(set(f) & KUBE_FIXTURES for f in kube.values())


def test_no_test_in_the_fast_selection_needs_what_only_set_up_builds():
    """The pipeline's unit job runs the fast selection without `.ci/setup`: a test there that reads `.cache` (the
    charts, the API server's binaries, the JVM copier's jar) or imports the compiled copy core fails from a clean
    checkout. It asks for the fixture that gives it what it needs (`kube_charts`, `compiled_core`), which marks it."""
    fast = collect(FAST_SELECTION, what="needs")
    assert fast, "the fast selection is empty"
    assert {node: needs for node, needs in fast.items() if needs} == {}
    marked = collect("kube", what="needs")
    chart = "tests/infra/test_kube_api.py::test_the_chart_set_up_copies_is_the_one_the_program_installs"
    assert marked[chart] == [".cache/kube/charts"], "the scan no longer sees a test that reads the charts"


# Code shaped as the mistakes the scan is there to catch, and as code that only looks like them; compiled from text,
# so that the test that scans it is not itself found to need what it names.
SAMPLES = """
from bench.testbed.kafka_cluster import kafka_classpath
from spark_app.realtime.jvm import local_jars
from tests.support import kube_api

def reads_the_charts():
    return (kube_api.CHARTS / "spark-operator" / "Chart.yaml").read_text()

def renders_a_chart():
    return kube_api.helm_template("spark-operator", "r", "ns", {})

def imports_the_core():
    from mirrorkit_copy_core import Copier
    return Copier

def starts_the_jvm_slots():
    return [jar for jar in local_jars() if jar.endswith(".jar")]

def runs_actionlint_and_kafkas_classes_and_names_cache_in_text():
    return [str(kube_api.ROOT / ".cache" / "bin" / "actionlint"), kafka_classpath(), ".cache/kube/charts, as text"]

def puts_a_missing_path_in_the_place_of_the_charts(monkeypatch, tmp_path):
    monkeypatch.setattr(kube_api, "CHARTS", tmp_path)
    return kube_api.helm_template("spark-operator", "r", "ns", {})
"""


def test_the_scan_finds_set_up_products_named_directly_through_helpers_and_in_imports():
    sample: dict = {}
    exec(SAMPLES, sample)
    assert set_up_needs(sample["reads_the_charts"]) == {".cache/kube/charts"}
    assert set_up_needs(sample["renders_a_chart"]) == {".cache/bin", ".cache/kube/crds", ".cache/kube/charts"}
    assert set_up_needs(sample["imports_the_core"]) == {COMPILED_CORE}
    assert set_up_needs(sample["starts_the_jvm_slots"]) == {".cache/jvm-copier"}
    assert set_up_needs(sample["runs_actionlint_and_kafkas_classes_and_names_cache_in_text"]) == set()
    assert set_up_needs(sample["puts_a_missing_path_in_the_place_of_the_charts"]) == {".cache/bin", ".cache/kube/crds"}


def test_spark_marks_the_spark_fixture_users_and_the_tests_that_run_the_mirror_cli():
    spark = collect("spark")
    everything = collect("kafka or not kafka")
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
