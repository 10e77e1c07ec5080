"""The failover runbook (docs/operations/failover.md, "From the survivor") on the real node: a shipped site stack's
mirror running on the node with a producer and a consumer group on the source; then the source lost (its broker
stopped, the mirror's pods gone as `mirrorkit:stopped` takes them); then only the site's toolbox, run with the
runbook's own kubectl commands, and the stack's outputs: `status` says the source is down, `failover` fences,
translates the group, and publishes the profile; the group consumes on the target with that profile and skips no
record. It prints the RTO (from the loss to the first record consumed on the target) and the RPO.

The node has one Kubernetes cluster, so the toolbox runs in the namespace the mirror ran in, standing in for the
survivor's, as tests/support/node_toolbox.py makes it run on the node. The module's clusters are its own: it stops
the source broker while it runs.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.testbed.clients import Record, by_partition, commit, consumer, create_topics, end_offsets, produce
from bench.testbed.kafka_cluster import KafkaCluster
from bench.testbed.testbed import TestBed
from infra.k8s.toolbox import PROFILE_CONFIGMAP, TOOLBOX, create_command, verb_args
from spark_app.config import MirrorConfig
from spark_app.dr.views import failover_plan
from spark_app.policy import target_topic
from tests.infra.harness import Run
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.kube_node import KubeNode
from tests.support.mirror_config import create_event_hubs
from tests.support.mirror_image import MirrorImage
from tests.support.node_deploy import NodeDeployment
from tests.support.node_toolbox import run_toolbox as node_run_toolbox
from tests.support.node_toolbox import toolbox_site
from tests.support.polling import wait_until
from tests.support.spark_operator import OperatorProcesses
from tests.support.stack_objects import apply_all

PARTITIONS = 3
RECORDS = 900  # per topic, before the loss
GROUP_READ = 200  # per partition of the first topic: where the application's group stands on the source
SUFFIX = "tbx"  # the namespaces of this module, apart from tests/node/test_mirror_on_node.py's
START_TIMEOUT_S = 600.0


@dataclass
class Site:
    api: KubeApiServer
    node: KubeNode
    operator: OperatorProcesses
    deployment: NodeDeployment
    source: KafkaCluster
    target: KafkaCluster
    local: MirrorConfig  # the mirror's config as this process reaches the test bed's clusters
    sent: dict[str, list[Record]]

    @property
    def namespace(self) -> str:
        return self.deployment.namespace


@pytest.fixture(scope="module")
def site(
    kube_api: KubeApiServer,
    kube_node: KubeNode,
    mirror_image: MirrorImage,
    stack_runs: dict[str, Run],
    platform_runs: dict[str, Run],
    testbed: TestBed,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Site]:
    # Clusters of its own: this test loses the source, which no test after it may inherit.
    volumes = Path(tmp_path_factory.mktemp("volumes"))
    made = toolbox_site(kube_api, kube_node, mirror_image, stack_runs, platform_runs, testbed, volumes, SUFFIX)
    deployment, operator, config = made.deployment, made.operator, made.local
    source_cluster, target_cluster = made.source, made.target
    (flow,) = config.flows
    topics = list(flow.topics.include)
    create_topics(source_cluster.admin, dict.fromkeys(topics, PARTITIONS))
    create_event_hubs(target_cluster.admin, config, flow.target, {target_topic(flow, t): PARTITIONS for t in topics})
    sent: dict[str, list[Record]] = {t: [] for t in topics}
    now = int(time.time() * 1000)
    for topic in topics:
        batch = [
            Record(i % PARTITIONS, f"k{i}".encode(), f"{topic}-v{i}".encode(), (), now + i) for i in range(RECORDS)
        ]
        produce(source_cluster.client, topic, batch)
        sent[topic] = batch
    assert apply_all(kube_api, deployment.objects, "pulumi-node") == {}
    try:
        yield Site(kube_api, kube_node, operator, deployment, source_cluster, target_cluster, config, sent)
    finally:
        app = deployment.app
        path = kube_api.object_path(app["apiVersion"], app["kind"], app["metadata"]["name"], deployment.namespace)
        with contextlib.suppress(KubeApiError):  # gone already: the test deleted it as the loss
            kube_api.request("DELETE", path)
        testbed.retire("tbx-primary")
        testbed.retire("tbx-dr")


def run_toolbox(site: Site, job: str, args: list[str]) -> tuple[bool, str]:
    """The runbook's command for these arguments, run as tests/support/node_toolbox.py does."""
    return node_run_toolbox(site.api, site.node, site.namespace, job, create_command(site.namespace, args))


