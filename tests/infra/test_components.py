"""Each component on its own, under mocks: what it registers and what it hands back."""

from __future__ import annotations

import json
import re
from typing import Any

import pulumi
import pulumi_aws as aws
import pytest

from infra.aws.identity import MirrorRole, MirrorRoleArgs, kafka_policy, regex_to_glob
from infra.aws.network import MskReach, MskReachArgs
from infra.aws.scram import MskScramUser, MskScramUserArgs
from infra.azure.eventhubs import EventHubs, EventHubsArgs
from infra.azure.identity import DATA_ROLES, MirrorEntraIdentity, MirrorEntraIdentityArgs
from infra.hubs import HubSpec
from infra.k8s.mirror_app import ALERT_METRICS, MirrorApplication, MirrorApplicationArgs
from infra.k8s.namespace import MirrorNamespace, MirrorNamespaceArgs
from infra.k8s.operator import CHART_VERSION, CRD, SparkOperator, SparkOperatorArgs, keep_crds
from infra.schema import (
    Alerts,
    AwsSite,
    CheckpointStore,
    EventHubsSpec,
    ExecutorResources,
    MskSpec,
    Pvc,
    Resources,
)
from spark_app.config import SPARK_JVM_OPTIONS, STOP_GRACE_S, FlowConfig
from tests.infra.harness import (
    CONNECTION_STRING,
    EVENTHUB,
    ROOT,
    SUBSCRIPTION,
    is_secret,
    run_pulumi,
    run_values,
    stack_values,
    with_secrets,
)

ROLE_ASSIGNMENT = "azure-native:authorization:RoleAssignment"

MSK = MskSpec(
    cluster_arn="arn:aws:kafka:eu-west-1:222222222222:cluster/dr/abc-1",
    auth="iam",
    vpc_id="vpc-0b",
    cidr="10.20.0.0/16",
    route_table_ids=["rtb-0b1", "rtb-0b2"],
    security_group_id="sg-0b",
)
SITE = AwsSite(
    vpc_id="vpc-0a", cidr="10.10.0.0/16", route_table_ids=["rtb-0a1"], account_id="111111111111", eks_cluster="eks"
)


def eventhubs_spec(**changes) -> EventHubsSpec:
    return EventHubsSpec(namespace="mirrorkit-test", resource_group="rg", tier="Premium", **changes)


def test_event_hubs_sizes_each_hub_and_keeps_the_key_secret():
    hubs = [HubSpec("a.orders", 12, False), HubSpec("a.customers", 3, True)]

    async def body():
        eh = EventHubs("eh", EventHubsArgs(eventhubs_spec(consumer_groups=["bi"]), "westeurope", hubs))
        return {"conn": await eh.connection_string.future(), "secret": await eh.connection_string.is_secret()}

    run = run_pulumi(body, {})
    assert run.result == {"conn": CONNECTION_STRING, "secret": True}
    ns = run.named("eh-ns").plain
    assert ns["sku"]["name"] == "Premium" and ns["minimumTlsVersion"] == "1.2" and ns["kafkaEnabled"] is True
    assert ns["zoneRedundant"] is True and ns["disableLocalAuth"] is False
    orders, customers = run.named("eh-a.orders").plain, run.named("eh-a.customers").plain
    for hub in (orders, customers):  # the copy keeps the source's timestamps instead of stamping append time
        assert hub["messageTimestampDescription"] == {"timestampType": "Create"}
    assert orders["partitionCount"] == 12
    assert orders["retentionDescription"] == {"cleanupPolicy": "Delete", "retentionTimeInHours": 24}
    assert customers["retentionDescription"] == {"cleanupPolicy": "Compact", "tombstoneRetentionTimeInHours": 24}
    assert {r.name for r in run.of_type(f"{EVENTHUB}:ConsumerGroup")} == {
        "eh-a.orders-bi",
        "eh-a.customers-bi",
    }
    assert run.named("eh-rule").plain["rights"] == ["Send", "Listen"]
    assert run.of_type(f"{EVENTHUB}:DisasterRecoveryConfig") == []


def test_event_hubs_adds_manage_and_geo_dr_only_when_asked():
    spec = eventhubs_spec(manage_rights=True, geo_dr={"alias": "dr", "partner_namespace_id": "/subs/x/ns/partner"})

    async def body():
        EventHubs("eh", EventHubsArgs(spec, "westeurope", [HubSpec("t", 1, False)]))
        return {}

    run = run_pulumi(body, {})
    assert run.named("eh-rule").plain["rights"] == ["Send", "Listen", "Manage"]
    assert run.named("eh-geo-dr").plain["partnerNamespace"] == "/subs/x/ns/partner"


