"""Cross-key checks: the rules no one stack key can check alone (where each flow runs, the credentials its clusters
need, what each site must have to reach them, the hubs a namespace must hold, what a flow asks of its target), each
error at the key to change."""

from __future__ import annotations

import ipaddress
import json

from infra.hubs import plan_hubs
from infra.naming import MIRROR_SID_PREFIX, PROJECT, credential_key
from infra.parts import Part, cross_account_sites
from infra.schema import (
    ADMIN_PREFIX,
    HUBS_PER_CAPACITY,
    TIER_LIMITS,
    ClusterSpec,
    ExecutorResources,
    SiteSpec,
    StackModel,
    Tier,
)
from spark_app.config import ConfigError, FlowConfig, FlowMode, MirrorConfig, cores_needed
from spark_app.policy import HEARTBEATS_TOPIC

S3_BUCKET_MAX = 63
# IAM's limit on a role's inline policies, together, in characters not counting whitespace.
ROLE_INLINE_POLICIES_MAX = 10_240


def check(model: StackModel, mirror: MirrorConfig, part: Part | None = None) -> dict[str, str]:
    """Every cross-key rule; raises ConfigError listing all that fail. Returns flow name -> the site that runs it.

    The rules hold for the whole topology in every stack of it; secrets are asked only of the stack that uses them."""
    site_of_flow, errors = place_flows(model, mirror)
    errors += unknown_stopped_flows(model, mirror)
    errors += missing_credentials(model, _credentials_used(model, mirror, site_of_flow, part))
    errors += hubs_over_tier(model, mirror)
    errors += eventhubs_open_to_the_internet(model)
    errors += missing_source_sizes(model, mirror)
    errors += exactly_once_without_transactions(model, mirror)
    errors += kept_policy_statements(model, mirror, site_of_flow)
    errors += checkpoint_pvc_without_a_storage_class(model)
    for i, site in enumerate(model.sites):
        flows = [f for f in mirror.flows if site_of_flow.get(f.name) == site.name]
        aliases = {a for f in flows for a in (f.source, f.target)}
        touched = [(j, c) for j, c in enumerate(model.clusters) if c.alias in aliases]
        errors += site_reaches_msk(i, site, touched)
        errors += peer_cidrs_overlap(i, site, touched)
        errors += site_signs_in_to_entra(i, site, touched)
        if touched:
            errors += site_reaches_checkpoints(i, site, model)
        errors += site_seats_realtime_tasks(site.name, model.mirror.executor, mirror, site_of_flow)
        errors += site_kafka_policy_fits(i, site, model, mirror, site_of_flow)
        if part is None or part == Part("site", site.name):
            errors += site_has_a_kubeconfig(i, site, model)
    if errors:
        raise ConfigError("\n".join(errors))
    return site_of_flow


def place_flows(model: StackModel, mirror: MirrorConfig) -> tuple[dict[str, str], list[str]]:
    """Each flow runs at the site `placement` names, else at the one site in its target's region."""
    errors: list[str] = []
    sites = [s.name for s in model.sites]
    for name, placed in model.placement.items():
        if placed not in sites:
            errors.append(f"{PROJECT}:placement.{name}: unknown site '{placed}' (sites: {', '.join(sites)})")
        if name not in {f.name for f in mirror.flows}:
            errors.append(f"{PROJECT}:placement.{name}: no such flow")
    region_of = {c.alias: c.region for c in model.clusters}
    site_of_flow: dict[str, str] = {}
    for i, flow in enumerate(mirror.flows):
        region = region_of[flow.target]
        in_region = [s.name for s in model.sites if s.region == region]
        chosen = model.placement.get(flow.name) or (in_region[0] if len(in_region) == 1 else None)
        if chosen is None:
            errors.append(
                f"{PROJECT}:flows[{i}]: {len(in_region)} sites in region '{region}' (the target's) to run {flow.name};"
                f" name one in {PROJECT}:placement"
            )
        else:
            site_of_flow[flow.name] = chosen
    return site_of_flow, errors


