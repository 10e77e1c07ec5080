"""What each stack would send to Kubernetes, applied to a real API server: schemas, CRDs, RBAC, a shared cluster.

The Kubernetes objects are the ones the program registers under mocks (tests/infra/harness.py), in the wire's
camelCase, applied with server-side apply as `pulumi up` applies them. The Spark Operator's Helm release is not an
object (the engine renders it, and mocks do not), so its test renders the chart with Helm from the values the release
is given.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from infra.k8s.mirror_app import CONFIG_HASH_ANNOTATION, EXCLUDED_DRIVER_STEPS
from infra.k8s.operator import CHART, CHART_VERSION
from tests.infra.harness import DEPLOYMENTS, Run
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.polling import wait_until
from tests.support.spark_operator import OperatorProcesses, start_operator
from tests.support.stack_objects import (
    CLUSTER_WIDE,
    apply_all,
    cluster_objects,
    ident,
    in_own_namespaces,
    most_mounted_application,
    namespace_renaming,
    not_kept,
    objects_by_cluster,
    operator_release,
    platform_release,
    sent_but_not_stored,
    served_by,
)

STACK_NAMES = DEPLOYMENTS
DRIVER_RESOURCES = ("pods", "services", "configmaps", "persistentvolumeclaims")
DRIVER_TIMEOUT_S = 90.0  # the controller's spark-submit starts a JVM: seconds, on a busy machine tens


@dataclass(frozen=True)
class Cluster:
    """The objects one Kubernetes provider of a stack would apply, and what the API server refused of them."""

    context: str
    objects: list[dict[str, Any]]
    refused: dict[str, str]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def applied(kube_api: KubeApiServer, stack_runs: dict[str, Run]) -> dict[str, list[Cluster]]:
    """Every stack's clusters, each in namespaces of its own, applied once for the module's tests."""
    out: dict[str, list[Cluster]] = {}
    for stack in STACK_NAMES:
        out[stack] = []
        for i, (context, objects) in enumerate(objects_by_cluster(stack_runs[stack]).items()):
            moved = in_own_namespaces(objects, f"s{STACK_NAMES.index(stack)}{i}")
            out[stack].append(Cluster(context, moved, apply_all(kube_api, moved, f"pulumi-{stack}")))
    return out


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_the_api_server_accepts_and_keeps_every_kubernetes_object_of_the_stack(applied, kube_api, stack):
    clusters = applied[stack]
    assert clusters and all(c.of_kind("SparkApplication") for c in clusters)
    assert {k: v for c in clusters for k, v in c.refused.items()} == {}
    assert {k: v for c in clusters for k, v in not_kept(kube_api, c.objects).items()} == {}


def driver_and_executor_accounts(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(namespace, driver's service account, executors' service account) per SparkApplication."""
    return [
        (
            app["metadata"]["namespace"],
            app["spec"]["driver"]["serviceAccount"],
            app["spec"]["executor"].get("serviceAccount", app["spec"]["driver"]["serviceAccount"]),
        )
        for app in cluster.of_kind("SparkApplication")
    ]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_the_drivers_service_account_manages_its_pods_in_its_namespace_and_nothing_else(applied, kube_api, stack):
    for cluster in applied[stack]:
        accounts = {(a["metadata"]["namespace"], a["metadata"]["name"]) for a in cluster.of_kind("ServiceAccount")}
        for namespace, driver, _ in driver_and_executor_accounts(cluster):
            assert (namespace, driver) in accounts, f"the driver runs as {driver}, which the stack does not make"

            may = functools.partial(kube_api.service_account_may, namespace, driver)
            assert {
                (v, r) for v in ("create", "delete") for r in DRIVER_RESOURCES if not may(v, r, where=namespace)
            } == set()
            elsewhere = [
                ("create", "pods", "", "default"),
                ("create", "pods", "", None),  # in every namespace
                ("list", "pods", "", None),
                ("get", "secrets", "", namespace),  # secrets reach the pods as volumes, never through the API
                ("list", "secrets", "", None),
                ("create", "roles", "rbac.authorization.k8s.io", namespace),
                ("create", "rolebindings", "rbac.authorization.k8s.io", namespace),
                ("create", "namespaces", "", None),
                ("list", "nodes", "", None),
                ("create", "clusterrolebindings", "rbac.authorization.k8s.io", None),
                ("update", "sparkapplications", "sparkoperator.k8s.io", namespace),
            ]
            assert [e for e in elsewhere if may(e[0], e[1], e[2], e[3])] == []


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_service_account_but_the_drivers_may_do_nothing(applied, kube_api, stack):
    for cluster in applied[stack]:
        drivers = {(ns, driver) for ns, driver, _ in driver_and_executor_accounts(cluster)}
        others = {
            (a["metadata"]["namespace"], a["metadata"]["name"]) for a in cluster.of_kind("ServiceAccount")
        } - drivers
        others |= {(ns, executor) for ns, _, executor in driver_and_executor_accounts(cluster)} - drivers
        rights = [
            (ns, account, verb, resource)
            for ns, account in sorted(others)
            for verb in ("get", "list", "create", "delete")
            for resource in (*DRIVER_RESOURCES, "secrets")
            if kube_api.service_account_may(ns, account, verb, resource, where=ns)
        ]
        assert rights == []


