"""The mirror's runtime configuration: the one schema that infra renders and the mirror reads.

A config names clusters (how to reach them, never the secret itself) and flows (what to copy from which cluster
to which, under which naming policy). Everything is checked here, before Spark starts, and every error names the
key path as the user wrote it, e.g. `flows[1].target: unknown cluster 'dr2'`.

This module must not import pulumi or pyspark: infra and the image both import it.
"""

from __future__ import annotations

import enum
import fnmatch
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

CONFIG_VERSION: Literal[1] = 1
ALIAS_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
# Kafka's own rule for topic names; Event Hubs names are a subset.
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
EVENTHUBS_CODECS = ("none", "gzip")
# Stopping (SIGTERM, or a topic-set change): the longest a stop waits for the batch in flight to commit before it
# cancels it (spark_app.throughput), and the longest a SIGTERM'd mirror takes to exit in all: that wait, then the DR
# service's last round and final checkpoint (three 30 s request timeouts), then Spark's own stop. The deployed driver
# pod's terminationGracePeriodSeconds is STOP_GRACE_S (infra/k8s/mirror_app.py), so Kubernetes does not kill it sooner.
STOP_BATCH_TIMEOUT_S = 120
STOP_GRACE_S = 300
# How long a topic must be missing from every topic-sync round before its state is forgotten. A topic drops out of a
# round while its metadata has an error or it is not authorized for a while (a leader election, a broker restart,
# ACLs being replaced, a fault over a weekend), after which it must resume from its positions: forgotten, it would
# come back as a new topic, and `start_from: latest` would skip what it got meanwhile. Missing for a week, it was
# deleted or deselected. Counted from the first round this process missed it, so a restart only puts it off
# (spark_app.ledger). A throughput flow's batch log keeps its positions of such a topic as long (spark_app.planner).
TOPIC_GONE_GRACE_S = 7 * 86_400.0
# The driver's JVM only schedules, and so do the executors' but for one case: a real-time slot in transactions copies
# there with Kafka's Java clients (spark_app.realtime.jvm, under these same options; its figures were measured with
# them). Spark's C2 compiles of its own planner cost a 200,000-record copy 14 of its JVM's 31 CPU s, and did not pay
# back over a minute of continuous batches; C1 alone and the serial collector (a small heap, no GC threads) cost less
# from the start and in steady state (bench/results/20261127-startup-profile.txt). The heap starts at 16 MB and grows
# only as far as Spark's own objects need, not from the 1/64 of the machine's memory the JVM would start with and then
# fill with young garbage: 90 MB less of the driver's peak RSS in a 1,000,000-record copy
# (bench/results/20261129-memory.txt). Set where a JVM starts: by `start_spark` for a JVM it launches, by infra's
# SparkApplication for the deployed driver and executors.
SPARK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xms16m"
# Spark's own classes, mapped from one class-data-sharing archive in Spark's home instead of read from its jars and
# verified again at each JVM start: 3-5 s of the mirror's start here (bench/results/20261128-startup-cds.txt). Set-up
# makes it once per local Spark install (images/spark_classes.py). A JVM that finds no archive there, or runs on
# another class path than it was made for, starts without it, as before. The image makes none: a pod's JVMs cannot
# map one (images/mirror/Dockerfile says why).
SPARK_CLASS_ARCHIVE = "mirrorkit-classes.jsa"
# Spark settings of the mirror wherever it starts (`start_spark` for a JVM it launches, infra's SparkApplication for
# the deployed one, where a stack's spark_conf may set them otherwise): Spark's web UI is off, as the mirror's metrics
# and `status` make up for it, and starting it took 0.2-0.6 s of every start (bench/results/JOURNAL.md).
SPARK_DEFAULTS = {"spark.ui.enabled": "false"}


def spark_jvm_conf(class_archive_home: str | None) -> dict[str, str]:
    """The driver's and executors' JVM options; they map Spark's classes from the archive in `class_archive_home`
    (a local Spark's home), or from none (None: the image's)."""
    archive = "" if class_archive_home is None else f" -XX:SharedArchiveFile={class_archive_home}/{SPARK_CLASS_ARCHIVE}"
    return {f"spark.{role}.extraJavaOptions": SPARK_JVM_OPTIONS + archive for role in ("driver", "executor")}


