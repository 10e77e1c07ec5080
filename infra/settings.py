"""The program's entry to its settings: read the stack config once, check all of it, and hand back StackSettings.

Everything is checked here, before any resource exists: the schema (infra.schema), the Kubernetes names
(infra.naming), the mirror's own config as spark_app validates it (infra.render), then the rules across keys
(infra.checks). A bad stack therefore fails at `pulumi preview` with the key path as the user wrote it, e.g.
`mirrorkit:flows[1].target: unknown cluster 'dr2'`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pulumi
import yaml
from pydantic import BaseModel, ValidationError

from infra.checks import check
from infra.hubs import HubSpec, plan_hubs
from infra.naming import PROJECT, app_name, name_errors, operator_name
from infra.parts import Part, parse_part, parts_of, references
from infra.render import in_site_regions, render_mirror
from infra.schema import ClusterSpec, PlatformSpec, SiteSpec, StackModel
from spark_app.config import ConfigError, FlowConfig, MirrorConfig

_FIELD_IN_MESSAGE = re.compile(rf"^({PROJECT}:[^:\s]+): ([a-z_]+): ")
STRUCTURED_KEYS = ("sites", "clusters", "flows", "mirror", "placement", "stopped", "credentials", "kubeconfigs")
SECRET_KEYS = ("credentials", "kubeconfigs")  # always the stack's own: another stack's secrets are not readable
STACKS_DIR = Path(__file__).resolve().parents[1] / "stacks"
# A topology its part stacks share: <name>.yaml here, never a Pulumi.<stack>.yaml, so that no one stack can deploy
# the whole of a topology that spans regions.
TOPOLOGIES_DIR = STACKS_DIR / "topologies"


@dataclass(frozen=True)
class StackSettings:
    stack: str
    deployment: str  # the topology's name: every stack of a set shares it, and the names derived from it
    part: Part | None  # None: the whole topology in this one stack
    namespace: str
    image: str
    spark_operator: bool
    monitoring: bool
    protect_data: bool  # event hubs, their namespaces, checkpoint PVCs and buckets: Pulumi may not delete them
    model: StackModel
    mirror_config: MirrorConfig  # every flow, bootstraps still pending where they are looked up
    site_of_flow: dict[str, str]  # flow name -> site name

    @property
    def operator_name(self) -> str:
        return operator_name(self.deployment)

    def app_name(self, site: str) -> str:
        return app_name(self.deployment, site)

    def makes(self, kind: str, name: str) -> bool:
        """Whether this stack holds that part's resources: its own part, or every part in a one-stack deployment."""
        return self.part is None or (self.part.kind, self.part.name) == (kind, name)

    @property
    def parts(self) -> list[Part]:
        """The stacks the topology splits into, in the order of a first `pulumi up`."""
        return parts_of(self.model, self.mirror_config, self.site_of_flow)

    def references(self, part: Part) -> list[Part]:
        """The parts whose stack outputs `part` reads."""
        return references(self.model, self.mirror_config, self.site_of_flow, part)

    def cluster(self, alias: str) -> ClusterSpec:
        return next(c for c in self.model.clusters if c.alias == alias)

    def site(self, name: str) -> SiteSpec:
        return next(s for s in self.model.sites if s.name == name)

    def flows_at(self, site: str) -> list[FlowConfig]:
        return [f for f in self.mirror_config.flows if self.site_of_flow[f.name] == site]

    def clusters_at(self, site: str) -> list[ClusterSpec]:
        """The clusters a site's mirror talks to, in stack order."""
        used = {a for f in self.flows_at(site) for a in (f.source, f.target)}
        return [c for c in self.model.clusters if c.alias in used]

    def mirror_at(self, site: str) -> MirrorConfig:
        """The runtime config of the mirror a site runs: its own flows but the stopped ones, and the clusters its
        flows name."""
        aliases = {c.alias for c in self.clusters_at(site)}
        return self.mirror_config.model_copy(
            update={
                "flows": [f for f in self.flows_at(site) if f.name not in self.model.stopped],
                "clusters": [c for c in self.mirror_config.clusters if c.alias in aliases],
            }
        )

    def hubs(self, alias: str) -> list[HubSpec]:
        """Every hub an Event Hubs cluster needs (infra.hubs)."""
        return plan_hubs(self.mirror_config, self.model.clusters, alias)


