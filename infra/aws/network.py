"""Network reach from a site's VPC to MSK: VPC peering (cross-region and cross-account), routes, one SG port.

Peering is used rather than MSK multi-VPC connectivity because the latter is same-region only.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_aws as aws

from infra.schema import AwsSite, MskSpec

STACK_TAG = "mirrorkit.io/stack"


# Which resources of a reach a stack makes: all of them (one stack), or one side of it (a stack set, where no
# stack holds resources of two regions): the MSK side requests the peering to the site's VPC, routes its own tables
# and opens its ports; the site side accepts that peering and routes its own tables.
Side = Literal["both", "msk", "site"]


@dataclass(frozen=True)
class MskReachArgs:
    stack: str  # tags the peering, so a later preview tells its own peering from another stack's
    site: AwsSite
    site_provider: aws.Provider | None  # None when the stack makes only the MSK side
    msk_provider: aws.Provider | None  # the MSK account and region; None when the stack makes only the site side
    clusters: Sequence[MskSpec]  # MSK clusters in one VPC that this site's mirror talks to
    site_region: str = ""  # the site's: where the MSK side's request goes
    side: Side = "both"
    peering_id: pulumi.Input[str] | None = None  # the site side: the MSK side's request, read from its stack
    # Where the site's and the MSK VPC's settings are, for preview errors: `mirrorkit:sites[i].aws`,
    # `mirrorkit:clusters[j].msk` (of the first cluster in the VPC, whose route tables are routed).
    keys: tuple[str, str] = ("site.aws", "msk")


class MskReach(pulumi.ComponentResource):
    """Peering between a site's VPC and one MSK VPC (none when they are the same VPC), routes both ways, and an
    ingress rule per cluster on its auth mode's port only, from the site's CIDR only."""

    def __init__(self, name: str, args: MskReachArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:aws:MskReach", name, None, opts)
        site, msk_vpc = args.site, args.clusters[0]
        on_site = pulumi.ResourceOptions(parent=self, provider=args.site_provider)
        on_msk = pulumi.ResourceOptions(parent=self, provider=args.msk_provider)
        self.peering_id: pulumi.Output[str] | None = None
        if msk_vpc.vpc_id in site.peerings:
            # Another stack's peering, with its routes and ingress rule from this site's CIDR: nothing to make.
            key = f"{args.keys[0]}.peerings.{msk_vpc.vpc_id}"
            self.peering_id = _shared_peering(site.peerings[msk_vpc.vpc_id], site.vpc_id, msk_vpc.vpc_id, key, on_site)
            self.register_outputs({"peering_id": self.peering_id})
            return
        if site.vpc_id != msk_vpc.vpc_id:
            site_key, msk_key = args.keys
            # Each side's tables get a route to the other side's CIDR.
            site_routes = _Routes(site.route_table_ids, f"{site_key}.route_table_ids", msk_vpc.cidr, f"{msk_key}.cidr")
            msk_routes = _Routes(msk_vpc.route_table_ids, f"{msk_key}.route_table_ids", site.cidr, f"{site_key}.cidr")
            if args.side == "both":
                peering = _request(
                    name, args.stack, site.vpc_id, msk_vpc.vpc_id, msk_vpc.account_id, msk_vpc.region, on_site
                )
                self.peering_id = _accept(name, peering, on_msk)
                site_routes.make(name, args.stack, self.peering_id, on_site)
                msk_routes.make(
                    name, args.stack, _every_client_table(msk_vpc, msk_routes, self.peering_id, on_msk), on_msk
                )
            elif args.side == "msk":
                peering = _request(
                    name, args.stack, msk_vpc.vpc_id, site.vpc_id, site.account_id, args.site_region, on_msk
                )
                # A route to a peering not yet accepted is a blackhole until the site's stack accepts it.
                msk_routes.make(name, args.stack, _every_client_table(msk_vpc, msk_routes, peering, on_msk), on_msk)
                self.peering_id = peering
            elif args.peering_id is not None:
                self.peering_id = _accept(name, args.peering_id, on_site)
                site_routes.make(name, args.stack, self.peering_id, on_site, accepted=args.peering_id)
        for cluster in args.clusters if args.side != "site" else ():
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-{cluster.security_group_id}-{cluster.port}",
                security_group_id=cluster.security_group_id,
                cidr_ipv4=site.cidr,
                ip_protocol="tcp",
                from_port=cluster.port,
                to_port=cluster.port,
                description=f"mirrorkit: Kafka {cluster.auth} from {name}",
                opts=on_msk,
            )
        self.register_outputs({"peering_id": self.peering_id})


def _request(
    name: str, stack: str, vpc: str, peer_vpc: str, peer_account: str, peer_region: str, opts: pulumi.ResourceOptions
) -> pulumi.Output[str]:
    """The requester's side of a peering, in the requester VPC's account and region, tagged with the stack."""
    peering = aws.ec2.VpcPeeringConnection(
        f"{name}-peering",
        vpc_id=_no_other_peering(stack, vpc, peer_vpc, opts),
        peer_vpc_id=peer_vpc,
        peer_owner_id=peer_account,
        peer_region=peer_region,
        tags={"Name": name, STACK_TAG: stack},
        opts=opts,
    )
    return peering.id  # type: ignore[no-any-return]  # pulumi_aws is not followed by mypy


def _shared_peering(
    peering_id: str, site_vpc: str, msk_vpc: str, key: str, on: pulumi.ResourceOptions
) -> pulumi.Output[str]:
    """An existing peering's id, once it is active and joins the site's VPC and the MSK VPC (either way round);
    otherwise preview fails here, naming the key."""
    found = aws.ec2.get_vpc_peering_connection_output(
        id=peering_id, opts=pulumi.InvokeOutputOptions(provider=on.provider)
    )

    def check(got: list[Any]) -> str:
        status, vpcs = got[0], {got[1], got[2]}
        if vpcs != {site_vpc, msk_vpc}:
            raise ValueError(
                f"{key}: {peering_id} joins {' and '.join(sorted(v for v in vpcs if v))}, not {site_vpc} and {msk_vpc}"
            )
        if status != "active":
            raise ValueError(f"{key}: {peering_id} is {status}, not active; accept it first")
        return peering_id

    return pulumi.Output.all(found.status, found.vpc_id, found.peer_vpc_id).apply(check)


def _accept(name: str, peering_id: pulumi.Input[str], opts: pulumi.ResourceOptions) -> pulumi.Output[str]:
    """The accepter's side of a peering, in the accepter VPC's account and region."""
    accepter = aws.ec2.VpcPeeringConnectionAccepter(
        f"{name}-accepter", vpc_peering_connection_id=peering_id, auto_accept=True, tags={"Name": name}, opts=opts
    )
    return accepter.id  # type: ignore[no-any-return]  # pulumi_aws is not followed by mypy


def _no_other_peering(stack: str, requester: str, accepter: str, on: pulumi.ResourceOptions) -> pulumi.Output[str]:
    """The requester VPC's id, once no other stack's peering joins the same two VPCs; otherwise preview fails here.

    AWS allows one active peering per pair of VPCs, and a second stack would also add the same routes and ingress
    rule, so two stacks cannot both reach one MSK VPC from one site VPC.
    """
    opts = pulumi.InvokeOutputOptions(provider=on.provider)
    pair = [
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="requester-vpc-info.vpc-id", values=[requester]),
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="accepter-vpc-info.vpc-id", values=[accepter]),
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="status-code", values=["active", "pending-acceptance"]),
    ]
    ours = aws.ec2.GetVpcPeeringConnectionsFilterArgs(name=f"tag:{STACK_TAG}", values=[stack])
    every = aws.ec2.get_vpc_peering_connections_output(filters=pair, opts=opts).ids
    own = aws.ec2.get_vpc_peering_connections_output(filters=[*pair, ours], opts=opts).ids

    def check(found: list[Any]) -> str:  # [every id, our ids], each None when there is none
        others = sorted(set(found[0] or []) - set(found[1] or []))
        if others:
            raise ValueError(
                f"VPC peering {', '.join(others)} already joins {requester} and {accepter}, made by another"
                f" stack or by hand; AWS allows one per pair of VPCs, and this stack would add the same routes and"
                f" ingress rule. Mirror this pair from one stack, or remove that peering."
            )
        return requester

    return pulumi.Output.all(every, own).apply(check)


@dataclass(frozen=True)
class _Routes:
    """One side's routes: a route in each of its tables to the other side's CIDR, through the peering."""

    tables: Sequence[str]
    tables_key: str
    destination: str
    destination_key: str

    def make(
        self,
        name: str,
        stack: str,
        peering_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions,
        accepted: pulumi.Input[str] | None = None,
    ) -> None:
        """Preview refuses a route that would clash with one some other peering already has in a table, naming both
        keys, before any is made (`_free`). The stack's own peerings carry its tag; a site's stack in a set also owns
        the peering it `accepted`, which the MSK part requested and tagged, so a later `up` finds its own route
        through it. That id comes from the MSK part's stack, known at preview, where the id of a peering not made yet
        is not."""
        on = pulumi.InvokeOutputOptions(provider=opts.provider)
        ours = aws.ec2.GetVpcPeeringConnectionsFilterArgs(name=f"tag:{STACK_TAG}", values=[stack])
        own = aws.ec2.get_vpc_peering_connections_output(filters=[ours], opts=on).ids
        for table in self.tables:
            routes = aws.ec2.get_route_table_output(route_table_id=table, opts=on).routes
            aws.ec2.Route(
                f"{name}-{table}",
                route_table_id=pulumi.Output.all(routes, own, accepted).apply(functools.partial(self._free, table)),
                destination_cidr_block=self.destination,
                vpc_peering_connection_id=peering_id,
                opts=opts,
            )

    def _free(self, table: str, found: list[Any]) -> str:  # [the table's routes, our peerings' ids, accepted]
        """The table, unless a route not ours there has the same destination (a table holds one route per
        destination: AWS refuses a second, RouteAlreadyExists), or one overlapping it through another peering: a
        narrower one takes part of this peer's traffic, a wider one loses part of its own to this route. A wider
        route out through a gateway (a default route, say) is what a peering route is meant to narrow."""
        routes, own = found[0] or [], {*(found[1] or []), *([found[2]] if found[2] else [])}
        wanted = ipaddress.ip_network(self.destination)
        for route in routes:
            cidr = _field(route, "cidr_block")
            peering = _field(route, "vpc_peering_connection_id")
            through = peering or _field(route, "gateway_id")
            if not cidr or through in own:
                continue
            if cidr == self.destination:
                raise ValueError(
                    f"{self.destination_key}: route table {table} already routes {self.destination} through"
                    f" {through} (another stack's peering, or one made by hand), and a table holds one route per"
                    f" destination; give the peer VPC a CIDR apart, or leave {table} out of {self.tables_key}"
                )
            if peering and ipaddress.ip_network(cidr).overlaps(wanted):
                raise ValueError(
                    f"{self.destination_key}: {self.destination} overlaps {cidr}, which route table {table} already"
                    f" routes through {peering} (another stack's peering, or one made by hand), so one of the two"
                    f" peers would get the other's traffic; give the peer VPC a CIDR apart, or leave {table} out of"
                    f" {self.tables_key}"
                )
        return table


def _field(result: Any, name: str) -> Any:
    """A field of an invoke's nested result, which comes typed (snake_case) or, as a plain dict, in wire names."""
    if isinstance(result, dict):
        return result.get(name, result.get(re.sub(r"_(\w)", lambda m: m[1].upper(), name)))
    return getattr(result, name, None)


