"""Platform semantics the mocks alone do not see: node drains, service accounts, resubmission on a config change,
the order of a first deploy and the protection of DR data. Each test reads what the engine would get."""

from __future__ import annotations

import copy
import hashlib
import json
import runpy

import pulumi
import pytest
import yaml
from kubeflow_spark_api.models import SparkV1beta2SparkApplication

from infra.k8s.mirror_app import MirrorApplication
from infra.settings import load_settings
from policies.rules import iam_grants_no_wildcards
from spark_app.config import ConfigError
from tests.infra.harness import (
    DEPLOYMENTS,
    EVENTHUB,
    ROOT,
    STACKS,
    TOPOLOGY_FILES,
    Run,
    run_pulumi,
    run_values,
    set_config,
    stack_values,
    with_secrets,
)
from tests.infra.test_components import mirror_args

NAMES = DEPLOYMENTS
SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
DR = ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml"


def entra_variant(issuer: str = "https://oidc.eks.eu-west-1.amazonaws.com/id/X", **azure: object) -> Run:
    """The active/passive stack into an Event Hubs namespace with local auth off (Entra ID workload identity)."""
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:clusters"][1]["eventhubs"]["disable_local_auth"] = True
    values["mirrorkit:sites"][0]["azure"] = {"oidc_issuer_url": issuer, **azure}
    return run_values(values, stack="dr-msk-to-eventhubs")


@pytest.mark.parametrize("stack", NAMES)
def test_no_pod_disruption_budget_blocks_a_node_drain(stack, stack_runs):
    # The driver and executors have no owner with /scale, so any maxUnavailable PDB allows 0 disruptions.
    assert stack_runs[stack].of_type("kubernetes:policy/v1:PodDisruptionBudget") == []


@pytest.mark.parametrize("stack", NAMES)
def test_executors_run_as_their_own_service_account_with_no_rbac(stack, stack_runs):
    run = stack_runs[stack]
    accounts = {
        (a.plain["metadata"]["namespace"], a.plain["metadata"]["name"]): a.plain
        for a in run.of_type("kubernetes:core/v1:ServiceAccount")
    }
    bound = {
        (s["namespace"], s["name"])
        for b in run.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
        for s in b.plain["subjects"]
    }
    for app in run.of_type(SPARK_APP):
        spec, namespace = app.plain["spec"], app.plain["metadata"]["namespace"]
        driver = (namespace, spec["driver"]["serviceAccount"])
        executor = (namespace, spec["executor"]["serviceAccount"])
        assert driver != executor and driver in bound and executor not in bound
        assert accounts[executor]["automountServiceAccountToken"] is False
        # Executors run Kafka clients too, so they carry the same cloud identity as the driver.
        assert accounts[executor]["metadata"]["annotations"] == accounts[driver]["metadata"]["annotations"]


def test_executors_and_the_toolbox_get_the_cloud_identity_too():
    """The driver, the executors and the failover toolbox (which signs in as the site's mirror) each have a
    federated credential, and nothing else in the namespace does."""
    run = entra_variant()
    subjects = {r.plain["subject"] for r in run.of_type("azure-native:managedidentity:FederatedIdentityCredential")}
    assert subjects == {
        "system:serviceaccount:mirrorkit-dr-msk-to-eventhubs:mirrorkit",
        "system:serviceaccount:mirrorkit-dr-msk-to-eventhubs:mirrorkit-executor",
        "system:serviceaccount:mirrorkit-dr-msk-to-eventhubs:mirrorkit-toolbox",
    }