class _Keys:
    """The stack's config, falling back for shared keys to the file of the topology it is a part of."""

    def __init__(self, config: pulumi.Config) -> None:
        self.config = config
        self.topology = config.get("topology")
        self.shared: dict[str, Any] = {}
        if self.topology is not None:
            path = topology_file(self.topology)
            if not path.is_file():
                where = path.relative_to(STACKS_DIR.parent)
                raise ConfigError(f"{PROJECT}:topology: no topology '{self.topology}': there is no file {where}")
            raw = yaml.safe_load(path.read_text()).get("config") or {}
            self.shared = {k.removeprefix(f"{PROJECT}:"): v for k, v in raw.items()}

    def get(self, key: str) -> Any:
        own = self.config.get_object(key) if key in STRUCTURED_KEYS else self.config.get(key)
        return own if own is not None or key in SECRET_KEYS else self.shared.get(key)

    def get_bool(self, key: str) -> bool | None:
        own = self.config.get_bool(key)
        return own if own is not None else self.shared.get(key)


def topology_file(topology: str) -> Path:
    """Where the keys a topology's part stacks share are: stacks/topologies/<topology>.yaml."""
    return TOPOLOGIES_DIR / f"{topology}.yaml"


def read_part(config: pulumi.Config) -> Part | None:
    text = config.get("part")
    return None if text is None else parse_part(text)


@dataclass(frozen=True)
class PlatformSettings:
    stack: str
    spec: PlatformSpec


def load_platform(config: pulumi.Config) -> PlatformSettings:
    """A platform stack's settings: `mirrorkit:platform`, checked."""
    return PlatformSettings(pulumi.get_stack(), _validated(PlatformSpec, config.get_object("platform") or {}))


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], raw: Any) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        # Whole-object checks here say `field: problem`; fold the field into the key path.
        lines = str(ConfigError.from_validation(PROJECT, err)).splitlines()
        raise ConfigError("\n".join(_FIELD_IN_MESSAGE.sub(r"\1.\2: ", line) for line in lines)) from None


# A tag can be moved to another image under a running mirror, and each node's cache keeps what it pulled first, so
# driver and executors could run different builds: the stack names the image by its digest.
PINNED_IMAGE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")


def pinned_image(image: str | None) -> str:
    """The mirror image as the stack names it, pinned by digest (`images/mirror/build` prints it)."""
    if not image:
        raise ConfigError(f"{PROJECT}:image: missing; give the mirror image pinned by its digest, as in"
                          " registry.example/mirrorkit/mirror@sha256:<64 hex digits>")  # fmt: skip
    if not PINNED_IMAGE.match(image):
        raise ConfigError(
            f"{PROJECT}:image: '{image}' is not pinned by digest; name it as <repository>@sha256:<64 hex digits>"
            " (the digest images/mirror/build prints, or the registry's), so every pod runs the same build"
        )
    return image


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    """Read and check the whole stack; raise ConfigError naming the first bad keys."""
    keys = _Keys(config or pulumi.Config(PROJECT))
    part = read_part(keys.config)
    raw = {k: v for k in STRUCTURED_KEYS if (v := keys.get(k)) is not None}
    for key in ("sites", "clusters", "flows"):
        if key not in raw:
            raise ConfigError(f"{PROJECT}:{key}: missing; the stack file must give it")
    image = pinned_image(keys.get("image"))
    model = _validated(StackModel, raw)
    stack = pulumi.get_stack()
    deployment = keys.topology or stack
    namespace = keys.get("namespace") or f"{PROJECT}-{deployment}"
    errors = name_errors(deployment, namespace, [s.name for s in model.sites])
    if errors:
        raise ConfigError("\n".join(errors))
    mirror = render_mirror(model, deployment)
    site_of_flow = check(model, mirror, part)
    mirror = in_site_regions(model, mirror, site_of_flow, deployment)
    protect = keys.get_bool("protectData")
    settings = StackSettings(
        stack=stack,
        deployment=deployment,
        part=part,
        namespace=namespace,
        image=image,
        spark_operator=keys.get_bool("sparkOperator") or False,
        monitoring=keys.get_bool("monitoring") or False,
        protect_data=True if protect is None else protect,
        model=model,
        mirror_config=mirror,
        site_of_flow=site_of_flow,
    )
    if part is not None and part not in settings.parts:
        raise ConfigError(
            f"{PROJECT}:part: '{part}' is not a part of topology '{deployment}'"
            f" (its parts: {', '.join(map(str, settings.parts))})"
        )
    regions = spanned_regions(model)
    if part is None and len(regions) > 1:
        pulumi.log.warn(
            f"stack '{stack}' deploys topology '{deployment}' whole, across {', '.join(regions)}: not for DR use. With"
            " one of those regions down this stack can neither preview nor update (every call into the lost region"
            " fails), so nothing of it, the surviving region's mirror included, can be changed until that region is"
            " back. Deploy it as its per-region set of stacks instead (docs/deploy/regions.md)."
        )
    return settings


def spanned_regions(model: StackModel) -> list[str]:
    """The regions a one-stack deployment makes resources in: its sites' and its MSK and Event Hubs clusters' (a
    self-managed cluster's region only places it)."""
    return sorted({s.region for s in model.sites} | {c.region for c in model.clusters if c.kafka is None})
