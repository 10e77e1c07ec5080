"""Client settings per platform, in librdkafka's names for confluent-kafka and the compiled core, and in Java names
for the real-time slots that copy with Kafka's Java clients on the executors' JVMs (`java_client`).

Each profile says what its platform needs (protocol, SASL mechanism, Event Hubs' limits); a cluster's
`client_overrides` (librdkafka names) win over the profile. The benchmarks, MirrorMaker 2 and the tests' Java tools
take their Java settings from `java_client` too. Secrets are read at run time, from the env var or file the config
names (here, or by the JVM copier on the executor); they are never logged and never part of an error message.
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
from typing import Any, Literal, TypeVar

from .config import ClusterConfig, ConfigError, Profile, SecretRef

Role = Literal["consumer", "producer", "admin"]
# librdkafka settings: strings, numbers and booleans, plus callbacks (oauth_cb, error_cb) that confluent-kafka's
# stubs leave out of their value type, hence Any.
Settings = dict[str, Any]
_T = TypeVar("_T")
OAuthCallback = Callable[[str], tuple[str, float]]

# Event Hubs: Azure's load balancer drops idle TCP after 4 minutes, so both idle limits stay under it; the service
# enforces a 20 s minimum request timeout and a 1 MB request cap, and takes no codec but gzip (or none).
_EVENTHUBS_TUNING = {"connections.max.idle.ms": "180000", "metadata.max.age.ms": "180000"}
# A producer's setting (an admin client is a producer underneath); a consumer only warns that it ignores it.
_EVENTHUBS_REQUESTS = {"request.timeout.ms": "60000"}
_EVENTHUBS_PRODUCER = {"message.max.bytes": "1000000", "compression.type": "none"}
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
    if ref.file is None:
        raise SecretError(f"{what}: the secret names neither an env var nor a file")
    try:
        return Path(ref.file).read_text().strip()
    except OSError as err:
        raise SecretError(f"{what}: cannot read secret file {ref.file}: {err.strerror}") from None


def librdkafka_settings(cluster: ClusterConfig, role: Role) -> Settings:
    """confluent-kafka settings for this cluster and role: the profile's, then the cluster's overrides."""
    conf: Settings = {"bootstrap.servers": cluster.bootstrap_servers, "security.protocol": _protocol(cluster)}
    if cluster.ca_file:
        conf["ssl.ca.location"] = cluster.ca_file
    what = f"cluster '{cluster.alias}'"
    if cluster.profile is Profile.EVENTHUBS:
        conf |= {"sasl.mechanism": "PLAIN", "sasl.username": "$ConnectionString"}
        conf["sasl.password"] = read_secret(_required(cluster.password), what)
    elif cluster.profile is Profile.EVENTHUBS_ENTRA:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": _entra_token(cluster)}
    elif cluster.profile is Profile.MSK_SCRAM:
        conf |= {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": cluster.username}
        conf["sasl.password"] = read_secret(_required(cluster.password), what)
    elif cluster.profile is Profile.MSK_IAM:
        conf |= {"sasl.mechanism": "OAUTHBEARER", "oauth_cb": _msk_iam_token(_required(cluster.region))}
    elif cluster.profile is Profile.MTLS:
        key = _required(cluster.client_key)
        if key.file is None:
            raise SecretError(f"{what} client_key: librdkafka reads the client key from a file, not {key.describe()}")
        conf |= {"ssl.certificate.location": cluster.client_cert_file, "ssl.key.location": key.file}
    if cluster.is_eventhubs:
        conf |= _EVENTHUBS_TUNING | ({} if role == "consumer" else _EVENTHUBS_REQUESTS)
        if role == "producer":
            conf |= _EVENTHUBS_PRODUCER | {"socket.keepalive.enable": True}
    return conf | cluster.client_overrides


# Profiles `java_client` can say in Kafka's Java client names: a password login, a client certificate, or none.
JAVA_PROFILES = frozenset({Profile.KAFKA, Profile.EVENTHUBS, Profile.MSK_SCRAM, Profile.MTLS})


# Tuning keys of `client_overrides` (librdkafka's names) that Kafka's Java clients take too, with their Java names
# and the roles that have them: a cluster whose overrides are all among them is reached from the JVM with them
# (`java_client`), as librdkafka's clients apply them. The keys the copy's guarantees rest on never get here
# (spark_app.config.GUARANTEE_KEYS refuses them at validation).
_BOTH: frozenset[Role] = frozenset({"consumer", "producer", "admin"})
_PRODUCER: frozenset[Role] = frozenset({"producer"})
_CONSUMER: frozenset[Role] = frozenset({"consumer"})
JAVA_TUNING: dict[str, tuple[str, frozenset[Role]]] = {
    "client.id": ("client.id", _BOTH),
    "request.timeout.ms": ("request.timeout.ms", _BOTH),
    "connections.max.idle.ms": ("connections.max.idle.ms", _BOTH),
    "metadata.max.age.ms": ("metadata.max.age.ms", _BOTH),
    "reconnect.backoff.ms": ("reconnect.backoff.ms", _BOTH),
    "reconnect.backoff.max.ms": ("reconnect.backoff.max.ms", _BOTH),
    "retry.backoff.ms": ("retry.backoff.ms", _BOTH),
    "retry.backoff.max.ms": ("retry.backoff.max.ms", _BOTH),
    "socket.connection.setup.timeout.ms": ("socket.connection.setup.timeout.ms", _BOTH),
    "socket.send.buffer.bytes": ("send.buffer.bytes", _BOTH),
    "socket.receive.buffer.bytes": ("receive.buffer.bytes", _BOTH),
    "linger.ms": ("linger.ms", _PRODUCER),
    "batch.size": ("batch.size", _PRODUCER),
    "compression.type": ("compression.type", _PRODUCER),
    "message.max.bytes": ("max.request.size", _PRODUCER),
    "message.timeout.ms": ("delivery.timeout.ms", _PRODUCER),
    "delivery.timeout.ms": ("delivery.timeout.ms", _PRODUCER),
    "fetch.min.bytes": ("fetch.min.bytes", _CONSUMER),
    "fetch.max.bytes": ("fetch.max.bytes", _CONSUMER),
    "fetch.wait.max.ms": ("fetch.max.wait.ms", _CONSUMER),
    "max.partition.fetch.bytes": ("max.partition.fetch.bytes", _CONSUMER),
}


def why_no_java_client(cluster: ClusterConfig) -> str | None:
    """Why the Java clients cannot reach this cluster as its profile says; None when they can. They would need more
    than `java_client` gives: a token callback (Entra ID, MSK IAM), or a `client_overrides` key with no Java name in
    JAVA_TUNING."""
    if cluster.profile not in JAVA_PROFILES:
        return f"cluster '{cluster.alias}': no Java client settings for profile '{cluster.profile.value}'"
    untranslated = sorted(k for k in cluster.client_overrides if k not in JAVA_TUNING)
    if untranslated:
        return (
            f"cluster '{cluster.alias}': client_overrides.{untranslated[0]} is a librdkafka setting the Java clients"
            " have no name for here"
        )
    return None


@dataclass(frozen=True)
class JavaLogin:
    """A SASL password login in the Java clients' words: the login module, the user, and where the password lives (an
    env var or a file, read where the client is made, so it never travels with a task)."""

    module: str
    username: str
    env: str | None
    file: str | None


@dataclass(frozen=True)
class JavaClientKey:
    """An mTLS client certificate (a PEM file) and where its key lives (an env var or a file, PEM, PKCS#8 as Kafka's
    Java clients read it), read where the client is made, so the key never travels with a task."""

    cert_file: str
    env: str | None
    file: str | None


@dataclass(frozen=True)
class JavaClient:
    """A cluster's client settings in Kafka's Java client names, and its login or client key if it has one."""

    alias: str
    settings: dict[str, str]
    login: JavaLogin | None
    client_key: JavaClientKey | None = None


def java_client(cluster: ClusterConfig, role: Role) -> JavaClient | None:
    """The same profile's settings in Kafka's Java client names, for the copier slots that run on the executors' JVMs
    (spark_app.realtime.jvm). None where `why_no_java_client` has a reason."""
    if why_no_java_client(cluster) is not None:
        return None
    settings = {"bootstrap.servers": cluster.bootstrap_servers, "security.protocol": _protocol(cluster)}
    if cluster.ca_file:
        settings |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": cluster.ca_file}
    login, client_key = None, None
    if cluster.profile is Profile.MTLS:
        key = _required(cluster.client_key)
        client_key = JavaClientKey(_required(cluster.client_cert_file), key.env, key.file)
    elif cluster.profile is not Profile.KAFKA:
        password = _required(cluster.password)
        scram = cluster.profile is Profile.MSK_SCRAM
        module = "scram.ScramLoginModule" if scram else "plain.PlainLoginModule"
        settings["sasl.mechanism"] = "SCRAM-SHA-512" if scram else "PLAIN"
        username = _required(cluster.username) if scram else "$ConnectionString"
        login = JavaLogin(f"org.apache.kafka.common.security.{module}", username, password.env, password.file)
    if cluster.is_eventhubs:
        settings |= _EVENTHUBS_TUNING | ({} if role == "consumer" else _EVENTHUBS_REQUESTS)
        if role == "producer":
            settings |= {"max.request.size": _EVENTHUBS_PRODUCER["message.max.bytes"], "compression.type": "none"}
    for name, value in cluster.client_overrides.items():  # last, as librdkafka_settings applies them
        java, roles = JAVA_TUNING[name]
        if role in roles:
            settings[java] = str(value)
    return JavaClient(cluster.alias, settings, login, client_key)


def redacted(settings: Settings) -> Settings:
    """Settings fit for a log line or `describe`."""
    secret_words = ("password", "jaas", "secret", "oauth_cb", "key.pem", "ssl.key")
    return {k: ("***" if any(w in k for w in secret_words) else v) for k, v in settings.items()}


def _protocol(cluster: ClusterConfig) -> str:
    if cluster.profile is Profile.KAFKA:
        return "SSL" if cluster.tls else "PLAINTEXT"
    return "SSL" if cluster.profile is Profile.MTLS else "SASL_SSL"


def _required(value: _T | None) -> _T:
    """A value the config's profile check already demands (spark_app.config); None here is a bug, not bad input."""
    if value is None:
        raise AssertionError("a profile's required setting is missing after validation")
    return value


def _msk_iam_token(region: str) -> OAuthCallback:
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


def _entra_token(cluster: ClusterConfig) -> OAuthCallback:
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
