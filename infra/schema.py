"""The stack file's schema: pydantic models of each structured key (sites, clusters, flows' surroundings, the
mirror's resources and checkpoint store), each refusing a bad value with the key it sits at.

What one model cannot see alone (a flow naming a cluster, a site reaching MSK) is checked in infra.checks; flows
themselves are spark_app's schema, rendered in infra.render.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator

from infra.naming import CHECKPOINT_DIR, DNS_LABEL, DNS_SUBDOMAIN
from infra.versions import pinned
from spark_app.config import ALIAS_PATTERN, StrictModel

EVENTHUBS_PORT = 9093
MSK_PORTS = {"scram": 9096, "iam": 9098, "tls": 9094}


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


def _public_ip(v: str) -> str:
    """An IPv4 address or CIDR an Event Hubs IP rule takes, never one that lets in everyone."""
    network = ipaddress.ip_network(v, strict=False)  # raises ValueError with a readable message
    if network.version != 4 or network.prefixlen == 0:
        raise ValueError(f"'{v}' is not an IPv4 address or a CIDR narrower than 0.0.0.0/0")
    return v


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
    # With public access: the only addresses let in (the sites' NAT egress, IPv4 address or CIDR); every other is
    # denied by the namespace's network rule set.
    allowed_ips: list[Annotated[str, AfterValidator(_public_ip)]] = Field(default_factory=list)
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


ADMIN_PREFIX = "admin_"  # credentials.<alias>.admin_*: the program's own, to set ACLs; never mounted in a pod


class MskAcls(StrictModel):
    """The mirror's ACLs on a SCRAM-auth MSK cluster, for `User:<username>`, set by the program as a SCRAM user that
    may alter ACLs (its password at `credentials.<alias>.admin_password`).

    Asked for, never automatic: the first ACL on a topic or group ends `allow.everyone.if.no.acl.found` there, which
    would shut out every other client of a cluster that relies on it."""

    admin_username: Annotated[str, Field(min_length=1)]


Names = str | Annotated[list[str], Field(min_length=1)]


def _refuse(wide: list[str], info: ValidationInfo) -> None:
    if wide and info.data.get("Effect") == "Allow":
        raise ValueError(f"{wide}: a wildcard in an Allow, which the policy pack refuses; name each one")


def _listed(value: Names) -> list[str]:
    return value if isinstance(value, list) else [value]


class PolicyStatement(StrictModel):
    """A statement of an MSK cluster policy that the program keeps beside the mirror roles' grants (the platform
    team's own, say), in IAM's keys. An Allow names its principals, actions and resources, as the policy pack
    (policies/rules.py, iam-grants-no-wildcards) requires of the whole policy."""

    Sid: Annotated[str, Field(min_length=1)] | None = None
    Effect: Literal["Allow", "Deny"]
    Principal: dict[str, Names]
    Action: Names
    Resource: Names
    Condition: dict[str, dict[str, Any]] | None = None

    @field_validator("Principal")
    @classmethod
    def _named_principals(cls, v: dict[str, Names], info: ValidationInfo) -> dict[str, Names]:
        _refuse([p for names in v.values() for p in _listed(names) if p == "*"], info)
        return v

    @field_validator("Action")
    @classmethod
    def _named_actions(cls, v: Names, info: ValidationInfo) -> Names:
        _refuse([a for a in _listed(v) if a == "*" or a.endswith(":*")], info)
        return v

    @field_validator("Resource")
    @classmethod
    def _named_resources(cls, v: Names, info: ValidationInfo) -> Names:
        _refuse([r for r in _listed(v) if r == "*"], info)
        return v


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
    acls: MskAcls | None = None
    # Kept in the cluster policy the program writes beside the mirror roles' grants; it owns the whole policy.
    cluster_policy_statements: list[PolicyStatement] = Field(default_factory=list)

    _cidr_ok = field_validator("cidr")(_cidr)

    @model_validator(mode="after")
    def _acls_for_scram(self) -> MskSpec:
        if self.acls is not None and self.auth != "scram":
            raise ValueError(f"acls: the program sets ACLs for the mirror's scram user only, and auth is '{self.auth}'")
        return self

    @property
    def principal(self) -> str:
        """The mirror's principal for its ACLs: its SCRAM user."""
        return f"User:{self.username}"

    @property
    def region(self) -> str:
        return self._arn("region")

    @property
    def account_id(self) -> str:
        return self._arn("account")

    @property
    def cluster_name(self) -> str:
        return self._arn("name")

    def _arn(self, part: str) -> str:
        match = MSK_ARN.match(self.cluster_arn)
        if match is None:  # the field's pattern is MSK_ARN's, so a parsed spec always matches
            raise ValueError(f"cluster_arn: '{self.cluster_arn}' is not an MSK cluster ARN")
        return match[part]

    @property
    def port(self) -> int:
        return MSK_PORTS[self.auth]

    def arn_of(self, kind: Literal["topic", "group", "transactional-id"], name: str) -> str:
        """IAM resource ARN of a topic, group or transactional id on this cluster (`name` may end in `*`)."""
        return self.cluster_arn.replace(":cluster/", f":{kind}/", 1) + f"/{name}"


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
    def _an_identity_for_the_mirror(self) -> KafkaSpec:
        if self.auth == "scram" and self.username is None:
            raise ValueError("username: give the mirror's SCRAM user")
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


