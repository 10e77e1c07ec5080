"""Wires the components for a stack: cloud pieces first, then one mirror per site, each owning its flows."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.aws.checkpoints import CheckpointBucket, CheckpointBucketArgs, s3a_conf
from infra.aws.identity import MirrorRole, MirrorRoleArgs, cluster_policy, kafka_policy
from infra.aws.network import MskReach, MskReachArgs
from infra.aws.scram import MskScramUser, MskScramUserArgs
from infra.azure.checkpoints import (
    BLOB_DATA_CONTRIBUTOR,
    CheckpointContainer,
    CheckpointContainerArgs,
    abfss_conf,
    prefix_condition,
)
from infra.azure.eventhubs import EventHubs, EventHubsArgs
from infra.azure.identity import MirrorEntraIdentity, MirrorEntraIdentityArgs, RoleGrant, TokenByHand, token_by_hand
from infra.k8s.mirror_app import MirrorApplication, MirrorApplicationArgs
from infra.k8s.namespace import MirrorNamespace, MirrorNamespaceArgs
from infra.k8s.operator import SparkOperator, SparkOperatorArgs
from infra.kafka.acls import MirrorAcls, MirrorAclsArgs
from infra.render import with_bootstraps
from infra.schema import ADMIN_PREFIX, MskSpec, SiteSpec
from infra.settings import StackSettings

SERVICE_ACCOUNT = "mirrorkit"  # the driver's
EXECUTOR_SERVICE_ACCOUNT = "mirrorkit-executor"
SERVICE_ACCOUNTS = (SERVICE_ACCOUNT, EXECUTOR_SERVICE_ACCOUNT)
STACK_LABEL = "mirrorkit.io/stack"


@dataclass
class Topology:
    """What the program built, for exports and tests."""

    event_hubs: dict[str, EventHubs] = field(default_factory=dict)
    scram_users: dict[str, MskScramUser] = field(default_factory=dict)
    reaches: dict[str, MskReach] = field(default_factory=dict)
    roles: dict[str, MirrorRole] = field(default_factory=dict)
    entra_identities: dict[str, MirrorEntraIdentity] = field(default_factory=dict)
    namespaces: dict[str, MirrorNamespace] = field(default_factory=dict)
    mirrors: dict[str, MirrorApplication] = field(default_factory=dict)
    mirror_configs: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # site -> rendered YAML
    acls: dict[str, MirrorAcls] = field(default_factory=dict)
    checkpoint_bucket: CheckpointBucket | None = None
    checkpoint_container: CheckpointContainer | None = None
    credentials: dict[str, dict[str, pulumi.Output[str]]] = field(default_factory=dict)


class _AwsProviders:
    """One explicit provider per (region, assumed role): the requester and the accepter sides of a peering."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str | None], aws.Provider] = {}

    def get(self, region: str, role_arn: str | None) -> aws.Provider:
        key = (region, role_arn)
        if key not in self._made:
            self._made[key] = aws.Provider(
                f"aws-{region}-{len(self._made)}",
                region=region,
                assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=role_arn)] if role_arn else None,
            )
        return self._made[key]


def _bootstrap(msk: MskSpec, provider: aws.Provider) -> pulumi.Output[str]:
    brokers = aws.msk.get_bootstrap_brokers_output(
        cluster_arn=msk.cluster_arn, opts=pulumi.InvokeOutputOptions(provider=provider)
    )
    # pulumi_aws is not followed by mypy (pyproject.toml), so `brokers` is Any: say what its outputs are.
    by_auth: dict[str, pulumi.Output[str]] = {
        "scram": brokers.bootstrap_brokers_sasl_scram,
        "iam": brokers.bootstrap_brokers_sasl_iam,
        "tls": brokers.bootstrap_brokers_tls,
    }
    return by_auth[msk.auth]


@dataclass
class _SiteIdentity:
    """How a site's pods sign in to the clouds, and what must exist before they try."""

    annotations: dict[str, pulumi.Input[str]] = field(default_factory=dict)  # on both service accounts
    pod_labels: dict[str, str] = field(default_factory=dict)
    spark_conf: dict[str, pulumi.Input[str]] = field(default_factory=dict)  # object storage sign-in
    ready: list[pulumi.Resource] = field(default_factory=list)  # the SparkApplication waits for these
    # The pods sign in to AWS (IAM-auth MSK, s3a:// checkpoints) as the site's role: through the node's EKS Pod
    # Identity agent, or with IRSA through STS.
    aws_credentials: bool = False
    token_by_hand: TokenByHand | None = None  # Entra ID off AKS: what the workload identity webhook would add


