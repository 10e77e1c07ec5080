"""A first `pulumi up` on a new cluster, as a platform team's pipeline runs it: from an API server that holds nothing
of the kit's but the operator's CRDs, the platform stack and the site stacks on that cluster applied one after the
other, in either order, and a tenant added later. Nothing is created for them beforehand: a namespace exists only
when a stack makes it (docs/decisions/2026-12-06-the-platform-makes-the-job-namespaces.md)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.naming import PROJECT
from tests.infra.harness import ROOT, Exports, Run, run_values, stack_values
from tests.infra.test_kube_api import cluster_wide_apart
from tests.infra.test_regions import SETS, a_set_is_up, part_values
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.stack_objects import (
    HELM_CHART,
    cluster_of,
    ident,
    in_own_namespaces,
    namespace_renaming,
    namespaces_the_cluster_has,
    not_kept,
    objects_by_cluster,
    operator_release,
)

PLATFORM = "platform-eks-euw1"  # two sets' sites share its cluster: two tenants on a first up
PLATFORM_FILE = ROOT / "stacks" / f"Pulumi.{PLATFORM}.yaml"


@pytest.fixture(scope="module")
def sets_up() -> tuple[dict[str, Exports], dict[str, Run]]:
    """Both shipped sets brought up against one backend, in the order of a first deployment."""
    backend: dict[str, Exports] = {}
    runs: dict[str, Run] = {}
    for topology in SETS:
        held, up = a_set_is_up(topology)
        backend |= {k: v for k, v in held.items() if v.values or k not in backend}
        runs |= up
    return backend, runs


def platform_run(job_namespaces: list[str] | None = None) -> Run:
    values = stack_values(PLATFORM_FILE)
    if job_namespaces is not None:
        values = values | {f"{PROJECT}:platform": values[f"{PROJECT}:platform"] | {"job_namespaces": job_namespaces}}
    return run_values(values, stack=PLATFORM)


def context_of(run: Run) -> str:
    (chart,) = run.of_type(HELM_CHART)
    return cluster_of(run, chart)


def on_cluster(run: Run, context: str, suffix: str, beside: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a stack applies to the cluster, in namespaces of its own (`<name>-<suffix>`), with its operator's
    release rendered by Helm (service accounts and RBAC only: no operator runs here), its cluster-wide names apart
    from other tests' releases on the same API server."""
    objects = objects_by_cluster(run).get(context, [])
    renamed = namespace_renaming(beside, suffix)
    charts = [c for c in run.of_type(HELM_CHART) if cluster_of(run, c) == context]
    released = [o for c in charts for o in operator_release(c, renamed).rbac]
    return cluster_wide_apart(in_own_namespaces(objects, suffix) + released, suffix)


def apply_as_up(api: KubeApiServer, objects: list[dict[str, Any]], manager: str) -> dict[str, str]:
    """Server-side apply without force, namespaces first, as one stack's `up`; what the server refused."""
    refused = {}
    for obj in sorted(objects, key=lambda o: o["kind"] != "Namespace"):
        try:
            api.apply(obj, field_manager=manager, force=False)
        except KubeApiError as err:
            refused[ident(obj)] = str(err)
    return refused


def stacks_on(runs: dict[str, Run], context: str) -> dict[str, Run]:
    return {s: r for s, r in sorted(runs.items()) if "-site-" in s and context in objects_by_cluster(r)}


def a_first_up(api: KubeApiServer, order: list[str], runs: dict[str, Run], suffix: str) -> dict[str, dict[str, str]]:
    """Each stack of `order` applied in turn to the cluster; per stack, what the server refused. Only namespaces that
    no stack makes (the monitoring stack's) are there before."""
    context = context_of(runs[PLATFORM])
    raw = [o for s in order for o in objects_by_cluster(runs[s]).get(context, [])]
    each = {s: on_cluster(runs[s], context, suffix, raw) for s in order}
    namespaces_the_cluster_has(api, [o for objects in each.values() for o in objects])
    refused = {s: apply_as_up(api, objects, f"pulumi-{s}") for s, objects in each.items()}
    kept = not_kept(api, [o for objects in each.values() for o in objects])
    return {s: r for s, r in refused.items() if r} | ({"(as sent)": kept} if kept else {})


def test_the_platform_first_then_each_site_converges_on_an_empty_cluster(kube_api, sets_up):
    _, runs = sets_up
    runs = runs | {PLATFORM: platform_run()}
    sites = stacks_on(runs, context_of(runs[PLATFORM]))
    assert len(sites) >= 2, sites
    assert a_first_up(kube_api, [PLATFORM, *sites], runs, "p1") == {}


def test_a_site_first_is_refused_at_preview_until_its_platform_is_up_then_either_order_converges(kube_api, sets_up):
    backend, runs = sets_up
    runs = runs | {PLATFORM: platform_run()}
    site = next(iter(stacks_on(runs, context_of(runs[PLATFORM]))))
    # A site reads its platform's job namespaces: before the platform's first `up` its preview stops, naming it.
    fresh = backend | {PLATFORM: Exports()}
    with pytest.raises(Exception, match=rf"run `pulumi up` on '{PLATFORM}' first"):
        run_values(part_values(site), stack=site, stacks=fresh, preview=True)
    # A site whose objects reached the cluster before the platform's (a platform stack destroyed and brought up
    # again): the platform's namespaces and RBAC land beside them.
    assert a_first_up(kube_api, [site, PLATFORM], runs, "s1") == {}


def test_a_tenant_the_platform_lists_before_its_site_exists_converges(kube_api, sets_up):
    _, runs = sets_up
    listed = stack_values(PLATFORM_FILE)[f"{PROJECT}:platform"]["job_namespaces"]
    tenant = f"{PROJECT}-tenant"
    grown = platform_run([*listed, tenant])
    context = context_of(grown)
    objects = on_cluster(grown, context, "t1", objects_by_cluster(grown)[context])
    assert apply_as_up(kube_api, objects, f"pulumi-{PLATFORM}") == {}
    (home,) = {o["metadata"]["namespace"] for o in objects if o["kind"] == "ServiceAccount"}
    accounts = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    where = f"{tenant}-t1"
    assert any(kube_api.service_account_may(home, a, "create", "pods", where=where) for a in accounts), where
    # Then the tenant's own objects, as its site stack would apply them, into the namespace the platform made.
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": where, "labels": {"team": "t"}}}
    assert apply_as_up(kube_api, [namespace], f"pulumi-{tenant}") == {}
