"""Client settings per platform, in both dialects the mirror speaks.

Users know Kafka's Java client names: the profile table, `client_overrides` and `describe` speak them. Every
client the mirror runs (the copier, topic sync, the DR loop) is confluent-kafka, which takes librdkafka names, so
`librdkafka_settings` translates the one table and the two cannot drift. Explicit `client_overrides` win over the
profile. Secrets are read here, at run time, from the env var or file the config names; they are never logged and
never part of an error message.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .config import ENTRA_JAVA_HANDLER_KEY, ClusterConfig, ConfigError, Profile, SecretRef

Role = Literal["consumer", "producer", "admin"]

# Event Hubs: Azure's load balancer drops idle TCP after 4 minutes, so both idle limits stay under it; the service
# enforces a 20 s minimum request timeout and a 1 MB request cap.
_EVENTHUBS_TUNING = {
    "connections.max.idle.ms": "180000",
    "metadata.max.age.ms": "180000",
    "request.timeout.ms": "60000",
}
_EVENTHUBS_PRODUCER = {"max.request.size": "1000000", "compression.type": "none"}
# Java names that librdkafka spells differently; the rest carry over as they are.
_TO_LIBRDKAFKA = {"max.request.size": "message.max.bytes"}
# Java-only names with no librdkafka counterpart.
_JAVA_ONLY = {"max.request.size", "sasl.jaas.config", "ssl.truststore.type", "ssl.truststore.location"}
# What Azure workload identity's admission webhook puts in a pod labelled azure.workload.identity/use=true whose
# service account carries azure.workload.identity/client-id.
WORKLOAD_IDENTITY_ENV = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST")
_CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"


class SecretError(ConfigError):
    pass


def read_secret(ref: SecretRef, what: str) -> str:
    """The secret's value; errors name where it was looked for, never what it holds."""
    if ref.env is not None:
        value = os.environ.get(ref.env)
        if not value:
            raise SecretError(f"{what}: env var {ref.env} is not set")
        return value
    try:
        return Path(ref.file).read_text().strip()
    except OSError as err:
        raise SecretError(f"{what}: cannot read secret file {ref.file}: {err.strerror}") from None


def java_settings(cluster: ClusterConfig, role: Role) -> dict[str, str]:
    """Java client properties for this cluster and role."""
    conf = {"bootstrap.servers": cluster.bootstrap_servers, "security.protocol": _protocol(cluster)}
    trust = {"ssl.truststore.type": "PEM", "ssl.truststore.location": cluster.ca_file} if cluster.ca_file else {}
    what = f"cluster '{cluster.alias}'"
    if cluster.profile is Profile.EVENTHUBS:
        secret = _jaas_quote(read_secret(cluster.password, f"{what} password"))
        conf |= {
            "sasl.mechanism": "PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="$ConnectionString" password="{secret}";',
            **_EVENTHUBS_TUNING,
            **(_EVENTHUBS_PRODUCER if role == "producer" else {}),
        }
    elif cluster.profile is Profile.EVENTHUBS_ENTRA:
        # A Java client also needs a login callback handler, from client_overrides; librdkafka uses `oauth_cb`.
        conf |= {
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            **_EVENTHUBS_TUNING,
            **(_EVENTHUBS_PRODUCER if role == "producer" else {}),
        }
    elif cluster.profile is Profile.MSK_SCRAM:
        secret = _jaas_quote(read_secret(cluster.password, f"{what} password"))
        conf |= {
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{_jaas_quote(cluster.username)}" password="{secret}";',
        }
    elif cluster.profile is Profile.MSK_IAM:
        conf |= {
            "sasl.mechanism": "AWS_MSK_IAM",
            "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
            "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
        }
    elif cluster.profile is Profile.MTLS:
        if cluster.client_key.file is None:
            raise SecretError(f"{what} client_key: the Java clients need it as a file (PEM key and chain)")
        conf |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": cluster.client_key.file}
    return conf | trust | cluster.client_overrides


