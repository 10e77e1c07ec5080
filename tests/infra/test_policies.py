"""The policy rules catch what they are for (the stacks pass them all in test_invariants)."""

from __future__ import annotations

from policies.rules import (
    config_map_holds_no_credentials,
    event_hub_keeps_producer_timestamps,
    eventhubs_namespace_speaks_kafka,
    msk_scram_secret_uses_customer_key,
    nothing_cluster_wide,
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
