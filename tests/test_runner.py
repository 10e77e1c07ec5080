"""A flow's runner while topics come and go at the source, with topic sync faked and no Spark or broker: its ledger
state, totals, lag positions and metric series stay bounded by the topics there now, and a topic missing for a short
while keeps its positions."""

from __future__ import annotations

import json
import logging
import random

from spark_app.config import TOPIC_GONE_GRACE_S, parse_config
from spark_app.ledger import STATE_FILE, FlowLedger
from spark_app.metrics import MirrorMetrics
from spark_app.ranges import Landing
from spark_app.runner import FlowRunner
from spark_app.topics import TopicPlan
from tests.support.clock import Clock

PARTITIONS = 2
SYNC_S = TOPIC_GONE_GRACE_S / 60  # rounds this far apart: a topic gone is forgotten 60 rounds later
SERIES = ("mirrorkit_records_mirrored", "mirrorkit_bytes_mirrored")


class FakeTopicSync:
    """The source's topics now (`present`), every one of them mirrored but those the target refuses."""

    def __init__(self) -> None:
        self.present: set[str] = set()
        self.refused: dict[str, str] = {}

    def sync(self) -> TopicPlan:
        wanted = dict.fromkeys(sorted(self.present), PARTITIONS)
        mirrored = {t: n for t, n in wanted.items() if t not in self.refused}
        return TopicPlan(mirrored, {t: r for t, r in self.refused.items() if t in wanted}, wanted)

    def earliest_offsets(self, partitions):
        return dict.fromkeys(partitions, 0)

    def topic_ids(self, topics):
        return {}


class MemoryFiles:
    """The checkpoint folder in memory, for thousands of saves without a disk's fsync each."""

    location = "memory"
    local = True

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def where(self, name: str) -> str:
        return name

    def read(self, name: str) -> bytes | None:
        return self.files.get(name)

    def write(self, name: str, data: bytes) -> None:
        self.files[name] = data


class IdleRunner(FlowRunner):
    """A runner with no copy: the test files its landings and says where the copy stands (`reached`)."""

    reached: dict[tuple[str, int], int] = {}

    def start(self, subscription, available_now):
        self.subscription = subscription

    def stop(self, timeout_s=0.0):
        pass

    def running(self):
        return False

    def wait(self):
        pass

    def failure(self):
        return None

    def catch_up(self):
        pass

    def _positions(self):
        return dict(self.reached)


def runner(tmp_path, clock: Clock) -> tuple[IdleRunner, FakeTopicSync]:
    clusters = [{"alias": a, "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"} for a in ("src", "dst")]
    flow = {"source": "src", "target": "dst", "topics": {"include": [".*"]}, "checkpoint_location": str(tmp_path)}
    config = parse_config({"clusters": clusters, "flows": [flow]})
    sync, metrics = FakeTopicSync(), MirrorMetrics()
    run = IdleRunner(None, config, config.flows[0], metrics, topic_sync=sync)  # type: ignore[arg-type]
    run.ledger = FlowLedger(run.flow, run.ledger.state, sync.earliest_offsets, metrics, clock=clock)
    return run, sync


def copy(run: IdleRunner, topics: set[str], records: int = 10) -> None:
    """What the copy does between rounds: each partition of `topics` copies `records` from where the ledger stands,
    and the copy reports where it got to."""
    positions = run.ledger.state.positions
    rows = []
    for topic in sorted(topics):
        for p in range(PARTITIONS):
            start = positions.get((topic, p), 0)
            rows.append(landing(topic, p, start, start + records))
    run.ledger.file(rows)
    run.reached = {(r.topic, r.partition): r.end_offset for r in rows}
    run.next_offsets()  # the lag poller's call


def landing(topic: str, partition: int, start: int, end: int, held_from: int = -1) -> Landing:
    """A range [start, end) that wrote everything, or everything below `held_from`."""
    row = Landing(topic, partition, first_offset=start, end_offset=end)
    written_to = end if held_from < 0 else held_from
    if written_to > start:
        row.last_offset, row.last_target_offset = written_to - 1, written_to - 1
        row.records, row.bytes = written_to - start, 10 * (written_to - start)
    if held_from >= 0:
        row.hold(held_from)
    return row


def series_topics(metrics: MirrorMetrics) -> set[str]:
    return {
        s.labels["topic"]
        for m in metrics.registry.collect()
        if m.name in SERIES
        for s in m.samples
        if "topic" in s.labels
    }


