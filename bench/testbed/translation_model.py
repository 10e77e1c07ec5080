"""A model of one mirrored partition that knows where every record landed, and a Hypothesis state machine that drives
the real sync store (spark_app.dr.syncs) through random steps against it.

The oracle is brute force on purpose: the source log and the target log as lists, each target entry saying what it
is (a mirrored copy of a source offset, or a record written on the target locally), and each group's committed
offset. After every step it checks each group's translation: no record the group has not read lies below the resume
point, what it reads again is within the bound the store reports, and, unless the store says it moved the group back
to a target-local record it could not show was read (`guarded`), within one batch.

tests/test_translation_model.py runs a fixed budget in the fast selection; bench/translation_model.py runs a longer
one. A subclass that sets `factory` runs the same machine against another store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from spark_app.dr.syncs import LOCAL, MIRRORED, Run, SlottedRun, SyncStore
from spark_app.ranges import Landing

BATCH = 6  # the most records one batch copies: the re-read bound for a group that has not been guarded
TAIL = 4  # a tiny dense tail, so eviction happens within a few steps
GROUPS = ("g0", "g1", "g2")
KEY = ("t", 0)

StoreFactory = Callable[[bool], SyncStore]


def make_store(local_writes: bool) -> SyncStore:
    return SyncStore(max_runs=TAIL, local_writes=local_writes)


@dataclass
class SyncsTopic:
    """The offset-syncs topic: records appended in write order; compaction keeps the newest per key and drops
    tombstones (a record whose run is None), as Kafka does once delete.retention.ms has passed."""

    log: list[SlottedRun] = field(default_factory=list)

    def write(self, synced: list[SlottedRun]) -> None:
        self.log += synced

    def compact(self) -> None:
        newest: dict[tuple[str, int, int, int], SlottedRun] = {}
        for s in self.log:
            key = (s.topic, s.partition, s.slot, s.kind)
            newest.pop(key, None)
            newest[key] = s
        self.log = [s for s in newest.values() if getattr(s, "run", None) is not None]


class Translation(RuleBasedStateMachine):
    """One partition of a flow A -> B; with `identity`, B also takes local writes, whose echoes come back to A."""

    identity = False
    factory: StoreFactory = staticmethod(make_store)

    def __init__(self) -> None:
        super().__init__()
        self.store = self.factory(self.identity)
        self.topic = SyncsTopic()
        self.src: list[tuple[str, int]] = []  # ("rec", 0), ("mark", 0), or ("echo", b): the echo of B's local at b
        self.tgt: list[tuple[str, int, int]] = []  # ("mir", epoch, source offset) or ("loc", 0, 0)
        self.pos = 0  # the mirror's next source offset
        self.epoch = 0  # the source topic's incarnation
        self.reset_pending = False
        self.echoed = 0  # B's local records below this target offset have come back to A
        self.old_echoes: set[int] = set()  # B's locals whose echo went with a re-created source topic
        self.reported: set[int] = set()  # source offsets of this epoch whose landing the store was told
        self.committed = dict.fromkeys(GROUPS, 0)
        self.zombie: list[SlottedRun] | None = None  # a replaced mirror's last round, not yet on the topic
        self.unwritten: set[int] = set()  # source offsets of this epoch whose runs a replaced mirror never wrote
        self.stale = False  # two writers' rounds crossed on the topic: re-reads are no longer counted

    # -- the source and the target --------------------------------------------------------------------------

    @rule(records=st.integers(1, BATCH), marker=st.booleans())
    def produce(self, records: int, marker: bool) -> None:
        """Records on A, and a transaction marker after them (an offset with no record)."""
        self.src += [("rec", 0)] * records + [("mark", 0)] * marker

    @rule(batches=st.integers(1, 12))
    def busy_transactional_producer(self, batches: int) -> None:
        """Full batches, each followed by a transaction marker: every batch the mirror copies is a run of its own."""
        self.src += ([("rec", 0)] * BATCH + [("mark", 0)]) * batches

    @rule(batches=st.integers(1, 12))
    def mirror_runs(self, batches: int) -> None:
        """Several batches in a row, none crashing."""
        for _ in range(batches):
            self.mirror_batch(BATCH + 1, crash=False)

    @precondition(lambda self: self.identity)
    @rule(records=st.integers(1, 3))
    def write_on_target(self, records: int) -> None:
        """B's own producers write between (or before, or after) the mirror's writes."""
        self.tgt += [("loc", 0, 0)] * records

    @precondition(lambda self: self.identity)
    @rule()
    def echo_comes_back(self) -> None:
        """The flow B -> A copies B's next local record to A (A's copies on B are never mirrored back)."""
        while self.echoed < len(self.tgt) and self.tgt[self.echoed][0] != "loc":
            self.echoed += 1
        if self.echoed < len(self.tgt):
            self.src.append(("echo", self.echoed))
            self.echoed += 1

    @rule(size=st.integers(1, BATCH), crash=st.sampled_from([False] * 9 + [True]))
    def mirror_batch(self, size: int, crash: bool) -> None:
        """The mirror copies the next `size` source offsets; a crash writes them and reports nothing, so the next
        batch copies them again."""
        landing = Landing("t", 0, self.pos, self.pos + size)
        for offset in range(self.pos, min(len(self.src), self.pos + size)):
            kind, at = self.src[offset]
            if kind == "rec":
                landing.landed(offset, len(self.tgt))
                self.tgt.append(("mir", self.epoch, offset))
            elif kind == "echo":
                landing.echoed(offset, at)
        if crash:
            return
        if self.reset_pending:
            self.store.reset(*KEY)
            self.reset_pending = False
        for start, target, last in landing.runs:
            self.store.record("t", 0, Run(start, target, last))
            self.reported.update(range(start, last + 1))
        for start, target, last in landing.echoes:
            self.store.echo("t", 0, Run(start, target, last))
        self.pos = min(len(self.src), self.pos + size)

    @rule()
    def source_topic_recreated(self) -> None:
        """The source topic is deleted and made again: its offsets start over, and so do its groups."""
        self.old_echoes |= {at for kind, at in self.src if kind == "echo"}
        self.src, self.pos, self.epoch, self.reset_pending = [], 0, self.epoch + 1, True
        self.reported = set()
        self.unwritten = set()
        self.committed = dict.fromkeys(GROUPS, 0)

    # -- groups ---------------------------------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS), step=st.integers(1, 3 * BATCH))
    def group_consumes(self, group: str, step: int) -> None:
        self.committed[group] = min(len(self.src), self.committed[group] + step)

    @rule(group=st.sampled_from(GROUPS))
    def group_catches_up(self, group: str) -> None:
        self.committed[group] = len(self.src)

    # -- the DR service -------------------------------------------------------------------------------------

    @rule()
    def checkpoint_round(self) -> None:
        """The checkpoint task: the groups' committed offsets go to the store, the changed syncs to the topic."""
        self.store.keep_for({KEY: set(self.committed.values())})
        self.topic.write(list(self.store.take_changed()))

    @rule()
    def syncs_topic_compacted(self) -> None:
        self.topic.compact()

    @rule()
    def mirror_restarts(self) -> None:
        """As DrSync does it: `stop` flushes the changed syncs; the next run's fresh store takes its batches while
        `prepare` reads the topic back into a store (spark_app.dr.internal.read_offset_syncs), then rebases on it."""
        self.topic.write(list(self.store.take_changed()))
        self._start_from_the_topic()

    def _start_from_the_topic(self) -> None:
        stored = SyncStore(local_writes=self.identity)
        stored.load(list(self.topic.log))
        self.store = self.factory(self.identity)
        self.store.rebase(stored)

    @rule()
    def mirror_replaced_while_the_old_one_still_runs(self) -> None:
        """Two writers of one flow: a replacement starts from the topic while the old mirror, not yet fenced, holds
        changes it has not written; its last round (`zombie_writes_its_last_round`) lands after the replacement's
        writes, and the flow's DR lease (spark_app.dr.lease) stops it writing more. Until a restart reads that
        round back, the replacement knows nothing of those runs (a crash loses them for good): a group among them
        may read again what they cover, never skip it. If they include the tombstones of a re-created topic's old
        runs, the replacement translates with the old incarnation's runs, whose target offsets all lie below the
        new one's: it re-reads more than it can count, and skips nothing."""
        self.zombie = list(self.store.take_changed())
        self.unwritten |= {
            o for z in self.zombie if z.kind == MIRRORED and z.run for o in range(z.run.start, z.run.last + 1)
        }
        self.stale = self.stale or any(z.run is None and z.kind != LOCAL for z in self.zombie)
        self._start_from_the_topic()

    @precondition(lambda self: self.zombie is not None)
    @rule()
    def zombie_writes_its_last_round(self) -> None:
        """The replaced mirror's last round lands after its replacement's writes: a slot both used now holds the
        replaced mirror's run (or its tombstone), and a restart loses the replacement's. From then on translation
        must still never skip; what it re-reads is no longer within the bound it counts."""
        assert self.zombie is not None
        self.topic.write(self.zombie)
        self.stale = True
        self.zombie = None

    # -- the property ---------------------------------------------------------------------------------------

    @invariant()
    def no_group_skips_and_rereads_are_bounded(self) -> None:
        for group, committed in self.committed.items():
            self.check(group, committed)

    def check(self, group: str, committed: int) -> None:
        if self.reset_pending:
            return  # the store learns of a re-created source topic with the mirror's next batch; until then it
            # translates with the old topic's history (spark_app.dr.offset_syncs)
        got = self.store.translate("t", 0, committed)
        read_locals = {at for kind, at in self.src[:committed] if kind == "echo"}
        if got is None:  # the checkpoint task then resumes at the target's start: safe, a long re-read
            assert self.stale or not any(s < committed for s in self.reported - self.unwritten), f"{group}: none"
            return
        resume = got.downstream_offset
        copies_above = {s for i, (kind, epoch, s) in enumerate(self.tgt) if kind == "mir" and i >= resume}
        for i, (kind, epoch, s) in enumerate(self.tgt[:resume]):
            if kind == "loc":
                unread = i not in read_locals and i not in self.old_echoes
                assert not unread, f"{group} at {committed} resumes at {resume}, past B's local {i} unread"
            elif epoch == self.epoch and s >= committed and s < self.pos:  # at or past pos: copied again later
                assert s in copies_above, f"{group} at {committed} resumes at {resume}, past unread source {s}"
        if self.stale:
            return  # re-reads are not counted right (see mirror_replaced_while_the_old_one_still_runs), and are safe
        # What it reads again: records it read at or after the resume point, each once (a crashed batch's copies of
        # records the mirror has not reported yet are its at-least-once duplicates, not translation's).
        reread = {("loc", i) for i in read_locals if i >= resume}
        read_mirrored = min(committed, self.pos)
        reread |= {("mir", s) for i, (kind, epoch, s) in enumerate(self.tgt)
                   if i >= resume and kind == "mir" and epoch == self.epoch and s < read_mirrored}  # fmt: skip
        assert len(reread) <= got.reread, f"{group} at {committed}: re-reads {len(reread)}, store said {got}"
        if not got.guarded:  # a replaced mirror's unwritten runs cost what they cover, at most
            bound = BATCH + len(self.unwritten)
            assert len(reread) <= bound, f"{group} at {committed}: re-reads {len(reread)} > {bound} ({got})"


class IdentityTranslation(Translation):
    identity = True

    @initialize(records=st.integers(0, 2 * BATCH))
    def target_already_holds_data(self, records: int) -> None:
        """The target topic held records of its own before the flow's first write."""
        self.tgt += [("loc", 0, 0)] * records


class ExactlyOnceTranslation(Translation):
    """An exactly-once flow (spark_app.transactions): every batch is a transaction on the target, so a commit marker
    follows its records there and every batch is a run of its own; a batch that crashes is aborted, its records
    left in the target's log, where a read_committed group never reads them."""

    @rule(size=st.integers(1, BATCH), crash=st.sampled_from([False] * 9 + [True]))
    def mirror_batch(self, size: int, crash: bool) -> None:
        written = len(self.tgt)
        super().mirror_batch(size, crash)
        if crash:  # aborted: not a copy any group reads
            self.tgt[written:] = [("abt", epoch, offset) for _, epoch, offset in self.tgt[written:]]
        self.tgt.append(("mark", 0, 0))  # the commit's (or the abort's) control marker
