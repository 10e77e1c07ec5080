"""Each site's toolbox (infra.k8s.toolbox) on a real API server: its objects applied as `pulumi up` applies them, a run
made from its CronJob with the runbook's own kubectl command, the run's pod admitted under the namespace's enforced
restricted Pod Security level, and its service account's token able to publish the applications' profile and to do
nothing else."""

from __future__ import annotations

import copy
import os
import subprocess
from typing import Any

import pytest

from infra.k8s.toolbox import CONTAINER, TOOLBOX, create_command, verb_args
from infra.naming import CHECKPOINT_DIR
from spark_app.config import ClusterConfig
from spark_app.dr import connection
from spark_app.dr.connection import ConfigMapRef, ConnectionProfile, Publication, PublishFailed, auth_profile
from tests.infra.harness import DEPLOYMENTS, Run
from tests.support.kube_api import KubeApiError, KubeApiServer
from tests.support.stack_objects import apply_all, in_own_namespaces, objects_by_cluster

STACK_NAMES = DEPLOYMENTS
KUBECTL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def toolboxes(kube_api: KubeApiServer, stack_runs: dict[str, Run]) -> dict[str, list[dict[str, Any]]]:
    """Every shipped stack's sites, each cluster's objects in namespaces of their own, applied once: the objects of
    each site that has a toolbox, by `<stack>/<context>`."""
    out: dict[str, list[dict[str, Any]]] = {}
    for n, stack in enumerate(STACK_NAMES):
        for i, (context, objects) in enumerate(objects_by_cluster(stack_runs[stack]).items()):
            moved = in_own_namespaces(objects, f"tb{n}{i}")
            assert apply_all(kube_api, moved, f"pulumi-{stack}") == {}, (stack, context)
            if any(o["kind"] == "CronJob" and o["metadata"]["name"] == TOOLBOX for o in moved):
                out[f"{stack}/{context}"] = moved
    assert len(out) == sum(len(stack_runs[s].result["settings"].model.sites) for s in STACK_NAMES)
    return out


def kubectl(kube_api: KubeApiServer, command: str, job: str) -> subprocess.CompletedProcess[str]:
    """A runbook command through a shell, kubectl signed in as the admin to the test's API server, on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env |= {"KUBECONFIG": str(kube_api.kubeconfig()), "JOB": job, "NO_PROXY": "127.0.0.1", "HOME": str(kube_api.folder)}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT_S,
        check=False,
    )


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_from(job: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod the Job controller would make from the Job's template."""
    template = job["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": job["metadata"]["namespace"], "labels": template["metadata"]["labels"]},
        "spec": copy.deepcopy(template["spec"]),
    }


def test_a_run_made_from_each_toolbox_with_the_runbooks_command_is_admitted_under_restricted_pod_security(
    kube_api, toolboxes
):
    for where, objects in toolboxes.items():
        cron = one(objects, "CronJob", TOOLBOX)
        namespace = cron["metadata"]["namespace"]
        labels = one(objects, "Namespace", namespace)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted", where
        stored = kube_api.read(cron)
        assert stored["spec"]["suspend"] is True
        args = verb_args("failover", "--flow", "a->b", "--publish-configmap", f"{namespace}/kafka-connection")
        done = kubectl(kube_api, create_command(namespace, args), "mirrorkit-toolbox-failover-1")
        assert done.returncode == 0, (where, done.stderr)
        job = kube_api.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/mirrorkit-toolbox-failover-1")
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert (container["name"], container["args"]) == (CONTAINER, args)
        template = stored["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert {k: v for k, v in container.items() if k != "args"} == {
            k: v for k, v in template["containers"][0].items() if k != "args"
        }, where
        assert job["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"] == "manual"

        # The pod the Job makes passes the namespace's enforced restricted level ...
        pods = f"/api/v1/namespaces/{namespace}/pods"
        admitted = kube_api.request("POST", pods, pod_from(job, "toolbox-run"))
        assert admitted["spec"]["serviceAccountName"] == TOOLBOX
        # ... and the level is enforced there: the same pod without runAsNonRoot is refused.
        bad = pod_from(job, "toolbox-as-root")
        del bad["spec"]["securityContext"]["runAsNonRoot"]
        del bad["spec"]["securityContext"]["runAsUser"]
        with pytest.raises(KubeApiError) as refused:
            kube_api.request("POST", pods, bad)
        assert refused.value.status == 403 and "PodSecurity" in str(refused.value), str(refused.value)

        # The stack's adopt command mounts the mirror's checkpoint claim where the driver does; still admitted.
        args = verb_args("adopt", "--flow", "a->b")
        done = kubectl(kube_api, create_command(namespace, args, checkpoint_claim="mirror-checkpoints"),
                       "mirrorkit-toolbox-adopt-1")  # fmt: skip
        assert done.returncode == 0, (where, done.stderr)
        job = kube_api.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/mirrorkit-toolbox-adopt-1")
        spec = job["spec"]["template"]["spec"]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "mirror-checkpoints"}} in spec["volumes"]
        (container,) = spec["containers"]
        assert container["args"] == args
        assert {"name": "checkpoints", "mountPath": CHECKPOINT_DIR} in container["volumeMounts"], where
        admitted = kube_api.request("POST", pods, pod_from(job, "toolbox-adopt"))
        assert "checkpoints" in {v["name"] for v in admitted["spec"]["volumes"]}, where


