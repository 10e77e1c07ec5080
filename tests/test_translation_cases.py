"""The promise after a failover, case by case, without brokers: a group resumes on the target without skipping a
record it has not read and re-reads at most one batch, on a partition with a transaction marker after every batch."""

from __future__ import annotations

from spark_app.dr.syncs import Run, SlottedRun, SyncStore

BATCH = 100
ROUND = 20  # batches per checkpoint round


def reread_of_a_group_behind(lag: int, batches: int = 6_000) -> int:
    """Batches of BATCH records, each followed by a marker; a group that keeps consuming `lag` batches behind the
    mirror, committing at a different offset inside a batch each round. Returns the most it would re-read."""
    store, worst = SyncStore(), 0
    for b in range(batches):
        store.record("t", 0, Run(b * (BATCH + 1), b * BATCH, b * (BATCH + 1) + BATCH - 1))
        if b % ROUND == ROUND - 1 and b >= lag:
            behind = b - lag
            committed = behind * (BATCH + 1) + (b // ROUND) % BATCH  # somewhere inside the batch `lag` behind
            store.keep_for({("t", 0): {committed}})
            got = store.translate("t", 0, committed)
            assert got is not None
            assert got.downstream_offset <= behind * BATCH + (b // ROUND) % BATCH  # never past an unread record
            worst = max(worst, got.reread)
    return worst


def test_a_group_consuming_300_batches_behind_rereads_at_most_one_batch():
    assert reread_of_a_group_behind(300) <= BATCH


def test_a_group_consuming_1000_batches_behind_rereads_at_most_one_batch():
    assert reread_of_a_group_behind(1_000) <= BATCH


def test_a_group_parked_240_batches_behind_translates_after_the_mirror_restarts_as_it_does():
    store, topic = SyncStore(), {}
    parked = 100 * (BATCH + 1) + 37  # inside batch 100
    for b in range(340):
        store.record("t", 0, Run(b * (BATCH + 1), b * BATCH, b * (BATCH + 1) + BATCH - 1))
        if b % ROUND == ROUND - 1:
            store.keep_for({("t", 0): {parked}})
            topic.update({(s.slot, s.kind): s for s in store.take_changed()})
    stored = SyncStore()  # prepare: the compacted topic read back ...
    stored.load(list(topic.values()))
    restarted = SyncStore()  # ... under the batches the new run landed meanwhile
    for b in range(340, 400):  # a minute of batches while the topic is read
        restarted.record("t", 0, Run(b * (BATCH + 1), b * BATCH, b * (BATCH + 1) + BATCH - 1))
    restarted.rebase(stored)
    for _ in range(2):  # before and after the first checkpoint round tells it what groups need
        got = restarted.translate("t", 0, parked)
        assert got is not None and got.downstream_offset == 100 * BATCH + 37 and got.reread <= BATCH
        restarted.keep_for({("t", 0): {parked}})


def test_identity_active_active_on_a_target_that_held_1000_records_never_skips_them():
    store = SyncStore(local_writes=True)
    store.record("t", 0, Run(0, 1_000, 2_999))  # the source's 0..2999 land after the target's own 0..999
    got = store.translate("t", 0, 3_000)  # the group read the source's 3,000 records and none of the target's
    assert got is not None and got.downstream_offset == 0 and got.guarded
    stored = SyncStore(local_writes=True)  # across a restart too
    stored.load([SlottedRun(s.topic, s.partition, s.slot, s.run, s.kind) for s in store.take_changed()])
    restarted = SyncStore(local_writes=True)
    restarted.rebase(stored)
    again = restarted.translate("t", 0, 3_000)
    assert again is not None and again.downstream_offset == 0
