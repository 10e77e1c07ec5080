"""The flow's ledger and its quarantines on their own: the state file, holds, catch-up and data-loss detection, with
no Spark and no broker (the copy path and the source's log starts are fakes)."""

from __future__ import annotations

import json

import pytest

from spark_app.config import FlowConfig
from spark_app.errors import MirrorFailed, StateError
from spark_app.ledger import RECENT_EVENTS, STATE_FILE, STATE_VERSION, FlowLedger, LedgerState
from spark_app.quarantine import RECORD_RETRY_S, Hold, Quarantine
from spark_app.ranges import Landing, OffsetRange
from spark_app.storage import checkpoint_files
from tests.support.clock import Clock

TOPIC = "orders"


def flow(**overrides: object) -> FlowConfig:
    return FlowConfig.model_validate(
        {"source": "a", "target": "b", "topics": {"include": [TOPIC]}, "checkpoint_location": "/c"} | overrides
    )


def landing(partition: int, start: int, end: int, held_from: int = -1, refused: int = 0) -> Landing:
    """A range [start, end) that wrote everything, or everything below `held_from`."""
    row = Landing(TOPIC, partition, first_offset=start, end_offset=end)
    written_to = end if held_from < 0 else held_from
    if written_to > start:
        row.last_offset, row.last_target_offset, row.records = written_to - 1, written_to - 1, written_to - start
    if held_from >= 0:
        row.hold(held_from, refused)
    return row


