"""Each region deploys and recovers on its own: the shipped sets of stacks come up in the order
docs/deploy/regions.md gives, each reading the others only through their stack outputs, and with one region down
the other region's stacks still preview and update."""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

import pulumi
import pytest
import yaml

import tests.infra.harness as harness
from infra.aws.network import STACK_TAG
from infra.naming import SECRETS_DIR
from infra.parts import Part
from spark_app import clients
from spark_app.config import ClusterConfig, FlowConfig, MirrorConfig, parse_config
from spark_app.dr.views import failover_plan
from tests.infra.harness import (
    PART_STACKS,
    ROOT,
    SETS,
    STACK_FILES,
    STACKS,
    TOPOLOGY_FILES,
    Answer,
    Exports,
    RegionDown,
    Run,
    a_set_is_up,
    order_of_up,
    part_values,
    run_values,
    stack_name,
    stack_values,
    topology_settings,
    topology_values,
    up,
    with_secrets,
)

SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
ROUTE_TABLE = "aws:ec2/getRouteTable:getRouteTable"
PEERINGS = "aws:ec2/getVpcPeeringConnections:getVpcPeeringConnections"
PEERING = "aws:ec2/vpcPeeringConnection:VpcPeeringConnection"
SECRET = "kubernetes:core/v1:Secret"
MONITORING = ("kubernetes:monitoring.coreos.com/v1:PodMonitor", "kubernetes:monitoring.coreos.com/v1:PrometheusRule")


def one_stack(topology: str) -> dict[str, Any]:
    """A stack written by hand to deploy a set's whole topology in one stack (the kit ships none): its keys, and the
    secrets of its clusters."""
    return with_secrets(topology_values(topology))


@pytest.mark.parametrize("topology", SETS)
def test_a_set_renders_the_mirror_the_one_stack_renders_reading_other_stacks_only_through_outputs(topology):
    whole = run_values(one_stack(topology), stack=topology)
    _, runs = a_set_is_up(topology)
    for site, config in whole.result["configs"].items():
        assert runs[f"{topology}-site-{site}"].result["configs"] == {site: config}

    # Every cloud and Kubernetes resource of the one stack is made by exactly one stack of the set.
    def made(run: Run) -> list[tuple[str, str]]:
        return sorted((r.typ, r.name) for r in run.resources if not r.typ.startswith(("pulumi:", "mirrorkit:")))

    in_set = {x for stack, run in runs.items() if not stack.startswith("platform-") for x in made(run)}
    assert sorted(in_set) == made(whole)
    # A site's stack reads only its own clusters' parts and its platform: no other site, so no other region.
    for stack, run in runs.items():
        read = sorted(r.inputs["name"].rsplit("/", 1)[1] for r in run.of_type("pulumi:pulumi:StackReference"))
        settings = run.result.get("settings")
        expected = [] if settings is None else sorted(p.stack(topology) for p in settings.references(settings.part))
        assert read == expected, stack


def survivors(topology: str, region: str) -> list[str]:
    """The stacks of a set whose parts are outside `region`: the platforms, clusters and sites there."""
    whole = topology_settings(topology)
    model = whole.model
    where = {Part("site", s.name): s.region for s in model.sites}
    where |= {Part("platform", s.platform): s.region for s in model.sites if s.platform}
    where |= {Part(k, c.alias): c.region for c in model.clusters for k in ("msk", "eventhubs")}
    return [p.stack(topology) for p in whole.parts if where[p] != region]


