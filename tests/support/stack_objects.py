"""The Kubernetes objects a stack's program registers (under Pulumi's mocks), as a cluster would receive them: per
cluster, moved into namespaces of their own, applied with server-side apply, with the Spark Operator's release rendered
by Helm. The API server's tests and the node's share them."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pulumi.runtime.rpc import UNKNOWN

from infra.k8s.operator import CHART
from tests.infra.harness import Registered, Run
from tests.support.kube_api import KubeApiError, KubeApiServer, helm_template

HELM_CHART = "kubernetes:helm.sh/v4:Chart"
NOT_OBJECTS = frozenset({HELM_CHART})  # a component: the engine renders its objects (see the operator's test)
RBAC_KINDS = frozenset({"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"})
CLUSTER_WIDE = frozenset({"ClusterRole", "ClusterRoleBinding"})  # Helm's output gives them a namespace anyway


def api_version(typ: str) -> str:
    """`kubernetes:core/v1:Namespace` -> `v1`; `kubernetes:rbac.authorization.k8s.io/v1:Role` -> that group."""
    group_version = typ.split(":")[1]
    return group_version.removeprefix("core/")


def kubernetes_object(resource: Registered) -> dict[str, Any]:
    """The object as the provider sends it: the registered inputs, which already use Kubernetes' field names."""
    obj = resource.plain
    assert UNKNOWN not in repr(obj), f"{resource.name} has unknown inputs: {obj}"
    assert (obj.get("apiVersion"), obj.get("kind")) == (api_version(resource.typ), resource.typ.rsplit(":", 1)[1])
    return obj


def cluster_of(run: Run, resource: Registered) -> str:
    """The kubeconfig context (a site's cluster) of the explicit provider a Kubernetes resource is bound to."""
    assert resource.provider, f"{resource.name} is not bound to a site's Kubernetes provider"
    urn = resource.provider.rsplit("::", 1)[0]  # `urn::id`; the urn ends in the provider's name
    provider = run.named(urn.rsplit("::", 1)[1])
    return provider.plain.get("context") or provider.name


def objects_by_cluster(run: Run) -> dict[str, list[dict[str, Any]]]:
    """Per cluster (kubeconfig context), the Kubernetes objects the program would apply there, in program order."""
    clusters: dict[str, list[dict[str, Any]]] = {}
    for r in run.resources:
        if r.typ.startswith("kubernetes:") and r.typ not in NOT_OBJECTS:
            clusters.setdefault(cluster_of(run, r), []).append(kubernetes_object(r))
    return clusters


def ident(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{obj['apiVersion']} {obj['kind']} {meta.get('namespace', '')}/{meta['name']}"


def namespace_renaming(objects: list[dict[str, Any]], suffix: str) -> Callable[[str], str]:
    """Each namespace the program makes, as `<name>-<suffix>` (keep it short: a name holds 63 characters); any other
    name unchanged."""
    made = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    return lambda name: f"{name}-{suffix}" if name in made else name


def in_own_namespaces(objects: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """The same objects with each namespace the program makes renamed `<name>-<suffix>`, so clusters of one test
    server never meet (namespaces cannot be deleted there: no controller manager finishes them)."""
    renamed = namespace_renaming(objects, suffix)

    out = []
    for obj in objects:
        meta = dict(obj["metadata"])
        if obj["kind"] == "Namespace":
            meta["name"] = renamed(meta["name"])
        if "namespace" in meta:
            meta["namespace"] = renamed(meta["namespace"])
        moved = obj | {"metadata": meta}
        if "subjects" in obj:
            moved["subjects"] = [
                s | ({"namespace": renamed(s["namespace"])} if "namespace" in s else {}) for s in obj["subjects"]
            ]
        out.append(moved)
    return out


def namespaces_the_cluster_has(api: KubeApiServer, objects: list[dict[str, Any]]) -> None:
    """Make the namespaces the objects go into that the program does not make: a real cluster has them already (the
    monitoring stack's, for the Grafana dashboard), and the program's objects are applied into them."""
    made = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    for name in sorted({o["metadata"].get("namespace") for o in objects} - made - {None}):
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}, field_manager="the-cluster")


def apply_all(api: KubeApiServer, objects: list[dict[str, Any]], manager: str, force: bool = True) -> dict[str, str]:
    """Namespaces first, then the rest in the program's order; returns what the server refused, with its message."""
    namespaces_the_cluster_has(api, objects)
    refused = {}
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        try:
            api.apply(obj, field_manager=manager, force=force)
        except KubeApiError as err:
            refused[ident(obj)] = str(err)
    return refused