def unknown_stopped_flows(model: StackModel, mirror: MirrorConfig) -> list[str]:
    """`stopped` names flows of the stack, as `SRC->DST`."""
    flows = {f.name for f in mirror.flows}
    return [
        f"{PROJECT}:stopped[{i}]: no such flow '{name}'" for i, name in enumerate(model.stopped) if name not in flows
    ]


def _credentials_used(
    model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str], part: Part | None
) -> dict[str, tuple[str, ...]]:
    """The credential keys the stack needs, by cluster: a site's mirror's, with the admin's of the self-managed
    clusters whose ACLs a site's stack sets; an MSK part's, for its SCRAM user and its ACLs."""
    if part is None:
        return {c.alias: c.credential_keys() for c in model.clusters}
    if part.kind == "site":
        used = {a for f in mirror.flows if site_of_flow.get(f.name) == part.name for a in (f.source, f.target)}
        return {
            c.alias: tuple(k for k in c.credential_keys() if c.kafka is not None or not k.startswith(ADMIN_PREFIX))
            for c in model.clusters
            if c.alias in used
        }
    return {c.alias: c.credential_keys() for c in model.clusters if part == Part("msk", c.alias)}


def missing_credentials(model: StackModel, used: dict[str, tuple[str, ...]]) -> list[str]:
    """Each credential the stack needs is set, as a secret."""
    return [
        f"{credential_key(alias, key)}: missing; set it with"
        f" `pulumi config set --secret --path '{credential_key(alias, key)}' ...`, or in the Pulumi ESC environment"
        " the stack imports, under values.pulumiConfig (docs/deploy/stacks.md)"
        for alias, keys in used.items()
        for key in keys
        if key not in model.credentials.get(alias, {})
    ]


def hubs_over_tier(model: StackModel, mirror: MirrorConfig) -> list[str]:
    """An Event Hubs namespace's tier takes all its hubs, and each hub's partitions."""
    errors = []
    for i, c in enumerate(model.clusters):
        if c.eventhubs is None:
            continue
        tier, limit = c.eventhubs.tier, TIER_LIMITS[c.eventhubs.tier].partitions
        hubs = plan_hubs(mirror, model.clusters, c.alias)
        if len(hubs) > c.eventhubs.hub_limit:
            errors.append(
                f"{PROJECT}:clusters[{i}].eventhubs.tier: namespace '{c.eventhubs.namespace}' needs {len(hubs)}"
                f" event hubs ({sum(h.own for h in hubs)} of them the mirror's own) but tier"
                f" {tier.value} allows {c.eventhubs.hub_limit}"
                + (f" at capacity {c.eventhubs.capacity}" if tier in HUBS_PER_CAPACITY else "")
            )
        errors += [
            f"{PROJECT}:clusters[{i}].eventhubs.tier: hub '{h.name}' needs {h.partitions} partitions (its source"
            f" topic's) but tier {tier.value} allows {limit}"
            for h in hubs
            if h.partitions > limit
        ]
    return errors


def missing_source_sizes(model: StackModel, mirror: MirrorConfig) -> list[str]:
    """A flow into Event Hubs names the size of each topic it copies, at the source cluster's `topics` key."""
    clusters = {c.alias: (i, c) for i, c in enumerate(model.clusters)}
    errors = []
    for j, flow in enumerate(mirror.flows):
        if clusters[flow.target][1].eventhubs is None:
            continue
        src_i, src = clusters[flow.source]
        errors += [
            f"{PROJECT}:clusters[{src_i}].topics.{t}: missing; the event hub for it is sized from the source"
            f" topic's partitions (flows[{j}] mirrors it into Event Hubs cluster '{flow.target}')"
            for t in flow.topics.literal_names() or []
            if t not in src.source_topic_sizes and t != HEARTBEATS_TOPIC
        ]
    return errors


