"""The policy rules catch what they are for (the stacks pass them all in test_invariants)."""

from __future__ import annotations

import json

from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from policies.rules import (
    RULES,
    bucket_is_not_public,
    config_map_holds_no_credentials,
    data_is_protected,
    event_hub_keeps_producer_timestamps,
    eventhubs_namespace_speaks_kafka,
    eventhubs_network_is_not_open,
    iam_grants_no_wildcards,
    image_is_pinned_by_digest,
    is_unknown,
    msk_scram_secret_uses_customer_key,
    namespace_enforces_pod_security,
    nothing_cluster_wide,
    plain,
    role_assignment_names_a_resource,
    roles_grant_only_what_the_driver_needs,
    security_group_opens_only_kafka_auth_port,
    spark_application_is_complete,
)

SG_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"


def test_an_open_or_wide_security_group_rule_is_refused():
    ok = {"fromPort": 9096, "toPort": 9096, "ipProtocol": "tcp", "cidrIpv4": "10.10.0.0/16"}
    assert security_group_opens_only_kafka_auth_port(SG_RULE, ok) == []
    assert security_group_opens_only_kafka_auth_port(SG_RULE, ok | {"cidrIpv4": "0.0.0.0/0"})
    assert security_group_opens_only_kafka_auth_port(SG_RULE, ok | {"fromPort": 9092, "toPort": 9098})
    # A private CIDR wider than any VPC can be lets in more than the peer: 10.0.0.0/8, 172.16.0.0/12.
    assert security_group_opens_only_kafka_auth_port(SG_RULE, ok | {"cidrIpv4": "10.0.0.0/8"}) == [
        "ingress from ['10.0.0.0/8'], wider than any peer VPC (IPv4 /16, IPv6 /56)"
    ]
    assert security_group_opens_only_kafka_auth_port(SG_RULE, ok | {"cidrIpv4": "10.20.30.0/24"}) == []
    six = {k: v for k, v in ok.items() if k != "cidrIpv4"} | {"cidrIpv6": "2600:1f18::/32"}
    assert security_group_opens_only_kafka_auth_port(SG_RULE, six)
    assert security_group_opens_only_kafka_auth_port(SG_RULE, six | {"cidrIpv6": "2600:1f18:1:100::/56"}) == []


def test_a_cluster_role_outside_the_operator_chart_is_refused():
    typ = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
    assert nothing_cluster_wide(
        typ, {}, "urn:pulumi:s::mirrorkit::kubernetes:rbac.authorization.k8s.io/v1:ClusterRole::x"
    )
    chart_child = "urn:pulumi:s::mirrorkit::mirrorkit:k8s:SparkOperator$kubernetes:helm.sh/v4:Chart$" + typ + "::op"
    assert nothing_cluster_wide(typ, {}, chart_child) == []


def test_a_config_map_with_an_inline_secret_is_refused():
    typ = "kubernetes:core/v1:ConfigMap"
    assert config_map_holds_no_credentials(typ, {"data": {"m.yaml": "clusters:\n- password: {file: /x}\n"}}) == []
    assert config_map_holds_no_credentials(typ, {"data": {"m.yaml": "clusters:\n- password: hunter2\n"}})
    assert config_map_holds_no_credentials(typ, {"data": {"c": "Endpoint=sb://x/;SharedAccessKey=k"}})


def test_basic_tier_scram_secret_without_kms_and_incomplete_spark_app_are_refused():
    ns = {"sku": {"name": "Basic"}, "minimumTlsVersion": "1.2", "kafkaEnabled": True}
    assert eventhubs_namespace_speaks_kafka("azure-native:eventhub:Namespace", ns)
    secret = {"name": "AmazonMSK_mirrorkit_dr"}
    assert msk_scram_secret_uses_customer_key("aws:secretsmanager/secret:Secret", secret)
    app = {"spec": {"type": "Python", "restartPolicy": {"type": "OnFailure"}}}
    problems = spark_application_is_complete("kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication", app)
    assert "spec.image is missing" in problems and any("Always" in p for p in problems)


