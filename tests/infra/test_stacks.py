"""One test per shipped topology: the whole program with its config (a set's part stacks, each in turn), its
resources and its rendered config."""

from __future__ import annotations

import copy

import yaml

from tests.infra.harness import (
    BOOTSTRAPS,
    EVENTHUB,
    ROOT,
    SETS,
    STACKS,
    run_values,
    stack_values,
    topology_values,
    with_secrets,
)


def test_every_shipped_topology_has_a_test():
    assert {p.name.split(".")[1] for p in STACKS} == {"onprem-to-msk"}  # the single-region one, deployed whole
    assert set(SETS) == {"dr-msk-to-eventhubs", "active-active"}  # deployed as sets of per-region stacks


def types(run) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in run.resources:
        counts[r.typ] = counts.get(r.typ, 0) + 1
    return counts


def test_active_passive_msk_to_event_hubs(stack_runs):
    run = stack_runs["dr-msk-to-eventhubs"]
    hubs = {h.plain["eventHubName"]: h.plain for h in run.of_type(f"{EVENTHUB}:EventHub")}
    assert sorted(hubs) == [
        "mirrorkit-dead-letters",
        "mirrorkit-offset-syncs.primary.internal",
        "primary.checkpoints.internal",
        "primary.customers",
        "primary.heartbeats",
        "primary.orders",
        "primary.payments",
    ]
    assert (hubs["primary.orders"]["partitionCount"], hubs["primary.payments"]["partitionCount"]) == (12, 6)
    assert hubs["primary.customers"]["retentionDescription"]["cleanupPolicy"] == "Compact"
    assert hubs["primary.orders"]["retentionDescription"] == {"cleanupPolicy": "Delete", "retentionTimeInHours": 168}
    # The internal hubs read back by key are compacted, as the mirror checks at start; the others are not.
    compacted = {name for name, hub in hubs.items() if hub["retentionDescription"]["cleanupPolicy"] == "Compact"}
    assert compacted == {"mirrorkit-offset-syncs.primary.internal", "primary.checkpoints.internal", "primary.customers"}
    assert run.named("eh-dr-ns").plain["sku"]["name"] == "Premium"
    # Cross-account, cross-region peering: the MSK part requests it in the MSK account and region, toward the site's
    # account and region, and the site's stack accepts it there, each through its own provider.
    peering = run.named("euw1-vpc-0f1e2d3c4b5a60001-peering")
    assert (peering.plain["peerOwnerId"], peering.plain["peerRegion"]) == ("111111111111", "eu-west-1")
    accepter = run.named("euw1-vpc-0f1e2d3c4b5a60001-accepter")
    regions = {f"{p.urn}::{p.name}-id": p.plain["region"] for p in run.of_type("pulumi:providers:aws")}
    assert (regions[peering.provider or ""], regions[accepter.provider or ""]) == ("us-east-1", "eu-west-1")
    assert peering.provider != accepter.provider
    routes = {(r.plain["routeTableId"], r.plain["destinationCidrBlock"]) for r in run.of_type("aws:ec2/route:Route")}
    assert routes == {("rtb-0a1b2c3d4e5f60003", "10.21.0.0/16"), ("rtb-0f1e2d3c4b5a60001", "10.30.0.0/16")}
    assert run.named("scram-primary-secret").plain["name"] == "AmazonMSK_mirrorkit_dr-msk-to-eventhubs.primary"
    assert "kubernetes:helm.sh/v4:Chart" not in types(run)  # the platform stack of eks-euw1 installs it
    assert types(run)["kubernetes:monitoring.coreos.com/v1:PrometheusRule"] == 1
    assert set(run.result["configs"]) == {"euw1"}  # the mirror runs near its target, outside the primary's region
    config = yaml.safe_load(run.result["configs"]["euw1"])
    primary, dr = config["clusters"]
    assert primary["bootstrap_servers"] == BOOTSTRAPS["bootstrapBrokersSaslScram"]
    assert (primary["profile"], primary["password"]["file"]) == ("msk-scram", "/etc/mirrorkit/secrets/primary/password")
    assert (dr["profile"], dr["bootstrap_servers"]) == ("eventhubs", "mirrorkit-dr-weu.servicebus.windows.net:9093")
    assert config["flows"][0]["checkpoint_location"] == "/checkpoints/primary-dr"
    assert config["flows"][0]["dead_letter_topic"] == "mirrorkit-dead-letters"