def exactly_once_without_transactions(model: StackModel, mirror: MirrorConfig) -> list[str]:
    """An exactly-once flow commits in transactions on its target, which an Event Hubs namespace of tier Standard
    does not have."""
    clusters = {c.alias: (i, c) for i, c in enumerate(model.clusters)}
    errors = []
    for j, flow in enumerate(mirror.flows):
        i, target = clusters[flow.target]
        if flow.exactly_once and target.eventhubs is not None and target.eventhubs.tier is Tier.STANDARD:
            errors.append(
                f"{PROJECT}:flows[{j}].exactly_once: exactly_once commits in Kafka transactions on the flow's"
                f" target, Event Hubs cluster '{flow.target}', whose namespace is of tier Standard"
                f" ({PROJECT}:clusters[{i}].eventhubs.tier); Event Hubs has Kafka transactions only on Premium and"
                " Dedicated, in preview. Turn exactly_once off, or give the namespace tier Premium or Dedicated"
            )
    return errors


def checkpoint_pvc_without_a_storage_class(model: StackModel) -> list[str]:
    """A checkpoint PVC names its StorageClass. Left out, the PVC takes whatever class the cluster marks default
    when it is made, which the program cannot see at preview: there may be none (the PVC then stays Pending and the
    driver never starts), or one that binds at once, which puts a zonal volume (EBS, Azure Disk) in a zone the driver
    may never be scheduled in. Only the driver mounts the checkpoint, so the class needs ReadWriteOnce, nothing
    wider; a PVC's class cannot change once it is made."""
    pvc = model.mirror.checkpoint.pvc
    if pvc is None or pvc.storage_class is not None:
        return []
    return [
        f"{PROJECT}:mirror.checkpoint.pvc.storage_class: missing; the mirror's checkpoint is a PVC, and without a class"
        " it takes the cluster's default, which preview cannot see (a cluster may mark none, and the PVC then never"
        " binds). Name a StorageClass that provisions ReadWriteOnce volumes (only the driver mounts the checkpoint) and"
        " binds WaitForFirstConsumer, so a zonal volume is made in the driver's zone: e.g. gp2 on EKS (gp3 only where"
        " a class gp3 was made). A deployment whose PVC exists names the class it has:"
        " kubectl get pvc -n <namespace> <app>-checkpoints -o jsonpath='{.spec.storageClassName}'"
    ]


def kept_policy_statements(model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str]) -> list[str]:
    """The statements an MSK cluster policy keeps go into a policy the program writes, each with a Sid of its own:
    none twice, none with the prefix of the program's statements."""
    errors = []
    for j, c in enumerate(model.clusters):
        statements = c.msk.cluster_policy_statements if c.msk is not None else []
        key = f"{PROJECT}:clusters[{j}].msk.cluster_policy_statements"
        if statements and not cross_account_sites(model, mirror, site_of_flow, c.alias):
            errors.append(
                f"{key}: the program writes no policy for cluster '{c.alias}', as no mirror role of another account"
                " uses it over IAM auth; leave the cluster's policy to whoever writes it"
            )
        first: dict[str, int] = {}
        for k, statement in enumerate(statements):
            sid = statement.Sid
            if sid is None:
                continue
            if sid.startswith(MIRROR_SID_PREFIX):
                errors.append(f"{key}[{k}].Sid: '{sid}' takes the program's prefix '{MIRROR_SID_PREFIX}'; rename it")
            elif sid in first:
                errors.append(f"{key}[{k}].Sid: '{sid}' is also the Sid of {key}[{first[sid]}]; a policy's Sids differ")
            first.setdefault(sid, k)
    return errors


def site_reaches_msk(i: int, site: SiteSpec, touched: list[tuple[int, ClusterSpec]]) -> list[str]:
    """A site whose mirror reaches MSK has an AWS identity, and one MSK lets in from another account."""
    msk = [(j, c.alias, c.msk) for j, c in touched if c.msk is not None]
    if not msk:
        return []
    if site.aws is None:
        aliases = ", ".join(alias for _, alias, _ in msk)
        return [f"{PROJECT}:sites[{i}].aws: missing; its mirror reaches MSK cluster(s) {aliases}"]
    return [
        f"{PROJECT}:clusters[{j}].msk.role_arn: missing; the mirror's role for site '{site.name}' lives in"
        f" account {site.aws.account_id} and cluster '{alias}' in {spec.account_id}, so MSK lets it in"
        f" only through the cluster's resource policy (aws.msk.ClusterPolicy). Give a role the program"
        f" assumes in {spec.account_id} to set that policy"
        for j, alias, spec in msk
        if spec.auth == "iam" and spec.account_id != site.aws.account_id and spec.role_arn is None
    ]


