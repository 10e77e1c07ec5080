"""Stack config -> typed, validated settings. Everything is checked here, before any resource exists.

The stack file says which clusters exist, which Kubernetes sites run mirrors and which flows exist; the mirror's
own config (spark_app.config.MirrorConfig) is rendered from these and validated by spark_app itself, so a bad
stack fails at `pulumi preview` with the key path as the user wrote it, e.g.
`mirrorkit:flows[1].target: unknown cluster 'dr2'`.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pulumi
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from infra.versions import pinned
from spark_app.config import ALIAS_PATTERN, ConfigError, FlowConfig, FlowMode, MirrorConfig, StrictModel, cores_needed
from spark_app.policy import HEARTBEATS_TOPIC, event_hubs_topics, target_topic

PROJECT = "mirrorkit"
SECRETS_DIR = "/etc/mirrorkit/secrets"
CHECKPOINT_DIR = "/checkpoints"
EVENTHUBS_PORT = 9093
MSK_PORTS = {"scram": 9096, "iam": 9098, "tls": 9094}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
APP_NAME_MAX = 50  # Spark derives pod and service names from it, within Kubernetes' 63
# Looked up from the MSK cluster at deploy time; stands in while the stack is validated.
PENDING_BOOTSTRAP = "bootstrap.pending.invalid"


class Tier(enum.StrEnum):
    BASIC = "Basic"
    STANDARD = "Standard"
    PREMIUM = "Premium"
    DEDICATED = "Dedicated"


@dataclass(frozen=True)
class TierLimits:
    partitions: int
    retention_hours: int
    consumer_groups: int


TIER_LIMITS = {
    Tier.STANDARD: TierLimits(partitions=32, retention_hours=7 * 24, consumer_groups=20),
    Tier.PREMIUM: TierLimits(partitions=100, retention_hours=90 * 24, consumer_groups=100),
    Tier.DEDICATED: TierLimits(partitions=1024, retention_hours=90 * 24, consumer_groups=1000),
}
# Event hubs per namespace: Standard 10 whatever its throughput units; Premium 100 per processing unit; Dedicated
# 1000 per capacity unit. ARM refuses the next one with "Conflict 40300".
HUBS_PER_NAMESPACE = {Tier.STANDARD: 10}
HUBS_PER_CAPACITY = {Tier.PREMIUM: 100, Tier.DEDICATED: 1000}
PREMIUM_CAPACITIES = (1, 2, 4, 8, 16)


def _cidr(v: str) -> str:
    ipaddress.ip_network(v)  # raises ValueError with a readable message
    return v


Cidr = Annotated[str, Field(min_length=9)]


class SourceTopic(StrictModel):
    """What infra must know of a source topic to size its copy on a cluster it provisions."""

    partitions: Annotated[int, Field(gt=0)]
    compacted: bool = False


class GeoDr(StrictModel):
    alias: Annotated[str, Field(min_length=1)]
    partner_namespace_id: Annotated[str, Field(min_length=1)]


class EventHubsSpec(StrictModel):
    namespace: Annotated[str, Field(pattern=r"^[a-zA-Z][a-zA-Z0-9-]{4,48}[a-zA-Z0-9]$")]
    resource_group: Annotated[str, Field(min_length=1)]
    existing_resource_group: bool = False
    tier: Tier
    capacity: Annotated[int, Field(ge=1)] = 1
    auto_inflate_max: Annotated[int, Field(ge=1, le=40)] | None = None  # Standard only; None turns auto-inflate off
    zone_redundant: bool = True
    public_network_access: Literal["Enabled", "Disabled", "SecuredByPerimeter"] = "Enabled"
    disable_local_auth: bool = False
    dedicated_cluster_id: str | None = None  # Dedicated: the existing Event Hubs cluster the namespace lives on
    retention_hours: Annotated[int, Field(ge=1)] = 24
    consumer_groups: list[str] = Field(default_factory=list)
    manage_rights: bool = False  # the mirror's rule gets Manage only when the stack asks for it
    geo_dr: GeoDr | None = None

    @model_validator(mode="after")
    def _fits_tier(self) -> EventHubsSpec:
        if self.tier is Tier.BASIC:
            raise ValueError("tier: 'Basic' has no Kafka endpoint; use Standard, Premium or Dedicated")
        limits = TIER_LIMITS[self.tier]
        errors = []
        if self.retention_hours > limits.retention_hours:
            errors.append(
                f"retention_hours: {self.retention_hours} is over the {self.tier.value} tier's {limits.retention_hours}"
            )
        if len(self.consumer_groups) + 1 > limits.consumer_groups:  # $Default counts too
            errors.append(f"consumer_groups: {self.tier.value} allows {limits.consumer_groups} per hub with $Default")
        if self.auto_inflate_max is not None and self.tier is not Tier.STANDARD:
            errors.append("auto_inflate_max: auto-inflate exists on the Standard tier only")
        if self.auto_inflate_max is not None and self.auto_inflate_max < self.capacity:
            errors.append(f"auto_inflate_max: {self.auto_inflate_max} is below capacity {self.capacity}")
        if self.tier is Tier.PREMIUM and self.capacity not in PREMIUM_CAPACITIES:
            errors.append(f"capacity: Premium takes 1, 2, 4, 8 or 16 processing units, not {self.capacity}")
        if (self.tier is Tier.DEDICATED) != (self.dedicated_cluster_id is not None):
            errors.append("dedicated_cluster_id: give it for tier Dedicated, and only then")
        if errors:
            raise ValueError("\n".join(errors))
        return self

    @property
    def hub_limit(self) -> int:
        """How many event hubs the namespace takes, internal ones counted."""
        return HUBS_PER_NAMESPACE.get(self.tier) or HUBS_PER_CAPACITY[self.tier] * self.capacity

    @property
    def bootstrap_servers(self) -> str:
        """With Geo-DR, through the alias, which follows a failover; the namespace's own name would not."""
        host = self.geo_dr.alias if self.geo_dr is not None else self.namespace
        return f"{host}.servicebus.windows.net:{EVENTHUBS_PORT}"