def librdkafka_settings(cluster: ClusterConfig, role: Role) -> dict[str, object]:
    """confluent-kafka settings for this cluster and role."""
    java = java_settings(cluster, role)
    conf: dict[str, object] = {
        _TO_LIBRDKAFKA.get(k, k): v for k, v in java.items() if k not in _JAVA_ONLY or k in _TO_LIBRDKAFKA
    }
    conf.pop("ssl.keystore.type", None)
    conf.pop("ssl.keystore.location", None)
    conf.pop("sasl.client.callback.handler.class", None)
    conf.pop(ENTRA_JAVA_HANDLER_KEY, None)
    if cluster.ca_file:
        conf["ssl.ca.location"] = cluster.ca_file
    what = f"cluster '{cluster.alias}'"
    if cluster.profile is Profile.EVENTHUBS:
        conf |= {"sasl.username": "$ConnectionString", "sasl.password": read_secret(cluster.password, what)}
    elif cluster.profile is Profile.MSK_SCRAM:
        conf |= {"sasl.username": cluster.username, "sasl.password": read_secret(cluster.password, what)}
    elif cluster.profile is Profile.EVENTHUBS_ENTRA:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": _entra_token(cluster)}
    elif cluster.profile is Profile.MSK_IAM:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": _msk_iam_token(cluster.region)}
    elif cluster.profile is Profile.MTLS:
        conf |= {"ssl.certificate.location": cluster.client_cert_file, "ssl.key.location": cluster.client_key.file}
    if role == "producer" and cluster.is_eventhubs:
        conf["socket.keepalive.enable"] = True
    return conf


def redacted(settings: dict[str, object]) -> dict[str, object]:
    """Settings fit for a log line or `describe`."""
    secret_words = ("password", "jaas", "secret", "oauth_cb", "key.pem", "ssl.key")
    return {k: ("***" if any(w in k for w in secret_words) else v) for k, v in settings.items()}


def _protocol(cluster: ClusterConfig) -> str:
    if cluster.profile is Profile.KAFKA:
        return "SSL" if cluster.tls else "PLAINTEXT"
    return "SSL" if cluster.profile is Profile.MTLS else "SASL_SSL"


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _msk_iam_token(region: str):
    """An OAUTHBEARER callback that signs MSK IAM tokens with the pod's AWS identity."""
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    def callback(_config: str) -> tuple[str, float]:
        token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(region)
        return token, expiry_ms / 1000

    return callback


@dataclass(frozen=True)
class WorkloadIdentity:
    """The pod's Azure workload identity, as the webhook injected it."""

    client_id: str
    tenant_id: str
    token_file: str
    authority_host: str

    @classmethod
    def from_env(cls, what: str) -> WorkloadIdentity:
        missing = [k for k in WORKLOAD_IDENTITY_ENV if not os.environ.get(k)]
        if missing:
            raise SecretError(
                f"{what}: profile 'eventhubs-entra' needs Azure workload identity, but {', '.join(missing)} is not set;"
                " the pod needs the label azure.workload.identity/use=true and a service account annotated with"
                " azure.workload.identity/client-id"
            )
        return cls(*(os.environ[k] for k in WORKLOAD_IDENTITY_ENV))

    @property
    def token_url(self) -> str:
        return f"{self.authority_host.rstrip('/')}/{self.tenant_id}/oauth2/v2.0/token"


def entra_scope(cluster: ClusterConfig) -> str:
    """Event Hubs takes tokens for its namespace host: https://<namespace>.servicebus.windows.net/.default."""
    host = cluster.bootstrap_servers.split(",")[0].strip().rpartition(":")[0]
    return f"https://{host}/.default"


def _entra_token(cluster: ClusterConfig) -> Callable[[str], tuple[str, float]]:
    """An OAUTHBEARER callback that trades the pod's federated token for an Entra ID token for the namespace.

    The webhook's token file is read on every call, because the kubelet rotates it.
    """
    what = f"cluster '{cluster.alias}'"
    identity = WorkloadIdentity.from_env(what)
    scope = entra_scope(cluster)

    def callback(_config: str) -> tuple[str, float]:
        assertion = read_secret(SecretRef(file=identity.token_file), f"{what} federated token")
        form = {
            "grant_type": "client_credentials",
            "client_id": identity.client_id,
            "scope": scope,
            "client_assertion_type": _CLIENT_ASSERTION_TYPE,
            "client_assertion": assertion,
        }
        request = urllib.request.Request(
            identity.token_url,
            data=urllib.parse.urlencode(form).encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                reply = json.load(response)
        except urllib.error.HTTPError as err:
            try:
                code = json.load(err).get("error", "")
            except ValueError:
                code = ""
            raise SecretError(
                f"{what}: Entra ID refused the workload identity token at {identity.token_url}: HTTP {err.code} {code}"
            ) from None
        except urllib.error.URLError as err:
            raise SecretError(f"{what}: cannot reach Entra ID at {identity.token_url}: {err.reason}") from None
        return reply["access_token"], time.time() + float(reply["expires_in"])

    return callback
