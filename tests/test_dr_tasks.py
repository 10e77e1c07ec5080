"""The DR tasks on their own, with the clusters injected as fakes: offset syncs, checkpoints, group commits and
heartbeats, so their rules are checked without a broker."""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConsumerGroupListing, ListConsumerGroupsResult

from spark_app.config import FlowConfig, GroupSelection, parse_config
from spark_app.dr.checkpoints import CheckpointTask
from spark_app.dr.formats import Checkpoint, Heartbeat, OffsetSync
from spark_app.dr.groups import ClusterGroups, Committed, GroupCommit, Partition, split_commit
from spark_app.dr.heartbeats import HeartbeatTask
from spark_app.dr.internal import read_checkpoints
from spark_app.dr.offset_syncs import OffsetSyncWriter
from spark_app.dr.service import DrSync
from spark_app.dr.syncs import Run, SyncStore
from spark_app.metrics import MirrorMetrics
from spark_app.ranges import Landing

FLOW = FlowConfig.model_validate(
    {"source": "primary", "target": "dr", "topics": {"include": ["orders"]}, "checkpoint_location": "/c",
     "groups": {"include": ["app-.*"]}, "sync_group_offsets": True}
)  # fmt: skip


CLUSTERS = [{"alias": a, "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"} for a in ("primary", "dr")]
CONFIG = {"clusters": CLUSTERS, "flows": [FLOW.model_dump(mode="json") | {"sync_group_offsets": False}]}


class FakeSource:
    def __init__(self, committed: dict[str, dict[Partition, Committed]]) -> None:
        self.by_group = committed

    def groups(self, selection: GroupSelection) -> list[str]:
        return sorted(g for g in self.by_group if selection.matches(g))

    def partitions(self) -> list[Partition]:
        return sorted({tp for offsets in self.by_group.values() for tp in offsets})

    def committed(self, group: str, partitions: list[Partition]) -> dict[Partition, Committed]:
        return {tp: c for tp, c in self.by_group[group].items() if tp in partitions}


