"""Topic naming and loop rules, shared by the mirror and by infra, and the access set infra grants from them.

A flow's `replication_policy` is one object (`replication_policy(flow)`, MirrorMaker 2's ReplicationPolicy) that the
copy, topic sync, DR and infra ask; no other module compares the policy's name.

- `default` (MirrorMaker 2's DefaultReplicationPolicy): `orders` from alias `A` becomes `A.orders`; a topic that is
  already a remote copy from the flow's target is never mirrored back, so active/active cannot cycle.
- `identity`: names are kept; each record carries a provenance header, `<source alias>:<source offset>`, and a flow
  drops records whose provenance is its own target. The offset lets the flow that drops such an echo of a
  target-local record tell which of them a source group has read (spark_app.dr.syncs).

Internal topics are named as MM2 names them (KIP-690): the flow's separator joins their parts too
(`<source>_checkpoints_internal` with `_`), or a dot with `internal_topic_separator: false`, MM2's
`replication.policy.internal.topic.separator.enabled`.

What the mirror reads, writes and creates on each cluster (`access`) follows from these rules, in one place: infra
renders the IAM policy, the Kafka ACLs and the event hubs to create from it. With `operator`, the set holds what the
operator verbs run with the mirror's identity (the site's toolbox: `failover`, `drill`, `adopt`, `handback`) do
besides, so that identity is granted them too.
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields

from .config import FlowConfig, FlowMode, MirrorConfig

PROVENANCE_HEADER = "mirrorkit.source"
HEARTBEATS_TOPIC = "heartbeats"
# Never mirrored, whatever a flow's patterns say: Kafka's own topics, MM2's and ours.
_INTERNAL_PREFIXES = ("__", "mm2-", "mirrorkit-")
_INTERNAL_SUFFIXES = (".internal", "-internal")
_CONNECT_TOPICS = ("connect-configs", "connect-offsets", "connect-status")


def never_mirrored(topic: str, separator: str = ".") -> bool:
    """Whether a topic is internal, so no flow mirrors it whatever its patterns say: Kafka's, Connect's, MM2's and the
    mirror's own topics, under the dotted names and those a flow's `separator` gives (MM2's isInternalTopic)."""
    return (
        topic.startswith(_INTERNAL_PREFIXES)
        or topic.endswith(_INTERNAL_SUFFIXES)
        or topic.endswith(f"{separator}internal")
        or topic in _CONNECT_TOPICS
        or topic.endswith(tuple(f".{t}" for t in _CONNECT_TOPICS))
    )


class ReplicationPolicy(abc.ABC):
    """How one flow names its copies on the target and keeps records from going round in circles."""

    name: str  # as the flow's `replication_policy` key says it
    renames: bool  # whether a copy's name differs from its source topic's
    stamps: bool  # whether each copy carries the provenance header, and echoes of the target's records are dropped

    @abc.abstractmethod
    def target_topic(self, source_topic: str) -> str:
        """The copy's name on the target."""

    @abc.abstractmethod
    def copies(self, pattern: str) -> str:
        """The full-match regex of the copies of the source topics `pattern` matches."""

    @abc.abstractmethod
    def came_from_target(self, source_topic: str) -> bool:
        """Whether a source topic is itself a copy from the flow's target, by its name: mirroring it back would
        cycle."""

    def drops(self, came_from: tuple[bytes, int] | None) -> bool:
        """Whether a record whose provenance `origin` is `came_from` came from the flow's target, and must not go
        back there."""
        return False


@dataclass(frozen=True)
class DefaultPolicy(ReplicationPolicy):
    """MirrorMaker 2's DefaultReplicationPolicy: `orders` from alias `A` becomes `A<separator>orders`."""

    source: str
    target: str
    separator: str
    name = "default"
    renames = True
    stamps = False

    def target_topic(self, source_topic: str) -> str:
        return f"{self.source}{self.separator}{source_topic}"

    def copies(self, pattern: str) -> str:
        return re.escape(f"{self.source}{self.separator}") + (f"(?:{pattern})" if "|" in pattern else pattern)

    def came_from_target(self, source_topic: str) -> bool:
        alias, sep, rest = source_topic.partition(self.separator)
        return bool(sep and rest) and alias == self.target


@dataclass(frozen=True)
class IdentityPolicy(ReplicationPolicy):
    """Names kept; loops are prevented by the provenance header, unless the flow turns it off (`provenance_header`)."""

    target: str
    stamps: bool  # per flow: its provenance_header
    name = "identity"
    renames = False

    def target_topic(self, source_topic: str) -> str:
        return source_topic

    def copies(self, pattern: str) -> str:
        return pattern

    def came_from_target(self, source_topic: str) -> bool:
        return False

    def drops(self, came_from: tuple[bytes, int] | None) -> bool:
        return self.stamps and came_from is not None and came_from[0] == self.target.encode()


@functools.cache
def named_policy(name: str, source: str, target: str, separator: str, provenance_header: bool) -> ReplicationPolicy:
    """The policy `name` (`default` or `identity`) for a flow between these aliases, as a flow or MM2 configures it."""
    if name == IdentityPolicy.name:
        return IdentityPolicy(target, provenance_header)
    return DefaultPolicy(source, target, separator)


def replication_policy(flow: FlowConfig) -> ReplicationPolicy:
    """The flow's replication policy: the one object that answers naming and loop questions for it."""
    return named_policy(flow.replication_policy, flow.source, flow.target, flow.separator, flow.provenance_header)


def target_topic(flow: FlowConfig, source_topic: str) -> str:
    """The copy's name on the flow's target (its policy's `target_topic`)."""
    return replication_policy(flow).target_topic(source_topic)


def should_mirror(flow: FlowConfig, source_topic: str) -> bool:
    """Whether a topic on the flow's source cluster is copied by this flow."""
    if never_mirrored(source_topic, flow.separator):
        return False
    if source_topic == HEARTBEATS_TOPIC:
        return True  # heartbeats always travel, like MM2's, to measure end-to-end liveness
    if replication_policy(flow).came_from_target(source_topic):
        return False  # a copy that came from our target: mirroring it back would cycle
    return flow.topics.matches(source_topic)


def provenance(alias: str, offset: int) -> bytes:
    """The provenance header's value for a record copied from `alias` at source `offset`."""
    return f"{alias}:{offset}".encode()


# The largest offset Kafka has (a signed 64-bit integer). A provenance value with a larger offset was made by no copy
# core of the mirror, so it is no stamp of ours: not an echo, and not stamped again (every core, by the contract).
MAX_OFFSET = 2**63 - 1


def origin(value: str | bytes) -> tuple[bytes, int] | None:
    """A provenance value's alias and source offset; None for a value `provenance` did not make, one whose offset is
    past MAX_OFFSET among them."""
    alias, sep, offset = (value.encode() if isinstance(value, str) else value).partition(b":")
    return (alias, int(offset)) if sep and offset.isdigit() and int(offset) <= MAX_OFFSET else None


def drops_record(flow: FlowConfig, came_from: tuple[bytes, int] | None) -> bool:
    """Identity loop prevention: a record that came from the flow's target (its provenance `origin`) must not go
    back there."""
    return replication_policy(flow).drops(came_from)


def echoes_back(config: MirrorConfig, flow: FlowConfig) -> bool:
    """Whether records written locally on the flow's target come back to its source, stamped, through a flow the
    other way that keeps names: then its translation can tell which of them a group has read (spark_app.dr.syncs)."""
    return not replication_policy(flow).renames and any(
        back.source == flow.target and back.target == flow.source and replication_policy(back).stamps
        for back in config.flows
    )


def internal_separator(flow: FlowConfig) -> str:
    """What joins the parts of an internal topic's name: the flow's separator, as MM2 does, unless it is told not to."""
    return flow.separator if flow.internal_topic_separator else "."


def checkpoints_topic(flow: FlowConfig) -> str:
    """MM2's name, on the target, so RemoteClusterUtils.translateOffsets reads our checkpoints."""
    sep = internal_separator(flow)
    return f"{flow.source}{sep}checkpoints{sep}internal"


def offset_syncs_topic(flow: FlowConfig) -> str:
    """Named as MM2 names its own, but with our prefix: see spark_app/dr/__init__.py for why."""
    return _offset_syncs("mirrorkit-offset-syncs", flow, flow.offset_syncs_location)


def mm2_offset_syncs_topic(flow: FlowConfig, location: str) -> str:
    """MM2's offset syncs for the flow when its `offset-syncs.topic.location` is `location` (`source` or `target`)."""
    return _offset_syncs("mm2-offset-syncs", flow, location)


def _offset_syncs(prefix: str, flow: FlowConfig, location: str) -> str:
    """After the alias of the cluster that does not hold them (MirrorSourceConfig.offsetSyncsTopic)."""
    other = flow.source if location == "target" else flow.target
    sep = internal_separator(flow)
    return f"{prefix}{sep}{other}{sep}internal"


LEASE_GROUP_PREFIX = "mirrorkit-lease."
POSITIONS_GROUP_PREFIX = "mirrorkit-positions."  # spark_app.transactions: an exactly-once flow's committed positions
# The mirror's own groups on a cluster, which DR sync never treats as a consumer's.
MIRROR_GROUP_PREFIXES = (LEASE_GROUP_PREFIX, POSITIONS_GROUP_PREFIX)


def lease_group(flow: FlowConfig) -> str:
    """The consumer group on the target whose static member holds the flow's DR lease (spark_app.dr.lease)."""
    return f"{LEASE_GROUP_PREFIX}{flow.source}.{flow.target}"


def positions_group(flow: FlowConfig) -> str:
    """The consumer group on the target whose offsets are an exactly-once flow's committed source positions (never
    joined: spark_app.transactions)."""
    return f"{POSITIONS_GROUP_PREFIX}{flow.source}.{flow.target}"


def transactional(flow: FlowConfig, into_eventhubs: bool) -> bool:
    """Whether the flow's copier slots write in transactions: every exactly-once flow, and every real-time flow, whose
    long-running tasks must not leave zombies writing beside their successors, unless its target is Event Hubs (only
    its Premium and Dedicated tiers have transactions, in preview: there a flow asks for them with `exactly_once`).
    The copy asks it, and so does `access`, which grants the ids."""
    return flow.exactly_once or (flow.mode is FlowMode.REALTIME and not into_eventhubs)


def transactional_id_prefix(flow: FlowConfig) -> str:
    """What every transactional id of the flow's copier slots starts with (the prefix infra grants)."""
    return f"mirrorkit.{flow.source}.{flow.target}."


# The drill's probe topic unless one is named (spark_app.dr.drill): not `mirrorkit-...`, an internal prefix never
# mirrored. A named probe topic is granted only when its name starts with it; each probe group is `<probe topic>-<id>`.
PROBE_TOPIC = "mirrorkit_drill"


def connect_offsets_topic(flow: FlowConfig) -> str:
    """Where MirrorMaker 2 keeps the flow's source positions on the target (Connect's offsets topic): what `adopt`
    reads and `handback` writes (spark_app.dr.adopt). The flow's `mirrormaker2.offsets_topic`, else dedicated mode's."""
    return flow.mirrormaker2.offsets_topic or f"mm2-offsets.{flow.source}.internal"


def connect_group(flow: FlowConfig) -> str:
    """MirrorMaker 2's Connect group on the target, whose members tell it still runs: the flow's
    `mirrormaker2.connect_group`, else dedicated mode's."""
    return flow.mirrormaker2.connect_group or f"{flow.source}-mm2"


@dataclass(frozen=True)
class Access:
    """What the mirror of some flows does on one cluster. Topics and groups are full-match regexes, as flows select
    them; a single name is escaped (`re.escape`), so `literal_prefix` gives it back whole. A new kind of right is one
    more field here, filled in by `access`."""

    read: frozenset[str] = frozenset()  # source topics: read
    written: frozenset[str] = frozenset()  # copies on a target: created, configured and written
    owned: frozenset[str] = frozenset()  # the mirror's own topics: created, written and read back
    dead_letters: frozenset[str] = frozenset()  # created and written, never read
    groups_described: frozenset[str] = frozenset()  # source groups whose committed offsets it reads
    groups_altered: frozenset[str] = frozenset()  # target groups whose offsets it sets (sync_group_offsets)
    # its own groups on a target: the DR lease, joined and committed; an exactly-once flow's positions, committed
    groups_joined: frozenset[str] = frozenset()
    # Copies on a target that those groups' offsets are committed on: an OffsetCommit needs Read on each topic it
    # names as well as on the group.
    offsets_committed: frozenset[str] = frozenset()
    # The transactional ids its copier slots write with, one regex per flow: real-time tasks fence their zombies with
    # them, and exactly-once flows commit through them (spark_app.transactions).
    transactional_ids: frozenset[str] = frozenset()
    # What only the operator verbs do (access(..., operator=True)):
    # the drill's probe topics on a source: created, written and read back (probe records, consumed by its group)
    probe_topics: frozenset[str] = frozenset()
    groups_deleted: frozenset[str] = frozenset()  # the drill's probe groups, deleted on both clusters at its end
    # MirrorMaker 2's and Connect's topics that `adopt` reads: MM2's heartbeats on the target and its offset syncs
    # wherever they are (`handback` creates and writes those, so they are `owned` too)
    foreign_read: frozenset[str] = frozenset()
    # Connect's offsets topic on the target: `adopt` reads MM2's positions there, `handback` writes them; never
    # created (Connect makes it)
    foreign_written: frozenset[str] = frozenset()

    @property
    def created(self) -> frozenset[str]:
        """Every topic it writes, and so may have to create."""
        return self.written | self.owned | self.dead_letters | self.probe_topics

    def __or__(self, other: Access) -> Access:
        """Both sets' rights."""
        return Access(**{f.name: getattr(self, f.name) | getattr(other, f.name) for f in fields(self)})


def access(flows: Iterable[FlowConfig], alias: str, eventhubs: bool = False, operator: bool = False) -> Access:
    """Everything the mirror of these flows does on cluster `alias` (an Event Hubs one with `eventhubs`), and nothing
    more; with `operator`, what the operator verbs run with its identity do there besides (`operator_access`).

    On a source: read the selected topics, describe the selected groups; own `heartbeats` when the flow emits them
    (written there, then read back to be mirrored like any topic), and the offset syncs when they live there. On a
    target: write the copies under the flow's naming policy; own the checkpoints, the heartbeats' copy and the offset
    syncs; join the flow's DR lease group; write dead letters; set the selected groups' offsets when the flow syncs
    them, which reads the copies; write with the flow's transactional ids when its tasks use them (real time, or
    exactly once), and commit an exactly-once flow's positions, which reads the copies too.
    """
    read: set[str] = set()
    written: set[str] = set()
    owned: set[str] = set()
    dead_letters: set[str] = set()
    described: set[str] = set()
    altered: set[str] = set()
    committed: set[str] = set()
    joined: set[str] = set()
    transactional_ids: set[str] = set()
    for flow in flows:
        if flow.source == alias:
            read |= _source_topics(flow)
            described |= set(flow.groups.include)
            if flow.emit_heartbeats:
                owned.add(re.escape(HEARTBEATS_TOPIC))
            if flow.offset_syncs_location == "source":
                owned.add(re.escape(offset_syncs_topic(flow)))
        if flow.target == alias:
            copies = {replication_policy(flow).copies(pattern) for pattern in _source_topics(flow)}
            written |= copies
            owned |= {re.escape(checkpoints_topic(flow)), re.escape(target_topic(flow, HEARTBEATS_TOPIC))}
            joined.add(re.escape(lease_group(flow)))
            if flow.offset_syncs_location == "target":
                owned.add(re.escape(offset_syncs_topic(flow)))
            if flow.dead_letter_topic:
                dead_letters.add(re.escape(flow.dead_letter_topic))
            if flow.sync_group_offsets:
                altered |= set(flow.groups.include)
                committed |= copies
            if transactional(flow, eventhubs):
                transactional_ids.add(re.escape(transactional_id_prefix(flow)) + r"\d+")
            if flow.exactly_once:
                joined.add(re.escape(positions_group(flow)))
                committed |= copies
    mirror = Access(
        read=frozenset(read),
        written=frozenset(written),
        owned=frozenset(owned),
        dead_letters=frozenset(dead_letters),
        groups_described=frozenset(described),
        groups_altered=frozenset(altered),
        offsets_committed=frozenset(committed),
        groups_joined=frozenset(joined),
        transactional_ids=frozenset(transactional_ids),
    )
    return mirror | operator_access(flows, alias) if operator else mirror


def operator_access(flows: Iterable[FlowConfig], alias: str) -> Access:
    """What the operator verbs do on cluster `alias` for these flows, beyond what the mirror does there.

    - `failover` (spark_app.dr.views): commits each selected group's translated offsets on the target, as group
      offset sync does: alters those groups, and reads the copies they commit on.
    - `drill` (spark_app.dr.drill), on a flow that mirrors its probe topic (`PROBE_TOPIC`, or a listed topic whose
      name starts with it): on the source, makes the probe topic, writes it and reads it back with a probe group
      that commits; on the target, reads the probe's copy with that group (after failing it over, as above); deletes
      the probe group on both. Probe groups are granted where the flow's group filter selects them (the drill
      refuses a flow that does not checkpoint them).
    - `adopt` and `handback` (spark_app.dr.adopt, spark_app.dr.handback), for dedicated-mode MirrorMaker 2: on the
      target, read and write Connect's offsets topic (`connect_offsets_topic`), describe Connect's group
      (`connect_group`) and read MM2's `heartbeats`, to tell whether MM2 still runs, and read the copies (adopt checks
      the record at MM2's position); MM2's offset syncs on either cluster (`offset-syncs.topic.location`): adopt reads
      them, handback makes and writes them. Names given only at run time (`--offsets-topic`, `--connect-group`) are
      not granted: a Connect cluster of its own (Strimzi) is named in the flow's `mirrormaker2`.
    """
    altered: set[str] = set()
    committed: set[str] = set()
    probes: set[str] = set()
    joined: set[str] = set()
    deleted: set[str] = set()
    described: set[str] = set()
    owned: set[str] = set()
    foreign_read: set[str] = set()
    foreign_written: set[str] = set()
    for flow in flows:
        if alias not in (flow.source, flow.target):
            continue
        probe = probe_topics(flow)
        probe_groups = {_probe_groups(p) for p in probe if flow.groups.matches(_probe_group_sample(p))}
        joined |= probe_groups
        deleted |= probe_groups
        if flow.source == alias:
            probes |= probe
            owned.add(re.escape(mm2_offset_syncs_topic(flow, "source")))
        if flow.target == alias:
            copies = {replication_policy(flow).copies(pattern) for pattern in _source_topics(flow)}
            altered |= set(flow.groups.include)
            committed |= copies
            owned.add(re.escape(mm2_offset_syncs_topic(flow, "target")))
            foreign_read.add(re.escape(HEARTBEATS_TOPIC))
            foreign_written.add(re.escape(connect_offsets_topic(flow)))
            described.add(re.escape(connect_group(flow)))
    return Access(
        owned=frozenset(owned),
        groups_described=frozenset(described),
        groups_altered=frozenset(altered),
        offsets_committed=frozenset(committed),
        groups_joined=frozenset(joined),
        probe_topics=frozenset(probes),
        groups_deleted=frozenset(deleted),
        foreign_read=frozenset(foreign_read),
        foreign_written=frozenset(foreign_written),
    )


def probe_topics(flow: FlowConfig) -> set[str]:
    """The drill's probe topics a flow mirrors, as regexes: with patterns, every name that starts with `PROBE_TOPIC`
    when the flow mirrors `PROBE_TOPIC` itself; with a list, the listed names that start with it."""
    names = flow.topics.literal_names()
    if names is None:
        return {re.escape(PROBE_TOPIC) + ".*"} if should_mirror(flow, PROBE_TOPIC) else set()
    return {re.escape(t) for t in names if t.startswith(PROBE_TOPIC) and should_mirror(flow, t)}


def _probe_group_sample(probe: str) -> str:
    """A probe group of a probe topic regex, as the drill names one, to ask a flow's group filter about."""
    return f"{literal_prefix(probe)[0]}-{'0' * 12}"


def _probe_groups(probe: str) -> str:
    """The probe groups of a probe topic regex: `<probe topic>-<run id>`."""
    name, whole = literal_prefix(probe)
    return re.escape(name) + ("-.*" if whole else ".*")


def _source_topics(flow: FlowConfig) -> set[str]:
    """A flow that lists plain names reads exactly those it mirrors; a flow with patterns, what they match."""
    names = flow.topics.literal_names()
    if names is None:
        return set(flow.topics.include)
    return {re.escape(t) for t in names if should_mirror(flow, t)}


_REGEX_META = set(".^$*+?{}[]\\|()")


def literal_prefix(pattern: str) -> tuple[str, bool]:
    """The literal text that every name a full-match regex takes starts with, and whether it is the whole name."""
    if _alternates(pattern):
        return "", False
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out, i = out + pattern[i + 1], i + 2
            continue
        if ch in _REGEX_META:
            # `?`, `*` and `{m,n}` may take the character before them zero times: it is not in every name.
            return (out[:-1] if ch in "?*{" else out), False
        out, i = out + ch, i + 1
    return out, True


def _alternates(pattern: str) -> bool:
    """Whether a regex has a `|` outside every group and character class: then no prefix is common to its names."""
    depth, i, in_class = 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        i += 1
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            i += pattern[i : i + 1] == "^"
            i += pattern[i : i + 1] == "]"  # a `]` first in a class is literal
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "|" and depth == 0:
            return True
    return False


def event_hubs_topics(config: MirrorConfig) -> dict[str, list[str]]:
    """Every topic the mirror writes to on each Event Hubs cluster, which infra must therefore create: what its
    access set there says it creates. Flows into Event Hubs list plain names (MirrorConfig refuses patterns), so each
    is one topic."""
    return {
        c.alias: sorted(_one_topic(p) for p in access(config.flows, c.alias, eventhubs=True).created)
        for c in config.clusters
        if c.is_eventhubs
    }


def _one_topic(pattern: str) -> str:
    name, whole = literal_prefix(pattern)
    if not whole:
        raise ValueError(f"'{pattern}' is a pattern, not one topic")
    return name
