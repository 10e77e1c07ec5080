"""A stack cluster as the mirror sees it: ClusterSpec -> spark_app's ClusterConfig, how to reach the cluster and
where its secrets are mounted in the pod (never the secrets themselves)."""

from __future__ import annotations

from infra.naming import SECRETS_DIR
from infra.schema import ClusterSpec, SignIn
from spark_app.config import ClusterConfig, Profile, SecretRef

# Looked up from the MSK cluster at deploy time; stands in while the stack is validated.
PENDING_BOOTSTRAP = "bootstrap.pending.invalid"
# spark_app's msk-scram profile is SASL_SSL SCRAM-SHA-512, which self-managed SCRAM listeners speak too.
PROFILES: dict[SignIn, Profile] = {
    "none": Profile.KAFKA,
    "tls": Profile.KAFKA,
    "sas": Profile.EVENTHUBS,
    "entra": Profile.EVENTHUBS_ENTRA,
    "scram": Profile.MSK_SCRAM,
    "iam": Profile.MSK_IAM,
    "mtls": Profile.MTLS,
}


def _bootstrap_servers(spec: ClusterSpec) -> str:
    """As the stack gives them; for MSK, looked up at deploy time (PENDING_BOOTSTRAP until then) on the auth port."""
    if spec.eventhubs is not None:
        return spec.eventhubs.bootstrap_servers
    if spec.msk is not None:
        return f"{PENDING_BOOTSTRAP}:{spec.msk.port}"
    return spec.self_managed.bootstrap_servers


def cluster_config(spec: ClusterSpec) -> ClusterConfig:
    """The spark_app view of a stack cluster; spark_app validates it (its client_overrides, say) as it is made."""
    sign_in = spec.sign_in
    secrets = f"{SECRETS_DIR}/{spec.alias}"
    username = spec.msk.username if spec.msk is not None else spec.kafka.username if spec.kafka is not None else None
    return ClusterConfig(
        alias=spec.alias,
        bootstrap_servers=_bootstrap_servers(spec),
        profile=PROFILES[sign_in],
        tls=sign_in == "tls",
        ca_file=spec.kafka.ca_file if spec.kafka is not None else None,
        username=username if sign_in == "scram" else None,
        password=SecretRef(file=f"{secrets}/password") if sign_in in ("sas", "scram") else None,
        client_cert_file=f"{secrets}/client_cert" if sign_in == "mtls" else None,
        client_key=SecretRef(file=f"{secrets}/client_key") if sign_in == "mtls" else None,
        region=spec.region if sign_in == "iam" else None,
        client_overrides=spec.client_overrides,
    )
