"""Wires the components for a stack: cloud pieces first, then one mirror per site, each owning its flows.

A stack that is one part of a set (infra.parts) makes only that part's resources and reads what it needs of the
other parts from their stack outputs (`exports`), never from their regions."""

from __future__ import annotations

import functools
import json
import re
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
from infra.k8s.namespace import POD_SECURITY, MirrorNamespace, MirrorNamespaceArgs
from infra.k8s.operator import SparkOperator, SparkOperatorArgs
from infra.k8s.toolbox import (
    CONFIG_PATH,
    PROFILE_CONFIGMAP,
    TOOLBOX,
    TOOLBOX_GRANTED,
    ProfileConfigMap,
    Toolbox,
    ToolboxArgs,
    commands,
    profile_pieces,
)
from infra.kafka.acls import MirrorAcls, MirrorAclsArgs
from infra.naming import PROJECT
from infra.parts import Part, cross_account_sites
from infra.render import with_bootstraps
from infra.schema import ADMIN_PREFIX, MskSpec, SiteSpec
from infra.settings import PlatformSettings, StackSettings
from spark_app.config import ConfigError

SERVICE_ACCOUNT = "mirrorkit"  # the driver's
EXECUTOR_SERVICE_ACCOUNT = "mirrorkit-executor"
# Every account whose pods sign in to the clusters as the site's identity: the toolbox's too (infra.k8s.toolbox).
SERVICE_ACCOUNTS = (SERVICE_ACCOUNT, EXECUTOR_SERVICE_ACCOUNT, TOOLBOX)
STACK_LABEL = "mirrorkit.io/stack"


@dataclass(frozen=True)
class HubsFromStack:
    """An Event Hubs namespace another stack of the set makes, as that stack exports it."""

    namespace_name: pulumi.Output[str]
    namespace_id: pulumi.Output[str]
    resource_group_name: pulumi.Output[str]
    connection_string: pulumi.Output[str] | None  # secret; None with local auth off


class _References:
    """One StackReference per other part of the set this stack reads, and its outputs, each required."""

    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self._made: dict[str, pulumi.StackReference] = {}

    def _reference(self, part: Part) -> tuple[str, pulumi.StackReference]:
        stack = part.stack(self.settings.deployment)
        if stack not in self._made:
            qualified = f"{pulumi.get_organization()}/{pulumi.get_project()}/{stack}"
            self._made[stack] = pulumi.StackReference(f"ref-{stack}", stack_name=qualified)
        return stack, self._made[stack]

    def optional(self, part: Part, key: str) -> pulumi.Output[Any]:
        return self._reference(part)[1].get_output(key)

    def require(self, part: Part, key: str) -> pulumi.Output[Any]:
        """The output, or a preview error naming the stack that must export it first."""
        stack, reference = self._reference(part)

        def present(value: Any) -> Any:
            if value is None:
                raise ConfigError(
                    f"stack '{stack}' exports no '{key}', which stack '{self.settings.stack}' reads: run `pulumi up`"
                    f" on '{stack}' first (the order is in docs/deploy/regions.md)"
                )
            return value

        return reference.get_output(key).apply(present)


@dataclass
class Topology:
    """What the program built, for exports and tests."""

    settings: StackSettings
    event_hubs: dict[str, EventHubs | HubsFromStack] = field(default_factory=dict)
    scram_users: dict[str, MskScramUser] = field(default_factory=dict)
    reaches: dict[str, MskReach] = field(default_factory=dict)
    roles: dict[str, MirrorRole] = field(default_factory=dict)
    entra_identities: dict[str, MirrorEntraIdentity] = field(default_factory=dict)
    namespaces: dict[str, MirrorNamespace] = field(default_factory=dict)
    mirrors: dict[str, MirrorApplication] = field(default_factory=dict)
    mirror_configs: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # site -> rendered YAML
    toolboxes: dict[str, Toolbox] = field(default_factory=dict)
    toolbox_configs: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # site -> its flows, stopped too
    acls: dict[str, MirrorAcls] = field(default_factory=dict)
    checkpoint_buckets: dict[str, CheckpointBucket] = field(default_factory=dict)  # by region
    checkpoint_container: CheckpointContainer | None = None
    credentials: dict[str, dict[str, pulumi.Output[str]]] = field(default_factory=dict)
    bootstraps: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # MSK clusters', alias -> servers
    cluster_policies: dict[str, aws.msk.ClusterPolicy] = field(default_factory=dict)
    platform_checks: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # site -> its platform stack
    identities: dict[str, _SiteIdentity] = field(default_factory=dict)
    requested_peerings: dict[str, pulumi.Output[str]] = field(default_factory=dict)  # an MSK part's, by site


