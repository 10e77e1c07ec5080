"""Invariants every stack keeps, checked over what the whole program registered under mocks."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubeflow_spark_api.models import SparkV1beta2SparkApplication

from infra.schema import MSK_PORTS
from policies.rules import OPTIONS_RULES, RULES, spark_application_is_complete
from spark_app.cli import main as cli_main
from spark_app.copy_wing.choice import Core
from tests.infra.harness import CONNECTION_STRING, DEPLOYMENTS, EVENTHUB, Run, is_secret, sentinel

KUBERNETES_VERSION = "1.33.0"  # the oldest release the kit supports; its OpenAPI schemas ship with kubernetes-validate
NAMES = DEPLOYMENTS
CRDS = ("sparkoperator.k8s.io", "monitoring.coreos.com", "helm.sh")
SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"

pytestmark = pytest.mark.parametrize("stack", NAMES)


def credentials(run: Run) -> list[str]:
    """Every credential value this run handled: the stack's secrets and the Event Hubs connection string."""
    values = [CONNECTION_STRING] if run.result["topology"].event_hubs else []
    return values + [
        sentinel(alias, key)
        for alias, files in run.result["topology"].credentials.items()
        for key in files
        if alias not in run.result["topology"].event_hubs
    ]


def manifest(resource) -> dict[str, Any]:
    return {k: v for k, v in resource.plain.items() if v is not None}


def kubernetes_objects(run: Run):
    return [r for r in run.resources if r.typ.startswith("kubernetes:") and "providers" not in r.typ]


def test_every_credential_is_a_secret_output_and_in_no_config_map(stack, stack_runs):
    run = stack_runs[stack]
    assert all(run.result["credential_is_secret"].values())  # an IAM-only stack has none
    config_maps = run.of_type("kubernetes:core/v1:ConfigMap")
    assert config_maps
    for config_map in config_maps:
        text = repr(config_map.plain)
        assert not any(is_secret(v) for v in config_map.inputs.values())
        assert not [c for c in credentials(run) if c in text]
    for secret in run.of_type("kubernetes:core/v1:Secret"):
        data = secret.inputs["stringData"]
        assert is_secret(data) or all(is_secret(v) for v in data.values()), secret.name
    for version in run.of_type("aws:secretsmanager/secretVersion:SecretVersion"):
        assert is_secret(version.inputs["secretString"])


def test_credentials_reach_the_mirror_only_as_mounted_files(stack, stack_runs):
    run = stack_runs[stack]
    for site, text in run.result["configs"].items():
        config = yaml.safe_load(text)
        for cluster in config["clusters"]:
            for key in ("password", "client_key"):
                ref = cluster[key]
                assert ref is None or (
                    ref["env"] is None and ref["file"].startswith(f"/etc/mirrorkit/secrets/{cluster['alias']}/")
                )
        secrets = run.named(f"mirrorkit-{stack}-{site}-app").plain["spec"]["driver"]["secrets"]
        mounted = {s["path"].rsplit("/", 1)[1] for s in secrets}
        assert mounted == {c["alias"] for c in config["clusters"] if c["password"] or c["client_key"]}


def test_each_event_hub_has_at_least_its_source_topics_partitions(stack, stack_runs):
    run = stack_runs[stack]
    settings_sources = {
        (f"{c.alias}{'.'}{t}"): spec.partitions
        for c in run.result["settings"].model.clusters
        for t, spec in c.source_topic_sizes.items()
    }
    hubs = run.of_type(f"{EVENTHUB}:EventHub")
    assert bool(hubs) == bool(run.result["topology"].event_hubs)
    for hub in hubs:
        name, partitions = hub.plain["eventHubName"], hub.plain["partitionCount"]
        assert partitions >= settings_sources.get(name, 1), name
    sized = [h for h in hubs if h.plain["eventHubName"] in settings_sources]
    assert bool(sized) == bool(hubs)  # the check above compared real source sizes, not only the default of 1


