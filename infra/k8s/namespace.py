"""The mirror's home on a Kubernetes cluster: namespace, service account, namespaced RBAC, network policy, secrets.

Objects are spelt in Kubernetes' own camelCase field names, as the API reference and the policy pack read them.
pulumi-kubernetes sends such dicts unchanged, but its type hints describe only its snake_case keys; each call that
passes one carries `# type: ignore[call-overload]` for that reason alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.k8s.labels import APP_LABELS

# What the Spark driver does in its own namespace: make executor pods and their service, config maps and PVCs.
DRIVER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete", "deletecollection"],
    }
]
API_SERVER_PORTS = (443, 6443)
# EKS Pod Identity Agent, link-local on every node (IPv4 and IPv6), plain HTTP.
POD_IDENTITY_AGENT = ({"cidr": "169.254.170.23/32"}, {"cidr": "fd00:ec2::23/128"})
# The mirror's namespace enforces Pod Security's restricted level; a platform stack that makes the namespace first
# sets the same labels, so the two owners agree on every field they share.
POD_SECURITY = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}


@dataclass(frozen=True)
class MirrorNamespaceArgs:
    namespace: str
    service_account: str  # the driver's, bound to its Role
    executor_service_account: str  # the executors', bound to nothing
    kafka_ports: Sequence[int]
    metrics_port: int
    monitoring_namespace: str
    api_server_cidrs: Sequence[str]
    credentials: Mapping[str, Mapping[str, pulumi.Output[str]]]  # alias -> file name -> secret value
    service_account_annotations: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # both accounts
    labels: Mapping[str, str] = field(default_factory=dict)  # on the namespace, e.g. the stack that owns it
    protect: bool = False  # deleting the namespace deletes a checkpoint PVC in it
    https_egress: bool = False  # object storage, Entra ID's token endpoint or STS: TCP 443 to anywhere
    pod_identity_agent: bool = False  # EKS Pod Identity: the node-local agent hands out the role's credentials


def secret_name(alias: str) -> str:
    return f"mirrorkit-{alias}"


class MirrorNamespace(pulumi.ComponentResource):
    """Everything the mirror's pods need around them, and nothing cluster-wide."""

    def __init__(self, name: str, args: MirrorNamespaceArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:k8s:MirrorNamespace", name, None, opts)
        ns = args.namespace
        namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata={
                "name": ns,
                "labels": {
                    **args.labels,
                    **APP_LABELS,
                    **POD_SECURITY,
                },
            },
            opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect),
        )
        in_ns = pulumi.ResourceOptions(parent=self, depends_on=[namespace])
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata={
                "name": args.service_account,
                "namespace": ns,
                "annotations": dict(args.service_account_annotations),
            },
            opts=in_ns,
        )
        # Executors copy records but make no Kubernetes calls: their own account, no binding, no API token. They
        # carry the same annotations, since their Kafka clients sign in with the pod's cloud identity.
        executors = k8s.core.v1.ServiceAccount(
            f"{name}-executor-sa",
            metadata={
                "name": args.executor_service_account,
                "namespace": ns,
                "annotations": dict(args.service_account_annotations),
            },
            automount_service_account_token=False,
            opts=in_ns,
        )
        role = k8s.rbac.v1.Role(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-driver", metadata={"name": "mirrorkit-driver", "namespace": ns}, rules=DRIVER_RULES, opts=in_ns
        )
        k8s.rbac.v1.RoleBinding(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-driver",
            metadata={"name": "mirrorkit-driver", "namespace": ns},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role.metadata.name},
            subjects=[{"kind": "ServiceAccount", "name": account.metadata.name, "namespace": ns}],
            opts=in_ns,
        )
        k8s.networking.v1.NetworkPolicy(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-default-deny",
            metadata={"name": "default-deny", "namespace": ns},
            spec={"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
            opts=in_ns,
        )
        k8s.networking.v1.NetworkPolicy(  # type: ignore[call-overload]  # camelCase fields (module doc)
            f"{name}-mirror",
            metadata={"name": "mirrorkit", "namespace": ns},
            spec=network_policy_spec(args),
            opts=in_ns,
        )
        self.secret_names: dict[str, str] = {}
        self.secret_versions: dict[str, pulumi.Output[str | None]] = {}  # a write to a Secret changes its version
        for alias, files in args.credentials.items():
            secret = k8s.core.v1.Secret(
                f"{name}-{alias}",
                metadata={"name": secret_name(alias), "namespace": ns},
                type="Opaque",
                string_data=dict(files),
                opts=in_ns,
            )
            self.secret_names[alias] = secret_name(alias)
            self.secret_versions[alias] = secret.metadata.resource_version
        self.namespace = namespace.metadata.name
        self.service_account = account.metadata.name
        self.executor_service_account = executors.metadata.name
        self.register_outputs(
            {
                "namespace": self.namespace,
                "service_account": self.service_account,
                "executor_service_account": self.executor_service_account,
            }
        )


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def site_egress(
    api_server_cidrs: Sequence[str], kafka_ports: Sequence[int], https_egress: bool, pod_identity_agent: bool
) -> list[dict[str, Any]]:
    """What a site's pods that run the mirror's code may reach (the mirror's and the toolbox's): DNS, the API server,
    the Kafka ports (by port), and the clouds' sign-in where the site's identity needs it."""
    egress: list[dict[str, Any]] = [
        {
            "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, _tcp(53)],
        },
        {"to": [{"ipBlock": {"cidr": c}} for c in api_server_cidrs], "ports": [_tcp(p) for p in API_SERVER_PORTS]},
        {"ports": [_tcp(p) for p in sorted(set(kafka_ports))]},
    ]
    if https_egress:
        egress.append({"ports": [_tcp(443)]})
    if pod_identity_agent:
        egress.append({"to": [{"ipBlock": b} for b in POD_IDENTITY_AGENT], "ports": [_tcp(80)]})
    return egress


def network_policy_spec(args: MirrorNamespaceArgs) -> dict[str, Any]:
    """Allow only what Spark and the mirror use: its own pods, DNS, the API server, Kafka, the metrics scrape."""
    same_app = {"podSelector": {"matchLabels": APP_LABELS}}
    egress = [
        {"to": [same_app]},
        *site_egress(args.api_server_cidrs, args.kafka_ports, args.https_egress, args.pod_identity_agent),
    ]
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": args.monitoring_namespace}}}
    return {
        "podSelector": {"matchLabels": APP_LABELS},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{"from": [same_app]}, {"from": [monitoring], "ports": [_tcp(args.metrics_port)]}],
        "egress": egress,
    }
