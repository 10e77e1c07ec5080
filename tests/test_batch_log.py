"""The batch log on its own: where a run resumes after commits, crashes and restarts, that it stays bounded, and that
an earlier release's Spark checkpoint is read as it stands. No Spark session and no broker."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from spark_app.batch_log import COMMITS, KEEP_BATCHES, OFFSETS, BatchLog, Planned
from spark_app.errors import StateError
from spark_app.storage import LocalFiles

MEMORY = "/dev/shm"  # a tmpfs on Linux


def test_a_batch_planned_and_not_committed_runs_again_with_the_same_start_and_end(tmp_path):
    log = BatchLog(LocalFiles(str(tmp_path), tmp_path))
    assert log.resume().batch == 0 and log.resume().start == Planned({}) and log.resume().planned is None
    first, second = Planned({"t": {"0": 5}}, {"t": "id-t"}), Planned({"t": {"0": 9}}, {"t": "id-t"})
    log.plan(0, first)
    assert (log.resume().batch, log.resume().start, log.resume().planned) == (0, Planned({}), first)
    log.commit(0)
    assert (log.resume().batch, log.resume().start, log.resume().planned) == (1, first, None)
    log.plan(1, second)  # and the mirror is killed before the batch's commit
    assert (log.resume().batch, log.resume().start, log.resume().planned) == (1, first, second)


def test_a_log_missing_the_entry_a_batch_in_flight_starts_from_stops_and_names_it_rather_than_start_over(tmp_path):
    log = BatchLog(LocalFiles(str(tmp_path), tmp_path))
    log.plan(0, Planned({"t": {"0": 5}}))
    log.commit(0)
    log.plan(1, Planned({"t": {"0": 9}}))
    (tmp_path / OFFSETS / "0").unlink()
    with pytest.raises(StateError, match=f"{tmp_path / OFFSETS / '0'}: the batch log has no such entry"):
        log.resume()


def test_an_earlier_releases_spark_checkpoint_is_read_as_it_stands_and_the_next_batch_follows_on(tmp_path):
    """Spark's own offset and commit logs, with the checksum files Hadoop's local file system writes beside them."""
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1764000000000, "conf": {"spark.sql.shuffle.partitions": "200"}}
    for batch, offset in ((6, 40), (7, 55)):
        entry = {"t": {"0": offset, "1": 3}, "#ids": {"t": "id-t"}, "#gone": {"old": 1764000000.5}}
        (tmp_path / OFFSETS).mkdir(exist_ok=True)
        (tmp_path / OFFSETS / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{json.dumps(entry)}")
        (tmp_path / OFFSETS / f".{batch}.crc").write_bytes(b"\0crc")
    (tmp_path / COMMITS).mkdir()
    (tmp_path / COMMITS / "6").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (tmp_path / "metadata").write_text('{"id":"query"}')
    log = BatchLog(LocalFiles(str(tmp_path), tmp_path))
    resume = log.resume()
    assert resume.batch == 7, "batch 7 was planned and never committed"
    assert resume.start == Planned({"t": {"0": 40, "1": 3}}, {"t": "id-t"}, {"old": 1764000000.5})
    assert resume.planned is not None and resume.planned.offsets == {"t": {"0": 55, "1": 3}}
    log.commit(7)
    assert log.resume().batch == 8 and log.resume().start.offsets == {"t": {"0": 55, "1": 3}}


class Restarts(RuleBasedStateMachine):
    """The log against a model that remembers every batch planned and committed, through kills and restarts."""

    def __init__(self) -> None:
        super().__init__()
        # In memory: the log fsyncs every file it writes, thousands per run, and on a disk those syncs were nearly
        # all of this test's two minutes. What the model checks (what a new log reads back) does not change.
        self.folder = Path(tempfile.mkdtemp(prefix="batch-log-", dir=MEMORY))
        self.log = BatchLog(LocalFiles(str(self.folder), self.folder))
        self.planned: list[Planned] = []  # every batch planned, by id
        self.committed = -1  # the last batch committed
        self.offset = 0

    @rule(records=st.integers(1, 10_000))
    def a_batch_is_planned(self, records: int) -> None:
        if len(self.planned) > self.committed + 1:
            return  # one is in flight: the driver plans the next only after its commit
        self.offset += records
        end = Planned({"t": {"0": self.offset}})
        self.log.plan(len(self.planned), end)
        self.planned.append(end)

    @rule()
    def the_batch_in_flight_commits(self) -> None:
        if len(self.planned) > self.committed + 1:
            self.committed += 1
            self.log.commit(self.committed)

    @rule(many=st.integers(1, 150))
    def many_batches_run(self, many: int) -> None:
        """A long quiet stretch of the mirror's life, each batch planned and committed."""
        self.the_batch_in_flight_commits()
        for _ in range(many):
            self.a_batch_is_planned(1)
            self.the_batch_in_flight_commits()

    @rule()
    def the_mirror_restarts(self) -> None:
        self.log = BatchLog(LocalFiles(str(self.folder), self.folder))

    def teardown(self) -> None:
        shutil.rmtree(self.folder)

    @invariant()
    def it_resumes_after_the_last_commit_or_runs_the_batch_in_flight_again_and_stays_bounded(self) -> None:
        resume = self.log.resume()
        in_flight = len(self.planned) > self.committed + 1
        assert resume.batch == self.committed + 1
        assert resume.start == (self.planned[self.committed] if self.committed >= 0 else Planned({}))
        assert resume.planned == (self.planned[-1] if in_flight else None)
        for folder in (OFFSETS, COMMITS):
            assert len(list((self.folder / folder).glob("[0-9]*"))) <= KEEP_BATCHES + 1


Restarts.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
test_the_log_resumes_where_the_model_says_through_kills_and_restarts = Restarts.TestCase