def test_event_hubs_with_local_auth_disabled_has_no_sas_rule_or_connection_string():
    async def body():
        eh = EventHubs(
            "eh", EventHubsArgs(eventhubs_spec(disable_local_auth=True), "westeurope", [HubSpec("t", 1, False)])
        )
        return {"conn": eh.connection_string, "id": await eh.namespace_id.future()}

    run = run_pulumi(body, {})
    assert run.named("eh-ns").plain["disableLocalAuth"] is True
    assert run.result == {"conn": None, "id": "eh-ns-id"}
    assert run.of_type(f"{EVENTHUB}:NamespaceAuthorizationRule") == []
    assert not [token for token, _ in run.mocks.calls if token.endswith(":listNamespaceKeys")]


def entra_identity(service_accounts: list[str], namespace_ids: dict[str, str]) -> MirrorEntraIdentity:
    """A site's Entra identity for these service accounts, granted on these Event Hubs namespaces."""
    return MirrorEntraIdentity(
        "site-entra",
        MirrorEntraIdentityArgs(
            resource_group_name="rg",
            location="westeurope",
            oidc_issuer_url="https://oidc.example/issuer/",
            namespace="mk",
            service_accounts=service_accounts,
            namespace_ids=namespace_ids,
        ),
    )


def test_entra_identity_federates_the_service_account_and_may_only_send_and_receive():
    async def body():
        identity = entra_identity(["mirrorkit"], {"dr": "/subscriptions/s/ns/dr", "dr2": "/subscriptions/s/ns/dr2"})
        annotations = {
            k: await pulumi.Output.from_input(v).future() for k, v in identity.service_account_annotations.items()
        }
        return {"annotations": annotations, "labels": identity.pod_labels}

    run = run_pulumi(body, {})
    federation = run.named("site-entra-federation-mirrorkit").plain
    assert (federation["issuer"], federation["subject"], federation["audiences"]) == (
        "https://oidc.example/issuer/",
        "system:serviceaccount:mk:mirrorkit",
        ["api://AzureADTokenExchange"],
    )
    assert federation["resourceName"] == "site-entra-identity"
    grants = {(r.plain["scope"], r.plain["roleDefinitionId"].rsplit("/", 1)[1]) for r in run.of_type(ROLE_ASSIGNMENT)}
    assert grants == {
        (ns, role) for ns in ("/subscriptions/s/ns/dr", "/subscriptions/s/ns/dr2") for role in DATA_ROLES.values()
    }
    for assignment in run.of_type(ROLE_ASSIGNMENT):
        p = assignment.plain
        assert p["principalId"] == "principal-site-entra-identity" and p["principalType"] == "ServicePrincipal"
        assert p["roleDefinitionId"].startswith(f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Authorization/")
    assert run.result == {
        "annotations": {"azure.workload.identity/client-id": "client-site-entra-identity"},
        "labels": {"azure.workload.identity/use": "true"},
    }


def test_federated_credentials_on_one_identity_are_written_one_after_another():
    # Azure refuses concurrent federated credential writes on one managed identity (409
    # ConcurrentFederatedIdentityCredentialsWritesForSingleManagedIdentity): each waits for the one before.
    accounts = ["mirrorkit", "mirrorkit-executor", "third"]

    async def body():
        entra_identity(accounts, {})
        return {}

    run = run_pulumi(body, {})
    credentials = [run.named(f"site-entra-federation-{a}") for a in accounts]
    for before, after in zip(credentials, credentials[1:], strict=False):
        assert before.urn in after.dependencies, f"{after.name} does not wait for {before.name}"
    assert not any(c.urn in credentials[0].dependencies for c in credentials[1:])


def test_event_hubs_can_use_an_existing_resource_group_and_auto_inflate():
    spec = EventHubsSpec(
        namespace="mirrorkit-test",
        resource_group="rg-existing",
        existing_resource_group=True,
        tier="Standard",
        capacity=2,
        auto_inflate_max=10,
    )

    async def body():
        EventHubs("eh", EventHubsArgs(spec, "westeurope", [HubSpec("t", 1, False)]))
        return {}

    run = run_pulumi(body, {})
    assert run.of_type("azure-native:resources:ResourceGroup") == []
    ns = run.named("eh-ns").plain
    assert ns["resourceGroupName"] == "rg-existing"
    assert (ns["isAutoInflateEnabled"], ns["maximumThroughputUnits"], ns["sku"]["capacity"]) == (True, 10, 2)


def test_msk_reach_peers_routes_both_ways_and_opens_one_port_from_the_peer():
    async def body():
        site = aws.Provider("site", region="eu-west-1")
        msk = aws.Provider("msk", region="eu-west-1")
        MskReach("r", MskReachArgs("test", SITE, site, msk, [MSK]))
        return {}

    run = run_pulumi(body, {})
    peering = run.named("r-peering").plain
    assert (peering["vpcId"], peering["peerVpcId"], peering["peerOwnerId"], peering["peerRegion"]) == (
        "vpc-0a",
        "vpc-0b",
        "222222222222",
        "eu-west-1",
    )
    assert run.named("r-accepter").plain["autoAccept"] is True
    assert "::site::" in run.named("r-peering").provider and "::msk::" in run.named("r-accepter").provider
    routes = {r.plain["routeTableId"]: r.plain["destinationCidrBlock"] for r in run.of_type("aws:ec2/route:Route")}
    assert routes == {"rtb-0a1": "10.20.0.0/16", "rtb-0b1": "10.10.0.0/16", "rtb-0b2": "10.10.0.0/16"}
    (rule,) = run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert {k: rule.plain[k] for k in ("securityGroupId", "cidrIpv4", "fromPort", "toPort", "ipProtocol")} == {
        "securityGroupId": "sg-0b",
        "cidrIpv4": "10.10.0.0/16",
        "fromPort": 9098,
        "toPort": 9098,
        "ipProtocol": "tcp",
    }


def reach_refused(calls, preview: bool = False) -> str:
    """What an update (or a preview) says of a reach between SITE and MSK when the AWS lookups answer `calls`."""

    async def body():
        site = aws.Provider("site", region="eu-west-1")
        msk = aws.Provider("msk", region="eu-west-1")
        keys = ("mirrorkit:sites[0].aws", "mirrorkit:clusters[1].msk")
        MskReach("r", MskReachArgs("test", SITE, site, msk, [MSK], keys=keys))
        return {}

    with pytest.raises(Exception) as refused:
        run_pulumi(body, {}, calls=calls, preview=preview)
    return str(refused.value)


def test_msk_reach_refuses_a_client_subnet_table_the_stack_does_not_route():
    subnets = {"brokerNodeGroupInfos": [{"clientSubnets": ["subnet-a", "subnet-b", "subnet-c"]}]}

    def tables(args):  # each client subnet of MSK has a table of its own
        assert args["filters"][0]["values"] == ["subnet-a", "subnet-b", "subnet-c"] and args["vpcId"] == "vpc-0b"
        return {"ids": ["rtb-0b1", "rtb-0b2", "rtb-0b3"]}

    calls = {"aws:msk/getCluster:getCluster": subnets, "aws:ec2/getRouteTables:getRouteTables": tables}
    message = reach_refused(calls)
    assert "mirrorkit:clusters[1].msk.route_table_ids: misses rtb-0b3" in message, message


@pytest.mark.parametrize("preview", [True, False])
def test_msk_reach_refuses_a_route_another_stack_has_in_a_table_naming_the_key_and_the_peering(preview):
    def table(args):
        taken = {"cidrBlock": "10.20.0.0/16", "vpcPeeringConnectionId": "pcx-other"}
        return {"routes": [taken] if args["routeTableId"] == "rtb-0a1" else []}

    # At preview too, when the peering the routes go through is not made yet and its id unknown.
    message = reach_refused({"aws:ec2/getRouteTable:getRouteTable": table}, preview)
    assert "mirrorkit:clusters[1].msk.cidr: route table rtb-0a1 already routes 10.20.0.0/16 through pcx-other" in (
        message
    ), message
    assert "mirrorkit:sites[0].aws.route_table_ids" in message


@pytest.mark.parametrize("theirs", ["10.20.5.0/24", "10.0.0.0/8"])
def test_msk_reach_refuses_a_route_overlapping_another_peerings_naming_the_key_and_the_peering(theirs):
    # A narrower route through another peering takes part of the MSK VPC's traffic; a wider one loses part of its own.
    def table(args):
        taken = {"cidrBlock": theirs, "vpcPeeringConnectionId": "pcx-other"}
        return {"routes": [taken] if args["routeTableId"] == "rtb-0a1" else []}

    message = reach_refused({"aws:ec2/getRouteTable:getRouteTable": table})
    assert f"mirrorkit:clusters[1].msk.cidr: 10.20.0.0/16 overlaps {theirs}, which route table rtb-0a1" in message
    assert "through pcx-other" in message and "mirrorkit:sites[0].aws.route_table_ids" in message


def test_msk_reach_takes_a_table_whose_default_route_leaves_through_a_gateway():
    def table(args):  # each table's own VPC, and the way out
        own = SITE.cidr if args["routeTableId"] in SITE.route_table_ids else MSK.cidr
        return {
            "routes": [{"cidrBlock": "0.0.0.0/0", "natGatewayId": "nat-0a"}, {"cidrBlock": own, "gatewayId": "local"}]
        }

    async def body():
        p = aws.Provider("p", region="eu-west-1")
        MskReach("r", MskReachArgs("test", SITE, p, p, [MSK]))
        return {}

    calls = {
        "aws:ec2/getRouteTable:getRouteTable": table,
        "aws:msk/getCluster:getCluster": {"brokerNodeGroupInfos": []},
    }
    run = run_pulumi(body, {}, calls=calls)
    assert {r.plain["destinationCidrBlock"] for r in run.of_type("aws:ec2/route:Route")} == {
        "10.10.0.0/16",
        "10.20.0.0/16",
    }


def test_msk_reach_in_the_same_vpc_only_opens_the_port():
    same = MSK.model_copy(update={"vpc_id": SITE.vpc_id, "auth": "scram"})

    async def body():
        p = aws.Provider("p", region="eu-west-1")
        MskReach("r", MskReachArgs("test", SITE, p, p, [same]))
        return {}

    run = run_pulumi(body, {})
    assert [r.typ for r in run.resources if r.typ.startswith("aws:") and "providers" not in r.typ] == [
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    ]
    assert run.resources[-1].plain["fromPort"] == 9096


def test_scram_user_is_an_amazonmsk_secret_on_a_customer_key():
    scram = MSK.model_copy(update={"auth": "scram"})

    async def body():
        MskScramUser("s", MskScramUserArgs(scram, "dr", pulumi.Output.secret("test-sentinel"), "test"))
        return {}

    run = run_pulumi(body, {})
    secret = run.named("s-secret").plain
    assert secret["name"] == "AmazonMSK_mirrorkit_test.dr" and secret["kmsKeyId"] == "arn:aws:test:::s-key"
    value = run.named("s-value").inputs["secretString"]
    assert is_secret(value) and json.loads(value["value"]) == {"username": "mirror", "password": "test-sentinel"}
    assocation = run.named("s-association").plain
    assert assocation["clusterArn"] == MSK.cluster_arn and assocation["secretArn"] == "arn:aws:test:::s-secret"


def test_regex_to_glob_keeps_the_literal_prefix():
    assert regex_to_glob("payments") == "payments"
    assert regex_to_glob(r"orders\..*") == "orders.*"
    assert regex_to_glob("events[0-9]+") == "events*"
    assert regex_to_glob(".*") == "*"


def test_kafka_policy_allows_only_the_flows_topics_and_groups():
    flows = [
        FlowConfig(
            source="us",
            target="eu",
            topics={"include": [r"events\..*"]},
            replication_policy="identity",
            checkpoint_location="/c",
            groups={"include": ["app-.*"]},
            sync_group_offsets=True,
        ),
    ]
    eu = MSK
    us = MSK.model_copy(update={"cluster_arn": "arn:aws:kafka:us-east-1:222222222222:cluster/us/def-1"})
    policy = kafka_policy(flows, {"us": us, "eu": eu})
    by_resource = {r: s["Action"] for s in policy["Statement"] for r in s["Resource"]}
    topic = "arn:aws:kafka:{}:222222222222:topic/{}/{}"
    assert "kafka-cluster:WriteData" not in by_resource[topic.format("us-east-1", "us", "def-1/events.*")]
    assert "kafka-cluster:WriteData" in by_resource[topic.format("us-east-1", "us", "def-1/heartbeats")]
    assert "kafka-cluster:WriteData" in by_resource[topic.format("eu-west-1", "dr", "abc-1/events.*")]
    assert "kafka-cluster:WriteData" in by_resource[topic.format("eu-west-1", "dr", "abc-1/us.checkpoints.internal")]
    assert by_resource["arn:aws:kafka:eu-west-1:222222222222:group/dr/abc-1/app-*"] == [
        "kafka-cluster:AlterGroup",
        "kafka-cluster:DescribeGroup",
    ]
    assert by_resource["arn:aws:kafka:us-east-1:222222222222:group/us/def-1/app-*"] == ["kafka-cluster:DescribeGroup"]
    resources = [r for s in policy["Statement"] for r in s["Resource"]]
    assert all(
        r.startswith(("arn:aws:kafka:us-east-1:222222222222:", "arn:aws:kafka:eu-west-1:222222222222:"))
        for r in resources
    )
    assert not any(r.endswith(("/*", ":*")) for r in resources)


def test_kafka_policy_lets_transactional_flows_use_their_transactional_ids_on_their_target_only():
    us = MSK.model_copy(update={"cluster_arn": "arn:aws:kafka:us-east-1:222222222222:cluster/us/def-1"})

    def flow(source: str, target: str, **changes: Any) -> FlowConfig:
        return FlowConfig(source=source, target=target, topics={"include": ["t"]}, checkpoint_location="/c", **changes)

    def transactional(*flows: FlowConfig) -> set[tuple[str, str]]:
        """(resource, action) of every grant on a transactional id, or of a transactional-id action."""
        policy = kafka_policy(flows, {"us": us, "eu": MSK})
        return {
            (r, a)
            for s in policy["Statement"]
            for r in s["Resource"]
            for a in s["Action"]
            if ":transactional-id/" in r or "TransactionalId" in a
        }

    def granted(resource: str) -> set[tuple[str, str]]:
        return {(resource, f"kafka-cluster:{a}TransactionalId") for a in ("Alter", "Describe")}

    into_eu = granted("arn:aws:kafka:eu-west-1:222222222222:transactional-id/dr/abc-1/mirrorkit.us.eu.*")
    into_us = granted("arn:aws:kafka:us-east-1:222222222222:transactional-id/us/def-1/mirrorkit.eu.us.*")
    assert transactional(flow("us", "eu", exactly_once=True)) == into_eu
    assert transactional(flow("eu", "us", mode="realtime")) == into_us
    assert transactional(flow("us", "eu", exactly_once=True), flow("eu", "us", mode="realtime")) == into_eu | into_us
    assert transactional(flow("us", "eu"), flow("eu", "us")) == set()


def test_mirror_role_uses_pod_identity_or_irsa():
    irsa = SITE.model_copy(
        update={"eks_cluster": None, "oidc_provider_arn": "arn:aws:iam::111111111111:oidc-provider/oidc.example/id/X"}
    )

    async def body():
        flows = [FlowConfig(source="a", target="b", topics={"include": ["t"]}, checkpoint_location="/c")]
        pod = MirrorRole("pod", MirrorRoleArgs(SITE, "ns", ["sa"], flows, {"b": MSK}))
        web = MirrorRole("web", MirrorRoleArgs(irsa, "ns", ["sa"], flows, {"b": MSK}))
        return {"pod": pod.service_account_annotations, "web": await web.role_arn.future()}

    run = run_pulumi(body, {})
    association = run.named("pod-pod-identity-sa").plain
    assert (association["clusterName"], association["namespace"], association["serviceAccount"]) == ("eks", "ns", "sa")
    assert run.result["pod"] == {}
    trust = json.loads(run.named("web-role").plain["assumeRolePolicy"])
    subjects = trust["Statement"][0]["Condition"]["StringEquals"]["oidc.example/id/X:sub"]
    assert subjects == ["system:serviceaccount:ns:sa"]
    assert run.result["web"] == "arn:aws:test:::web-role"


def namespace_args(**changes) -> MirrorNamespaceArgs:
    defaults = dict(
        namespace="mk",
        service_account="mirrorkit",
        executor_service_account="mirrorkit-executor",
        kafka_ports=[9096, 9093],
        metrics_port=9404,
        monitoring_namespace="monitoring",
        api_server_cidrs=["10.0.0.0/16"],
        credentials={"dr": {"password": pulumi.Output.secret("test-sentinel")}},
    )
    return MirrorNamespaceArgs(**(defaults | changes))


def test_namespace_is_restricted_rbac_is_namespaced_and_traffic_is_denied_by_default():
    async def body():
        ns = MirrorNamespace("s", namespace_args())
        return {"secrets": ns.secret_names}

    run = run_pulumi(body, {})
    labels = run.named("s-ns").plain["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    (role,) = run.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.plain["metadata"]["namespace"] == "mk"
    assert sorted(role.plain["rules"][0]["resources"]) == ["configmaps", "persistentvolumeclaims", "pods", "services"]
    (binding,) = run.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.plain["roleRef"]["kind"] == "Role"
    assert binding.plain["subjects"] == [{"kind": "ServiceAccount", "name": "mirrorkit", "namespace": "mk"}]
    deny = run.named("s-default-deny").plain["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    allow = run.named("s-mirror").plain["spec"]
    egress_ports = {p["port"] for rule in allow["egress"] for p in rule.get("ports", [])}
    assert egress_ports == {53, 443, 6443, 9093, 9096}
    assert allow["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9404}]
    secret = run.named("s-dr")
    assert is_secret(secret.inputs["stringData"]) or is_secret(secret.inputs["stringData"]["password"])
    assert run.result["secrets"] == {"dr": "mirrorkit-dr"}


def test_namespace_opens_https_and_the_pod_identity_agent_only_when_asked():
    async def body():
        MirrorNamespace("plain", namespace_args())
        MirrorNamespace("wide", namespace_args(https_egress=True, pod_identity_agent=True))
        return {}

    run = run_pulumi(body, {})

    def extra(name):
        return [
            rule
            for rule in run.named(f"{name}-mirror").plain["spec"]["egress"]
            if "to" not in rule
            or any("ipBlock" in peer and peer["ipBlock"]["cidr"].startswith(("169.254", "fd00")) for peer in rule["to"])
        ]

    assert extra("plain") == [{"ports": [{"protocol": "TCP", "port": 9093}, {"protocol": "TCP", "port": 9096}]}]
    assert extra("wide")[1:] == [
        {"ports": [{"protocol": "TCP", "port": 443}]},
        {
            "to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}, {"ipBlock": {"cidr": "fd00:ec2::23/128"}}],
            "ports": [{"protocol": "TCP", "port": 80}],
        },
    ]


def test_spark_operator_chart_is_pinned_and_watches_only_the_mirror_namespace():
    async def body():
        SparkOperator("op", SparkOperatorArgs(job_namespaces=["mk"], release="spark-operator-test"))
        return {}

    run = run_pulumi(body, {})
    (chart,) = run.of_type("kubernetes:helm.sh/v4:Chart")
    assert chart.plain["version"] == CHART_VERSION and chart.plain["chart"] == "spark-operator"
    assert chart.plain["name"] == chart.plain["namespace"] == "spark-operator-test"
    assert chart.plain["values"]["spark"]["jobNamespaces"] == ["mk"]
    assert chart.plain["values"]["spark"]["rbac"] == {"create": False}


def test_the_operator_runs_two_replicas_under_a_budget_and_keeps_its_crds_when_the_release_goes():
    async def body():
        SparkOperator("op", SparkOperatorArgs(job_namespaces=["mk"], release="spark-operator"))
        return {}

    run = run_pulumi(body, {})
    (chart,) = run.of_type("kubernetes:helm.sh/v4:Chart")
    for part in ("controller", "webhook"):
        values = chart.plain["values"][part]
        assert values["replicas"] == 2 and values["podDisruptionBudget"] == {"enable": True, "minAvailable": 1}
    assert chart.transforms == 1
    crd = pulumi.ResourceTransformArgs(
        custom=True, type_=CRD, name="op-chart:sparkapplications", props={}, opts=pulumi.ResourceOptions()
    )
    kept = keep_crds(crd)
    assert kept is not None and kept.opts.protect is True and kept.opts.retain_on_delete is True
    deployment = pulumi.ResourceTransformArgs(
        custom=True, type_="kubernetes:apps/v1:Deployment", name="d", props={}, opts=pulumi.ResourceOptions()
    )
    assert keep_crds(deployment) is None


def test_a_platform_stacks_release_and_provider_keep_their_names_when_the_stack_is_renamed():
    values = stack_values(ROOT / "stacks" / "Pulumi.platform-eks-use1.yaml")
    for stack in ("platform-eks-use1", "renamed"):
        run = run_values(values, stack=stack)
        (chart,) = run.of_type("kubernetes:helm.sh/v4:Chart")
        assert chart.plain["name"] == chart.plain["namespace"] == "spark-operator", stack
        (provider,) = run.of_type("pulumi:providers:kubernetes")
        # The first releases named it `<stack>-k8s`: the alias keeps it, and every object on it, on upgrade.
        assert provider.name == "k8s" and any(f'name: "{stack}-k8s"' in a for a in provider.aliases)
    # A platform first deployed under its stack's name keeps that release by naming it.
    old = values | {
        "mirrorkit:platform": values["mirrorkit:platform"] | {"release": "spark-operator-platform-eks-use1"}
    }
    (chart,) = run_values(old, stack="renamed").of_type("kubernetes:helm.sh/v4:Chart")
    assert chart.plain["name"] == "spark-operator-platform-eks-use1"


def mirror_args(**changes) -> MirrorApplicationArgs:
    defaults = dict(
        namespace="mk",
        service_account="mirrorkit",
        executor_service_account="mirrorkit-executor",
        image="img:1",
        spark_version="4.0.1",
        config_yaml="version: 1\n",
        secret_names={"dr": "mirrorkit-dr"},
        driver=Resources(cores=1, memory="2g"),
        executor=ExecutorResources(instances=3, cores=2, memory="4g"),
        checkpoint=CheckpointStore(pvc=Pvc(size="5Gi")),
        metrics_port=9404,
        monitoring=True,
        alerts=Alerts(),
    )
    return MirrorApplicationArgs(**(defaults | changes))


def test_the_application_turns_on_sparks_authentication_and_encryption_and_nothing_turns_them_off():
    """Spark authenticates and encrypts every connection between the driver and its executors with a secret it makes
    for the application and hands the executor pods itself, so the spec holds no secret; the real-time slots' report
    channel takes its key from that secret (spark_app.channel)."""

    async def body():
        off = {"spark.authenticate": "false", "spark.network.crypto.enabled": "false"}
        MirrorApplication("m", mirror_args(spark_conf=off))
        return {}

    conf = run_pulumi(body, {}).named("m-app").plain["spec"]["sparkConf"]
    assert conf["spark.authenticate"] == "true"
    assert conf["spark.network.crypto.enabled"] == "true"
    assert not [key for key in conf if key.startswith("spark.authenticate.secret")], conf


def test_sparks_web_ui_is_off_unless_the_stacks_spark_conf_turns_it_on():
    async def body():
        MirrorApplication("off", mirror_args())
        MirrorApplication("on", mirror_args(spark_conf={"spark.ui.enabled": "true"}))
        return {}

    run = run_pulumi(body, {})
    enabled = {name: run.named(f"{name}-app").plain["spec"]["sparkConf"]["spark.ui.enabled"] for name in ("off", "on")}
    assert enabled == {"off": "false", "on": "true"}


def test_mirror_runs_the_cli_with_its_config_and_checkpoint_pvc():
    async def body():
        MirrorApplication("m", mirror_args())
        return {}

    run = run_pulumi(body, {})
    assert run.named("m-config").plain["data"] == {"mirror.yaml": "version: 1\n"}
    spec = run.named("m-app").plain["spec"]
    assert spec["mainApplicationFile"] == "local:///opt/mirrorkit/main.py"
    assert spec["arguments"] == ["run", "--config", "/etc/mirrorkit/config/mirror.yaml"]
    assert spec["restartPolicy"]["type"] == "Always" and spec["restartPolicy"]["onFailureRetryInterval"] > 0
    assert (spec["executor"]["instances"], spec["executor"]["cores"], spec["executor"]["memory"]) == (3, 2, "4g")
    assert spec["driver"]["secrets"] == [
        {"name": "mirrorkit-dr", "path": "/etc/mirrorkit/secrets/dr", "secretType": "Generic"}
    ]
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in spec["driver"]["volumeMounts"]
    assert spec["driver"]["terminationGracePeriodSeconds"] == STOP_GRACE_S == 300
    jvm = {role: spec["sparkConf"][f"spark.{role}.extraJavaOptions"] for role in ("driver", "executor")}
    assert jvm == {"driver": SPARK_JVM_OPTIONS, "executor": SPARK_JVM_OPTIONS}  # no class archive: the image has none
    assert run.named("m-checkpoints").plain["spec"]["resources"]["requests"]["storage"] == "5Gi"
    rules = {r["alert"]: r["expr"] for r in run.named("m-rules").plain["spec"]["groups"][0]["rules"]}
    assert set(rules) == {
        "MirrorkitLagHigh",
        "MirrorkitStalled",
        "MirrorkitAbsent",
        "MirrorkitCheckpointStale",
        "MirrorkitHeartbeatStale",
        "MirrorkitDrUnusable",
        "MirrorkitErrors",
    }
    assert all('{app_kubernetes_io_instance="m"}' in expr for expr in rules.values())
    # Every series the mirror serves for alerting is read by some rule, under its exact name.
    used = {name for expr in rules.values() for name in re.findall(r"\bmirrorkit_[a-z_]+", expr)}
    assert (
        used
        == set(ALERT_METRICS)
        == {
            "mirrorkit_records_mirrored_total",
            "mirrorkit_lag_records",
            "mirrorkit_checkpoint_age_seconds",
            "mirrorkit_heartbeat_age_seconds",
            "mirrorkit_last_batch_timestamp_seconds",
            "mirrorkit_errors_total",
            "mirrorkit_dr_unusable_topics",
        }
    )
    assert "time() - max by (flow) (mirrorkit_last_batch_timestamp_seconds" in rules["MirrorkitStalled"]
    assert all(expr.count("(") == expr.count(")") for expr in rules.values())
    assert run.named("m-podmonitor").plain["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_mirror_with_object_storage_and_no_monitoring_has_no_pvc_or_monitors():
    async def body():
        MirrorApplication("m", mirror_args(checkpoint=CheckpointStore(url="s3a://bucket/x"), monitoring=False))
        return {}

    run = run_pulumi(body, {})
    types = {r.typ for r in run.resources}
    assert "kubernetes:core/v1:PersistentVolumeClaim" not in types
    assert not any("monitoring.coreos.com" in t for t in types)
    assert [v["name"] for v in run.named("m-app").plain["spec"]["volumes"]] == ["config", "scratch"]


def test_the_checkpoint_pvc_takes_the_clusters_default_storage_class_unless_the_stack_names_one():
    # EKS ships gp2 as its default class, and gp3 only where someone made it: naming none lets the cluster choose.
    async def body():
        MirrorApplication("plain", mirror_args())
        MirrorApplication("named", mirror_args(checkpoint=CheckpointStore(pvc=Pvc(size="5Gi", storage_class="gp3"))))
        return {}

    run = run_pulumi(body, {})
    assert "storageClassName" not in run.named("plain-checkpoints").plain["spec"]
    assert run.named("named-checkpoints").plain["spec"]["storageClassName"] == "gp3"


def test_the_msk_scram_secret_is_named_per_stack_and_deleted_at_once_so_destroy_then_up_reuses_the_name():
    values = with_secrets(stack_values(ROOT / "stacks" / "Pulumi.onprem-to-msk.yaml"))
    names = []
    for stack in ("dr-a", "dr-b"):
        (secret,) = run_values(values, stack=stack).of_type("aws:secretsmanager/secret:Secret")
        names.append(secret.plain["name"])
        # A deleted secret's name stays taken for its recovery window; the password lives in stack config anyway.
        assert secret.plain["recoveryWindowInDays"] == 0
    assert names == ["AmazonMSK_mirrorkit_dr-a.aws", "AmazonMSK_mirrorkit_dr-b.aws"]
    assert all(n.startswith("AmazonMSK_") for n in names) and len(set(names)) == 2


def test_every_event_hubs_resource_keeps_its_place_when_the_pinned_api_version_moves():
    """infra/azure/eventhubs.py pins an Event Hubs API version, which is in each resource's type token. A move to the
    provider's default module (azure-native 3 drops most versioned ones) or another version must find the resource
    by an alias, or the engine would replace the namespace and its hubs: azure-native's SDK sends one for the default
    token and every other version it knows; this holds the program to it."""
    run = run_values(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml")))
    found = [r for r in run.resources if r.typ.startswith(f"{EVENTHUB}:")]
    assert {r.typ.rsplit(":", 1)[1] for r in found} >= {"Namespace", "EventHub", "NamespaceAuthorizationRule"}
    for resource in found:
        kind = resource.typ.rsplit(":", 1)[1]
        moved = [f'type: "azure-native:eventhub:{kind}"', f'type: "azure-native:eventhub/v20240101:{kind}"']
        missing = [m for m in moved if not any(m in a for a in resource.aliases)]
        assert missing == [], f"{resource.typ} {resource.name}"


def test_a_public_event_hubs_namespace_lets_in_only_the_listed_addresses():
    run = run_values(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml")))
    (rules,) = run.of_type(f"{EVENTHUB}:NamespaceNetworkRuleSet")
    assert rules.plain["defaultAction"] == "Deny" and rules.plain["publicNetworkAccess"] == "Enabled"
    assert [r["ipMask"] for r in rules.plain["ipRules"]] == ["198.51.100.20", "198.51.100.21"]  # site euw1's NAT
    assert rules.plain["trustedServiceAccessEnabled"] is False