def test_an_event_hub_stamping_append_time_is_refused_at_any_api_version():
    create = {"messageTimestampDescription": {"timestampType": "Create"}}
    for typ in ("azure-native:eventhub:EventHub", "azure-native:eventhub/v20240501preview:EventHub"):
        assert event_hub_keeps_producer_timestamps(typ, create) == []
        assert event_hub_keeps_producer_timestamps(typ, {})
        assert event_hub_keeps_producer_timestamps(typ, {"messageTimestampDescription": {"timestampType": "LogAppend"}})


def test_a_role_beyond_the_drivers_needs_or_a_binding_to_a_cluster_role_is_refused():
    role = "kubernetes:rbac.authorization.k8s.io/v1:Role"
    ok = {"rules": [{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["create"]}]}
    assert roles_grant_only_what_the_driver_needs(role, ok) == []
    assert roles_grant_only_what_the_driver_needs(role, {"rules": [ok["rules"][0] | {"resources": ["secrets"]}]})
    assert roles_grant_only_what_the_driver_needs(role, {"rules": [ok["rules"][0] | {"apiGroups": ["*"]}]})
    binding = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
    assert roles_grant_only_what_the_driver_needs(binding, {"roleRef": {"kind": "ClusterRole", "name": "admin"}})


def test_only_the_spark_operator_charts_own_objects_may_be_cluster_wide():
    typ = "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"
    chart = "kubernetes:helm.sh/v4:Chart"
    own = f"urn:pulumi:s::mirrorkit::mirrorkit:k8s:SparkOperator${chart}${typ}::op:spark-operator/op-controller"
    assert nothing_cluster_wide(typ, {}, own) == []
    for urn in (
        f"urn:pulumi:s::mirrorkit::{chart}${typ}::other-chart:ns/admin",  # some other chart
        f"urn:pulumi:s::mirrorkit::mirrorkit:k8s:Other${chart}${typ}::x",  # a chart under another component
        f"urn:pulumi:s::mirrorkit::mirrorkit:k8s:SparkOperator${chart}$mirrorkit:x:Wrapper${typ}::x",  # deeper
        f"urn:pulumi:s::mirrorkit::{typ}::{chart}",  # the chart's token in the name
        f"urn:pulumi:s::mirrorkit::mirrorkit:k8s:Mirror${typ}::mirrorkit:k8s:SparkOperator${chart}",
    ):
        assert nothing_cluster_wide(typ, {}, urn), urn
    binding = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
    to_cluster_role = {"roleRef": {"kind": "ClusterRole", "name": "admin"}}
    assert roles_grant_only_what_the_driver_needs(binding, to_cluster_role, own.replace(typ, binding)) == []
    assert roles_grant_only_what_the_driver_needs(binding, to_cluster_role, f"urn:pulumi:s::m::{chart}${binding}::x")


def test_a_value_not_known_at_preview_is_reported_never_passed():
    cases = [
        ("kubernetes:core/v1:ConfigMap", {"data": {"mirror.yaml": None}}, "data.mirror.yaml"),
        ("aws:secretsmanager/secret:Secret", {"name": None}, "name"),
        ("aws:secretsmanager/secret:Secret", {"name": "AmazonMSK_mirrorkit_dr", "kmsKeyId": None}, "kmsKeyId"),
        ("aws:ec2/securityGroupRule:SecurityGroupRule", {"type": None}, "type"),
        (SG_RULE, {"fromPort": 9096, "toPort": 9096, "ipProtocol": "tcp", "cidrIpv4": None}, "cidrIpv4"),
        ("azure-native:eventhub:NamespaceAuthorizationRule", {"rights": None}, "rights"),
        ("azure-native:eventhub:EventHub", {"messageTimestampDescription": None}, "messageTimestampDescription"),
        ("kubernetes:core/v1:Namespace", {"metadata": {"labels": None}}, "metadata.labels"),
        ("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", {"roleRef": None}, "roleRef"),
        ("kubernetes:rbac.authorization.k8s.io/v1:Role", {"rules": [{"apiGroups": None}]}, "rules[0].apiGroups"),
        (
            "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication",
            {"spec": {"driver": {"serviceAccount": None}}},
            "spec.driver.serviceAccount",
        ),
    ]
    for typ, props, path in cases:
        found = [m for _, (rule, _) in RULES.items() for m in rule(typ, props, "")]
        unknown = [m for m in found if is_unknown(m)]
        assert any(m.startswith(f"{path} ") for m in unknown), (typ, path, found)