def _checkpoint_store(settings: StackSettings, providers: _AwsProviders, out: Topology) -> None:
    """The bucket or container object-storage checkpoints live in (a component that makes nothing for an existing
    one), before any identity is granted access to it."""
    checkpoint = settings.model.mirror.checkpoint
    if checkpoint.scheme == "s3a":
        bucket, _ = checkpoint.store()
        site = next(s for s in settings.model.sites if s.aws is not None and settings.clusters_at(s.name))
        out.checkpoint_bucket = CheckpointBucket(
            "checkpoints",
            CheckpointBucketArgs(bucket, checkpoint.existing, settings.protect_data),
            pulumi.ResourceOptions(
                provider=providers.get(_bucket_region(settings), site.aws.role_arn if site.aws else None)
            ),
        )
    elif checkpoint.scheme == "abfss" and checkpoint.resource_group is not None:  # settings require it
        container, account = checkpoint.store()
        out.checkpoint_container = CheckpointContainer(
            "checkpoints",
            CheckpointContainerArgs(
                account, container, checkpoint.resource_group, checkpoint.existing, settings.protect_data
            ),
        )


def _bucket_region(settings: StackSettings) -> str:
    """Where the checkpoint bucket is: as the stack says, or the first site's region that runs a mirror."""
    first = next(s for s in settings.model.sites if settings.clusters_at(s.name))
    return settings.model.mirror.checkpoint.region or first.region


def _checkpoint_keys(settings: StackSettings, site: str) -> list[str]:
    """The key prefixes of a site's flows' checkpoints in their bucket or container."""
    checkpoint = settings.model.mirror.checkpoint
    return [checkpoint.key(f.checkpoint_location) for f in settings.flows_at(site)]


def _site_identity(settings: StackSettings, site: SiteSpec, providers: _AwsProviders, out: Topology) -> _SiteIdentity:
    """The site's reach to MSK, its IAM role and its Entra identity, as its flows and checkpoints need them."""
    found = _SiteIdentity()
    clusters = settings.clusters_at(site.name)
    msk = {c.alias: c.msk for c in clusters if c.msk is not None}
    bucket = out.checkpoint_bucket
    if site.aws is not None and bucket is not None:
        found.spark_conf.update(s3a_conf(site.aws, _bucket_region(settings)))
    if site.aws is not None and (msk or bucket is not None):
        site_provider = providers.get(site.region, site.aws.role_arn)
        by_vpc: dict[str, list[MskSpec]] = defaultdict(list)
        for spec in msk.values():
            by_vpc[spec.vpc_id].append(spec)
        for vpc, specs in by_vpc.items():
            out.reaches[f"{site.name}-{vpc}"] = MskReach(
                f"{site.name}-{vpc}",
                MskReachArgs(
                    settings.stack, site.aws, site_provider, providers.get(specs[0].region, specs[0].role_arn), specs
                ),
            )
        iam = {a: s for a, s in msk.items() if s.auth == "iam"}
        if iam or bucket is not None:
            role = MirrorRole(
                f"{site.name}-mirror",
                MirrorRoleArgs(
                    site.aws,
                    settings.namespace,
                    SERVICE_ACCOUNTS,
                    settings.flows_at(site.name),
                    iam,
                    checkpoints=(bucket.bucket, _checkpoint_keys(settings, site.name)) if bucket else None,
                ),
                pulumi.ResourceOptions(provider=site_provider),
            )
            out.roles[site.name] = role
            found.aws_credentials = True
            found.annotations.update(role.service_account_annotations)
            found.ready += role.ready
    entra = [c for c in clusters if c.entra]
    container = out.checkpoint_container
    checkpoint = settings.model.mirror.checkpoint
    # Settings refuse a site that reaches these without `azure`, and abfss without a resource group and region.
    if (entra or container is not None) and site.azure is not None:
        if entra:
            group: pulumi.Input[str] = out.event_hubs[entra[0].alias].resource_group_name
            location = entra[0].region
        else:
            group, location = checkpoint.resource_group or "", checkpoint.region or ""
        grants = (
            [
                RoleGrant(
                    "checkpoints",
                    container.scope,
                    BLOB_DATA_CONTRIBUTOR,
                    prefix_condition(_checkpoint_keys(settings, site.name)),
                )
            ]
            if container is not None
            else []
        )
        identity = MirrorEntraIdentity(
            f"{site.name}-entra",
            MirrorEntraIdentityArgs(
                resource_group_name=group,
                location=location,
                oidc_issuer_url=site.azure.oidc_issuer_url,
                namespace=settings.namespace,
                service_accounts=SERVICE_ACCOUNTS,
                namespace_ids={c.alias: out.event_hubs[c.alias].namespace_id for c in entra},
                grants=grants,
            ),
        )
        out.entra_identities[site.name] = identity
        found.annotations.update(identity.service_account_annotations)
        found.pod_labels = identity.pod_labels
        found.ready += identity.ready
        if not site.azure.webhook:
            found.token_by_hand = token_by_hand(identity.client_id, identity.tenant_id)
        if container is not None:
            found.spark_conf.update(abfss_conf(checkpoint.store()[1], identity.client_id, identity.tenant_id))
    return found