def may(kube_api: KubeApiServer, namespace: str, verb: str, resource: str, where: str, name: str = "") -> bool:
    """A SubjectAccessReview for the toolbox's account, about one object by name when `name` is given."""
    attributes = {"verb": verb, "group": "", "resource": resource, "namespace": where} | (
        {"name": name} if name else {}
    )
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{TOOLBOX}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            "resourceAttributes": attributes,
        },
    }
    answer = kube_api.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(answer["status"].get("allowed"))


def test_the_toolboxs_token_publishes_the_profile_and_may_do_nothing_else(kube_api, toolboxes, tmp_path, monkeypatch):
    host, port = kube_api.url.removeprefix("https://").rsplit(":", 1)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    for n, (where, objects) in enumerate(toolboxes.items()):
        cron = one(objects, "CronJob", TOOLBOX)
        namespace = cron["metadata"]["namespace"]
        role = one(objects, "Role", TOOLBOX)
        (rule,) = role["rules"]
        ref = ConfigMapRef(role["metadata"]["namespace"], rule["resourceNames"][0])
        # The token a pod of the toolbox's account gets, where connection.InCluster reads it.
        folder = tmp_path / f"sa{n}"
        folder.mkdir()
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        token = kube_api.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{TOOLBOX}/token", request)
        (folder / "token").write_text(token["status"]["token"])
        (folder / "ca.crt").write_bytes(kube_api.ca.read_bytes())
        monkeypatch.setattr(connection, "SERVICEACCOUNT", folder)

        publication = Publication(ref)
        assert publication.check() == [f"may write {ref} ({kube_api.url})"], where
        target = ClusterConfig(alias="dr", bootstrap_servers="dr:9093", profile="kafka")
        profile = ConnectionProfile("p->dr", "failover", "dr", "dr:9093", auth_profile(target), "default", [], [])
        (written,) = publication.publish(profile)
        assert written.startswith(f"wrote {ref}"), written
        stored = kube_api.request("GET", f"/api/v1/namespaces/{ref.namespace}/configmaps/{ref.name}")
        assert stored["data"]["bootstrap.servers"] == "dr:9093"
        # Another ConfigMap of that namespace is refused, naming it.
        with pytest.raises(PublishFailed, match="HTTP 403"):
            Publication(ConfigMapRef(ref.namespace, "another")).check()

        assert [v for v in ("get", "create", "patch", "update") if not may(kube_api, namespace, v, "configmaps",
                                                                           ref.namespace, ref.name)] == []  # fmt: skip
        nothing_else = [
            ("list", "configmaps", ref.namespace, ""),
            ("get", "configmaps", namespace, "mirrorkit-toolbox-config"),  # mounted, never read through the API
            ("delete", "configmaps", ref.namespace, ref.name),
            ("get", "secrets", namespace, "mirrorkit-dr"),
            ("list", "secrets", namespace, ""),
            ("create", "pods", namespace, ""),
            ("create", "jobs", namespace, ""),
            ("get", "configmaps", "default", ref.name),
        ]
        assert [e for e in nothing_else if may(kube_api, namespace, *e)] == [], where


def test_a_bare_create_job_from_the_cronjob_runs_status(kube_api, toolboxes):
    """`status` is the template's own arguments: the runbook's plain `create job --from` runs it, unchanged."""
    (where, objects), *_ = toolboxes.items()
    namespace = one(objects, "CronJob", TOOLBOX)["metadata"]["namespace"]
    command = create_command(namespace, verb_args("status"))
    assert "patch" not in command
    done = kubectl(kube_api, command, "mirrorkit-toolbox-status-1")
    assert done.returncode == 0, done.stderr
    job = kube_api.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/mirrorkit-toolbox-status-1")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == verb_args("status")
