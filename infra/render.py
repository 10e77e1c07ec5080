"""Rendering the mirror's config: the stack's clusters and flows -> spark_app's MirrorConfig, validated by
spark_app with its errors kept at the stack's key paths; at deploy time, the looked-up bootstraps filled in."""

from __future__ import annotations

from pydantic import ValidationError

from infra.clusters import cluster_config
from infra.naming import PROJECT
from infra.schema import StackModel
from spark_app.config import ClusterConfig, ConfigError, MirrorConfig, parse_config


def render_mirror(model: StackModel, deployment: str) -> MirrorConfig:
    """The MirrorConfig the stack means, every flow's checkpoint location set from `mirror.checkpoint`."""
    errors = [
        f"{PROJECT}:flows[{i}].checkpoint_location: set by infra from {PROJECT}:mirror.checkpoint; remove it"
        for i, f in enumerate(model.flows)
        if "checkpoint_location" in f
    ]
    clusters: list[ClusterConfig] = []
    for i, spec in enumerate(model.clusters):
        try:
            clusters.append(cluster_config(spec))
        except ValidationError as err:
            errors += str(ConfigError.from_validation(PROJECT, err, at=("clusters", i))).splitlines()
    if errors:
        raise ConfigError("\n".join(errors))
    flows = []
    for raw in model.flows:
        # Raw until spark_app validates it below; a flow without its aliases fails there, not here.
        where = model.mirror.checkpoint.location(deployment, str(raw.get("source")), str(raw.get("target")))
        flows.append(raw | {"checkpoint_location": where})
    try:
        return MirrorConfig.model_validate(model.mirror.runtime | {"clusters": clusters, "flows": flows})
    except ValidationError as err:
        runtime_keys = set(MirrorConfig.model_fields) - {"clusters", "flows"}
        lines = str(ConfigError.from_validation(PROJECT, err)).splitlines()
        raise ConfigError("\n".join(_under_runtime(line, runtime_keys) for line in lines)) from None


def in_site_regions(
    model: StackModel, mirror: MirrorConfig, site_of_flow: dict[str, str], deployment: str
) -> MirrorConfig:
    """Each flow's s3a:// checkpoint in the bucket of the region its mirror runs in (CheckpointStore.bucket_in), so a
    mirror's state is never in a region it does not run in."""
    checkpoint = model.mirror.checkpoint
    if checkpoint.scheme != "s3a":
        return mirror
    region_of = {s.name: s.region for s in model.sites}
    flows = [
        f.model_copy(
            update={
                "checkpoint_location": checkpoint.location(
                    deployment,
                    f.source,
                    f.target,
                    checkpoint.bucket_in(region_of[site_of_flow[f.name]], model.checkpoint_home),
                )
            }
        )
        for f in mirror.flows
    ]
    return mirror.model_copy(update={"flows": flows})


def _under_runtime(line: str, runtime_keys: set[str]) -> str:
    """A top-level MirrorConfig key comes from the stack's `mirror.runtime`: say so in its path."""
    key = line.removeprefix(f"{PROJECT}:").split(":", 1)[0].split(".", 1)[0]
    return line.replace(f"{PROJECT}:", f"{PROJECT}:mirror.runtime.", 1) if key in runtime_keys else line


def with_bootstraps(mirror: MirrorConfig, bootstraps: dict[str, str]) -> str:
    """A site's MirrorConfig as YAML, with the bootstraps looked up at deploy time filled in, validated again by
    spark_app."""
    clusters = [
        c.model_copy(update={"bootstrap_servers": bootstraps.get(c.alias, c.bootstrap_servers)})
        for c in mirror.clusters
    ]
    raw = mirror.model_copy(update={"clusters": clusters}).model_dump(mode="json")
    return parse_config(raw, source="rendered mirror config").to_yaml()