def peer_cidrs_overlap(i: int, site: SiteSpec, touched: list[tuple[int, ClusterSpec]]) -> list[str]:
    """The VPCs a site peers with (its MSK clusters' outside its own VPC) overlap neither its VPC nor each other:
    AWS refuses to peer overlapping CIDRs, and a route table holds one route per destination."""
    if site.aws is None:
        return []
    keyed = [(f"{PROJECT}:sites[{i}].aws.cidr", site.aws.vpc_id, site.aws.cidr)]
    for j, c in touched:
        if c.msk is not None and c.msk.vpc_id not in {vpc for _, vpc, _ in keyed}:
            keyed.append((f"{PROJECT}:clusters[{j}].msk.cidr", c.msk.vpc_id, c.msk.cidr))
    return [
        f"{key}: {cidr} overlaps {other_key} {other_cidr}; peered VPCs need CIDRs apart"
        for n, (key, _, cidr) in enumerate(keyed)
        for other_key, _, other_cidr in keyed[:n]
        if ipaddress.ip_network(cidr).overlaps(ipaddress.ip_network(other_cidr))
    ]


def site_signs_in_to_entra(i: int, site: SiteSpec, touched: list[tuple[int, ClusterSpec]]) -> list[str]:
    """A site whose mirror reaches an Event Hubs namespace with local auth off has a workload identity issuer."""
    entra = [c.alias for _, c in touched if c.entra]
    if not entra or site.azure is not None:
        return []
    return [
        f"{PROJECT}:sites[{i}].azure: missing; its mirror reaches Event Hubs cluster(s) {', '.join(entra)}"
        " with local auth disabled, so it signs in with Entra ID workload identity: give"
        " azure.oidc_issuer_url, the issuer of the site's service-account tokens"
    ]


def site_reaches_checkpoints(i: int, site: SiteSpec, model: StackModel) -> list[str]:
    """A site that runs a mirror signs in to the object storage its checkpoints are in with the pod's identity."""
    checkpoint = model.mirror.checkpoint
    scheme = checkpoint.scheme
    if scheme == "s3a" and site.aws is None:
        return [
            f"{PROJECT}:sites[{i}].aws: missing; its mirror keeps checkpoints in s3a:// and signs in with the"
            " pod's AWS identity (EKS Pod Identity or IRSA), which the site's aws settings give"
        ]
    if scheme == "s3a" and len(bucket := checkpoint.bucket_in(site.region, model.checkpoint_home)) > S3_BUCKET_MAX:
        return [
            f"{PROJECT}:mirror.checkpoint.url: site '{site.name}' keeps its checkpoints in its own region,"
            f" {site.region}, in bucket '{bucket}', over S3's {S3_BUCKET_MAX} characters; shorten the url's bucket"
        ]
    if scheme == "abfss" and site.azure is None:
        return [
            f"{PROJECT}:sites[{i}].azure: missing; its mirror keeps checkpoints in abfss:// and signs in with"
            " Entra ID workload identity: give azure.oidc_issuer_url"
        ]
    return []