# How the mirror signs in to a cluster, whatever its platform calls it, and the stack credentials each way takes.
SignIn = Literal["none", "tls", "sas", "entra", "scram", "iam", "mtls"]
CREDENTIAL_KEYS: dict[SignIn, tuple[str, ...]] = {"scram": ("password",), "mtls": ("client_cert", "client_key")}


class ClusterSpec(StrictModel):
    alias: Annotated[str, Field(pattern=ALIAS_PATTERN)]
    region: Annotated[str, Field(min_length=1)]
    eventhubs: EventHubsSpec | None = None
    msk: MskSpec | None = None
    kafka: KafkaSpec | None = None
    # Stack key `topics`: the sizes of the source topics flows read from this cluster, to size their copies.
    source_topic_sizes: dict[str, SourceTopic] = Field(default_factory=dict, alias="topics")
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
        return self.sign_in == "entra"

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

    @property
    def sign_in(self) -> SignIn:
        """How the mirror signs in. MSK's `tls` is mutual TLS (a client certificate); self-managed `tls` is server
        TLS alone, and `mtls` the mutual one."""
        if self.eventhubs is not None:
            return "entra" if self.eventhubs.disable_local_auth else "sas"
        if self.msk is not None:
            return "mtls" if self.msk.auth == "tls" else self.msk.auth
        return self.self_managed.auth

    def credential_keys(self) -> tuple[str, ...]:
        """Files the mirror reads from this cluster's Kubernetes Secret, set in stack config as secrets (the Event
        Hubs connection string comes from the namespace the program makes, not from stack config), then the admin's
        the program sets ACLs with, which stay out of the cluster."""
        keys = CREDENTIAL_KEYS.get(self.sign_in, ())
        if self.sets_acls:
            keys += tuple(f"{ADMIN_PREFIX}{k}" for k in keys)
        return keys

    @property
    def sets_acls(self) -> bool:
        """Whether the program sets the mirror's ACLs on this cluster, with an admin credential of its own."""
        acls = self.kafka.acls if self.kafka is not None else self.msk.acls if self.msk is not None else None
        return acls is not None


class AwsSite(StrictModel):
    """The site's own VPC, to peer with MSK VPCs, and how its pods get an AWS identity."""

    vpc_id: Annotated[str, Field(pattern=r"^vpc-[0-9a-f]+$")]
    cidr: Cidr
    route_table_ids: Annotated[list[str], Field(min_length=1)]
    account_id: Annotated[str, Field(pattern=r"^\d{12}$")]
    role_arn: str | None = None
    eks_cluster: str | None = None  # EKS Pod Identity
    oidc_provider_arn: str | None = None  # IRSA, when Pod Identity is not used
    # MSK VPC id -> a peering between this VPC and that one which another stack made (a first tenant's, or the
    # platform team's): reused, with its routes and ingress rules, so a second tenant on the same pair of VPCs makes
    # none of its own (AWS allows one peering per pair). Checked at preview to join the two VPCs and be active.
    peerings: dict[
        Annotated[str, Field(pattern=r"^vpc-[0-9a-f]+$")], Annotated[str, Field(pattern=r"^pcx-[0-9a-f]+$")]
    ] = Field(default_factory=dict)

    _cidr_ok = field_validator("cidr")(_cidr)

    @model_validator(mode="after")
    def _one_identity(self) -> AwsSite:
        if (self.eks_cluster is None) == (self.oidc_provider_arn is None):
            raise ValueError("give exactly one of 'eks_cluster' (Pod Identity) or 'oidc_provider_arn' (IRSA)")
        return self


AKS_ISSUER = re.compile(r"^https://[a-z0-9-]+\.oic\.prod-aks\.azure\.com/")