def test_image_pull_secrets_reach_the_driver_and_executor_pods_only_when_the_stack_names_them(stack_runs):
    for stack in NAMES:  # none by default
        for app in stack_runs[stack].of_type(SPARK_APP):
            assert "imagePullSecrets" not in app.plain["spec"]
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:mirror"]["image_pull_secrets"] = ["regcred", "mirror-pull"]
    run = run_values(values, stack="dr-msk-to-eventhubs")
    (app,) = run.of_type(SPARK_APP)
    # The operator passes the spec's list to spark-submit as spark.kubernetes.container.image.pullSecrets, which
    # Spark puts on the driver's pod and on every executor pod it makes (v1beta2 has no per-pod field for it).
    assert app.plain["spec"]["imagePullSecrets"] == ["regcred", "mirror-pull"]
    rendered = {k: v for k, v in app.plain.items() if v is not None}
    assert SparkV1beta2SparkApplication.from_dict(rendered).to_dict() == rendered


TOKEN_DIR = "/var/run/secrets/azure/tokens"
TOKEN_VOLUME = {
    "name": "azure-identity-token",
    "projected": {
        "sources": [
            {
                "serviceAccountToken": {
                    "audience": "api://AzureADTokenExchange",
                    "expirationSeconds": 3600,
                    "path": "azure-identity-token",
                }
            }
        ]
    },
}


def test_off_aks_the_pods_get_the_token_and_variables_the_workload_identity_webhook_would_give():
    # An EKS site: Azure's webhook does not run there, so the program mounts the token and sets AZURE_* itself.
    (app,) = entra_variant().of_type(SPARK_APP)
    spec = app.plain["spec"]
    assert TOKEN_VOLUME in spec["volumes"]
    for role in ("driver", "executor"):
        pod = spec[role]
        assert {"name": "azure-identity-token", "mountPath": TOKEN_DIR, "readOnly": True} in pod["volumeMounts"]
        assert {e["name"]: e["value"] for e in pod["env"]} == {
            "AZURE_CLIENT_ID": "client-euw1-entra-identity",
            "AZURE_TENANT_ID": "t",
            "AZURE_FEDERATED_TOKEN_FILE": f"{TOKEN_DIR}/azure-identity-token",
            "AZURE_AUTHORITY_HOST": "https://login.microsoftonline.com/",
        }
    rendered = {k: v for k, v in app.plain.items() if v is not None}
    assert SparkV1beta2SparkApplication.from_dict(rendered).to_dict() == rendered
    # On AKS (its issuer, or `aks: true`) the webhook injects them, so the program leaves the pods alone.
    for run in (entra_variant("https://westeurope.oic.prod-aks.azure.com/tenant/0000/"), entra_variant(aks=True)):
        (app,) = run.of_type(SPARK_APP)
        spec = app.plain["spec"]
        assert [v["name"] for v in spec["volumes"]] == ["config", "scratch", "checkpoints"]
        assert "env" not in spec["driver"] and "env" not in spec["executor"]


def test_up_waits_until_the_operator_reports_the_application_running_and_fails_after_the_timeout():
    """pulumi-kubernetes' await annotations: without them `up` is green while the mirror never starts."""

    async def body():
        MirrorApplication("w", mirror_args(config_yaml="version: 1\n"))
        return {}

    annotations = run_pulumi(body, {}).named("w-app").plain["metadata"]["annotations"]
    assert annotations["pulumi.com/waitFor"] == "jsonpath={.status.applicationState.state}=RUNNING"
    assert int(annotations["pulumi.com/timeoutSeconds"]) > 0


def test_a_config_change_changes_the_spark_application_spec():
    async def body():
        MirrorApplication("a", mirror_args(config_yaml="version: 1\n"))
        MirrorApplication("b", mirror_args(config_yaml="version: 1\n"))
        MirrorApplication("c", mirror_args(config_yaml="version: 1\nflows: []\n"))
        return {}

    run = run_pulumi(body, {})
    annotations = {n: run.named(f"{n}-app").plain["spec"]["driver"]["annotations"] for n in "abc"}
    hashes = {n: found["mirrorkit.io/config-sha256"] for n, found in annotations.items()}
    assert hashes["a"] == hashes["b"] == hashlib.sha256(b"version: 1\n").hexdigest() != hashes["c"]


def urn_of(run: Run, typ: str) -> set[str]:
    return {r.urn for r in run.of_type(typ)}