def site_seats_realtime_tasks(
    site: str, executor: ExecutorResources, mirror: MirrorConfig, site_of_flow: dict[str, str]
) -> list[str]:
    """A real-time task holds an executor core for as long as the mirror runs, and a task with no core never starts,
    so a site's executors must seat every real-time task, plus one core for its throughput flows' batches. The stack
    sets no Spark conf, so spark.task.cpus is Spark's 1 and a core is a task slot."""
    flows = [(i, f) for i, f in enumerate(mirror.flows) if site_of_flow.get(f.name) == site]
    needed = cores_needed([f for _, f in flows])
    cores = executor.instances * executor.cores
    if cores >= needed:
        return []
    realtime: list[tuple[int, FlowConfig]] = [(i, f) for i, f in flows if f.mode is FlowMode.REALTIME]
    throughput = [f.name for _, f in flows if f.mode is FlowMode.THROUGHPUT]
    tasks = ", ".join(f"{f.name} ({PROJECT}:flows[{i}].realtime_tasks: {f.realtime_tasks})" for i, f in realtime)
    batches = f" and 1 for the batches of throughput flow(s) {', '.join(throughput)}" if throughput else ""
    return [
        f"{PROJECT}:mirror.executor: site '{site}' gets {cores} executor cores (instances {executor.instances} x cores"
        f" {executor.cores}) but needs {needed}: one per real-time task of {tasks}{batches}. Each real-time task"
        f" holds its core for as long as the mirror runs, so the tasks left without one would never copy their"
        f" partitions; raise {PROJECT}:mirror.executor.instances or {PROJECT}:mirror.executor.cores, or lower the"
        " flows' realtime_tasks"
    ]


def site_has_a_kubeconfig(i: int, site: SiteSpec, model: StackModel) -> list[str]:
    """The program reaches each site's Kubernetes API through a kubeconfig context or a secret kubeconfig."""
    if site.context is not None or site.name in model.kubeconfigs:
        return []
    return [
        f"{PROJECT}:sites[{i}].context: missing; give a kubeconfig context, or set"
        f" `pulumi config set --secret --path '{PROJECT}:kubeconfigs.{site.name}' \"$(cat kubeconfig)\"`"
    ]


def policy_size(document: dict[str, object]) -> int:
    """A policy document's size as IAM counts it toward its limits: its JSON, without whitespace."""
    return len(json.dumps(document, separators=(",", ":")))


def site_kafka_policy_fits(
    i: int, site: SiteSpec, model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str]
) -> list[str]:
    """The site's mirror role holds its MSK IAM grants (one resource per literal topic, as flows into Event Hubs
    list them) inline: past IAM's limit its `up` would fail after preview passed. Said here, with the flow that
    lists the most topics."""
    from infra.aws.identity import kafka_policy  # pulumi_aws: imported only when a site's grants are sized
    from infra.k8s.toolbox import TOOLBOX_GRANTED  # the role holds the toolbox's grants too, as infra.topology gives

    flows = [f for f in mirror.flows if site_of_flow.get(f.name) == site.name]
    used = {a for f in flows for a in (f.source, f.target)}
    iam = {c.alias: c.msk for c in model.clusters if c.alias in used and c.msk is not None and c.msk.auth == "iam"}
    if site.aws is None or not iam:
        return []
    size = policy_size(kafka_policy(flows, iam, TOOLBOX_GRANTED))
    if size <= ROLE_INLINE_POLICIES_MAX:
        return []
    j, widest = max(
        ((j, f) for j, f in enumerate(mirror.flows) if f in flows), key=lambda jf: len(jf[1].topics.include)
    )
    return [
        f"{PROJECT}:flows[{j}].topics: the mirror role of site '{site.name}' ({PROJECT}:sites[{i}]) would hold"
        f" {size} characters of MSK grants inline, over IAM's {ROLE_INLINE_POLICIES_MAX} for a role's inline policies;"
        f" flow {widest.name} lists {len(widest.topics.include)} topics: select them by a pattern where the target"
        " allows one, or run some flows at another site"
    ]


def eventhubs_open_to_the_internet(model: StackModel) -> list[str]:
    """A namespace the program makes with public network access lets in only the addresses it lists."""
    return [
        f"{PROJECT}:clusters[{j}].eventhubs.allowed_ips: public_network_access 'Enabled' lets in the whole internet;"
        " list the mirror's egress addresses (the sites' NAT gateways), or set 'Disabled' and reach the namespace by"
        " a private endpoint"
        for j, c in enumerate(model.clusters)
        if c.eventhubs is not None and c.eventhubs.public_network_access == "Enabled" and not c.eventhubs.allowed_ips
    ]
