"""Each region deploys and recovers on its own: the shipped sets of stacks come up in the README's order, each
reading the others only through their stack outputs, and with one region down the other region's stacks still
preview and update."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.aws.network import STACK_TAG
from infra.parts import Part
from tests.infra.harness import (
    PART_STACKS,
    ROOT,
    STACKS,
    Answer,
    Exports,
    Lost,
    RegionDown,
    Run,
    credentials_for,
    run_stack,
    run_values,
    stack_values,
)

SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
SETS = ("active-active", "dr-msk-to-eventhubs")
ROUTE_TABLE = "aws:ec2/getRouteTable:getRouteTable"
PEERINGS = "aws:ec2/getVpcPeeringConnections:getVpcPeeringConnections"


def stack_name(path: Path) -> str:
    return path.name.split(".")[1]


def part_values(stack: str) -> dict[str, Any]:
    """A part's stack config: its own file, and the secrets of its topology's clusters as `config set` holds them."""
    values = stack_values(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    topology = values.get("mirrorkit:topology", stack)
    creds = credentials_for(stack_values(ROOT / "stacks" / f"Pulumi.{topology}.yaml"))
    return values | ({"mirrorkit:credentials": creds} if creds else {})


def order_of_up(topology: str) -> list[str]:
    """The stacks of a set, in the README's order: its parts as infra.parts orders them, then the MSK parts again
    when a cluster policy merges the grants the sites export."""
    settings = run_stack(ROOT / "stacks" / f"Pulumi.{topology}.yaml").result["settings"]
    first = [p.stack(topology) for p in settings.parts]
    again = [p.stack(topology) for p in settings.parts if p.kind == "msk" and settings.references(p)]
    return first + again


def up(
    stacks: list[str],
    backend: dict[str, Exports],
    lost: Lost | None = None,
    calls: dict[str, Answer] | None = None,
    **changes: Any,
) -> dict[str, Run]:
    """`pulumi up` of each stack in turn against one backend, which keeps each stack's outputs for the next; `calls`
    answers the cloud's lookups."""
    runs = {}
    for stack in stacks:
        values = part_values(stack) | changes
        runs[stack] = run = run_values(values, stack=stack, calls=calls, stacks=backend, lost=lost)
        backend[stack] = run.result["exports"]
    return runs


def a_set_is_up(topology: str) -> tuple[dict[str, Exports], dict[str, Run]]:
    backend = {stack_name(p): Exports() for p in PART_STACKS}  # `pulumi stack init` of every stack first
    return backend, up(order_of_up(topology), backend)


def region_down(region: str) -> Lost:
    """Every resource, provider and invoke in `region` fails: an AWS provider's region, an Azure location, or the
    Kubernetes context of a cluster there."""
    contexts = {
        s["context"] for path in STACKS for s in stack_values(path).get("mirrorkit:sites", []) if s["region"] == region
    }

    def lost(inputs: dict[str, Any], provider: dict[str, Any]) -> bool:
        where = {inputs.get("region"), inputs.get("location"), provider.get("region")}
        return region in where or bool({inputs.get("context"), provider.get("context")} & contexts)

    return lost


@pytest.mark.parametrize("topology", SETS)
def test_a_set_renders_the_mirror_the_one_stack_renders_reading_other_stacks_only_through_outputs(topology):
    whole = run_stack(ROOT / "stacks" / f"Pulumi.{topology}.yaml")
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
    whole = run_stack(ROOT / "stacks" / f"Pulumi.{topology}.yaml").result["settings"]
    model = whole.model
    where = {Part("site", s.name): s.region for s in model.sites}
    where |= {Part("platform", s.platform): s.region for s in model.sites if s.platform}
    where |= {Part(k, c.alias): c.region for c in model.clusters for k in ("msk", "eventhubs")}
    return [p.stack(topology) for p in whole.parts if where[p] != region]


@pytest.mark.parametrize(
    ("topology", "region", "kept"),
    [
        ("active-active", "us-east-1", ["platform-eks-euw1", "active-active-msk-eu", "active-active-site-euw1"]),
        ("active-active", "eu-west-1", ["platform-eks-use1", "active-active-msk-us", "active-active-site-use1"]),
        (
            "dr-msk-to-eventhubs",
            "westeurope",
            ["platform-eks-use1", "dr-msk-to-eventhubs-msk-primary", "dr-msk-to-eventhubs-site-use1"],
        ),
    ],
)
def test_with_a_region_down_the_other_regions_stacks_preview_and_update(topology, region, kept):
    assert survivors(topology, region) == kept
    backend, before = a_set_is_up(topology)
    lost = region_down(region)
    # The lost region's own stacks, and the one-stack deployment, cannot preview: the test can fail.
    for stack in sorted(set(order_of_up(topology)) - set(kept)):
        with pytest.raises(RegionDown):
            up([stack], dict(backend), lost=lost)
    with pytest.raises(RegionDown):
        run_values(part_values(topology), stack=topology, lost=lost)
    # The survivors preview and update unchanged ...
    up(kept, dict(backend), lost=lost)
    # ... and with the mirror resized and a flow's topics changed (a topic stopped).
    values = part_values(topology)
    flows = copy.deepcopy(values["mirrorkit:flows"])
    for flow in flows:
        flow["topics"]["exclude"] = [*flow["topics"].get("exclude", []), "stopped"]
    mirror = copy.deepcopy(values.get("mirrorkit:mirror", {}))
    mirror["executor"] = dict(mirror.get("executor", {}), instances=3)
    runs = up(kept, dict(backend), lost=lost, **{"mirrorkit:flows": flows, "mirrorkit:mirror": mirror})
    (site,) = [s for s in kept if "-site-" in s]
    (app,) = runs[site].of_type(SPARK_APP)
    (old,) = before[site].of_type(SPARK_APP)
    assert (old.plain["spec"]["executor"]["instances"], app.plain["spec"]["executor"]["instances"]) == (2, 3)
    config = yaml.safe_load(runs[site].result["configs"][site.rsplit("-", 1)[1]])
    assert all("stopped" in f["topics"]["exclude"] for f in config["flows"])


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


def readme_table() -> list[tuple[str, str, list[str]]]:
    """The README's table of each shipped set, in its order: (topology, stack, the stacks it reads)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("<!-- stacks table -->", 2)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|([^|]*)\|$", section, re.M)
    return [(topology, stack, re.findall(r"`([^`]+)`", reads)) for topology, stack, reads in rows]


def test_the_readme_lists_each_sets_stacks_in_the_order_of_up_with_what_each_reads():
    expected = []
    for topology in SETS:
        settings = run_stack(ROOT / "stacks" / f"Pulumi.{topology}.yaml").result["settings"]
        expected += [
            (topology, p.stack(topology), [r.stack(topology) for r in settings.references(p)]) for p in settings.parts
        ]
    assert readme_table() == expected
    listed = {stack for _, stack, _ in expected}
    assert listed == {stack_name(p) for p in PART_STACKS}, "every part stack file is in a shipped set"