class _AwsProviders:
    """One explicit provider per (region, assumed role): the requester and the accepter sides of a peering.

    Named by what it is, `aws-<region>[-as-<role>]`, so a stack's providers keep their names whatever order its
    clusters and sites come in. The first releases named them by call order, `aws-<region>-<n>`: an alias to that
    name keeps each provider, and every resource on it, in place on upgrade."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, str | None], aws.Provider] = {}

    def get(self, region: str, role_arn: str | None) -> aws.Provider:
        key = (region, role_arn)
        if key not in self._made:
            role = f"-as-{re.sub(r'[^a-z0-9]+', '-', role_arn.lower())}" if role_arn else ""
            self._made[key] = aws.Provider(
                f"aws-{region}{role}",
                region=region,
                assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=role_arn)] if role_arn else None,
                opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=f"aws-{region}-{len(self._made)}")]),
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
    running = [s for s in settings.model.sites if settings.clusters_at(s.name)]
    if not any(settings.makes("site", s.name) for s in running):
        return
    # One bucket, or with `per_region` one per region that runs mirrors (CheckpointStore.bucket_in), made by the stack
    # of the first site whose checkpoints it holds; the other sites take it as existing.
    if checkpoint.scheme == "s3a":
        home = settings.model.checkpoint_home
        first: dict[str, SiteSpec] = {}
        for s in running:
            first.setdefault(checkpoint.bucket_region(s.region, home), s)
        for region, site in first.items():
            holds = [s for s in running if checkpoint.bucket_region(s.region, home) == region]
            if not any(settings.makes("site", s.name) for s in holds):
                continue
            existing = checkpoint.existing or not settings.makes("site", site.name)
            role = site.aws.role_arn if site.aws else None
            out.checkpoint_buckets[region] = CheckpointBucket(
                "checkpoints" if region == home else f"checkpoints-{region}",
                CheckpointBucketArgs(checkpoint.bucket_in(region, home), existing, settings.protect_data),
                pulumi.ResourceOptions(provider=None if existing else providers.get(region, role)),
            )
    elif checkpoint.scheme == "abfss" and checkpoint.resource_group is not None:  # settings require it
        container, account = checkpoint.store()
        existing = checkpoint.existing or not settings.makes("site", running[0].name)
        out.checkpoint_container = CheckpointContainer(
            "checkpoints",
            CheckpointContainerArgs(account, container, checkpoint.resource_group, existing, settings.protect_data),
        )


def _checkpoint_keys(settings: StackSettings, site: str) -> list[str]:
    """The key prefixes of a site's flows' checkpoints in their bucket or container."""
    checkpoint = settings.model.mirror.checkpoint
    return [checkpoint.key(f.checkpoint_location) for f in settings.flows_at(site)]


def _msk_vpcs(msk: dict[str, MskSpec]) -> dict[str, tuple[str, list[MskSpec]]]:
    """MSK clusters by VPC, each with the first cluster's alias: in a set, that cluster's part makes the reach."""
    by_vpc: dict[str, tuple[str, list[MskSpec]]] = {}
    for alias, spec in msk.items():
        by_vpc.setdefault(spec.vpc_id, (alias, []))[1].append(spec)
    return by_vpc


def _reach_keys(settings: StackSettings, site: str, alias: str) -> tuple[str, str]:
    """Where a reach's site and MSK VPC are set, for its preview errors."""
    i = next(i for i, s in enumerate(settings.model.sites) if s.name == site)
    j = next(j for j, c in enumerate(settings.model.clusters) if c.alias == alias)
    return f"{PROJECT}:sites[{i}].aws", f"{PROJECT}:clusters[{j}].msk"


def _requested_for(site: str, peerings: dict[str, str]) -> str:
    return peerings[site]