def test_the_pack_sees_crossguards_unknown_values_as_none():
    raw = {"data": {"mirror.yaml": UNKNOWN_STRING_VALUE}, "metadata": {"labels": {"a": "b"}}, "n": [1, {"x": True}]}
    props = plain(unknown_checking_proxy(raw))
    assert props == {"data": {"mirror.yaml": None}, "metadata": {"labels": {"a": "b"}}, "n": [1, {"x": True}]}
    assert type(props["metadata"]) is dict and type(props["n"]) is list
    (finding,) = config_map_holds_no_credentials("kubernetes:core/v1:ConfigMap", props)
    assert is_unknown(finding)


def test_the_pod_security_rule_checks_the_level_not_only_the_label():
    typ = "kubernetes:core/v1:Namespace"
    enforce = "pod-security.kubernetes.io/enforce"
    for level in ("restricted", "baseline"):
        assert namespace_enforces_pod_security(typ, {"metadata": {"labels": {enforce: level}}}) == []
    for level in ("privileged", "Restricted", "", "strict"):
        assert namespace_enforces_pod_security(typ, {"metadata": {"labels": {enforce: level}}}), level


def test_iam_wildcard_actions_or_resources_are_refused():
    role_policy = "aws:iam/rolePolicy:RolePolicy"
    scoped = {"Effect": "Allow", "Action": ["kafka-cluster:ReadData"], "Resource": ["arn:aws:kafka:r:1:topic/c/u/t*"]}

    def doc(*statements):
        return {"policy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}

    assert iam_grants_no_wildcards(role_policy, doc(scoped)) == []
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Action": "*"}))
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Action": ["kafka-cluster:*"]}))
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Resource": "*"}))
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Resource": "arn:aws:s3:::*"}))
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Resource": ["arn:aws:kafka:*:*:*"]}))
    assert iam_grants_no_wildcards(role_policy, doc(scoped | {"Resource": "arn:aws:s3:::ckpt/*"})) == []
    negated = {k: v for k, v in scoped.items() if k != "Action"} | {"NotAction": ["iam:*"]}
    assert iam_grants_no_wildcards(role_policy, doc(negated)) == [
        "Statement[0].NotAction allows everything it does not name"
    ]
    cluster_policy = "aws:msk/clusterPolicy:ClusterPolicy"
    assert iam_grants_no_wildcards(cluster_policy, doc(scoped | {"Principal": {"AWS": "*"}}))
    assert iam_grants_no_wildcards(cluster_policy, doc(scoped | {"Effect": "Deny", "Action": "*"})) == []
    (finding,) = iam_grants_no_wildcards(role_policy, {"policy": None})
    assert is_unknown(finding)


def test_a_public_bucket_is_refused():
    block = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
    closed = dict.fromkeys(("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"), True)
    assert bucket_is_not_public(block, closed) == []
    assert bucket_is_not_public(block, closed | {"restrictPublicBuckets": False})
    assert bucket_is_not_public(block, {k: v for k, v in closed.items() if k != "blockPublicPolicy"})
    for typ in ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2", "aws:s3/bucketAclV2:BucketAclV2"):
        assert bucket_is_not_public(typ, {"acl": "private"}) == []
        assert bucket_is_not_public(typ, {"acl": "public-read"}), typ


def test_data_that_pulumi_may_delete_is_reported():
    for typ in (
        "azure-native:eventhub/v20240501preview:Namespace",
        "azure-native:resources:ResourceGroup",
        "kubernetes:core/v1:PersistentVolumeClaim",
        "aws:s3/bucket:Bucket",
        "azure-native:storage:BlobContainer",
    ):
        assert data_is_protected(typ, {}, protect=True) == []
        assert data_is_protected(typ, {}, protect=False), typ
    assert data_is_protected("kubernetes:core/v1:ConfigMap", {}, protect=False) == []


def test_a_trust_policy_open_to_anyone_and_an_aws_managed_policy_are_refused():
    role = "aws:iam/role:Role"
    pod_identity = {"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"}, "Action": "sts:AssumeRole"}

    def trust(*statements):
        return {"assumeRolePolicy": json.dumps({"Version": "2012-10-17", "Statement": list(statements)})}

    assert iam_grants_no_wildcards(role, trust(pod_identity)) == []
    assert iam_grants_no_wildcards(role, trust(pod_identity | {"Principal": {"AWS": "*"}}))
    assert iam_grants_no_wildcards(role, trust(pod_identity | {"Principal": "*"}))
    assert iam_grants_no_wildcards(role, trust(pod_identity | {"Principal": {"Federated": ["*"]}}))
    attachment = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
    assert iam_grants_no_wildcards(attachment, {"policyArn": "arn:aws:iam::aws:policy/AmazonMSKFullAccess"})
    assert iam_grants_no_wildcards(attachment, {"policyArn": "arn:aws:iam::111111111111:policy/mirror"}) == []