MSK_ARN = re.compile(
    r"^arn:aws:kafka:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):cluster/(?P<name>[^/]+)/(?P<uuid>[^/]+)$"
)


class MskSpec(StrictModel):
    cluster_arn: Annotated[str, Field(pattern=MSK_ARN.pattern)]
    auth: Literal["scram", "iam", "tls"]
    vpc_id: Annotated[str, Field(pattern=r"^vpc-[0-9a-f]+$")]
    cidr: Cidr
    route_table_ids: Annotated[list[str], Field(min_length=1)]
    security_group_id: Annotated[str, Field(pattern=r"^sg-[0-9a-f]+$")]
    username: str = "mirror"  # scram
    role_arn: str | None = None  # assumed to act in the MSK account (cross-account accepter, secret, rules)

    _cidr_ok = field_validator("cidr")(_cidr)

    @property
    def region(self) -> str:
        return self._arn("region")

    @property
    def account_id(self) -> str:
        return self._arn("account")

    def _arn(self, part: str) -> str:
        match = MSK_ARN.match(self.cluster_arn)
        if match is None:  # the field's pattern is MSK_ARN's, so a parsed spec always matches
            raise ValueError(f"cluster_arn: '{self.cluster_arn}' is not an MSK cluster ARN")
        return match[part]

    @property
    def port(self) -> int:
        return MSK_PORTS[self.auth]

    def arn_of(self, kind: Literal["topic", "group"], name: str) -> str:
        """IAM resource ARN of a topic or group on this cluster (`name` may end in `*`)."""
        return self.cluster_arn.replace(":cluster/", f":{kind}/", 1) + f"/{name}"


ADMIN_PREFIX = "admin_"  # credentials.<alias>.admin_*: the program's own, to set ACLs; never mounted in a pod


class KafkaAcls(StrictModel):
    """The mirror's ACLs on a self-managed cluster, set by the program with an admin credential
    (`credentials.<alias>.admin_password`, or `admin_client_cert` and `admin_client_key` for mTLS)."""

    principal: str | None = None  # as the brokers name the mirror; default for SCRAM: User:<username>
    admin_username: str | None = None  # SCRAM: the user that may alter ACLs


class KafkaSpec(StrictModel):
    """Self-managed Kafka (on-prem, Strimzi): reached over an existing network path."""

    bootstrap_servers: Annotated[str, Field(min_length=3)]
    auth: Literal["none", "tls", "scram", "mtls"] = "none"
    username: str | None = None  # scram
    ca_file: str | None = None
    acls: KafkaAcls | None = None

    @model_validator(mode="after")
    def _acls_need_an_identity(self) -> KafkaSpec:
        if self.acls is None:
            return self
        if self.auth not in ("scram", "mtls"):
            raise ValueError(f"acls: the mirror has no identity on a '{self.auth}' listener; use scram or mtls")
        if self.auth == "mtls" and self.acls.principal is None:
            raise ValueError("acls: give the principal the brokers map the mirror's certificate to (User:CN=...)")
        if self.auth == "scram" and self.acls.admin_username is None:
            raise ValueError("acls: give admin_username, the SCRAM user that sets the ACLs")
        return self

    @property
    def principal(self) -> str:
        """The mirror's principal for its ACLs."""
        if self.acls is not None and self.acls.principal is not None:
            return self.acls.principal
        return f"User:{self.username}"

    @property
    def ports(self) -> set[int]:
        return {int(s.rsplit(":", 1)[1]) for s in self.bootstrap_servers.split(",") if s.rsplit(":", 1)[-1].isdigit()}


