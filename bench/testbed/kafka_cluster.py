"""KRaft Kafka clusters on loopback, each broker a real JVM started from the Maven Central jars.

Most clusters are a single node. A multi-broker cluster (`MultiBrokerCluster`, plaintext) serves leader and broker
faults: stopping one of its brokers takes the partitions it leads offline while the rest of the cluster answers.

Every broker has a PLAINTEXT admin listener (the test bed's super user, standing in for ARM or the cluster
operator) and one client listener of a chosen kind:

- `plaintext`: PLAINTEXT, like on-prem Kafka or Strimzi without auth;
- `eventhubs`: like Azure Event Hubs' Kafka endpoint: SASL_SSL PLAIN with username `$ConnectionString` and a
  connection string as password, a 1 MB message cap, and topic creation denied to the client;
- `msk-scram`: like MSK's SASL/SCRAM listener: SASL_SSL SCRAM-SHA-512 with a user created at format time.

A broker started with a Toxiproxy server (bench/testbed/toxiproxy.py) has a third listener, PROXIED, of the same
security as CLIENT, bound on its own port and advertised at its proxy's, so a client that bootstraps through the
proxy (`proxied`) learns only proxy addresses from metadata and every connection it makes crosses the proxy, where
`faults` breaks it. `client` stays direct.
"""

from __future__ import annotations

import base64
import enum
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from images.fetch_jars import cached_jars
from spark_app import clients
from spark_app.config import ClusterConfig, Profile, SecretRef

from .ports import free_ports
from .tls import TlsFiles
from .toxiproxy import Faults, Proxy, ToxiproxyServer

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
READY_TIMEOUT_S = 60.0
EVENTHUBS_USER = "$ConnectionString"
MSK_USER = "mirror"


class ListenerKind(enum.StrEnum):
    PLAINTEXT = "plaintext"
    EVENTHUBS = "eventhubs"
    MSK_SCRAM = "msk-scram"
    MTLS = "mtls"  # TLS with a client certificate the broker requires (the mirror's `mtls` profile)
    # SASL_SSL OAUTHBEARER with Kafka's unsecured token validator: any unsigned JWT with `sub` and `exp` signs in. A
    # stand-in for Entra ID and MSK IAM, whose token callbacks run against a loopback token endpoint in the tests.
    OAUTHBEARER = "oauthbearer"


# The mirror's principal on each SASL kind whose broker can check ACLs (it allows everything where no ACL is found).
PRINCIPALS = {ListenerKind.EVENTHUBS: f"User:{EVENTHUBS_USER}", ListenerKind.MSK_SCRAM: f"User:{MSK_USER}"}


def require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java is not on PATH: the test bed runs real Kafka brokers and needs a JDK 17")
    return java


def kafka_classpath() -> str:
    """The broker, tools and MirrorMaker 2 classpath; fails with the fetch command if the jars are missing."""
    return os.pathsep.join(str(j) for j in cached_jars("kafka"))