class FakeTarget:
    def __init__(self, usable: bool = True) -> None:
        self.usable = usable
        self.written: list[Checkpoint] = []
        self.commits: dict[str, dict[Partition, int]] = {}

    def start_offset(self, topic: str, partition: int) -> int:
        return 1000 + partition

    def write(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        if not self.usable:
            return []
        self.written += checkpoints
        return checkpoints

    def commit(self, group: str, offsets: dict[Partition, int]) -> GroupCommit:
        self.commits[group] = offsets
        return GroupCommit(group, committed=offsets)


def landing(partition: int, start: int, end: int, target: int) -> Landing:
    """A range whose records all landed, one after another, from `target` on."""
    row = Landing("orders", partition, start, end)
    for offset in range(start, end):
        row.landed(offset, target + offset - start)
    return row


class FlakyProducer:
    """A producer that reports the first `failures` records it is handed as not delivered, and keeps the rest as the
    topic's log: (topic, key, value)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.log: list[tuple[str, bytes, bytes | None]] = []
        self._queued: list[tuple[str, bytes, bytes | None, Callable | None]] = []

    def produce(self, topic: str, key: bytes, value: bytes | None, on_delivery: Callable | None = None) -> None:
        self._queued.append((topic, key, value, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        queued, self._queued = self._queued, []
        for topic, key, value, on_delivery in queued:
            error = None
            if self.failures:
                self.failures -= 1
                error = KafkaError(KafkaError._MSG_TIMED_OUT)
            else:
                self.log.append((topic, key, value))
            if on_delivery is not None:
                on_delivery(error, None)
        return len(queued)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0


class HeldLease:
    """The flow's DR lease, held for good (spark_app.dr.lease needs a cluster)."""

    fenced = None

    def held(self) -> bool:
        return True

    def release(self) -> None:
        pass


def service_writing_to(producer: FlakyProducer, groups: dict[str, dict[Partition, Committed]]) -> DrSync:
    """A flow's DR service whose internal topics are there and whose producers are `producer`, with no cluster."""
    config = parse_config(CONFIG)
    dr = DrSync(config, config.flows[0])
    dr._prepared = True  # nothing to read back
    dr.lease = HeldLease()  # type: ignore[assignment]
    dr.producers._by_alias = {"primary": producer, "dr": producer}  # type: ignore[dict-item]
    dr.checkpoints.source = FakeSource(groups)
    return dr


def test_an_offset_sync_the_cluster_did_not_take_is_written_again_at_the_next_round():
    producer = FlakyProducer(failures=1)
    dr = service_writing_to(producer, {})
    dr.on_landed([landing(0, 0, 50, 0)])
    dr.checkpoint_once()
    assert producer.log == []  # refused once
    dr.checkpoint_once()  # nothing new landed: the refused sync is written again
    assert [OffsetSync.decode(k, v) for _, k, v in producer.log if v] == [OffsetSync("orders", 0, 0, 0, 0, 49)]
    dr.on_landed([landing(0, 50, 60, 50)])  # the run grows: one newer sync of the same slot, the refused one is gone
    dr.checkpoint_once()
    dr.checkpoint_once()
    assert [OffsetSync.decode(k, v) for _, k, v in producer.log if v] == [
        OffsetSync("orders", 0, 0, 0, 0, 49), OffsetSync("orders", 0, 0, 0, 0, 59)
    ]  # fmt: skip


def test_a_refused_sync_is_not_written_again_over_a_newer_one_of_its_slot():
    store, lock = SyncStore(), threading.Lock()
    handed: list[OffsetSync] = []
    writer = OffsetSyncWriter(store, lock, handed.append)
    store.record("orders", 0, Run(0, 0, 9))
    (old,) = writer.flush()
    store.record("orders", 0, Run(10, 10, 19))
    (new,) = writer.flush()
    writer.delivered(old, KafkaError(KafkaError._MSG_TIMED_OUT))  # the older write's report comes late
    writer.delivered(new, None)
    assert writer.flush() == [] and handed == [old, new]


def test_a_checkpoint_the_cluster_did_not_take_is_written_again_at_the_next_round():
    producer = FlakyProducer(failures=0)
    dr = service_writing_to(producer, {"app-a": {("orders", 0): Committed(40)}})
    dr.on_landed([landing(0, 0, 100, 0)])
    dr.offset_syncs.flush()
    producer.failures = 1  # the checkpoint's write is refused
    assert dr.checkpoint_once() == [] and dr.checkpoints.written_at == {}
    assert dr.checkpoint_once() == [Checkpoint("app-a", "primary.orders", 0, 40, 40)]
    checkpoints = [Checkpoint.decode(k, v) for t, k, v in producer.log if t == "primary.checkpoints.internal" and v]
    assert checkpoints == [Checkpoint("app-a", "primary.orders", 0, 40, 40)]
    assert dr.checkpoint_once() == []  # taken: not written again


def test_a_group_gone_from_the_source_or_the_selection_gets_tombstones_taken_once():
    producer = FlakyProducer(failures=0)
    groups = {g: {("orders", 0): Committed(40), ("orders", 1): Committed(5)} for g in ("app-a", "app-b", "app-c")}
    dr = service_writing_to(producer, groups)
    dr.on_landed([landing(0, 0, 100, 0), landing(1, 0, 100, 0)])
    assert len(dr.checkpoint_once()) == 6
    del groups["app-a"]  # deleted on the source
    groups["other-b"] = groups.pop("app-b")  # not selected any more (stands in for a changed `groups.include`)
    producer.failures = 1  # the first tombstone is refused: it is written again at the next round
    tombstones = [Checkpoint.tombstone(g, "primary.orders", p) for g in ("app-a", "app-b") for p in (0, 1)]
    assert dr.checkpoint_once() == tombstones[1:]
    assert dr.checkpoint_once() == tombstones[:1]
    assert dr.checkpoint_once() == []  # forgotten: nothing more to write
    assert sorted(dr.checkpoints.checkpoints) == [("app-c", "primary.orders", 0), ("app-c", "primary.orders", 1)]
    assert sorted(dr.checkpoints.written_at) == ["app-c"]
    nulls = [Checkpoint.decode_key(k) for t, k, v in producer.log if t == "primary.checkpoints.internal" and v is None]
    assert sorted(nulls) == sorted((cp.group, cp.topic, cp.partition) for cp in tombstones)


class RefusingTarget(FakeTarget):
    """A target that, while `refusing`, does not take about half of what it is handed, tombstones too."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = rng
        self.refusing = False

    def write(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        return [cp for cp in checkpoints if not (self.refusing and self.rng.random() < 0.5)]


def test_checkpoint_age_series_are_the_groups_checkpointed_now_over_thousands_of_rounds():
    """What runs for days: 3,000 rounds while groups come and go on the source, in and out of the selection, their
    offsets moved to a topic the flow does not mirror or deleted, and the target refusing some writes, tombstones
    too. After every round the checkpoint-age series are at most the groups with a checkpoint now (all of them when
    the target took everything), so the stale-checkpoint alert never fires for a group the flow no longer
    checkpoints."""
    rng = random.Random(7)
    store = SyncStore()
    for partition in (0, 1):
        store.record("orders", partition, Run(0, 0, 10**9))
    committed: dict[str, dict[Partition, Committed]] = {}
    source, target, metrics = FakeSource(committed), RefusingTarget(rng), MirrorMetrics()
    task = CheckpointTask(FLOW, store, threading.Lock(), source, target,
                          lambda group, at: metrics.checkpoint_written("f", group, at))  # fmt: skip
    most = 0
    for _ in range(3000):
        for _ in range(rng.randint(0, 3)):
            group, change = f"{rng.choice(['app', 'other'])}-{rng.randrange(30)}", rng.random()  # other-*: unselected
            if change < 0.4:
                committed[group] = {("orders", rng.randrange(2)): Committed(rng.randrange(1000))}
            elif change < 0.55:
                committed[group] = {("unmirrored", 0): Committed(rng.randrange(1000))}
            elif change < 0.65:
                committed[group] = {}  # its offsets deleted, the group still listed
            else:
                committed.pop(group, None)
        target.refusing = rng.random() < 0.2
        task.run_once()
        now = {g for g in source.groups(FLOW.groups) if ("orders", 0) in committed[g] or ("orders", 1) in committed[g]}
        series = {
            s.labels["group"]
            for family in metrics.collect()  # the series computed at scrape time
            for s in family.samples
            if family.name == "mirrorkit_checkpoint_age_seconds"
        }
        assert series <= now and set(task.written_at) == series and set(task.group_commits) <= now
        if not target.refusing:
            assert series == now
        most = max(most, len(series))
    assert most > 5  # the loop did keep several groups checkpointed at once


def test_a_group_listing_a_broker_did_not_answer_is_refused_rather_than_taken_as_groups_gone():
    class Admin:
        def list_consumer_groups(self, request_timeout: float) -> SimpleNamespace:
            error = KafkaError(KafkaError._TRANSPORT)  # what librdkafka lists for a broker that did not answer
            found = ListConsumerGroupsResult([ConsumerGroupListing("app-a", False)], [error])
            return SimpleNamespace(result=lambda: found)

    groups = ClusterGroups(parse_config(CONFIG).cluster("primary"))
    groups._admin = Admin()  # type: ignore[assignment]
    with pytest.raises(KafkaException):
        groups.groups(FLOW.groups)


def test_checkpoints_read_back_leave_out_keys_a_tombstone_deleted(monkeypatch: pytest.MonkeyPatch):
    kept, deleted = Checkpoint("app-c", "primary.orders", 0, 40, 40), Checkpoint("app-a", "primary.orders", 0, 9, 9)
    records = [(deleted.key(), deleted.value()), (kept.key(), kept.value()), (None, b"x"), (deleted.key(), None)]
    log = [SimpleNamespace(key=lambda k=k: k, value=lambda v=v: v, timestamp=lambda: (1, 5000)) for k, v in records]
    monkeypatch.setattr("spark_app.clients.records", lambda cluster, topic, tail, timeout_s: iter(log))
    dr = service_writing_to(FlakyProducer(failures=0), {})
    assert read_checkpoints(dr.config, dr.flow) == {("app-c", "primary.orders", 0): (kept, 5.0)}
    assert gc.isenabled()  # paused for the decode only


def test_a_reset_partition_writes_tombstones_for_its_old_slots():
    producer = FlakyProducer(failures=0)
    dr = service_writing_to(producer, {})
    dr.on_landed([landing(0, 0, 50, 0), landing(0, 60, 70, 50)])  # a gap: two runs, slots 0 and 1
    dr.checkpoint_once()
    again = landing(0, 0, 10, 70)
    again.reset_from = 0  # the topic was re-created on the source: its offsets start over
    dr.on_landed([again])
    dr.checkpoint_once()
    written = [OffsetSync.decode_key(k) + ((OffsetSync.decode(k, v) if v else None),) for _, k, v in producer.log]
    assert written[2:] == [
        ("orders", 0, 0, 0, OffsetSync("orders", 0, 0, 70, 0, 9)),  # slot 0 holds the new run
        ("orders", 0, 1, 0, None),  # slot 1's old run is deleted
    ]


def test_offset_syncs_go_to_the_store_at_once_and_to_the_topic_once_per_flush_for_what_changed():
    store, emitted = SyncStore(), []
    writer = OffsetSyncWriter(store, threading.Lock(), emitted.append)
    held = Landing("orders", 1, 0, 50)  # held whole: nothing landed
    for batch in range(10):
        writer.on_landed([landing(0, 50 * batch, 50 * (batch + 1), 12 + 50 * batch), held])
    assert store.runs("orders", 0) == [Run(0, 12, 499)] and store.latest("orders", 1) is None
    assert emitted == []  # nothing written per batch
    assert writer.flush() == emitted == [OffsetSync("orders", 0, 0, 12, slot=0, last_offset=499)]
    writer.delivered(emitted[0], None)
    assert writer.flush() == []  # unchanged since: nothing to write
    writer.on_landed([landing(0, 501, 510, 512)])  # a gap at 500: a new run, in a slot of its own
    assert writer.flush() == [OffsetSync("orders", 0, 501, 512, slot=1, last_offset=509)]


def test_checkpoints_translate_selected_groups_commit_them_and_skip_partitions_with_nothing_mirrored():
    store = SyncStore()
    store.record("orders", 0, Run(0, -59, 99))  # source 99 landed at 40
    store.record("orders", 1, Run(5, 1, 9))
    source = FakeSource(
        {
            "app-a": {("orders", 0): Committed(99, "m"), ("orders", 1): Committed(3), ("orders", 2): Committed(7)},
            "other": {("orders", 0): Committed(1)},  # not selected
            "app-b": {("unselected-topic", 0): Committed(5)},
        }
    )
    target, written_at = FakeTarget(), []
    task = CheckpointTask(FLOW, store, threading.Lock(), source, target, lambda g, t: written_at.append((g, t)),
                          clock=lambda: 50.0)  # fmt: skip
    written = task.run_once()
    assert written == [
        Checkpoint("app-a", "primary.orders", 0, 99, 40, "m"),  # exact: right after 98, at 39
        Checkpoint("app-a", "primary.orders", 1, 3, 1001, ""),  # below every run: the target partition's start
    ]  # partition 2 has nothing mirrored yet; app-b's topic is not mirrored by this flow
    assert target.written == written and written_at == [("app-a", 50.0)]
    assert target.commits == {"app-a": {("primary.orders", 0): 40, ("primary.orders", 1): 1001}}
    assert task.checkpoints[("app-a", "primary.orders", 0)].downstream_offset == 40
    # A second round with nothing changed writes nothing and commits nothing, but confirms the group is current.
    target.commits.clear()
    assert task.run_once() == [] and target.written == written and target.commits == {}
    assert written_at == [("app-a", 50.0), ("app-a", 50.0)]
    source.by_group["app-a"][("orders", 0)] = Committed(101, "m")  # the group moved on one partition
    # ahead of the mirror (it wrote through 99): the mirror's next write, re-reading the 1 it has not copied yet
    assert task.run_once() == [Checkpoint("app-a", "primary.orders", 0, 101, 41, "m")]
    assert target.commits == {"app-a": {("primary.orders", 0): 41, ("primary.orders", 1): 1001}}


def test_group_sync_asks_again_for_a_group_an_operator_moved_only_when_its_translation_changes():
    """The target leaves a marked group alone (spark_app.dr.groups); unlike a refusal, that is not retried every
    round, only when the group's translation changes."""

    class MovedTarget(FakeTarget):
        def commit(self, group: str, offsets: dict[Partition, int]) -> GroupCommit:
            self.commits.setdefault(group, {}).update(offsets)
            return GroupCommit(group, left=f"group '{group}' on 'dr' was moved by mirrorkit:failover primary->dr")

    store = SyncStore()
    store.record("orders", 0, Run(0, 0, 99))
    source = FakeSource({"app-a": {("orders", 0): Committed(10)}})
    target = MovedTarget()
    task = CheckpointTask(FLOW, store, threading.Lock(), source, target)
    task.run_once()
    assert task.group_commits["app-a"].left and target.commits == {"app-a": {("primary.orders", 0): 10}}
    target.commits.clear()
    task.run_once()
    assert target.commits == {}  # nothing changed: not asked again
    source.by_group["app-a"][("orders", 0)] = Committed(20)
    task.run_once()
    assert target.commits == {"app-a": {("primary.orders", 0): 20}}


def test_a_group_below_every_sync_resumes_from_its_previous_checkpoint_when_that_is_not_ahead():
    store = SyncStore()
    store.record("orders", 0, Run(500, 300, 600))
    task = CheckpointTask(FLOW, store, threading.Lock(), FakeSource({}), FakeTarget())
    task.checkpoints[("app-a", "primary.orders", 0)] = Checkpoint("app-a", "primary.orders", 0, 100, 60)
    at_120 = task.checkpoint("app-a", ("orders", 0), "primary.orders", Committed(120))
    assert at_120 == Checkpoint("app-a", "primary.orders", 0, 120, 60)  # re-reads at most the 20 since then
    at_90 = task.checkpoint(
        "app-a", ("orders", 0), "primary.orders", Committed(90)
    )  # moved back: the old checkpoint is ahead
    assert at_90 == Checkpoint("app-a", "primary.orders", 0, 90, 1000)


def test_checkpoints_the_target_cannot_take_are_not_remembered_as_written():
    store = SyncStore()
    store.record("orders", 0, Run(0, 0, 9))
    source = FakeSource({"app-a": {("orders", 0): Committed(10)}})
    target = FakeTarget(usable=False)
    task = CheckpointTask(FLOW, store, threading.Lock(), source, target)
    assert task.run_once() == [] and target.commits == {"app-a": {("primary.orders", 0): 10}}
    assert task.checkpoints == {} and task.written_at == {}
    target.usable = True  # the topic appears (infra made it): the same checkpoint is written at the next round
    assert task.run_once() == [Checkpoint("app-a", "primary.orders", 0, 10, 10)]


def test_a_group_commit_keeps_partitions_the_target_group_is_already_past():
    result = split_commit("g", {("t", 0): 10, ("t", 1): 10, ("t", 2): 10}, {("t", 0): 12, ("t", 1): 4})
    assert result == GroupCommit("g", committed={("t", 1): 10, ("t", 2): 10}, kept={("t", 0): 12})


def test_heartbeats_are_emitted_with_the_flow_aliases_and_the_newest_seen_only_moves_forward():
    emitted: list[Heartbeat] = []
    seen = iter([None, 5_000, 3_000, 9_000])
    reported: list[float] = []
    task = HeartbeatTask(FLOW, emitted.append, lambda: next(seen), reported.append, clock=lambda: 12.5)
    task.run_once()
    assert emitted == [Heartbeat("primary", "dr", 12_500)] and task.newest_ms is None
    for _ in range(3):
        task.observe()
    assert task.newest_ms == 9_000 and reported == [5.0, 5.0, 9.0]
