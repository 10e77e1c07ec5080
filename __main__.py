"""The Pulumi program: stack config -> validated settings -> resources, the rendered mirror config and the outputs
the other stacks of a set read (infra.parts). A platform stack holds only the Spark Operator of one cluster."""

import pulumi

from infra.naming import PROJECT
from infra.settings import load_platform, load_settings, read_part
from infra.topology import build, build_platform, exports

config = pulumi.Config(PROJECT)
part = read_part(config)
outputs = build_platform(load_platform(config)) if part and part.kind == "platform" else exports(build(load_settings()))
for key, value in outputs.items():
    pulumi.export(key, value)