class ClusterSpec(StrictModel):
    alias: Annotated[str, Field(pattern=ALIAS_PATTERN)]
    region: Annotated[str, Field(min_length=1)]
    eventhubs: EventHubsSpec | None = None
    msk: MskSpec | None = None
    kafka: KafkaSpec | None = None
    topics: dict[str, SourceTopic] = Field(default_factory=dict)  # source topics flows read from this cluster
    client_overrides: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_platform(self) -> ClusterSpec:
        given = [k for k in ("eventhubs", "msk", "kafka") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of 'eventhubs', 'msk' or 'kafka' (got {given or 'none'})")
        if self.msk is not None and self.msk.region != self.region:
            raise ValueError(f"region: '{self.region}' but msk.cluster_arn is in '{self.msk.region}'")
        return self

    @property
    def entra(self) -> bool:
        """An Event Hubs namespace with local auth off: the mirror signs in with Entra ID (workload identity)."""
        return self.eventhubs is not None and self.eventhubs.disable_local_auth

    @property
    def self_managed(self) -> KafkaSpec:
        """The `kafka` spec of a cluster that is neither Event Hubs nor MSK (`_one_platform` leaves no fourth kind)."""
        if self.kafka is None:
            raise ValueError(f"cluster '{self.alias}' is not self-managed Kafka")
        return self.kafka

    @property
    def ports(self) -> set[int]:
        if self.eventhubs is not None:
            return {EVENTHUBS_PORT}
        return {self.msk.port} if self.msk is not None else self.self_managed.ports

    def credential_keys(self) -> tuple[str, ...]:
        """Files the mirror reads from this cluster's Kubernetes Secret, set in stack config as secrets."""
        auth = self.msk.auth if self.msk is not None else self.kafka.auth if self.kafka is not None else "sas"
        keys = {
            "scram": ("password",),
            "tls": ("client_cert", "client_key"),
            "mtls": ("client_cert", "client_key"),
        }.get(auth, ())
        if self.kafka is not None and self.kafka.acls is not None:
            keys += tuple(f"{ADMIN_PREFIX}{k}" for k in keys)
        return keys


class AwsSite(StrictModel):
    """The site's own VPC, to peer with MSK VPCs, and how its pods get an AWS identity."""

    vpc_id: Annotated[str, Field(pattern=r"^vpc-[0-9a-f]+$")]
    cidr: Cidr
    route_table_ids: Annotated[list[str], Field(min_length=1)]
    account_id: Annotated[str, Field(pattern=r"^\d{12}$")]
    role_arn: str | None = None
    eks_cluster: str | None = None  # EKS Pod Identity
    oidc_provider_arn: str | None = None  # IRSA, when Pod Identity is not used

    _cidr_ok = field_validator("cidr")(_cidr)

    @model_validator(mode="after")
    def _one_identity(self) -> AwsSite:
        if (self.eks_cluster is None) == (self.oidc_provider_arn is None):
            raise ValueError("give exactly one of 'eks_cluster' (Pod Identity) or 'oidc_provider_arn' (IRSA)")
        return self


class AzureSite(StrictModel):
    """Azure workload identity for the site's pods: the issuer of its service-account tokens (AKS: the cluster's
    `oidcIssuerProfile.issuerUrl`); the workload identity webhook must run on the cluster."""

    oidc_issuer_url: Annotated[str, Field(pattern=r"^https://\S+$")]


class SiteSpec(StrictModel):
    """A Kubernetes cluster that runs mirrors."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")]
    region: Annotated[str, Field(min_length=1)]
    context: str | None = None  # kubeconfig context; otherwise mirrorkit:kubeconfigs.<name> (secret)
    api_server_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    monitoring_namespace: str = "monitoring"
    aws: AwsSite | None = None
    azure: AzureSite | None = None  # needed when its mirror reaches an Event Hubs namespace with local auth off

    @field_validator("api_server_cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        return [_cidr(c) for c in v]


class Resources(StrictModel):
    cores: Annotated[int, Field(ge=1)] = 1
    memory: Annotated[str, Field(pattern=r"^\d+[kmgt]$")] = "2g"


class ExecutorResources(Resources):
    instances: Annotated[int, Field(ge=1)] = 1


class Pvc(StrictModel):
    size: Annotated[str, Field(pattern=r"^\d+(Mi|Gi|Ti)$")] = "10Gi"
    storage_class: str | None = None


ABFSS_URL = re.compile(
    r"^abfss://(?P<container>[a-z0-9-]{3,63})@(?P<account>[a-z0-9]{3,24})\.dfs\.core\.windows\.net/?"
)
S3A_URL = re.compile(r"^s3a://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/?")


class Checkpoint(StrictModel):
    """Where Spark keeps its checkpoints: a PVC on the driver, or object storage (s3a://, abfss://, gs://).

    For s3a:// and abfss://, infra makes the bucket or container (or takes an existing one), lets each mirror's
    identity reach its own prefixes only, and renders Spark's settings to sign in with the pod's identity.
    """

    pvc: Pvc | None = None
    url: Annotated[str, Field(pattern=r"^(s3a|abfss|gs)://.+")] | None = None
    existing: bool = False  # the bucket or container exists already: take it, never make or delete it
    region: str | None = None  # s3a: the bucket's region (default: the first site's); abfss: the account's location
    resource_group: str | None = None  # abfss: the storage account's resource group (the account must exist)

    @model_validator(mode="after")
    def _one(self) -> Checkpoint:
        if (self.pvc is None) == (self.url is None):
            raise ValueError("give exactly one of 'pvc' or 'url'")
        if self.url is not None and self.url.startswith("abfss://"):
            if ABFSS_URL.match(self.url) is None:
                raise ValueError(f"url: '{self.url}' is not abfss://<container>@<account>.dfs.core.windows.net/...")
            if self.resource_group is None or self.region is None:
                raise ValueError("resource_group: give the storage account's resource group and region for abfss://")
        if self.url is not None and self.url.startswith("s3a://") and S3A_URL.match(self.url) is None:
            raise ValueError(f"url: '{self.url}' does not name an S3 bucket")
        return self

    @property
    def scheme(self) -> str | None:
        return None if self.url is None else self.url.split("://", 1)[0]

    def store(self) -> tuple[str, str]:
        """(bucket or container, storage account or '') of an s3a:// or abfss:// url."""
        groups = self._match(self.url or "").groupdict()
        return groups.get("bucket") or groups["container"], groups.get("account") or ""

    def key(self, location: str) -> str:
        """A checkpoint location's key prefix in its bucket or container."""
        return location[self._match(location).end() :].strip("/")

    @staticmethod
    def _match(url: str) -> re.Match[str]:
        match = ABFSS_URL.match(url) or S3A_URL.match(url)
        if match is None:
            raise ValueError(f"checkpoint url '{url}' is neither s3a:// nor abfss://")
        return match

    def location(self, stack: str, source: str, target: str) -> str:
        """A PVC lives in the stack's own namespace; in a shared bucket, each stack keeps to its own prefix."""
        if self.url is None:  # `_one`: url, or else a pvc
            return f"{CHECKPOINT_DIR}/{source}-{target}"
        return f"{self.url.rstrip('/')}/{stack}/{source}-{target}"


class Alerts(StrictModel):
    lag_records: Annotated[int, Field(ge=1)] = 100_000
    stalled_minutes: Annotated[int, Field(ge=1)] = 10
    checkpoint_age_s: Annotated[int, Field(ge=1)] = 300
    heartbeat_age_s: Annotated[int, Field(ge=1)] = 300


class MirrorSpec(StrictModel):
    # The SparkApplication's sparkVersion: the pyspark pin, which the image's Spark is built from too
    # (images/mirror/Dockerfile). Set it only for an image built some other way.
    spark_version: str = pinned("pyspark")
    driver: Resources = Field(default_factory=Resources)
    executor: ExecutorResources = Field(default_factory=ExecutorResources)
    checkpoint: Checkpoint = Field(default_factory=lambda: Checkpoint(pvc=Pvc()))
    alerts: Alerts = Field(default_factory=Alerts)
    # On the PodMonitor and PrometheusRule: kube-prometheus-stack selects them by `release: <its Helm release>`.
    monitoring_labels: dict[str, str] = Field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    # On the dashboard's ConfigMap, in the site's monitoring namespace: Grafana's sidecar loads what carries these.
    dashboard_labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    # Top-level MirrorConfig settings (intervals, metrics_port), passed through and checked by spark_app.
    runtime: dict[str, Any] = Field(default_factory=dict)


class StackModel(StrictModel):
    """The stack file's structured keys, as one model so errors carry their paths."""

    sites: Annotated[list[SiteSpec], Field(min_length=1)]
    clusters: Annotated[list[ClusterSpec], Field(min_length=2)]
    flows: Annotated[list[dict[str, Any]], Field(min_length=1)]
    mirror: MirrorSpec = Field(default_factory=MirrorSpec)
    placement: dict[str, str] = Field(default_factory=dict)  # flow name `SRC->DST` -> site; default: target's region
    credentials: dict[str, dict[str, SecretStr]] = Field(default_factory=dict)
    kubeconfigs: dict[str, SecretStr] = Field(default_factory=dict)


@dataclass(frozen=True)
class HubSpec:
    """One event hub to create: a mirrored topic's copy, or one of the mirror's internal topics."""

    name: str
    partitions: int
    compacted: bool
    own: bool = False  # one of the mirror's own topics (heartbeats, checkpoints, offset syncs, dead letters)


@dataclass(frozen=True)
class StackSettings:
    stack: str
    namespace: str
    image: str
    spark_operator: bool
    monitoring: bool
    protect_data: bool  # event hubs, their namespaces, checkpoint PVCs and buckets: Pulumi may not delete them
    model: StackModel
    mirror_config: MirrorConfig  # every flow, bootstraps still pending where they are looked up
    site_of_flow: dict[str, str]  # flow name -> site name

    @property
    def operator_name(self) -> str:
        """The Spark Operator's Helm release and namespace: its cluster-wide objects are named after the release."""
        return operator_name(self.stack)

    def app_name(self, site: str) -> str:
        """The SparkApplication of a site: unique across stacks, as alerts and dashboards select on it."""
        return app_name(self.stack, site)

    def cluster(self, alias: str) -> ClusterSpec:
        return next(c for c in self.model.clusters if c.alias == alias)

    def site(self, name: str) -> SiteSpec:
        return next(s for s in self.model.sites if s.name == name)

    def flows_at(self, site: str) -> list[FlowConfig]:
        return [f for f in self.mirror_config.flows if self.site_of_flow[f.name] == site]

    def clusters_at(self, site: str) -> list[ClusterSpec]:
        """The clusters a site's mirror talks to, in stack order."""
        used = {a for f in self.flows_at(site) for a in (f.source, f.target)}
        return [c for c in self.model.clusters if c.alias in used]

    def mirror_at(self, site: str) -> MirrorConfig:
        """The runtime config of the mirror a site runs: its own flows and the clusters they name."""
        aliases = {c.alias for c in self.clusters_at(site)}
        return self.mirror_config.model_copy(
            update={
                "flows": self.flows_at(site),
                "clusters": [c for c in self.mirror_config.clusters if c.alias in aliases],
            }
        )

    def hubs(self, alias: str) -> list[HubSpec]:
        """Every hub an Event Hubs cluster needs, named by spark_app's policy and sized from the source topic."""
        return _hubs(self.mirror_config, self.model, alias)


def _hubs(mirror: MirrorConfig, model: StackModel, alias: str) -> list[HubSpec]:
    sources: dict[str, tuple[str, str]] = {}  # hub name -> (source alias, source topic)
    for flow in mirror.flows:
        if flow.target == alias:
            for topic in flow.topics.literal_names() or []:
                sources[target_topic(flow, topic)] = (flow.source, topic)
    clusters = {c.alias: c for c in model.clusters}
    hubs = []
    for name in event_hubs_topics(mirror)[alias]:
        source = sources.get(name)
        spec = clusters[source[0]].topics.get(source[1]) if source else None
        if spec is not None:
            hubs.append(HubSpec(name, spec.partitions, spec.compacted))
        else:
            # The mirror's own topics (heartbeats, checkpoints, offset syncs, dead letters): one partition, like
            # MM2's; checkpoints and offset syncs are read back by key, so they are compacted.
            hubs.append(HubSpec(name, 1, name.endswith(".internal"), own=True))
    return hubs


def _secret_key(alias: str, key: str) -> str:
    return f"{PROJECT}:credentials.{alias}.{key}"


def _mirror_cluster(c: ClusterSpec) -> dict[str, Any]:
    """The spark_app view of a cluster: how to reach it, and where its secrets are mounted."""
    secrets = f"{SECRETS_DIR}/{c.alias}"
    out: dict[str, Any] = {"alias": c.alias, "client_overrides": c.client_overrides}
    by_auth: dict[str, dict[str, Any]]
    if c.eventhubs is not None:
        if c.entra:
            return out | {"bootstrap_servers": c.eventhubs.bootstrap_servers, "profile": "eventhubs-entra"}
        return out | {
            "bootstrap_servers": c.eventhubs.bootstrap_servers,
            "profile": "eventhubs",
            "password": {"file": f"{secrets}/password"},
        }
    if c.msk is not None:
        by_auth = {
            "scram": {"profile": "msk-scram", "username": c.msk.username, "password": {"file": f"{secrets}/password"}},
            "iam": {"profile": "msk-iam", "region": c.msk.region},
            "tls": {
                "profile": "mtls",
                "client_cert_file": f"{secrets}/client_cert",
                "client_key": {"file": f"{secrets}/client_key"},
            },
        }
        return out | {"bootstrap_servers": f"{PENDING_BOOTSTRAP}:{c.msk.port}"} | by_auth[c.msk.auth]
    k = c.self_managed
    by_auth = {
        "none": {"profile": "kafka"},
        "tls": {"profile": "kafka", "tls": True},
        "scram": {"profile": "msk-scram", "username": k.username, "password": {"file": f"{secrets}/password"}},
        "mtls": {
            "profile": "mtls",
            "client_cert_file": f"{secrets}/client_cert",
            "client_key": {"file": f"{secrets}/client_key"},
        },
    }
    return out | {"bootstrap_servers": k.bootstrap_servers, "ca_file": k.ca_file} | by_auth[k.auth]


def operator_name(stack: str) -> str:
    return f"spark-operator-{stack}"


def app_name(stack: str, site: str) -> str:
    return f"{PROJECT}-{stack}-{site}"


def _names(stack: str, namespace: str, model: StackModel) -> list[str]:
    """Kubernetes names derive from the stack, so stacks sharing a cluster never take each other's objects."""
    errors = []
    if not DNS_LABEL.match(namespace):
        errors.append(f"{PROJECT}:namespace: '{namespace}' is not a Kubernetes namespace name (a DNS label)")
    for i, site in enumerate(model.sites):
        name = app_name(stack, site.name)
        if len(name) > APP_NAME_MAX or not DNS_LABEL.match(name):
            errors.append(
                f"{PROJECT}:sites[{i}].name: the mirror's name '{name}' (project, stack, site) is longer than"
                f" {APP_NAME_MAX} characters or not a DNS label; shorten the stack or site name"
            )
    if not DNS_LABEL.match(operator_name(stack)):
        errors.append(f"{PROJECT}: stack '{stack}' makes no valid Helm release name '{operator_name(stack)}'")
    return errors


def _render(model: StackModel, stack: str) -> MirrorConfig:
    """The MirrorConfig the stack means, validated by spark_app; its errors keep the stack's key paths."""
    errors = [
        f"{PROJECT}:flows[{i}].checkpoint_location: set by infra from {PROJECT}:mirror.checkpoint; remove it"
        for i, f in enumerate(model.flows)
        if "checkpoint_location" in f
    ]
    if errors:
        raise ConfigError("\n".join(errors))
    flows = []
    for raw in model.flows:
        # Raw until spark_app validates it below; a flow without its aliases fails there, not here.
        where = model.mirror.checkpoint.location(stack, str(raw.get("source")), str(raw.get("target")))
        flows.append(raw | {"checkpoint_location": where})
    raw_config = model.mirror.runtime | {"clusters": [_mirror_cluster(c) for c in model.clusters], "flows": flows}
    try:
        return MirrorConfig.model_validate(raw_config)
    except ValidationError as err:
        runtime_keys = set(MirrorConfig.model_fields) - {"clusters", "flows"}
        lines = str(ConfigError.from_validation(PROJECT, err)).splitlines()
        raise ConfigError("\n".join(_under_runtime(line, runtime_keys) for line in lines)) from None


def _under_runtime(line: str, runtime_keys: set[str]) -> str:
    key = line.removeprefix(f"{PROJECT}:").split(":", 1)[0].split(".", 1)[0]
    return line.replace(f"{PROJECT}:", f"{PROJECT}:mirror.runtime.", 1) if key in runtime_keys else line


def _check(model: StackModel, mirror: MirrorConfig) -> dict[str, str]:
    """Cross-key rules: placement, credentials, what each site needs, and hub sizes. Returns flow -> site."""
    errors: list[str] = []
    clusters = {c.alias: (i, c) for i, c in enumerate(model.clusters)}
    sites = {s.name: s for s in model.sites}
    site_of_flow: dict[str, str] = {}
    for name, placed in model.placement.items():
        if placed not in sites:
            errors.append(f"{PROJECT}:placement.{name}: unknown site '{placed}' (sites: {', '.join(sites)})")
        if name not in {f.name for f in mirror.flows}:
            errors.append(f"{PROJECT}:placement.{name}: no such flow")
    for i, flow in enumerate(mirror.flows):
        region = model.clusters[clusters[flow.target][0]].region
        in_region = [s.name for s in model.sites if s.region == region]
        chosen = model.placement.get(flow.name) or (in_region[0] if len(in_region) == 1 else None)
        if chosen is None:
            errors.append(
                f"{PROJECT}:flows[{i}]: {len(in_region)} sites in region '{region}' (the target's) to run {flow.name};"
                f" name one in {PROJECT}:placement"
            )
            continue
        site_of_flow[flow.name] = chosen
    for i, c in enumerate(model.clusters):
        for key in c.credential_keys():
            if key not in model.credentials.get(c.alias, {}):
                errors.append(
                    f"{_secret_key(c.alias, key)}: missing; set it with"
                    f" `pulumi config set --secret --path '{_secret_key(c.alias, key)}' ...`"
                )
        if c.eventhubs is not None:
            limit = TIER_LIMITS[c.eventhubs.tier].partitions
            hubs = _hubs(mirror, model, c.alias)
            if len(hubs) > c.eventhubs.hub_limit:
                errors.append(
                    f"{PROJECT}:clusters[{i}].eventhubs.tier: namespace '{c.eventhubs.namespace}' needs {len(hubs)}"
                    f" event hubs ({sum(h.own for h in hubs)} of them the mirror's own) but tier"
                    f" {c.eventhubs.tier.value} allows {c.eventhubs.hub_limit}"
                    + (f" at capacity {c.eventhubs.capacity}" if c.eventhubs.tier in HUBS_PER_CAPACITY else "")
                )
            errors += [
                f"{PROJECT}:clusters[{i}].eventhubs.tier: hub '{h.name}' needs {h.partitions} partitions (its source"
                f" topic's) but tier {c.eventhubs.tier.value} allows {limit}"
                for h in hubs
                if h.partitions > limit
            ]
        for j, flow in enumerate(mirror.flows):
            if flow.target == c.alias and c.eventhubs is not None:
                src_i, src = clusters[flow.source]
                errors += [
                    f"{PROJECT}:clusters[{src_i}].topics.{t}: missing; the event hub for it is sized from the source"
                    f" topic's partitions (flows[{j}] mirrors it into Event Hubs cluster '{c.alias}')"
                    for t in flow.topics.literal_names() or []
                    if t not in src.topics and t != HEARTBEATS_TOPIC
                ]
    for site_name, site in sites.items():
        touched = {a for f in mirror.flows if site_of_flow.get(f.name) == site_name for a in (f.source, f.target)}
        msk = [a for a in touched if clusters[a][1].msk is not None]
        i = list(sites).index(site_name)
        if msk and site.aws is None:
            errors.append(f"{PROJECT}:sites[{i}].aws: missing; its mirror reaches MSK cluster(s) {', '.join(msk)}")
        for alias in sorted(msk):
            j, spec = clusters[alias][0], clusters[alias][1].msk
            if (
                spec is not None
                and spec.auth == "iam"
                and site.aws is not None
                and spec.account_id != site.aws.account_id
                and spec.role_arn is None
            ):
                errors.append(
                    f"{PROJECT}:clusters[{j}].msk.role_arn: missing; the mirror's role for site '{site_name}' lives in"
                    f" account {site.aws.account_id} and cluster '{alias}' in {spec.account_id}, so MSK lets it in"
                    f" only through the cluster's resource policy (aws.msk.ClusterPolicy). Give a role the program"
                    f" assumes in {spec.account_id} to set that policy"
                )
        entra = sorted(a for a in touched if clusters[a][1].entra)
        if entra and site.azure is None:
            errors.append(
                f"{PROJECT}:sites[{i}].azure: missing; its mirror reaches Event Hubs cluster(s) {', '.join(entra)}"
                " with local auth disabled, so it signs in with Entra ID workload identity: give"
                " azure.oidc_issuer_url, the issuer of the site's service-account tokens"
            )
        checkpoint = model.mirror.checkpoint
        if touched and checkpoint.scheme == "s3a" and site.aws is None:
            errors.append(
                f"{PROJECT}:sites[{i}].aws: missing; its mirror keeps checkpoints in s3a:// and signs in with the"
                " pod's AWS identity (EKS Pod Identity or IRSA), which the site's aws settings give"
            )
        if touched and checkpoint.scheme == "abfss" and site.azure is None:
            errors.append(
                f"{PROJECT}:sites[{i}].azure: missing; its mirror keeps checkpoints in abfss:// and signs in with"
                " Entra ID workload identity: give azure.oidc_issuer_url"
            )
        errors += _cores(site_name, model.mirror.executor, mirror, site_of_flow)
        if site.context is None and site_name not in model.kubeconfigs:
            errors.append(
                f"{PROJECT}:sites[{i}].context: missing; give a kubeconfig context, or set"
                f" `pulumi config set --secret --path '{PROJECT}:kubeconfigs.{site_name}' \"$(cat kubeconfig)\"`"
            )
    if errors:
        raise ConfigError("\n".join(errors))
    return site_of_flow


def _cores(site: str, executor: ExecutorResources, mirror: MirrorConfig, site_of_flow: dict[str, str]) -> list[str]:
    """A real-time task holds an executor core for as long as the mirror runs, and a task with no core never starts,
    so a site's executors must seat every real-time task, plus one core for its throughput flows' batches. The stack
    sets no Spark conf, so spark.task.cpus is Spark's 1 and a core is a task slot."""
    flows = [(i, f) for i, f in enumerate(mirror.flows) if site_of_flow.get(f.name) == site]
    realtime = [(i, f) for i, f in flows if f.mode is FlowMode.REALTIME]
    throughput = [f.name for _, f in flows if f.mode is FlowMode.THROUGHPUT]
    needed = cores_needed([f for _, f in flows])
    cores = executor.instances * executor.cores
    if cores >= needed:
        return []
    tasks = ", ".join(f"{f.name} ({PROJECT}:flows[{i}].realtime_tasks: {f.realtime_tasks})" for i, f in realtime)
    batches = f" and 1 for the batches of throughput flow(s) {', '.join(throughput)}" if throughput else ""
    return [
        f"{PROJECT}:mirror.executor: site '{site}' gets {cores} executor cores (instances {executor.instances} x cores"
        f" {executor.cores}) but needs {needed}: one per real-time task of {tasks}{batches}. Each real-time task"
        f" holds its core for as long as the mirror runs, so the tasks left without one would never copy their"
        f" partitions; raise {PROJECT}:mirror.executor.instances or {PROJECT}:mirror.executor.cores, or lower the"
        " flows' realtime_tasks"
    ]


_FIELD_IN_MESSAGE = re.compile(rf"^({PROJECT}:[^:\s]+): ([a-z_]+): ")
STRUCTURED_KEYS = ("sites", "clusters", "flows", "mirror", "placement", "credentials", "kubeconfigs")


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    """Read and check the whole stack; raise ConfigError naming the first bad keys."""
    config = config or pulumi.Config(PROJECT)
    raw = {k: v for k in STRUCTURED_KEYS if (v := config.get_object(k)) is not None}
    for key in ("sites", "clusters", "flows"):
        if key not in raw:
            raise ConfigError(f"{PROJECT}:{key}: missing; the stack file must give it")
    image = config.get("image")
    if not image:
        raise ConfigError(f"{PROJECT}:image: missing; give the mirror image with its tag")
    try:
        model = StackModel.model_validate(raw)
    except ValidationError as err:
        # Whole-object checks here say `field: problem`; fold the field into the key path.
        lines = str(ConfigError.from_validation(PROJECT, err)).splitlines()
        raise ConfigError("\n".join(_FIELD_IN_MESSAGE.sub(r"\1.\2: ", line) for line in lines)) from None
    stack = pulumi.get_stack()
    namespace = config.get("namespace") or f"{PROJECT}-{stack}"
    errors = _names(stack, namespace, model)
    if errors:
        raise ConfigError("\n".join(errors))
    mirror = _render(model, stack)
    protect = config.get_bool("protectData")
    return StackSettings(
        stack=stack,
        namespace=namespace,
        image=image,
        spark_operator=config.get_bool("sparkOperator") or False,
        monitoring=config.get_bool("monitoring") or False,
        protect_data=True if protect is None else protect,
        model=model,
        mirror_config=mirror,
        site_of_flow=_check(model, mirror),
    )
