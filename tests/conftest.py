"""Session-wide fixtures: the real Kafka clusters every integration test shares, the real Kubernetes API server, and
the `kafka`, `spark` and `kube` marks that say which tests need them.

Brokers and the API server start once per session; each test isolates itself with its own topic names (see `unique`)
or namespaces. The four clusters below are proxied (bench/testbed/toxiproxy.py): beside `client`, each offers
`proxied`, the same access through Toxiproxy, and `faults`, which breaks that path; a test that breaks it heals it
before it ends.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bench.testbed.kafka_cluster import KafkaCluster, ListenerKind, MultiBrokerCluster
from bench.testbed.ports import free_port
from bench.testbed.s3 import S3Server, moto_server
from bench.testbed.spark_standalone import SparkStandalone
from bench.testbed.testbed import TestBed
from tests.support.kube_api import CHARTS, SETUP_HINT, KubeApiServer
from tests.support.mirror_cli import MirrorCli

# Spark binds its drivers and executors to loopback, as every process of the test bed does: left to itself it takes
# the host's own address, and the mirror's tasks would connect to it. Every process the suite starts inherits this.
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"

CLUSTER_FIXTURES = frozenset(
    {
        "testbed",
        "plaintext_cluster",
        "source_cluster",
        "target_cluster",
        "multi_broker_cluster",
        "acl_source_cluster",
        "acl_target_cluster",
    }
)
# Object storage is reached through Spark's s3a connector, so the `s3` fixture needs Spark too; `mirror_cli` starts the
# mirror's `run`, and with it Spark, in a subprocess.
SPARK_FIXTURES = frozenset({"spark", "spark_standalone", "s3", "mirror_cli"})
# What only `.ci/setup` builds, and the pipeline's unit job does not: the API server, the charts it copies and the
# compiled copy core; a test that needs one asks for its fixture, which marks it `kube` (tests/test_markers.py finds the
# fast tests that reach `.cache` or the compiled core without one).
KUBE_FIXTURES = frozenset({"kube_api", "kube_charts", "compiled_core"})
NODE_FIXTURES = frozenset({"kube_node"})  # bench/node/run alone provides what they need
# The tests that need neither brokers, Spark nor the API server: the pipeline's unit job runs this selection.
FAST_SELECTION = "not kafka and not spark and not kube"


@pytest.fixture(scope="session")
def testbed() -> Iterator[TestBed]:
    bed = TestBed()
    yield bed
    bed.close()


@pytest.fixture(scope="session")
def plaintext_cluster(testbed: TestBed) -> KafkaCluster:
    """On-prem style Kafka (PLAINTEXT)."""
    return testbed.start("onprem", ListenerKind.PLAINTEXT, proxied=True)


@pytest.fixture(scope="session")
def source_cluster(testbed: TestBed) -> KafkaCluster:
    """The MSK-like source: SASL_SSL with SCRAM-SHA-512."""
    return testbed.start("msk", ListenerKind.MSK_SCRAM, proxied=True)


@pytest.fixture(scope="session")
def target_cluster(testbed: TestBed) -> KafkaCluster:
    """The Event Hubs-like target: SASL_SSL PLAIN with `$ConnectionString`, 1 MB cap, no topic creation."""
    return testbed.start("eventhubs", ListenerKind.EVENTHUBS, proxied=True)


@pytest.fixture(scope="session")
def acl_source_cluster(testbed: TestBed) -> KafkaCluster:
    """An MSK-like source (SCRAM) whose broker checks ACLs: the mirror holds only the grants infra renders for it.
    Started on first use, for the topic ACL tests; each test names its own topics and principals."""
    return testbed.start("msk-acls-source", ListenerKind.MSK_SCRAM, acls=True)


@pytest.fixture(scope="session")
def acl_target_cluster(testbed: TestBed) -> KafkaCluster:
    """An MSK-like DR target (SCRAM) whose broker checks ACLs, for the copies' ACLs and their write block."""
    return testbed.start("msk-acls-target", ListenerKind.MSK_SCRAM, acls=True)


@pytest.fixture
def own_cluster(testbed: TestBed) -> Iterator[Callable[..., KafkaCluster]]:
    """Starts clusters of the test's own (one it stops, throttles or fills with state no other test may see), each
    retired when the test ends: a broker left idle for the rest of the session takes the two cores' time from the
    tests after it."""
    started: list[str] = []

    def start(name: str, kind: ListenerKind | str, **options) -> KafkaCluster:
        cluster = testbed.start(name, kind, **options)
        started.append(name)
        return cluster

    yield start
    for name in started:
        testbed.retire(name)


