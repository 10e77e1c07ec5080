"""The Pulumi program: stack config -> validated settings -> resources and the rendered mirror config.

No credential is a stack output: the Event Hubs connection string goes only into the mirror's Kubernetes Secret."""

import pulumi

from infra.settings import load_settings
from infra.topology import build

topology = build(load_settings())
for site, config in topology.mirror_configs.items():
    pulumi.export(f"mirror_config_{site}", config)
for alias, hubs in topology.event_hubs.items():
    pulumi.export(f"eventhubs_{alias}_namespace", hubs.namespace_name)
for site, role in topology.roles.items():
    pulumi.export(f"mirror_role_{site}", role.role_arn)