def _msk_side(settings: StackSettings, providers: _AwsProviders, out: Topology) -> None:
    """An MSK cluster's part: its side of each site's reach (peering request, its routes, its ingress rules)."""
    if settings.part is None or settings.part.kind != "msk":
        return
    for site in settings.model.sites:
        msk = {c.alias: c.msk for c in settings.clusters_at(site.name) if c.msk is not None}
        for vpc, (leader, specs) in _msk_vpcs(msk).items():
            if leader != settings.part.name or site.aws is None:
                continue
            args = MskReachArgs(
                settings.stack,
                site.aws,
                None,
                providers.get(specs[0].region, specs[0].role_arn),
                specs,
                site_region=site.region,
                side="msk",
                keys=_reach_keys(settings, site.name, leader),
            )
            reach = out.reaches[f"{site.name}-{vpc}"] = MskReach(f"{site.name}-{vpc}", args)
            if reach.peering_id is not None:
                out.requested_peerings[site.name] = reach.peering_id


def _site_identity(
    settings: StackSettings, site: SiteSpec, providers: _AwsProviders, refs: _References, out: Topology
) -> _SiteIdentity:
    """The site's reach to MSK, its IAM role and its Entra identity, as its flows and checkpoints need them."""
    found = _SiteIdentity()
    clusters = settings.clusters_at(site.name)
    msk = {c.alias: c.msk for c in clusters if c.msk is not None}
    bucket_region = settings.model.mirror.checkpoint.bucket_region(site.region, settings.model.checkpoint_home)
    bucket = out.checkpoint_buckets.get(bucket_region)
    if site.aws is not None and bucket is not None:
        found.spark_conf.update(s3a_conf(site.aws, bucket_region))
    if site.aws is not None and (msk or bucket is not None):
        site_provider = providers.get(site.region, site.aws.role_arn)
        for vpc, (leader, specs) in _msk_vpcs(msk).items():
            if settings.part is None:
                args = MskReachArgs(
                    settings.stack,
                    site.aws,
                    site_provider,
                    providers.get(specs[0].region, specs[0].role_arn),
                    specs,
                    keys=_reach_keys(settings, site.name, leader),
                )
            else:  # the MSK cluster's part requested the peering; this side accepts it
                peering: pulumi.Output[str] | None = None
                if vpc != site.aws.vpc_id:
                    peerings = refs.require(Part("msk", leader), f"msk_{leader}_peerings")
                    peering = peerings.apply(functools.partial(_requested_for, site.name))
                args = MskReachArgs(
                    settings.stack,
                    site.aws,
                    site_provider,
                    None,
                    specs,
                    side="site",
                    peering_id=peering,
                    keys=_reach_keys(settings, site.name, leader),
                )
            out.reaches[f"{site.name}-{vpc}"] = MskReach(f"{site.name}-{vpc}", args)
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
                    operator=TOOLBOX_GRANTED,
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


def site_grants(settings: StackSettings, out: Topology, site: str) -> pulumi.Output[dict[str, Any]]:
    """What a site's role may do on each IAM-auth MSK cluster its flows use: alias -> {role_arn, policy}. A site's
    part exports it, and the cluster's part merges it into the cluster policy."""
    iam = {c.alias: c.msk for c in settings.clusters_at(site) if c.msk is not None and c.msk.auth == "iam"}
    flows = settings.flows_at(site)
    return out.roles[site].role_arn.apply(
        lambda arn: {
            a: {"role_arn": arn, "policy": kafka_policy(flows, {a: spec}, TOOLBOX_GRANTED)} for a, spec in iam.items()
        }
    )


def _cluster_policies(settings: StackSettings, providers: _AwsProviders, refs: _References, out: Topology) -> None:
    """The resource policy of each IAM-auth MSK cluster that a role from another account uses (settings make sure
    the stack can act in the cluster's account). MSK keeps one policy per cluster, so one stack writes all of it: the
    cluster's part in a set, from the grants every site's part exports (a site not yet up adds none), beside the
    statements its `msk.cluster_policy_statements` keeps."""
    model = settings.model
    for c in model.clusters:
        if c.msk is None or not settings.makes("msk", c.alias):
            continue
        spec, alias = c.msk, c.alias
        users = cross_account_sites(model, settings.mirror_config, settings.site_of_flow, alias)
        if not users:
            continue
        grants = [
            site_grants(settings, out, name)
            if settings.part is None
            else refs.optional(Part("site", name), f"grants_{name}")
            for name in users
        ]

        kept = [s.model_dump(exclude_none=True) for s in spec.cluster_policy_statements]

        def document(found: list[dict[str, Any] | None], alias: str = alias, kept: list[dict[str, Any]] = kept) -> str:
            mine = [g[alias] for g in found if g is not None and alias in g]
            return json.dumps(cluster_policy([(g["role_arn"], g["policy"]) for g in mine], kept))

        out.cluster_policies[alias] = aws.msk.ClusterPolicy(
            f"msk-policy-{alias}",
            cluster_arn=spec.cluster_arn,
            policy=pulumi.Output.all(*grants).apply(document),
            # Other stacks' and the platform's access may rest on it: never deleted with this stack.
            opts=pulumi.ResourceOptions(
                provider=providers.get(spec.region, spec.role_arn),
                protect=settings.protect_data,
                retain_on_delete=settings.protect_data,
            ),
        )
        for name in users if settings.part is None else ():
            out.identities[name].ready.append(out.cluster_policies[alias])