class FakeSource:
    """The copy path and the source's log starts, recording what was asked."""

    def __init__(self) -> None:
        self.copied: list[OffsetRange] = []
        self.refuse_at: dict[int, int] = {}  # partition -> offset the target still refuses
        self.log_start: dict[tuple[str, int], int | None] = {}

    def copy(self, ranges: list[OffsetRange], ready: dict[str, int], lives: dict[str, str]) -> list[Landing]:
        assert set(ready) == {r.topic for r in ranges}
        self.copied += ranges
        return [landing(r.partition, r.start, r.end, self.refuse_at.get(r.partition, -1), 9) for r in ranges]

    def earliest(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The log starts of the partitions whose leader answers (a log start of None: it does not)."""
        return {tp: start for tp in partitions if (start := self.log_start.get(tp, 0)) is not None}


def keeper(tmp_path, fake: FakeSource, clock: Clock | None = None, **flow_overrides: object) -> FlowLedger:
    state = LedgerState.load(checkpoint_files(str(tmp_path)))
    return FlowLedger(flow(**flow_overrides), state, fake.earliest, clock=clock or Clock())


def test_the_state_file_round_trips_holds_and_positions_and_is_replaced_whole(tmp_path):
    state = LedgerState.load(checkpoint_files(f"file:{tmp_path}"))
    assert state.where == str(tmp_path / STATE_FILE) and state.quarantined == {} and state.positions == {}
    state.quarantined[TOPIC] = Quarantine("too big", {0: Hold(5, 11), 3: Hold(7, 8)})
    state.positions = {(TOPIC, 0): 11, (TOPIC, 3): 8, ("other", 1): 42}
    state.adopted = {(TOPIC, 0): 9, ("other", 1): 40}
    state.unresolved = {(TOPIC, 3): [(2, 5), (6, 7)]}
    state.save()
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]  # no temporary file left behind
    again = LedgerState.load(checkpoint_files(str(tmp_path)))
    assert again.quarantined == {TOPIC: Quarantine("too big", {0: Hold(5, 11), 3: Hold(7, 8)})}
    assert again.positions == state.positions and again.adopted == state.adopted
    assert again.unresolved == state.unresolved
    assert json.loads((tmp_path / STATE_FILE).read_text())["version"] == STATE_VERSION


def test_a_state_file_of_another_version_is_refused_naming_the_file_and_what_to_do(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": STATE_VERSION + 1}))
    with pytest.raises(StateError) as refused:
        LedgerState.load(checkpoint_files(str(tmp_path)))
    message = str(refused.value)
    assert str(tmp_path / STATE_FILE) in message and f"this mirror reads version {STATE_VERSION}" in message
    assert "move the file away" in message


def test_a_refused_record_holds_its_partition_and_the_hold_grows_until_a_catch_up_writes_exactly_it(tmp_path):
    fake, clock = FakeSource(), Clock()
    q = keeper(tmp_path, fake, clock)
    q.file([landing(0, 0, 10, held_from=5, refused=1_200_000), landing(1, 0, 10)])
    assert q.held == {TOPIC: {0: 5}}
    assert "partition 0 offset 5 (1200000 bytes)" in q.quarantined[TOPIC]
    assert q.quarantines.ready({TOPIC: 2, "other": 1}) == {"other": 1}
    # The query goes on: the next batch holds the whole topic (not ready), and the hold grows to its end.
    q.file([landing(0, 10, 20, held_from=10), landing(1, 10, 15, held_from=10)])
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(5, 20), 1: Hold(10, 15)}
    q.catch_up({TOPIC: 2}, fake.copy)
    assert fake.copied == [], "a record hold waits RECORD_RETRY_S before it tries again"
    clock.now += RECORD_RETRY_S
    q.catch_up({TOPIC: 2}, fake.copy)
    assert fake.copied == [OffsetRange(TOPIC, 0, 5, 20), OffsetRange(TOPIC, 1, 10, 15)]
    assert q.quarantined == {} and q.quarantines.ready({TOPIC: 2}) == {TOPIC: 2}
    assert LedgerState.load(checkpoint_files(str(tmp_path))).quarantined == {}, "the rejoin is saved"


def test_a_catch_up_refused_again_keeps_the_rest_held_from_the_refused_offset(tmp_path):
    fake, clock = FakeSource(), Clock()
    q = keeper(tmp_path, fake, clock)
    q.file([landing(0, 0, 10, held_from=5, refused=2_000_000)])
    clock.now += RECORD_RETRY_S
    fake.refuse_at = {0: 8}
    q.catch_up({TOPIC: 1}, fake.copy)
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(8, 10)}
    assert "offset 8 (9 bytes)" in q.quarantined[TOPIC]
    assert q.state.quarantined[TOPIC].retry_at == clock.now + RECORD_RETRY_S


def test_a_long_hold_catches_up_in_steps_bounded_like_batches_each_saved_so_a_stop_loses_at_most_one(tmp_path):
    fake, clock = FakeSource(), Clock()
    q = keeper(tmp_path, fake, clock, max_records_per_trigger=1_000)
    q.file([landing(0, 0, 10, held_from=5, refused=1_200_000), landing(1, 0, 10)])
    q.file([landing(0, 10, 5_000, held_from=10), landing(1, 10, 2_010, held_from=10)])  # quarantined a long time
    clock.now += RECORD_RETRY_S
    steps = 0
    while q.quarantined:
        before = len(fake.copied)
        q.catch_up({TOPIC: 2}, fake.copy)
        steps += 1
        step = fake.copied[before:]
        assert sum(r.size for r in step) <= 1_000, f"step {steps} copied {step}"
        saved = LedgerState.load(checkpoint_files(str(tmp_path))).quarantined
        assert saved == q.state.quarantined, "each step is saved: a stop now loses nothing before it"
    assert steps == 7, "4 steps of 500 + 500, then 3 of partition 0 alone: about (4,995 + 2,000) / 1,000"
    for partition, (first, end) in {0: (5, 5_000), 1: (10, 2_010)}.items():
        ranges = sorted((r.start, r.end) for r in fake.copied if r.partition == partition)
        assert ranges[0][0] == first and ranges[-1][1] == end, ranges
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), f"gapless, in order: {ranges}"


def test_a_step_refused_again_waits_and_goes_on_from_the_refused_offset(tmp_path):
    fake, clock = FakeSource(), Clock()
    q = keeper(tmp_path, fake, clock, max_records_per_trigger=100)
    q.file([landing(0, 0, 1_000, held_from=0, refused=9)])
    clock.now += RECORD_RETRY_S
    q.catch_up({TOPIC: 1}, fake.copy)
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(100, 1_000)}
    assert q.state.quarantined[TOPIC].retry_at <= clock.now, "more owed: the next step goes at once"
    fake.refuse_at = {0: 150}
    q.catch_up({TOPIC: 1}, fake.copy)
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(150, 1_000)}
    assert q.state.quarantined[TOPIC].retry_at == clock.now + RECORD_RETRY_S, "refused again: it waits"


def test_a_topic_the_target_cannot_take_is_held_whole_and_waits_until_it_has_the_partitions(tmp_path):
    fake = FakeSource()
    q = keeper(tmp_path, fake)
    q.refused({TOPIC: "event hub 'a.orders' does not exist on 'b'; infra must create it"})
    q.file([landing(0, 0, 7, held_from=0), landing(1, 0, 3, held_from=0)])
    q.catch_up({}, fake.copy)  # still not on the target
    q.catch_up({TOPIC: 1}, fake.copy)  # too few partitions there
    assert fake.copied == []
    q.catch_up({TOPIC: 2}, fake.copy)
    assert fake.copied == [OffsetRange(TOPIC, 0, 0, 7), OffsetRange(TOPIC, 1, 0, 3)]
    assert q.quarantined == {}


def test_records_deleted_at_the_source_before_they_were_read_are_reported_once_with_their_range(tmp_path):
    fake = FakeSource()
    q = keeper(tmp_path, fake)
    q.file([landing(0, 0, 10)])
    fake.log_start[(TOPIC, 0)] = 15
    q.file([landing(0, 15, 20)])  # 10..14 were never read: retention took them
    q.file([landing(0, 22, 30)])  # 20, 21 were never records (compaction, markers): the log starts lower
    assert [(x.topic, x.partition, x.first_offset, x.last_offset, x.count) for x in q.data_loss] == [
        (TOPIC, 0, 10, 14, 5)
    ]


def test_a_catch_up_that_meets_retention_midway_reports_only_what_it_never_read_and_keeps_its_first_hold(tmp_path):
    """A catch-up step's copy comes back in two rows for one partition: what it copied, then (retention moved the log
    start meanwhile) a row from the log start. Only the offsets between them are lost; a hold in the first row
    stands though the second row held nothing."""
    fake = FakeSource()
    q = keeper(tmp_path, fake)
    q.refused({TOPIC: "event hub 'a.orders' does not exist on 'b'; infra must create it"})
    q.file([landing(0, 0, 20, held_from=0)])
    fake.log_start[(TOPIC, 0)] = 12
    q.catch_up({TOPIC: 1}, lambda ranges, ready, lives: [landing(0, 0, 8), landing(0, 12, 20)])
    assert [(x.first_offset, x.last_offset) for x in q.data_loss] == [(8, 11)], "0..7 were copied"
    assert q.quarantined == {}

    q.refused({TOPIC: "event hub 'a.orders' does not exist on 'b'; infra must create it"})
    q.file([landing(0, 20, 40, held_from=20)])
    fake.log_start[(TOPIC, 0)] = 30
    q.catch_up(
        {TOPIC: 1}, lambda ranges, ready, lives: [landing(0, 20, 25, held_from=24, refused=9), landing(0, 30, 40)]
    )
    assert q.held == {TOPIC: {0: 24}}, "held from the record the target refused, not past it"


def test_a_flow_that_loses_records_for_months_keeps_the_newest_events_and_counts_them_all(tmp_path):
    """2,000 batches each finding 3 records deleted before they were read, and a reset every 10th: the ledger keeps
    the newest RECENT_EVENTS of each, and its total counts every lost record."""
    fake = FakeSource()
    q = keeper(tmp_path, fake)
    q.file([landing(0, 0, 10)])
    at, newest = 10, -1
    for batch in range(2_000):
        fake.log_start[(TOPIC, 0)] = at + 3
        row = landing(0, at + 3, at + 10)
        if batch % 10 == 9:
            row.reset_from = at + 3  # the row says it went back to where it starts: no gap is counted before it
        else:
            newest = at
        q.file([row])
        at += 10
    assert len(q.data_loss) == RECENT_EVENTS and q.data_loss[-1].first_offset == newest
    assert len(q.resets) == RECENT_EVENTS
    assert q.lost_records == 3 * (2_000 - 200)


def test_fail_on_data_loss_stops_the_flow_naming_the_lost_range(tmp_path):
    fake = FakeSource()
    q = keeper(tmp_path, fake, fail_on_data_loss=True)
    q.file([landing(0, 0, 10)])
    fake.log_start[(TOPIC, 0)] = 12
    with pytest.raises(
        MirrorFailed, match="records deleted before they were mirrored.*first_offset=10, last_offset=11"
    ):
        q.file([landing(0, 12, 20)])


def test_a_gap_whose_log_start_does_not_answer_never_fails_the_filing_and_is_reported_once_it_answers(tmp_path):
    """Seen under faults: real time with exactly once files a gap at every commit marker, and the source broker
    leading the partition stopped between the read and the filing; the lookup's error stopped the whole mirror."""
    fake = FakeSource()
    q = keeper(tmp_path, fake)
    q.file([landing(0, 0, 10), landing(1, 0, 10)])
    fake.log_start[(TOPIC, 0)] = None  # its leader offline
    fake.log_start[(TOPIC, 1)] = 14
    q.file([landing(0, 15, 20), landing(1, 16, 20)])  # 10..14 deleted on partition 0, 10..13 on partition 1
    assert [(x.partition, x.first_offset, x.last_offset) for x in q.data_loss] == [(1, 10, 13)]
    q.file([landing(0, 20, 30)])  # still no answer: still no report, and no failure
    assert q.lost_records == 4
    fake.log_start[(TOPIC, 0)] = 15
    q.file([landing(0, 30, 40)])
    assert [(x.partition, x.first_offset, x.last_offset) for x in q.data_loss] == [(1, 10, 13), (0, 10, 14)]
    assert q.lost_records == 9
    q.file([landing(0, 40, 50)])
    assert q.lost_records == 9, "reported once"


