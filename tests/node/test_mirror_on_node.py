"""The kit as a platform team deploys it, on a real node: the image built from our Dockerfile, a shipped site stack's
Kubernetes objects, the Spark Operator reconciling its SparkApplication, the driver making executor pods, and the
mirror copying between the test bed's brokers inside those pods; then pod-level faults, with the records checked on
both clusters after each.

What the node cannot give (cluster DNS, a network of pods, four cores, a storage provisioner) is stood in for in
tests/support/node_deploy.py, and only there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.kafka_cluster import KafkaCluster
from infra.k8s.mirror_app import CONFIG_HASH_ANNOTATION, config_hash
from spark_app.config import STOP_GRACE_S, MirrorConfig
from spark_app.policy import target_topic
from tests.infra.harness import Run
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.kube_node import KubeNode
from tests.support.mirror_config import create_event_hubs
from tests.support.mirror_image import MirrorImage
from tests.support.node_deploy import NodeDeployment, for_the_node
from tests.support.polling import wait_until
from tests.support.spark_operator import OperatorProcesses, start_operator
from tests.support.stack_objects import (
    apply_all,
    in_own_namespaces,
    most_mounted_application,
    namespace_renaming,
    objects_by_cluster,
    operator_release,
    platform_release,
    served_by,
)

PARTITIONS = 3
BATCH = 600  # records per topic per round: several batches of the mirror, small enough for two cores
START_TIMEOUT_S = 600.0  # a JVM and Python start in each pod on two cores: minutes, not seconds


@dataclass
class Mirror:
    """The deployed mirror: what was applied, who runs it, and every record sent to its source so far."""

    api: KubeApiServer
    node: KubeNode
    operator: OperatorProcesses
    deployment: NodeDeployment
    source: KafkaCluster
    target: KafkaCluster
    sent: dict[str, list[Record]]

    @property
    def namespace(self) -> str:
        return self.deployment.namespace

    @property
    def name(self) -> str:
        return str(self.deployment.app["metadata"]["name"])

    def state(self) -> dict[str, Any]:
        return dict(self.api.read(self.deployment.app).get("status") or {})

    def pods(self, role: str) -> list[dict[str, Any]]:
        selector = f"spark-role={role},sparkoperator.k8s.io/app-name={self.name}"
        found = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods", params={"labelSelector": selector})
        return [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]

    def running(self, role: str, count: int = 1) -> list[dict[str, Any]]:
        ready = [p for p in self.pods(role) if p["status"].get("phase") == "Running"]
        return ready if len(ready) >= count else []

    def wait(self, condition: Callable[[], object], what: str) -> None:
        """`wait_until`, failing with what the node, the operator and the pods say."""
        try:
            wait_until(condition, what, timeout_s=START_TIMEOUT_S, every_s=2)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """The application's status, each pod's phase and why, the namespace's last events, and the logs' tails."""
        lines = [f"application status: {self.state()}"]
        pods = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        for pod in pods:
            status = pod["status"]
            states = [c.get("state") for c in status.get("containerStatuses", [])]
            lines.append(f"pod {pod['metadata']['name']}: {status.get('phase')} {states} {status.get('conditions')}")
        events = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/events")["items"]
        lines += [f"event {e['involvedObject']['name']}: {e['reason']}: {e['message'][:300]}" for e in events[-15:]]
        for pod in pods:
            try:
                tail = self.node.pod_log(self.namespace, pod["metadata"]["name"]).splitlines()[-25:]
            except KubeApiError as err:
                tail = [str(err)]
            lines += [f"--- log of {pod['metadata']['name']} ---", *tail]
        return "\n".join([*lines, self.operator.log_tail(15), self.node.log_tail(10)])

    def produce_round(self, tag: str) -> None:
        """BATCH more records on each topic, each unique, with keys, headers and timestamps."""
        now = int(time.time() * 1000)
        for topic in self.sent:
            batch = [
                Record(
                    i % PARTITIONS,
                    f"{tag}-k{i}".encode(),
                    f"{tag}-{topic}-v{i}".encode() * 8,
                    (("round", tag.encode()), ("i", str(i).encode())),
                    now + i,
                )  # fmt: skip
                for i in range(BATCH)
            ]
            produce(self.source.client, topic, batch)
            self.sent[topic] += batch

    def check(self, what: str) -> dict[str, int]:
        """Every record sent is on the target, first copies in order; returns the duplicates per topic."""
        duplicates = {}
        config = MirrorConfig.model_validate(self.deployment.config)
        (flow,) = config.flows
        for topic, sent in self.sent.items():
            copy = target_topic(flow, topic)
            got = read_all(self.target.client, copy, len(sent), timeout_s=START_TIMEOUT_S, exact=False)
            assert_each_record_once_in_order(copy, got, sent, at_least_once=True)
            duplicates[topic] = len(got) - len(sent)
        print(f"after {what}: {sum(len(s) for s in self.sent.values())} sent, 0 lost, duplicates {duplicates}")
        return duplicates


def deployed_site(
    api: KubeApiServer, stack_runs: dict[str, Run], platform_runs: dict[str, Run]
) -> tuple[list[dict[str, Any]], str, OperatorProcesses]:
    """The site whose driver mounts the most (as the API server's operator test picks it), moved into namespaces of
    its own, with its platform stack's operator running for it: its objects, its application's name, the operator."""
    platform, site = most_mounted_application(stack_runs, platform_runs)
    context, chart = platform_release(platform_runs[platform])
    home_objects = objects_by_cluster(platform_runs[platform])[context]
    served = [o for s in served_by(stack_runs, platform) for o in s.objects]
    release = operator_release(chart, namespace_renaming(home_objects + served, "node"))
    assert apply_all(api, in_own_namespaces(home_objects, "node") + release.rbac, f"pulumi-{platform}") == {}
    operator = start_operator(api, release.manifests, release.namespace)
    return in_own_namespaces(site.objects, "node"), site.app["metadata"]["name"], operator


@pytest.fixture(scope="module")
def mirror(
    kube_api: KubeApiServer,
    kube_node: KubeNode,
    mirror_image: MirrorImage,
    stack_runs: dict[str, Run],
    platform_runs: dict[str, Run],
    source_cluster: KafkaCluster,
    target_cluster: KafkaCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Mirror]:
    objects, app_name, operator = deployed_site(kube_api, stack_runs, platform_runs)
    pinned = kube_node.import_image(mirror_image.archive, mirror_image.ref, mirror_image.digest)
    deployment = for_the_node(
        objects,
        app_name,
        pinned,  # by digest, as a stack names it
        kube_api.url,
        {"primary": source_cluster, "dr": target_cluster},
        Path(tmp_path_factory.mktemp("volumes")),
    )
    config = MirrorConfig.model_validate(deployment.config)
    (flow,) = config.flows
    topics = list(flow.topics.include)
    create_topics(source_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_event_hubs(target_cluster.admin, config, flow.target, {target_topic(flow, t): PARTITIONS for t in topics})
    run = Mirror(kube_api, kube_node, operator, deployment, source_cluster, target_cluster, {t: [] for t in topics})
    run.produce_round("before")
    assert apply_all(kube_api, deployment.objects, "pulumi-node") == {}
    yield run
    # Gone before the node stops, so the operator does not start its driver again meanwhile.
    kube_api.request("DELETE", kube_api.object_path("sparkoperator.k8s.io/v1beta2", "SparkApplication", run.name,
                                                    run.namespace))  # fmt: skip


def test_the_site_stacks_application_runs_on_the_node_and_mirrors_byte_exact(mirror):
    """The operator submits the stack's SparkApplication, it reaches RUNNING, the driver makes its executor pods, and
    every record on the source lands on the target with its key, value, headers, partition and timestamp."""
    mirror.wait(lambda: mirror.state().get("applicationState", {}).get("state") == "RUNNING", "the application RUNNING")
    mirror.wait(lambda: mirror.running("executor", 2), "two executor pods running")
    assert mirror.check("the first start") == dict.fromkeys(mirror.sent, 0)

    (driver,) = mirror.running("driver")
    executors = mirror.running("executor", 2)
    spec = mirror.deployment.app["spec"]
    for pod, role in [(driver, "driver"), *((e, "executor") for e in executors)]:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"].startswith("spark-kubernetes")]
        print(f"{role} {pod['metadata']['name']}: account {pod['spec']['serviceAccountName']},"
              f" security {pod['spec']['securityContext']} {container['securityContext']},"
              f" mounts {[m['mountPath'] for m in container['volumeMounts']]}")  # fmt: skip
        assert pod["spec"]["serviceAccountName"] == spec[role]["serviceAccount"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 185
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["image"] == spec["image"]
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert {m["mountPath"] for m in spec[role]["volumeMounts"]} <= mounted
        assert {s["path"] for s in spec[role]["secrets"]} <= mounted


def wait_running_again(mirror: Mirror, after: str, what: str) -> dict[str, Any]:
    """Wait until a driver pod other than `after` (a uid) runs with its executors and the application is RUNNING."""

    def back() -> bool:
        drivers = mirror.running("driver")
        state = mirror.state().get("applicationState", {}).get("state")
        return bool(drivers) and drivers[0]["metadata"]["uid"] != after and state == "RUNNING"

    mirror.wait(back, f"the application RUNNING again after {what}")
    mirror.wait(lambda: mirror.running("executor", 2), f"two executors again after {what}")
    (driver,) = mirror.running("driver")
    for pod in [driver, *mirror.running("executor", 2)]:  # the read-only root and the non-root user held throughout
        (container,) = [c for c in pod["spec"]["containers"] if c["name"].startswith("spark-kubernetes")]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, pod["metadata"]["name"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 185, pod["metadata"]["name"]
    return driver


def test_the_driver_pod_deleted_stops_on_sigterm_and_the_operator_starts_it_again_with_nothing_lost(mirror):
    """A pod deletion sends the driver SIGTERM: the mirror stops between copies and exits 0 within its grace period;
    the operator submits the application again, and the new driver resumes from the checkpoint on the volume."""
    mirror.wait(lambda: mirror.running("executor", 2), "the mirror running")
    mirror.produce_round("driver-1")
    (driver,) = mirror.running("driver")
    meta = driver["metadata"]
    pods = f"/api/v1/namespaces/{meta['namespace']}/pods"
    last = mirror.api.delete_and_wait(pods, meta["name"], timeout_s=STOP_GRACE_S + 60)
    (status,) = [s for s in last["status"]["containerStatuses"] if s["name"] == "spark-kubernetes-driver"]
    print(f"the deleted driver's container: {status['state']}")
    assert status["state"]["terminated"]["exitCode"] == 0, status
    wait_running_again(mirror, meta["uid"], "the driver's deletion")
    mirror.produce_round("driver-2")
    mirror.check("the driver pod deleted")


def test_an_executor_pod_deleted_mid_copy_is_replaced_and_nothing_is_lost(mirror):
    """The driver asks Kubernetes for a new executor; the copy that executor held is done again."""
    mirror.wait(lambda: mirror.running("executor", 2), "the mirror running")
    (driver,) = mirror.running("driver")
    gone = mirror.running("executor", 2)[0]["metadata"]
    mirror.produce_round("executor-1")
    mirror.api.request("DELETE", f"/api/v1/namespaces/{gone['namespace']}/pods/{gone['name']}")
    mirror.wait(lambda: gone["uid"] not in {p["metadata"]["uid"] for p in mirror.running("executor", 2)},
                "a new executor in place of the deleted one")  # fmt: skip
    assert mirror.running("driver")[0]["metadata"]["uid"] == driver["metadata"]["uid"], "the driver restarted"
    mirror.produce_round("executor-2")
    mirror.check("an executor pod deleted")


def test_a_config_change_submits_the_application_again_with_the_new_config(mirror):
    """`pulumi up` of a changed config rewrites the ConfigMap and the config hash in the spec; the operator submits the
    application again (a ConfigMap edit alone restarts nothing), and the mirror goes on from its checkpoint."""
    mirror.wait(lambda: mirror.running("executor", 2), "the mirror running")
    before = mirror.state()["submissionID"]
    (driver,) = mirror.running("driver")
    changed = mirror.deployment.config | {"trigger_interval_s": 0.5}
    for obj in mirror.deployment.with_config(changed):
        mirror.api.apply(obj, field_manager="pulumi-node")
    driver = wait_running_again(mirror, driver["metadata"]["uid"], "the config change")
    assert mirror.state()["submissionID"] != before
    assert driver["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == config_hash(
        yaml.safe_dump(changed, sort_keys=False)
    )
    mirror.produce_round("config")
    mirror.check("a config change")


def test_the_node_drained_of_the_mirrors_pods_and_opened_again_resumes_with_nothing_lost(mirror):
    """As `kubectl drain` does: the node cordoned and the mirror's pods evicted (the driver gets SIGTERM). With no
    other node the driver cannot come back until the node is opened again; then the operator starts it again, and it
    resumes from its checkpoint. No disruption budget blocks the evictions (infra.k8s.mirror_app)."""
    mirror.wait(lambda: mirror.running("executor", 2), "the mirror running")
    (driver,) = mirror.running("driver")
    mirror.produce_round("drain-1")
    mirror.node.cordon(True)
    try:
        for pod in [driver, *mirror.running("executor", 2)]:
            mirror.node.evict(pod["metadata"]["namespace"], pod["metadata"]["name"])
        mirror.wait(lambda: not mirror.running("driver") and not mirror.running("executor", 1), "the node drained")
        mirror.produce_round("drain-2")  # written while no mirror runs
    finally:
        mirror.node.cordon(False)
    wait_running_again(mirror, driver["metadata"]["uid"], "the drain")
    mirror.check("the node drained and opened again")
