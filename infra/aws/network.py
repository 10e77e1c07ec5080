"""Network reach from a site's VPC to MSK: VPC peering (cross-region and cross-account), routes, one SG port.

Peering is used rather than MSK multi-VPC connectivity because the latter is same-region only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.schema import AwsSite, MskSpec

STACK_TAG = "mirrorkit.io/stack"


@dataclass(frozen=True)
class MskReachArgs:
    stack: str  # tags the peering, so a later preview tells its own peering from another stack's
    site: AwsSite
    site_provider: aws.Provider
    msk_provider: aws.Provider  # the MSK account and region: accepter, its routes and its SG rules
    clusters: Sequence[MskSpec]  # MSK clusters in one VPC that this site's mirror talks to


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
            peering = aws.ec2.VpcPeeringConnection(
                f"{name}-peering",
                vpc_id=_no_other_peering(args, msk_vpc),
                peer_vpc_id=msk_vpc.vpc_id,
                peer_owner_id=msk_vpc.account_id,
                peer_region=msk_vpc.region,
                tags={"Name": name, STACK_TAG: args.stack},
                opts=on_site,
            )
            accepter = aws.ec2.VpcPeeringConnectionAccepter(
                f"{name}-accepter",
                vpc_peering_connection_id=peering.id,
                auto_accept=True,
                tags={"Name": name},
                opts=on_msk,
            )
            _routes(name, site.route_table_ids, msk_vpc.cidr, accepter.id, on_site)
            _routes(name, msk_vpc.route_table_ids, site.cidr, accepter.id, on_msk)
            self.peering_id = accepter.id
        for cluster in args.clusters:
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


def _no_other_peering(args: MskReachArgs, msk: MskSpec) -> pulumi.Output[str]:
    """The site's VPC id, once no other stack's peering joins the same two VPCs; otherwise preview fails here.

    AWS allows one active peering per pair of VPCs, and a second stack would also add the same routes and ingress
    rule, so two stacks cannot both reach one MSK VPC from one site VPC.
    """
    opts = pulumi.InvokeOutputOptions(provider=args.site_provider)
    pair = [
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="requester-vpc-info.vpc-id", values=[args.site.vpc_id]),
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="accepter-vpc-info.vpc-id", values=[msk.vpc_id]),
        aws.ec2.GetVpcPeeringConnectionsFilterArgs(name="status-code", values=["active", "pending-acceptance"]),
    ]
    ours = aws.ec2.GetVpcPeeringConnectionsFilterArgs(name=f"tag:{STACK_TAG}", values=[args.stack])
    every = aws.ec2.get_vpc_peering_connections_output(filters=pair, opts=opts).ids
    own = aws.ec2.get_vpc_peering_connections_output(filters=[*pair, ours], opts=opts).ids

    def check(found: list[Any]) -> str:  # [every id, our ids], each None when there is none
        others = sorted(set(found[0] or []) - set(found[1] or []))
        if others:
            raise ValueError(
                f"VPC peering {', '.join(others)} already joins {args.site.vpc_id} and {msk.vpc_id}, made by another"
                f" stack or by hand; AWS allows one per pair of VPCs, and this stack would add the same routes and"
                f" ingress rule. Mirror this pair from one stack, or remove that peering."
            )
        return args.site.vpc_id

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