def test_a_gap_whose_log_start_does_not_answer_is_saved_and_reported_after_a_restart(tmp_path):
    """Seen under faults: the positions were saved past the gap, and the mirror restarted before its partition's log
    start answered; the gap was only in memory, and its records went unreported."""
    fake = FakeSource()
    keeper(tmp_path, fake).file([landing(0, 0, 10)])
    fake.log_start[(TOPIC, 0)] = None
    keeper(tmp_path, fake).file([landing(0, 15, 20)])
    fake.log_start[(TOPIC, 0)] = 15
    after_restart = keeper(tmp_path, fake)
    after_restart.file([])
    assert [(x.first_offset, x.last_offset) for x in after_restart.data_loss] == [(10, 14)]
    assert after_restart.state.unresolved == {}


def test_state_stays_one_entry_per_partition_over_thousands_of_batches_with_holds_coming_and_going(tmp_path):
    """What runs for days: 5,000 batches over 8 partitions, a record refused every 500 batches and caught up later.
    The state file holds positions and holds per partition, never per batch."""
    fake, clock = FakeSource(), Clock()
    q = keeper(tmp_path, fake, clock)
    sizes = []
    for batch in range(5000):
        start, end = batch * 10, batch * 10 + 10
        refused = batch % 500 == 7
        rows = [
            landing(
                p, start, end, held_from=start + 3 if refused and p == 2 else (start if TOPIC in q.quarantined else -1)
            )
            for p in range(8)
        ]
        q.file(rows)
        if batch % 500 == 100:
            clock.now += RECORD_RETRY_S
            q.catch_up({TOPIC: 8}, fake.copy)
        sizes.append(len((tmp_path / STATE_FILE).read_text()))
    assert q.quarantined == {} and len(q.state.positions) == 8
    assert max(sizes) < 2_000, max(sizes)
    assert all(r.end - r.start <= 940 for r in fake.copied)  # each catch-up owed only what piled up since the hold
    assert len(fake.copied) == 8 * 10  # ten holds, all eight partitions held by the topic's quarantine


