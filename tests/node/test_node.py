"""The node itself: it runs pods, and a pod on it reaches loopback and nothing else."""

from __future__ import annotations

from tests.support.kube_node import NODE_NAME, PAUSE_IMAGE
from tests.support.polling import wait_until

# A pod that tries the `kubernetes` Service's address, a public one and the API server on loopback, and says which
# it reached. busybox's nc exits non-zero when it cannot connect.
PROBE = (
    "for to in 10.96.0.1:443 1.1.1.1:443 {api}; do"
    " if busybox nc -w 3 ${{to%:*}} ${{to#*:}} </dev/null; then echo reached $to; else echo refused $to; fi;"
    " done"
)


def test_a_pod_on_the_node_reaches_the_api_server_on_loopback_and_no_other_address(kube_node, kube_api, unique):
    namespace = f"probe-{unique[-8:]}"
    kube_node.namespace(namespace)
    api = kube_api.url.removeprefix("https://")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "probe", "image": PAUSE_IMAGE, "command": ["/bin/busybox", "sh", "-c", PROBE.format(api=api)]}
            ],
        },
    }
    kube_api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)

    def finished() -> bool:
        stored = kube_api.request("GET", f"/api/v1/namespaces/{namespace}/pods/probe")
        return stored["status"].get("phase") in {"Succeeded", "Failed"}

    wait_until(finished, "the probe pod to finish", timeout_s=120)
    stored = kube_api.request("GET", f"/api/v1/namespaces/{namespace}/pods/probe")
    assert stored["status"]["phase"] == "Succeeded", (stored["status"], kube_node.log_tail())
    assert stored["spec"]["nodeName"] == NODE_NAME
    said = kube_node.pod_log(namespace, "probe").split("\n")
    print("\n".join(said))
    verdicts = [line for line in said if line.startswith(("refused", "reached"))]
    assert verdicts == ["refused 10.96.0.1:443", "refused 1.1.1.1:443", f"reached {api}"]
    # No route at all: refused at once, never sent anywhere.
    assert sum("Network is unreachable" in line for line in said) == 2, said