def test_the_spark_application_waits_for_the_operator_and_the_pod_identity(stack_runs):
    # A stack that installs the operator itself (no platform stack on its cluster) waits for the chart.
    values = copy.deepcopy(with_secrets(stack_values(DR))) | {"mirrorkit:sparkOperator": True}
    del values["mirrorkit:sites"][0]["platform"]
    own = run_values(values)
    charts = urn_of(own, "kubernetes:helm.sh/v4:Chart")
    (app,) = own.of_type(SPARK_APP)
    assert charts and charts & set(app.dependencies)
    # The shipped stacks install none: each site's platform stack says it acts in the mirror's namespace.
    for stack in ("dr-msk-to-eventhubs", "active-active"):
        run = stack_runs[stack]
        assert not run.of_type("kubernetes:helm.sh/v4:Chart")
        platforms = {k: v for k, v in run.result["exports"].values.items() if k.startswith("platform_")}
        assert platforms == {f"platform_{s}": f"platform-eks-{s}" for s in run.result["configs"]}
    run = stack_runs["active-active"]
    (app,) = [a for a in run.of_type(SPARK_APP) if a.name == "mirrorkit-active-active-use1-app"]
    association = urn_of(run, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
    assert association and association <= set(app.dependencies)
    policies = urn_of(run, "aws:iam/rolePolicy:RolePolicy")
    assert any(p in app.dependencies for p in policies)


def test_the_spark_application_waits_for_its_role_assignments():
    run = entra_variant()
    assignments = urn_of(run, "azure-native:authorization:RoleAssignment")
    (app,) = run.of_type(SPARK_APP)
    assert assignments and assignments <= set(app.dependencies)


ONPREM = ROOT / "stacks" / "Pulumi.onprem-to-msk.yaml"
POD_IDENTITY_AGENT = [{"ipBlock": {"cidr": "169.254.170.23/32"}}, {"ipBlock": {"cidr": "fd00:ec2::23/128"}}]


def opens_the_pod_identity_agent(run: Run) -> dict[str, bool]:
    """Site -> whether its mirror's NetworkPolicy lets pods reach the node's EKS Pod Identity agent on port 80."""
    found = {}
    for policy in run.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy"):
        if policy.name.endswith("-mirror"):
            found[policy.name.removesuffix("-mirror")] = any(
                rule.get("to") == POD_IDENTITY_AGENT and rule.get("ports") == [{"protocol": "TCP", "port": 80}]
                for rule in policy.plain["spec"]["egress"]
            )
    return found


def test_the_pod_identity_agent_is_open_wherever_pods_get_aws_credentials_from_it(stack_runs):
    # IAM-auth MSK at use1 (Pod Identity); euw1 signs in through IRSA (STS over HTTPS) and never asks the agent.
    assert opens_the_pod_identity_agent(stack_runs["active-active"]) == {"use1": True, "euw1": False}
    # SCRAM to MSK and checkpoints on a PVC: no AWS credentials at all.
    assert opens_the_pod_identity_agent(stack_runs["onprem-to-msk"]) == {"euw1": False}
    # The same site with s3a:// checkpoints: Hadoop's s3a asks the agent for the role's credentials.
    values = copy.deepcopy(with_secrets(stack_values(ONPREM)))
    values["mirrorkit:mirror"]["checkpoint"] = {"url": "s3a://mirrorkit-checkpoints-example/onprem"}
    run = run_values(values, stack="onprem-to-msk")
    assert opens_the_pod_identity_agent(run) == {"euw1": True}
    assert run.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")


HOLDERS = (  # what holds DR data, or other stacks' access to it
    f"{EVENTHUB}:Namespace",
    "azure-native:resources:ResourceGroup",
    "kubernetes:core/v1:PersistentVolumeClaim",
    "aws:msk/clusterPolicy:ClusterPolicy",
)


def test_dr_data_is_protected_and_kept_and_a_topic_dropped_from_a_flow_leaves_its_hub_without_wedging(stack_runs):
    run = stack_runs["dr-msk-to-eventhubs"]
    values = copy.deepcopy(with_secrets(stack_values(ROOT / "stacks" / "topologies" / "active-active.yaml")))
    values["mirrorkit:clusters"][0]["msk"]["cluster_arn"] = values["mirrorkit:clusters"][0]["msk"][
        "cluster_arn"
    ].replace("111111111111", "222222222222")
    values["mirrorkit:clusters"][0]["msk"]["role_arn"] = "arn:aws:iam::222222222222:role/deployer"
    cross_account = run_values(values)  # its cluster policy
    for typ in HOLDERS:
        found = run.of_type(typ) + cross_account.of_type(typ)
        assert found and all(r.protect and r.retain_on_delete for r in found), typ
    # A hub is kept, not protected: dropping its topic from a flow forgets it and leaves its data in Azure, where a
    # protected hub would fail every later update.
    hubs = run.of_type(f"{EVENTHUB}:EventHub")
    assert hubs and all(h.retain_on_delete and not h.protect for h in hubs)


def test_data_can_be_left_unprotected_only_when_the_stack_says_so():
    values = copy.deepcopy(with_secrets(stack_values(DR))) | {"mirrorkit:protectData": "false"}
    run = run_values(values)
    kept = [r for r in run.resources if r.protect or r.retain_on_delete]
    assert run.of_type(f"{EVENTHUB}:EventHub") and kept == []


def kubernetes_identities(run: Run) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of every Kubernetes object, and each Helm release with its namespace."""
    out = set()
    for r in run.resources:
        if r.typ == "kubernetes:helm.sh/v4:Chart":
            out.add(("helm-release", r.plain["namespace"], r.plain["name"]))
        elif r.typ.startswith("kubernetes:") and "providers" not in r.typ:
            meta = r.plain["metadata"]
            out.add((r.typ.rsplit(":", 1)[1], meta.get("namespace", ""), meta["name"]))
    return out


@pytest.mark.parametrize("path", [*STACKS, *TOPOLOGY_FILES], ids=NAMES)
def test_two_stacks_on_one_cluster_share_no_kubernetes_object_or_checkpoint(path):
    values = with_secrets(stack_values(path))
    blue, green = run_values(values, stack="blue"), run_values(values, stack="green")
    assert kubernetes_identities(blue) and not kubernetes_identities(blue) & kubernetes_identities(green)
    for site, config in blue.result["configs"].items():  # a PVC path is in the stack's own namespace, shown above
        places = {f["checkpoint_location"] for f in yaml.safe_load(config)["flows"]}
        others = {f["checkpoint_location"] for f in yaml.safe_load(green.result["configs"][site])["flows"]}
        assert all(p.startswith("/checkpoints/") for p in places & others)
    for run, stack in ((blue, "blue"), (green, "green")):
        (namespace,) = {n.plain["metadata"]["name"] for n in run.of_type("kubernetes:core/v1:Namespace")} - {
            f"spark-operator-{stack}"
        }
        assert namespace == f"mirrorkit-{stack}"


PEERINGS = "aws:ec2/getVpcPeeringConnections:getVpcPeeringConnections"


PEERING_BY_ID = "aws:ec2/getVpcPeeringConnection:getVpcPeeringConnection"
REACH_TYPES = (
    "aws:ec2/vpcPeeringConnection:VpcPeeringConnection",
    "aws:ec2/vpcPeeringConnectionAccepter:VpcPeeringConnectionAccepter",
    "aws:ec2/route:Route",
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
)


def test_a_second_tenant_on_the_same_vpcs_reuses_the_first_ones_peering_and_makes_no_reach_of_its_own():
    """AWS allows one peering per pair of VPCs: a second deployment between the same site VPC and MSK VPC names the
    first one's peering (`sites[].aws.peerings`), whose routes and ingress rule from the site's CIDR serve it too."""
    site_vpc, msk_vpc = "vpc-0a1b2c3d4e5f60003", "vpc-0f1e2d3c4b5a60001"
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:sites"][0]["aws"]["peerings"] = {msk_vpc: "pcx-0f1a57"}
    others = {PEERINGS: {"ids": ["pcx-0f1a57"], "id": "x"}}  # the first tenant's, untagged with this stack

    def peering(status: str, vpcs: tuple[str, str]):
        return {PEERING_BY_ID: {"id": "pcx-0f1a57", "status": status, "vpcId": vpcs[0], "peerVpcId": vpcs[1]}}

    run = run_values(values, stack="tenant-two", calls=others | peering("active", (site_vpc, msk_vpc)))
    assert [r.typ for r in run.resources if r.typ in REACH_TYPES] == []
    (reach,) = [r for r in run.resources if r.typ == "mirrorkit:aws:MskReach"]
    assert run.result["configs"], "the tenant's mirror is rendered"
    with pytest.raises(
        Exception, match=r"mirrorkit:sites\[0\]\.aws\.peerings\.vpc-0f1e2d3c4b5a60001: pcx-0f1a57 joins"
    ):
        run_values(values, stack="tenant-two", calls=others | peering("active", (site_vpc, "vpc-0somewhere")))
    with pytest.raises(Exception, match=r"pcx-0f1a57 is pending-acceptance, not active"):
        run_values(values, stack="tenant-two", calls=others | peering("pending-acceptance", (msk_vpc, site_vpc)))
    assert reach


def test_a_peering_another_stack_made_for_the_same_vpcs_is_refused_at_preview():
    def peerings(args):  # another stack's peering joins the same VPCs; it carries not our stack's tag
        tagged = any(f["name"].startswith("tag:") for f in args.get("filters", []))
        return {"ids": [] if tagged else ["pcx-0other"], "id": "x"}

    values = with_secrets(stack_values(DR))
    with pytest.raises(Exception, match=r"pcx-0other already joins vpc-0a1b2c3d4e5f60003 and vpc-0f1e2d3c4b5a60001"):
        run_values(values, calls={PEERINGS: peerings})
    # Its own peering, on a later preview, is no overlap.
    run_values(values, calls={PEERINGS: {"ids": ["pcx-0ours"], "id": "x"}})


ACTIVE_ACTIVE = ROOT / "stacks" / "topologies" / "active-active.yaml"


def test_a_route_another_stack_has_in_a_site_table_is_refused_at_preview_naming_both_keys():
    # active-active is up: its euw1 table routes its eu MSK VPC's 10.40.0.0/16 through its peering.
    up = stack_runs_of(ACTIVE_ACTIVE)
    (theirs,) = [
        r.plain
        for r in up.of_type("aws:ec2/route:Route")
        if r.plain["routeTableId"] == "rtb-0a1b2c3d4e5f60003" and r.plain["destinationCidrBlock"] == "10.40.0.0/16"
    ]
    routes = {
        "rtb-0a1b2c3d4e5f60003": [{"cidrBlock": theirs["destinationCidrBlock"], "vpcPeeringConnectionId": "pcx-0aa"}]
    }
    calls = {"aws:ec2/getRouteTable:getRouteTable": lambda args: {"routes": routes.get(args["routeTableId"], [])}}
    # dr-msk-to-eventhubs, its mirror at the same site VPC, peered with an MSK VPC of the same CIDR.
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:clusters"][0]["msk"]["cidr"] = theirs["destinationCidrBlock"]
    with pytest.raises(Exception) as refused:
        run_values(values, calls=calls)
    message = str(refused.value)
    assert "mirrorkit:clusters[0].msk.cidr: route table rtb-0a1b2c3d4e5f60003 already routes 10.40.0.0/16" in message
    assert "through pcx-0aa" in message and "mirrorkit:sites[0].aws.route_table_ids" in message
    # As shipped now, its MSK VPC's CIDR is apart, and both stacks come up.
    run_values(with_secrets(stack_values(DR)), calls=calls)


def stack_runs_of(path):
    return run_values(with_secrets(stack_values(path)), stack=path.name.split(".")[1])


CLUSTER_POLICY = "aws:msk/clusterPolicy:ClusterPolicy"


def test_an_idempotent_producer_may_write_to_every_iam_cluster_it_writes_to(stack_runs):
    run = stack_runs["active-active"]
    policies = [
        json.loads(p.plain["policy"]) for p in run.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-kafka")
    ]
    assert policies
    for policy in policies:
        on_clusters = [s for s in policy["Statement"] if all(":cluster/" in r for r in s["Resource"])]
        assert on_clusters and all("kafka-cluster:WriteDataIdempotently" in s["Action"] for s in on_clusters)


def cross_account(role_arn: str | None) -> dict:
    """Active/active with the eu cluster in another account than the sites' roles."""
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))
    eu = values["mirrorkit:clusters"][1]["msk"]
    eu["cluster_arn"] = eu["cluster_arn"].replace(":111111111111:", ":222222222222:")
    if role_arn:
        eu["role_arn"] = role_arn
    return values