# Kafka Java client names users carry over from MirrorMaker 2 configs, with what librdkafka (whose names
# `client_overrides` take) calls them; None when librdkafka has no such setting.
JAVA_CLIENT_NAMES = {
    "max.request.size": "message.max.bytes",
    "ssl.truststore.location": "ssl.ca.location",
    "max.poll.records": None,
    "sasl.client.callback.handler.class": None,
    "sasl.login.callback.handler.class": None,
}
# client_overrides keys the copy's guarantees rest on (no record lost, skipped, copied twice or out of order), with
# why: the mirror sets each itself (spark_app.outbox, spark_app.transactions), and an override, applied last, would
# change delivery or order without a word. Every other key is tuning, and passes.
GUARANTEE_KEYS = {
    "auto.offset.reset": "a position outside the source's log must stop or be reported as a gap, never be reset"
    " silently; MirrorMaker 2 configs often carry 'earliest'",
    "isolation.level": "the copy reads committed records only: read_uncommitted would copy aborted transactions",
    "enable.auto.commit": "the batch log or the flow's ledger owns the positions, never the consumer group",
    "enable.auto.offset.store": "the batch log or the flow's ledger owns the positions, never the consumer group",
    "enable.partition.eof": "an available-now run learns where each partition's log ends from it",
    "acks": "a record counts as copied once every in-sync replica has it",
    "enable.idempotence": "the producer keeps each partition's order through retries, and writes no duplicates",
    "max.in.flight.requests.per.connection": "order through retries rests on the idempotent producer's bound",
    "max.in.flight": "order through retries rests on the idempotent producer's bound",
    "enable.gapless.guarantee": "the copy settles each partition's failures itself (spark_app.outbox)",
    "transactional.id": "each copier slot's id fences its zombies: spark_app.transactions sets it per slot",
    "transaction.timeout.ms": "spark_app.transactions sets it with the transactions it commits",
}
# client_overrides keys that carry a secret or point at a private key (matched without case; `ssl.key*` takes
# `ssl.keystore.*` too): overrides are plain config, and infra writes the config into a ConfigMap, so a secret goes
# through a SecretRef (`password`, `client_key`) instead. Java names among them are refused here too.
SECRET_KEYS = ("*password*", "*secret*", "*passphrase*", "*private.key*", "sasl.jaas.config", "ssl.key*", "ssl_key")


class ConfigError(ValueError):
    """A config the mirror refuses; the message names the offending key."""

    @classmethod
    def from_validation(cls, source: str, err: ValidationError, at: Sequence[str | int] = ()) -> ConfigError:
        """One line per error, `source:key.path: message`; `at` is where the validated value sits in its source."""
        lines = []
        for e in err.errors():
            path = _key_path([*at, *e["loc"]])
            for msg in e["msg"].removeprefix("Value error, ").splitlines():
                # Whole-config checks put the key path at the start of each line themselves.
                lines.append(f"{source}:{path}: {msg}" if path else f"{source}:{msg}")
        return cls("\n".join(lines))


def _key_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class StrictModel(BaseModel):
    """The base of every config model here and in infra's stack schema: unknown keys refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class FlowMode(enum.StrEnum):
    """How a flow copies: micro-batches of offset ranges, or long-running copier tasks (one core each)."""

    THROUGHPUT = "throughput"
    REALTIME = "realtime"


class Profile(enum.StrEnum):
    """How a cluster is reached; spark_app.profiles turns each into client settings."""

    KAFKA = "kafka"  # plaintext, or TLS with `tls: true`
    EVENTHUBS = "eventhubs"  # SASL_SSL PLAIN, username $ConnectionString, password the connection string
    # SASL_SSL OAUTHBEARER with an Entra ID token from Azure workload identity: for namespaces with local (SAS) auth
    # disabled.
    EVENTHUBS_ENTRA = "eventhubs-entra"
    MSK_SCRAM = "msk-scram"  # SASL_SSL SCRAM-SHA-512, port 9096
    MSK_IAM = "msk-iam"  # SASL_SSL AWS_MSK_IAM, port 9098
    MTLS = "mtls"  # TLS with a client certificate


# The profiles whose clusters check Kafka ACLs, which a flow's topic ACL sync reads and sets (`sync_topic_acls`).
KAFKA_ACL_PROFILES = (Profile.KAFKA, Profile.MSK_SCRAM, Profile.MTLS)


class SecretRef(StrictModel):
    """Where a secret lives at run time: an env var, or a file mounted from a Kubernetes Secret."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self

    def describe(self) -> str:
        return f"env {self.env}" if self.env else f"file {self.file}"


