"""An Event Hubs namespace with one hub per topic the mirror writes there, and a Send/Listen rule for the mirror.

Every hub keeps the producer's timestamp (`messageTimestampDescription.timestampType: Create`, ARM API
2024-05-01-preview and later); otherwise a hub stamps append time and the DR copy loses the source's timestamps.
azure-native 3.x (up to 3.29.0, the newest on PyPI) ships only API 2024-01-01, which lacks that property, and its
other API versions need `pulumi package add`, i.e. a locally generated SDK. azure-native 2.92.3 ships the
2024-05-01-preview module, so the whole component uses that one API version.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import resources
from pulumi_azure_native.eventhub import v20240501preview as eventhub

from infra.hubs import HubSpec
from infra.schema import EventHubsSpec, Tier

RULE_NAME = "mirrorkit"


@dataclass(frozen=True)
class EventHubsArgs:
    spec: EventHubsSpec
    location: str
    hubs: Sequence[HubSpec]  # from StackSettings.hubs: names by spark_app's policy, sized from the source
    # The namespace and its hubs hold the DR copy: Pulumi may delete them (a topic dropped from a flow, a destroyed
    # stack) only when the stack turns protection off.
    protect: bool = True


class EventHubs(pulumi.ComponentResource):
    """A Kafka-enabled namespace, its hubs and consumer groups, the mirror's rule and optional Geo-DR pairing.

    With local auth disabled there is no SAS rule and no connection string: the mirror signs in with Entra ID
    (MirrorEntraIdentity grants it the data roles on `namespace_id`).
    """

    connection_string: pulumi.Output[str] | None
    namespace_name: pulumi.Output[str]
    namespace_id: pulumi.Output[str]
    resource_group_name: pulumi.Input[str]

    def __init__(self, name: str, args: EventHubsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:azure:EventHubs", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)
        # The namespace and its resource group: neither deleted nor destroyed with the stack (protect), and kept in
        # Azure if ever dropped from it. A hub is kept but not protected: a topic dropped from a flow leaves the
        # stack and keeps its data, where a protected hub would fail every later update.
        data = pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect)
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=args.protect)
        if spec.existing_resource_group:
            group_name: pulumi.Input[str] = spec.resource_group
        else:
            group = resources.ResourceGroup(
                f"{name}-rg", resource_group_name=spec.resource_group, location=args.location, opts=data
            )
            group_name = group.name
        # Dedicated namespaces live on an existing Event Hubs cluster and take the Standard SKU there.
        sku_name = Tier.STANDARD.value if spec.tier is Tier.DEDICATED else spec.tier.value
        namespace = eventhub.Namespace(
            f"{name}-ns",
            namespace_name=spec.namespace,
            resource_group_name=group_name,
            location=args.location,
            sku=eventhub.SkuArgs(name=sku_name, tier=sku_name, capacity=spec.capacity),
            cluster_arm_id=spec.dedicated_cluster_id,
            kafka_enabled=True,
            is_auto_inflate_enabled=spec.auto_inflate_max is not None,
            maximum_throughput_units=spec.auto_inflate_max,
            zone_redundant=spec.zone_redundant,
            minimum_tls_version=eventhub.TlsVersion.TLS_VERSION_1_2,
            public_network_access=spec.public_network_access,
            disable_local_auth=spec.disable_local_auth,
            opts=data,
        )
        if spec.public_network_access == "Enabled":
            # The Kafka endpoint is public: only the listed addresses reach it (settings require at least one).
            eventhub.NamespaceNetworkRuleSet(
                f"{name}-network",
                namespace_name=namespace.name,
                resource_group_name=group_name,
                default_action=eventhub.DefaultAction.DENY,
                public_network_access=eventhub.PublicNetworkAccessFlag.ENABLED,
                ip_rules=[
                    eventhub.NWRuleSetIpRulesArgs(ip_mask=ip, action=eventhub.NetworkRuleIPAction.ALLOW)
                    for ip in spec.allowed_ips
                ],
                trusted_service_access_enabled=False,
                opts=child,
            )
        self.hubs: dict[str, eventhub.EventHub] = {}
        for hub in args.hubs:
            retention = (
                eventhub.RetentionDescriptionArgs(
                    cleanup_policy=eventhub.CleanupPolicyRetentionDescription.COMPACT,
                    tombstone_retention_time_in_hours=spec.retention_hours,
                )
                if hub.compacted
                else eventhub.RetentionDescriptionArgs(
                    cleanup_policy=eventhub.CleanupPolicyRetentionDescription.DELETE,
                    retention_time_in_hours=spec.retention_hours,
                )
            )
            self.hubs[hub.name] = eventhub.EventHub(
                f"{name}-{hub.name}",
                event_hub_name=hub.name,
                namespace_name=namespace.name,
                resource_group_name=group_name,
                partition_count=hub.partitions,
                retention_description=retention,
                message_timestamp_description=eventhub.MessageTimestampDescriptionArgs(
                    timestamp_type=eventhub.TimestampType.CREATE
                ),
                opts=kept,
            )
            for group_name_ in spec.consumer_groups:
                eventhub.ConsumerGroup(
                    f"{name}-{hub.name}-{group_name_}",
                    consumer_group_name=group_name_,
                    event_hub_name=self.hubs[hub.name].name,
                    namespace_name=namespace.name,
                    resource_group_name=group_name,
                    opts=child,
                )
        pairing = None
        if spec.geo_dr is not None:
            pairing = eventhub.DisasterRecoveryConfig(
                f"{name}-geo-dr",
                alias=spec.geo_dr.alias,
                namespace_name=namespace.name,
                resource_group_name=group_name,
                partner_namespace=spec.geo_dr.partner_namespace_id,
                opts=child,
            )
        self.connection_string = (
            None if spec.disable_local_auth else self._sas_rule(name, spec, namespace, group_name, pairing)
        )
        self.namespace_name = namespace.name
        self.namespace_id = namespace.id
        self.resource_group_name = group_name
        self.register_outputs(
            {
                "namespace_name": self.namespace_name,
                "namespace_id": self.namespace_id,
                "connection_string": self.connection_string,
            }
        )

    def _sas_rule(
        self,
        name: str,
        spec: EventHubsSpec,
        namespace: eventhub.Namespace,
        group_name: pulumi.Input[str],
        pairing: eventhub.DisasterRecoveryConfig | None,
    ) -> pulumi.Output[str]:
        """The mirror's Send/Listen rule (Manage only when asked); its connection string only ever as a secret.

        With Geo-DR, the alias's connection string: it names the alias, which a failover moves to the partner."""
        rights = [eventhub.AccessRights.SEND, eventhub.AccessRights.LISTEN]
        if spec.manage_rights:
            rights.append(eventhub.AccessRights.MANAGE)
        rule = eventhub.NamespaceAuthorizationRule(
            f"{name}-rule",
            authorization_rule_name=RULE_NAME,
            namespace_name=namespace.name,
            resource_group_name=group_name,
            rights=rights,
            opts=pulumi.ResourceOptions(parent=self),
        )
        if pairing is not None:
            alias_keys = eventhub.list_disaster_recovery_config_keys_output(
                alias=pairing.name,
                authorization_rule_name=rule.name,
                namespace_name=namespace.name,
                resource_group_name=group_name,
                opts=pulumi.InvokeOutputOptions(parent=self),
            )
            return pulumi.Output.secret(alias_keys.alias_primary_connection_string)
        keys = eventhub.list_namespace_keys_output(
            authorization_rule_name=rule.name,
            namespace_name=namespace.name,
            resource_group_name=group_name,
            opts=pulumi.InvokeOutputOptions(parent=self),
        )
        return pulumi.Output.secret(keys.primary_connection_string)