def test_a_cross_account_iam_cluster_gets_a_cluster_policy_for_the_mirror_roles():
    run = run_values(cross_account("arn:aws:iam::222222222222:role/deployer"), stack="active-active")
    (policy,) = run.of_type(CLUSTER_POLICY)
    assert policy.plain["clusterArn"].startswith("arn:aws:kafka:eu-west-1:222222222222:cluster/")
    document = json.loads(policy.plain["policy"])
    principals = {s["Principal"]["AWS"] for s in document["Statement"]}
    assert principals == {"arn:aws:test:::use1-mirror-role", "arn:aws:test:::euw1-mirror-role"}
    assert all(
        r.startswith("arn:aws:kafka:eu-west-1:222222222222:") for s in document["Statement"] for r in s["Resource"]
    )
    writes = [s for s in document["Statement"] if "kafka-cluster:WriteDataIdempotently" in s["Action"]]
    assert writes  # the resource policy must allow what the role policy allows
    # Set in the cluster's account, through the provider that assumes the stack's role there.
    (provider,) = [p for p in run.of_type("pulumi:providers:aws") if f"::{p.name}::" in policy.provider]
    assert json.loads(provider.plain["assumeRoles"]) == [{"roleArn": "arn:aws:iam::222222222222:role/deployer"}]
    apps = run.of_type(SPARK_APP)
    assert all(policy.urn in app.dependencies for app in apps)