class AzureSite(StrictModel):
    """Azure workload identity for the site's pods: the issuer of its service-account tokens (AKS: the cluster's
    `oidcIssuerProfile.issuerUrl`; EKS: the cluster's OIDC issuer)."""

    oidc_issuer_url: Annotated[str, Field(pattern=r"^https://\S+$")]
    # Azure workload identity's mutating webhook runs on AKS and hands the pods their token and AZURE_* variables;
    # elsewhere the program mounts the token and sets them itself. Default: AKS when the issuer is AKS's.
    aks: bool | None = None

    @property
    def webhook(self) -> bool:
        """Whether the workload identity webhook injects the token and variables into the site's pods."""
        return self.aks if self.aks is not None else AKS_ISSUER.match(self.oidc_issuer_url) is not None


class SiteSpec(StrictModel):
    """A Kubernetes cluster that runs mirrors."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")]
    region: Annotated[str, Field(min_length=1)]
    context: str | None = None  # kubeconfig context; otherwise mirrorkit:kubeconfigs.<name> (secret)
    api_server_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    monitoring_namespace: str = "monitoring"
    aws: AwsSite | None = None
    azure: AzureSite | None = None  # needed when its mirror reaches an Event Hubs namespace with local auth off
    # The stack that installs the Spark Operator on this cluster for every deployment there (`mirrorkit:part:
    # platform:<stack>`); the site's own stack then installs none, whatever `sparkOperator` says.
    platform: Annotated[str, Field(pattern=DNS_LABEL.pattern)] | None = None
    # NAMESPACE/NAME: the ConfigMap the site's toolbox publishes the applications' connection profile to on failover
    # (infra.k8s.toolbox), in the applications' namespace; default `kafka-connection` in the mirror's namespace.
    profile_configmap: (
        Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")]
        | None
    ) = None

    @field_validator("api_server_cidrs")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        return [_cidr(c) for c in v]


class Resources(StrictModel):
    cores: Annotated[int, Field(ge=1)] = 1
    memory: Annotated[str, Field(pattern=r"^\d+[kmgt]$")] = "2g"


class ExecutorResources(Resources):
    instances: Annotated[int, Field(ge=1)] = 1


def _storage_class(v: str) -> str:
    if DNS_SUBDOMAIN.match(v) is None:
        raise ValueError(f"'{v}' is not a Kubernetes StorageClass name (a DNS subdomain: a-z, 0-9, '-' and '.')")
    return v


class Pvc(StrictModel):
    size: Annotated[str, Field(pattern=r"^\d+(Mi|Gi|Ti)$")] = "10Gi"
    # None: the cluster's default class. EKS ships gp2 as its default; gp3 exists only where someone made it.
    storage_class: Annotated[str, AfterValidator(_storage_class)] | None = None


ABFSS_URL = re.compile(
    r"^abfss://(?P<container>[a-z0-9-]{3,63})@(?P<account>[a-z0-9]{3,24})\.dfs\.core\.windows\.net/?"
)
S3A_URL = re.compile(r"^s3a://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/?")


class CheckpointStore(StrictModel):
    """Where Spark keeps its checkpoints: a PVC on the driver, or object storage (s3a://, abfss://, gs://).

    For s3a:// and abfss://, infra makes the bucket or container (or takes an existing one), lets each mirror's
    identity reach its own prefixes only, and renders Spark's settings to sign in with the pod's identity.
    """

    pvc: Pvc | None = None
    url: Annotated[str, Field(pattern=r"^(s3a|abfss|gs)://.+")] | None = None
    existing: bool = False  # the bucket or container exists already: take it, never make or delete it
    region: str | None = (
        None  # s3a: the url's bucket's region (default: the first site's); abfss: the account's location
    )
    resource_group: str | None = None  # abfss: the storage account's resource group (the account must exist)
    # s3a: each region's mirrors keep their checkpoints in a bucket in their own region (`bucket_in`). Off by default:
    # turned on, the checkpoints of mirrors outside the url's region move, which an existing deployment copies first.
    per_region: bool = False

    @model_validator(mode="after")
    def _one(self) -> CheckpointStore:
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

    def bucket_region(self, region: str, home: str) -> str:
        """s3a: the region of the bucket holding the checkpoints of mirrors in `region`: their own with
        `per_region`, else the url's bucket's (`home`)."""
        return region if self.per_region else home

    def bucket_in(self, region: str, home: str) -> str:
        """s3a: the bucket of the checkpoints of mirrors in `region`. With `per_region` each region keeps its
        mirrors' state in its own region, so they run and recover while any other region is down: the url's bucket
        is in its home region, and any other region's is `<bucket>-<region>`."""
        bucket, where = self.store()[0], self.bucket_region(region, home)
        return bucket if where == home else f"{bucket}-{where}"

    def key(self, location: str) -> str:
        """A checkpoint location's key prefix in its bucket or container."""
        return location[self._match(location).end() :].strip("/")

    @staticmethod
    def _match(url: str) -> re.Match[str]:
        match = ABFSS_URL.match(url) or S3A_URL.match(url)
        if match is None:
            raise ValueError(f"checkpoint url '{url}' is neither s3a:// nor abfss://")
        return match

    def location(self, stack: str, source: str, target: str, bucket: str | None = None) -> str:
        """A PVC lives in the stack's own namespace; in a shared bucket, each stack keeps to its own prefix. `bucket`
        puts an s3a:// location in another bucket than the url's (`bucket_in`)."""
        if self.url is None:  # `_one`: url, or else a pvc
            return f"{CHECKPOINT_DIR}/{source}-{target}"
        url = self.url if bucket is None else f"s3a://{bucket}/{self.key(self.url)}"
        return f"{url.rstrip('/')}/{stack}/{source}-{target}"


class Alerts(StrictModel):
    lag_records: Annotated[int, Field(ge=1)] = 100_000
    stalled_minutes: Annotated[int, Field(ge=1)] = 10
    checkpoint_age_s: Annotated[int, Field(ge=1)] = 300
    heartbeat_age_s: Annotated[int, Field(ge=1)] = 300
    # Where the team publishes docs/operations/alerts.md: each alert's `runbook_url` is this plus the alert's anchor.
    runbook_url: Annotated[str, Field(pattern=r"^https://[^#\s]+$")] = (
        "https://github.com/example/mirrorkit/blob/main/docs/operations/alerts.md"
    )


def _secret_name(v: str) -> str:
    if DNS_LABEL.match(v) is None:
        raise ValueError(f"'{v}' is not a Kubernetes Secret name (a DNS label: a-z, 0-9 and '-', at most 63)")
    return v


SecretName = Annotated[str, AfterValidator(_secret_name)]


class MirrorSpec(StrictModel):
    # The SparkApplication's sparkVersion: the pyspark pin, which the image's Spark is built from too
    # (images/mirror/Dockerfile). Set it only for an image built some other way.
    spark_version: str = pinned("pyspark")
    driver: Resources = Field(default_factory=Resources)
    executor: ExecutorResources = Field(default_factory=ExecutorResources)
    checkpoint: CheckpointStore = Field(default_factory=lambda: CheckpointStore(pvc=Pvc()))
    alerts: Alerts = Field(default_factory=Alerts)
    # On the PodMonitor and PrometheusRule: kube-prometheus-stack selects them by `release: <its Helm release>`.
    monitoring_labels: dict[str, str] = Field(default_factory=lambda: {"release": "kube-prometheus-stack"})
    # On the dashboard's ConfigMap, in the site's monitoring namespace: Grafana's sidecar loads what carries these.
    dashboard_labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    # Secrets (kubernetes.io/dockerconfigjson, in the mirror's namespace) the kubelet pulls the image with, on the
    # driver's and the executors' pods; none by default.
    image_pull_secrets: list[SecretName] = Field(default_factory=list)
    # Top-level MirrorConfig settings (intervals, metrics_port), passed through and checked by spark_app.
    runtime: dict[str, Any] = Field(default_factory=dict)


class PlatformSpec(StrictModel):
    """A platform stack's one key, `mirrorkit:platform`: the cluster, and the namespaces its operator acts in."""

    context: Annotated[str, Field(min_length=1)]  # kubeconfig context
    job_namespaces: Annotated[list[Annotated[str, Field(pattern=DNS_LABEL.pattern)]], Field(min_length=1)]
    # The Helm release and its namespace, not derived from the stack's name, so renaming the stack keeps the release
    # (and the CRDs, webhooks and cluster roles named after it). A platform stack first deployed before this key
    # existed sets its old name, `spark-operator-<stack>`.
    release: Annotated[str, Field(pattern=DNS_LABEL.pattern)] = "spark-operator"


class StackModel(StrictModel):
    """The stack file's structured keys, as one model so errors carry their paths."""

    sites: Annotated[list[SiteSpec], Field(min_length=1)]
    clusters: Annotated[list[ClusterSpec], Field(min_length=2)]
    flows: Annotated[list[dict[str, Any]], Field(min_length=1)]
    mirror: MirrorSpec = Field(default_factory=MirrorSpec)
    placement: dict[str, str] = Field(default_factory=dict)  # flow name `SRC->DST` -> site; default: target's region
    # Flows (`SRC->DST`) whose mirror stops: its site keeps every resource and the flow's state, to resume from.
    stopped: list[str] = Field(default_factory=list)
    credentials: dict[str, dict[str, SecretStr]] = Field(default_factory=dict)
    kubeconfigs: dict[str, SecretStr] = Field(default_factory=dict)

    @property
    def checkpoint_home(self) -> str:
        """The region of the checkpoint url's own bucket: as `mirror.checkpoint.region` says, or the first site's."""
        return self.mirror.checkpoint.region or self.sites[0].region
