"""The Pulumi program: stack config -> validated settings -> resources and the rendered mirror config."""

import pulumi

from infra.settings import load_settings

settings = load_settings()
pulumi.export("namespace", settings.namespace)
pulumi.export("mirror_config", settings.mirror.to_yaml())
