"""A site's toolbox on the real node: the site deployed in namespaces of a test module's own, the toolbox made to run
there, and one run of it through the runbook's own kubectl command.

The toolbox's objects are the stack's, with the node's stand-ins of tests/support/node_deploy.py (the node's network,
the test bed's clusters) and two more of its own: the pod reaches the API server on loopback (KUBERNETES_SERVICE_HOST
and _PORT), as no `kubernetes` Service address is routed here. Network policies are not enforced on the node's
network.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.testbed.kafka_cluster import KafkaCluster, ListenerKind
from bench.testbed.testbed import TestBed
from infra.k8s.mirror_app import CONFIG_FILE
from infra.k8s.toolbox import TOOLBOX, TOOLBOX_CONFIG
from spark_app.config import MirrorConfig
from tests.infra.harness import Run
from tests.support.kube_api import KubeApiServer
from tests.support.kube_node import KubeNode
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

RUN_TIMEOUT_S = 300.0  # a toolbox run: a pod and the CLI on two busy cores


def site_on_the_node(
    api: KubeApiServer, stack_runs: dict[str, Run], platform_runs: dict[str, Run], suffix: str
) -> tuple[list[dict[str, Any]], str, OperatorProcesses]:
    """The site tests/node/test_mirror_on_node.py deploys, in namespaces named with `suffix`, with its platform's
    operator running for it."""
    platform, site = most_mounted_application(stack_runs, platform_runs)
    context, chart = platform_release(platform_runs[platform])
    home_objects = objects_by_cluster(platform_runs[platform])[context]
    served = [o for s in served_by(stack_runs, platform) for o in s.objects]
    release = operator_release(chart, namespace_renaming(home_objects + served, suffix))
    assert apply_all(api, in_own_namespaces(home_objects, suffix) + release.rbac, f"pulumi-{platform}") == {}
    operator = start_operator(api, release.manifests, release.namespace)
    return in_own_namespaces(site.objects, suffix), site.app["metadata"]["name"], operator


def toolbox_for_the_node(deployment: NodeDeployment, image: str, api_url: str) -> None:
    """The toolbox's config names the test bed's clusters as the mirror's does here (node_deploy), and its pod runs the
    image the node holds (by digest, as the mirror's), on the node's network, reaching the API server on loopback."""
    (config_map,) = [
        o for o in deployment.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == TOOLBOX_CONFIG
    ]
    config = yaml.safe_load(config_map["data"][CONFIG_FILE])
    on_node = {c["alias"]: c for c in deployment.config["clusters"]}
    config["clusters"] = [on_node[c["alias"]] for c in config["clusters"]]
    config_map["data"][CONFIG_FILE] = yaml.safe_dump(config, sort_keys=False)
    (cron,) = [o for o in deployment.objects if o["kind"] == "CronJob" and o["metadata"]["name"] == TOOLBOX]
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    host, port = api_url.removeprefix("https://").rsplit(":", 1)
    (container,) = pod["containers"]
    container["image"] = image
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]


def local_config(deployment: NodeDeployment, clusters: dict[str, KafkaCluster]) -> MirrorConfig:
    """The mirror's config as this process reaches the test bed's clusters."""
    config = MirrorConfig.model_validate(deployment.config)
    local = [clusters[c.alias].client.model_copy(update={"alias": c.alias}) for c in config.clusters]
    return config.model_copy(update={"clusters": local})


@dataclass(frozen=True)
class ToolboxSite:
    """A site deployed for its toolbox on the node: its objects as applied, the operator running for it, its two
    clusters of the test bed, and the mirror's config as this process reaches them."""

    deployment: NodeDeployment
    operator: OperatorProcesses
    source: KafkaCluster
    target: KafkaCluster
    local: MirrorConfig


def toolbox_site(
    api: KubeApiServer, node: KubeNode, image: MirrorImage, stack_runs: dict[str, Run], platform_runs: dict[str, Run],
    testbed: TestBed, volumes: Path, suffix: str,
) -> ToolboxSite:  # fmt: skip
    """The site of `site_on_the_node`, over clusters of its own (`<suffix>-primary`, an MSK-like source, and
    `<suffix>-dr`, an Event Hubs-like target: the stack's flow names its topics, and a test that loses or seeds a
    cluster leaves none to the next), on the node's image, with its toolbox made to run there; nothing applied yet."""
    source = testbed.start(f"{suffix}-primary", ListenerKind.MSK_SCRAM)
    target = testbed.start(f"{suffix}-dr", ListenerKind.EVENTHUBS)
    objects, app_name, operator = site_on_the_node(api, stack_runs, platform_runs, suffix)
    pinned = node.import_image(image.archive, image.ref, image.digest)
    clusters = {"primary": source, "dr": target}
    deployment = for_the_node(objects, app_name, pinned, api.url, clusters, volumes)
    toolbox_for_the_node(deployment, pinned, api.url)
    return ToolboxSite(deployment, operator, source, target, local_config(deployment, clusters))


def run_toolbox(api: KubeApiServer, node: KubeNode, namespace: str, job: str, command: str) -> tuple[bool, str]:
    """One of the runbook's commands (infra.k8s.toolbox.create_command), through kubectl signed in to the node's API
    server, with `$JOB` set to `job`; then the run's outcome and its log once its pod finished."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": str(api.kubeconfig()), "JOB": job, "NO_PROXY": "127.0.0.1"}
    print(f"$ JOB={job} && {command}")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs/{job}"

    def finished() -> bool:
        status = api.request("GET", jobs).get("status") or {}
        return bool(status.get("succeeded") or status.get("failed"))

    wait_until(finished, f"the toolbox run {job} to finish", timeout_s=RUN_TIMEOUT_S, every_s=2)
    status = api.request("GET", jobs)["status"]
    pods = api.request("GET", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": f"job-name={job}"})
    (pod,) = pods["items"]  # backoffLimit 0: one pod, never retried
    log = node.pod_log(namespace, pod["metadata"]["name"])
    print(log)
    return bool(status.get("succeeded")), log
