"""A flow without transactions (throughput at least once, or real time) into the Event Hubs-like target meets a
record only the target's broker refuses: the target topic's cap was lowered after topic sync, so no pre-send rule
knows it. The records the producer had queued behind the refused one land first (librdkafka's idempotent producer
starts a new epoch and sends them), so their first copies are out of source order on the target; the mirror cannot
prevent that without transactions, so it must say so: the flow's ledger reports exactly the range that landed
ahead, in its log line and its metric, and nothing else out of order goes unreported. Both copy cores, both modes
(a real-time task run as a Spark task runs it, its reports filed in order), on real brokers."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka.admin import OffsetSpec

from bench.chaos.check import reported_ahead
from bench.testbed.clients import Record, create_topics, end_offsets, produce, read_all
from spark_app.clients import list_offsets
from spark_app.config import FlowConfig, FlowMode, TopicSelection
from spark_app.ledger import FlowLedger, LedgerState
from spark_app.metrics import MirrorMetrics
from spark_app.range_copy import RangeCopier
from spark_app.ranges import Landing, OffsetRange
from spark_app.realtime.task import DONE, LANDED, Assignment, CopierTask, LiveCopy
from spark_app.storage import checkpoint_files
from spark_app.topics import TargetRules

CAP = 50_000  # the target topic's max.message.bytes, lowered after topic sync: the flow's rules still say 1 MB
BATCH = 20_000  # the producer's batch.size (a tuning override): the copy's batches fit under CAP, as a trickle's do
RECORDS = 4_000
REFUSED_AT = 1_000  # the one record over CAP, mid-partition


@pytest.mark.parametrize("mode", [FlowMode.THROUGHPUT, FlowMode.REALTIME])
@pytest.mark.parametrize("core", ["python", "compiled"])
def test_records_that_land_ahead_of_a_record_the_broker_refused_are_reported_exactly(
    source_cluster, target_cluster, unique, tmp_path, caplog, core, mode
):
    source, target = source_cluster, target_cluster
    topic = f"ahead-{core}-{mode.value[:2]}-{unique}"
    create_topics(source.admin, {topic: 1})
    create_topics(target.admin, {topic: 1}, {"max.message.bytes": str(CAP)})
    now_ms = int(time.time() * 1000)
    values = [f"{i}|".encode() + (b"x" * (CAP + 10_000 if i == REFUSED_AT else 1_000)) for i in range(RECORDS)]
    produce(source.admin, topic, [Record(0, f"k{i}".encode(), v, (), now_ms) for i, v in enumerate(values)])
    flow = FlowConfig(
        source=source.client.alias, target=target.client.alias, topics=TopicSelection(include=[topic]),
        checkpoint_location=str(tmp_path / "flow"), replication_policy="identity", copy_core=core,
        mode=mode,
    )  # fmt: skip
    end = end_offsets(source.admin, [(topic, 0)])[(topic, 0)]
    producing = target.client.model_copy(update={"client_overrides": {"batch.size": str(BATCH)}})
    if mode == FlowMode.THROUGHPUT:
        landings = RangeCopier(flow, source.client, producing, None, TargetRules()).copy(
            [OffsetRange(topic, 0, 0, end)]
        )
    else:  # one available-now task, its reports in the order it sent them
        task = CopierTask(flow, source.client, producing, ("127.0.0.1", 9), b"unused", TargetRules())
        reports = _Reports()
        LiveCopy(task, Assignment({(topic, 0): 0}, {(topic, 0): end}), 0).run(reports)
        landings = [Landing.from_row(row) for row in reports.rows]
    # The refused record is too large for a batch of the producer's: it went alone, and the partition holds from it.
    (held,) = {r.held_from for r in landings if r.held_from >= 0}
    assert held == REFUSED_AT

    # What landed, read back: the source offset of each record in target order.
    on_target = end_offsets(target.admin, [(topic, 0)])[(topic, 0)]
    landed = [int((r.value or b"").split(b"|", 1)[0]) for r in read_all(target.admin, topic, on_target)]
    assert landed[:held] == list(range(held)), "in order up to the refused record"
    ahead = landed[held:]
    assert ahead, "nothing landed past the refused record: the test proves nothing (it must show the reorder)"
    assert ahead == list(range(held + 1, ahead[-1] + 1)), "what landed ahead is the run right after it"

    metrics = MirrorMetrics()
    state = LedgerState.load(checkpoint_files(str(tmp_path / "flow")))
    admin = source.admin
    ledger = FlowLedger(flow, state, lambda ps: list_offsets(admin, ps, OffsetSpec.earliest()), metrics)
    with caplog.at_level(logging.ERROR, logger="spark_app.ledger"):
        ledger.file(landings)

    reported = ledger.landed_ahead  # one range, or (real time) its parts, report by report
    assert [(r.topic, r.partition, r.refused_offset) for r in reported] == [(topic, 0, held)] * len(reported)
    assert [o for r in reported for o in range(r.first_offset, r.last_offset + 1)] == ahead
    assert sum(r.count for r in reported) == len(ahead)
    assert reported_ahead(caplog.text) == {(topic, 0): [(held, r.first_offset, r.last_offset) for r in reported]}
    figure = metrics.registry.get_sample_value(
        "mirrorkit_records_landed_ahead_total", {"flow": flow.name, "topic": topic, "partition": "0"}
    )
    assert figure == len(ahead)


class _Reports:
    """A real-time task's report channel whose driver never says stop: the rows it was sent."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def send(self, message: list) -> None:
        self.rows += message[1] if message[0] in (LANDED, DONE) else []

    def poll(self) -> bool:
        return False

    def recv(self) -> object:
        raise AssertionError("an available-now task hears nothing from its driver")