def test_an_image_not_pinned_by_digest_is_refused():
    typ = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
    pinned = "ghcr.io/example/mirror@sha256:" + "0" * 64
    spec = {"image": pinned, "driver": {}, "executor": {}}
    assert image_is_pinned_by_digest(typ, {"spec": spec}) == []
    assert image_is_pinned_by_digest(typ, {"spec": spec | {"image": "ghcr.io/example/mirror:0.1.0"}}) == [
        "spec.image 'ghcr.io/example/mirror:0.1.0' is not pinned by a sha256 digest"
    ]
    assert image_is_pinned_by_digest(typ, {"spec": spec | {"executor": {"image": "mirror:latest"}}})
    (finding,) = image_is_pinned_by_digest(typ, {"spec": spec | {"image": None}})
    assert is_unknown(finding)


def test_a_role_assignment_on_a_resource_group_subscription_or_management_group_is_refused():
    typ = "azure-native:authorization:RoleAssignment"
    namespace = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.EventHub/namespaces/ns"
    assert role_assignment_names_a_resource(typ, {"scope": namespace}) == []
    assert role_assignment_names_a_resource(typ, {"scope": f"{namespace}/eventhubs/orders"}) == []
    for broad in (
        "/subscriptions/s",
        "/subscriptions/s/",
        "/subscriptions/s/resourceGroups/rg",
        "/SUBSCRIPTIONS/s/resourcegroups/rg",
        "/providers/Microsoft.Management/managementGroups/root",
        "/",
    ):
        assert role_assignment_names_a_resource(typ, {"scope": broad}), broad


def test_every_rule_passes_on_every_stack_the_pipeline_deploys():
    """The pipeline runs the pack on every stack it previews and deploys: platform, account and site stacks alike."""
    from tests.infra.test_pipeline import pipeline_runs

    runs = pipeline_runs()
    assert any(s.startswith("platform-") for s in runs) and any("-site-" in s for s in runs)
    found = {
        (stack, r.name, name): message
        for stack, run in runs.items()
        for r in run.resources
        for name, (rule, _) in RULES.items()
        for message in rule(r.typ, r.plain, r.urn)
    }
    assert found == {}


def test_an_event_hubs_namespace_open_to_every_address_is_refused():
    namespace = "azure-native:eventhub/v20240501preview:Namespace"
    assert eventhubs_network_is_not_open(namespace, {"publicNetworkAccess": "Disabled"}) == []
    assert eventhubs_network_is_not_open(namespace, {"kafkaEnabled": True}) == [
        "publicNetworkAccess is unset: Azure's default lets in the whole internet"
    ]
    rules = "azure-native:eventhub:NamespaceNetworkRuleSet"
    listed = {"defaultAction": "Deny", "ipRules": [{"ipMask": "203.0.113.10", "action": "Allow"}]}
    assert eventhubs_network_is_not_open(rules, listed) == []
    assert eventhubs_network_is_not_open(rules, listed | {"defaultAction": "Allow"})
    assert eventhubs_network_is_not_open(rules, listed | {"ipRules": [{"ipMask": "0.0.0.0/0", "action": "Allow"}]})