class ClusterConfig(StrictModel):
    alias: Annotated[str, Field(pattern=ALIAS_PATTERN)]
    bootstrap_servers: Annotated[str, Field(min_length=3)]
    profile: Profile
    tls: bool = False  # only for profile `kafka`; every other profile is always TLS
    ca_file: str | None = None  # a PEM bundle to trust; the system store when absent
    username: str | None = None  # msk-scram
    password: SecretRef | None = None  # msk-scram password, or the Event Hubs connection string
    client_cert_file: str | None = None  # mtls
    client_key: SecretRef | None = None  # mtls
    region: str | None = None  # msk-iam
    client_overrides: dict[str, str] = Field(default_factory=dict)  # librdkafka names; they win over the profile

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, v: str) -> str:
        servers = [s.strip() for s in v.split(",")]
        for n, server in enumerate(servers):
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                # Not echoed: an Event Hubs connection string pasted here carries its key.
                raise ValueError(
                    f"entry {n + 1} of {len(servers)} is not host:port, as in b-1.example.com:9096 (not shown, in"
                    " case it holds a secret: a connection string or a key belongs in 'password')"
                )
        return v

    @field_validator("client_overrides")
    @classmethod
    def _no_secret(cls, overrides: dict[str, str]) -> dict[str, str]:
        secrets = [k for k in overrides if any(fnmatch.fnmatch(k.lower(), p) for p in SECRET_KEYS)]
        if secrets:
            raise ValueError(
                "\n".join(
                    f"'{k}' carries a secret, and client_overrides are plain config (a ConfigMap when deployed);"
                    " name where the secret lives instead: 'password: {file: ...}' or '{env: ...}' (eventhubs,"
                    " msk-scram), 'client_key: {file: ...}' (mtls)"
                    for k in secrets
                )
            )
        return overrides

    @model_validator(mode="after")
    def _profile_needs(self) -> ClusterConfig:
        needs = {
            Profile.EVENTHUBS: ("password",),
            Profile.MSK_SCRAM: ("username", "password"),
            Profile.MSK_IAM: ("region",),
            Profile.MTLS: ("client_cert_file", "client_key"),
        }.get(self.profile, ())
        missing = [k for k in needs if getattr(self, k) is None]
        if missing:
            raise ValueError(f"profile '{self.profile.value}' needs {', '.join(repr(k) for k in missing)}")
        if self.tls and self.profile is not Profile.KAFKA:
            raise ValueError(f"'tls' applies to profile 'kafka' only; '{self.profile.value}' always uses TLS")
        guarded = [k for k in self.client_overrides if k in GUARANTEE_KEYS]
        if guarded:
            raise ValueError(
                "\n".join(
                    f"client_overrides.{k}: the mirror sets it, as its guarantees rest on it ({GUARANTEE_KEYS[k]});"
                    " remove it"
                    for k in guarded
                )
            )
        for key in self.client_overrides:
            if key in JAVA_CLIENT_NAMES:
                instead = JAVA_CLIENT_NAMES[key]
                raise ValueError(
                    f"client_overrides.{key}: a Kafka Java client name; the mirror's clients are librdkafka, "
                    + (
                        f"which calls it '{instead}'"
                        if instead
                        else "which has no such setting (the profile covers it)"
                    )
                )
        codec = self.client_overrides.get("compression.type")
        if self.is_eventhubs and codec is not None and codec not in EVENTHUBS_CODECS:
            raise ValueError(
                f"client_overrides.compression.type '{codec}' is refused by Event Hubs; use one of {EVENTHUBS_CODECS}"
            )
        return self

    @property
    def is_eventhubs(self) -> bool:
        """Event Hubs topics are made through ARM only: the mirror never creates or alters them."""
        return self.profile in (Profile.EVENTHUBS, Profile.EVENTHUBS_ENTRA)