def test_a_topic_missing_for_a_while_keeps_its_positions_and_one_gone_past_the_grace_is_forgotten(tmp_path, caplog):
    clock = Clock()
    run, sync = runner(tmp_path, clock)
    forgotten: list[list[str]] = []  # what the DR service is told to drop the history of
    run._on_forgotten = forgotten.append
    sync.present = {"orders", "held"}
    sync.refused = {"held": "no such hub on the target"}  # quarantined whole: all its records are owed
    run.sync_topics()
    copy(run, {"orders"})
    run.ledger.file([landing("held", 0, 0, 5, held_from=0)])
    assert run.ledger.held == {"held": {0: 0}}
    before = dict(run.ledger.state.positions)

    sync.present = {"held"}  # one round without 'orders': its metadata had an error, or it was not authorized
    clock.now += SYNC_S
    assert run.sync_topics() == (("held", PARTITIONS),)
    assert run.ledger.state.positions == before, "a topic missing for one round keeps its positions"
    assert "orders" not in series_topics(run.metrics), "its series go at once"
    assert run.next_offsets().keys() <= {("held", 0), ("held", 1)}

    sync.present = {"orders", "held"}  # back: it resumes where it stood
    clock.now += SYNC_S
    run.sync_topics()
    copy(run, {"orders"})
    assert [run.ledger.state.positions[("orders", p)] for p in range(PARTITIONS)] == [20, 20]
    assert run.ledger.data_loss == [] and run.totals.records["orders"] == 40

    sync.present = {"held"}  # deleted at the source ('held' too, below, and for longer)
    clock.now += SYNC_S
    run.sync_topics()
    missed_at = clock.now
    while clock.now + SYNC_S - missed_at < TOPIC_GONE_GRACE_S:
        clock.now += SYNC_S
        run.sync_topics()
        assert ("orders", 0) in run.ledger.state.positions, "kept throughout the grace"
    clock.now += SYNC_S
    sync.present = set()
    run.sync_topics()
    assert {t for t, _ in run.ledger.state.positions} == {"held"}
    assert "orders" not in run.totals.records and run.totals.records_total == 40
    assert forgotten == [["orders"]], "its offset-sync history goes too"
    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert set(saved["positions"]) == {"held"}, "the saved state forgets it too"

    clock.now += TOPIC_GONE_GRACE_S / 2  # a quarantined topic missing for less than the grace still owes its records
    run.sync_topics()
    assert run.ledger.held == {"held": {0: 0}} and ("held", 0) in run.ledger.state.positions
    assert set(json.loads((tmp_path / STATE_FILE).read_text())["quarantined"]) == {"held"}
    clock.now += TOPIC_GONE_GRACE_S  # gone for good: it gives up its holds, saying so, and its alert clears
    with caplog.at_level(logging.ERROR):
        run.sync_topics()
    assert run.ledger.held == {} and run.ledger.quarantined == {} and not run.ledger.state.positions
    assert json.loads((tmp_path / STATE_FILE).read_text())["quarantined"] == {}
    assert "quarantined topic 'held' (no such hub on the target) has been missing" in caplog.text
    assert "{0: 0}" in caplog.text, "the log says from where its records are given up"
    assert forgotten == [["orders"], ["held"]]


def test_state_totals_and_series_stay_bounded_by_the_topics_there_now_over_thousands_of_rounds(tmp_path):
    """What runs for days: 2,000 topic-sync rounds, 60 to the grace, while 60 topic names come and go: most absences
    are a round or a few (a metadata error), some last hours (deleted, made again later). After every round the
    ledger holds exactly the topics there now or missing for less than the grace; the totals, lag positions and
    metric series hold no more."""
    rng, clock = random.Random(11), Clock()
    run, sync = runner(tmp_path, clock)
    files = run.ledger.state.files = MemoryFiles()
    names = [f"t{i}" for i in range(60)]
    back_at: dict[str, float] = {}  # topic away now -> when it comes back
    missing_since: dict[str, float] = {}  # the model: topic with positions, missing -> first round it was missed
    known: set[str] = set()
    filed = forgotten = 0
    for round_ in range(2000):
        clock.now += SYNC_S
        for topic in [t for t, at in back_at.items() if at <= clock.now]:
            del back_at[topic]
        for topic in rng.sample(sorted(sync.present), min(2, len(sync.present))):
            if rng.random() < 0.3:
                away = SYNC_S * rng.choice([1, 2, 5]) if rng.random() < 0.7 else rng.uniform(1, 4) * TOPIC_GONE_GRACE_S
                back_at[topic] = clock.now + away
        sync.present = set([t for t in names if t not in back_at][:20])  # a new name comes when one goes away
        run.sync_topics()
        for topic in known - sync.present:
            missing_since.setdefault(topic, clock.now)
        for topic in sync.present:
            missing_since.pop(topic, None)
        for topic, since in list(missing_since.items()):
            if clock.now - since >= TOPIC_GONE_GRACE_S:
                known.discard(topic)
                del missing_since[topic]
                forgotten += 1

        assert run.ledger.state.topics() == known, "forgotten exactly when missing past the grace, never before"
        assert set(run.totals.records) <= known and {t for t, _ in run.next_offsets()} <= sync.present
        if round_ % 10 == 0:  # a scrape's worth of work: not every round
            assert series_topics(run.metrics) <= sync.present
        copy(run, sync.present)
        known |= sync.present
        filed += 10 * PARTITIONS * len(sync.present)
        assert run.totals.records_total == filed, "the flow's totals keep what forgotten topics copied"
    saved = json.loads(files.files[STATE_FILE])
    assert set(saved["positions"]) == known and len(known) < 40
    assert forgotten > 100  # topics did go for good, many times over