def test_a_cross_account_iam_cluster_with_no_role_to_set_its_policy_is_refused():
    values = cross_account(None)
    set_config(values)
    with pytest.raises(ConfigError, match=r"clusters\[1\]\.msk\.role_arn: missing; .*ClusterPolicy"):
        load_settings()


EU_CLUSTER = "arn:aws:kafka:eu-west-1:222222222222:cluster/events-eu/0b0b0b0b-1111-2222-3333-444455556666-1"
KEPT = {  # the platform team's: another account's multi-VPC connectivity to the cluster
    "Sid": "PlatformMultiVpc",
    "Effect": "Allow",
    "Principal": {"AWS": ["arn:aws:iam::333333333333:root"]},
    "Action": ["kafka:CreateVpcConnection", "kafka:DescribeClusterV2", "kafka:GetBootstrapBrokers"],
    "Resource": EU_CLUSTER,
}


def keeping(*statements: dict) -> dict:
    values = cross_account("arn:aws:iam::222222222222:role/deployer")
    values["mirrorkit:clusters"][1]["msk"]["cluster_policy_statements"] = list(statements)
    return values


def test_a_cluster_policy_keeps_the_statements_its_stack_names_beside_the_mirror_roles_grants():
    run = run_values(keeping(KEPT, KEPT | {"Sid": "PlatformDeny", "Effect": "Deny", "Action": "kafka:*"}))
    (policy,) = run.of_type(CLUSTER_POLICY)
    statements = json.loads(policy.plain["policy"])["Statement"]
    assert statements[:2] == [KEPT, KEPT | {"Sid": "PlatformDeny", "Effect": "Deny", "Action": "kafka:*"}]
    principals = {s["Principal"]["AWS"] for s in statements[2:]}
    assert principals == {"arn:aws:test:::use1-mirror-role", "arn:aws:test:::euw1-mirror-role"}
    sids = [s["Sid"] for s in statements]
    assert len(set(sids)) == len(sids) == len(statements)
    assert iam_grants_no_wildcards(CLUSTER_POLICY, policy.plain) == []


