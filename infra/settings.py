"""The program's entry to its settings: read the stack config once, check all of it, and hand back StackSettings.

Everything is checked here, before any resource exists: the schema (infra.schema), the Kubernetes names
(infra.naming), the mirror's own config as spark_app validates it (infra.render), then the rules across keys
(infra.checks). A bad stack therefore fails at `pulumi preview` with the key path as the user wrote it, e.g.
`mirrorkit:flows[1].target: unknown cluster 'dr2'`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pulumi
from pydantic import ValidationError

from infra.checks import check
from infra.hubs import HubSpec, plan_hubs
from infra.naming import PROJECT, app_name, name_errors, operator_name
from infra.render import render_mirror
from infra.schema import ClusterSpec, SiteSpec, StackModel
from spark_app.config import ConfigError, FlowConfig, MirrorConfig

_FIELD_IN_MESSAGE = re.compile(rf"^({PROJECT}:[^:\s]+): ([a-z_]+): ")
STRUCTURED_KEYS = ("sites", "clusters", "flows", "mirror", "placement", "credentials", "kubeconfigs")


@dataclass(frozen=True)
class StackSettings:
    stack: str
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
        return operator_name(self.stack)

    def app_name(self, site: str) -> str:
        return app_name(self.stack, site)

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
        """The runtime config of the mirror a site runs: its own flows and the clusters they name."""
        aliases = {c.alias for c in self.clusters_at(site)}
        return self.mirror_config.model_copy(
            update={
                "flows": self.flows_at(site),
                "clusters": [c for c in self.mirror_config.clusters if c.alias in aliases],
            }
        )

    def hubs(self, alias: str) -> list[HubSpec]:
        """Every hub an Event Hubs cluster needs (infra.hubs)."""
        return plan_hubs(self.mirror_config, self.model.clusters, alias)


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    """Read and check the whole stack; raise ConfigError naming the first bad keys."""
    config = config or pulumi.Config(PROJECT)
    raw = {k: v for k in STRUCTURED_KEYS if (v := config.get_object(k)) is not None}
    for key in ("sites", "clusters", "flows"):
        if key not in raw:
            raise ConfigError(f"{PROJECT}:{key}: missing; the stack file must give it")
    image = config.get("image")
    if not image:
        raise ConfigError(f"{PROJECT}:image: missing; give the mirror image with its tag")
    try:
        model = StackModel.model_validate(raw)
    except ValidationError as err:
        # Whole-object checks here say `field: problem`; fold the field into the key path.
        lines = str(ConfigError.from_validation(PROJECT, err)).splitlines()
        raise ConfigError("\n".join(_FIELD_IN_MESSAGE.sub(r"\1.\2: ", line) for line in lines)) from None
    stack = pulumi.get_stack()
    namespace = config.get("namespace") or f"{PROJECT}-{stack}"
    errors = name_errors(stack, namespace, [s.name for s in model.sites])
    if errors:
        raise ConfigError("\n".join(errors))
    mirror = render_mirror(model, stack)
    protect = config.get_bool("protectData")
    return StackSettings(
        stack=stack,
        namespace=namespace,
        image=image,
        spark_operator=config.get_bool("sparkOperator") or False,
        monitoring=config.get_bool("monitoring") or False,
        protect_data=True if protect is None else protect,
        model=model,
        mirror_config=mirror,
        site_of_flow=check(model, mirror),
    )