def test_active_active_runs_one_mirror_per_region_owning_the_flow_into_it(stack_runs):
    run = stack_runs["active-active"]
    configs = {site: yaml.safe_load(text) for site, text in run.result["configs"].items()}
    assert {site: [f"{f['source']}->{f['target']}" for f in c["flows"]] for site, c in configs.items()} == {
        "use1": ["eu->us"],
        "euw1": ["us->eu"],
    }
    assert {site: [(f["mode"], f["realtime_tasks"]) for f in c["flows"]] for site, c in configs.items()} == {
        "use1": [("throughput", 1)],
        "euw1": [("realtime", 2)],
    }
    for config in configs.values():
        assert {c["profile"] for c in config["clusters"]} == {"msk-iam"}
        assert all(c["bootstrap_servers"] == BOOTSTRAPS["bootstrapBrokersSaslIam"] for c in config["clusters"])
        assert config["flows"][0]["replication_policy"] == "identity" and config["flows"][0]["provenance_header"]
        assert config["checkpoint_interval_s"] == 5
    # Each region's mirror keeps its checkpoints in its own region's bucket.
    assert {site: c["flows"][0]["checkpoint_location"] for site, c in configs.items()} == {
        "use1": "s3a://mirrorkit-checkpoints-example/active-active/active-active/eu-us",
        "euw1": "s3a://mirrorkit-checkpoints-example-eu-west-1/active-active/active-active/us-eu",
    }
    assert len(run.of_type("kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication")) == 2
    assert not run.of_type("kubernetes:core/v1:PersistentVolumeClaim") and not run.of_type("kubernetes:core/v1:Secret")
    # Each site peers with both MSK VPCs: four peerings, all ingress on the IAM port.
    assert len(run.of_type("aws:ec2/vpcPeeringConnection:VpcPeeringConnection")) == 4
    assert {r.plain["fromPort"] for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")} == {
        9098
    }
    # use1 associates its driver, executor and toolbox accounts; euw1 uses IRSA
    assert len(run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")) == 3
    irsa = run.named("euw1-sa").plain["metadata"]["annotations"]
    assert irsa == {"eks.amazonaws.com/role-arn": "arn:aws:test:::euw1-mirror-role"}


def test_aws_providers_are_named_by_region_and_role_and_keep_their_first_names_as_aliases(stack_runs, set_runs):
    names = {
        stack: {r.name: r.aliases for r in run.of_type("pulumi:providers:aws")} for stack, run in stack_runs.items()
    }
    assert sorted(names["dr-msk-to-eventhubs"]) == [
        "aws-eu-west-1",
        "aws-us-east-1-as-arn-aws-iam-222222222222-role-mirrorkit-deployer",
    ]
    assert sorted(names["active-active"]) == ["aws-eu-west-1", "aws-us-east-1"]
    # Named by call order before: an alias to that name keeps each provider, and every resource on it, in place. In
    # a set's stack, each region's provider is the first its stack made.
    for runs in set_runs.values():
        for stack, run in runs.items():
            for provider in run.of_type("pulumi:providers:aws"):
                first = f'"aws-{provider.plain["region"]}-0"'
                assert any(first in a for a in provider.aliases), (stack, provider.name, provider.aliases)
    # A topology deployed whole in one stack, as the first releases shipped it, keeps its providers too: the MSK
    # cluster's (through its account's role) came first, then the site's.
    whole = run_values(with_secrets(topology_values("dr-msk-to-eventhubs")), stack="dr-msk-to-eventhubs")
    dr = {r.name: r.aliases for r in whole.of_type("pulumi:providers:aws")}
    assert any(
        '"aws-us-east-1-0"' in a for a in dr["aws-us-east-1-as-arn-aws-iam-222222222222-role-mirrorkit-deployer"]
    )
    assert any('"aws-eu-west-1-1"' in a for a in dr["aws-eu-west-1"])


def test_what_was_named_for_the_one_service_account_of_the_first_releases_keeps_that_name_as_an_alias(stack_runs):
    # The driver's account had these before the executors got one of their own: an alias keeps them in place.
    run = stack_runs["active-active"]
    association = run.named("use1-mirror-pod-identity-mirrorkit")
    assert any('"use1-mirror-pod-identity"' in a for a in association.aliases)
    assert not run.named("use1-mirror-pod-identity-mirrorkit-executor").aliases
    values = copy.deepcopy(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml")))
    values["mirrorkit:clusters"][1]["eventhubs"]["disable_local_auth"] = True
    values["mirrorkit:sites"][0]["azure"] = {"oidc_issuer_url": "https://oidc.eks.eu-west-1.amazonaws.com/id/X"}
    federation = run_values(values).named("euw1-entra-federation-mirrorkit")
    assert any('"euw1-entra-federation"' in a for a in federation.aliases)


def test_hybrid_on_prem_to_msk(stack_runs):
    run = stack_runs["onprem-to-msk"]
    assert not run.of_type("aws:ec2/vpcPeeringConnection:VpcPeeringConnection")  # MSK shares the site's VPC
    (rule,) = run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert (rule.plain["fromPort"], rule.plain["cidrIpv4"]) == (9096, "10.30.0.0/16")
    assert "kubernetes:helm.sh/v4:Chart" not in types(run)
    assert sorted(s.plain["metadata"]["name"] for s in run.of_type("kubernetes:core/v1:Secret")) == [
        "mirrorkit-aws",
        "mirrorkit-dc1",
    ]
    egress = run.named("euw1-mirror").plain["spec"]["egress"]
    assert {p["port"] for rule in egress for p in rule.get("ports", [])} == {53, 443, 6443, 9093, 9096}
    config = yaml.safe_load(run.result["configs"]["euw1"])
    dc1, msk = config["clusters"]
    assert (dc1["profile"], dc1["client_key"]["file"]) == ("mtls", "/etc/mirrorkit/secrets/dc1/client_key")
    assert msk["bootstrap_servers"] == BOOTSTRAPS["bootstrapBrokersSaslScram"]
    assert config["flows"][0]["topics"] == {"include": ["orders.*", "payments"], "exclude": ["orders\\.tmp.*"]}


def test_active_passive_into_an_entra_only_namespace_uses_workload_identity():
    values = copy.deepcopy(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml")))
    values["mirrorkit:clusters"][1]["eventhubs"]["disable_local_auth"] = True
    values["mirrorkit:sites"][0]["azure"] = {"oidc_issuer_url": "https://oidc.eks.eu-west-1.amazonaws.com/id/X"}
    run = run_values(values)
    dr = yaml.safe_load(run.result["configs"]["euw1"])["clusters"][1]
    assert (dr["profile"], dr["password"]) == ("eventhubs-entra", None)
    assert not run.of_type(f"{EVENTHUB}:NamespaceAuthorizationRule")
    assert [s.plain["metadata"]["name"] for s in run.of_type("kubernetes:core/v1:Secret")] == ["mirrorkit-primary"]
    assert run.named("euw1-entra-federation-mirrorkit").plain["subject"] == (
        "system:serviceaccount:mirrorkit-test:mirrorkit"
    )
    scopes = {r.plain["scope"] for r in run.of_type("azure-native:authorization:RoleAssignment")}
    assert scopes == {"eh-dr-ns-id"}
    annotations = run.named("euw1-sa").plain["metadata"]["annotations"]
    assert annotations == {"azure.workload.identity/client-id": "client-euw1-entra-identity"}
    spec = run.named("mirrorkit-test-euw1-app").plain["spec"]
    for role in ("driver", "executor"):
        assert spec[role]["labels"]["azure.workload.identity/use"] == "true"
    egress = run.named("euw1-mirror").plain["spec"]["egress"]
    assert {"ports": [{"protocol": "TCP", "port": 443}]} in egress  # Entra ID's token endpoint


def test_a_realtime_flow_whose_site_seats_its_tasks_reaches_the_mirrors_config_map():
    values = copy.deepcopy(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "active-active.yaml")))
    values["mirrorkit:flows"][0] |= {"mode": "realtime", "realtime_tasks": 4}  # euw1's 2 executors x 2 cores
    values["mirrorkit:mirror"]["runtime"]["realtime_commit_interval_s"] = 2
    run = run_values(values)
    configs = {
        site: yaml.safe_load(run.named(f"mirrorkit-test-{site}-config").plain["data"]["mirror.yaml"])
        for site in ("euw1", "use1")
    }
    assert [(f["mode"], f["realtime_tasks"]) for f in configs["euw1"]["flows"]] == [("realtime", 4)]
    assert [f["mode"] for f in configs["use1"]["flows"]] == ["throughput"]
    assert {c["realtime_commit_interval_s"] for c in configs.values()} == {2}
