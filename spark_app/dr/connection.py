"""The applications' connection profile: what an application needs to move to a flow's target after `failover`
(or back to the primary after `failback`), and where it is published.

A profile names the cluster (alias and bootstrap servers), how a client signs in there (the kit's profile, security
protocol, SASL mechanism, the CA bundle, and where the credential of that kind lives in the kit's config, never the
credential itself), per source topic its name there (the flow's replication policy: `default` renames `orders` to
`<source alias>.orders`, `identity` keeps it), and per group the verb moved, where it resumes.

It is built from the config and the target alone (the source may be gone), printed as JSON, written to a file for
pipelines (`--profile-out`), and published as a ConfigMap the applications read (`--publish-configmap NS/NAME`),
through the Kubernetes API with the pod's service-account token, as a toolbox Job runs it. The ConfigMap is written
by server-side apply, so the one Role a toolbox needs is get, create, patch and update on that one ConfigMap name; the
write is tried first as a server-side dry run, before the verb changes anything, so a missing grant refuses the verb
at once, naming the namespace and the ConfigMap.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import clients
from ..config import ClusterConfig, ConfigError, FlowConfig, Profile
from ..errors import MirrorFailed
from ..policy import HEARTBEATS_TOPIC, never_mirrored, replication_policy, should_mirror

PROFILE_KEY = "profile.json"  # the ConfigMap's key holding the whole profile
# Where a pod finds its service account's token and the API server's CA (Kubernetes mounts them there).
SERVICEACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
FIELD_MANAGER = "mirrorkit"
KUBE_TIMEOUT_S = 30.0
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_MECHANISMS = {
    Profile.EVENTHUBS: "PLAIN",
    Profile.EVENTHUBS_ENTRA: "OAUTHBEARER",
    Profile.MSK_SCRAM: "SCRAM-SHA-512",
    Profile.MSK_IAM: "AWS_MSK_IAM",
}


@dataclass(frozen=True)
class AuthProfile:
    """How a client signs in: never a secret, only its kind and where the kit's config finds one."""

    profile: str  # the kit's profile name (spark_app.config.Profile)
    security_protocol: str  # PLAINTEXT, SSL or SASL_SSL
    sasl_mechanism: str | None  # PLAIN, SCRAM-SHA-512, OAUTHBEARER, AWS_MSK_IAM; None without SASL
    ca_file: str | None  # a PEM bundle to trust; None: the system store
    secret: str | None  # where the credential lives ("env NAME" or "file PATH"); None when there is none
    region: str | None = None  # msk-iam: the region its tokens are signed for


@dataclass(frozen=True)
class TopicRoute:
    source_topic: str  # as producers and consumers named it on the primary
    topic: str  # its name on the profile's cluster


@dataclass(frozen=True)
class GroupResume:
    group: str
    topic: str  # on the profile's cluster
    partition: int
    offset: int  # the group's committed offset there: where it resumes


@dataclass(frozen=True)
class ConnectionProfile:
    flow: str  # the flow the verb moved
    verb: str  # failover or failback
    cluster: str  # the alias the applications go to
    bootstrap_servers: str
    auth: AuthProfile
    replication_policy: str  # the flow's: how source topics are named on the cluster
    topics: list[TopicRoute]
    groups: list[GroupResume]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def configmap_data(self) -> dict[str, str]:
        """The ConfigMap's keys: the whole profile, and the three settings a client reads most, for `envFrom`."""
        data = {PROFILE_KEY: self.to_json(), "bootstrap.servers": self.bootstrap_servers}
        data["security.protocol"] = self.auth.security_protocol
        if self.auth.sasl_mechanism is not None:
            data["sasl.mechanism"] = self.auth.sasl_mechanism
        return data