def test_the_chart_set_up_copies_is_the_one_the_program_installs(kube_charts):
    chart = yaml.safe_load((kube_charts / CHART / "Chart.yaml").read_text())
    assert (chart["name"], chart["version"]) == (CHART, CHART_VERSION), "bump tests/support/kube/go.mod with the chart"


def test_the_operator_acts_only_in_the_mirrors_namespaces(kube_api, stack_runs, platform_runs):
    """Each platform stack's Spark Operator chart rendered by Helm with the values, namespace and release name the
    stack gives it, its service accounts and RBAC applied, and each of them asked what it may do: it acts in the
    namespace of every mirror whose site names the platform stack, and nowhere else."""
    for n, (platform, run) in enumerate(sorted(platform_runs.items())):
        context, chart = platform_release(run)
        served = served_by(stack_runs, platform)
        assert served, f"no site names the platform stack {platform}"
        assert {s.context for s in served} == {context}, f"a site naming {platform} is on another cluster"
        home_objects = objects_by_cluster(run)[context]
        sites = [o for s in served for o in s.objects]
        suffix = f"o{n}"
        renamed = namespace_renaming(home_objects + sites, suffix)
        release = operator_release(chart, renamed)
        mirrors = sorted({renamed(s.app["metadata"]["namespace"]) for s in served})
        assert release.job_namespaces == mirrors, f"{platform}: the operator watches {release.job_namespaces}"
        made = [o for o in in_own_namespaces(home_objects + sites, suffix) if o["kind"] == "Namespace"]
        assert apply_all(kube_api, made + release.rbac, f"pulumi-{platform}") == {}
        home = release.namespace
        accounts = sorted(o["metadata"]["name"] for o in release.rbac if o["kind"] == "ServiceAccount")
        assert accounts, f"{platform}: the chart makes no service account"
        for job in release.job_namespaces:
            for verb in ("create", "delete"):
                assert any(kube_api.service_account_may(home, a, verb, "pods", where=job) for a in accounts), job
        beyond = [
            (account, verb, resource, where)
            for account in accounts
            for verb, resource, where in (
                ("create", "pods", "default"),
                ("create", "pods", None),
                ("get", "secrets", "default"),
                ("list", "secrets", None),
                ("create", "configmaps", None),
                ("delete", "persistentvolumeclaims", None),
            )
            if kube_api.service_account_may(home, account, verb, resource, where=where)
        ]
        assert beyond == [], platform