def _regexes_compile(patterns: list[str]) -> list[str]:
    for i, pattern in enumerate(patterns):
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"[{i}] '{pattern}' is not a valid regex: {err}") from None
    return patterns


_Item = TypeVar("_Item")


def _non_empty(message: str) -> Callable[[list[_Item]], list[_Item]]:
    """A field validator refusing an empty list with `message`."""

    def check(items: list[_Item]) -> list[_Item]:
        if not items:
            raise ValueError(message)
        return items

    return check


def _selected(name: str, include: list[str], exclude: list[str]) -> bool:
    return any(re.fullmatch(p, name) for p in include) and not any(re.fullmatch(p, name) for p in exclude)


class TopicSelection(StrictModel):
    """Include and exclude regexes, each matched against the whole topic name. Exclude wins."""

    include: list[str]
    exclude: list[str] = Field(default_factory=list)

    _not_empty = field_validator("include")(_non_empty("select at least one topic: 'include' is empty"))
    _compiles = field_validator("include", "exclude")(_regexes_compile)

    def matches(self, name: str) -> bool:
        return _selected(name, self.include, self.exclude)

    def literal_names(self) -> list[str] | None:
        """The topic list when every include is a plain name (as Event Hubs flows must be), else None."""
        if all(TOPIC_NAME.match(p) for p in self.include):
            return [t for t in self.include if self.matches(t)]
        return None


class GroupSelection(StrictModel):
    include: list[str] = Field(default_factory=lambda: [".*"])
    exclude: list[str] = Field(default_factory=list)

    _compiles = field_validator("include", "exclude")(_regexes_compile)

    def matches(self, group: str) -> bool:
        return _selected(group, self.include, self.exclude)


class MirrorMaker2Names(StrictModel):
    """Where MirrorMaker 2 keeps a flow's state on its target, for `adopt` (from MM2) and `handback` (to it): Connect's
    offsets topic and Connect's group. Unset: dedicated mode's names (spark_app.policy). A Connect cluster of its own
    (Strimzi's KafkaMirrorMaker2) names them itself (`offset.storage.topic`, `group.id`): set them here, so the site's
    toolbox is granted them and the verbs find them without flags."""

    offsets_topic: Annotated[str, Field(pattern=TOPIC_NAME.pattern)] | None = None
    connect_group: Annotated[str, Field(min_length=1, max_length=255)] | None = None


# How often an exactly-once real-time slot commits by default. At 0.1 s its p99 for a read_committed reader was 0.61×
# that of MirrorMaker 2 with exactly-once source support (bench/results/JOURNAL.md, 2026-12-07 23:42), but a topic
# made again while a slot committed that often had its new life never copied in a test: 1 s until that is found.
EXACTLY_ONCE_COMMIT_S = 1.0
# Event Hubs takes at most 4 offset commits per second per partition, and each commit sends the slot's positions.
EVENTHUBS_MIN_COMMIT_S = 0.25


