"""Taking over from a real MirrorMaker 2 (dedicated mode): no gap, bounded duplicates, groups keep their place."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import OffsetSpec

from bench.testbed import clients
from bench.testbed.clients import Record, by_partition, commit, create_topics, produce, read_all
from bench.testbed.mm2 import mm2_command
from spark_app.cli import main as cli_main
from spark_app.clients import read_topic
from spark_app.config import parse_config
from spark_app.dr.adopt import TOOLBOX_MARK, running_refusals, unreached_checkpoint
from spark_app.mirror import Mirror
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.test_dr import mm2_translate, values_from

TOPICS = {"orders": 2, "payments": 2}
MM2_SETTINGS = {
    "dr.offset.flush.interval.ms": "2000",  # Connect's worker setting: how often MM2 commits its positions
    "dr.session.timeout.ms": "6000",  # how long a killed MM2 stays a member of its Connect group (broker minimum)
    "emit.checkpoints.interval.seconds": "1",
    "refresh.groups.interval.seconds": "1",
    "emit.heartbeats.interval.seconds": "1",
    "sync.group.offsets.enabled": "false",
    # Its syncs on the target, as `mm2-offset-syncs.primary.internal` (named after the source there); adopt must find
    # them where this puts them
    "offset-syncs.topic.location": "target",
}


def mm2_committed(config, offsets_topic: str) -> dict[tuple[str, int], int]:
    """MM2's MirrorSourceConnector positions as the test reads them itself: the last source offset copied."""
    out = {}
    for msg in read_topic(config.cluster("dr"), offsets_topic):
        name, part = json.loads(msg.key())
        if name == "MirrorSourceConnector" and msg.value() is not None:
            out[(part["topic"], part["partition"])] = json.loads(msg.value())["offset"]
    return out