def _every_client_table(
    msk: MskSpec, routes: _Routes, peering_id: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> pulumi.Output[str]:
    """The peering id, once the stack routes every table the MSK cluster's client subnets use (one per AZ,
    usually); a broker in a subnet whose table has no route back is unreachable, so preview refuses it."""
    on = pulumi.InvokeOutputOptions(provider=opts.provider)
    infos = aws.msk.get_cluster_output(cluster_name=msk.cluster_name, opts=on).broker_node_group_infos
    subnets = infos.apply(lambda found: sorted({s for i in found or [] for s in _field(i, "client_subnets") or []}))
    by_subnet = aws.ec2.GetRouteTablesFilterArgs(name="association.subnet-id", values=subnets)
    tables = aws.ec2.get_route_tables_output(vpc_id=msk.vpc_id, filters=[by_subnet], opts=on).ids

    def check(found: list[Any]) -> str:  # [the peering id, the client subnets' tables]
        missing = sorted(set(found[1] or []) - set(routes.tables))
        if missing:
            raise ValueError(
                f"{routes.tables_key}: misses {', '.join(missing)}, the route table(s) of MSK cluster"
                f" {msk.cluster_name}'s client subnets; each needs the route back to the site"
            )
        return str(found[0])

    return pulumi.Output.all(peering_id, tables).apply(check)