def test_security_group_rules_open_only_the_auth_port_from_the_peer(stack, stack_runs):
    run = stack_runs[stack]
    settings = run.result["settings"]
    site_cidrs = {s.aws.cidr for s in settings.model.sites if s.aws}
    ports_by_sg = {c.msk.security_group_id: c.msk.port for c in settings.model.clusters if c.msk}
    rules = run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert bool(rules) == bool(ports_by_sg)
    for rule in rules:
        p = rule.plain
        assert p["fromPort"] == p["toPort"] == ports_by_sg[p["securityGroupId"]] in MSK_PORTS.values()
        assert p["cidrIpv4"] in site_cidrs and p["ipProtocol"] == "tcp"
    assert not run.of_type("aws:ec2/securityGroupRule:SecurityGroupRule")
    assert not run.of_type("aws:ec2/securityGroup:SecurityGroup")


def test_rbac_grants_nothing_cluster_wide(stack, stack_runs):
    run = stack_runs[stack]
    assert not [r for r in run.resources if r.typ.split(":")[-1] in ("ClusterRole", "ClusterRoleBinding")]
    bindings = run.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    roles = run.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    # Per site: the driver's Role, and the toolbox's on the profile's ConfigMap (infra.k8s.toolbox).
    assert len(bindings) == len(roles) == 2 * len(run.result["topology"].namespaces) > 0
    for binding in bindings:
        assert binding.plain["roleRef"]["kind"] == "Role"
    for role in roles:
        assert {res for rule in role.plain["rules"] for res in rule["resources"]} <= {
            "pods",
            "services",
            "configmaps",
            "persistentvolumeclaims",
        }


def test_every_kubernetes_object_validates_against_the_pinned_schemas(stack, stack_runs):
    built_in = [r for r in kubernetes_objects(stack_runs[stack]) if not any(g in r.typ for g in CRDS)]
    assert built_in
    for resource in built_in:
        kubernetes_validate.validate(manifest(resource), KUBERNETES_VERSION, strict=True)


def test_the_spark_application_round_trips_through_the_operator_models(stack, stack_runs):
    apps = stack_runs[stack].of_type(SPARK_APP)
    assert apps
    for app in apps:
        rendered = manifest(app)
        model = SparkV1beta2SparkApplication.from_dict(rendered)
        assert model.to_dict() == rendered
        assert spark_application_is_complete(app.typ, rendered) == []


def test_the_policy_pack_passes_on_everything_registered(stack, stack_runs):
    run = stack_runs[stack]
    assert len(run.resources) > 10
    violations = [
        f"{r.name}: {name}: {message}"
        for r in run.resources
        for name, (rule, _) in RULES.items()
        for message in rule(r.typ, r.plain, r.urn)
    ]
    violations += [
        f"{r.name}: {name}: {message}"
        for r in run.resources
        for name, (options_rule, _) in OPTIONS_RULES.items()
        for message in options_rule(r.typ, r.plain, r.protect)
    ]
    assert violations == []


def test_each_mirror_runs_in_the_region_of_the_flows_it_owns(stack, stack_runs):
    settings = stack_runs[stack].result["settings"]
    for flow in settings.mirror_config.flows:
        site = settings.site(settings.site_of_flow[flow.name])
        assert site.region == settings.cluster(flow.target).region or flow.name in settings.model.placement


def test_describe_offline_says_which_core_copies_each_rendered_flow_and_why(stack, stack_runs, tmp_path, capsys):
    """What an operator reads before a deploy (`mirrorkit describe --offline` on the ConfigMap's config): per flow,
    the core and the reason, from the rendered config alone (no cluster, no mounted secret)."""
    run = stack_runs[stack]
    for site, text in run.result["configs"].items():
        path = tmp_path / f"{site}.yaml"
        path.write_text(text)
        assert cli_main(["describe", "--config", str(path), "--offline"]) == 0
        described = json.loads(capsys.readouterr().out)
        rendered = [f"{f['source']}->{f['target']}" for f in yaml.safe_load(text)["flows"]]
        assert [f["flow"] for f in described["flows"]] == rendered
        for flow in described["flows"]:
            copy = flow["copy"]
            assert copy["core"] in {c.value for c in Core} and copy["reason"], flow
            with capsys.disabled():  # the figures, for the log of a run
                print(f"{stack} {site} {flow['flow']}: {copy['copies']} -> {copy['core']} ({copy['reason']})")