def where_failover_reads(config: MirrorConfig, flow: FlowConfig, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The clusters `mirrorkit failover` plans from, by alias: its own planning code (spark_app.dr.views) run with
    spark_app's client layer replaced by one that records each cluster asked for and holds nothing."""
    reached: set[str] = set()

    def admin(cluster: ClusterConfig) -> ClusterConfig:
        reached.add(cluster.alias)
        return cluster

    def nothing(*args: Any, **kwargs: Any) -> dict[Any, Any]:
        reached.update(a.alias for a in args if isinstance(a, ClusterConfig))
        return {}

    def no_client(cluster: ClusterConfig, *args: Any) -> None:
        raise AssertionError(f"failover made a client of its own for '{cluster.alias}'")

    monkeypatch.setattr(clients, "admin", admin)
    monkeypatch.setattr(clients, "list_topics", nothing)
    monkeypatch.setattr(clients, "list_offsets", nothing)
    monkeypatch.setattr(clients, "list_offsets_each", lambda *args, **kwargs: ({}, {}))
    monkeypatch.setattr(clients, "_settings", no_client)
    assert failover_plan(config, flow) == []  # it read the checkpoints and offset syncs, and found none
    return reached


@pytest.mark.parametrize(
    ("topology", "region", "kept"),
    [
        ("active-active", "us-east-1", ["platform-eks-euw1", "active-active-msk-eu", "active-active-site-euw1"]),
        ("active-active", "eu-west-1", ["platform-eks-use1", "active-active-msk-us", "active-active-site-use1"]),
        (
            "dr-msk-to-eventhubs",
            "us-east-1",
            ["platform-eks-euw1", "dr-msk-to-eventhubs-eventhubs-dr", "dr-msk-to-eventhubs-site-euw1"],
        ),
        (
            "dr-msk-to-eventhubs",
            "westeurope",
            ["platform-eks-euw1", "dr-msk-to-eventhubs-msk-primary", "dr-msk-to-eventhubs-site-euw1"],
        ),
    ],
)
def test_with_a_region_down_the_other_regions_stacks_preview_and_update(topology, region, kept, monkeypatch):
    assert survivors(topology, region) == kept
    backend, before = a_set_is_up(topology)
    # The lost region's own stacks, and a one-stack deployment written by hand, can neither preview nor update: the
    # test can fail.
    for preview in (True, False):
        for stack in sorted(set(order_of_up(topology)) - set(kept)):
            with pytest.raises(RegionDown):
                up([stack], dict(backend), down=region, preview=preview)
        with pytest.raises(RegionDown):
            run_values(one_stack(topology), stack=topology, down=region, preview=preview)
    (site_stack,) = [s for s in kept if s.startswith(f"{topology}-site-")]
    site = site_stack.rsplit("-", 1)[1]
    settings = before[site_stack].result["settings"]
    # The survivors preview and update unchanged ...
    for preview in (True, False):
        runs = up(kept, dict(backend), down=region, preview=preview)
        assert runs[site_stack].result["configs"] == before[site_stack].result["configs"], preview

    # ... and with the mirror resized, a topic stopped, and every flow whose mirror ran in the lost region stopped.
    values = topology_values(topology)
    ran_there = {
        f.name for f in settings.mirror_config.flows if settings.site(settings.site_of_flow[f.name]).region == region
    }
    flows = [f for f in copy.deepcopy(values["mirrorkit:flows"]) if f"{f['source']}->{f['target']}" not in ran_there]
    for flow in flows:
        flow["topics"]["exclude"] = [*flow["topics"].get("exclude", []), "stopped"]
    mirror = copy.deepcopy(values.get("mirrorkit:mirror", {}))
    mirror["executor"] = dict(mirror.get("executor", {}), instances=3)
    changes = {"mirrorkit:flows": flows, "mirrorkit:mirror": mirror}
    for preview in (True, False):
        runs = up(kept, dict(backend), down=region, preview=preview, **changes)
        (app,) = runs[site_stack].of_type(SPARK_APP)
        (old,) = before[site_stack].of_type(SPARK_APP)
        assert (old.plain["spec"]["executor"]["instances"], app.plain["spec"]["executor"]["instances"]) == (2, 3)
        config = yaml.safe_load(runs[site_stack].result["configs"][site])
        assert all("stopped" in f["topics"]["exclude"] for f in config["flows"]), preview
    # The survivor's own flows stopped (their source, or their target, may be the lost region): the mirror stops,
    # and everything its flows' state lives in or signs in with stays.
    own = [f.name for f in settings.flows_at(site)]
    for preview in (True, False):
        stopped = up([site_stack], dict(backend), down=region, preview=preview, **{"mirrorkit:stopped": own})
        assert site not in stopped[site_stack].result["configs"], preview
        gone = {(r.typ, r.name) for r in before[site_stack].resources} - {
            (r.typ, r.name) for r in stopped[site_stack].resources
        }
        # The SparkApplication, its config and its monitoring; the namespace, identities and checkpoints stay.
        assert {typ for typ, _ in gone} == {SPARK_APP, "kubernetes:core/v1:ConfigMap", *MONITORING}, gone

    # The surviving clusters' parts peer with no site in the lost region any more.
    for stack in [s for s in kept if s.startswith(f"{topology}-msk-")]:
        peered = {p.name.split("-", 1)[0] for p in runs[stack].of_type(PEERING)}
        assert peered and all(settings.site(s).region != region for s in peered), peered

    # The survivor's mirror keeps its checkpoints and state in its own region.
    aws_region = settings.site(site).region
    rendered = parse_config(yaml.safe_load(runs[site_stack].result["configs"][site]), source="rendered")
    checkpoint = settings.model.mirror.checkpoint
    providers = {f"{p.urn}::{p.name}-id": p.plain["region"] for p in before[site_stack].of_type("pulumi:providers:aws")}
    for flow in rendered.flows:
        if checkpoint.scheme == "s3a":
            bucket = checkpoint.bucket_in(aws_region, settings.model.checkpoint_home)
            assert flow.checkpoint_location.startswith(f"s3a://{bucket}/"), flow.checkpoint_location
            (made,) = [b for b in before[site_stack].of_type("aws:s3/bucket:Bucket") if b.plain["bucket"] == bucket]
            assert providers[made.provider or ""] == aws_region
            (app,) = runs[site_stack].of_type(SPARK_APP)
            assert app.plain["spec"]["sparkConf"]["spark.hadoop.fs.s3a.endpoint.region"] == aws_region
        else:  # on the driver's PVC, in the survivor's own Kubernetes cluster
            assert flow.checkpoint_location.startswith("/")

    # Failing over a flow whose target survives plans from its target only, with what its cluster's part (outside
    # the lost region) exports: an MSK target's bootstrap, in the survivor's region; an Event Hubs namespace's, in
    # the Azure region the survivor's site sits near.
    region_of = {c.alias: c.region for c in settings.model.clusters}
    into = [f for f in rendered.flows if region_of[f.target] != region]
    for flow in into:
        assert flow.offset_syncs_location == "target"
        assert where_failover_reads(rendered, flow, monkeypatch) == {flow.target}
        target = rendered.cluster(flow.target)
        if next(c for c in settings.model.clusters if c.alias == flow.target).eventhubs is not None:
            exports = backend[f"{topology}-eventhubs-{flow.target}"].values
            namespace = exports[f"eventhubs_{flow.target}_namespace"]
            assert target.bootstrap_servers == f"{namespace}.servicebus.windows.net:9093"
            # It signs in with the connection string the survivor's site holds in its own namespace's Secret.
            assert target.password is not None and target.password.file == f"{SECRETS_DIR}/{flow.target}/password"
            (secret,) = [s for s in runs[site_stack].of_type(SECRET) if s.name == f"{site}-{flow.target}"]
            assert secret.plain["metadata"]["namespace"] == settings.namespace
            continue
        assert region_of[flow.target] == aws_region
        assert (
            target.bootstrap_servers == backend[f"{topology}-msk-{flow.target}"].values[f"msk_{flow.target}_bootstrap"]
        )
        # It signs in as the site's role (IAM), which the survivor's stack makes on its own region's provider.
        assert target.password is None and target.client_key is None
        roles = before[site_stack].of_type("aws:iam/role:Role")
        assert roles and {providers[r.provider or ""] for r in roles} == {aws_region}
    assert into or region_of[rendered.flows[0].target] == region  # dr-msk-to-eventhubs, westeurope: its DR copy lost


@pytest.mark.parametrize("topology", SETS)
def test_every_call_of_a_sets_stack_reaches_its_parts_region_and_a_peering_its_peers_only_when_made(topology):
    """Where the harness places each call of each stack (with a region no stack uses down): so every call of a
    stack whose region is down fails, however it names its region."""
    settings = topology_settings(topology)
    model = settings.model
    where = {Part("site", s.name): s.region for s in model.sites}
    where |= {Part("platform", s.platform): s.region for s in model.sites if s.platform}
    where |= {Part(k, c.alias): c.region for c in model.clusters for k in ("msk", "eventhubs")}
    backend = {stack_name(p): Exports() for p in PART_STACKS}
    for first in (True, False):
        for part in settings.parts:
            stack = part.stack(topology)
            (run,) = up([stack], backend, down="nowhere-1").values()
            regions = {r for _, r in run.mocks.placed}
            peers = {settings.site(s).region for s in settings.site_of_flow.values()} if part.kind == "msk" else set()
            # A peering's peer region answers its making; once made, a second `up` reaches it no more.
            expected = {where[part]} | (peers if first else set())
            assert where[part] in regions and regions <= expected, (stack, sorted(set(run.mocks.placed)))
            if not first:
                assert regions == {where[part]}, (stack, sorted(set(run.mocks.placed)))
            azure = [c for c, _ in run.mocks.placed if c.startswith("azure-native:")]
            assert bool(azure) == (part.kind == "eventhubs")


def what_aws_holds(runs: dict[str, Run]) -> dict[str, Answer]:
    """AWS's answers to the program's lookups once `runs` are up: each table's routes, and the peerings (their
    requester's tags; the accepter's id is the peering's) that match a lookup's filters."""
    routes: dict[str, list[dict[str, str]]] = {}
    peerings = []
    for run in runs.values():
        for r in run.of_type("aws:ec2/route:Route"):
            route = {
                "cidrBlock": r.plain["destinationCidrBlock"],
                "vpcPeeringConnectionId": r.plain["vpcPeeringConnectionId"],
            }
            routes.setdefault(r.plain["routeTableId"], []).append(route)
        peerings += [
            (f"{r.name}-id", r.plain) for r in run.of_type("aws:ec2/vpcPeeringConnection:VpcPeeringConnection")
        ]

    def matches(peering: dict[str, Any], name: str, values: list[str]) -> bool:
        fields = {"requester-vpc-info.vpc-id": peering["vpcId"], "accepter-vpc-info.vpc-id": peering["peerVpcId"]}
        if name.startswith("tag:"):
            return peering.get("tags", {}).get(name[4:]) in values
        return name == "status-code" or fields[name] in values

    def peerings_matching(args: dict[str, Any]) -> dict[str, Any]:
        found = [i for i, p in peerings if all(matches(p, f["name"], f["values"]) for f in args.get("filters", []))]
        return {"ids": found, "id": "lookup"}

    return {
        ROUTE_TABLE: lambda args: {"routes": routes.get(args["routeTableId"], [])},
        PEERINGS: peerings_matching,
    }


def test_a_second_up_of_every_stack_of_a_set_takes_its_own_routes_and_peerings_for_its_own():
    backend, runs = a_set_is_up("active-active")
    aws = what_aws_holds(runs)
    # use1's table routes the us MSK VPC through the peering that msk-us requested (and tagged) and use1 accepted.
    (route,) = [
        r
        for r in aws[ROUTE_TABLE]({"routeTableId": "rtb-0a1b2c3d4e5f60001"})["routes"]
        if r["cidrBlock"] == "10.20.0.0/16"
    ]
    tagged = {"name": f"tag:{STACK_TAG}", "values": ["active-active-msk-us"]}
    to_use1 = {"name": "accepter-vpc-info.vpc-id", "values": ["vpc-0a1b2c3d4e5f60001"]}
    assert aws[PEERINGS]({"filters": [tagged, to_use1]})["ids"] == [route["vpcPeeringConnectionId"]]
    up(order_of_up("active-active"), backend, calls=aws)


def stacks_table() -> list[tuple[str, str, list[str]]]:
    """The table of each shipped set in docs/deploy/regions.md, in its order: (topology, stack, the stacks it reads)."""
    text = (ROOT / "docs" / "deploy" / "regions.md").read_text()
    section = text.split("<!-- stacks table -->", 2)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|([^|]*)\|$", section, re.M)
    return [(topology, stack, re.findall(r"`([^`]+)`", reads)) for topology, stack, reads in rows]


def test_the_docs_list_each_sets_stacks_in_the_order_of_up_with_what_each_reads():
    expected = []
    for topology in SETS:
        settings = topology_settings(topology)
        expected += [
            (topology, p.stack(topology), [r.stack(topology) for r in settings.references(p)]) for p in settings.parts
        ]
    assert stacks_table() == expected
    listed = {stack for _, stack, _ in expected}
    assert listed == {stack_name(p) for p in PART_STACKS}, "every part stack file is in a shipped set"


NOWHERE = "nowhere-1"  # a region no stack uses: down, it fails nothing, and every call must be placed
# A self-managed cluster's brokers, by bootstrap, and the region its stack places it in (on-prem, that region's
# sites reach it): the Kafka provider that sets its ACLs names no region of its own.
KAFKA_REGIONS = {
    c["kafka"]["bootstrap_servers"]: c["region"]
    for p in [*STACK_FILES, *TOPOLOGY_FILES]
    for c in stack_values(p).get("mirrorkit:clusters", [])
    if "kafka" in c
}


class PlacingKafka(harness.RecordingMocks):
    """The kit's mocks, which also place a Kafka provider (the ACLs of a self-managed cluster) in its cluster's
    region."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        if args.typ == "pulumi:providers:kafka":
            listed = args.inputs["bootstrapServers"]  # a provider's inputs arrive as JSON text
            servers = ",".join(json.loads(listed) if isinstance(listed, str) else listed)
            args.inputs = {**args.inputs, "region": KAFKA_REGIONS[servers]}
        return super().new_resource(args)


@functools.cache
def everything_up() -> dict[str, Exports]:
    """Every shipped stack `up` once against one backend: each set by its parts in the order of up, then each
    single-region topology deployed whole."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "RecordingMocks", PlacingKafka)
        backend = {stack_name(p): Exports() for p in PART_STACKS}
        for topology in SETS:
            up(order_of_up(topology), backend, down=NOWHERE)
        for path in STACKS:
            stack = stack_name(path)
            run = run_values(part_values(stack), stack=stack, stacks=dict(backend), down=NOWHERE)
            backend[stack] = run.result["exports"]
        return backend


@functools.cache
def reach(stack: str) -> frozenset[str]:
    """The regions a deployed stack's preview calls into (a peering's peer only while it is being made, so after
    the first `up` no more)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(harness, "RecordingMocks", PlacingKafka)
        run = run_values(part_values(stack), stack=stack, stacks=dict(everything_up()), down=NOWHERE, preview=True)
    return frozenset(r for _, r in run.mocks.placed)


SHIPPED = [stack_name(p) for p in STACK_FILES]
REGIONS = ("us-east-1", "eu-west-1", "westeurope")


def test_the_region_down_run_covers_every_region_a_shipped_stack_reaches():
    reached = {stack: reach(stack) for stack in SHIPPED}
    assert all(reached.values()) and set().union(*reached.values()) == set(REGIONS), reached


@pytest.mark.parametrize("stack", SHIPPED)
def test_every_shipped_stack_lies_in_one_region_so_with_any_region_down_none_is_stranded(stack, monkeypatch):
    """Under the kit's mocks, with every call into one region failing: every shipped stack file's calls reach one
    region only, so with that region down it fails (the test can fail) and with any other down it previews."""
    backend, reached = everything_up(), reach(stack)
    assert len(reached) == 1, f"{stack} spans {sorted(reached)}: with any of them down it can neither preview nor up"
    monkeypatch.setattr(harness, "RecordingMocks", PlacingKafka)
    for region in REGIONS:
        if region in reached:
            with pytest.raises(RegionDown):
                run_values(part_values(stack), stack=stack, stacks=dict(backend), down=region, preview=True)
        else:
            run_values(part_values(stack), stack=stack, stacks=dict(backend), down=region, preview=True)


@pytest.mark.parametrize("topology", SETS)
def test_a_stack_written_by_hand_across_regions_is_warned_and_stranded_with_any_of_them_down(topology, monkeypatch):
    """The program still deploys a topology whole in one stack, as a user may write it: its preview warns that it is
    not for DR use (naming its regions and the per-region sets' page), and with any of its regions down it fails."""
    monkeypatch.setattr(harness, "RecordingMocks", PlacingKafka)
    warned: list[str] = []
    monkeypatch.setattr("pulumi.log.warn", lambda message, *args, **kwargs: warned.append(message))
    settings = topology_settings(topology)
    regions = sorted({s.region for s in settings.model.sites} | {c.region for c in settings.model.clusters})
    assert len(regions) > 1, regions
    backend = dict(everything_up())  # the stack's first `up`, with every region up
    backend[topology] = run_values(one_stack(topology), stack=topology, stacks=dict(backend), down=NOWHERE).result[
        "exports"
    ]
    for region in regions:
        warned.clear()
        with pytest.raises(RegionDown):
            run_values(one_stack(topology), stack=topology, stacks=dict(backend), down=region, preview=True)
        (warning,) = [w for w in warned if "not for DR use" in w]
        assert f"across {', '.join(regions)}:" in warning and "docs/deploy/regions.md" in warning, warning
        assert "Pulumi." not in warning, "it names no stack file"
    assert (ROOT / "docs" / "deploy" / "regions.md").is_file()
