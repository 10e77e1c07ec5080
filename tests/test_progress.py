"""The `--available-now` progress display on its own: its arithmetic, its line, live or logged, on a fake clock."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import pytest
from confluent_kafka.admin import OffsetSpec

from spark_app import clients
from spark_app.config import ClusterConfig
from spark_app.metrics import owed_from
from spark_app.progress import (
    LOG_EVERY_S,
    RATE_WINDOW_S,
    FlowProgress,
    ProgressReport,
    count_backlog,
    progress_line,
)
from tests.support.clock import Clock

FLOW = "msk->eh"


class Counter:
    """Records done so far, as FlowTotals.handled reports them."""

    def __init__(self) -> None:
        self.done = 0

    def __call__(self) -> int:
        return self.done


def test_the_line_says_done_of_backlog_rate_and_eta_and_dashes_what_is_not_known():
    assert progress_line(FLOW, 1_200, 4_000, 400.0, 7.0) == (
        "flow msk->eh: 1,200 of 4,000 records (30.0%), 400 records/s, ETA 0:00:07"
    )
    assert progress_line(FLOW, 0, 2_000_000, None, None) == (
        "flow msk->eh: 0 of 2,000,000 records (0.0%), - records/s, ETA -"
    )
    assert progress_line(FLOW, 5_000, None, 1234.4, None) == "flow msk->eh: 5,000 records, 1,234 records/s"
    assert progress_line(FLOW, 0, 0, None, 0.0) == "flow msk->eh: 0 of 0 records (100.0%), - records/s, ETA 0:00:00"
    assert "ETA 1:01:01" in progress_line(FLOW, 1, 10, 1.0, 3661.0)
    # More done than counted (records produced after the count): never over 100%.
    assert "(100.0%)" in progress_line(FLOW, 12, 10, 1.0, 0.0)


def test_rate_is_taken_over_the_window_and_the_eta_is_what_remains_at_that_rate():
    done, clock = Counter(), Clock(100.0)
    backlog: list[int | None] = [None]  # not countable until the query has its topics
    flow = FlowProgress(FLOW, done, lambda: backlog[0])

    flow.sample(clock())
    assert (flow.backlog, flow.rate(), flow.eta_s()) == (None, None, None)
    backlog[0] = 10_000
    clock.now += 1
    flow.sample(clock())
    assert flow.backlog == 10_000 and flow.rate() == 0.0 and flow.eta_s() is None, "no rate yet: no ETA"
    backlog[0] = 99  # counted once: a later answer is not taken
    for _ in range(10):  # 100 records/s for 10 s
        clock.now += 1
        done.done += 100
        flow.sample(clock())
    assert flow.backlog == 10_000
    assert flow.rate() == pytest.approx(1_000 / 11)  # the window still holds the idle start
    for _ in range(int(RATE_WINDOW_S)):  # then 200 records/s for a whole window: the start has left it
        clock.now += 1
        done.done += 200
        flow.sample(clock())
    assert flow.rate() == pytest.approx(200.0)
    assert flow.eta_s() == pytest.approx((10_000 - 7_000) / 200.0)
    assert flow.line() == "flow msk->eh: 7,000 of 10,000 records (70.0%), 200 records/s, ETA 0:00:15"
    clock.now += 1
    done.done = 10_000
    flow.sample(clock())
    assert flow.eta_s() == 0.0


def test_a_terminal_gets_one_line_redrawn_in_place_with_every_flow():
    out, clock = io.StringIO(), Clock(100.0)
    a, b = Counter(), Counter()
    flows = [FlowProgress("a->b", a, lambda: 1_000), FlowProgress("b->a", b, lambda: None)]
    report = ProgressReport(flows, out, live=True, clock=clock)
    report.tick()
    clock.now += 2
    a.done, b.done = 500, 30
    report.tick()
    redraws = out.getvalue().split("\r\x1b[K")
    assert redraws[0] == "" and len(redraws) == 3 and "\n" not in out.getvalue()
    assert redraws[2] == (
        "flow a->b: 500 of 1,000 records (50.0%), 250 records/s, ETA 0:00:02 | flow b->a: 30 records, 15 records/s\r"
    )


def test_without_a_terminal_each_flow_logs_a_line_every_interval(caplog):
    done, clock, out = Counter(), Clock(100.0), io.StringIO()
    report = ProgressReport([FlowProgress(FLOW, done, lambda: 600)], out, live=False, clock=clock)
    caplog.set_level(logging.INFO, logger="spark_app.progress")
    for _ in range(int(LOG_EVERY_S) * 2 + 1):  # a tick a second, as the thread does
        report.tick()
        clock.now += 1
        done.done += 10
    assert [r.getMessage() for r in caplog.records] == [
        "flow msk->eh: 0 of 600 records (0.0%), - records/s, ETA -",
        "flow msk->eh: 300 of 600 records (50.0%), 10 records/s, ETA 0:00:30",
        "flow msk->eh: 600 of 600 records (100.0%), 10 records/s, ETA 0:00:00",
    ]
    assert out.getvalue() == "", "log lines only, no redraws"


@pytest.mark.parametrize("live", [True, False], ids=["terminal", "log"])
def test_the_final_figures_are_shown_when_the_run_ends(live, caplog):
    done, out = Counter(), io.StringIO()
    caplog.set_level(logging.INFO, logger="spark_app.progress")
    with ProgressReport([FlowProgress(FLOW, done, lambda: 10)], out, live=live, clock=Clock(100.0)):
        done.done = 10
    final = "flow msk->eh: 10 of 10 records (100.0%), - records/s, ETA 0:00:00"
    if live:
        assert out.getvalue().endswith(f"\r\x1b[K{final}\r\n")
    else:
        assert caplog.records[-1].getMessage() == final


class LogBounds:
    """An admin client that answers ListOffsets from each partition's (log start, end)."""

    def __init__(self, bounds: dict[tuple[str, int], tuple[int, int]]) -> None:
        self.bounds = bounds

    def list_offsets(self, request, isolation_level, request_timeout):
        latest = type(OffsetSpec.latest())
        return {
            tp: SimpleNamespace(
                result=lambda tp=tp, spec=spec: SimpleNamespace(
                    offset=self.bounds[(tp.topic, tp.partition)][isinstance(spec, latest)]
                )
            )
            for tp, spec in request.items()
        }


@pytest.mark.parametrize(
    ("start_from", "expected"), [("earliest", 10 + 30 + 20 + 7 + 15), ("latest", 10 + 30 + 20 + 7)]
)
def test_the_backlog_runs_from_where_each_partition_resumes_to_its_end(monkeypatch, start_from, expected):
    bounds = {("t", 0): (0, 100), ("t", 1): (0, 50), ("t", 2): (5, 12), ("a", 0): (0, 40), ("n", 0): (3, 18)}
    monkeypatch.setattr(clients, "admin", lambda _cluster: LogBounds(bounds))
    cluster = ClusterConfig(alias="src", bootstrap_servers="src.example:9092", profile="kafka")
    # t[0] saved at 90; t[1] read to 50 but held from 20; t[2] is a partition added since (from its log start);
    # a[0] adopted from MirrorMaker 2 at 20; n is a topic new to the flow: its log start, or its end under `latest`.
    resume = owed_from({("t", 0): 90, ("t", 1): 50, ("a", 0): 20}, {"t": {1: 20}})
    topics = {"t": 3, "a": 1, "n": 1}
    assert count_backlog(cluster, topics, resume, start_from) == expected
