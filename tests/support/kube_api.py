"""A real Kubernetes API server and its etcd on loopback, with the operators' CRDs, for what mocks cannot check.

`.ci/setup` builds etcd, kube-apiserver and Helm from the Go module proxy (tests/support/kube/go.mod), generates the
Spark Operator's and the Prometheus Operator's CRDs from their Go API types, and copies the Spark Operator's chart from
its Go module. There is no controller manager: nothing runs the built-in objects (the Spark Operator runs beside the
server where a test starts it: tests/support/spark_operator.py), deleted namespaces never finish terminating, and no
`default` service account appears.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.testbed.ports import free_ports
from bench.testbed.tls import make_loopback_tls

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".cache" / "bin"
CRDS = ROOT / ".cache" / "kube" / "crds"
# The kinds the program makes; the operators' other CRDs are generated too but not installed (each costs seconds).
INSTALLED_CRDS = (
    "sparkoperator.k8s.io_sparkapplications",
    "monitoring.coreos.com_podmonitors",
    "monitoring.coreos.com_prometheusrules",
)
CHARTS = ROOT / ".cache" / "kube" / "charts"
READY_TIMEOUT_S = 60.0
SETUP_HINT = "run `bash .ci/setup` (it builds etcd and kube-apiserver from the Go module proxy, and the CRDs)"
ADMIN = "mirrorkit-test-admin"


class ServerStartError(RuntimeError):
    pass


class KubeApiError(Exception):
    """The API server refused a request; the message is its own Status message."""

    def __init__(self, status: int, method: str, path: str, message: str):
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ResourceType:
    path: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool


def require_binaries() -> dict[str, Path]:
    found = {name: BIN / name for name in ("etcd", "kube-apiserver", "helm")}
    missing = [str(p) for p in found.values() if not p.is_file()]
    missing += [str(CRDS / f"{name}.yaml") for name in INSTALLED_CRDS if not (CRDS / f"{name}.yaml").is_file()]
    if not CHARTS.is_dir():
        missing.append(str(CHARTS))
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: {SETUP_HINT}")
    return found


def helm_template(chart: str, release: str, namespace: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifests `helm template` renders from a chart in CHARTS for this release and these values."""
    helm = require_binaries()["helm"]
    with tempfile.TemporaryDirectory(prefix="mirrorkit-helm-") as folder:
        given = Path(folder) / "values.json"  # JSON is YAML
        given.write_text(json.dumps(values))
        done = subprocess.run(
            [str(helm), "template", release, str(CHARTS / chart), "--namespace", namespace, "--values", str(given)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "HOME": folder},  # no kubeconfig, no user Helm settings
        )
    if done.returncode != 0:
        raise RuntimeError(f"helm template {chart} failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def api_version_path(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


@dataclass
class KubeApiServer:
    """etcd plus kube-apiserver (RBAC, an admin token in system:masters), started and stopped as one."""

    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mirrorkit-kube-")))
    url: str = ""
    started_in_s: float = 0.0
    _token: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    _ca: Path = field(default=Path(), repr=False)
    _processes: list[subprocess.Popen] = field(default_factory=list, repr=False)
    _session: requests.Session = field(default_factory=requests.Session, repr=False)
    _types: dict[tuple[str, str], ResourceType] = field(default_factory=dict, repr=False)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> KubeApiServer:
        """Start etcd and the API server, wait for /readyz, install the CRDs. A port another process took between
        our probe and the bind is retried with new ports."""
        binaries = require_binaries()
        began = time.monotonic()
        tls = make_loopback_tls(self.folder / "tls")
        self._ca = tls.ca_pem
        self._write_credentials()
        self._session.headers["Authorization"] = f"Bearer {self._token}"
        self._session.verify = str(tls.ca_pem)
        self._session.trust_env = False  # else REQUESTS_CA_BUNDLE or a proxy from the environment wins
        for attempt in range(1, attempts + 1):
            etcd_client, etcd_peer, secure_port = free_ports(3)
            self.url = f"https://127.0.0.1:{secure_port}"
            self._launch_etcd(binaries["etcd"], etcd_client, etcd_peer, attempt)
            self.launch(
                "kube-apiserver",
                binaries["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={secure_port}",
                f"--tls-cert-file={tls.server_pem}",
                f"--tls-private-key-file={tls.server_pem}",
                f"--cert-dir={self.folder / 'certs'}",
                f"--service-account-key-file={self.folder / 'sa.pub'}",
                f"--service-account-signing-key-file={self.folder / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=RBAC",
                f"--token-auth-file={self.folder / 'tokens.csv'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--endpoint-reconciler-type=none",  # on 127.0.0.1 the `kubernetes` service's endpoints are refused
                "--kubelet-preferred-address-types=InternalIP",  # a node of the test bed has no name to look up
            )
            try:
                self._wait_ready()
                break
            except ServerStartError:
                taken = any("address already in use" in self.log_tail(n, 400) for n in ("etcd", "kube-apiserver"))
                self._terminate()
                if not taken or attempt == attempts:
                    raise
        self.started_in_s = time.monotonic() - began
        self.install_crds()
        return self

    def stop(self) -> None:
        self._terminate()
        self._session.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _terminate(self) -> None:
        for process in reversed(self._processes):
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._processes.clear()

    def _write_credentials(self) -> None:
        """The service-account token signing key pair, and the token file with the admin's token."""
        account_key = ec.generate_private_key(ec.SECP256R1())
        (self.folder / "sa.key").write_bytes(
            account_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (self.folder / "sa.pub").write_bytes(
            account_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        tokens = self.folder / "tokens.csv"
        tokens.write_text(f'{self._token},{ADMIN},{ADMIN},"system:masters"\n')
        tokens.chmod(0o600)

    def _launch_etcd(self, binary: Path, client_port: int, peer_port: int, attempt: int) -> None:
        client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        self.launch(
            "etcd",
            binary,
            "--name=test",
            f"--data-dir={self.folder / f'etcd-{attempt}'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--unsafe-no-fsync",  # a throwaway store: durability buys nothing here
            "--log-level=warn",
        )

    def log_tail(self, name: str, lines: int = 40) -> str:
        log = self.folder / f"{name}.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def launch(self, name: str, binary: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Start a process that runs against the server (etcd and the server itself, or a controller), its output in
        `<name>.log` here; it is stopped with the server, before those started earlier."""
        with (self.folder / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [str(binary), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self._processes.append(process)
        return process

    @property
    def ca(self) -> Path:
        """The certificate authority of the server's certificate."""
        return self._ca

    @property
    def service_account_key(self) -> Path:
        """The key that signs service-account tokens (a controller manager signs with it too)."""
        return self.folder / "sa.key"

    def kubeconfig(self, account: tuple[str, str] | None = None) -> Path:
        """A kubeconfig, 0600 in the server's folder, signed in as the admin (its token is in system:masters) or as
        the service account `(namespace, name)`, with a token the server issues for it as for a pod of that account."""
        user, token = ADMIN, self._token
        if account is not None:
            namespace, name = account
            request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
            issued = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", request)
            user, token = f"{namespace}.{name}", issued["status"]["token"]
        path = self.folder / f"{user}.kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self._ca)}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        }
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for process, name in zip(self._processes, ("etcd", "kube-apiserver"), strict=True):
                if process.poll() is not None:
                    raise ServerStartError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                if self._session.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not listening yet, or busy starting
                pass
            time.sleep(0.2)
        raise ServerStartError(
            f"kube-apiserver not ready after {READY_TIMEOUT_S:.0f}s:\n{self.log_tail('kube-apiserver')}"
        )

    def install_crds(self, files: Sequence[Path] = tuple(CRDS / f"{name}.yaml" for name in INSTALLED_CRDS)) -> None:
        """Apply these generated CRDs (by default the kinds the program makes) and wait until each is established and
        served."""
        crds = [yaml.safe_load(path.read_text()) for path in files]
        for crd in crds:
            self.apply(crd, field_manager="mirrorkit-tests")
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {c["metadata"]["name"] for c in crds}
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
                if conditions.get("Established") == "True":
                    pending.discard(name)
            time.sleep(0.1)
        assert not pending, f"CRDs not established after {READY_TIMEOUT_S:.0f}s: {sorted(pending)}"
        self._types.clear()

    # -- requests -------------------------------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> dict[str, Any]:
        response = self._session.request(method, f"{self.url}{path}", json=body, timeout=30, **kwargs)
        if response.status_code >= 400:
            try:
                message = response.json().get("message", response.text)
            except ValueError:
                message = response.text
            raise KubeApiError(response.status_code, method, path, message)
        return response.json()

    def text(self, path: str, **kwargs: Any) -> str:
        """A GET whose answer is text, such as a pod's log."""
        response = self._session.get(f"{self.url}{path}", timeout=30, **kwargs)
        if response.status_code >= 400:
            raise KubeApiError(response.status_code, "GET", path, response.text[:500])
        return response.text

    def delete_and_wait(self, collection: str, name: str, timeout_s: float) -> dict[str, Any]:
        """Delete object `name` of the collection at path `collection` and wait until it is gone; returns it as the
        server last held it (a pod's last container states, for one)."""
        since = self.request("GET", collection)["metadata"]["resourceVersion"]
        self.request("DELETE", f"{collection}/{name}")
        params = {
            "watch": "true",
            "resourceVersion": since,
            "fieldSelector": f"metadata.name={name}",
            "timeoutSeconds": str(int(timeout_s)),
        }
        with self._session.get(f"{self.url}{collection}", params=params, stream=True, timeout=timeout_s + 30) as answer:
            if answer.status_code >= 400:
                raise KubeApiError(answer.status_code, "GET", collection, answer.text)
            for line in answer.iter_lines():
                event = json.loads(line)
                if event["type"] == "DELETED":
                    return dict(event["object"])
        raise AssertionError(f"{collection}/{name} was not gone {timeout_s:.0f} s after its deletion")

    def first_added(self, collection: str, name: str, since: str, timeout_s: float) -> dict[str, Any] | None:
        """Object `name` of the collection at path `collection` as the server first stored it after resource version
        `since`, even if it is gone by now; None if none was added within `timeout_s`."""
        params = {
            "watch": "true",
            "resourceVersion": since,
            "fieldSelector": f"metadata.name={name}",
            "timeoutSeconds": str(int(timeout_s)),
        }
        url = f"{self.url}{collection}"
        with self._session.get(url, params=params, stream=True, timeout=timeout_s + 30) as response:
            if response.status_code >= 400:
                raise KubeApiError(response.status_code, "GET", collection, response.text)
            for line in response.iter_lines():
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise KubeApiError(event["object"]["code"], "GET", collection, event["object"]["message"])
                if event["type"] == "ADDED":
                    return event["object"]
        return None

    def resource_type(self, api_version: str, kind: str) -> ResourceType:
        """Where the server serves a kind, from its discovery documents (read again after CRDs change)."""
        key = (api_version, kind)
        if key not in self._types:
            base = api_version_path(api_version)
            for entry in self._discover(base):
                if "/" not in entry["name"]:  # subresources such as pods/status
                    self._types[(api_version, entry["kind"])] = ResourceType(base, entry["name"], entry["namespaced"])
        if key not in self._types:
            raise KubeApiError(404, "GET", api_version_path(api_version), f"the server serves no kind {kind}")
        return self._types[key]

    def _discover(self, base: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                return self.request("GET", base)["resources"]
            except KubeApiError as err:  # a new CRD's group shows in discovery a moment after it is established
                if err.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def object_path(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> str:
        kind_at = self.resource_type(api_version, kind)
        scope = f"/namespaces/{namespace}" if kind_at.namespaced and namespace else ""
        return f"{kind_at.path}{scope}/{kind_at.plural}/{name}"

    def apply(self, obj: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply, as `pulumi up` does it; unknown or duplicate fields are refused (strict validation)."""
        meta = obj["metadata"]
        path = self.object_path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        params = {"fieldManager": field_manager, "fieldValidation": "Strict", "force": "true" if force else "false"}
        return self.request("PATCH", path, obj, params=params, headers={"Content-Type": "application/apply-patch+yaml"})

    def read(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return self.request(
            "GET", self.object_path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        )

    def service_account_may(
        self, namespace: str, account: str, verb: str, resource: str, group: str = "", where: str | None = None
    ) -> bool:
        """A SubjectAccessReview: may `account` of `namespace` do `verb` on `resource` in `where` (None: anywhere)."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{account}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                "resourceAttributes": {"verb": verb, "group": group, "resource": resource}
                | ({"namespace": where} if where else {}),
            },
        }
        answer = self.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        return bool(answer["status"].get("allowed"))
