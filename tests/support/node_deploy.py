"""A site stack's Kubernetes objects made to run on the test bed's node: what changes, and why, in one place.

The objects are the ones the program registers (tests/support/stack_objects.py). What a real cluster has and this
node has not is stood in for here, and nothing else is touched:
- **No cluster network, no DNS.** Pods use the node's network (`hostNetwork`), which is loopback in a namespace of its
  own; Pod Security's `baseline` and `restricted` levels refuse that field alone, so the namespace enforces
  `privileged` and still warns and audits at the stack's level. The driver reaches the API server on loopback
  (`spark.kubernetes.driver.master`), and the executors reach the driver at the node's address, so Spark's driver
  Service step, whose name only cluster DNS resolves, is left out.
- **One node's network.** The executors' block managers take free ports rather than Spark's fixed one.
- **Two cores.** The pods request a fraction of a core each and a small heap, so a driver and two executors fit.
- **No storage provisioner.** The checkpoint claim binds to a host-path volume made for it.
- **The test bed's clusters.** The rendered config names the stack's clusters; here each alias points at a test-bed
  cluster on loopback, its CA and secret in the Secret the stack mounts for that alias, and the config-hash annotation
  follows, as `pulumi up` would set it.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.testbed.kafka_cluster import KafkaCluster
from infra.k8s.mirror_app import CONFIG_FILE, CONFIG_HASH_ANNOTATION, EXCLUDED_DRIVER_STEPS, config_hash
from infra.naming import SECRETS_DIR
from tests.support.kube_node import NODE_IP

# The image's user (images/mirror/Dockerfile): the checkpoint volume is a host folder it must own.
IMAGE_USER = 185
NOT_ON_THIS_NODE = "org.apache.spark.deploy.k8s.features.DriverServiceFeatureStep"


@dataclass(frozen=True)
class NodeDeployment:
    """The site's objects as they are applied to the node, and the names the tests look for."""

    objects: list[dict[str, Any]]
    app: dict[str, Any]
    namespace: str
    config: dict[str, Any]  # the mirror's config as the ConfigMap holds it
    config_map: dict[str, Any]

    def with_config(self, config: dict[str, Any]) -> list[dict[str, Any]]:
        """What `pulumi up` of a changed config sends: the ConfigMap, and the application with the new hash."""
        config_map, app = copy.deepcopy(self.config_map), copy.deepcopy(self.app)
        _render(config, config_map, app)
        return [config_map, app]


def _render(config: dict[str, Any], config_map: dict[str, Any], app: dict[str, Any]) -> None:
    rendered = yaml.safe_dump(config, sort_keys=False)
    config_map["data"][CONFIG_FILE] = rendered
    app["spec"]["driver"]["annotations"][CONFIG_HASH_ANNOTATION] = config_hash(rendered)


def for_the_node(
    objects: list[dict[str, Any]],
    app_name: str,
    image: str,
    api_url: str,
    clusters: dict[str, KafkaCluster],
    volumes: Path,
) -> NodeDeployment:
    """The site's `objects` (already in namespaces of their own) as they run on the node: see the module's doc."""
    out = copy.deepcopy(objects)
    (app,) = [o for o in out if o["kind"] == "SparkApplication" and o["metadata"]["name"] == app_name]
    namespace = app["metadata"]["namespace"]
    spec = app["spec"]
    (config_map,) = [
        o for o in out if o["kind"] == "ConfigMap" and o["metadata"]["name"] == spec["volumes"][0]["configMap"]["name"]
    ]
    config = yaml.safe_load(config_map["data"][CONFIG_FILE])
    for entry in config["clusters"]:
        cluster = clusters[entry["alias"]].client
        entry["bootstrap_servers"] = cluster.bootstrap_servers
        entry["ca_file"] = f"{SECRETS_DIR}/{entry['alias']}/ca.pem"
        if entry.get("username"):
            entry["username"] = cluster.username
    _render(config, config_map, app)

    out = [o for o in out if o["kind"] != "Secret"] + [
        secret_for(namespace, s["name"], clusters[s["path"].rsplit("/", 1)[1]]) for s in spec["driver"]["secrets"]
    ]
    for obj in out:
        if obj["kind"] == "Namespace" and obj["metadata"]["name"] == namespace:
            obj["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "privileged"
    spec["image"] = image
    for role, cores in (("driver", "0.3"), ("executor", "0.3")):
        spec[role]["hostNetwork"] = True
        spec[role]["memory"] = "1g"
        spec["sparkConf"][f"spark.kubernetes.{role}.request.cores"] = cores
    spec["executor"]["cores"] = 1
    spec["sparkConf"] |= {
        "spark.kubernetes.driver.master": api_url,
        "spark.kubernetes.driver.pod.excludedFeatureSteps": f"{EXCLUDED_DRIVER_STEPS},{NOT_ON_THIS_NODE}",
        "spark.driver.host": NODE_IP,
        # Each executor's block manager on a free port: on one node's network, two executors asking for Spark's
        # fixed 7079 (declared as a pod port, so a host port here) could never be placed together. The driver's
        # keeps it (its pod declares the port, and 0 is no port).
        "spark.blockManager.port": "0",
        "spark.driver.blockManager.port": "7079",
    }
    for claim in [o for o in out if o["kind"] == "PersistentVolumeClaim"]:
        out.append(host_volume_for(claim, volumes))
    return NodeDeployment(out, app, namespace, config, config_map)


def secret_for(namespace: str, name: str, cluster: KafkaCluster) -> dict[str, Any]:
    """The Secret the stack mounts for a cluster's alias, holding the test-bed cluster's password and CA."""
    assert cluster.secret is not None, f"{cluster.name} signs in with no secret"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"password": cluster.secret, "ca.pem": cluster.tls.ca_pem.read_text()},
    }


def host_volume_for(claim: dict[str, Any], root: Path) -> dict[str, Any]:
    """A host-path PersistentVolume bound to `claim` ahead of time, in a folder the image's user owns."""
    meta = claim["metadata"]
    folder = root / f"{meta['namespace']}-{meta['name']}"
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(folder, IMAGE_USER, IMAGE_USER)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{meta['namespace']}-{meta['name']}"[:63]},
        "spec": {
            "capacity": claim["spec"]["resources"]["requests"],
            "accessModes": claim["spec"]["accessModes"],
            "hostPath": {"path": str(folder), "type": "Directory"},
            "claimRef": {"namespace": meta["namespace"], "name": meta["name"]},
            # The claim's class (the stack names one): a pre-bound volume of another class is never bound to it.
            "storageClassName": claim["spec"].get("storageClassName", ""),
            "persistentVolumeReclaimPolicy": "Retain",
        },
    }
