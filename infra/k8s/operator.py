"""The Spark Operator, from its pinned Helm chart, acting only in the mirror's namespaces: two replicas of its
controller and of its webhook under a disruption budget, and its CRDs protected and left in the cluster when the
release goes (deleting a CRD deletes every SparkApplication)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

CHART = "spark-operator"
CHART_VERSION = "2.4.0"  # the operator release whose v1beta2 models (kubeflow-spark-api) the tests check against
CHART_REPO = "https://kubeflow.github.io/spark-operator"
CRD = "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"
REPLICAS = 2  # the controller and the webhook each: one drains from a node while the other serves (leader election)
# A node drain may take one replica at a time: the chart refuses a budget with fewer than two replicas.
HIGHLY_AVAILABLE = {"replicas": REPLICAS, "podDisruptionBudget": {"enable": True, "minAvailable": 1}}


@dataclass(frozen=True)
class SparkOperatorArgs:
    job_namespaces: Sequence[pulumi.Input[str]]  # every deployment's on this cluster, when a platform stack has it
    # The Helm release, and the namespace it goes in. The chart names its cluster-wide objects (ClusterRole,
    # webhook configurations) after the release, so each stack sharing a cluster needs its own.
    release: str
    # What must exist before the release: the job namespaces, where the chart makes the operator's Role and binding.
    depends_on: Sequence[pulumi.Resource] = ()


def keep_crds(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
    """The chart's CRDs: protected, and left in the cluster when the release, the stack or its name goes."""
    if args.type_ != CRD:
        return None
    kept = pulumi.ResourceOptions(protect=True, retain_on_delete=True)
    return pulumi.ResourceTransformResult(args.props, pulumi.ResourceOptions.merge(args.opts, kept))


class SparkOperator(pulumi.ComponentResource):
    """The chart installs cluster-scoped RBAC for the operator itself; the mirror's service account, role and
    binding are ours (MirrorNamespace), so the chart's job-namespace RBAC is switched off."""

    def __init__(self, name: str, args: SparkOperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:k8s:SparkOperator", name, None, opts)
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata={
                "name": args.release,
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        chart = k8s.helm.v4.Chart(
            f"{name}-chart",
            name=args.release,
            chart=CHART,
            version=CHART_VERSION,
            repository_opts=k8s.helm.v4.RepositoryOptsArgs(repo=CHART_REPO),
            namespace=namespace.metadata.name,
            values={
                "spark": {
                    "jobNamespaces": list(args.job_namespaces),
                    "serviceAccount": {"create": False},
                    "rbac": {"create": False},
                },
                "controller": HIGHLY_AVAILABLE,
                "webhook": HIGHLY_AVAILABLE,
                "prometheus": {"metrics": {"enable": True}},
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on), transforms=[keep_crds]),
        )
        self.chart = chart
        self.release = args.release
        self.register_outputs({})