def test_the_runbook_fails_over_from_the_toolbox_alone_after_the_source_is_lost(site: Site) -> None:
    api, flow = site.api, site.local.flows[0]
    app = site.deployment.app
    app_path = api.object_path(app["apiVersion"], app["kind"], app["metadata"]["name"], site.namespace)

    def running() -> bool:
        try:
            return (api.read(app).get("status") or {}).get("applicationState", {}).get("state") == "RUNNING"
        except KubeApiError as err:
            if err.status == 404:  # deleted
                return False
            raise

    def driver_pods() -> list[dict[str, Any]]:
        selector = f"spark-role=driver,sparkoperator.k8s.io/app-name={app['metadata']['name']}"
        pods = api.request("GET", f"/api/v1/namespaces/{site.namespace}/pods", params={"labelSelector": selector})
        return list(pods["items"])

    wait_until(running, "the mirror RUNNING", timeout_s=START_TIMEOUT_S, every_s=2)
    topic = flow.topics.include[0]
    copy = target_topic(flow, topic)
    # Everything sent is on the target, then the application's group stands at GROUP_READ on each partition of the
    # source, and the mirror checkpoints it on the target.
    ends = {(copy, p): len(r) for p, r in by_partition(site.sent[topic]).items()}
    wait_until(lambda: end_offsets(site.local.cluster(flow.target), ends) == ends, "every record mirrored",
               timeout_s=START_TIMEOUT_S, every_s=2)  # fmt: skip
    group = next(g for g in ("billing", "orders-app", "app") if flow.groups.matches(g))
    commit(site.local.cluster(flow.source), group, topic, dict.fromkeys(range(PARTITIONS), GROUP_READ))

    def checkpointed() -> bool:
        rows = [r for r in failover_plan(site.local, flow) if r.group == group and r.topic == copy]
        return len(rows) == PARTITIONS and all(r.source_offset == GROUP_READ for r in rows)

    wait_until(checkpointed, f"the mirror to checkpoint {group}", timeout_s=START_TIMEOUT_S, every_s=5)

    # The source region is lost: its broker stops, and the mirror's pods go (the site's flow stopped).
    lost_at = time.monotonic()
    site.source.stop()
    api.request("DELETE", app_path)
    # Its driver stops on SIGTERM and gives up the flow's lease, so failover needs no --force.
    wait_until(lambda: not running() and not driver_pods(), "the mirror gone", timeout_s=START_TIMEOUT_S, every_s=2)
    on_target = end_offsets(site.local.cluster(flow.target), ends)
    rpo_records = sum(ends.values()) - sum(on_target.values())

    # Step 2 of the runbook: status, from the toolbox.
    ok, log = run_toolbox(site, f"{TOOLBOX}-status-1", verb_args("status"))
    assert ok and "source down" in log, log
    # Steps 4 and 5: the dry run, then the failover publishing the profile.
    profile_ref = f"{site.namespace}/{PROFILE_CONFIGMAP}"
    ok, log = run_toolbox(site, f"{TOOLBOX}-dry-run-1", verb_args("failover", "--flow", flow.name, "--dry-run"))
    assert ok and "step 4/4 publish profile: not asked" in log, log
    args = verb_args("failover", "--flow", flow.name, "--publish-configmap", profile_ref)
    ok, log = run_toolbox(site, f"{TOOLBOX}-failover-1", args)
    assert ok, log
    for step in (
        "step 1/4 fence:",
        "step 2/4 translate groups: ",
        "step 3/4 lift write block:",
        f"step 4/4 publish profile: wrote ConfigMap {PROFILE_CONFIGMAP} in namespace {site.namespace}",
    ):
        assert step in log, (step, log)  # fmt: skip
    assert "0 refused" in log, log

    # Step 6: the application reads the profile and consumes on the target with its group.
    stored = api.request("GET", f"/api/v1/namespaces/{site.namespace}/configmaps/{PROFILE_CONFIGMAP}")["data"]
    profile = json.loads(stored["profile.json"])
    target = site.local.cluster(flow.target)
    assert stored["bootstrap.servers"] == profile["bootstrap_servers"] == target.bootstrap_servers
    (route,) = [r for r in profile["topics"] if r["source_topic"] == topic]
    assert route["topic"] == copy
    resumes = {g["partition"]: g["offset"] for g in profile["groups"] if g["group"] == group and g["topic"] == copy}
    assert set(resumes) == set(range(PARTITIONS)), profile["groups"]
    reader = consumer(target, group, {"enable.auto.commit": False, "auto.offset.reset": "earliest"})
    first: dict[int, Record] = {}
    read_at = 0.0
    try:
        reader.subscribe([route["topic"]])
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(first) < PARTITIONS and time.monotonic() < deadline:
            msg = reader.poll(0.5)
            if msg is None or msg.error():
                continue
            read_at = read_at or time.monotonic()
            first.setdefault(msg.partition(), Record(msg.partition(), msg.key(), msg.value(), (), 0, msg.offset()))
    finally:
        reader.close()
    assert set(first) == set(range(PARTITIONS)), first
    # No partition skips a record: the first read on the target is the source record at the group's position there,
    # or one before it (re-read).
    for p, record in first.items():
        source_order = [r.value for r in by_partition(site.sent[topic])[p]]
        assert record.value is not None and source_order.index(record.value) <= GROUP_READ, (p, record)
    print(f"RTO {read_at - lost_at:.1f} s from the loss to the first record consumed on the target;"
          f" RPO {rpo_records} record(s) not mirrored at the loss")  # fmt: skip
