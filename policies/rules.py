"""Policy rules as plain functions over (resource type, wire-name properties, URN), returning violations.

The pack in __main__.py wraps them for `pulumi preview --policy-pack policies`; the tests run them over what the
program registers under mocks.

A value not known yet (at preview, an output of a resource still to be made; None here, as `plain` turns
CrossGuard's unknowns into) never passes a rule silently: the rule reports it as `<path> is not known ...`
(`is_unknown`). The pack files those under an advisory policy of their own, since at `pulumi up` the value is known
and the rule's own check runs on it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from pulumi_policy import proxy

KAFKA_AUTH_PORTS = {9094, 9096, 9098}  # MSK in-VPC: TLS, SASL/SCRAM, IAM
OPEN_CIDRS = {"0.0.0.0/0", "::/0"}
VPC_WIDEST = {4: 16, 6: 56}  # the widest CIDR block a VPC takes, by IP version
CREDENTIAL_MARKERS = ("SharedAccessKey=", "-----BEGIN", "sasl.jaas.config")
SECRET_KEYS = {"password", "client_key", "connection_string"}
OPERATOR_CHART = "kubernetes:helm.sh/v4:Chart"
OPERATOR_COMPONENT = "mirrorkit:k8s:SparkOperator"  # infra/k8s/operator.py: the chart's parent

DRIVER_RESOURCES = {"pods", "services", "configmaps", "persistentvolumeclaims"}
ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCED_LEVELS = ("restricted", "baseline")
IAM_POLICIES = ("aws:iam/rolePolicy:RolePolicy", "aws:iam/policy:Policy", "aws:msk/clusterPolicy:ClusterPolicy")
ROLE = "aws:iam/role:Role"  # its trust policy, `assumeRolePolicy`
ROLE_POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
AWS_MANAGED = "arn:aws:iam::aws:policy/"
PUBLIC_ACCESS_BLOCKS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2", "aws:s3/bucketAclV2:BucketAclV2")
PUBLIC_ACLS = {"public-read", "public-read-write", "authenticated-read"}
DATA_HOLDERS = (
    r"azure-native:eventhub(/v\w+)?:Namespace",
    "azure-native:resources:ResourceGroup",
    "kubernetes:core/v1:PersistentVolumeClaim",
    r"aws:s3/bucket(V2)?:Bucket(V2)?",
    r"azure-native:storage(/v\w+)?:BlobContainer",
)

Rule = Callable[[str, dict[str, Any], str], list[str]]
OptionsRule = Callable[[str, dict[str, Any], bool], list[str]]  # sees the resource's `protect` option too

_UNKNOWN = " is not known yet (an output still to be resolved): checked when it is, at `pulumi up`"
_ABSENT = object()
# How CrossGuard's SDK spells a value not known yet, by type.
UNKNOWN_SENTINELS = frozenset(
    getattr(proxy, name) for name in dir(proxy) if name.startswith("UNKNOWN_") and name.endswith("_VALUE")
)


def unknown(path: str) -> str:
    return f"{path}{_UNKNOWN}"


def is_unknown(message: str) -> bool:
    """A finding about a value not known yet, rather than a violation."""
    return message.endswith(_UNKNOWN)


def plain(value: Any) -> Any:
    """CrossGuard's props (mappings and sequences that raise on an unknown value) as plain dicts and lists, each
    unknown (the SDK's UNKNOWN_* sentinels) as None."""
    if type(value).__module__ == "pulumi_policy.proxy":  # a proxy hands back its raw target, unknowns not raised
        value = value["__target"]
    if isinstance(value, str):
        return None if value in UNKNOWN_SENTINELS else value
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [plain(v) for v in value]
    return value


def _at(props: Any, path: str) -> Any:
    """The value at a dotted path: None where it or a parent is not known yet, _ABSENT where it is not given."""
    node = props
    for part in path.split("."):
        if node is None:
            return None
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _unknowns(props: dict[str, Any], *paths: str) -> list[str]:
    return [unknown(p) for p in paths if _at(props, p) is None]


def _unknown_items(props: dict[str, Any], path: str) -> list[str]:
    """The list at `path` unknown, or any element of it."""
    found = _at(props, path)
    if found is None:
        return [unknown(path)]
    if not isinstance(found, list):
        return []
    return [unknown(f"{path}[{i}]") for i, v in enumerate(found) if v is None]


def _in_operator_chart(typ: str, urn: str) -> bool:
    """Whether the URN is the Spark Operator chart's own object: a direct child of the chart, which is a direct child
    of the program's SparkOperator component, the type chain matched exactly, never by substring."""
    parts = urn.split("::")
    if len(parts) < 4 or not parts[0].startswith("urn:pulumi:"):
        return False
    chain = parts[2].split("$")
    return chain[-3:] == [OPERATOR_COMPONENT, OPERATOR_CHART, typ]


def _eventhub(typ: str, kind: str) -> bool:
    """An azure-native eventhub resource of this kind, at the default or any explicit API version."""
    return re.fullmatch(rf"azure-native:eventhub(/v\w+)?:{kind}", typ) is not None


def eventhubs_namespace_speaks_kafka(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if not _eventhub(typ, "Namespace"):
        return []
    if found := _unknowns(props, "sku", "sku.name", "minimumTlsVersion", "kafkaEnabled"):
        return found
    out = []
    if props.get("sku", {}).get("name") not in ("Standard", "Premium"):
        out.append(f"sku {props.get('sku', {}).get('name')!r} has no Kafka endpoint")
    if props.get("minimumTlsVersion") != "1.2":
        out.append("minimumTlsVersion must be 1.2")
    if props.get("kafkaEnabled") is not True:
        out.append("kafkaEnabled must be true")
    return out


def eventhubs_network_is_not_open(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """An Event Hubs namespace says how the public network reaches it (Azure's default lets everyone in), and its
    network rule set denies by default, letting in listed addresses only, never 0.0.0.0/0."""
    if _eventhub(typ, "Namespace"):
        if found := _unknowns(props, "publicNetworkAccess"):
            return found
        if props.get("publicNetworkAccess") in (None, _ABSENT):
            return ["publicNetworkAccess is unset: Azure's default lets in the whole internet"]
        return []
    if not _eventhub(typ, "NamespaceNetworkRuleSet"):
        return []
    if found := _unknowns(props, "defaultAction") + _unknown_items(props, "ipRules"):
        return found
    out = []
    if props.get("defaultAction") != "Deny":
        out.append(f"defaultAction is {props.get('defaultAction')!r}: every address not listed gets in")
    masks = [str((rule or {}).get("ipMask")) for rule in props.get("ipRules") or []]
    if wide := [m for m in masks if m.endswith("/0")]:
        out.append(f"ipRules let in {wide}")
    return out


def mirror_rule_sends_and_listens_only(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if not _eventhub(typ, "NamespaceAuthorizationRule"):
        return []
    if found := _unknown_items(props, "rights"):
        return found
    extra = set(props.get("rights", [])) - {"Send", "Listen"}
    return [f"rights {sorted(extra)} beyond Send and Listen"] if extra else []


def event_hub_keeps_producer_timestamps(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """A hub that stamps append time loses the source's timestamps: the DR copy must keep them (Create)."""
    if not _eventhub(typ, "EventHub"):
        return []
    if found := _unknowns(props, "messageTimestampDescription", "messageTimestampDescription.timestampType"):
        return found
    stamped = (props.get("messageTimestampDescription") or {}).get("timestampType")
    return [] if stamped == "Create" else [f"messageTimestampDescription.timestampType is {stamped!r}, not 'Create'"]


def security_group_opens_only_kafka_auth_port(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if typ == "aws:ec2/securityGroupRule:SecurityGroupRule" and (found := _unknowns(props, "type")):
        return found
    if typ == "aws:ec2/securityGroupRule:SecurityGroupRule" and props.get("type") != "ingress":
        return []
    if typ not in (
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        "aws:ec2/securityGroupRule:SecurityGroupRule",
    ):
        return []
    found = _unknowns(props, "fromPort", "toPort", "ipProtocol", "protocol", "cidrIpv4", "cidrIpv6")
    if found := found + _unknown_items(props, "cidrBlocks"):
        return found
    out = []
    ports = (props.get("fromPort"), props.get("toPort"))
    if ports[0] != ports[1] or ports[0] not in KAFKA_AUTH_PORTS:
        out.append(f"ingress on ports {ports}; only one of {sorted(KAFKA_AUTH_PORTS)} is allowed")
    if props.get("ipProtocol", props.get("protocol")) != "tcp":
        out.append("ingress must be tcp")
    cidrs = [props.get("cidrIpv4"), props.get("cidrIpv6"), *props.get("cidrBlocks", [])]
    cidrs = [c for c in cidrs if c]
    if not cidrs or set(cidrs) & OPEN_CIDRS:
        out.append(f"ingress must come from the peer CIDR only, not {cidrs or 'anywhere'}")
        return out
    if wide := [c for c in cidrs if _wider_than_a_vpc(str(c))]:
        out.append(f"ingress from {wide}, wider than any peer VPC (IPv4 /{VPC_WIDEST[4]}, IPv6 /{VPC_WIDEST[6]})")
    return out


def _wider_than_a_vpc(cidr: str) -> bool:
    """A CIDR no VPC can have: a peer's is at most /16 (IPv4) or /56 (IPv6), so a wider one lets in more than it."""
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return True
    return network.prefixlen < VPC_WIDEST[network.version]


def msk_scram_secret_uses_customer_key(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if typ != "aws:secretsmanager/secret:Secret":
        return []
    if found := _unknowns(props, "name"):  # it may yet be an AmazonMSK_ secret
        return found
    if not str(props.get("name", "")).startswith("AmazonMSK_"):
        return []
    if found := _unknowns(props, "kmsKeyId"):
        return found
    return [] if props.get("kmsKeyId") else ["an AmazonMSK_ secret needs a customer KMS key; MSK rejects the default"]


def nothing_cluster_wide(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """The mirror's RBAC is namespaced; only the Spark Operator's own chart may hold cluster roles."""
    if typ not in (
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
    ):
        return []
    return [] if _in_operator_chart(typ, urn) else [f"{typ.rsplit(':', 1)[1]} grants cluster-wide rights"]


def roles_grant_only_what_the_driver_needs(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """The driver's Role: core pods, services, configmaps and PVCs; a RoleBinding binds a Role, never a ClusterRole."""
    if typ == "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding":
        if _in_operator_chart(typ, urn):
            return []
        if found := _unknowns(props, "roleRef", "roleRef.kind"):
            return found
        kind = (props.get("roleRef") or {}).get("kind")
        return [] if kind == "Role" else [f"roleRef binds a {kind}, not a namespaced Role"]
    if typ != "kubernetes:rbac.authorization.k8s.io/v1:Role" or _in_operator_chart(typ, urn):
        return []
    found = _unknown_items(props, "rules")
    for i, rule in enumerate(props.get("rules") or []):
        if rule is not None:
            found += [unknown(f"rules[{i}].{key}") for key in ("apiGroups", "resources") if rule.get(key, ()) is None]
    if found:
        return found
    out = []
    for i, rule in enumerate(props.get("rules") or []):
        if set(rule.get("apiGroups") or []) != {""}:
            out.append(f"rules[{i}].apiGroups {rule.get('apiGroups')} beyond the core group")
        extra = set(rule.get("resources") or []) - DRIVER_RESOURCES
        if extra:
            out.append(f"rules[{i}].resources {sorted(extra)} beyond {sorted(DRIVER_RESOURCES)}")
    return out


def _inline_secrets(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict):
        found = []
        for key, value in node.items():
            if key in SECRET_KEYS and isinstance(value, str):
                found.append(f"{path}{key}")
            found += _inline_secrets(value, f"{path}{key}.")
        return found
    if isinstance(node, list):
        return [f for i, v in enumerate(node) for f in _inline_secrets(v, f"{path}{i}.")]
    return []


def config_map_holds_no_credentials(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if typ != "kubernetes:core/v1:ConfigMap":
        return []
    if found := _unknowns(props, "data"):
        return found
    out = []
    for name, text in (props.get("data") or {}).items():
        if text is None:
            out.append(unknown(f"data.{name}"))
            continue
        if any(marker in str(text) for marker in CREDENTIAL_MARKERS):
            out.append(f"data.{name} holds a credential")
            continue
        try:
            parsed = yaml.safe_load(str(text))
        except yaml.YAMLError:
            continue
        out += [
            f"data.{name}: {key} is inline; reference an env var or a mounted file" for key in _inline_secrets(parsed)
        ]
    return out


SPARK_APP_REQUIRED = ("type", "mode", "image", "mainApplicationFile", "sparkVersion", "driver", "executor")


def spark_application_is_complete(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    if typ != "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication":
        return []
    required = [f"spec.{k}" for k in SPARK_APP_REQUIRED]
    known = ["spec", *required, "spec.restartPolicy", "spec.restartPolicy.type", "spec.driver.serviceAccount"]
    if found := _unknowns(props, *known, "spec.executor.instances"):
        return found
    spec = props.get("spec") or {}
    out = [f"spec.{k} is missing" for k in SPARK_APP_REQUIRED if not spec.get(k)]
    if (spec.get("restartPolicy") or {}).get("type") != "Always":
        out.append("spec.restartPolicy.type must be Always: a mirror never finishes")
    if not (spec.get("driver") or {}).get("serviceAccount"):
        out.append("spec.driver.serviceAccount is missing: the driver needs its namespaced Role")
    if not (spec.get("executor") or {}).get("instances"):
        out.append("spec.executor.instances is missing")
    return out


DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def image_is_pinned_by_digest(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """The mirror's image, by its digest: a tag can move to another build under a running mirror, and each node
    keeps what it pulled first, so driver and executors could run different code."""
    if typ != "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication":
        return []
    paths = ["spec", "spec.image", "spec.driver", "spec.executor", "spec.driver.image", "spec.executor.image"]
    if found := _unknowns(props, *paths):
        return found
    spec = props.get("spec") or {}
    images = {"spec.image": spec.get("image")}
    images |= {f"spec.{part}.image": (spec.get(part) or {}).get("image") for part in ("driver", "executor")}
    return [
        f"{path} {image!r} is not pinned by a sha256 digest"
        for path, image in images.items()
        if image and not DIGEST.search(str(image))
    ]


ROLE_ASSIGNMENT = re.compile(r"azure-native:authorization(/v\w+)?:RoleAssignment")
# An ARM scope that names no resource: a management group, a subscription, or a whole resource group.
BROAD_SCOPE = re.compile(
    r"^(/providers/Microsoft\.Management/managementGroups/[^/]+|/subscriptions/[^/]+(/resourceGroups/[^/]+)?)?/?$",
    re.IGNORECASE,
)


def role_assignment_names_a_resource(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """The mirror's Azure role assignments are scoped to the resource they are for (an event hub or its namespace,
    a checkpoint container): never a resource group, subscription or management group, where the data role would
    reach every namespace or storage account in it."""
    if not ROLE_ASSIGNMENT.fullmatch(typ):
        return []
    if found := _unknowns(props, "scope"):
        return found
    scope = str(props.get("scope") or "")
    return [f"scope {scope!r} names no resource: the role would reach all in it"] if BROAD_SCOPE.match(scope) else []


def namespace_enforces_pod_security(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """A namespace enforces Pod Security Admission at level restricted or baseline (the operator's), never
    privileged; a misspelt level is refused too, as the API server would reject it."""
    if typ != "kubernetes:core/v1:Namespace":
        return []
    if found := _unknowns(props, "metadata", "metadata.labels"):
        return found
    labels = (props.get("metadata") or {}).get("labels") or {}
    if ENFORCE not in labels:
        return ["no Pod Security Admission enforce label"]
    level = labels[ENFORCE]
    if level is None:
        return [unknown(f"metadata.labels.{ENFORCE}")]
    return [] if level in ENFORCED_LEVELS else [f"{ENFORCE} is {level!r}, not one of {', '.join(ENFORCED_LEVELS)}"]


def _statements(props: dict[str, Any], key: str = "policy") -> list[dict[str, Any]] | str:
    """The statements of an IAM policy document (`policy`, JSON text), or why they cannot be read."""
    text = props.get(key)
    try:
        document = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return "policy is not JSON"
    if not isinstance(document, dict):
        return "policy is not a policy document"
    statements = document.get("Statement", [])
    return [statements] if isinstance(statements, dict) else list(statements)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


NEGATED = ("NotAction", "NotResource", "NotPrincipal")


def _every_resource(arn: Any) -> bool:
    """An ARN whose resource part is a bare wildcard (`arn:aws:s3:::*`, `arn:aws:kafka:*:*:*`): every resource of the
    service, in effect `*`. A wildcard after a named resource (`arn:aws:s3:::bucket/*`) is scoped to it."""
    parts = str(arn).split(":", 5)
    return len(parts) == 6 and parts[0] == "arn" and parts[5].lstrip("*/") == ""


def iam_grants_no_wildcards(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """The mirror's IAM and MSK cluster policies allow named actions on named resources, to named principals: no
    `*` or `service:*` action, no `*` resource (nor an ARN whose resource part is `*`), no `*` principal, and no
    NotAction, NotResource or NotPrincipal in an Allow; in its roles' trust policies too, and no AWS-managed policy
    attached. A wildcard inside a topic or group name, as the
    flows' patterns give, is scoped to its cluster and allowed."""
    if typ == ROLE_POLICY_ATTACHMENT:
        if found := _unknowns(props, "policyArn"):
            return found
        arn = str(props.get("policyArn"))
        return (
            [f"policyArn {arn} is AWS-managed: its grants are not the mirror's"] if arn.startswith(AWS_MANAGED) else []
        )
    key = "assumeRolePolicy" if typ == ROLE else "policy"
    if typ not in IAM_POLICIES and typ != ROLE:
        return []
    if found := _unknowns(props, key):
        return found
    statements = _statements(props, key)
    if isinstance(statements, str):
        return [statements]
    out = []
    for i, statement in enumerate(statements):
        if statement.get("Effect") != "Allow":
            continue
        # An Allow with NotAction, NotResource or NotPrincipal grants everything but what it names.
        out += [f"Statement[{i}].{key} allows everything it does not name" for key in NEGATED if key in statement]
        actions = [a for a in _listed(statement.get("Action", [])) if a == "*" or str(a).endswith(":*")]
        if actions:
            out.append(f"Statement[{i}].Action allows {actions}")
        if "*" in _listed(statement.get("Resource", [])):
            out.append(f"Statement[{i}].Resource is '*'")
        if wide := [r for r in _listed(statement.get("Resource", [])) if r != "*" and _every_resource(r)]:
            out.append(f"Statement[{i}].Resource names every resource of its service: {wide}")
        principal = statement.get("Principal")
        if principal is not None and "*" in _principals(principal):
            out.append(f"Statement[{i}].Principal is '*'")
    return out


def _principals(principal: Any) -> list[Any]:
    """Every principal a statement names, of any kind (`AWS`, `Federated`, `Service`), or `*` itself."""
    if isinstance(principal, dict):
        return [p for value in principal.values() for p in _listed(value)]
    return _listed(principal)


def bucket_is_not_public(typ: str, props: dict[str, Any], urn: str = "") -> list[str]:
    """A checkpoint bucket's public access block blocks all four ways in, and no bucket or ACL is public."""
    if typ == "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
        if found := _unknowns(props, *PUBLIC_ACCESS_BLOCKS):
            return found
        return [f"{k} is not true" for k in PUBLIC_ACCESS_BLOCKS if props.get(k) is not True]
    if typ not in BUCKETS:
        return []
    if "acl" in props and props["acl"] is None:
        return [unknown("acl")]
    acl = props.get("acl")
    return [f"acl {acl!r} makes the bucket public"] if acl in PUBLIC_ACLS else []


def data_is_protected(typ: str, props: dict[str, Any], protect: bool) -> list[str]:
    """What holds DR data (an Event Hubs namespace and its resource group, a checkpoint PVC, bucket or container) is
    protected, so no update or destroy deletes it. Reads the resource's options, not its properties."""
    held = any(re.fullmatch(pattern, typ) for pattern in DATA_HOLDERS)
    return ["holds DR data but is not protected: Pulumi may delete it"] if held and not protect else []


RULES: dict[str, tuple[Rule, str]] = {
    "eventhubs-namespace-speaks-kafka": (eventhubs_namespace_speaks_kafka, "mandatory"),
    "mirror-rule-sends-and-listens-only": (mirror_rule_sends_and_listens_only, "advisory"),
    "eventhubs-network-is-not-open": (eventhubs_network_is_not_open, "mandatory"),
    "event-hub-keeps-producer-timestamps": (event_hub_keeps_producer_timestamps, "mandatory"),
    "security-group-opens-only-kafka-auth-port": (security_group_opens_only_kafka_auth_port, "mandatory"),
    "msk-scram-secret-uses-customer-key": (msk_scram_secret_uses_customer_key, "mandatory"),
    "nothing-cluster-wide": (nothing_cluster_wide, "mandatory"),
    "roles-grant-only-what-the-driver-needs": (roles_grant_only_what_the_driver_needs, "mandatory"),
    "config-map-holds-no-credentials": (config_map_holds_no_credentials, "mandatory"),
    "spark-application-is-complete": (spark_application_is_complete, "mandatory"),
    "namespace-enforces-pod-security": (namespace_enforces_pod_security, "mandatory"),
    "iam-grants-no-wildcards": (iam_grants_no_wildcards, "mandatory"),
    "bucket-is-not-public": (bucket_is_not_public, "mandatory"),
    "image-is-pinned-by-digest": (image_is_pinned_by_digest, "mandatory"),
    "role-assignment-names-a-resource": (role_assignment_names_a_resource, "mandatory"),
}
# Advisory: a stack may turn protection off (mirrorkit:protectData false), and preview then says what it risks.
OPTIONS_RULES: dict[str, tuple[OptionsRule, str]] = {
    "data-is-protected": (data_is_protected, "advisory"),
}
