"""The Kubeflow Spark Operator's controller and webhook as local processes against the test API server.

`.ci/setup` builds the operator's command from a Go module of its own (tests/support/operator). Both processes run
with the arguments the chart's Deployments give them, so they act in the namespaces the stack's release names, and the
chart's webhook configurations are applied as rendered. What a pod would provide is replaced for loopback: no leader
election (one replica each), no probe or metrics listeners, the webhook configurations point at
`https://localhost:<port>` instead of a Service (the webhook's own certificate names localhost, and it writes its CA
into them as in a cluster), and both sign in with the test server's admin kubeconfig. The controller runs
spark-submit from the pyspark install (`SPARK_HOME`), which reaches the API server as from the operator's pod:
through KUBERNETES_SERVICE_HOST and _PORT, signed in with the same kubeconfig.
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


def container_args(manifests: list[dict[str, Any]], command: str) -> list[str]:
    """The arguments of the chart's Deployment whose container runs `spark-operator <command> ...`."""
    for obj in manifests:
        if obj["kind"] == "Deployment":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            if container.get("args", [])[:1] == [command]:
                return list(container["args"])
    raise AssertionError(f"the chart renders no Deployment running `{command}`")


def served_at(configuration: dict[str, Any], port: int) -> dict[str, Any]:
    """A webhook configuration of the chart, each webhook sent to `https://localhost:<port><its path>`."""
    hooks = []
    for hook in configuration["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hooks.append(hook | {"clientConfig": {"url": f"https://localhost:{port}{path}"}})
    return configuration | {"webhooks": hooks}


def start_operator(api: KubeApiServer, manifests: list[dict[str, Any]]) -> OperatorProcesses:
    """Run the webhook and the controller the chart's `manifests` describe (its namespace must exist), and return
    once the webhook serves and the API server trusts it."""
    missing = [str(p) for p in (OPERATOR, *OPERATOR_CRDS) if not p.is_file()]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: {SETUP_HINT}")
    api.install_crds(OPERATOR_CRDS)
    folder = api.folder / "spark-operator"
    folder.mkdir(exist_ok=True)
    kubeconfig = str(api.kubeconfig())
    port = free_port()
    configurations = [served_at(o, port) for o in manifests if o["kind"] in WEBHOOK_KINDS]
    assert {c["kind"] for c in configurations} == set(WEBHOOK_KINDS), "the chart renders no webhook configurations"
    for configuration in configurations:
        api.apply(configuration, field_manager="helm")
    here = ["--leader-election=false", "--metrics-bind-address=0", "--health-probe-bind-address=0"]
    server = urlsplit(api.url)
    env = os.environ | {
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "KUBERNETES_SERVICE_HOST": str(server.hostname),
        "KUBERNETES_SERVICE_PORT": str(server.port),
        "KUBECONFIG": kubeconfig,  # spark-submit's Kubernetes client reads it
    }
    webhook = api.launch(
        PROCESSES[0],
        OPERATOR,
        *container_args(manifests, "webhook"),
        *here,
        f"--kubeconfig={kubeconfig}",
        f"--webhook-port={port}",
        f"--webhook-cert-dir={folder / 'certs'}",
        env=env,
    )
    controller = api.launch(
        PROCESSES[1], OPERATOR, *container_args(manifests, "controller"), *here, f"--kubeconfig={kubeconfig}", env=env
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
