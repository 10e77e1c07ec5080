"""Checkpoints in Azure Data Lake Storage (abfss://): the container (made and protected, or taken as it is), the
role that lets the mirror's Entra identity reach its own prefixes only, and Spark's abfss settings that sign in
with the pod's workload identity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import authorization, storage

from infra.azure.identity import TOKEN_FILE

# Built-in role: Storage Blob Data Contributor, narrowed by an ABAC condition to the mirror's prefixes.
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
TOKEN_PROVIDER = "org.apache.hadoop.fs.azurebfs.oauth2.WorkloadIdentityTokenProvider"
_BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
# A prefix itself, or anything below it; never a sibling that merely starts with the same characters.
_AT_OR_UNDER = (("StringEquals", ""), ("StringStartsWith", "/"))


@dataclass(frozen=True)
class CheckpointContainerArgs:
    account: str
    container: str
    resource_group: str
    existing: bool  # take it as it is: no resource, so Pulumi never changes or deletes it
    protect: bool


class CheckpointContainer(pulumi.ComponentResource):
    """The container the mirrors' checkpoints live in, in an existing storage account, with no public access."""

    scope: pulumi.Output[str]  # its ARM id, where the mirror's role assignment goes

    def __init__(self, name: str, args: CheckpointContainerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:azure:CheckpointContainer", name, None, opts)
        if not args.existing:
            storage.BlobContainer(
                f"{name}-container",
                account_name=args.account,
                container_name=args.container,
                resource_group_name=args.resource_group,
                public_access=storage.PublicAccess.NONE,
                opts=pulumi.ResourceOptions(parent=self, protect=args.protect, retain_on_delete=args.protect),
            )
        subscription = authorization.get_client_config_output(
            opts=pulumi.InvokeOutputOptions(parent=self)
        ).subscription_id
        self.scope = pulumi.Output.concat(
            "/subscriptions/",
            subscription,
            f"/resourceGroups/{args.resource_group}/providers/Microsoft.Storage/storageAccounts/{args.account}",
            f"/blobServices/default/containers/{args.container}",
        )
        self.register_outputs({"scope": self.scope})


def prefix_condition(prefixes: Sequence[str]) -> str:
    """An ABAC condition: blob reads, writes and deletes only on each prefix (the checkpoint root itself, a directory
    on a hierarchical namespace) and under it, and listings only of those. A listing is a read with the `Blob.List`
    suboperation and carries the listed prefix instead of a blob path, so it takes a clause of its own; a listing
    of the whole container (no prefix) is refused."""
    data = ("write", "delete", "add/action", "move/action")
    roots = sorted(prefixes)
    reads = f"!(ActionMatches{{'{_BLOBS}/read'}} AND NOT SubOperationMatches{{'Blob.List'}})"
    on_blobs = " AND ".join([reads, *(f"!(ActionMatches{{'{_BLOBS}/{a}'}})" for a in data)])
    at_path = " OR ".join(f"@Resource[{_BLOBS}:path] {op} '{p}{tail}'" for p in roots for op, tail in _AT_OR_UNDER)
    listing = f"!(ActionMatches{{'{_BLOBS}/read'}} AND SubOperationMatches{{'Blob.List'}})"
    listed = " OR ".join(f"@Request[{_BLOBS}:prefix] {op} '{p}{tail}'" for p in roots for op, tail in _AT_OR_UNDER)
    return f"(({on_blobs}) OR ({at_path})) AND (({listing}) OR ({listed}))"


def abfss_conf(
    account: str, client_id: pulumi.Input[str], tenant_id: pulumi.Input[str]
) -> dict[str, pulumi.Input[str]]:
    """Spark's abfss settings for the account: OAuth with the pod's federated token, never a key."""
    host = f"{account}.dfs.core.windows.net"
    return {
        f"spark.hadoop.fs.azure.account.auth.type.{host}": "OAuth",
        f"spark.hadoop.fs.azure.account.oauth.provider.type.{host}": TOKEN_PROVIDER,
        f"spark.hadoop.fs.azure.account.oauth2.client.id.{host}": client_id,
        f"spark.hadoop.fs.azure.account.oauth2.msi.tenant.{host}": tenant_id,
        f"spark.hadoop.fs.azure.account.oauth2.token.file.{host}": TOKEN_FILE,
    }
