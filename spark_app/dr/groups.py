"""Consumer groups on a cluster: their committed offsets, and commits that never overwrite a group in use.

An operator's move (`failover`, `failback`) marks what it commits: the commit metadata of every partition of the
group it moved names the move and the flow. Group offset sync leaves a marked group alone, so a running mirror
never moves a group the operator moved. A consumer's own commit clears the mark on the partitions it commits; so
does `kafka-consumer-groups.sh --reset-offsets --to-current --execute` for every partition, which hands the group
back to group sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from .. import clients
from ..clients import Partition
from ..config import ClusterConfig, GroupSelection
from ..policy import MIRROR_GROUP_PREFIXES


@dataclass(frozen=True)
class Committed:
    """A group's committed position on one partition: the next offset it reads, and its commit metadata."""

    offset: int
    metadata: str = ""


MARK_PREFIX = "mirrorkit:"


def mark(move: str, flow: str) -> str:
    """The commit metadata of an operator's move, e.g. `mirrorkit:failover primary->dr`."""
    return f"{MARK_PREFIX}{move} {flow}"


@dataclass(frozen=True)
class GroupCommit:
    """What committing translated offsets did for one group: committed, kept (target ahead), refused, or left
    alone (group sync, for a group an operator moved)."""

    group: str
    committed: dict[Partition, int] = field(default_factory=dict)
    kept: dict[Partition, int] = field(default_factory=dict)
    refused: str | None = None
    left: str | None = None


def split_commit(group: str, wanted: dict[Partition, int], current: dict[Partition, int]) -> GroupCommit:
    """Which wanted offsets to commit: a partition whose committed offset is already at or past it is kept."""
    committed, kept = {}, {}
    for tp, offset in wanted.items():
        have = current.get(tp)
        if have is not None and have >= offset:
            kept[tp] = have
        else:
            committed[tp] = offset
    return GroupCommit(group, committed, kept)


class ClusterGroups:
    """The consumer groups of one cluster, through its AdminClient."""

    def __init__(self, cluster: ClusterConfig) -> None:
        self.cluster = cluster
        self._admin: AdminClient | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = clients.admin(self.cluster)
        return self._admin

    def groups(self, selection: GroupSelection) -> list[str]:
        """The groups on the cluster that `selection` matches, sorted, but the mirrors' own (DR leases, whose member is
        a running mirror, and exactly-once positions: no consumer's); raises when any broker did not answer."""
        listing = self.admin.list_consumer_groups(request_timeout=clients.REQUEST_TIMEOUT_S).result()
        if listing.errors:  # a broker did not answer: its groups are missing, and a missing group gets tombstones
            raise KafkaException(listing.errors[0])  # a KafkaError, which `except Exception` would not catch
        return sorted(
            g.group_id
            for g in listing.valid
            if selection.matches(g.group_id) and not g.group_id.startswith(MIRROR_GROUP_PREFIXES)
        )

    def partitions(self) -> list[Partition]:
        """Every partition of the cluster's topics but Kafka's own (`__consumer_offsets` and the like)."""
        topics = clients.list_topics(self.admin, self.cluster)
        return sorted((t, p) for t, m in topics.items() if not t.startswith("__") for p in m.partitions)

    def committed(self, group: str, partitions: list[Partition] | None = None) -> dict[Partition, Committed]:
        """The group's committed positions on `partitions` (by default every partition of `partitions()`), where it
        committed one."""
        asked = [TopicPartition(t, p) for t, p in (self.partitions() if partitions is None else partitions)]
        return {
            (tp.topic, tp.partition): Committed(tp.offset, tp.metadata or "")
            for tp in clients.group_offsets(self.cluster, group, asked)
            if tp.offset >= 0
        }

    def members(self, group: str) -> int:
        """How many members the group has on this cluster (0 for an empty or unknown group)."""
        future = self.admin.describe_consumer_groups([group], request_timeout=clients.REQUEST_TIMEOUT_S)[group]
        return len(future.result().members)

    def delete(self, group: str) -> None:
        """Delete a group with no member here (the broker refuses a group in use); raises KafkaException."""
        future = self.admin.delete_consumer_groups([group], request_timeout=clients.REQUEST_TIMEOUT_S)[group]
        future.result()

    def latest(self, partitions: list[Partition]) -> dict[Partition, int]:
        """The end offset of each partition: where a group that has read everything resumes."""
        return clients.list_offsets(self.admin, partitions, OffsetSpec.latest())

    def plan_commit(self, group: str, offsets: dict[Partition, int], move: str | None = None) -> GroupCommit:
        """What `commit` would do, committing nothing: refused for a group with members here; for group sync
        (`move` None) left alone when an operator's move marked it; else the split."""
        members = self.members(group)
        if members:
            return GroupCommit(
                group,
                refused=f"group '{group}' has {members} active member(s) on '{self.cluster.alias}'; stop its"
                " consumers there first, the mirror never overwrites a group in use",
            )
        current = self.committed(group)
        marks = sorted({c.metadata for c in current.values() if c.metadata.startswith(MARK_PREFIX)})
        if move is None and marks:
            return GroupCommit(group, left=f"group '{group}' on '{self.cluster.alias}' was moved by {marks[0]}")
        return split_commit(group, offsets, {tp: c.offset for tp, c in current.items()})

    def commit(self, group: str, offsets: dict[Partition, int], move: str | None = None) -> GroupCommit:
        """Commit offsets for a group with no member here, never moving a partition backwards. An operator's
        `move` (see `mark`) is written on every partition it names, kept ones included; group sync passes none."""
        result = self.plan_commit(group, offsets, move)
        if result.refused or result.left:
            return result
        wanted = result.committed | (result.kept if move else {})
        if wanted:
            partitions = [
                TopicPartition(t, p, o, metadata=move) if move else TopicPartition(t, p, o)
                for (t, p), o in sorted(wanted.items())
            ]
            request = [ConsumerGroupTopicPartitions(group, partitions)]
            try:
                self.admin.alter_consumer_group_offsets(request, request_timeout=clients.REQUEST_TIMEOUT_S)[
                    group
                ].result()
            except KafkaException as err:  # a member joined between the check and the commit: the broker refused
                return GroupCommit(group, refused=f"group '{group}' on '{self.cluster.alias}': {err.args[0].str()}")
        return result