@dataclass(frozen=True)
class _ClusterPolicy:
    resource: aws.msk.ClusterPolicy
    sites: list[str]  # whose roles it allows


def _cluster_policies(settings: StackSettings, providers: _AwsProviders, out: Topology) -> list[_ClusterPolicy]:
    """The resource policy of each IAM-auth MSK cluster that a role from another account uses (settings make sure
    the stack can act in the cluster's account). MSK keeps one policy per cluster: this one replaces any other."""
    made: list[_ClusterPolicy] = []
    accounts = {s.name: s.aws.account_id for s in settings.model.sites if s.aws is not None}
    for c in settings.model.clusters:
        if c.msk is None or c.msk.auth != "iam":
            continue
        spec = c.msk
        users = [n for n in out.roles if c in settings.clusters_at(n) and accounts[n] != spec.account_id]
        if not users:
            continue
        grants = [(out.roles[name].role_arn, kafka_policy(settings.flows_at(name), {c.alias: spec})) for name in users]
        policies = [p for _, p in grants]

        def document(arns: list[str], policies: list[dict[str, Any]] = policies) -> str:
            return json.dumps(cluster_policy(list(zip(arns, policies, strict=True))))

        text = pulumi.Output.all(*(arn for arn, _ in grants)).apply(document)
        policy = aws.msk.ClusterPolicy(
            f"msk-policy-{c.alias}",
            cluster_arn=spec.cluster_arn,
            policy=text,
            opts=pulumi.ResourceOptions(provider=providers.get(spec.region, spec.role_arn)),
        )
        made.append(_ClusterPolicy(policy, users))
    return made


