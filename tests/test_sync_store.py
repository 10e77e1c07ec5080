"""The offset-sync store over time, without brokers: exact translation from runs, replays, bounded memory for
100,000 batches with groups parked far behind, and a restart rebuilt from what the compacted topic would hold."""

from __future__ import annotations

import random
from collections import OrderedDict

from spark_app.dr.syncs import Run, SlottedRun, SyncStore, Translation, run_bound
from spark_app.ranges import MAX_RUNS_PER_RANGE, Landing

BATCH = 100


def test_translation_resumes_right_after_the_last_record_read_and_never_skips():
    store = SyncStore()
    store.record("orders", 0, Run(0, 40, 99))  # source 0..99 landed at target 40..139
    store.record("orders", 0, Run(105, 140, 199))  # 100..104 were transaction markers: no records
    assert store.translate("orders", 0, 100) == Translation(140, 0)  # read through 99: the next record is at 140
    assert store.translate("orders", 0, 150) == Translation(185, 0)  # inside a run: exact
    assert store.translate("orders", 0, 103) == Translation(140, 3)  # in the gap: resumes after the run, safely
    assert store.translate("orders", 0, 200) == Translation(235, 0)  # consumed everything mirrored
    assert store.translate("orders", 0, 10_000) == Translation(235, 9_800)  # ahead of the mirror: its next write
    assert store.translate("orders", 0, 0) is None  # below every run: the caller falls back
    assert store.translate("orders", 0, 0, Translation(7, 3)) == Translation(7, 3)
    assert store.translate("orders", 1, 50) is None


def test_runs_that_continue_each_other_merge_and_a_replayed_batch_moves_translation_to_the_newer_copy():
    store = SyncStore()
    store.record("t", 0, Run(0, 0, 9))
    store.record("t", 0, Run(10, 10, 19))  # the next batch, right after: one run
    assert store.runs("t", 0) == [Run(0, 0, 19)]
    store.record("t", 0, Run(15, 20, 24))  # 15..19 written again after a retry, at 20..24
    assert store.runs("t", 0) == [Run(0, 0, 14), Run(15, 20, 24)]
    assert store.translate("t", 0, 16) == Translation(21, 0)  # reading goes on from the newer copy
    assert store.translate("t", 0, 12) == Translation(12, 0)


def test_a_landing_reports_its_runs_breaking_at_gaps_and_foreign_records_and_keeps_the_newest_when_full():
    landing = Landing("t", 0, 0, 1000)
    for offset, target in ((0, 50), (1, 51), (2, 52), (4, 53), (5, 55), (6, 56)):  # a gap at 3, a foreign record at 54
        landing.landed(offset, target)
    assert landing.runs == [[0, 50, 2], [4, 53, 4], [5, 55, 6]]
    assert (landing.last_offset, landing.last_target_offset) == (6, 56)
    crowded = Landing("t", 0, 0, 1000)
    for i in range(3 * MAX_RUNS_PER_RANGE):
        crowded.landed(2 * i, i)  # every other source offset: each record its own run
    assert len(crowded.runs) == MAX_RUNS_PER_RANGE
    assert crowded.runs[-1] == [
        2 * (3 * MAX_RUNS_PER_RANGE - 1),
        3 * MAX_RUNS_PER_RANGE - 1,
        2 * (3 * MAX_RUNS_PER_RANGE - 1),
    ]
    store = SyncStore()
    for start, target, last in crowded.runs:
        store.record("t", 0, Run(start, target, last))
    dropped = 2 * (MAX_RUNS_PER_RANGE + 5)  # a run the landing could not keep: safe, with a bounded re-read
    translation = store.translate("t", 0, dropped + 1)
    assert translation is not None and translation.downstream_offset <= MAX_RUNS_PER_RANGE + 5


class CompactedTopic:
    """What the offset-syncs topic holds after compaction: the newest record per key, in the order written."""

    def __init__(self) -> None:
        self.records: OrderedDict[tuple[str, int, int, int], SlottedRun] = OrderedDict()
        self.written = 0

    def write(self, synced: list[SlottedRun]) -> None:
        for s in synced:
            key = (s.topic, s.partition, s.slot, s.kind)
            self.records.pop(key, None)
            self.records[key] = s
        self.written += len(synced)


