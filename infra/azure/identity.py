"""The mirror's Entra ID identity, for Event Hubs namespaces with local (SAS) auth disabled and abfss checkpoints.

Azure workload identity: a user-assigned managed identity trusts the site's service-account tokens (a federated
credential for the cluster's OIDC issuer and `system:serviceaccount:<ns>:<sa>`), holds the Event Hubs data roles
on each namespace, and the service account names it, so the webhook hands its pods a token file that
spark_app's `eventhubs-entra` profile trades for an Entra ID token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_azure_native import authorization, managedidentity

from infra.naming import first_names

# Built-in roles: Azure Event Hubs Data Sender and Data Receiver (the SAS rule's Send and Listen).
DATA_ROLES = {"sender": "2b629674-e913-4c01-ae53-ef4638d8f975", "receiver": "a638d3c7-ab3a-418d-83e6-5f17a39d4fde"}
TOKEN_AUDIENCE = "api://AzureADTokenExchange"
CLIENT_ID_ANNOTATION = "azure.workload.identity/client-id"
POD_LABELS = {"azure.workload.identity/use": "true"}
# Where the webhook projects the service-account token, and what else it sets; off AKS the program does the same.
TOKEN_DIR = "/var/run/secrets/azure/tokens"
TOKEN_PATH = "azure-identity-token"
TOKEN_FILE = f"{TOKEN_DIR}/{TOKEN_PATH}"
TOKEN_SECONDS = 3600
AUTHORITY_HOST = "https://login.microsoftonline.com/"


@dataclass(frozen=True)
class TokenByHand:
    """What Azure workload identity's webhook adds to a pod, for clusters where it does not run: a service-account
    token for Entra ID's audience, mounted where the webhook would put it, and the AZURE_* variables that name it."""

    volume: dict[str, Any]
    mount: dict[str, Any]
    env: dict[str, pulumi.Input[str]]


def token_by_hand(client_id: pulumi.Input[str], tenant_id: pulumi.Input[str]) -> TokenByHand:
    token = {"audience": TOKEN_AUDIENCE, "expirationSeconds": TOKEN_SECONDS, "path": TOKEN_PATH}
    return TokenByHand(
        volume={"name": TOKEN_PATH, "projected": {"sources": [{"serviceAccountToken": token}]}},
        mount={"name": TOKEN_PATH, "mountPath": TOKEN_DIR, "readOnly": True},
        env={
            "AZURE_CLIENT_ID": client_id,
            "AZURE_TENANT_ID": tenant_id,
            "AZURE_FEDERATED_TOKEN_FILE": TOKEN_FILE,
            "AZURE_AUTHORITY_HOST": AUTHORITY_HOST,
        },
    )


@dataclass(frozen=True)
class RoleGrant:
    """A role the identity holds beyond the Event Hubs data roles, e.g. on the checkpoints' container."""

    name: str
    scope: pulumi.Input[str]
    role_id: str  # a built-in role's id
    condition: str | None = None  # ABAC, version 2.0


@dataclass(frozen=True)
class MirrorEntraIdentityArgs:
    resource_group_name: pulumi.Input[str]  # where the identity lives: the first namespace's group
    location: str
    oidc_issuer_url: str  # the site's service-account token issuer
    namespace: str
    service_accounts: Sequence[str]  # the driver's and the executors': both run Kafka clients
    namespace_ids: Mapping[str, pulumi.Input[str]]  # cluster alias -> Event Hubs namespace ARM id
    grants: Sequence[RoleGrant] = ()


class MirrorEntraIdentity(pulumi.ComponentResource):
    """A managed identity the mirror's service account federates with, allowed to send and receive, nothing more."""

    client_id: pulumi.Output[str]
    service_account_annotations: dict[str, pulumi.Input[str]]
    pod_labels: dict[str, str]

    def __init__(self, name: str, args: MirrorEntraIdentityArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("mirrorkit:azure:MirrorEntraIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        identity = managedidentity.UserAssignedIdentity(
            f"{name}-identity", resource_group_name=args.resource_group_name, location=args.location, opts=child
        )
        # What a pod needs before it can sign in; the mirror's SparkApplication waits for these.
        self.ready: list[pulumi.Resource] = []
        # Azure refuses concurrent writes of federated credentials on one identity (409
        # ConcurrentFederatedIdentityCredentialsWritesForSingleManagedIdentity): each waits for the one before.
        previous: list[pulumi.Resource] = []
        for account in args.service_accounts:
            credential = managedidentity.FederatedIdentityCredential(
                f"{name}-federation-{account}",
                resource_group_name=args.resource_group_name,
                resource_name_=identity.name,
                issuer=args.oidc_issuer_url,
                subject=f"system:serviceaccount:{args.namespace}:{account}",
                audiences=[TOKEN_AUDIENCE],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=previous,
                    aliases=[
                        pulumi.Alias(name=n) for n in first_names(f"{name}-federation", account, args.service_accounts)
                    ],
                ),
            )
            self.ready.append(credential)
            previous = [credential]
        client = authorization.get_client_config_output(opts=pulumi.InvokeOutputOptions(parent=self))
        subscription = client.subscription_id
        data_roles = [
            RoleGrant(f"{alias}-{role}", namespace_id, role_id)
            for alias, namespace_id in args.namespace_ids.items()
            for role, role_id in DATA_ROLES.items()
        ]
        for grant in [*data_roles, *args.grants]:
            self.ready.append(
                authorization.RoleAssignment(
                    f"{name}-{grant.name}",
                    principal_id=identity.principal_id,
                    principal_type=authorization.PrincipalType.SERVICE_PRINCIPAL,
                    role_definition_id=pulumi.Output.concat(
                        "/subscriptions/",
                        subscription,
                        "/providers/Microsoft.Authorization/roleDefinitions/",
                        grant.role_id,
                    ),
                    scope=grant.scope,
                    condition=grant.condition,
                    condition_version="2.0" if grant.condition else None,
                    opts=child,
                )
            )
        self.client_id = identity.client_id
        self.tenant_id: pulumi.Output[str] = client.tenant_id
        self.service_account_annotations = {CLIENT_ID_ANNOTATION: identity.client_id}
        self.pod_labels = dict(POD_LABELS)
        self.register_outputs({"client_id": self.client_id})
