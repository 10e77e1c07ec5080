"""The Kubeflow Spark Operator's controller and webhook as local processes against the test API server.

`.ci/setup` builds the operator's command from a Go module of its own (tests/support/operator). Both processes run
with the arguments the chart's Deployments give them, so they act in the namespaces the stack's release names, and the
chart's webhook configurations are applied as rendered. What a pod would provide is replaced for loopback: no leader
election (one replica each), no probe or metrics listeners, the webhook configurations point at
`https://localhost:<port>` instead of a Service (the webhook's own certificate names localhost, and it writes its CA
into them as in a cluster). Each signs in as the service account its Deployment names, with a token the API server
issues for it, so the chart's RBAC is what lets it act. The controller runs spark-submit from the pyspark install
(`SPARK_HOME`), which reaches the API server as from the operator's pod: through KUBERNETES_SERVICE_HOST and _PORT,
signed in as the controller's account.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyspark

from bench.testbed.ports import free_port
from tests.support.kube_api import BIN, CRDS, SETUP_HINT, KubeApiServer

OPERATOR = BIN / "spark-operator"
# Its controller and webhook watch every kind of its API, not only the SparkApplication the program makes.
OPERATOR_CRDS = (
    CRDS / "sparkoperator.k8s.io_scheduledsparkapplications.yaml",
    CRDS.parent / "operator-crds" / "sparkoperator.k8s.io_sparkconnects.yaml",
)
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
READY_TIMEOUT_S = 60.0
PROCESSES = ("spark-operator-webhook", "spark-operator-controller")  # their log files' names


@dataclass(frozen=True)
class OperatorProcesses:
    """Where the operator runs: its log files, for a failing test's message."""

    api: KubeApiServer

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name} ---\n{self.api.log_tail(name, lines)}" for name in PROCESSES)


def as_deployed(manifests: list[dict[str, Any]], namespace: str, command: str) -> tuple[list[str], tuple[str, str]]:
    """The arguments and the service account `(namespace, name)` of the chart's Deployment whose container runs
    `spark-operator <command> ...`, in the release's `namespace` unless it names its own."""
    for obj in manifests:
        if obj["kind"] == "Deployment":
            pod = obj["spec"]["template"]["spec"]
            (container,) = pod["containers"]
            if container.get("args", [])[:1] == [command]:
                where = obj["metadata"].get("namespace", namespace)
                return list(container["args"]), (where, pod["serviceAccountName"])
    raise AssertionError(f"the chart renders no Deployment running `{command}`")


def served_at(configuration: dict[str, Any], port: int) -> dict[str, Any]:
    """A webhook configuration of the chart, each webhook sent to `https://localhost:<port><its path>`."""
    hooks = []
    for hook in configuration["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hooks.append(hook | {"clientConfig": {"url": f"https://localhost:{port}{path}"}})
    return configuration | {"webhooks": hooks}


def start_operator(api: KubeApiServer, manifests: list[dict[str, Any]], namespace: str) -> OperatorProcesses:
    """Run the webhook and the controller the chart's `manifests` describe for a release in `namespace`, each as its
    service account (the release's namespace, accounts and RBAC must be applied), and return once the webhook serves
    and the API server trusts it."""
    missing = [str(p) for p in (OPERATOR, *OPERATOR_CRDS) if not p.is_file()]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: {SETUP_HINT}")
    api.install_crds(OPERATOR_CRDS)
    folder = api.folder / "spark-operator"
    folder.mkdir(exist_ok=True)
    port = free_port()
    configurations = [served_at(o, port) for o in manifests if o["kind"] in WEBHOOK_KINDS]
    assert {c["kind"] for c in configurations} == set(WEBHOOK_KINDS), "the chart renders no webhook configurations"
    for configuration in configurations:
        api.apply(configuration, field_manager="helm")
    server = urlsplit(api.url)
    env = os.environ | {
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port),
    }
    here = ["--leader-election=false", "--metrics-bind-address=0", "--health-probe-bind-address=0"]
    webhook_args, webhook_account = as_deployed(manifests, namespace, "webhook")
    controller_args, controller_account = as_deployed(manifests, namespace, "controller")
    webhook_kubeconfig, controller_kubeconfig = api.kubeconfig(webhook_account), api.kubeconfig(controller_account)
    webhook = api.launch(
        PROCESSES[0],
        OPERATOR,
        *webhook_args,
        *here,
        f"--kubeconfig={webhook_kubeconfig}",
        f"--webhook-port={port}",
        f"--webhook-cert-dir={folder / 'certs'}",
        env=env,
    )
    controller = api.launch(
        PROCESSES[1],
        OPERATOR,
        *controller_args,
        *here,
        f"--kubeconfig={controller_kubeconfig}",
        env=env | {"KUBECONFIG": str(controller_kubeconfig)},  # spark-submit's Kubernetes client reads it
    )
    processes = OperatorProcesses(api)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (all(_trusted(api, c) for c in configurations) and _listening(port)):
        for process in (webhook, controller):
            if process.poll() is not None:
                raise RuntimeError(f"the Spark Operator exited with {process.returncode}:\n{processes.log_tail()}")
        if time.monotonic() > deadline:
            wait = f"{READY_TIMEOUT_S:.0f}s"
            raise RuntimeError(f"the operator's webhook is not served after {wait}:\n{processes.log_tail()}")
        time.sleep(0.2)
    return processes


def _trusted(api: KubeApiServer, configuration: dict[str, Any]) -> bool:
    """Whether the webhook has written its CA into every webhook of the configuration, as it does in a cluster."""
    stored = api.read(configuration)
    return all(hook["clientConfig"].get("caBundle") for hook in stored["webhooks"])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("localhost", port), timeout=1).close()
    except OSError:
        return False
    return True
