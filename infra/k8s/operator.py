"""The Spark Operator, from its pinned Helm chart, acting only in the mirror's namespace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

CHART = "spark-operator"
CHART_VERSION = "2.4.0"  # the operator release whose v1beta2 models (kubeflow-spark-api) the tests check against
CHART_REPO = "https://kubeflow.github.io/spark-operator"


@dataclass(frozen=True)
class SparkOperatorArgs:
    job_namespaces: Sequence[pulumi.Input[str]]  # every deployment's on this cluster, when a platform stack has it
    # The Helm release, and the namespace it goes in. The chart names its cluster-wide objects (ClusterRole,
    # webhook configurations) after the release, so each stack sharing a cluster needs its own.
    release: str


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
                "prometheus": {"metrics": {"enable": True}},
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.chart = chart
        self.release = args.release
        self.register_outputs({})
