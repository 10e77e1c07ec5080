"""The checkpoint task: translate the selected groups' committed offsets and write MM2-format checkpoints.

Every `checkpoint_interval_s` the committed offsets of the flow's selected groups on its mirrored partitions are read on
the source and translated through the offset-sync store. A checkpoint is written to `<source>.checkpoints.internal` on
the target, in MirrorMaker 2's format keyed by (group, target topic, partition) so MM2's
`RemoteClusterUtils.translateOffsets` reads it, only when it differs from the last one written for its key: an idle
group costs nothing. A group that leaves the selection (deleted on the source, its offsets expired, or no longer matched
by `groups`) gets a tombstone for each of its keys, so the compacted topic forgets it and a failover or drill does not
bring it back. A group's checkpoint age is reported (`on_written`) only while it has a checkpoint: one gone, no longer
selected, or no longer committing on a mirrored partition loses its series at that round, so the stale-checkpoint alert
watches only groups the flow still checkpoints. Each round tells the store which committed offsets groups hold, so the
runs they need are kept however old they grow. With `sync_group_offsets` a changed translation is also committed on the
target for groups with no member there, except a group an operator's `failover` or `failback` moved there (its commits
carry their mark, spark_app.dr.groups). The source and the target are injected, so the task runs without a cluster in
tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ..clients import Partition
from ..config import FlowConfig, GroupSelection
from ..policy import should_mirror, target_topic
from .formats import Checkpoint
from .groups import Committed, GroupCommit
from .syncs import SyncStore, Translation

log = logging.getLogger(__name__)

CheckpointKey = tuple[str, str, int]  # (group, target topic, partition)


class SourceGroups(Protocol):
    """The consumer groups on the flow's source."""

    def groups(self, selection: GroupSelection) -> list[str]: ...

    def partitions(self) -> list[Partition]:
        """Every partition of the cluster's topics."""
        ...

    def committed(self, group: str, partitions: list[Partition]) -> dict[Partition, Committed]:
        """The group's committed positions on `partitions`, where it committed one."""
        ...


class CheckpointTarget(Protocol):
    """The flow's target, as the checkpoint task uses it."""

    def start_offset(self, topic: str, partition: int) -> int:
        """The first offset of a target partition."""
        ...

    def write(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        """Write checkpoints (and tombstones); those the cluster acknowledged, [] when the checkpoints topic cannot
        be used."""
        ...

    def commit(self, group: str, offsets: dict[Partition, int]) -> GroupCommit:
        """Commit a group's offsets on the target as group sync (spark_app.dr.groups.ClusterGroups.commit)."""
        ...


class CheckpointTask:
    """One flow's checkpoints. `checkpoints` holds the newest written per key (a restart reloads them)."""

    def __init__(
        self,
        flow: FlowConfig,
        syncs: SyncStore,
        lock: threading.Lock,
        source: SourceGroups,
        target: CheckpointTarget,
        on_written: Callable[[str, float | None], None] | None = None,  # None: the group has no checkpoint now
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.flow = flow
        self.syncs = syncs
        self.source = source
        self.target = target
        self.checkpoints: dict[CheckpointKey, Checkpoint] = {}  # the last written (or read back at start) per key
        # Per group with a checkpoint now: the unix time its checkpoints were last written or confirmed.
        self.written_at: dict[str, float] = {}
        self.group_commits: dict[str, GroupCommit] = {}  # the last group sync of each group with a checkpoint now
        self._lock = lock
        self._on_written = on_written
        self._clock = clock

    def run_once(self) -> list[Checkpoint]:
        """Translate every selected group's committed offsets; write the checkpoints that changed, and tombstones
        for the keys of groups gone from the selection; sync the groups whose translation changed (or whose last
        commit was refused) if asked. Returns what the target acknowledged: a checkpoint it did not take stays
        changed, so the next round writes it again."""
        current: list[Checkpoint] = []
        needed: dict[Partition, set[int]] = {}
        listed = self.source.groups(self.flow.groups)
        partitions = self.source.partitions() if listed else []
        copies = {t: target_topic(self.flow, t) for t in {t for t, _ in partitions} if should_mirror(self.flow, t)}
        mirrored = [tp for tp in partitions if tp[0] in copies]
        for group in listed:
            offsets = self.source.committed(group, mirrored)
            for tp, c in offsets.items():
                needed.setdefault(tp, set()).add(c.offset)
            for tp, c in sorted(offsets.items()):
                if (cp := self.checkpoint(group, tp, copies[tp[0]], c)) is not None:
                    current.append(cp)
        with self._lock:
            self.syncs.keep_for(needed)
        changed = [cp for cp in current if self.checkpoints.get((cp.group, cp.topic, cp.partition)) != cp]
        if self.flow.sync_group_offsets:
            self._sync_groups(current, {cp.group for cp in changed})
        still = set(listed)
        gone = [Checkpoint.tombstone(*key) for key in self.checkpoints if key[0] not in still]
        written = self.target.write(changed + gone) if changed or gone else []
        now = self._clock()
        for cp in written:
            key = (cp.group, cp.topic, cp.partition)
            if cp.deleted:
                del self.checkpoints[key]
            else:
                self.checkpoints[key] = cp
        checkpointed = {cp.group for cp in current}
        pending = {cp.group for cp in set(changed) - set(written)}  # not taken: still changed at the next round
        for group in sorted(checkpointed - pending):
            self.written_at[group] = now
            if self._on_written is not None:
                self._on_written(group, now)
        # No checkpoint of theirs now, whether their tombstones were taken yet or not: their age would only grow.
        for group in sorted(self.written_at.keys() - checkpointed):
            del self.written_at[group]
            if self._on_written is not None:
                self._on_written(group, None)
        self.group_commits = {g: commit for g, commit in self.group_commits.items() if g in checkpointed}
        return written

    def _sync_groups(self, current: list[Checkpoint], changed_groups: set[str]) -> None:
        refused = {g for g, commit in self.group_commits.items() if commit.refused}
        for group in sorted(changed_groups | (refused & {cp.group for cp in current})):
            on_target = {(cp.topic, cp.partition): cp.downstream_offset for cp in current if cp.group == group}
            result = self.target.commit(group, on_target)
            if result.left and not (group in self.group_commits and self.group_commits[group].left):
                log.info("flow %s: group sync leaves it alone: %s", self.flow.name, result.left)
            self.group_commits[group] = result

    def checkpoint(self, group: str, tp: Partition, remote: str, committed: Committed) -> Checkpoint | None:
        """The checkpoint for one group's committed offset on a mirrored source partition, whose copy is `remote`;
        None when the partition has nothing mirrored yet."""
        topic, partition = tp
        previous = self.checkpoints.get((group, remote, partition))
        fallback = None
        if previous is not None and previous.upstream_offset <= committed.offset:
            fallback = Translation(previous.downstream_offset, committed.offset - previous.upstream_offset)
        with self._lock:
            translation = self.syncs.translate(topic, partition, committed.offset, fallback)
            mirrored = self.syncs.latest(topic, partition) is not None
        if translation is None:
            if not mirrored:
                return None  # nothing of this partition mirrored yet
            translation = Translation(self.target.start_offset(remote, partition), committed.offset)
        return Checkpoint(group, remote, partition, committed.offset, translation.downstream_offset, committed.metadata)
