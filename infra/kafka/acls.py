"""The mirror's ACLs on a Kafka cluster (self-managed, or MSK with SCRAM), least privilege, rendered from its
access set there (spark_app.policy.access): read the source topics and describe their groups; write the target
copies; its own internal topics and DR lease group; heartbeats on the source when the flow emits them; and read the
copies whose group offsets it commits; write with its copier slots' transactional ids; and, for a flow that syncs
topic ACLs (spark_app.topic_acls), describe the source's ACLs, create and delete ACLs on the target and keep its
record of them there. The principal is also the site's toolbox's (infra.k8s.toolbox), so it holds what the operator
verbs need besides (`operator`). The program sets them with an admin credential of its own."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kafka as kafka

from infra.schema import ADMIN_PREFIX
from spark_app.config import FlowConfig
from spark_app.policy import access, literal_prefix
from spark_app.topic_acls import ledger_topic

READ = ("Read", "Describe", "DescribeConfigs")
WRITE = ("Write", "Describe", "Create", "DescribeConfigs", "AlterConfigs")  # topic sync creates and configures
OWN = ("Read", "Write", "Describe", "Create")  # internal topics the mirror writes and reads back
EMIT = ("Write", "Describe", "Create")


@dataclass(frozen=True, order=True)
class AclSpec:
    resource_type: str  # Topic | Group | TransactionalID | Cluster (the Kafka provider's spelling)
    pattern: str  # Literal | Prefixed
    name: str
    operation: str


def _pattern(regex: str) -> tuple[str, str]:
    """(pattern type, name) of the narrowest ACL covering a regex: the whole literal name, or its literal prefix."""
    prefix, whole = literal_prefix(regex)
    if whole or not prefix:
        return "Literal", prefix or "*"
    return "Prefixed", prefix


def mirror_acls(alias: str, flows: Sequence[FlowConfig], operator: bool = False) -> list[AclSpec]:
    """Every ACL the mirror needs on cluster `alias` for these flows (spark_app.policy.access), and nothing more; with
    `operator`, what the operator verbs run with its principal need besides (the site's toolbox)."""
    grant = access(flows, alias, operator=operator)
    rights = (
        ("Topic", grant.read, READ),
        ("Topic", grant.written, WRITE),
        ("Topic", grant.owned, OWN),
        ("Topic", grant.dead_letters, EMIT),
        ("Topic", grant.offsets_committed, ("Read", "Describe")),  # an OffsetCommit needs Read on its topics
        ("Group", grant.groups_described, ("Describe",)),  # committed offsets, to translate them
        ("Group", grant.groups_altered, ("Read", "Describe")),  # altering a group's offsets needs Read on it
        # the DR lease: join, commit who holds it; an exactly-once flow's positions: TxnOffsetCommit needs Read
        ("Group", grant.groups_joined, ("Read", "Describe")),
        # the copier slots' transactions: Write to init (and fence), add to, commit and abort them; Describe to find
        # their coordinator
        ("TransactionalID", grant.transactional_ids, ("Write", "Describe")),
        # the operator verbs: the drill's probe topics (made, written, read back) and groups (deleted at its end);
        # MirrorMaker 2's heartbeats and Connect's offsets topic, which adopt reads and handback writes
        ("Topic", grant.probe_topics, OWN),
        ("Group", grant.groups_deleted, ("Delete",)),
        ("Topic", grant.foreign_read, ("Read", "Describe")),
        ("Topic", grant.foreign_written, ("Read", "Write", "Describe")),
    )
    acls = {AclSpec(kind, *_pattern(p), op) for kind, patterns, ops in rights for p in patterns for op in ops}
    return sorted(acls | _acl_sync(alias, flows))


CLUSTER = "kafka-cluster"  # the one name of Kafka's cluster resource


def _acl_sync(alias: str, flows: Sequence[FlowConfig]) -> set[AclSpec]:
    """What topic ACL sync needs: DescribeAcls on a source (Describe on the cluster); CreateAcls and DeleteAcls on a
    target (Alter on the cluster, which implies Describe), and its record of them there. Alter on the cluster lets
    the mirror set any ACL on the target, as MirrorMaker 2's ACL sync needs too: a flow with `sync_topic_acls: false`
    does without it."""
    out: set[AclSpec] = set()
    for flow in flows:
        if not flow.sync_topic_acls:
            continue
        if flow.source == alias:
            out.add(AclSpec("Cluster", "Literal", CLUSTER, "Describe"))
        if flow.target == alias:
            out.add(AclSpec("Cluster", "Literal", CLUSTER, "Alter"))
            out |= {AclSpec("Topic", "Literal", ledger_topic(flow), op) for op in OWN}
    return out


@dataclass(frozen=True)
class MirrorAclsArgs:
    alias: str
    bootstrap_servers: pulumi.Input[str]  # comma-separated, TLS listeners
    principal: str  # the mirror, as the brokers name it
    admin_username: str | None  # the SCRAM user that sets the ACLs; None: the admin's client certificate (mTLS)
    flows: Sequence[FlowConfig]
    credentials: Mapping[str, pulumi.Output[str]]  # the cluster's credential files; the admin_* ones are used here
    operator: bool = False  # the operator verbs' grants too: the principal is also the site's toolbox's


class MirrorAcls(pulumi.ComponentResource):
    """The mirror principal's ACLs, set through a Kafka provider that signs in as the admin."""

    def __init__(self, name: str, args: MirrorAclsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:kafka:MirrorAcls", name, None, opts)
        admin = args.credentials
        provider = kafka.Provider(
            f"{name}-admin",
            bootstrap_servers=pulumi.Output.from_input(args.bootstrap_servers).apply(lambda s: s.split(",")),
            tls_enabled=True,
            client_cert=admin.get(f"{ADMIN_PREFIX}client_cert"),
            client_key=admin.get(f"{ADMIN_PREFIX}client_key"),
            sasl_mechanism="scram-sha512" if args.admin_username is not None else None,
            sasl_username=args.admin_username,
            sasl_password=admin.get(f"{ADMIN_PREFIX}password"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        on_cluster = pulumi.ResourceOptions(parent=self, provider=provider)
        for acl in mirror_acls(args.alias, args.flows, args.operator):
            kafka.Acl(
                f"{name}-{acl.resource_type}-{acl.pattern}-{_slug(acl.name)}-{acl.operation}".lower(),
                acl_principal=args.principal,
                acl_host="*",
                acl_operation=acl.operation,
                acl_permission_type="Allow",
                acl_resource_type=acl.resource_type,
                acl_resource_name=acl.name,
                resource_pattern_type_filter=acl.pattern,
                opts=on_cluster,
            )
        self.register_outputs({})


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", name)