def _acls(
    settings: StackSettings,
    out: Topology,
    alias: str,
    bootstrap_servers: pulumi.Input[str],
    principal: str,
    admin_username: str | None,
) -> None:
    """The mirror's ACLs on a cluster, from every flow that touches it, set with the admin credential."""
    out.acls[alias] = MirrorAcls(
        f"acls-{alias}",
        MirrorAclsArgs(
            alias,
            bootstrap_servers,
            principal,
            admin_username,
            settings.mirror_config.flows,
            out.credentials[alias],
            operator=TOOLBOX_GRANTED,
        ),
    )


def _clusters(settings: StackSettings, providers: _AwsProviders, refs: _References, out: Topology) -> None:
    """Each cluster's own resources where this stack makes them; in a site's part, what it reads of the others."""
    model = settings.model
    mine = (
        {a for f in settings.flows_at(settings.part.name) for a in (f.source, f.target)}
        if settings.part is not None and settings.part.kind == "site"
        else set()
    )
    first_site: dict[str, str] = {}  # alias -> the first site whose mirror uses it
    for site in model.sites:
        for c in settings.clusters_at(site.name):
            first_site.setdefault(c.alias, site.name)
    for c in model.clusters:
        if c.eventhubs is not None and settings.makes("eventhubs", c.alias):
            hubs = EventHubs(
                f"eh-{c.alias}",
                EventHubsArgs(c.eventhubs, c.region, settings.hubs(c.alias), protect=settings.protect_data),
            )
            out.event_hubs[c.alias] = hubs
            if hubs.connection_string is not None:
                out.credentials[c.alias] = {"password": hubs.connection_string}
        elif c.eventhubs is not None and c.alias in mine:
            part = Part("eventhubs", c.alias)
            key = f"eventhubs_{c.alias}"
            connection = None if c.eventhubs.disable_local_auth else refs.require(part, f"{key}_connection_string")
            out.event_hubs[c.alias] = HubsFromStack(
                refs.require(part, f"{key}_namespace"),
                refs.require(part, f"{key}_namespace_id"),
                refs.require(part, f"{key}_resource_group"),
                connection,
            )
            if connection is not None:
                out.credentials[c.alias] = {"password": pulumi.Output.secret(connection)}
        # One stack sets a cluster's ACLs: a self-managed cluster's first site's.
        if c.kafka is not None and c.kafka.acls is not None and settings.makes("site", first_site.get(c.alias, "")):
            admin = c.kafka.acls.admin_username if c.kafka.auth == "scram" else None
            _acls(settings, out, c.alias, c.kafka.bootstrap_servers, c.kafka.principal, admin)
        if c.msk is not None and settings.makes("msk", c.alias):
            provider = providers.get(c.msk.region, c.msk.role_arn)
            out.bootstraps[c.alias] = _bootstrap(c.msk, provider)
            if c.msk.auth == "scram":
                out.scram_users[c.alias] = MskScramUser(
                    f"scram-{c.alias}",
                    MskScramUserArgs(c.msk, c.alias, out.credentials[c.alias]["password"], settings.deployment),
                    pulumi.ResourceOptions(provider=provider),
                )
            # An MSK cluster's: the stack that makes its SCRAM user, the mirror's principal there.
            if c.msk.acls is not None:
                _acls(settings, out, c.alias, out.bootstraps[c.alias], c.msk.principal, c.msk.acls.admin_username)
        elif c.msk is not None and c.alias in mine:
            out.bootstraps[c.alias] = refs.require(Part("msk", c.alias), f"msk_{c.alias}_bootstrap")


