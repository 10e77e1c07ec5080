"""DR bookkeeping over a long run: hundreds of batches, a group parked far behind, a restart half-way, then a
failover that resumes the group exactly where it stopped.

Each batch files an offset sync and each checkpoint round a checkpoint, so the parked group's translation has to
hold through hundreds of syncs, end to end through Spark, the offset-syncs topic and a restart that reads it back.
The sync store's bounds and trimming over 100,000 batches, and its translation against a brute-force model, are the
unit tests' (test_sync_store, test_translation_model): this test proves the wiring, not the arithmetic again."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TopicPartition

from bench.testbed import clients
from bench.testbed.clients import commit, create_topics, end_offsets
from bench.testbed.ports import free_port
from spark_app.cli import main as cli_main
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.support.running import mirror_running

BATCHES = 400  # at least this many micro-batches over the two runs of the mirror
PER_BATCH = 8  # max_records_per_trigger: small batches (about 0.3 s of Spark each), yet more than arrive
PARKED_AT = {0: 37, 1: 41}  # where the group stopped reading, per partition


def produce_steadily(cluster, topic: str, stop: threading.Event, sent: list[bytes]) -> None:
    """Records across two partitions, about ten a second (fewer than the mirror copies), until `stop`; each
    value says its order."""
    producer = clients.producer(cluster.client, {"linger.ms": 1})
    while not stop.is_set():
        value = str(len(sent)).encode()
        producer.produce(topic, value=value, partition=len(sent) % 2)
        sent.append(value)
        producer.poll(0)
        time.sleep(0.1)  # the load's pacing: fewer records than the mirror copies, so batches stay small
    assert producer.flush(30) == 0


def batches_done(mirror: Mirror) -> int:
    return mirror.flows[0].totals.batches


@pytest.mark.timeout(1200)  # 400 micro-batches take 3 to 6 minutes on two cores
def test_a_group_parked_through_hundreds_of_batches_and_a_restart_fails_over_exactly(
    spark, plaintext_cluster, source_cluster, tmp_path, unique, capsys
):
    topic, group = f"orders-{unique}", f"parked-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    raw = one_flow_config(
        plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", source_alias="primary", target_alias="dr",
        groups={"include": [group]}, emit_heartbeats=False, max_records_per_trigger=PER_BATCH,
        trigger_interval_s=0, checkpoint_interval_s=1, metrics_port=free_port(),
    )  # fmt: skip
    config = parse_config(raw)
    config_file = tmp_path / "mirror.json"
    config_file.write_text(config.model_dump_json())
    sent: list[bytes] = []
    stop = threading.Event()
    producing = threading.Thread(target=produce_steadily, args=(plaintext_cluster, topic, stop, sent), daemon=True)
    producing.start()
    wait_until(lambda: len(sent) >= 2 * max(PARKED_AT.values()), "records past where the group parks", every_s=0.1)
    commit(plaintext_cluster.client, group, topic, PARKED_AT)  # the application read this far, then stopped

    done = 0
    for run in (1, 2):  # the mirror restarts half-way, on the same checkpoint and offset-syncs topic
        mirror = Mirror(spark, config)
        with mirror_running(mirror) as errors:
            half = f"{BATCHES // 2} batches in run {run}"
            wait_until(lambda ran=mirror: batches_done(ran) >= BATCHES // 2, half, 900, 1, errors)
            if run == 2:
                stop.set()
                producing.join(60)
                caught_up(source_cluster, f"primary.{topic}", len(sent), errors)
        # The mirror's stop wrote its final offset syncs and checkpoints (DrSync.stop): the failover reads them.
        done += batches_done(mirror)
        print(f"run {run}: {batches_done(mirror)} batches, {len(sent)} records sent so far")
    print(f"{done} batches over two runs of the mirror, {len(sent)} records")
    assert done >= BATCHES

    capsys.readouterr()
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr", "--dry-run"]) == 0
    plan = {}
    for line in capsys.readouterr().out.splitlines()[1:]:
        group_, remote, partition, source_offset, target_offset, reread, _note = line.split()
        plan[int(partition)] = (int(source_offset), int(target_offset), int(reread))
    print(f"failover plan (source offset, target offset, re-read) per partition: {plan}")
    assert {p: s for p, (s, _, _) in plan.items()} == PARKED_AT
    assert all(reread <= PER_BATCH for _, _, reread in plan.values()), "re-read more than one batch"
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr"]) == 0

    # The group resumes on DR: it reads every record it had not read, in order, and nothing it had read before
    # beyond the re-read the plan announced.
    consumer = clients.consumer(source_cluster.client, group, {"enable.auto.commit": False})
    consumer.assign([TopicPartition(f"primary.{topic}", p, plan[p][1]) for p in PARKED_AT])
    unread = {p: [v for i, v in enumerate(sent) if i % 2 == p][PARKED_AT[p] :] for p in PARKED_AT}
    got: dict[int, list[bytes]] = {p: [] for p in PARKED_AT}
    deadline = time.monotonic() + 60
    while sum(map(len, got.values())) < sum(map(len, unread.values())) + sum(r for _, _, r in plan.values()):
        assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} on DR, expected more"
        for msg in consumer.consume(1000, 0.5):
            if msg.error() is None:
                got[msg.partition()].append(msg.value())
    consumer.close()
    for p in PARKED_AT:
        reread = plan[p][2]
        assert got[p][reread:] == unread[p], f"partition {p}: not every unread record, in order, once"


def caught_up(target, remote: str, expected: int, errors: list[BaseException]) -> None:
    """Wait until the target holds every record sent."""

    def copied() -> bool:
        return sum(end_offsets(target.client, [(remote, 0), (remote, 1)]).values()) >= expected

    wait_until(copied, f"all {expected} records on '{remote}'", 300, 1, errors)
