"""A real Kubernetes node beside the test API server: containerd and runc, the kubelet, the scheduler and the
controller manager, all on loopback inside a network namespace that has nothing else.

`bench/node/build` builds the kubelet, the scheduler and the controller manager from the Go module proxy
(tests/support/node/go.mod) and the mirror's image (images/mirror/build); `bench/node/run` enters a new network and
mount namespace whose only interface is loopback and runs the node's tests there. So no Service, pod or cluster
address can lead anywhere: a connection to one fails at once. Pods use the node's network (`hostNetwork`), which is
that namespace's loopback; the node's address is 127.0.0.1.

containerd keeps its images in a cache folder across runs (importing the mirror's image costs a minute), and all
else (its state and socket, the kubelet's folder, pod logs) in the API server's throwaway folder.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.testbed.ports import free_ports
from tests.support.kube_api import BIN, KubeApiError, KubeApiServer
from tests.support.polling import wait_until

NODE_NAME = "mirrorkit-node"
NODE_IP = "127.0.0.1"
CACHE = Path.home() / ".cache" / "mirrorkit" / "node"
# The sandbox ("pause") image cannot be pulled here: a static busybox that sleeps stands in, built once.
PAUSE_IMAGE = "localhost/mirrorkit/pause:1"
NAMESPACE = "k8s.io"  # containerd's namespace for the kubelet's images and containers
BUILD_HINT = "run `bench/node/build` (it builds the kubelet, the scheduler and the controller manager, and the image)"
RUN_HINT = "run the node's tests through `bench/node/run`: it enters a network namespace that has only loopback"
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-controller-manager")


class NodeStartError(RuntimeError):
    pass


def only_loopback() -> bool:
    """Whether this process's network namespace has no interface but loopback, and loopback is up with 127.0.0.1.
    Asked over netlink (`ip`): /sys/class/net shows the namespace that mounted /sys, not this one."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if line.strip()]
    lo = subprocess.run(["ip", "-o", "addr", "show", "lo"], capture_output=True, text=True, check=True).stdout
    return names == ["lo"] and "127.0.0.1/8" in lo


def require_node_tools() -> dict[str, Path]:
    """The node's binaries, or a failure that says how to get them; and the refusal to start outside a namespace of
    loopback alone, where a pod could reach the world."""
    if not only_loopback():
        raise NodeStartError(f"this network namespace has interfaces besides loopback: {RUN_HINT}")
    found = {name: BIN / name for name in NODE_BINARIES}
    system = {name: shutil.which(name) for name in ("containerd", "runc", "ctr", "umoci", "busybox")}
    missing = [str(p) for p in found.values() if not p.is_file()] + [n for n, p in system.items() if p is None]
    if missing:
        raise NodeStartError(f"missing {', '.join(missing)}: {BUILD_HINT}")
    return found | {name: Path(str(path)) for name, path in system.items()}