def build(settings: StackSettings) -> Topology:
    out = Topology(settings)
    model = settings.model
    for alias, files in model.credentials.items():
        out.credentials[alias] = {k: pulumi.Output.secret(v.get_secret_value()) for k, v in files.items()}
    providers = _AwsProviders()
    refs = _References(settings)
    _clusters(settings, providers, refs, out)
    _checkpoint_store(settings, providers, out)
    for site in model.sites:
        if settings.clusters_at(site.name) and settings.makes("site", site.name):
            out.identities[site.name] = _site_identity(settings, site, providers, refs, out)
    _msk_side(settings, providers, out)
    _cluster_policies(settings, providers, refs, out)
    for site in model.sites:
        clusters = settings.clusters_at(site.name)
        if not clusters or not settings.makes("site", site.name):
            continue
        msk = {c.alias: c.msk for c in clusters if c.msk is not None}
        entra = [c for c in clusters if c.entra]
        identity = out.identities[site.name]
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
        if site.platform is not None:
            out.platform_checks[site.name] = _platform_watches(refs, site.platform, settings.namespace)
        elif settings.spark_operator:
            operator = SparkOperator(
                f"{site.name}-operator",
                SparkOperatorArgs(job_namespaces=[namespace.namespace], release=settings.operator_name),
                on_site,
            )
            ready.append(operator.chart)
        site_bootstraps = {a: out.bootstraps[a] for a in msk}
        config_yaml: pulumi.Output[str] | None = None  # every flow of the site stopped: no mirror runs there
        if site_config.flows:
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
                secret_versions=namespace.secret_versions,
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
        _toolbox(settings, site, out, identity, site_bootstraps, on_site)
    return out


def _toolbox(
    settings: StackSettings,
    site: SiteSpec,
    out: Topology,
    identity: _SiteIdentity,
    bootstraps: dict[str, pulumi.Output[str]],
    on_site: pulumi.ResourceOptions,
) -> None:
    """The site's toolbox (infra.k8s.toolbox), from this site's objects alone: its flows' config, stopped flows
    included, and the Secrets its namespace holds."""
    namespace = out.namespaces[site.name]
    clusters = settings.clusters_at(site.name)
    aliases = {c.alias for c in clusters}
    config = settings.mirror_config.model_copy(
        update={
            "flows": settings.flows_at(site.name),
            "clusters": [c for c in settings.mirror_config.clusters if c.alias in aliases],
        }
    )
    config_yaml = (
        pulumi.Output.all(**bootstraps).apply(functools.partial(with_bootstraps, config))
        if bootstraps
        else pulumi.Output.from_input(with_bootstraps(config, {}))
    )
    out.toolbox_configs[site.name] = config_yaml
    aws = identity.aws_credentials and site.aws is not None
    out.toolboxes[site.name] = Toolbox(
        f"{site.name}-toolbox",
        ToolboxArgs(
            namespace=namespace.namespace,
            image=settings.image,
            config_yaml=config_yaml,
            secret_names=namespace.secret_names,
            kafka_ports=sorted({p for c in clusters for p in c.ports}),
            api_server_cidrs=site.api_server_cidrs,
            profile=_profile_configmap(settings, site),
            service_account_annotations=identity.annotations,
            pod_labels=identity.pod_labels,
            # Entra ID's token endpoint, or STS for IRSA; the toolbox reads no checkpoint in object storage.
            https_egress=any(c.entra for c in clusters)
            or (aws and site.aws is not None and site.aws.oidc_provider_arn is not None),
            pod_identity_agent=aws and site.aws is not None and site.aws.eks_cluster is not None,
            token_by_hand=identity.token_by_hand,
            image_pull_secrets=settings.model.mirror.image_pull_secrets,
        ),
        pulumi.ResourceOptions.merge(on_site, pulumi.ResourceOptions(depends_on=[namespace])),
    )


def _profile_configmap(settings: StackSettings, site: SiteSpec) -> ProfileConfigMap:
    where, _, name = (site.profile_configmap or f"{settings.namespace}/{PROFILE_CONFIGMAP}").partition("/")
    return ProfileConfigMap(where, name)