def test_a_topic_made_again_gives_up_the_holds_of_its_old_life_and_a_catch_up_copies_only_its_new_ones(tmp_path):
    """A hold names the topic's life. Filed in a new life, or found gone backwards, the old life's holds are given up
    (their records went with the old topic), never copied from the old offsets in the new log; a catch-up asks the
    topic's id first, and waits while it does not answer."""
    fake, ids, clock = FakeSource(), {TOPIC: "life-a"}, Clock()
    q = FlowLedger(flow(), LedgerState.load(checkpoint_files(str(tmp_path))), fake.earliest, clock=clock,
                   topic_ids=lambda topics: {t: i for t, i in ids.items() if t in topics})  # fmt: skip
    q.state.topic_ids[TOPIC] = "life-a"
    q.file([landing(0, 0, 900, held_from=300), landing(1, 0, 900, held_from=500)])
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(300, 900, "life-a"), 1: Hold(500, 900, "life-a")}
    q.note_topic_ids({TOPIC: "life-b"})  # made again: partition 0 starts over in a batch, held whole
    again = Landing(TOPIC, 0, 0, 200, reset_from=900)
    again.hold(0)
    q.file([again])
    assert q.state.quarantined[TOPIC].partitions == {0: Hold(0, 200, "life-b")}, "partition 1's hold went with life a"
    again = LedgerState.load(checkpoint_files(str(tmp_path)))
    assert again.quarantined[TOPIC].partitions == {0: Hold(0, 200, "life-b")}, "a restart knows the hold's life"

    clock.now += RECORD_RETRY_S
    ids.clear()  # the id does not answer: the catch-up waits
    q.catch_up({TOPIC: 2}, fake.copy)
    assert fake.copied == [] and TOPIC in q.quarantined
    ids[TOPIC] = "life-c"  # made again once more before the catch-up came
    q.catch_up({TOPIC: 2}, fake.copy)
    assert fake.copied == [] and TOPIC not in q.quarantined, "nothing of life c copied at life b's offsets"

    q.state.topic_ids[TOPIC] = "life-c"
    q.file([landing(1, 0, 50, held_from=10)])
    q.file([Landing(TOPIC, 1, 0, 0, reset_from=50)])  # truncated, or made again and found so: the hold is given up
    assert q.state.quarantined[TOPIC].partitions == {}