class FlowConfig(StrictModel):
    source: str
    target: str
    topics: TopicSelection
    groups: GroupSelection = Field(default_factory=GroupSelection)
    replication_policy: Literal["default", "identity"] = "default"
    separator: Annotated[str, Field(min_length=1, max_length=8)] = "."
    # MM2's replication.policy.internal.topic.separator.enabled: false names the internal topics with dots whatever
    # the separator, as MM2 then does and as mirrors before KIP-690 naming did (spark_app.policy)
    internal_topic_separator: bool = True
    # identity only: stamp a provenance header and drop records that came from the target (loop prevention)
    provenance_header: bool = True
    start_from: Literal["earliest", "latest"] = "earliest"
    checkpoint_location: Annotated[str, Field(min_length=1)]
    dead_letter_topic: str | None = None  # on the target; without it an oversized record stops its topic
    fail_on_data_loss: bool = False
    offset_syncs_location: Literal["source", "target"] = "target"
    sync_group_offsets: bool = False
    # MM2-format heartbeats to `heartbeats` on the source while the mirror runs; needs write rights there
    emit_heartbeats: bool = True
    # The bounds of one batch (spark_app.planner): a stop or a topic-set change waits for, or at worst throws away,
    # one batch, so its size is what a slow target can take in well under the producer's delivery timeout.
    max_records_per_trigger: Annotated[int, Field(gt=0)] = 1_000_000
    max_bytes_per_trigger: Annotated[int, Field(ge=1_048_576)] = 536_870_912
    # `throughput`: micro-batches (spark_app.throughput). `realtime`: long-running copier tasks that write each record
    # as it comes (spark_app.realtime), for MirrorMaker 2-class latency; each of its `realtime_tasks` holds a core.
    mode: FlowMode = FlowMode.THROUGHPUT
    realtime_tasks: Annotated[int, Field(ge=1, le=256)] = 1
    # Each task's records and its partitions' next source offsets in one transaction on the target
    # (spark_app.transactions): a read_committed consumer of the target sees every record once, through any crash.
    # Needs transactions on the target (Kafka 3.x or later, MSK; Event Hubs Premium or Dedicated only).
    exactly_once: bool = False
    # How often an exactly-once real-time slot commits its transaction, records and positions together: a
    # read_committed reader sees a record at the first commit after it landed, so this is most of the latency it sees.
    # Each commit costs a round of transaction requests and a marker in every partition it touched.
    exactly_once_commit_interval_s: Annotated[float, Field(ge=0.01, le=60)] = EXACTLY_ONCE_COMMIT_S
    # What copies the flow's records: `compiled`, a compiled core where one serves the flow, else the Python loop;
    # `python`, the reference loop (spark_app.outbox) everywhere. spark_app.copy_wing.choice decides which core and
    # says why (`mirrorkit describe`): the Rust core (librdkafka, about a third of the Python loop's CPU per record)
    # for throughput batches and real-time slots without transactions, Kafka's Java clients on the executors' JVMs for
    # real-time slots in transactions; a compiled core hands over to the Python loop at the first event it leaves to it.
    copy_core: Literal["compiled", "python"] = "compiled"
    # Copy the source's topic ACLs to the copies as MirrorMaker 2's `sync.topic.acls.enabled` does, WRITE kept off
    # them until failover (spark_app.topic_acls). Unset: on where both clusters have Kafka ACLs (KAFKA_ACL_PROFILES);
    # a MirrorConfig resolves it for each of its flows. Event Hubs and MSK IAM have none: infra renders their grants.
    sync_topic_acls: bool | None = None
    mirrormaker2: MirrorMaker2Names = Field(default_factory=MirrorMaker2Names)

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"