def run_batches(store: SyncStore, topic: CompactedTopic, batches: int, gap_every: int, groups: dict[str, int]) -> None:
    """`batches` batches of BATCH records into one partition; every `gap_every`-th batch ends in a transaction
    marker (a gap, so a new run); each group keeps up with the mirror, then stops where it ends up `lag` batches
    behind the last batch; a checkpoint round every 20 batches."""
    source = target = 0
    for b in range(batches):
        store.record("t", 0, Run(source, target, source + BATCH - 1))
        source, target = source + BATCH, target + BATCH
        if gap_every and b % gap_every == 0:
            source += 1  # the marker takes an offset on the source and none on the target
        if b % 20 == 19 or b == batches - 1:
            store.keep_for({("t", 0): committed_offsets(store, groups, b + 1, batches)})
            topic.write(list(store.take_changed()))


def committed_offsets(store: SyncStore, groups: dict[str, int], done: int, batches: int) -> set[int]:
    """Each group's committed offset after `done` batches: the start of the newest batch, until it has reached the
    batch `lag` before the last one, where it stays."""
    return {store.runs("t", 0)[-1].last + 2 if done <= batches - lag else (batches - lag) * (BATCH + 1)
            for lag in groups.values()}  # fmt: skip


def test_100000_batches_keep_every_lagging_group_exact_in_bounded_memory_and_a_restart_from_the_compacted_topic_too():
    lags = {"near": 1, "usual": 240, "far": 10_000, "farthest": 90_000}
    store, topic = SyncStore(), CompactedTopic()
    run_batches(store, topic, 100_000, gap_every=1, groups=lags)  # every batch its own run: the hardest case
    runs = store.runs("t", 0)
    bound = run_bound(len(lags))  # the dense tail or the trail above the slowest group, exponential points, held
    assert len(runs) <= bound, len(runs)
    needed = committed_offsets(store, lags, 100_000, 100_000)
    for committed in needed:
        translation = store.translate("t", 0, committed)
        assert translation is not None and translation.reread <= BATCH, (committed, translation)
        assert translation.reread <= 1  # exact but for the marker just before, which held no record
    assert len(topic.records) <= bound + 1  # about one record per live run after compaction
    print(
        f"100,000 batches: {len(runs)} runs kept, {topic.written} syncs written, {len(topic.records)} after compaction"
    )

    restarted = SyncStore()
    restarted.load(topic.records.values())
    restarted.keep_for({("t", 0): needed})
    assert len(restarted.runs("t", 0)) <= bound
    for committed in needed:
        assert restarted.translate("t", 0, committed) == store.translate("t", 0, committed)


def test_a_partition_without_gaps_is_one_run_for_its_whole_history_so_every_offset_translates_exactly():
    store, topic = SyncStore(), CompactedTopic()
    run_batches(store, topic, 100_000, gap_every=0, groups={"far": 90_000})  # parked, the others consume at pace
    assert store.runs("t", 0) == [Run(0, 0, 100_000 * BATCH - 1)]
    for committed in (1, 12_345, 5_000_000, 9_999_999):
        assert store.translate("t", 0, committed) == Translation(committed, 0)
    assert len(topic.records) == 1 and topic.written == 5_000  # one sync per checkpoint round, not per batch


def test_a_restart_replays_slots_in_write_order_so_a_run_written_again_replaces_the_old_one():
    store, topic = SyncStore(), CompactedTopic()
    store.record("t", 0, Run(0, 0, 9))
    store.record("t", 0, Run(11, 10, 19))
    topic.write(list(store.take_changed()))
    store.record("t", 0, Run(5, 30, 12))  # a replay from 5: run (11..19) goes, (0..9) is cut to 0..4
    topic.write(list(store.take_changed()))
    uncompacted = SyncStore()  # the active segment is not compacted yet: every record is read back, in order
    uncompacted.load([SlottedRun("t", 0, 0, Run(0, 0, 9)), SlottedRun("t", 0, 1, Run(11, 10, 19)),
                      *topic.records.values()])  # fmt: skip
    compacted = SyncStore()
    compacted.load(topic.records.values())
    for rebuilt in (uncompacted, compacted):
        assert rebuilt.runs("t", 0) == store.runs("t", 0) == [Run(0, 0, 4), Run(5, 30, 12)]