def auth_profile(cluster: ClusterConfig) -> AuthProfile:
    if cluster.profile is Profile.KAFKA:
        protocol = "SSL" if cluster.tls else "PLAINTEXT"
    else:
        protocol = "SSL" if cluster.profile is Profile.MTLS else "SASL_SSL"
    ref = cluster.client_key if cluster.profile is Profile.MTLS else cluster.password
    return AuthProfile(
        cluster.profile.value,
        protocol,
        _MECHANISMS.get(cluster.profile),
        cluster.ca_file,
        None if ref is None else ref.describe(),
        cluster.region,
    )


def source_topics_on_target(target: ClusterConfig, flow: FlowConfig) -> list[str]:
    """The source topics the flow mirrors, read from the target alone: the flow's literal topic list, else the
    target's topics that are copies of a topic the flow selects."""
    named = flow.topics.literal_names()
    if named is not None:
        return sorted(named)
    policy = replication_policy(flow)
    prefix = f"{flow.source}{flow.separator}" if policy.renames else ""
    found = []
    for name in clients.list_topics(clients.admin(target), target):
        if not name.startswith(prefix):
            continue
        source = name[len(prefix) :]
        if never_mirrored(source, flow.separator) or source == HEARTBEATS_TOPIC:
            continue
        if should_mirror(flow, source) and policy.target_topic(source) == name:
            found.append(source)
    return sorted(found)


def failover_profile(config_cluster: ClusterConfig, flow: FlowConfig, groups: list[GroupResume]) -> ConnectionProfile:
    """Where the applications of `flow` go after its failover: its target, its copies' names there."""
    policy = replication_policy(flow)
    routes = [TopicRoute(t, policy.target_topic(t)) for t in source_topics_on_target(config_cluster, flow)]
    return ConnectionProfile(
        flow.name, "failover", config_cluster.alias, config_cluster.bootstrap_servers, auth_profile(config_cluster),
        flow.replication_policy, routes, sorted(groups, key=_order),
    )  # fmt: skip


def primary_profile(primary: ClusterConfig, original: FlowConfig, groups: list[GroupResume]) -> ConnectionProfile:
    """What failback puts back: the primary of `original`, each topic by its own name there."""
    named = original.topics.literal_names()
    if named is None:  # patterns: the primary's topics the flow selects, by their own names
        on_primary = clients.list_topics(clients.admin(primary), primary)
        named = [t for t in on_primary if t != HEARTBEATS_TOPIC and should_mirror(original, t)]
    topics = named
    return ConnectionProfile(
        original.name, "failback", primary.alias, primary.bootstrap_servers, auth_profile(primary),
        original.replication_policy, [TopicRoute(t, t) for t in sorted(topics)], sorted(groups, key=_order),
    )  # fmt: skip


def _order(g: GroupResume) -> tuple[str, str, int]:
    return (g.group, g.topic, g.partition)