@dataclass
class KubeNode:
    """One node (containerd, kubelet, scheduler, controller manager) joined to `api`; stopped with it."""

    api: KubeApiServer
    folder: Path = Path()
    socket: Path = Path()

    def start(self) -> KubeNode:
        tools = require_node_tools()
        self.folder = self.api.folder / "node"
        self.folder.mkdir(exist_ok=True)
        self._start_containerd(tools)
        self._import_pause_image(tools)
        admin = self.api.kubeconfig()
        scheduler_port, manager_port, kubelet_port, healthz_port = free_ports(4)
        self.api.launch(
            "kube-scheduler",
            tools["kube-scheduler"],
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={scheduler_port}",
        )
        self.api.launch(
            "kube-controller-manager",
            tools["kube-controller-manager"],
            f"--kubeconfig={admin}",
            f"--authentication-kubeconfig={admin}",
            f"--authorization-kubeconfig={admin}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={manager_port}",
            f"--service-account-private-key-file={self.api.service_account_key}",
            f"--root-ca-file={self.api.ca}",  # published as kube-root-ca.crt, which every pod's token volume mounts
            "--use-service-account-credentials=true",
            "--controllers=*,-nodeipam",  # no pod CIDRs: pods use the node's network
        )
        config = self.folder / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(kubelet_port, healthz_port)))
        self.api.launch(
            "kubelet",
            tools["kubelet"],
            f"--config={config}",
            f"--kubeconfig={admin}",
            f"--root-dir={self.folder / 'kubelet'}",
            f"--cert-dir={self.folder / 'kubelet-pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
            "--v=1",
        )
        try:
            wait_until(
                lambda: self._exists(f"/api/v1/nodes/{NODE_NAME}"), f"node {NODE_NAME} registered", timeout_s=120
            )
            self._give_address()
            wait_until(self._ready, f"node {NODE_NAME} Ready", timeout_s=120, every_s=1)
        except AssertionError as err:
            raise NodeStartError(f"{err}:\n{self.log_tail()}") from None
        return self

    def _kubelet_config(self, port: int, healthz_port: int) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": NODE_IP,
            "healthzPort": healthz_port,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,  # this machine has cgroup v1 only
            "cgroupsPerQOS": False,  # pods' cgroups straight under the root: no QoS tree to set up and clean away
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "podLogsDir": str(self.folder / "pod-logs"),
            # The API server reads pods' logs from the kubelet without a client certificate of its own; only loopback
            # in a namespace of its own reaches this port.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": str(self._resolv_conf()),
            "clusterDomain": "cluster.local",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,  # no image is pulled again here: never collect one
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "registerWithTaints": [],
            "nodeStatusReportFrequency": "10s",
            "fileCheckFrequency": "1s",
        }

    def _resolv_conf(self) -> Path:
        """No name server: a name that is not in /etc/hosts fails at once."""
        path = self.folder / "resolv.conf"
        path.write_text("options ndots:1\n")
        return path

    def _start_containerd(self, tools: dict[str, Path]) -> None:
        """containerd with its images in the cache, everything else here, and the settings this machine needs
        (FACTS.md): cgroupfs, no AppArmor, oom_score_adj left alone, the local sandbox image, a loopback-only CNI."""
        CACHE.mkdir(parents=True, exist_ok=True)
        self._lock = (CACHE / "containerd.lock").open("w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one node at a time owns the image store
        cni = self.folder / "cni"
        cni.mkdir(exist_ok=True)
        # containerd reports the network ready once a CNI config loads; pods here use the node's network.
        (cni / "10-loopback.conflist").write_text(
            '{"cniVersion": "1.0.0", "name": "loopback", "plugins": [{"type": "loopback"}]}\n'
        )
        self.socket = self.folder / "containerd.sock"
        config = self.folder / "containerd.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{CACHE / "containerd"}"\n'
            f'state = "{self.folder / "containerd-state"}"\n'
            f'[grpc]\n  address = "{self.socket}"\n'
            '[plugins."io.containerd.grpc.v1.cri"]\n'
            f'  sandbox_image = "{PAUSE_IMAGE}"\n'
            "  restrict_oom_score_adj = true\n"
            "  disable_apparmor = true\n"
            '  [plugins."io.containerd.grpc.v1.cri".cni]\n'
            '    bin_dir = "/usr/lib/cni"\n'
            f'    conf_dir = "{cni}"\n'
            '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
            '    runtime_type = "io.containerd.runc.v2"\n'
            '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
            "    SystemdCgroup = false\n"
        )
        self.api.launch("containerd", tools["containerd"], f"--config={config}")
        wait_until(lambda: self._ctr("version", check=False).returncode == 0, "containerd serving", timeout_s=60)

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={self.socket}", f"--namespace={NAMESPACE}", *args],
            capture_output=True,
            text=True,
            check=check,
        )

    def has_image(self, ref: str) -> bool:
        return self.stored_digest(ref) is not None

    def stored_digest(self, ref: str) -> str | None:
        """The manifest digest the node holds under `ref`, if any (`ctr images list`: REF TYPE DIGEST ...)."""
        for line in self._ctr("images", "list").stdout.splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == ref:
                return fields[2]
        return None

    def import_image(self, archive: Path, ref: str, digest: str) -> str:
        """Hold the image of `digest` under `ref`, loading it from the OCI archive unless the node has it already;
        returns its name by digest, which the node also answers to (a pulled image would carry it; an imported one
        is given it here)."""
        if self.stored_digest(ref) != digest:
            self._ctr("images", "import", "--base-name", ref.rsplit(":", 1)[0], str(archive))
        if self.stored_digest(ref) != digest:
            raise NodeStartError(f"{archive} did not give {ref} at {digest}: {self._ctr('images', 'list').stdout}")
        pinned = f"{ref.rsplit(':', 1)[0]}@{digest}"
        if self.stored_digest(pinned) != digest:
            self._ctr("images", "tag", "--force", ref, pinned)
        return pinned

    def _import_pause_image(self, tools: dict[str, Path]) -> None:
        if self.has_image(PAUSE_IMAGE):
            return
        with tempfile.TemporaryDirectory(prefix="mirrorkit-pause-") as tmp:
            layout, bundle = Path(tmp) / "oci", Path(tmp) / "bundle"
            umoci = str(tools["umoci"])
            subprocess.run([umoci, "init", "--layout", str(layout)], check=True)
            subprocess.run([umoci, "new", "--image", f"{layout}:1"], check=True)
            subprocess.run([umoci, "unpack", "--rootless", "--image", f"{layout}:1", str(bundle)], check=True)
            rootfs = bundle / "rootfs"
            (rootfs / "bin").mkdir(parents=True, exist_ok=True)
            shutil.copy2(tools["busybox"], rootfs / "bin" / "busybox")
            subprocess.run([umoci, "repack", "--image", f"{layout}:1", str(bundle)], check=True)
            subprocess.run(
                [
                    umoci,
                    "config",
                    "--image",
                    f"{layout}:1",
                    "--config.entrypoint=/bin/busybox",
                    "--config.cmd=sleep",
                    "--config.cmd=2147483647",
                ],  # fmt: skip
                check=True,
            )
            archive = Path(tmp) / "pause.tar"
            with tarfile.open(archive, "w") as tar:
                tar.add(layout, arcname=".")
            self._ctr("images", "import", "--base-name", PAUSE_IMAGE.rsplit(":", 1)[0], str(archive))

    def _give_address(self) -> None:
        """The kubelet refuses a loopback node address ("nodeIP can't be loopback address") and sets none, so the node's
        status gets 127.0.0.1 here. The kubelet keeps what it cannot set itself: pods of the node's network get it as
        their `status.podIP` (Spark's driver binds to it), and the API server reads pods' logs through it."""
        addresses = [{"type": "InternalIP", "address": NODE_IP}, {"type": "Hostname", "address": NODE_NAME}]
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{NODE_NAME}/status",
            {"status": {"addresses": addresses}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )

    def _ready(self) -> bool:
        try:
            node = self.api.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        except KubeApiError as err:  # not registered yet
            if err.status == 404:
                return False
            raise
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conditions.get("Ready") == "True"

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Make a namespace and wait for the controller manager to give it its `default` service account, without
        which no pod is admitted there."""
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        self.api.request("POST", "/api/v1/namespaces", body)
        wait_until(lambda: self._exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
                   f"the default service account of {name}", timeout_s=60)  # fmt: skip

    def _exists(self, path: str) -> bool:
        try:
            self.api.request("GET", path)
        except KubeApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    def cordon(self, closed: bool) -> None:
        """Mark the node unschedulable (as `kubectl cordon`), or schedulable again."""
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{NODE_NAME}",
            {"spec": {"unschedulable": closed}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )

    def evict(self, namespace: str, pod: str) -> None:
        """Evict a pod through the Eviction API, as `kubectl drain` does: disruption budgets may refuse it."""
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        self.api.request("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", eviction)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's log, through the API server (which reads it from the kubelet)."""
        params = {"container": container} if container else {}
        return self.api.text(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", params=params)

    def log_tail(self, lines: int = 30) -> str:
        names = ("containerd", "kubelet", "kube-scheduler", "kube-controller-manager")
        return "\n".join(f"--- {name} ---\n{self.api.log_tail(name, lines)}" for name in names)


@contextmanager
def running_node(api: KubeApiServer) -> Iterator[KubeNode]:
    """A node joined to `api` for the length of the block; its pods are deleted before it stops, so no container
    outlives the test run."""
    node = KubeNode(api).start()
    try:
        yield node
    finally:
        _delete_every_pod(api)
        wait_until(lambda: not _pods(api), "every pod gone", timeout_s=120)


def _pods(api: KubeApiServer) -> list[dict[str, Any]]:
    return list(api.request("GET", "/api/v1/pods")["items"])


def _delete_every_pod(api: KubeApiServer) -> None:
    for pod in _pods(api):
        meta = pod["metadata"]
        try:
            # The run is over: no grace period (a mirror's driver would take its 300 s to stop otherwise).
            api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        params={"gracePeriodSeconds": "0"})  # fmt: skip
        except KubeApiError as err:
            if err.status != 404:
                raise