class MirrorConfig(StrictModel):
    version: Literal[1] = CONFIG_VERSION
    clusters: list[ClusterConfig]
    flows: list[FlowConfig]
    topic_sync_interval_s: Annotated[float, Field(gt=0, le=30)] = 5.0
    checkpoint_interval_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    heartbeat_interval_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    # How often a continuous run looks for new records: each look is one ListOffsets request to the source, and a
    # batch costs about 0.3 s of Spark overhead (bench/), so 0.25 s keeps latency low without hammering the source.
    trigger_interval_s: Annotated[float, Field(ge=0)] = 0.25
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 9404
    # How often a real-time flow saves its positions (spark_app.realtime): a SIGKILL copies again at most what landed
    # since (exactly once: nothing, the target's positions win), and each save is one write of the state file beside
    # the checkpoint (object storage too). An exactly-once slot's own commits follow its flow's
    # `exactly_once_commit_interval_s`.
    realtime_commit_interval_s: Annotated[float, Field(gt=0, le=60)] = 1.0

    _some_flow = field_validator("flows")(_non_empty("define at least one flow"))

    @model_validator(mode="after")
    def _flows_fit_clusters(self) -> MirrorConfig:
        aliases = {c.alias: c for c in self.clusters}
        errors = [
            f"clusters[{i}].alias: '{c.alias}' is used twice"
            for i, c in enumerate(self.clusters)
            if c.alias in {d.alias for d in self.clusters[:i]}
        ]
        by_pair: dict[tuple[str, str], FlowConfig] = {}
        for i, flow in enumerate(self.flows):
            where = f"flows[{i}]"
            for side in ("source", "target"):
                alias = getattr(flow, side)
                if alias not in aliases:
                    errors.append(f"{where}.{side}: unknown cluster '{alias}' (clusters: {', '.join(aliases)})")
            if flow.source == flow.target:
                errors.append(f"{where}: source and target are the same cluster '{flow.source}'")
            if (flow.source, flow.target) in by_pair:
                errors.append(f"{where}: a second flow {flow.name}")
            by_pair[(flow.source, flow.target)] = flow
            target = aliases.get(flow.target)
            every = flow.exactly_once_commit_interval_s
            if target is not None and target.is_eventhubs and every < EVENTHUBS_MIN_COMMIT_S:
                errors.append(
                    f"{where}.exactly_once_commit_interval_s: {every} s is too often for Event Hubs cluster"
                    f" '{flow.target}', which takes at most 4 offset commits per second per partition; give"
                    f" {EVENTHUBS_MIN_COMMIT_S} or more"
                )
            if target is not None and target.is_eventhubs and flow.topics.literal_names() is None:
                errors.append(
                    f"{where}.topics.include: a flow into Event Hubs cluster '{flow.target}' must list topic names,"
                    " not patterns, because every event hub is created ahead by infra"
                )
        for (src, dst), flow in by_pair.items():
            back = by_pair.get((dst, src))
            if back is None or src > dst:
                continue
            if flow.replication_policy == back.replication_policy == "identity" and not (
                flow.provenance_header and back.provenance_header
            ):
                i = self.flows.index(flow)
                errors.append(
                    f"flows[{i}]: identity flows {src}->{dst} and {dst}->{src} would loop records forever;"
                    " keep 'provenance_header: true' on both, or use replication_policy 'default'"
                )
        for i, flow in enumerate(self.flows):
            lacking = [
                f"'{aliases[a].alias}' ({aliases[a].profile.value})"
                for a in (flow.source, flow.target)
                if a in aliases and aliases[a].profile not in KAFKA_ACL_PROFILES
            ]
            if flow.sync_topic_acls and lacking:
                errors.append(
                    f"flows[{i}].sync_topic_acls: {' and '.join(lacking)} has no Kafka ACLs to sync (profiles with"
                    f" them: {', '.join(p.value for p in KAFKA_ACL_PROFILES)}); infra grants access there, so remove"
                    " the key or set it false"
                )
            elif flow.sync_topic_acls is None:
                self.flows[i] = flow.model_copy(update={"sync_topic_acls": not lacking})
        if errors:
            raise ValueError("\n".join(errors))
        return self

    def cluster(self, alias: str) -> ClusterConfig:
        return next(c for c in self.clusters if c.alias == alias)

    def flow(self, name: str) -> FlowConfig:
        """A flow by its `SRC->DST` name."""
        for f in self.flows:
            if f.name == name:
                return f
        raise ConfigError(f"no flow '{name}'; flows: {', '.join(f.name for f in self.flows)}")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_defaults=False), sort_keys=False)


def cores_needed(flows: Sequence[FlowConfig]) -> int:
    """The task slots (executor cores, as spark.task.cpus is 1) a mirror of these flows needs: each real-time task
    holds one for as long as the mirror runs, and throughput flows' micro-batches need one more beside them."""
    realtime = sum(f.realtime_tasks for f in flows if f.mode is FlowMode.REALTIME)
    return realtime + (1 if any(f.mode is FlowMode.THROUGHPUT for f in flows) else 0)


def parse_config(raw: Any, source: str = "config") -> MirrorConfig:
    try:
        return MirrorConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError.from_validation(source, err) from None


def load_config(path: str | Path) -> MirrorConfig:
    """Read a YAML or JSON file (JSON is YAML) and validate it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    try:
        raw = yaml.safe_load(text) if path.suffix != ".json" else json.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML/JSON: {err}") from None
    return parse_config(raw, source=str(path))
