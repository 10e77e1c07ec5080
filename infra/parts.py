"""A deployment split into stacks that each stand alone: which parts a topology has, the stack each part is, and
which other parts' outputs it reads through StackReferences.

A region must be operable while another is down, so no stack holds resources of two regions:
- `site:<site>`: what runs on one Kubernetes cluster for the deployment (namespace, identities, the mirror) and
  its side of each peering;
- `platform:<stack>`: what is cluster-wide on one Kubernetes cluster, the Spark Operator and its CRDs, installed
  once for every deployment there (its own stack, named by the sites that use it, `sites[].platform`);
- `msk:<alias>`: what lives in an MSK cluster's account and region (the peering requests to the sites' VPCs, routes
  and ingress on its side, the SCRAM user and its ACLs, the cluster policy merging the grants the sites export);
- `eventhubs:<alias>`: an Event Hubs namespace and its hubs.

A stack without `mirrorkit:part` holds the whole topology, for a deployment in one region.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.naming import PROJECT
from infra.schema import StackModel
from spark_app.config import ConfigError, MirrorConfig

Kind = Literal["site", "platform", "msk", "eventhubs"]
KINDS: tuple[Kind, ...] = ("eventhubs", "msk", "platform", "site")  # the order of a first `pulumi up`


@dataclass(frozen=True, order=True)
class Part:
    kind: Kind
    name: str  # a site's name, or a cluster's alias

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    def stack(self, deployment: str) -> str:
        """The stack that holds this part of a deployment, `<deployment>-<kind>-<name>`; a platform is its own."""
        return self.name if self.kind == "platform" else f"{deployment}-{self.kind}-{self.name}"


def parse_part(text: str) -> Part:
    kind, _, name = text.partition(":")
    if kind not in KINDS or not name:
        raise ConfigError(f"{PROJECT}:part: '{text}' is not <kind>:<name> with kind one of {', '.join(KINDS)}")
    return Part(kind, name)


def parts_of(model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str]) -> list[Part]:
    """Every part a topology splits into, in the order of a first `pulumi up`: the platforms its sites name, the
    clusters' parts, then the sites."""
    used = {a for f in mirror.flows for a in (f.source, f.target)}
    sites = [s for s in model.sites if s.name in site_of_flow.values()]
    found = sorted({Part("platform", s.platform) for s in sites if s.platform is not None})
    found += [Part("eventhubs", c.alias) for c in model.clusters if c.eventhubs is not None and c.alias in used]
    found += [Part("msk", c.alias) for c in model.clusters if c.msk is not None and c.alias in used]
    return found + [Part("site", s.name) for s in sites]


def cross_account_sites(model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str], alias: str) -> list[str]:
    """The sites whose IAM role acts on IAM-auth MSK cluster `alias` from another account: MSK lets them in only
    through the cluster's resource policy, which the cluster's part writes from the grants they export."""
    cluster = next(c for c in model.clusters if c.alias == alias)
    if cluster.msk is None or cluster.msk.auth != "iam":
        return []
    accounts = {s.name: s.aws.account_id for s in model.sites if s.aws is not None}
    users = {site_of_flow[f.name] for f in mirror.flows if alias in (f.source, f.target)}
    return [
        s.name for s in model.sites if s.name in users and accounts.get(s.name) not in (None, cluster.msk.account_id)
    ]


def references(model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str], part: Part) -> list[Part]:
    """The parts whose outputs `part` reads. A site reads only the parts of the clusters its flows use and of its
    own platform, never another site's, so it previews and updates while any other region is down."""
    if part.kind == "site":
        used = {a for f in mirror.flows if site_of_flow[f.name] == part.name for a in (f.source, f.target)}
        found = [
            Part("eventhubs" if c.eventhubs is not None else "msk", c.alias)
            for c in model.clusters
            if c.alias in used and c.kafka is None
        ]
        platform = next(s.platform for s in model.sites if s.name == part.name)
        return sorted(found) + ([Part("platform", platform)] if platform is not None else [])
    if part.kind == "msk":
        return [Part("site", s) for s in cross_account_sites(model, mirror, site_of_flow, part.name)]
    return []