def build(settings: StackSettings) -> Topology:
    out = Topology()
    model = settings.model
    for alias, files in model.credentials.items():
        out.credentials[alias] = {k: pulumi.Output.secret(v.get_secret_value()) for k, v in files.items()}
    providers = _AwsProviders()
    bootstraps: dict[str, pulumi.Output[str]] = {}
    for c in model.clusters:
        if c.eventhubs is not None:
            hubs = EventHubs(
                f"eh-{c.alias}",
                EventHubsArgs(c.eventhubs, c.region, settings.hubs(c.alias), protect=settings.protect_data),
            )
            out.event_hubs[c.alias] = hubs
            if hubs.connection_string is not None:
                out.credentials[c.alias] = {"password": hubs.connection_string}
        if c.kafka is not None and c.kafka.acls is not None:
            out.acls[c.alias] = MirrorAcls(
                f"acls-{c.alias}",
                MirrorAclsArgs(c.alias, c.kafka, settings.mirror_config.flows, out.credentials[c.alias]),
            )
        if c.msk is not None:
            provider = providers.get(c.msk.region, c.msk.role_arn)
            bootstraps[c.alias] = _bootstrap(c.msk, provider)
            if c.msk.auth == "scram":
                out.scram_users[c.alias] = MskScramUser(
                    f"scram-{c.alias}",
                    MskScramUserArgs(c.msk, c.alias, out.credentials[c.alias]["password"], settings.stack),
                    pulumi.ResourceOptions(provider=provider),
                )
    _checkpoint_store(settings, providers, out)
    identities: dict[str, _SiteIdentity] = {}
    for site in model.sites:
        if settings.clusters_at(site.name):
            identities[site.name] = _site_identity(settings, site, providers, out)
    for policy in _cluster_policies(settings, providers, out):
        for site_name in policy.sites:
            identities[site_name].ready.append(policy.resource)
    for site in model.sites:
        clusters = settings.clusters_at(site.name)
        if not clusters:
            continue
        msk = {c.alias: c.msk for c in clusters if c.msk is not None}
        entra = [c for c in clusters if c.entra]
        identity = identities[site.name]
        annotations, ready, pod_labels = identity.annotations, identity.ready, identity.pod_labels
        kubeconfig = model.kubeconfigs.get(site.name)
        k8s_provider = k8s.Provider(
            f"{site.name}-k8s",
            context=site.context,
            kubeconfig=pulumi.Output.secret(kubeconfig.get_secret_value()) if kubeconfig else None,
        )
        on_site = pulumi.ResourceOptions(provider=k8s_provider)
        site_config = settings.mirror_at(site.name)
        namespace = MirrorNamespace(
            site.name,
            MirrorNamespaceArgs(
                namespace=settings.namespace,
                service_account=SERVICE_ACCOUNT,
                executor_service_account=EXECUTOR_SERVICE_ACCOUNT,
                labels={STACK_LABEL: settings.stack},
                protect=settings.protect_data and model.mirror.checkpoint.pvc is not None,
                kafka_ports=sorted({p for c in clusters for p in c.ports}),
                metrics_port=site_config.metrics_port,
                monitoring_namespace=site.monitoring_namespace,
                api_server_cidrs=site.api_server_cidrs,
                credentials={  # the mirror's own; the program's admin credentials stay out of the cluster
                    c.alias: {k: v for k, v in out.credentials[c.alias].items() if not k.startswith(ADMIN_PREFIX)}
                    for c in clusters
                    if c.alias in out.credentials
                },
                service_account_annotations=annotations,
                # HTTPS out of the cluster: object storage, Entra ID's token endpoint, STS for IRSA.
                https_egress=model.mirror.checkpoint.url is not None
                or bool(entra)
                or (identity.aws_credentials and site.aws is not None and site.aws.oidc_provider_arn is not None),
                # EKS Pod Identity: every AWS sign-in of the pods (Kafka's IAM auth and s3a alike) asks the agent.
                pod_identity_agent=identity.aws_credentials
                and site.aws is not None
                and site.aws.eks_cluster is not None,
            ),
            on_site,
        )
        out.namespaces[site.name] = namespace
        if settings.spark_operator:
            operator = SparkOperator(
                f"{site.name}-operator",
                SparkOperatorArgs(job_namespace=namespace.namespace, release=settings.operator_name),
                on_site,
            )
            ready.append(operator.chart)
        site_bootstraps = {a: bootstraps[a] for a in msk}
        config_yaml = (
            pulumi.Output.all(**site_bootstraps).apply(functools.partial(with_bootstraps, site_config))
            if site_bootstraps
            else pulumi.Output.from_input(with_bootstraps(site_config, {}))
        )
        out.mirror_configs[site.name] = config_yaml
        out.mirrors[site.name] = MirrorApplication(
            settings.app_name(site.name),
            MirrorApplicationArgs(
                namespace=namespace.namespace,
                service_account=namespace.service_account,
                executor_service_account=namespace.executor_service_account,
                image=settings.image,
                spark_version=model.mirror.spark_version,
                config_yaml=config_yaml,
                secret_names=namespace.secret_names,
                driver=model.mirror.driver,
                executor=model.mirror.executor,
                checkpoint=model.mirror.checkpoint,
                metrics_port=site_config.metrics_port,
                monitoring=settings.monitoring,
                alerts=model.mirror.alerts,
                monitoring_namespace=site.monitoring_namespace,
                monitoring_labels=model.mirror.monitoring_labels,
                dashboard_labels=model.mirror.dashboard_labels,
                pod_labels=pod_labels,
                depends_on=ready,
                spark_conf=identity.spark_conf,
                image_pull_secrets=model.mirror.image_pull_secrets,
                token_by_hand=identity.token_by_hand,
                protect=settings.protect_data,
            ),
            on_site,
        )
    return out