def cluster_wide_apart(objects: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """The objects with each cluster-wide name (and a binding's role) as `<name>-<suffix>`: the test's clusters share
    one API server, where two clusters' platform releases, each named `spark-operator`, would meet."""

    def apart(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] not in CLUSTER_WIDE:
            return obj
        moved = obj | {"metadata": obj["metadata"] | {"name": f"{obj['metadata']['name']}-{suffix}"}}
        if obj["kind"] == "ClusterRoleBinding":
            moved["roleRef"] = obj["roleRef"] | {"name": f"{obj['roleRef']['name']}-{suffix}"}
        return moved

    return [apart(o) for o in objects]


def test_stacks_on_one_cluster_share_no_object_and_leave_each_others_as_they_sent_them(
    kube_api, stack_runs, platform_runs
):
    """The stacks whose sites name the same kubeconfig context, and the platform stack there with its operator's
    RBAC, applied one after the other with their own field managers and without force, as their `pulumi up`s would.
    An object two of them name would be deleted by destroying either stack."""
    runs = stack_runs | platform_runs
    by_context: dict[str, list[str]] = {}
    for stack in sorted(runs):
        for context in objects_by_cluster(runs[stack]):
            by_context.setdefault(context, []).append(stack)
    shared = {context: stacks for context, stacks in by_context.items() if len(stacks) > 1}
    assert shared, "no two stack files share a cluster"
    for i, (context, stacks) in enumerate(sorted(shared.items())):
        beside = [o for s in stacks for o in objects_by_cluster(runs[s])[context]]
        each = {s: cluster_wide_apart(cluster_objects(runs[s], context, f"x{i}", beside), f"x{i}") for s in stacks}
        named = [n for objects in each.values() for n in {ident(o) for o in objects}]
        # A platform stack makes the namespaces its operator acts in, and leaves them when it goes: the site that
        # makes the same namespace with its labels shares it, and destroying the platform deletes nothing there.
        retained = {
            ident(o)
            for s in stacks
            if s in platform_runs
            for r in platform_runs[s].of_type("kubernetes:core/v1:Namespace")
            if r.retain_on_delete
            for o in cluster_objects(platform_runs[s], context, f"x{i}", beside)
            if o["kind"] == "Namespace" and o["metadata"]["name"].removesuffix(f"-x{i}") == r.plain["metadata"]["name"]
        }
        assert sorted({n for n in named if named.count(n) > 1} - retained) == [], context
        assert any(o["kind"] in CLUSTER_WIDE for objects in each.values() for o in objects), f"{context}: no operator"
        refused = {}
        for stack, objects in each.items():
            refused |= apply_all(kube_api, objects, f"pulumi-{stack}", force=False)
        assert refused == {}, context
        assert not_kept(kube_api, [o for objects in each.values() for o in objects]) == {}, context


def test_the_api_server_refuses_what_a_schema_does_not_declare(kube_api, stack_runs):
    """The checks above can fail: a misspelt field, a wrong type and an unknown enum value in a SparkApplication."""
    objects = in_own_namespaces(objects_by_cluster(stack_runs["onprem-to-msk"])["eks-euw1"], "r")
    assert apply_all(kube_api, [o for o in objects if o["kind"] == "Namespace"], "tests") == {}
    (app,) = [o for o in objects if o["kind"] == "SparkApplication"]
    spec = app["spec"]
    wrong = {
        ".spec.driver.serviceAcount: field not declared in schema": spec
        | {"driver": spec["driver"] | {"serviceAcount": "mirrorkit"}},
        ".spec.executor.instances: expected numeric": spec | {"executor": spec["executor"] | {"instances": "two"}},
        'spec.mode: Unsupported value: "clustered"': spec | {"mode": "clustered"},
    }
    for message, bad in wrong.items():
        with pytest.raises(KubeApiError, match=re.escape(message)):
            kube_api.apply(app | {"spec": bad}, field_manager="tests")


@dataclass(frozen=True)
class Submitted:
    """A stack's SparkApplication as it renders it, applied with its cluster's objects where the Spark Operator runs,
    and the driver pod the API server admitted for it."""

    app: dict[str, Any]
    namespace: dict[str, Any]
    pod: dict[str, Any]
    operator: OperatorProcesses


@pytest.fixture(scope="session")
def submitted(kube_api: KubeApiServer, stack_runs: dict[str, Run], platform_runs: dict[str, Run]) -> Submitted:
    """One operator (webhook and controller, as the platform stack's chart release runs them) for the session, and
    one of the stacks' SparkApplications applied with its cluster's objects for it to submit."""
    platform, site = most_mounted_application(stack_runs, platform_runs)
    context, chart = platform_release(platform_runs[platform])
    assert site.context == context, f"the site naming {platform} is on another cluster"
    home_objects = objects_by_cluster(platform_runs[platform])[context]
    served = [o for s in served_by(stack_runs, platform) for o in s.objects]
    release = operator_release(chart, namespace_renaming(home_objects + served, "op"))
    assert apply_all(kube_api, in_own_namespaces(home_objects, "op") + release.rbac, f"pulumi-{platform}") == {}
    operator = start_operator(kube_api, release.manifests, release.namespace)
    moved = in_own_namespaces(site.objects, "op")
    since = kube_api.request("GET", "/api/v1/namespaces")["metadata"]["resourceVersion"]
    assert apply_all(kube_api, moved, f"pulumi-{context}") == {}
    (app,) = [
        o for o in moved if o["kind"] == "SparkApplication" and o["metadata"]["name"] == site.app["metadata"]["name"]
    ]
    where = app["metadata"]["namespace"]
    (namespace,) = [o for o in moved if o["kind"] == "Namespace" and o["metadata"]["name"] == where]
    # Watched, not polled: spark-submit deletes the pod again when a later step of its submission is refused.
    pod = kube_api.first_added(
        f"/api/v1/namespaces/{where}/pods", f"{app['metadata']['name']}-driver", since, DRIVER_TIMEOUT_S
    )
    if pod is None:
        state = (kube_api.read(app).get("status") or {}).get("applicationState", {})
        # spark-submit's output, of which the exception names what the API server refused
        refused = [line for line in state.get("errorMessage", "").splitlines() if line.startswith("Exception")]
        pytest.fail(f"no driver pod; the application is {state.get('state')}: {refused}\n{operator.log_tail(10)}")
    return Submitted(app, namespace, pod, operator)


def test_the_submission_succeeds_with_the_rbac_the_chart_grants(submitted, kube_api):
    """spark-submit 4.2 would also make a driver NetworkPolicy, which the chart's RBAC does not allow: the submission
    failed after the driver pod was made, and the pod was deleted again. The stack leaves that step out (the stack's own
    NetworkPolicy is the one), so the operator reports the application submitted and the driver pod stays."""
    assert EXCLUDED_DRIVER_STEPS.endswith(".NetworkPolicyFeatureStep")
    spec = submitted.app["spec"]
    assert spec["sparkConf"]["spark.kubernetes.driver.pod.excludedFeatureSteps"] == EXCLUDED_DRIVER_STEPS

    def state() -> str | None:
        return (kube_api.read(submitted.app).get("status") or {}).get("applicationState", {}).get("state")

    wait_until(lambda: state() not in (None, "", "NEW"), "the operator to finish the submission", timeout_s=180)
    assert state() in {"SUBMITTED", "RUNNING"}, f"{state()}:\n{submitted.operator.log_tail(20)}"
    where, name = submitted.pod["metadata"]["namespace"], submitted.pod["metadata"]["name"]
    assert (
        kube_api.request("GET", f"/api/v1/namespaces/{where}/pods/{name}")["metadata"]["uid"]
        == (submitted.pod["metadata"]["uid"])
    )


def test_the_operator_makes_the_driver_pod_as_the_stack_renders_it_and_pod_security_admits_it(submitted):
    """The operator's webhook and controller (spark-submit from the pyspark install) turn the rendered spec into the
    driver pod; the API server admitted that pod under the namespace's enforced Pod Security level, so no field the
    restricted level needs was lost on the way."""
    labels = submitted.namespace["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    spec, pod = submitted.app["spec"], submitted.pod
    driver = spec["driver"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "spark-kubernetes-driver"]
    assert container["image"] == spec["image"]
    assert pod["spec"]["serviceAccountName"] == driver["serviceAccount"]
    assert sent_but_not_stored(driver["podSecurityContext"], pod["spec"]["securityContext"]) == []
    assert sent_but_not_stored(driver["securityContext"], container["securityContext"]) == []
    assert pod["spec"]["terminationGracePeriodSeconds"] == driver["terminationGracePeriodSeconds"]
    assert sent_but_not_stored(driver["annotations"], pod["metadata"]["annotations"]) == []
    assert pod["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == driver["annotations"][CONFIG_HASH_ANNOTATION]
    assert sent_but_not_stored(driver["labels"], pod["metadata"]["labels"]) == []
    assert [p for p in container["ports"] if p["name"] == "metrics"] == driver["ports"]
    assert [s["name"] for s in pod["spec"].get("imagePullSecrets", [])] == spec.get("imagePullSecrets", [])

    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = {m["mountPath"]: m for m in container["volumeMounts"]}
    rendered = {v["name"]: v for v in spec["volumes"]}
    for mount in driver["volumeMounts"]:
        assert sent_but_not_stored(mount, mounted.get(mount["mountPath"])) == [], mount
        assert sent_but_not_stored(rendered[mount["name"]], volumes.get(mount["name"])) == [], mount["name"]
    for secret in driver["secrets"]:
        at = mounted.get(secret["path"])
        assert at is not None, f"secret {secret['name']} is not mounted at {secret['path']}"
        assert volumes[at["name"]]["secret"]["secretName"] == secret["name"]
