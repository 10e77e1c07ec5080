"""Network reach from a site's VPC to MSK: VPC peering (cross-region and cross-account), routes, one SG port.

Peering is used rather than MSK multi-VPC connectivity because the latter is same-region only.
"""

from __future__ import annotations

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


class MskReach(pulumi.ComponentResource):
    """Peering between a site's VPC and one MSK VPC (none when they are the same VPC), routes both ways, and an
    ingress rule per cluster on its auth mode's port only, from the site's CIDR only."""

    def __init__(self, name: str, args: MskReachArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:aws:MskReach", name, None, opts)
        site, msk_vpc = args.site, args.clusters[0]
        on_site = pulumi.ResourceOptions(parent=self, provider=args.site_provider)
        on_msk = pulumi.ResourceOptions(parent=self, provider=args.msk_provider)
        self.peering_id: pulumi.Output[str] | None = None
        if site.vpc_id != msk_vpc.vpc_id:
            if args.side == "both":
                peering = _request(
                    name, args.stack, site.vpc_id, msk_vpc.vpc_id, msk_vpc.account_id, msk_vpc.region, on_site
                )
                self.peering_id = _accept(name, peering, on_msk)
                _routes(name, site.route_table_ids, msk_vpc.cidr, self.peering_id, on_site)
                _routes(name, msk_vpc.route_table_ids, site.cidr, self.peering_id, on_msk)
            elif args.side == "msk":
                peering = _request(
                    name, args.stack, msk_vpc.vpc_id, site.vpc_id, site.account_id, args.site_region, on_msk
                )
                # A route to a peering not yet accepted is a blackhole until the site's stack accepts it.
                _routes(name, msk_vpc.route_table_ids, site.cidr, peering, on_msk)
                self.peering_id = peering
            elif args.peering_id is not None:
                self.peering_id = _accept(name, args.peering_id, on_site)
                _routes(name, site.route_table_ids, msk_vpc.cidr, self.peering_id, on_site)
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


def _routes(
    name: str, tables: Sequence[str], destination: str, peering_id: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> None:
    """One route per table in `tables` (one side of the peering) to the other side's CIDR, through the peering."""
    for table in tables:
        aws.ec2.Route(
            f"{name}-{table}",
            route_table_id=table,
            destination_cidr_block=destination,
            vpc_peering_connection_id=peering_id,
            opts=opts,
        )
