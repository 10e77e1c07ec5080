"""The mirror's AWS identity: an IAM role bound to its service accounts, allowed only what its flows need on MSK
and on their S3 checkpoint prefixes."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.aws.checkpoints import checkpoint_policy
from infra.naming import first_names, mirror_sid
from infra.schema import AwsSite, MskSpec
from spark_app.config import FlowConfig
from spark_app.policy import access, literal_prefix

# Consumer group ids the mirror's own clients carry (the copier, the readers of internal topics; spark_app.clients);
# they never join or commit, but MSK IAM checks the group id all the same.
OWN_GROUPS = ("mirrorkit-*",)
READ = ["kafka-cluster:DescribeTopic", "kafka-cluster:DescribeTopicDynamicConfiguration", "kafka-cluster:ReadData"]
WRITE = [*READ, "kafka-cluster:CreateTopic", "kafka-cluster:AlterTopic", "kafka-cluster:WriteData"]
WRITE_CONFIGS = [*WRITE, "kafka-cluster:AlterTopicDynamicConfiguration"]
GROUP_READ = ["kafka-cluster:DescribeGroup"]
GROUP_USE = ["kafka-cluster:DescribeGroup", "kafka-cluster:AlterGroup"]
GROUP_DELETE = [*GROUP_USE, "kafka-cluster:DeleteGroup"]  # the drill's probe groups: joined, committed, deleted
REWRITE = [*READ, "kafka-cluster:WriteData"]  # Connect's offsets topic, which handback writes and never creates
# A copier slot's transactional producer: Alter to init (and fence), add to, commit and abort its transactions; it
# takes Describe besides, and WriteData on the topics written, which the copies' grant gives.
TRANSACTIONS = ["kafka-cluster:DescribeTransactionalId", "kafka-cluster:AlterTransactionalId"]


def regex_to_glob(pattern: str) -> str:
    """The narrowest IAM wildcard covering a topic, group or transactional id regex: its literal prefix, then `*`
    unless that is all."""
    prefix, whole = literal_prefix(pattern)
    return prefix if whole else f"{prefix}*"


def _statement(actions: list[str], resources: list[str]) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": sorted(set(actions)), "Resource": sorted(set(resources))}


def kafka_policy(flows: Sequence[FlowConfig], clusters: dict[str, MskSpec], operator: bool = False) -> dict[str, Any]:
    """Least privilege on the IAM-auth MSK clusters among `clusters` (alias -> spec) for these flows; with
    `operator`, what the operator verbs run with the role need besides (the site's toolbox)."""
    statements = []
    for alias, msk in clusters.items():
        grant = access(flows, alias, operator=operator)
        # Committing a group's offsets on a topic takes DescribeTopic and ReadData on it besides AlterGroup.
        reads = {regex_to_glob(t) for t in grant.read | grant.offsets_committed | grant.foreign_read}
        writes = {regex_to_glob(t) for t in grant.created}
        rewritten = {regex_to_glob(t) for t in grant.foreign_written} - writes  # written, never created
        groups_read = {regex_to_glob(g) for g in grant.groups_described}
        groups_use = {*OWN_GROUPS, *(regex_to_glob(g) for g in grant.groups_altered)}
        groups_deleted = {regex_to_glob(g) for g in grant.groups_deleted}
        transactional_ids = {regex_to_glob(i) for i in grant.transactional_ids}
        if not (reads or writes):
            continue
        on_cluster = [
            "kafka-cluster:Connect",
            "kafka-cluster:DescribeCluster",
            "kafka-cluster:DescribeClusterDynamicConfiguration",
        ]
        if writes or rewritten:
            # The mirror's producer is idempotent: with WriteData granted per topic, InitProducerId also needs this,
            # on the cluster, or every write is refused.
            on_cluster.append("kafka-cluster:WriteDataIdempotently")
        statements.append(_statement(on_cluster, [msk.cluster_arn]))
        if reads - writes:
            statements.append(_statement(READ, [msk.arn_of("topic", t) for t in reads - writes]))
        if writes:
            statements.append(_statement(WRITE_CONFIGS, [msk.arn_of("topic", t) for t in writes]))
        if rewritten:
            statements.append(_statement(REWRITE, [msk.arn_of("topic", t) for t in rewritten]))
        if groups_read - groups_use:
            statements.append(_statement(GROUP_READ, [msk.arn_of("group", g) for g in groups_read - groups_use]))
        statements.append(_statement(GROUP_USE, [msk.arn_of("group", g) for g in groups_use]))
        if groups_deleted:
            statements.append(_statement(GROUP_DELETE, [msk.arn_of("group", g) for g in groups_deleted]))
        if transactional_ids:
            statements.append(_statement(TRANSACTIONS, [msk.arn_of("transactional-id", i) for i in transactional_ids]))
    return {"Version": "2012-10-17", "Statement": statements}


def cluster_policy(grants: Sequence[tuple[str, dict[str, Any]]], kept: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """An MSK cluster's resource policy: the statements the stack keeps, then the program's own (each with a Sid
    of its own prefix) allowing each (role ARN, its kafka_policy on this cluster only).

    A role from another account may act on a cluster only when the cluster's own policy allows it too. MSK keeps
    one policy per cluster, so whatever else must stay in it is among `kept`."""
    mine = [
        {**statement, "Principal": {"AWS": role_arn}}
        for role_arn, policy in grants
        for statement in policy["Statement"]
    ]
    return {"Version": "2012-10-17", "Statement": [*kept, *({"Sid": mirror_sid(n)} | s for n, s in enumerate(mine))]}


def _oidc_issuer(provider_arn: str) -> str:
    return re.sub(r"^arn:aws:iam::\d+:oidc-provider/", "", provider_arn)


def trust_policy(site: AwsSite, namespace: str, service_accounts: Sequence[str]) -> dict[str, Any]:
    """EKS Pod Identity when the site names its EKS cluster, IRSA through the cluster's OIDC provider otherwise."""
    if site.oidc_provider_arn is None:  # so the site names its EKS cluster (AwsSite takes exactly one of them)
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "pods.eks.amazonaws.com"},
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                }
            ],
        }
    issuer = _oidc_issuer(site.oidc_provider_arn)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Federated": site.oidc_provider_arn},
                "Action": "sts:AssumeRoleWithWebIdentity",
                "Condition": {
                    "StringEquals": {
                        f"{issuer}:sub": [f"system:serviceaccount:{namespace}:{sa}" for sa in service_accounts],
                        f"{issuer}:aud": "sts.amazonaws.com",
                    }
                },
            }
        ],
    }


