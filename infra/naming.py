"""Names and paths a stack derives: the Spark Operator's release, the mirror's application, where a pod finds its
secrets and checkpoints, the stack key of a credential, and the Sids of the program's cluster policy statements.

Kubernetes names derive from the stack, so stacks sharing a cluster never take each other's objects.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

PROJECT = "mirrorkit"  # the stack config's namespace, and the first part of every name below
SECRETS_DIR = "/etc/mirrorkit/secrets"  # a cluster's Kubernetes Secret is mounted at SECRETS_DIR/<alias>
CHECKPOINT_DIR = "/checkpoints"  # the checkpoint PVC's mount on the driver
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A DNS subdomain (RFC 1123): dot-separated labels, at most 253 characters; StorageClass names are these.
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
APP_NAME_MAX = 50  # Spark derives pod and service names from it, within Kubernetes' 63
MIRROR_SID_PREFIX = "Mirrorkit"


def operator_name(stack: str) -> str:
    """The Spark Operator's Helm release and namespace: its cluster-wide objects are named after the release."""
    return f"spark-operator-{stack}"


def app_name(stack: str, site: str) -> str:
    """The SparkApplication of a site: unique across stacks, as alerts and dashboards select on it."""
    return f"{PROJECT}-{stack}-{site}"


def msk_scram_secret_name(stack: str, alias: str) -> str:
    """The Secrets Manager secret of the mirror's SCRAM user on MSK cluster `alias`: MSK reads only `AmazonMSK_`
    names, and one per stack keeps stacks sharing an account apart. Aliases hold no '.', so the last one splits."""
    return f"AmazonMSK_{PROJECT}_{stack}.{alias}"


def mirror_sid(n: int) -> str:
    """The Sid of the program's n-th statement in an MSK cluster policy; a kept statement may not take its prefix."""
    return f"{MIRROR_SID_PREFIX}{n}"


def first_names(name: str, account: str, service_accounts: Sequence[str]) -> list[str]:
    """What a per-service-account resource was named in the first releases, which had only the driver's account
    and no suffix: kept as an alias, so an upgrade leaves the resource in place."""
    return [name] if account == service_accounts[0] else []


def credential_key(alias: str, key: str) -> str:
    """The stack key a cluster's credential file is set at, with `pulumi config set --secret --path`."""
    return f"{PROJECT}:credentials.{alias}.{key}"


def name_errors(stack: str, namespace: str, sites: Sequence[str]) -> list[str]:
    """What is wrong with the Kubernetes names the stack, its namespace and its sites (in stack order) make."""
    errors = []
    if not DNS_LABEL.match(namespace):
        errors.append(f"{PROJECT}:namespace: '{namespace}' is not a Kubernetes namespace name (a DNS label)")
    for i, site in enumerate(sites):
        name = app_name(stack, site)
        if len(name) > APP_NAME_MAX or not DNS_LABEL.match(name):
            errors.append(
                f"{PROJECT}:sites[{i}].name: the mirror's name '{name}' (project, stack, site) is longer than"
                f" {APP_NAME_MAX} characters or not a DNS label; shorten the stack or site name"
            )
    if not DNS_LABEL.match(operator_name(stack)):
        errors.append(f"{PROJECT}: stack '{stack}' makes no valid Helm release name '{operator_name(stack)}'")
    return errors
