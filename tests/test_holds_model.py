"""The flow's holds across a topic's lives, against a model of the source: a topic deleted and made again while its
partitions are held gives up what its old life held, and its new life is copied whole, once, in spite of holds, a
target that refuses and stops refusing, the source's ids not answering for a while, and restarts from the saved state.

Hypothesis drives random steps against the real `FlowLedger` (its quarantines and catch-ups, saved in a folder as
the mirror saves them): records produced, the topic made again (its partitions start over at offset 0, with another
id, and refilled), the target refusing the topic's records or taking them again, the source's ids answering or not,
a batch (held whole while the topic is quarantined, held at its first record while the target refuses, copied
otherwise), a catch-up (before or after a refused record's retry time), and a restart. A record is named by its life
and offset. At every step no record was copied twice; after `settle` (the target takes everything, the ids answer,
the catch-ups and a batch run) every record of the present life is on the target. With `Quarantines.outlived` (which
gives up an old life's holds) made a no-op, 1,000 derandomized examples find a counterexample (about 3 minutes), and
so do 600 random ones; these settings keep the suite's share short."""

from __future__ import annotations

import collections

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from spark_app.ledger import FlowLedger
from spark_app.quarantine import RECORD_RETRY_S
from spark_app.ranges import Landing, OffsetRange
from tests.support.ledger_machine import LedgerMachine

TOPIC = "orders"
PARTITIONS = (0, 1)
TOO_LARGE = 2_000_000  # a record the target refuses while `refusing`


class HoldsAcrossLives(LedgerMachine):
    def __init__(self) -> None:
        super().__init__(TOPIC)
        self.life = 0  # the source topic's present life
        self.end = dict.fromkeys(PARTITIONS, 0)  # each partition's log end in the present life
        self.ids_answer = True
        self.refusing = False
        self.now = 0.0
        self.copied: collections.Counter[tuple[int, int, int]] = collections.Counter()  # (life, partition, offset)
        self.ledger = self._load()
        self.ledger.note_topic_ids({TOPIC: self._id()})
        self.ledger.expect({(TOPIC, p): 0 for p in PARTITIONS})
        self.ledger.file([])
        self.at = dict.fromkeys(PARTITIONS, 0)  # where the batches read next, in the life the ledger knows

    def _id(self) -> str:
        return f"id-of-life-{self.life}"

    def _load(self) -> FlowLedger:
        return FlowLedger(
            self.flow, self.saved(), lambda partitions: {},
            clock=lambda: self.now, topic_ids=self._topic_ids,
        )  # fmt: skip

    def _topic_ids(self, topics: set[str]) -> dict[str, str]:
        return {TOPIC: self._id()} if self.ids_answer and TOPIC in topics else {}

    def _copy_or_hold(self, p: int, first: int, end: int, whole: bool) -> Landing:
        """A range of the present life: held whole, held at its first record while the target refuses, or copied."""
        row = Landing(TOPIC, p, first, end)
        if whole and end > first:
            row.hold(first)
        elif self.refusing and end > first:
            row.hold(first, TOO_LARGE)
        elif end > first:
            row.last_offset, row.last_target_offset, row.records = end - 1, end - 1, end - first
            self.copied.update((self.life, p, o) for o in range(first, end))
        return row

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(1, 30))
    def records_produced(self, p: int, n: int) -> None:
        self.end[p] += n

    @rule(refill=st.integers(0, 30))
    def topic_made_again(self, refill: int) -> None:
        """Deleted and made again, then `refill` records written to each partition of the new life."""
        self.life += 1
        self.end = dict.fromkeys(PARTITIONS, refill)

    @rule(refusing=st.booleans())
    def target_refuses(self, refusing: bool) -> None:
        self.refusing = refusing

    @rule(answer=st.booleans())
    def ids_answer_or_not(self, answer: bool) -> None:
        self.ids_answer = answer

    @precondition(lambda self: self.ids_answer)
    @rule(n=st.integers(1, 40))
    def batch(self, n: int) -> None:
        """A batch planned in the present life (the planner asked its id): a topic made again since the last one
        starts every partition over at 0; a quarantined topic's ranges are held whole (not `ready`)."""
        rows = []
        if self.ledger.note_topic_ids({TOPIC: self._id()}):
            rows = [Landing(TOPIC, p, 0, 0, reset_from=self.at[p]) for p in PARTITIONS]
            self.at = dict.fromkeys(PARTITIONS, 0)
        held = TOPIC in self.ledger.quarantines.topics
        for p in PARTITIONS:
            end = min(self.end[p], self.at[p] + n)
            rows.append(self._copy_or_hold(p, self.at[p], end, held))
            self.at[p] = end
        self.ledger.file(rows)

    @rule(due=st.booleans())
    def catch_up(self, due: bool) -> None:
        """A catch-up between batches; `due`: after the retry time of a refused record has passed."""
        if due:
            self.now += RECORD_RETRY_S + 1

        def copy(ranges: list[OffsetRange], ready: dict[str, int], lives: dict[str, str]) -> list[Landing]:
            assert lives.get(TOPIC, self._id()) == self._id(), f"a catch-up of life {lives} in life {self._id()}"
            for r in ranges:
                assert r.end <= self.end[r.partition], f"a catch-up past the present life's end: {r}"
            return [self._copy_or_hold(r.partition, r.start, r.end, whole=False) for r in ranges]

        self.ledger.catch_up({TOPIC: len(PARTITIONS)}, copy)

    @rule()
    def restart(self) -> None:
        """The mirror starts again from its saved state: the batches from where the last one ended (the positions it
        filed, as the batch log says), the holds caught up apart (not `resume_points`, a real-time start's)."""
        self.ledger = self._load()
        self.at = {p: self.ledger.state.positions.get((TOPIC, p), 0) for p in PARTITIONS}

    @rule()
    def settle(self) -> None:
        """The target takes everything and the ids answer: catch-ups empty the quarantine, and a batch copies the
        rest; by then every record of the present life is on the target."""
        self.refusing, self.ids_answer = False, True
        self.batch(0)  # a topic made again is noted, as the next batch would
        for _ in range(100):
            if TOPIC not in self.ledger.quarantines.topics:
                break
            self.catch_up(due=True)
        assert TOPIC not in self.ledger.quarantines.topics, self.ledger.quarantines.held()
        self.batch(max(self.end.values()))
        for p in PARTITIONS:
            missing = [o for o in range(self.end[p]) if not self.copied[(self.life, p, o)]]
            assert not missing, f"partition {p}: offsets {missing[:10]} of the present life never copied"

    @invariant()
    def no_record_is_copied_twice(self) -> None:
        twice = [key for key, n in self.copied.items() if n > 1]
        assert not twice, f"copied twice (life, partition, offset): {twice[:10]}"


TestHoldsAcrossLives = HoldsAcrossLives.TestCase
TestHoldsAcrossLives.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, derandomize=True, database=None
)