def test_history_waiting_for_the_groups_it_must_keep_stays_bounded_when_the_groups_never_come():
    """After a restart nothing is evicted until the checkpoint task says what groups need; a source that never lets
    it list them must not make the store grow with every batch. Translation stays safe meanwhile."""
    store = SyncStore()
    for b in range(20_000):  # a marker after every batch: one run each
        store.record("t", 0, Run(b * 11, b * 10, b * 11 + 9))
    held = len(store.runs("t", 0))
    assert held <= 2 * run_bound(0), held
    got = store.translate("t", 0, 5)
    assert got is not None and got.downstream_offset <= 5, "a group below what was kept never skips"


def test_a_group_that_jumps_past_what_was_kept_for_it_resumes_safely_rereading_at_most_the_jump():
    store = SyncStore(max_runs=8, max_trail=8)
    store.record("t", 0, Run(0, 0, 99))
    store.keep_for({("t", 0): {101 * 10}})  # a group that will be parked at batch 10 for a while
    for b in range(1, 1000):  # every batch its own run (a marker after each)
        store.record("t", 0, Run(b * 101, b * 100, b * 101 + 99))
    parked = store.translate("t", 0, 101 * 10)
    assert parked == Translation(1000, 1)  # exact; the 1 is the marker offset before it, which held no record
    jumped = 101 * 500 + 30  # then it consumed into history no longer kept
    translation = store.translate("t", 0, jumped)
    assert translation is not None
    assert translation.downstream_offset <= 100 * 500 + 30  # never past a record it has not read
    below = [r for r in store.runs("t", 0) if r.start <= jumped - 1][-1]  # the newest run kept below it
    assert translation == Translation(below.target_end, jumped - 1 - below.last)  # the re-read says how far back
    assert translation.reread <= jumped - 1 - (101 * 9 + 99)  # and an exponential point is nearer than the parked run


class ActiveActive:
    """One partition of an identity active/active pair, A <-> B, as the A -> B flow's store sees it.

    A's log holds A's own records and the echoes of B's (each with the B offset it came from); B's log holds A's
    records copied there and B's own. Each step appends local records on either side or runs a flow for one small
    batch; the A -> B flow reports its runs and echoes to the store, unless the batch "crashes" after writing (its
    copy stays on B unreported, and the next batch copies the same records again).
    """

    def __init__(self, rng: random.Random, store: SyncStore) -> None:
        self.rng, self.store = rng, store
        self.a: list[tuple[str, int]] = []  # ("A", n) own, or ("B", b): the echo of B's record at offset b
        self.b: list[tuple[str, int]] = []  # ("A", a): A's record at offset a, or ("B", n) own
        self.a_to_b = self.b_to_a = 0  # each flow's next source offset

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.3:
            self.a += [("A", len(self.a))] * self.rng.randint(1, 4)
        elif roll < 0.55:
            self.b += [("B", len(self.b))] * self.rng.randint(1, 3)
        elif roll < 0.75:
            end = min(len(self.b), self.b_to_a + self.rng.randint(1, 12))
            self.a += [("B", i) for i in range(self.b_to_a, end) if self.b[i][0] == "B"]  # A's records stay
            self.b_to_a = end
        else:
            self.copy_a_to_b(crash=self.rng.random() < 0.05)

    def copy_a_to_b(self, crash: bool) -> None:
        landing = Landing("t", 0, self.a_to_b, self.a_to_b)
        end = min(len(self.a), self.a_to_b + self.rng.randint(1, 12))
        for offset in range(self.a_to_b, end):
            origin, at = self.a[offset]
            if origin == "B":
                landing.echoed(offset, at)
            else:
                landing.landed(offset, len(self.b))
                self.b.append(("A", offset))
        if crash:
            return  # written, never reported: the next batch copies the same records again
        for start, target, last in landing.runs:
            self.store.record("t", 0, Run(start, target, last))
        for start, target, last in landing.echoes:
            self.store.echo("t", 0, Run(start, target, last))
        self.a_to_b = end

    def check(self, committed: int) -> int:
        """Translate a group that read A's offsets below `committed`: no record of B it has not read lies below the
        resume point, and what it reads again is within the reported bound. Returns the re-read."""
        read_b = {b for origin, b in self.a[:committed] if origin == "B"}
        translation = self.store.translate("t", 0, committed)
        assert translation is not None
        resume = translation.downstream_offset
        unread = [x for x, (origin, n) in enumerate(self.b) if (n not in read_b if origin == "B" else n >= committed)]
        assert not unread or unread[0] >= resume, (committed, resume, unread[:3])
        reread = len(self.b) - resume - len([x for x in unread if x >= resume])
        assert reread <= translation.reread, (committed, translation, reread)
        return reread