def not_kept(api: KubeApiServer, objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per object, each field the server does not hold as it was sent."""
    return {ident(o): diff for o in objects if (diff := sent_but_not_stored(as_stored(o), api.read(o)))}


def sent_but_not_stored(sent: Any, stored: Any, at: str = "") -> list[str]:
    """Every field value sent that the server did not keep as sent (pruned by a schema, or changed). An empty map or
    list is the same as none: Kubernetes omits empty fields."""
    if sent in ({}, []) and stored is None:
        return []
    if isinstance(sent, dict) and isinstance(stored, dict):
        return [p for k, v in sent.items() for p in sent_but_not_stored(v, stored.get(k), f"{at}.{k}")]
    if isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        return [
            p
            for i, (a, b) in enumerate(zip(sent, stored, strict=True))
            for p in sent_but_not_stored(a, b, f"{at}[{i}]")
        ]
    return [] if sent == stored else [f"{at}: sent {sent!r}, stored {stored!r}"]


def as_stored(obj: dict[str, Any]) -> dict[str, Any]:
    """A Secret's `stringData` is write-only: the server keeps it base64-encoded in `data`."""
    if obj["kind"] != "Secret" or "stringData" not in obj:
        return obj
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in obj["stringData"].items()}
    return {k: v for k, v in obj.items() if k != "stringData"} | {"data": obj.get("data", {}) | encoded}


@dataclass(frozen=True)
class OperatorRelease:
    """The Spark Operator's chart as Helm renders it for a stack's release: every manifest, and its service accounts
    and RBAC, which alone are applied where no operator runs (its webhook configurations would send every later
    SparkApplication to a webhook that is not served)."""

    namespace: str
    job_namespaces: list[str]
    rbac: list[dict[str, Any]]
    manifests: list[dict[str, Any]]


def operator_release(chart: Registered, renamed: Callable[[str], str]) -> OperatorRelease:
    given = chart.plain
    values = given["values"]
    jobs = [renamed(n) for n in values["spark"]["jobNamespaces"]]
    home = renamed(given["namespace"])
    values = values | {"spark": values["spark"] | {"jobNamespaces": jobs}}
    rendered = helm_template(CHART, given.get("name", chart.name), home, values)
    rbac = [
        o | {"metadata": {k: v for k, v in o["metadata"].items() if k != "namespace"}}
        if o["kind"] in CLUSTER_WIDE
        else o
        for o in rendered
        if o["kind"] in RBAC_KINDS
    ]
    return OperatorRelease(home, jobs, rbac, rendered)


def cluster_objects(run: Run, context: str, suffix: str, beside: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a stack applies to one cluster, in namespaces of its own: its objects, then its operator's RBAC, which
    acts in namespaces that other stacks there make (`beside`: every stack's objects on the cluster)."""
    objects = objects_by_cluster(run)[context]
    renamed = namespace_renaming(beside, suffix)
    charts = [c for c in run.of_type(HELM_CHART) if cluster_of(run, c) == context]
    return in_own_namespaces(objects, suffix) + [o for c in charts for o in operator_release(c, renamed).rbac]


@dataclass(frozen=True)
class Served:
    """A site whose Spark Operator a platform stack installs: the cluster, what the site's stack applies there, and
    the site's SparkApplication."""

    context: str
    objects: list[dict[str, Any]]
    app: dict[str, Any]


def served_by(stack_runs: dict[str, Run], platform: str) -> list[Served]:
    """Every site, of every stack, that names `platform` as the stack installing its cluster's operator
    (`sites[].platform`)."""
    found = []
    for _, run in sorted(stack_runs.items()):
        settings = run.result["settings"]
        apps = {settings.app_name(s.name) for s in settings.model.sites if s.platform == platform}
        for context, objects in objects_by_cluster(run).items():
            found += [
                Served(context, objects, o)
                for o in objects
                if o["kind"] == "SparkApplication" and o["metadata"]["name"] in apps
            ]
    return found


def platform_release(run: Run) -> tuple[str, Registered]:
    """A platform stack's cluster (kubeconfig context) and its one Spark Operator release."""
    (chart,) = run.of_type(HELM_CHART)
    return cluster_of(run, chart), chart


def most_mounted_application(stack_runs: dict[str, Run], platform_runs: dict[str, Run]) -> tuple[str, Served]:
    """Of the SparkApplications of every site whose operator a platform stack installs, the one whose driver mounts
    the most volumes and secrets (the one that asks the most of what the operator passes on to the pod), with that
    platform stack."""

    def mounts(app: dict[str, Any]) -> int:
        return len(app["spec"]["driver"].get("volumeMounts", [])) + len(app["spec"]["driver"].get("secrets", []))

    found = [(platform, s) for platform in sorted(platform_runs) for s in served_by(stack_runs, platform)]
    return max(found, key=lambda f: mounts(f[1].app))