@dataclass
class KafkaCluster:
    """One broker JVM. `start` formats and launches it; `stop`, `kill` and `start` again serve fault tests.

    Alone it is a whole cluster, its own controller. Given a `quorum` (the controller node of a multi-broker cluster)
    it is a broker only, node `node_id` of that node's cluster. Given a `toxiproxy` server it gets a proxy there, named
    as the broker, and the PROXIED listener behind it.
    """

    name: str
    kind: ListenerKind
    folder: Path
    tls: TlsFiles | None = None
    node_id: int = 1
    quorum: KafkaCluster | None = None
    password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    message_max_bytes: int = 1048576
    acls: bool = False  # the broker checks ACLs (an Event Hubs-like one always does): a test may deny the mirror
    admin_port: int = 0
    client_port: int = 0
    controller_port: int = 0
    proxied_port: int = 0  # the PROXIED listener's own port, which the proxy forwards to
    toxiproxy: ToxiproxyServer | None = field(default=None, repr=False)
    proxy: Proxy | None = None
    started_in_s: float = 0.0
    cluster_id: str = ""
    _process: subprocess.Popen | None = None
    _formatted: bool = False

    # -- what tests use -------------------------------------------------------------------------------------------

    @property
    def admin(self) -> ClusterConfig:
        """The test bed's own super-user access, for setup a real platform does out of band (ARM, operators)."""
        return ClusterConfig(alias=self.name, bootstrap_servers=f"127.0.0.1:{self.admin_port}", profile=Profile.KAFKA)

    @property
    def client(self) -> ClusterConfig:
        """What the mirror and the applications under test use, as the mirror's config describes a cluster: the secret
        stays in a 0600 file next to the broker's, as a Kubernetes Secret mount gives it."""
        return self._config(f"127.0.0.1:{self.client_port}")

    @property
    def proxied(self) -> ClusterConfig:
        """As `client`, same credentials and TLS, but bootstrapped through this broker's proxy: the TLS name holds,
        as the proxy listens on 127.0.0.1 too."""
        return self._config(self._proxy().listen)

    @property
    def faults(self) -> Faults:
        """Network faults between `proxied` clients and this broker."""
        return Faults([self._proxy()])

    def _proxy(self) -> Proxy:
        if self.proxy is None:
            raise RuntimeError(f"broker {self.name} has no proxy: start it with `proxied=True` (TestBed.start)")
        return self.proxy

    def _config(self, bootstrap: str) -> ClusterConfig:
        if self.kind is ListenerKind.PLAINTEXT:
            return ClusterConfig(alias=self.name, bootstrap_servers=bootstrap, profile=Profile.KAFKA)
        if self.kind is ListenerKind.OAUTHBEARER:  # the token comes from the workload identity the test points at
            return ClusterConfig(
                alias=self.name,
                bootstrap_servers=bootstrap,
                profile=Profile.EVENTHUBS_ENTRA,
                ca_file=str(self.tls.ca_pem),
            )
        if self.kind is ListenerKind.MTLS:
            return ClusterConfig(
                alias=self.name, bootstrap_servers=bootstrap, profile=Profile.MTLS, ca_file=str(self.tls.ca_pem),
                client_cert_file=str(self.tls.client_cert_pem), client_key=SecretRef(file=str(self.tls.client_key_pem)),
            )  # fmt: skip
        signed_in = {"password": SecretRef(file=str(self.folder / "client-secret")), "ca_file": str(self.tls.ca_pem)}
        if self.kind is ListenerKind.EVENTHUBS:
            return ClusterConfig(alias=self.name, bootstrap_servers=bootstrap, profile=Profile.EVENTHUBS, **signed_in)
        return ClusterConfig(
            alias=self.name, bootstrap_servers=bootstrap, profile=Profile.MSK_SCRAM, username=MSK_USER, **signed_in
        )

    def add_user(self, name: str) -> ClusterConfig:
        """Another SCRAM user on an MSK-like cluster, made by the super user: an application beside the mirror, with
        a principal of its own (`User:<name>`). Returns its `client` config; its password stays in a 0600 file."""
        if self.kind is not ListenerKind.MSK_SCRAM:
            raise ValueError(f"broker {self.name} is {self.kind.value}: only msk-scram brokers take more users")
        password = secrets.token_hex(16)
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upsert = UserScramCredentialUpsertion(name, info, password.encode())
        admin = clients.admin(self.admin)
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=15).values():
            future.result()
        path = self.folder / f"user-{name}-secret"
        path.write_text(password)
        path.chmod(0o600)
        return self.client.model_copy(update={"username": name, "password": SecretRef(file=str(path))})

    @property
    def secret(self) -> str | None:
        """What the client signs in with: the connection string (Event Hubs-like) or the password (MSK-like); None for
        no login or a client certificate (its key stays in its file)."""
        if self.kind in (ListenerKind.PLAINTEXT, ListenerKind.MTLS, ListenerKind.OAUTHBEARER):
            return None
        return self.connection_string if self.kind is ListenerKind.EVENTHUBS else self.password

    @property
    def connection_string(self) -> str:
        """An Event Hubs-shaped connection string; its key is this run's random password."""
        key = base64.b64encode(bytes.fromhex(self.password) * 2).decode()
        return f"Endpoint=sb://{self.name}.servicebus.windows.net/;SharedAccessKeyName=mirror;SharedAccessKey={key}"

    @property
    def log_file(self) -> Path:
        return self.folder / "broker.log"

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_file.exists():
            return "(no broker log yet)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        """The broker JVM's process id, for benchmarks that read its CPU."""
        if self._process is None:
            raise RuntimeError(f"broker {self.name} is not started")
        return self._process.pid

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> KafkaCluster:
        """Start (or restart after `stop`/`kill`) and wait until the broker answers on its admin listener."""
        if self.running:
            return self
        self._write_secret()
        for attempt in range(1, attempts + 1):
            if not self._formatted:
                self.admin_port, self.client_port, self.controller_port, self.proxied_port = free_ports(4)
                self._place_proxy()
                self._write_properties()
                self._format()
            began = time.monotonic()
            self._launch()
            try:
                self._wait_ready()
            except BrokerStartError as err:
                self.kill()
                address_taken = "Address already in use" in self.log_tail(200)
                if address_taken and attempt < attempts and not self.started_in_s:
                    self._formatted = False  # another run took a port between our probe and the bind: pick anew
                    continue
                if self.started_in_s and attempt < attempts:  # a restart: try again, the failure kept in the log
                    print(f"test bed: broker {self.name} failed to start again (attempt {attempt}): {err}", flush=True)
                    time.sleep(2.0)
                    continue
                raise
            self.started_in_s = time.monotonic() - began
            if self.kind is ListenerKind.EVENTHUBS:
                self._deny_topic_creation_to_client()
            return self
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM), as in a rolling restart."""
        if not self.running:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """A hard loss of the broker (SIGKILL), as in a lost region."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)

    def limit_producers(self, bytes_per_s: int) -> None:
        """A broker quota (`producer_byte_rate`) for every client id: a slow target, each write throttled."""
        self._quota(f"producer_byte_rate={bytes_per_s}", "--entity-default")

    def unlimit_producers(self) -> None:
        """Take `limit_producers`' quota away."""
        self._quota("producer_byte_rate", "--entity-default", change="--delete-config")

    def limit_consumer(self, client_id: str, bytes_per_s: int) -> None:
        """A broker quota (`consumer_byte_rate`) for one client id: a slow source for that client alone, each fetch
        throttled. Quotas are cluster metadata: set through one broker, every broker of the cluster applies it."""
        self._quota(f"consumer_byte_rate={bytes_per_s}", "--entity-name", client_id)

    def _quota(self, config: str, *entity: str, change: str = "--add-config") -> None:
        command = self._java(
            "kafka.admin.ConfigCommand", "--bootstrap-server", f"127.0.0.1:{self.admin_port}", "--alter",
            "--entity-type", "clients", *entity, change, config,
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"could not set quota {config} on {self.name}:\n{done.stdout}\n{done.stderr}")

    # -- internals ------------------------------------------------------------------------------------------------

    def _write_secret(self) -> None:
        if self.secret is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "client-secret"
        path.write_text(self.secret)
        path.chmod(0o600)

    def _place_proxy(self) -> None:
        """Point the proxy at the PROXIED listener's port, making the proxy on the first start; its own port stays."""
        if self.toxiproxy is None:
            return
        upstream = f"127.0.0.1:{self.proxied_port}"
        if self.proxy is None:
            self.proxy = self.toxiproxy.proxy(self.name, upstream)
        else:
            self.proxy.point_at(upstream)

    def _client_protocol(self) -> str:
        return {ListenerKind.PLAINTEXT: "PLAINTEXT", ListenerKind.MTLS: "SSL"}.get(self.kind, "SASL_SSL")

    def _write_properties(self) -> None:
        data = self.folder / "data"
        if data.exists():
            shutil.rmtree(data)
        self.folder.mkdir(parents=True, exist_ok=True)
        listeners = [f"ADMIN://127.0.0.1:{self.admin_port}", f"CLIENT://127.0.0.1:{self.client_port}"]
        advertised = list(listeners)
        protocols = ["ADMIN:PLAINTEXT", f"CLIENT:{self._client_protocol()}", "CONTROLLER:PLAINTEXT"]
        client_listeners = ["client"]
        if self.proxy is not None:
            listeners.append(f"PROXIED://127.0.0.1:{self.proxied_port}")
            advertised.append(f"PROXIED://{self.proxy.listen}")
            protocols.append(f"PROXIED:{self._client_protocol()}")
            client_listeners.append("proxied")
        if not self.quorum:
            listeners.append(f"CONTROLLER://127.0.0.1:{self.controller_port}")
        controller = self.quorum or self
        props = {
            "process.roles": "broker" if self.quorum else "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "ADMIN",
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(protocols),
            "log.dirs": str(data),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "message.max.bytes": str(self.message_max_bytes),
            "log.retention.check.interval.ms": "5000",
        }
        if self.kind is not ListenerKind.PLAINTEXT:
            props |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.tls.server_pem)}
        if self.kind is ListenerKind.MTLS:
            props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.tls.ca_pem)}
            props |= {f"listener.name.{listener}.ssl.client.auth": "required" for listener in client_listeners}
        module = "org.apache.kafka.common.security"
        logins = {  # each SASL kind's one mechanism, and the broker's login module for it
            ListenerKind.EVENTHUBS: (
                "PLAIN", f'{module}.plain.PlainLoginModule required user_{EVENTHUBS_USER}="{self.connection_string}";'
            ),
            ListenerKind.MSK_SCRAM: ("SCRAM-SHA-512", f"{module}.scram.ScramLoginModule required;"),
            ListenerKind.OAUTHBEARER: (
                "OAUTHBEARER",
                f'{module}.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";',
            ),
        }  # fmt: skip
        if self.kind in logins:
            mechanism, jaas = logins[self.kind]
            for listener in client_listeners:
                props |= {
                    f"listener.name.{listener}.sasl.enabled.mechanisms": mechanism,
                    f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config": jaas,
                }
        if self.kind is ListenerKind.EVENTHUBS or self.acls:
            props |= {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": "User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "true",
            }
        lines = [f"{k}={_escape_property(v)}" for k, v in props.items()]
        properties = self.folder / "server.properties"
        properties.write_text("\n".join(lines) + "\n")
        properties.chmod(0o600)

    def _java(self, main_class: str, *args: str, log_config: bool = True) -> list[str]:
        jvm = [require_java(), "-Xms128m", "-Xmx768m", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        if log_config:
            jvm.append(f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}")
        return [*jvm, "-cp", kafka_classpath(), main_class, *args]

    def _format(self) -> None:
        if self.quorum:  # a broker joining the controller's cluster
            self.cluster_id = self.quorum.cluster_id
            args = ["format", "--no-initial-controllers", "-t", self.cluster_id]
        else:
            self.cluster_id = "-"
            while self.cluster_id.startswith("-"):  # the storage tool would read a leading '-' as an option
                self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            args = ["format", "--standalone", "-t", self.cluster_id]
        args += ["-c", str(self.folder / "server.properties")]
        if self.kind is ListenerKind.MSK_SCRAM:
            args += ["--add-scram", f"SCRAM-SHA-512=[name={MSK_USER},password={self.password}]"]
        result = subprocess.run(
            self._java("kafka.tools.StorageTool", *args), capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise BrokerStartError(f"formatting {self.name} failed:\n{result.stdout}\n{result.stderr}")
        self._formatted = True

    def _launch(self) -> None:
        with self.log_file.open("ab") as log:
            log.write(f"=== test bed: launching broker {self.name} at {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.folder / "server.properties")),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        """Wait for the admin port to accept, then for the broker to show in metadata."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        admin: AdminClient | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrokerStartError(f"broker {self.name} exited with {self._process.returncode}:\n{self.log_tail()}")
            if admin is None:
                with socket.socket() as probe:
                    probe.settimeout(0.5)
                    if probe.connect_ex(("127.0.0.1", self.admin_port)) == 0:
                        admin = clients.admin(self.admin)
            elif _has_broker(admin, self.node_id):
                return
            time.sleep(0.1)
        raise BrokerStartError(f"broker {self.name} not ready after {READY_TIMEOUT_S:.0f}s:\n{self.log_tail()}")

    def _deny_topic_creation_to_client(self) -> None:
        """Event Hubs makes topics through ARM only: the client may do everything but create."""
        principal = PRINCIPALS[ListenerKind.EVENTHUBS]

        def acl(rtype: ResourceType, name: str, op: AclOperation, perm: AclPermissionType) -> AclBinding:
            return AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", op, perm)

        allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
        bindings = [
            acl(ResourceType.TOPIC, "*", AclOperation.ALL, allow),
            acl(ResourceType.GROUP, "*", AclOperation.ALL, allow),
            acl(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL, allow),
            acl(ResourceType.TOPIC, "*", AclOperation.CREATE, deny),
            acl(ResourceType.BROKER, "kafka-cluster", AclOperation.CREATE, deny),
        ]
        admin = clients.admin(self.admin)
        for future in admin.create_acls(bindings, request_timeout=15).values():
            future.result()


def _has_broker(admin: AdminClient, node_id: int) -> bool:
    """The cluster's metadata, as this broker serves it, lists this broker."""
    try:
        return node_id in admin.list_topics(timeout=2).brokers
    except KafkaException:
        return False


@dataclass
class MultiBrokerCluster:
    """One plaintext KRaft cluster of several broker JVMs: node 1 is the controller and a broker, the others are
    brokers only. Stopping one of those (`broker(n).stop()`, then `.start()`) takes the partitions it leads offline
    while the controller and the other brokers keep answering; a topic placed with replication factor 1
    (bench.testbed.clients.create_placed_topics) chooses which partitions those are."""

    name: str
    brokers: list[KafkaCluster]
    kind: ListenerKind = ListenerKind.PLAINTEXT

    @property
    def admin(self) -> ClusterConfig:
        return self._bootstrapped([b.admin for b in self.brokers])

    @property
    def client(self) -> ClusterConfig:
        return self._bootstrapped([b.client for b in self.brokers])

    @property
    def proxied(self) -> ClusterConfig:
        """As `client`, through each broker's own proxy."""
        return self._bootstrapped([b.proxied for b in self.brokers])

    def _bootstrapped(self, each: list[ClusterConfig]) -> ClusterConfig:
        """The cluster reached through every broker's address of one kind."""
        bootstrap = ",".join(c.bootstrap_servers for c in each)
        return ClusterConfig(alias=self.name, bootstrap_servers=bootstrap, profile=Profile.KAFKA)

    @property
    def faults(self) -> Faults:
        """Network faults on every broker's proxy at once; `broker(n).faults` for one broker's alone."""
        return Faults([p for b in self.brokers for p in b.faults.proxies])

    def broker(self, node_id: int) -> KafkaCluster:
        return next(b for b in self.brokers if b.node_id == node_id)

    def start(self) -> MultiBrokerCluster:
        """Start every broker, the controller first, and wait until each serves metadata."""
        for broker in self.brokers:
            broker.start()
        return self


class BrokerStartError(RuntimeError):
    pass


def _escape_property(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def cluster_entry(cluster: KafkaCluster | MultiBrokerCluster, alias: str, proxied: bool = False) -> dict[str, object]:
    """The `clusters[]` entry for a test-bed cluster under `alias`: its client `ClusterConfig` as a config file gives
    it, the secret still in the 0600 file next to the broker's. `proxied` takes its `proxied` config instead, so the
    mirror reaches the cluster through Toxiproxy, where the cluster's `faults` act."""
    access = cluster.proxied if proxied else cluster.client
    return access.model_copy(update={"alias": alias}).model_dump(mode="json", exclude_defaults=True)