@pytest.mark.parametrize(
    ("statement", "refused"),
    [
        (
            {k: v for k, v in KEPT.items() if k != "Principal"},
            r"cluster_policy_statements\[0\]\.Principal: Field required",
        ),
        (KEPT | {"Action": ["kafka:*"]}, r"cluster_policy_statements\[0\]\.Action: .*wildcard"),
        (KEPT | {"Resource": "*"}, r"cluster_policy_statements\[0\]\.Resource: .*wildcard"),
        (KEPT | {"Principal": {"AWS": "*"}}, r"cluster_policy_statements\[0\]\.Principal: .*wildcard"),
        (KEPT | {"Sid": "Mirrorkit0"}, r"cluster_policy_statements\[0\]\.Sid: 'Mirrorkit0' .*the program's"),
    ],
)
def test_a_kept_cluster_policy_statement_that_is_incomplete_wide_open_or_takes_the_programs_sid_is_refused(
    statement, refused
):
    set_config(keeping(statement))
    with pytest.raises(ConfigError, match=rf"mirrorkit:clusters\[1\]\.msk\.{refused}"):
        load_settings()


def test_two_kept_cluster_policy_statements_with_one_sid_are_refused_naming_the_second():
    set_config(keeping(KEPT, KEPT | {"Action": "kafka:GetBootstrapBrokers"}))
    with pytest.raises(
        ConfigError,
        match=r"mirrorkit:clusters\[1\]\.msk\.cluster_policy_statements\[1\]\.Sid: 'PlatformMultiVpc' .*\[0\]",
    ):
        load_settings()