@pytest.fixture(scope="session")
def multi_broker_cluster(testbed: TestBed) -> MultiBrokerCluster:
    """A plaintext cluster of two brokers, node 1 also its controller, for leader and broker faults: stopping broker 2
    takes the partitions it leads offline. A test that stops a broker starts it again before it ends."""
    return testbed.start_multi("multi", brokers=2, proxied=True)


@pytest.fixture(scope="session")
def spark():
    """One local Spark for the whole run, started as the mirror starts its own."""
    # Python workers must run this interpreter, or they cannot import pyarrow and confluent-kafka.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spark_app.mirror import start_spark

    context = start_spark("local[2]", app_name="mirrorkit-tests")
    context.setLogLevel("WARN")
    yield context
    context.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 API (moto's server mode) on a loopback port, for checkpoints in object storage."""
    with moto_server(tmp_path_factory.mktemp("moto"), free_port()) as server:
        yield server


@pytest.fixture(scope="session")
def kube_api() -> Iterator[KubeApiServer]:
    """etcd and kube-apiserver on loopback with the operators' CRDs installed (tests/support/kube_api.py)."""
    server = KubeApiServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kube_charts() -> Path:
    """The Helm charts `.ci/setup` copies out of the operators' Go modules (tests/support/kube_api.py's CHARTS)."""
    assert CHARTS.is_dir(), f"{CHARTS} is missing: {SETUP_HINT}"
    return CHARTS


@pytest.fixture(scope="session")
def compiled_core() -> ModuleType:
    """The compiled copy core's module (`mirrorkit_copy_core`), which `.ci/setup` builds and installs."""
    return importlib.import_module("mirrorkit_copy_core")


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    """A Spark standalone cluster for the whole run: a master and two workers of one core each. Their executors'
    Python workers import the mirror from this checkout (the application names their interpreter)."""
    root = Path(__file__).resolve().parent.parent
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), env={"PYTHONPATH": str(root)})
    try:
        cluster.start()
    except BaseException:
        cluster.close()
        raise
    yield cluster
    cluster.close()


@pytest.fixture
def mirror_cli(tmp_path: Path) -> MirrorCli:
    """The mirror's `run` in a subprocess (tests/support/mirror_cli.py): a test that starts it asks for this fixture,
    which marks it `spark`."""
    return MirrorCli(tmp_path)


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A short per-test suffix for topic names, aliases and group ids."""
    return f"{request.node.name[:24].strip('_[]')}-{uuid.uuid4().hex[:8]}".replace("[", "-").replace("]", "")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """On failure, attach the tail of every running broker's log to the report."""
    report = yield
    if report.failed and "testbed" in getattr(item, "funcargs", {}):
        bed: TestBed = item.funcargs["testbed"]
        for cluster in bed.clusters.values():
            report.sections.append((f"broker '{cluster.name}' log (tail)", cluster.log_tail()))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what each test needs, so `-m "not kafka and not spark and not kube"` selects the fast ones.

    - `kafka`: the test's fixture closure holds a cluster fixture (CLUSTER_FIXTURES), or one of its parameters names
      one (a test parametrized over cluster names calls `request.getfixturevalue`).
    - `spark`: it holds a SPARK_FIXTURES fixture; `mirror_cli` among them, through which every test that starts the
      mirror's `run` in a subprocess builds its command (tests/test_markers.py checks that no test builds it alone).
    - `kube`: it holds a fixture of KUBE_FIXTURES: the real API server, whose binaries `.ci/setup` builds, or another
      thing only set-up makes (the charts, the compiled copy core).
    - `node`: it holds a NODE_FIXTURES fixture: a real Kubernetes node, which only `bench/node/run` can start.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = {v for v in callspec.params.values() if isinstance(v, str)} if callspec else set()
        needs_kafka = bool((fixtures | params) & CLUSTER_FIXTURES)
        if needs_kafka:
            item.add_marker(pytest.mark.kafka)
        if fixtures & KUBE_FIXTURES:
            item.add_marker(pytest.mark.kube)
        if fixtures & NODE_FIXTURES:
            item.add_marker(pytest.mark.node)
        if fixtures & SPARK_FIXTURES:
            item.add_marker(pytest.mark.spark)