def write_profile(profile: ConnectionProfile, path: str) -> None:
    """The profile as JSON at `path`, replaced whole (a reader never sees half of it)."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(profile.to_json() + "\n")
    partial.replace(target)


@dataclass(frozen=True)
class ConfigMapRef:
    namespace: str
    name: str

    @classmethod
    def parse(cls, text: str, option: str = "--publish-configmap") -> ConfigMapRef:
        namespace, sep, name = text.partition("/")
        if not sep or not _DNS_LABEL.fullmatch(namespace) or len(namespace) > 63:
            raise ConfigError(f"{option}: '{text}' is not NAMESPACE/NAME (a namespace is a DNS label)")
        if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            raise ConfigError(f"{option}: '{name}' is not a ConfigMap name (lowercase letters, digits, '-' and '.')")
        return cls(namespace, name)

    def __str__(self) -> str:
        return f"ConfigMap {self.name} in namespace {self.namespace}"


class PublishFailed(MirrorFailed):
    """The profile could not be published; the message names the namespace and the ConfigMap, never the token."""


class InCluster:
    """The Kubernetes API as a pod reaches it: KUBERNETES_SERVICE_HOST and _PORT, the service account's token and
    CA from SERVICEACCOUNT."""

    def __init__(self) -> None:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise PublishFailed(
                "publishing a profile needs the Kubernetes API: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT"
                " are not set (run it in a pod, as the site's toolbox Job does, or write a file with --profile-out)"
            )
        token_file, ca_file = SERVICEACCOUNT / "token", SERVICEACCOUNT / "ca.crt"
        if not token_file.is_file() or not ca_file.is_file():
            raise PublishFailed(f"no service-account token and CA in {SERVICEACCOUNT} (automountServiceAccountToken?)")
        self.url = f"https://{host if ':' not in host else f'[{host}]'}:{port}"
        self._token_file = token_file
        self._context = ssl.create_default_context(cafile=str(ca_file))

    def apply(self, ref: ConfigMapRef, data: dict[str, str], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply of the ConfigMap with this data (a dry run: authorized and validated, not stored)."""
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": ref.name,
                "namespace": ref.namespace,
                "labels": {"app.kubernetes.io/managed-by": "mirrorkit"},
            },
            "data": data,
        }
        query = {"fieldManager": FIELD_MANAGER, "force": "true"} | ({"dryRun": "All"} if dry_run else {})
        path = f"/api/v1/namespaces/{ref.namespace}/configmaps/{ref.name}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={
                "Content-Type": "application/apply-patch+yaml",  # JSON is YAML
                "Accept": "application/json",
                "Authorization": f"Bearer {self._token_file.read_text().strip()}",  # re-read: kubelet rotates it
            },
        )
        what = f"{'a dry run of writing' if dry_run else 'writing'} {ref}"
        try:
            with urllib.request.urlopen(request, timeout=KUBE_TIMEOUT_S, context=self._context) as answer:
                result: dict[str, Any] = json.loads(answer.read())
                return result
        except urllib.error.HTTPError as err:
            raise PublishFailed(f"{what}: HTTP {err.code}: {_status_message(err)}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = err.reason if isinstance(err, urllib.error.URLError) else err
            raise PublishFailed(f"{what}: the Kubernetes API at {self.url} did not answer: {reason}") from None


def _status_message(err: urllib.error.HTTPError) -> str:
    """The API server's own Status message (it names the user, verb and resource refused), else the reason."""
    try:
        message = json.loads(err.read()).get("message")
    except (ValueError, OSError):
        message = None
    return str(message or err.reason)


@dataclass
class Publication:
    """Where one verb publishes its profile: checked before the verb changes anything, written after."""

    configmap: ConfigMapRef | None = None
    path: str | None = None
    _api: InCluster | None = None

    def check(self) -> list[str]:
        """Before the verb acts: the ConfigMap write as a server-side dry run (so a missing grant refuses the verb
        now), and the file's folder. Returns what was checked, one line each."""
        done = []
        if self.configmap is not None:
            self._api = InCluster()
            self._api.apply(self.configmap, {PROFILE_KEY: "{}"}, dry_run=True)
            done.append(f"may write {self.configmap} ({self._api.url})")
        if self.path is not None:
            folder = Path(self.path).resolve().parent
            if not folder.is_dir():
                raise ConfigError(f"--profile-out: folder {folder} does not exist")
            done.append(f"may write {self.path}")
        return done

    def publish(self, profile: ConnectionProfile) -> list[str]:
        """Write the profile where asked; returns what was written, one line each."""
        done = []
        if self.path is not None:
            write_profile(profile, self.path)
            done.append(f"wrote {self.path}")
        if self.configmap is not None:
            api = self._api or InCluster()
            began = time.monotonic()
            stored = api.apply(self.configmap, profile.configmap_data())
            version = stored.get("metadata", {}).get("resourceVersion", "?")
            done.append(f"wrote {self.configmap} (resourceVersion {version}, {time.monotonic() - began:.2f} s)")
        return done

    @property
    def asked(self) -> bool:
        return self.configmap is not None or self.path is not None