@dataclass(frozen=True)
class MirrorRoleArgs:
    site: AwsSite
    namespace: str
    service_accounts: Sequence[str]  # the driver's and the executors': both run Kafka clients
    flows: Sequence[FlowConfig]
    iam_clusters: dict[str, MskSpec]  # alias -> spec, IAM-auth clusters only
    # S3 checkpoints: (bucket, the key prefixes of this site's flows), or None
    checkpoints: tuple[pulumi.Input[str], Sequence[str]] | None = None
    operator: bool = False  # the operator verbs' grants too: the role is also the site's toolbox's


class MirrorRole(pulumi.ComponentResource):
    """The role the mirror's pods assume; the service account carries `role_arn` (IRSA) or is associated (Pod
    Identity)."""

    role_arn: pulumi.Output[str]
    service_account_annotations: dict[str, pulumi.Input[str]]

    def __init__(self, name: str, args: MirrorRoleArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:aws:MirrorRole", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps(trust_policy(args.site, args.namespace, args.service_accounts)),
            opts=child,
        )
        # What a pod needs before it can sign in; the mirror's SparkApplication waits for these.
        self.ready: list[pulumi.Resource] = []
        if args.iam_clusters:
            self.ready.append(
                aws.iam.RolePolicy(
                    f"{name}-kafka",
                    role=role.name,
                    policy=json.dumps(kafka_policy(args.flows, args.iam_clusters, args.operator)),
                    opts=child,
                )
            )
        if args.checkpoints is not None:
            bucket, prefixes = args.checkpoints
            self.ready.append(
                aws.iam.RolePolicy(
                    f"{name}-checkpoints",
                    role=role.name,
                    policy=pulumi.Output.from_input(bucket).apply(lambda b: json.dumps(checkpoint_policy(b, prefixes))),
                    opts=child,
                )
            )
        self.service_account_annotations = {}
        if args.site.eks_cluster is not None:
            for account in args.service_accounts:
                self.ready.append(
                    aws.eks.PodIdentityAssociation(
                        f"{name}-pod-identity-{account}",
                        cluster_name=args.site.eks_cluster,
                        namespace=args.namespace,
                        service_account=account,
                        role_arn=role.arn,
                        opts=pulumi.ResourceOptions(
                            parent=self,
                            aliases=[
                                pulumi.Alias(name=n)
                                for n in first_names(f"{name}-pod-identity", account, args.service_accounts)
                            ],
                        ),
                    )
                )
        else:
            self.service_account_annotations = {"eks.amazonaws.com/role-arn": role.arn}
        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})