def test_kept_statements_on_a_cluster_whose_policy_the_program_does_not_write_are_refused():
    values = copy.deepcopy(with_secrets(stack_values(ACTIVE_ACTIVE)))  # the eu cluster is in the roles' account
    values["mirrorkit:clusters"][1]["msk"]["cluster_policy_statements"] = [KEPT]
    set_config(values)
    with pytest.raises(ConfigError, match=r"mirrorkit:clusters\[1\]\.msk\.cluster_policy_statements: .*writes no"):
        load_settings()


GEO_DR = {"alias": "mirrorkit-dr", "partner_namespace_id": "/subscriptions/s/ns/partner"}


def test_with_geo_dr_the_mirror_connects_through_the_alias():
    values = copy.deepcopy(with_secrets(stack_values(DR)))
    values["mirrorkit:clusters"][1]["eventhubs"]["geo_dr"] = GEO_DR
    alias_string = "Endpoint=sb://mirrorkit-dr.servicebus.windows.net/;SharedAccessKeyName=mirrorkit;SharedAccessKey=k"
    run = run_values(
        values, calls={f"{EVENTHUB}:listDisasterRecoveryConfigKeys": {"aliasPrimaryConnectionString": alias_string}}
    )
    dr = yaml.safe_load(run.result["configs"]["euw1"])["clusters"][1]
    assert dr["bootstrap_servers"] == "mirrorkit-dr.servicebus.windows.net:9093"
    secret = run.named("euw1-dr")  # the Kubernetes Secret the mirror reads its password from
    assert secret.plain["stringData"]["password"] == alias_string


def test_no_connection_string_is_a_stack_output(monkeypatch):
    exported: dict[str, object] = {}
    monkeypatch.setattr(pulumi, "export", lambda name, value: exported.__setitem__(name, value))

    async def body():
        runpy.run_path(str(ROOT / "__main__.py"))
        return {}

    run_pulumi(body, with_secrets(stack_values(DR)))
    assert exported and not [name for name in exported if "connection" in name]
