"""`mirrorkit failover` and `failback` as operators run them: after a failover and writes on DR, the groups go back to
the primary where docs/operations/failback.md says, and it refuses while consumers still run on DR or a flow still
lags; what either moved, the mirror's group sync leaves alone."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import KafkaError, TopicPartition

from bench.testbed import clients
from bench.testbed.clients import Record, commit, committed, create_topics, produce
from bench.testbed.kafka_cluster import cluster_entry
from bench.testbed.ports import free_port
from spark_app.cli import main as cli_main
from spark_app.config import ClusterConfig, parse_config
from spark_app.dr.formats import Checkpoint
from spark_app.dr.groups import ClusterGroups, Committed
from spark_app.dr.lease import DrLease
from spark_app.mirror import Mirror
from spark_app.policy import checkpoints_topic


@pytest.fixture(scope="module")
def pair(testbed):
    """A primary and a DR cluster of their own: both flows run both ways on them."""
    yield testbed.start("fb-primary", "plaintext"), testbed.start("fb-dr", "plaintext")
    testbed.retire("fb-primary")
    testbed.retire("fb-dr")


def resume(cluster: ClusterConfig, group: str, topics: list[str]) -> dict[str, list[bytes]]:
    """What the group reads, per topic, from where it stands until every partition is at its end."""
    consumer = clients.consumer(
        cluster, group, {"enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True}
    )
    consumer.subscribe(topics)
    read: dict[str, list[bytes]] = {t: [] for t in topics}
    at_end: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 60
    while len(at_end) < 2 * len(topics) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error() is not None:
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            at_end.add((msg.topic(), msg.partition()))
            continue
        at_end.discard((msg.topic(), msg.partition()))
        read[msg.topic()].append(msg.value())
    consumer.close()
    assert len(at_end) == 2 * len(topics), "the group never reached the end of its topics"
    return read


def actions(out: str) -> set[tuple[str, str, str, int, int, str]]:
    """The (move, group, topic, partition, offset, what) rows `failback` printed."""
    rows = set()
    for line in out.splitlines()[1:]:
        move, group, topic, partition, offset, done = line.split(maxsplit=5)
        rows.add((move, group, topic, int(partition), int(offset), done))
    return rows


def test_failback_moves_groups_to_the_primary_and_refuses_live_consumers_and_lag(spark, pair, tmp_path, unique, capsys):
    primary, dr = pair
    p, d = f"p{unique[-6:]}", f"d{unique[-6:]}"
    topic, group, live_group = f"orders-{unique}", f"app-{unique}", f"live-{unique}"
    dropped, deleted = f"dropped-{unique}", f"deleted-{unique}"  # mirrored once, then left out of include / deleted
    flows = [
        {"source": src, "target": dst, "topics": {"include": [topic]}, "groups": {"include": [f".*-{unique}"]},
         "checkpoint_location": str(tmp_path / f"ckpt-{src}")}
        for src, dst in ((p, d), (d, p))
    ]  # fmt: skip
    raw = {
        "clusters": [cluster_entry(primary, p), cluster_entry(dr, d)],
        "flows": flows,
        "checkpoint_interval_s": 1,
        "metrics_port": free_port(),
    }
    forward_only = parse_config(raw | {"flows": flows[:1]})
    # The reverse flow still names the topic deleted on DR below: that must read as no topic, not as a source down.
    both = parse_config(raw | {"flows": [flows[0], flows[1] | {"topics": {"include": [topic, deleted]}}]})
    earlier = parse_config(raw | {"flows": [flows[0], flows[1] | {"topics": {"include": [topic, dropped, deleted]}}]})
    config_file = tmp_path / "failback.json"
    config_file.write_text(json.dumps(both.model_dump(mode="json")))
    failback = ["failback", "--config", str(config_file), "--flow", f"{d}->{p}"]

    # Before the outage: 100 records on the primary, the group read 30 of each partition's 50; all mirrored.
    create_topics(primary.admin, {topic: 2})
    create_topics(dr.admin, {topic: 2, dropped: 1, deleted: 1})
    for name in (dropped, deleted):
        produce(dr.client, name, [Record(0, None, b"x")] * 3)
    produce(primary.client, topic, [Record(i % 2, None, f"p-{i}".encode()) for i in range(100)])
    commit(primary.client, group, topic, {0: 30, 1: 30})
    Mirror(spark, forward_only).run_available_now()
    # Failover; on DR the group reads the rest of the primary's copy, and part of what producers write on DR.
    assert cli_main(["failover", "--config", str(config_file), "--flow", f"{p}->{d}"]) == 0
    assert committed(dr.client, group, f"{p}.{topic}", 2) == {0: 30, 1: 30}
    produce(dr.client, topic, [Record(i % 2, None, f"d-{i}".encode()) for i in range(40)])
    commit(dr.client, group, f"{p}.{topic}", {0: 50, 1: 50})
    commit(dr.client, group, topic, {0: 15, 1: 12})
    capsys.readouterr()

    # The reverse flow has not run: what was written on DR is not on the primary yet.
    assert cli_main(failback) == 1
    err = capsys.readouterr().err
    assert f"flow {d}->{p}: {topic}[0] has 20 record(s), none mirrored yet" in err, err

    # A consumer still runs on DR.
    live = clients.consumer(dr.client, live_group, {"enable.auto.commit": False})
    live.subscribe([topic])
    deadline = time.monotonic() + 60
    while not live.assignment() and time.monotonic() < deadline:
        live.poll(0.5)
    try:
        Mirror(spark, earlier).run_available_now()
        assert cli_main(failback) == 1
        err = capsys.readouterr().err
        assert f"consumers still run on '{d}' in group(s) {live_group} (1 member(s))" in err, err
    finally:
        live.close()

    # The flow no longer selects one topic it mirrored, and another was deleted on DR: neither is lag, nor is the
    # deleted one a source that does not answer.
    produce(dr.client, dropped, [Record(0, None, b"y")] * 2)
    admin = clients.admin(dr.admin)  # held: the futures of a client already freed never complete
    admin.delete_topics([deleted], operation_timeout=30)[deleted].result()
    # A producer on DR wrote after the reverse flow's last copy, in a transaction: its lag is not 0 (two records and
    # the commit marker per partition).
    transactional = clients.producer(dr.client, {"transactional.id": f"tx-{unique}"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    for i in range(4):
        transactional.produce(topic, value=f"d-late-{i}".encode(), partition=i % 2)
    transactional.commit_transaction(30)
    assert cli_main(failback) == 1
    err = capsys.readouterr().err
    assert f"flow {d}->{p}: {topic}[0] lag 3" in err and f"flow {d}->{p}: {topic}[1] lag 3" in err, err
    assert dropped not in err and deleted not in err and "does not answer" not in err, err
    # --force goes past the lag, and says what it went past (a dry run: nothing moves yet).
    assert cli_main([*failback, "--force", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "forced past: lag is not 0" in out and f"{topic}[0] lag 3" in out, out
    assert committed(primary.client, group, topic, 2) == {0: 30, 1: 30}

    # Mirrored: each partition now ends in a commit marker the mirror cannot copy, which is no lag.
    Mirror(spark, both).run_available_now()
    assert cli_main(["status", "--config", str(config_file), "--json"]) == 0
    reverse = json.loads(capsys.readouterr().out)["flows"][1]
    assert reverse["source_reachable"] and {(s["topic"], s["lag"]) for s in reverse["partitions"]} == {(topic, 0)}
    # A consumer on DR stopped before the end of the primary's copy: at the end on the primary, it would skip.
    commit(dr.client, group, f"{p}.{topic}", {1: 49})
    assert cli_main(failback) == 1
    err = capsys.readouterr().err
    assert f"{group} {p}.{topic}[1] at 49 of 50" in err, err
    commit(dr.client, group, f"{p}.{topic}", {1: 50})

    assert cli_main([*failback, "--dry-run"]) == 0
    planned = actions(capsys.readouterr().out)
    assert planned == {
        ("where-stopped", group, f"{d}.{topic}", 0, 15, "would commit"),
        ("where-stopped", group, f"{d}.{topic}", 1, 12, "would commit"),
        ("at-end", group, topic, 0, 50, "would commit"),
        ("at-end", group, topic, 1, 50, "would commit"),
    }
    assert committed(primary.client, group, f"{d}.{topic}", 2) == {}
    assert committed(primary.client, group, topic, 2) == {0: 30, 1: 30}

    assert cli_main(failback) == 0
    assert actions(capsys.readouterr().out) == {(*a[:5], "commit") for a in planned}
    # On the primary's copy of what was written on DR, where the group stopped on DR; at the end of
    # the original topic, which it consumed through DR.
    assert committed(primary.client, group, f"{d}.{topic}", 2) == {0: 15, 1: 12}
    assert committed(primary.client, group, topic, 2) == {0: 50, 1: 50}
    # Every record in its place: the group reads on the primary exactly what it had not read on DR, and nothing of
    # the original topic again.
    read = resume(primary.client, group, [topic, f"{d}.{topic}"])
    assert read[topic] == []
    unread = [f"d-{i}".encode() for i in range(40) if i // 2 >= (15 if i % 2 == 0 else 12)]
    unread += [f"d-late-{i}".encode() for i in range(4)]
    assert sorted(read[f"{d}.{topic}"]) == sorted(unread)
    # The live group was never touched on the primary, and running it again moves nothing back.
    assert committed(primary.client, live_group, topic, 2) == {}
    assert cli_main(failback) == 0
    assert actions(capsys.readouterr().out) == {(*a[:5], "keep") for a in planned}
    # What failback committed carries its mark, so the reverse flow's group sync leaves the group alone there.
    on_primary = ClusterGroups(both.cluster(p))
    assert {c.metadata for c in on_primary.committed(group).values()} == {f"mirrorkit:failback {d}->{p}"}
    assert on_primary.commit(group, {(f"{d}.{topic}", 0): 20}).left is not None
    assert committed(primary.client, group, f"{d}.{topic}", 2) == {0: 15, 1: 12}


def test_failback_under_identity_puts_groups_at_the_end_of_the_one_topic(spark, pair, tmp_path, unique, capsys):
    """Identity both ways: the records written on DR go back into the same topic on the primary, and the primary's
    own records, back on it from DR, are dropped (their tail is no lag). The group drained DR, so failback puts it
    at the end of the topic on the primary, with nothing to re-read or skip."""
    primary, dr = pair
    p, d = f"p{unique[-6:]}", f"d{unique[-6:]}"
    topic, group = f"orders-{unique}", f"app-{unique}"
    flows = [
        {"source": src, "target": dst, "topics": {"include": [topic]}, "groups": {"include": [f".*-{unique}"]},
         "replication_policy": "identity", "checkpoint_location": str(tmp_path / f"ckpt-{src}")}
        for src, dst in ((p, d), (d, p))
    ]  # fmt: skip
    raw = {"clusters": [cluster_entry(primary, p), cluster_entry(dr, d)], "flows": flows, "metrics_port": free_port()}
    both = parse_config(raw)
    config_file = tmp_path / "failback.json"
    config_file.write_text(json.dumps(both.model_dump(mode="json")))

    create_topics(primary.admin, {topic: 2})
    produce(primary.client, topic, [Record(i % 2, None, f"p-{i}".encode()) for i in range(100)])
    commit(primary.client, group, topic, {0: 30, 1: 30})
    Mirror(spark, parse_config(raw | {"flows": flows[:1]})).run_available_now()
    assert cli_main(["failover", "--config", str(config_file), "--flow", f"{p}->{d}"]) == 0
    assert committed(dr.client, group, topic, 2) == {0: 30, 1: 30}
    produce(dr.client, topic, [Record(i % 2, None, f"d-{i}".encode()) for i in range(40)])
    commit(dr.client, group, topic, {0: 70, 1: 70})  # it read everything on DR
    Mirror(spark, both).run_available_now()
    capsys.readouterr()

    assert cli_main(["failback", "--config", str(config_file), "--flow", f"{d}->{p}"]) == 0
    assert actions(capsys.readouterr().out) == {("at-end", group, topic, q, 70, "commit") for q in (0, 1)}
    assert committed(primary.client, group, topic, 2) == {0: 70, 1: 70}
    assert resume(primary.client, group, [topic]) == {topic: []}


def test_failover_clamps_to_the_log_start_and_marks_groups_so_group_sync_leaves_them_alone(pair, tmp_path, unique,
                                                                                          capsys):  # fmt: skip
    """No Spark: checkpoints as the mirror writes them, on a DR copy whose oldest records retention deleted. The
    failover resumes such a partition at its log start and says so; every partition it commits carries its mark,
    and group sync (the same commit, unmarked) then leaves the group alone until a consumer's commits clear it."""
    primary, dr = pair
    p, d = f"p{unique[-6:]}", f"d{unique[-6:]}"
    topic, group = f"orders-{unique}", f"app-{unique}"
    remote = f"{p}.{topic}"
    config = parse_config(
        {
            "clusters": [cluster_entry(primary, p), cluster_entry(dr, d)],
            "flows": [{"source": p, "target": d, "topics": {"include": [topic]}, "sync_group_offsets": True,
                       "groups": {"include": [f".*-{unique}"]}, "checkpoint_location": str(tmp_path / "ckpt")}],
        }
    )  # fmt: skip
    flow = config.flows[0]
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    create_topics(dr.admin, {remote: 2, checkpoints_topic(flow): 1})
    produce(dr.client, remote, [Record(i % 2, None, str(i).encode()) for i in range(20)])
    admin = clients.admin(dr.admin)  # held: the futures of a client already freed never complete
    for future in admin.delete_records([TopicPartition(remote, 0, 6)], request_timeout=30).values():
        future.result()
    checkpoints = [Checkpoint(group, remote, 0, 40, 3), Checkpoint(group, remote, 1, 40, 4)]
    produce(dr.client, checkpoints_topic(flow), [Record(0, cp.key(), cp.value()) for cp in checkpoints])
    failover = ["failover", "--config", str(config_file), "--flow", f"{p}->{d}"]

    assert cli_main([*failover, "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(line.split()[2:]) for line in out.splitlines()[1:3]}
    assert rows == {("0", "40", "6", "?", "log-start(translated-3)"), ("1", "40", "4", "?", "-")}, out
    assert "1 row(s) resume at the target partition's log start" in out, out

    # A mirror of the flow still runs (it holds the flow's DR lease): the failover refuses, naming it; forced, it
    # fences that mirror first and says so.
    running = DrLease(config.cluster(d), flow)
    running.acquire()
    try:
        assert cli_main(failover) == 1
        assert f"the mirror of flow {p}->{d} still runs" in capsys.readouterr().err
        assert ClusterGroups(config.cluster(d)).committed(group) == {}
        assert cli_main([*failover, "--force"]) == 0
        assert f"forced past: the mirror of flow {p}->{d} still runs" in capsys.readouterr().out
        assert not running.held() and running.fenced is not None
    finally:
        running.release()
    on_dr = ClusterGroups(config.cluster(d))
    moved = f"mirrorkit:failover {p}->{d}"
    assert on_dr.committed(group) == {(remote, 0): Committed(6, moved), (remote, 1): Committed(4, moved)}
    # The running mirror's group sync would move it on; it leaves a group a failover moved alone.
    synced = on_dr.commit(group, {(remote, 0): 9, (remote, 1): 9})
    assert synced.left is not None and moved in synced.left and not synced.committed
    assert {tp: c.offset for tp, c in on_dr.committed(group).items()} == {(remote, 0): 6, (remote, 1): 4}
    # Run again (the fence released the lease it took), the failover keeps what is there and marks it still.
    assert cli_main(failover) == 0
    assert f"kept {group} {remote}[0] = 6" in capsys.readouterr().out
    assert {c.metadata for c in on_dr.committed(group).values()} == {moved}
    # The group's consumers commit on DR (here, as `--reset-offsets --to-current` would): the mark is gone, and
    # group sync moves the group again.
    commit(dr.client, group, remote, {0: 6, 1: 4})
    assert on_dr.commit(group, {(remote, 0): 9, (remote, 1): 9}).committed == {(remote, 0): 9, (remote, 1): 9}