def test_adopt_and_handback_round_trip_with_mm2_with_no_gap_and_groups_carry_on(
    spark, own_cluster, tmp_path, unique, capsys
):
    """MM2 mirrors two topics under a steady producer, checkpointing a group, and is killed mid-stream. Adopting
    is refused while it runs and for a flow named differently; then `adopt`, and the mirror copies the rest. Each
    target partition is MM2's prefix followed by the source from MM2's committed position on: in order, nothing
    missing, duplicates exactly the records MM2 wrote but had not committed. RemoteClusterUtils reads the group's
    checkpoints before and after the switch, and a failover after it resumes the group without skipping.

    Then `handback`, more records, and MM2 started again as it was: it copies exactly the records the mirror had
    not (no duplicate more, none missing), and its checkpoints translate the group on, from the syncs handback
    wrote (a group at the mirror's last record resumes exactly) and from its own."""
    src = own_cluster(f"mm2src-{unique[-8:]}", "plaintext")
    dst = own_cluster(f"mm2dst-{unique[-8:]}", "plaintext")
    group = f"app-{unique}"
    create_topics(src.admin, TOPICS)
    raw = one_flow_config(src, dst, list(TOPICS), tmp_path / "ckpt", source_alias="primary", target_alias="dr",
                          groups={"include": [group]}, emit_heartbeats=False)  # fmt: skip
    config = parse_config(raw)
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(raw))
    identity_file = tmp_path / "identity.json"
    identity = json.loads(json.dumps(raw))
    identity["flows"][0]["replication_policy"] = "identity"
    identity_file.write_text(json.dumps(identity))
    offsets_topic = "mm2-offsets.primary.internal"  # dedicated mode's Connect offsets topic, as MM2 names it

    stop = threading.Event()
    produced = {tp: 0 for tp in ((t, p) for t, n in TOPICS.items() for p in range(n))}

    def producer_loop() -> None:
        producer = clients.producer(src.client, {"linger.ms": 5, "enable.idempotence": True})
        while not stop.is_set():
            for topic, partition in produced:
                i = produced[(topic, partition)]
                producer.produce(topic, value=f"{topic}/{partition}/{i}".encode(), partition=partition)
                produced[(topic, partition)] = i + 1
            producer.poll(0)
            time.sleep(0.005)  # a steady load's pacing
        assert producer.flush(30) == 0

    def written_past_its_commit() -> bool:
        """Whether MM2 wrote, on every partition, records it has not committed yet."""
        done = mm2_committed(config, offsets_topic)
        ends = _ends(dst, "primary.")
        return all(end > done.get((t.removeprefix("primary."), p), -1) + 1 for (t, p), end in ends.items())

    log = (tmp_path / "mm2.log").open("wb")
    mm2 = subprocess.Popen(
        mm2_command("primary", src.client.bootstrap_servers, "dr", dst.client.bootstrap_servers, list(TOPICS), tmp_path,
                    MM2_SETTINGS),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    producer = threading.Thread(target=producer_loop, daemon=True)
    producer.start()
    try:
        commit(src.client, group, "orders", {0: 40, 1: 60})
        checkpointed = {(group, "primary.orders", p) for p in (0, 1)}
        deadline = time.monotonic() + 90
        mm2_checkpoints: dict = {}
        # MM2 checkpoints each partition once an offset sync covers the group's offset there: not all in one pass.
        while len(mm2_committed(config, offsets_topic)) < len(produced) or set(mm2_checkpoints) != checkpointed:
            assert mm2.poll() is None, f"MM2 exited: {(tmp_path / 'mm2.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, (
                f"MM2 never committed every partition and checkpointed the group on both: {mm2_checkpoints}"
            )
            time.sleep(1)
            mm2_checkpoints = mm2_translate(dst.client, "primary", [group], tmp_path, before_checkpoints=True)

        # While MM2 runs (members in its Connect group, fresh heartbeats), adopting is refused.
        assert cli_main(["adopt", "--config", str(config_file), "--flow", "primary->dr"]) == 1
        err = capsys.readouterr().err
        assert "its Connect group 'primary-mm2' on 'dr' has 1 member(s)" in err
        assert "its heartbeat primary->dr reached 'heartbeats'" in err
        wait_until(written_past_its_commit, "MM2 to write past its last committed position on every partition")
        os.killpg(mm2.pid, signal.SIGKILL)  # mid-stream, between two of its offset commits
        mm2.wait(30)
        stopped_at = _ends(dst, "primary.")  # where MM2 stopped writing
        wait_until(
            lambda: all(_ends(src, "")[(t.removeprefix("primary."), p)] > n for (t, p), n in stopped_at.items()),
            "records on every source partition past where MM2 stopped",
        )
    finally:
        stop.set()
        producer.join(60)
        if mm2.poll() is None:
            os.killpg(mm2.pid, signal.SIGKILL)
            mm2.wait(30)
        log.close()
    committed_by_mm2 = mm2_committed(config, offsets_topic)

    # A flow whose naming is not MM2's is refused, naming the setting.
    assert cli_main(["adopt", "--config", str(identity_file), "--flow", "primary->dr"]) == 1
    assert "flows[0].replication_policy is 'identity'" in capsys.readouterr().err

    quiet = wait_until(
        lambda: not running_refusals(config, config.flows[0], 3, "primary-mm2"),
        "MM2's member to leave its Connect group (session timeout) and its heartbeats to be 3 s old",
    )
    with capsys.disabled():
        print(f"\nMM2 killed: {quiet:.1f} s more until its member left and its heartbeats went quiet")
    assert cli_main(["adopt", "--config", str(config_file), "--flow", "primary->dr", "--heartbeat-quiet-s", "3"]) == 0
    adopted = capsys.readouterr().out
    with capsys.disabled():
        print(f"\n{adopted}", end="")
    # MM2's syncs were found where offset-syncs.topic.location=target put them: each partition has its history.
    history = [int(line.split()[-1]) for line in adopted.splitlines() if line.startswith(tuple(TOPICS))]
    assert len(history) == 4 and min(history) > 1, adopted
    # The group moves on, after the switch: on orders[0] into what MM2 copied, on orders[1] into what it did not.
    after = {0: committed_by_mm2[("orders", 0)] - 5, 1: produced[("orders", 1)] - 50}
    commit(src.client, group, "orders", after)
    Mirror(spark, config).run_available_now()

    duplicates, bound = _copies_check(src, dst, produced, stopped_at, committed_by_mm2)
    with capsys.disabled():
        print(f"adopted from MM2: {duplicates} duplicates (MM2 wrote {bound} records it had not committed)")
    assert duplicates <= bound

    # RemoteClusterUtils reads the group's checkpoints on; a failover resumes it without skipping a record.
    translated = mm2_translate(dst.client, "primary", [group], tmp_path)
    assert set(translated) == set(mm2_checkpoints) == checkpointed
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr", "--dry-run"]) == 0
    plan = {}
    for line in capsys.readouterr().out.splitlines()[1:]:
        _, topic, partition, source_offset, target_offset, reread, _note = line.split()
        plan[int(partition)] = (int(source_offset), int(target_offset), int(reread))
    assert {p: plan[p][0] for p in plan} == after
    assert {(group, "primary.orders", p): plan[p][1] for p in plan} == translated
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr"]) == 0
    for p, (source_offset, target_offset, reread) in plan.items():
        resumed = values_from(dst.client, "primary.orders", p, target_offset)
        next_unread = f"orders/{p}/{source_offset}".encode()
        assert next_unread in resumed, f"orders[{p}]: the group would skip {next_unread!r}"
        with capsys.disabled():
            print(f"orders[{p}]: resumes at {target_offset}, re-reads {resumed.index(next_unread)} (plan: {reread})")
        assert resumed.index(next_unread) <= reread <= 100  # MM2's offset.lag.max: its syncs' spacing at most
    got = clients.consumer(dst.client, group).committed([TopicPartition("primary.orders", p) for p in plan], timeout=30)
    assert {tp.partition: tp.offset for tp in got} == {p: plan[p][1] for p in plan}

    # Hand the flow back to MM2, which then copies only what the mirror had not.
    handed = dict(produced)  # the mirror copied every record produced so far
    for (topic, partition), start in handed.items():
        produce(src.client, topic, [Record(partition, None, f"{topic}/{partition}/{i}".encode())
                                    for i in range(start, start + 40)])  # fmt: skip
        produced[(topic, partition)] = start + 40
    handback = ["handback", "--config", str(config_file), "--flow", "primary->dr", "--heartbeat-quiet-s", "3",
                "--mm2-offset-syncs-location", "target"]  # fmt: skip
    assert cli_main(handback) == 0
    printed = capsys.readouterr().out
    with capsys.disabled():
        print(printed, end="")
    starts = {(line.split()[0], int(line.split()[1])): int(line.split()[2])
              for line in printed.splitlines() if line.startswith(tuple(TOPICS))}  # fmt: skip
    assert starts == handed
    log = (tmp_path / "mm2-again.log").open("wb")
    mm2 = subprocess.Popen(
        mm2_command("primary", src.client.bootstrap_servers, "dr", dst.client.bootstrap_servers, list(TOPICS), tmp_path,
                    MM2_SETTINGS),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        # On orders[1] the group is at the mirror's last record, on orders[0] in what MM2 copies now.
        moved = {0: produced[("orders", 0)] - 10, 1: handed[("orders", 1)]}
        commit(src.client, group, "orders", moved)
        expected = {(f"primary.{t}", p): n + stopped_at[(f"primary.{t}", p)] - committed_by_mm2[(t, p)] - 1
                    for (t, p), n in produced.items()}  # fmt: skip
        deadline = time.monotonic() + 90
        while True:  # until MM2 copied the rest and checkpointed the group where it moved
            assert mm2.poll() is None, f"MM2 exited: {(tmp_path / 'mm2-again.log').read_text()[-3000:]}"
            resumed_at = mm2_translate(dst.client, "primary", [group], tmp_path)
            ends = _ends(dst, "primary.")
            if ends == expected and all(resumed_at.get(key) != offset for key, offset in translated.items()):
                break
            assert time.monotonic() < deadline, f"MM2 copied {ends} of {expected}; checkpoints {resumed_at}"
            time.sleep(1)
        # Handing back while MM2 runs is refused, and so is a flow the mirror never ran.
        never_ran = json.loads(json.dumps(raw))
        never_ran["flows"][0]["checkpoint_location"] = str(tmp_path / "never")
        (tmp_path / "never.json").write_text(json.dumps(never_ran))
        assert cli_main(["handback", "--config", str(tmp_path / "never.json"), "--flow", "primary->dr"]) == 1
        err = capsys.readouterr().err
        assert "its Connect group 'primary-mm2' on 'dr' has 1 member(s)" in err
        assert f"flow primary->dr has no positions in {tmp_path / 'never'}" in err
    finally:
        os.killpg(mm2.pid, signal.SIGKILL)
        mm2.wait(30)
        log.close()
    assert _copies_check(src, dst, produced, stopped_at, committed_by_mm2) == (duplicates, bound)
    for p, source_offset in moved.items():
        target_offset = resumed_at[(group, "primary.orders", p)]
        resumed = values_from(dst.client, "primary.orders", p, target_offset)
        next_unread = f"orders/{p}/{source_offset}".encode()
        assert next_unread in resumed, f"orders[{p}]: MM2's checkpoint would skip {next_unread!r}"
        with capsys.disabled():
            print(f"after handback, orders[{p}]: MM2 resumes the group at {target_offset}, re-reads"
                  f" {resumed.index(next_unread)}")  # fmt: skip
        assert resumed.index(next_unread) <= (0 if p == 1 else 100)


def _copies_check(src, dst, produced, stopped_at, committed_by_mm2) -> tuple[int, int]:
    """Each target partition is MM2's prefix then the source from MM2's committed position on, in order, nothing
    missing; returns the duplicates and their bound (what MM2 wrote but had not committed)."""
    duplicates = bound = 0
    for topic in TOPICS:
        source = by_partition(read_all(src.client, topic, sum(n for (t, _), n in produced.items() if t == topic)))
        on_target = by_partition(read_all(dst.client, f"primary.{topic}", 0, exact=False))
        for p in range(TOPICS[topic]):
            src_values = [r.value for r in source[p]]
            dst_values = [r.value for r in on_target[p]]
            m, k = stopped_at[(f"primary.{topic}", p)], committed_by_mm2[(topic, p)] + 1
            assert k <= m, (topic, p, "MM2 committed a position it had not written")
            assert dst_values == src_values[:m] + src_values[k:], (topic, p, "a record is missing or out of order")
            duplicates += len(dst_values) - len(src_values)
            bound += m - k
    return duplicates, bound


def _ends(cluster, prefix: str) -> dict[tuple[str, int], int]:
    admin = clients.admin(cluster.admin)
    wanted = {TopicPartition(f"{prefix}{t}", p): OffsetSpec.latest() for t, n in TOPICS.items() for p in range(n)}
    return {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(wanted).items()}


def _unreached_config(tmp_path, location: str) -> str:
    """A config whose clusters are never reached: the verb refuses before it connects."""
    raw = {
        "clusters": [
            {"alias": "primary", "bootstrap_servers": "127.0.0.1:1", "profile": "kafka"},
            {"alias": "dr", "bootstrap_servers": "127.0.0.1:2", "profile": "kafka"},
        ],
        "flows": [
            {"source": "primary", "target": "dr", "topics": {"include": ["orders"]}, "checkpoint_location": location}
        ],
    }
    path = tmp_path / "mirror.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("verb", ["adopt", "handback"])
@pytest.mark.parametrize("location", ["/checkpoints/primary-dr", "s3a://bucket/checkpoints/primary-dr"])
def test_adopt_and_handback_refuse_in_the_toolbox_where_the_flows_checkpoint_is_not_mounted(
    tmp_path, capsys, monkeypatch, verb, location
):
    """The toolbox pod mounts no checkpoint volume and has no Spark settings for object storage: there the verbs
    that read and write the flow's state refuse, naming the location and where to run them, instead of writing the
    state into the pod's own file system (or failing on it) or reading none and calling the flow never run."""
    monkeypatch.setenv(TOOLBOX_MARK, "1")
    assert cli_main([verb, "--config", _unreached_config(tmp_path, location), "--flow", "primary->dr"]) == 1
    out = capsys.readouterr()
    said = out.out + out.err
    assert f"checkpoint_location {location}, which this toolbox pod does not mount" in said, said
    assert "docs/operations/adopt.md" in said, said


def test_adopt_in_a_toolbox_run_that_mounts_the_checkpoint_goes_on_to_the_clusters(tmp_path, monkeypatch):
    """A toolbox Job that mounts the mirror's checkpoint volume (docs/operations/adopt.md) is not refused for it."""
    monkeypatch.setenv(TOOLBOX_MARK, "1")
    config = parse_config(json.loads(Path(_unreached_config(tmp_path, str(tmp_path / "ckpt"))).read_text()))
    assert unreached_checkpoint(config.flows[0], "adopt") == []
    monkeypatch.delenv(TOOLBOX_MARK)
    elsewhere = parse_config(json.loads(Path(_unreached_config(tmp_path, "/nowhere/ckpt")).read_text()))
    assert unreached_checkpoint(elsewhere.flows[0], "adopt") == []  # outside the toolbox: not its concern