def _platform_watches(refs: _References, platform: str, namespace: str) -> pulumi.Output[str]:
    """The platform stack's name, once it says its Spark Operator acts in the mirror's namespace."""

    def check(watched: list[str]) -> str:
        if namespace not in watched:
            raise ConfigError(
                f"platform stack '{platform}': its Spark Operator does not act in namespace '{namespace}' (it acts"
                f" in {', '.join(watched)}); add it to that stack's mirrorkit:platform.job_namespaces"
            )
        return platform

    return refs.require(Part("platform", platform), "job_namespaces").apply(check)


def build_platform(settings: PlatformSettings) -> dict[str, Any]:
    """A platform stack: the Spark Operator and its CRDs, once per cluster, and the namespaces it acts in; its exports.

    The chart makes the operator's Role and binding in each job namespace, so the namespaces are made here (with the
    Pod Security labels a site gives its namespace), before the release: a first `up` of the platform needs no site's
    stack, and a site's stack (which makes the same namespace with its labels, by server-side apply) finds it there.
    They are left in the cluster when a namespace leaves the list or the stack goes: a site's checkpoint PVC may live
    in one. docs/decisions/2026-12-06-the-platform-makes-the-job-namespaces.md says why."""
    # Named by what it is, not by the stack, so renaming the stack keeps the provider and everything on it.
    provider = k8s.Provider(
        "k8s",
        context=settings.spec.context,
        opts=pulumi.ResourceOptions(aliases=[pulumi.Alias(name=f"{settings.stack}-k8s")]),
    )
    namespaces = [
        k8s.core.v1.Namespace(
            f"job-{namespace}",
            metadata={"name": namespace, "labels": POD_SECURITY},
            opts=pulumi.ResourceOptions(provider=provider, retain_on_delete=True),
        )
        for namespace in settings.spec.job_namespaces
    ]
    operator = SparkOperator(
        "operator",
        SparkOperatorArgs(
            job_namespaces=list(settings.spec.job_namespaces), release=settings.spec.release, depends_on=namespaces
        ),
        pulumi.ResourceOptions(provider=provider),
    )
    return {"release": operator.release, "job_namespaces": list(settings.spec.job_namespaces)}


def exports(out: Topology) -> dict[str, Any]:
    """The stack's outputs: what the other stacks of a set read (infra.parts), and what people look up. No credential
    is an output of a one-stack deployment; in a set, the Event Hubs connection string is a secret output of its
    namespace's part, which only that namespace's sites read."""
    settings = out.settings
    found: dict[str, Any] = {}
    for site, config in out.mirror_configs.items():
        found[f"mirror_config_{site}"] = config
    for alias, hubs in out.event_hubs.items():
        if isinstance(hubs, EventHubs):
            found[f"eventhubs_{alias}_namespace"] = hubs.namespace_name
            found[f"eventhubs_{alias}_namespace_id"] = hubs.namespace_id
            found[f"eventhubs_{alias}_resource_group"] = hubs.resource_group_name
            if settings.part is not None and hubs.connection_string is not None:
                found[f"eventhubs_{alias}_connection_string"] = hubs.connection_string
    for site, role in out.roles.items():
        found[f"mirror_role_{site}"] = role.role_arn
        if settings.part is not None:
            found[f"grants_{site}"] = site_grants(settings, out, site)
    if settings.part is not None and settings.part.kind == "msk":
        alias = settings.part.name
        found[f"msk_{alias}_bootstrap"] = out.bootstraps[alias]
        found[f"msk_{alias}_peerings"] = out.requested_peerings
    for site, platform in out.platform_checks.items():
        found[f"platform_{site}"] = platform
    # What a failover from the site needs, from the site's stack alone (docs/operations/failover.md): the toolbox and
    # the commands that run it, and the applications' profile after each flow's failover. No credential is in them.
    for site, toolbox in out.toolboxes.items():
        spec = settings.site(site)
        profile = _profile_configmap(settings, spec)
        found[f"toolbox_{site}"] = {
            "namespace": settings.namespace,
            "context": spec.context,
            "cronjob": toolbox.name,
            "service_account": toolbox.service_account,
            "config": CONFIG_PATH,
            "profile_configmap": str(profile),
            "commands": commands(
                settings.namespace, spec.context, settings.flows_at(site), profile, out.mirrors[site].checkpoint_claim
            ),
        }
        found[f"profile_{site}"] = out.toolbox_configs[site].apply(profile_pieces)
    return found