def test_identity_active_active_never_skips_a_local_record_the_group_has_not_read_over_thousands_of_steps():
    """Local writes on both sides, echoes, lagging groups, crashed batches and a restart from the compacted topic:
    every translation resumes at or before the first record of B the group has not read."""
    rng = random.Random(7)
    store, topic = SyncStore(max_runs=16, local_writes=True), CompactedTopic()
    pair = ActiveActive(rng, store)
    guarded = rereads = 0
    for step in range(20_000):
        pair.step()
        if step % 50 == 49 and pair.a_to_b:
            committed = [rng.randint(max(1, pair.a_to_b - 40), pair.a_to_b) for _ in range(3)]
            store.keep_for({("t", 0): committed})
            topic.write(list(store.take_changed()))
            for c in committed:
                rereads = max(rereads, pair.check(c))
                guarded += bool(store.translate("t", 0, c).guarded)  # type: ignore[union-attr]
        if step == 10_000:  # the mirror restarts: its store comes back from the compacted topic
            restored = SyncStore(max_runs=16, local_writes=True)
            restored.load(topic.records.values())
            store = pair.store = restored
    assert guarded > 0  # local records the group had not read moved some resume points back
    print(f"identity active/active: {len(pair.b)} records on B, {guarded} guarded translations, max re-read {rereads}")


def test_without_the_guard_a_group_would_skip_a_local_record_it_never_read():
    """The case the guard exists for: B's record lands below A's next one, and A's group has not read its echo."""
    for guard in (False, True):
        store = SyncStore(local_writes=guard)
        store.record("t", 0, Run(0, 0, 9))  # A's 0..9 at B's 0..9
        store.record("t", 0, Run(10, 11, 19))  # B wrote its own record at 10; A's 10..19 land at 11..20
        translation = store.translate("t", 0, 20)  # the group read A's 0..19, and not yet the echo of B's 10
        assert translation is not None
        assert translation.downstream_offset == (10 if guard else 21)
        assert translation.guarded is guard
        store.echo("t", 0, Run(20, 10, 20))  # the echo of B's 10 arrived on A at 20 ...
        assert store.translate("t", 0, 21) == Translation(21, 1)  # ... and once the group read it, nothing is held


def test_a_topic_gone_for_good_leaves_no_history_in_the_store_nor_on_the_topic_once_compacted():
    """Topics come and go for years: the history of one the flow's ledger forgot goes from memory, and every slot
    it held gets a tombstone, so a restart does not read it back."""
    store, topic = SyncStore(local_writes=True), CompactedTopic()
    for p in (0, 1):
        store.record("gone", p, Run(0, 0, 9))
        store.record("gone", p, Run(20, 15, 29))  # a gap: two runs, two slots
        store.record("kept", p, Run(0, 0, 9))
    store.echo("gone", 0, Run(10, 12, 12))
    topic.write(list(store.take_changed()))
    store.forget(["gone"])
    tombstones = list(store.take_changed())
    assert sorted((s.partition, s.slot, s.kind) for s in tombstones) == sorted(
        (s.partition, s.slot, s.kind) for s in topic.records.values() if s.topic == "gone"
    ), "one tombstone per slot the topic held, of each kind"
    assert all(s.topic == "gone" and s.run is None for s in tombstones)
    topic.write(tombstones)
    assert store.partitions() == [("kept", 0), ("kept", 1)] and store.runs("gone", 0) == []
    assert store.translate("gone", 0, 5) is None
    assert list(store.take_changed()) == [], "nothing of it is left to write"
    rebuilt = SyncStore(local_writes=True)
    rebuilt.load(topic.records.values())
    assert rebuilt.partitions() == [("kept", 0), ("kept", 1)]
