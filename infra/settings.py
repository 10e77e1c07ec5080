"""Stack config -> typed settings. Everything is validated here, before any resource exists."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from spark_app.config import ConfigError, MirrorConfig, parse_config

PROJECT = "mirrorkit"


@dataclass(frozen=True)
class StackSettings:
    namespace: str
    image: str
    mirror: MirrorConfig


def load_settings(config: pulumi.Config | None = None) -> StackSettings:
    config = config or pulumi.Config(PROJECT)
    raw_mirror = config.get_object("mirror")
    if raw_mirror is None:
        raise ConfigError(f"{PROJECT}:mirror: missing; the stack file must give the mirror's clusters and flows")
    return StackSettings(
        namespace=config.get("namespace") or "mirrorkit",
        image=config.require("image"),
        mirror=parse_config(raw_mirror, source=f"{PROJECT}:mirror"),
    )
