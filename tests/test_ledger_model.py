"""The flow's ledger against a model of the source: nothing retention deleted before the mirror read it goes
unreported, whatever comes between (the source's log starts not answering, restarts from the saved state), and
nothing the ledger filed as copied is ever reported lost.

Hypothesis drives random steps: records produced, retention moving a log start, a copy that reads from where the
copier stands (moving to the log start when retention passed it) and files its landing, a copy whose landing a crash
lost before it was filed, the log-start lookup failing or answering again, and a restart from the saved state. After
each `settle` (every lookup answers, a filing) every offset below where the copier stands is on the target or
reported deleted, once.

Runs of the flow also start transactional slots, each run its own number of them: the mark the ledger saves is, at
every step, past every slot id any run started, read from the saved state alone (a restart reads nothing else), and
is one integer; so every start can fence the slot ids from its own count up to it."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from spark_app.ledger import FlowLedger
from spark_app.ranges import Landing
from tests.support.ledger_machine import LedgerMachine

TOPIC = "orders"
PARTITIONS = (0, 1)


class SourceModel:
    """The source's partitions as the ledger's lookups see them: each log's start and end, and whether its log
    start answers (its leader reachable from the driver)."""

    def __init__(self) -> None:
        self.end = dict.fromkeys(PARTITIONS, 0)
        self.start = dict.fromkeys(PARTITIONS, 0)
        self.answers = dict.fromkeys(PARTITIONS, True)

    def earliest(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {tp: self.start[tp[1]] for tp in partitions if self.answers[tp[1]]}


class LedgerAgainstRetention(LedgerMachine):
    def __init__(self) -> None:
        super().__init__(TOPIC)
        self.source = SourceModel()
        self.on_target: dict[int, set[int]] = {p: set() for p in PARTITIONS}  # copied, filed or not
        self.filed: dict[int, set[int]] = {p: set() for p in PARTITIONS}  # copied and filed
        self.reported: dict[int, list[int]] = {p: [] for p in PARTITIONS}  # every offset reported deleted, each time
        self.ledger = self._load()
        self.ledger.expect({(TOPIC, p): 0 for p in PARTITIONS})
        self.ledger.file([])
        self.at = dict.fromkeys(PARTITIONS, 0)  # where the copier reads next
        self.slots_started: set[int] = set()  # every slot id a run started a producer of

    def _load(self) -> FlowLedger:
        self._seen = 0  # of this ledger's data-loss events
        return FlowLedger(self.flow, self.saved(), self.source.earliest)

    def _collect(self) -> None:
        """Take the ledger's new data-loss reports into the model (a step makes far fewer than it keeps)."""
        events = list(self.ledger.data_loss)
        for loss in events[self._seen :]:
            self.reported[loss.partition] += range(loss.first_offset, loss.last_offset + 1)
        self._seen = len(events)

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(1, 50))
    def records_produced(self, p: int, n: int) -> None:
        self.source.end[p] += n

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(1, 60))
    def retention_deletes(self, p: int, n: int) -> None:
        self.source.start[p] = min(self.source.end[p], self.source.start[p] + n)

    @rule(p=st.sampled_from(PARTITIONS), answers=st.booleans())
    def log_start_lookup(self, p: int, answers: bool) -> None:
        self.source.answers[p] = answers

    def _copy(self, p: int, n: int) -> Landing:
        """Read up to `n` records from where the copier stands (from the log start if retention passed it)."""
        first = max(self.at[p], self.source.start[p])
        end = min(self.source.end[p], first + n)
        row = Landing(TOPIC, p, first_offset=first, end_offset=end)
        if end > first:
            row.last_offset, row.last_target_offset, row.records = end - 1, end - 1, end - first
        self.on_target[p].update(range(first, end))
        self.at[p] = end
        return row

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(0, 40))
    def copy_and_file(self, p: int, n: int) -> None:
        row = self._copy(p, n)
        self.ledger.file([row])
        self.filed[p].update(range(row.first_offset, row.end_offset))
        self._collect()

    @rule(p=st.sampled_from(PARTITIONS), n=st.integers(1, 40))
    def copy_then_crash_before_filing(self, p: int, n: int) -> None:
        self._copy(p, n)
        self.restart()

    @rule(count=st.integers(1, 12))
    def run_starts_slots(self, count: int) -> None:
        """A run (a batch, a catch-up, a real-time job) starts slots 0..count - 1: it files them first, then fences
        the ids from its count up to the saved mark, then starts its own (which fences their earlier attempts)."""
        self.ledger.slots_start(count)
        mark = self.saved().slots
        fenced = set(range(count, mark)) | set(range(count))
        assert self.slots_started <= fenced, f"slot ids {sorted(self.slots_started - fenced)} left unfenced"
        self.slots_started.update(range(count))

    @rule()
    def restart(self) -> None:
        """The mirror starts again from its saved state; its copier from the resume points."""
        self.ledger = self._load()
        resume = self.ledger.resume_points()
        self.at = {p: resume[(TOPIC, p)] for p in PARTITIONS}

    @rule()
    def settle(self) -> None:
        """Every lookup answers and the ledger files once more: by now every record the copier passed is on the target
        or was reported deleted."""
        self.source.answers = dict.fromkeys(PARTITIONS, True)
        self.ledger.file([])
        self._collect()
        for p in PARTITIONS:
            missing = set(range(self.at[p])) - self.on_target[p] - set(self.reported[p])
            assert not missing, f"partition {p}: offsets {sorted(missing)[:10]} deleted and never reported"

    @invariant()
    def the_saved_slot_mark_is_past_every_slot_started(self) -> None:
        saved = self.saved()
        assert saved.slots == max(self.slots_started, default=-1) + 1, (saved.slots, sorted(self.slots_started))

    @invariant()
    def nothing_filed_as_copied_is_reported_and_nothing_twice(self) -> None:
        for p in PARTITIONS:
            assert not set(self.reported[p]) & self.filed[p], f"partition {p}: reported lost, but filed as copied"
            assert len(self.reported[p]) == len(set(self.reported[p])), f"partition {p}: a loss reported twice"


TestLedgerAgainstRetention = LedgerAgainstRetention.TestCase
TestLedgerAgainstRetention.settings = settings(
    max_examples=500, stateful_step_count=40, deadline=None, derandomize=True, database=None
)
