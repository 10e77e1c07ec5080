"""The compiled copy core against the Python loop it replaces: the same generated input, copied by each, gives the
same target records, the same dead letters and the same landings.

Both copy through the throughput copy (`RangeCopier`) on real brokers, from the SCRAM source into the
`$ConnectionString` target (so the compiled core's clients log in with both profiles), without Spark; only the flow's
`copy_core` differs. The input has keys and null keys, tombstones, duplicate, binary and null-valued headers,
timestamps old and new, echoes of the target's own records and a third cluster's stamps (identity policy), a record
over the target's cap (dead-lettered), a record the target topic would refuse (its partition held), and a range that
ends in transaction markers with an aborted transaction inside it. A fourth topic (`_odd`) comes from a source topic
that stamps its broker's append time (replication latency must be timed alike), carries a provenance value whose
offset is 20 digits (no stamp of ours: copied, not dropped, by every core), and a record with headers that only the
target broker refuses for its size (dead-lettered from a delivery report, with the record's headers). A third
profile, mTLS, has a test of its own.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import pytest
from confluent_kafka import KafkaException, TopicPartition

import spark_app.range_copy
import spark_app.realtime.task
from bench.testbed import clients as testbed_clients
from bench.testbed.clients import Record, by_partition, create_topics, end_offsets, produce, read_all
from bench.testbed.kafka_cluster import ListenerKind
from spark_app.config import ClusterConfig, FlowConfig, FlowMode, TopicSelection
from spark_app.copy_wing.choice import Core
from spark_app.policy import PROVENANCE_HEADER, positions_group
from spark_app.range_copy import RangeCopier
from spark_app.ranges import Landing, OffsetRange
from spark_app.realtime.task import Assignment, CopierTask, LiveCopy
from spark_app.topics import TargetRule, TargetRules
from tests.support.report_channel import AvailableNowDriver

CAP = 10_000  # the target topics' max.message.bytes
PER_PARTITION = 400


def _generated(rng: random.Random, target_alias: str, now_ms: int) -> list[Record]:
    """Two partitions of varied records; the last of partition 1 is over the target's cap."""
    out: list[Record] = []
    for i in range(2 * PER_PARTITION):
        partition = i % 2
        key = None if rng.random() < 0.15 else rng.randbytes(rng.randint(0, 40))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 600))
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            name = rng.choice(("trace", "trace", "bin", "empty"))  # duplicates kept in order
            headers.append((name, None if name == "empty" else rng.randbytes(rng.randint(0, 12))))
        if i % 7 == 3:  # the target's own record come back: an echo, dropped
            headers.append((PROVENANCE_HEADER, f"{target_alias}:{rng.randint(0, 10_000)}".encode()))
        elif i % 11 == 5:  # a third cluster's record: kept, not stamped again
            headers.append((PROVENANCE_HEADER, b"elsewhere:17"))
        out.append(Record(partition, key, value, tuple(headers), now_ms - rng.randint(0, 86_400_000)))
    out.append(Record(1, b"big", b"x" * (2 * CAP), (("trace", b"t"),), now_ms))
    return out


# The `_odd` topic's target takes records up to half the cap the flow's rules say (changed after topic sync): a
# record between the two is sent, and refused by the broker in its delivery report.
ODD_CAP = CAP // 2
TWENTY_DIGITS = "9" * 20  # past the largest 64-bit offset


def _odd(target_alias: str, now_ms: int) -> list[Record]:
    """Partition 0: records from an append-time source topic, one with a 20-digit provenance offset that names the
    target; partition 1: one record over ODD_CAP, with duplicate and null-valued headers, alone in its partition so
    that no other record shares its refused batch."""
    small = [Record(0, f"k{i}".encode(), f"v{i}".encode(), (("n", str(i).encode()),), now_ms - 1000) for i in range(30)]
    small[7] = replace(small[7], headers=((PROVENANCE_HEADER, f"{target_alias}:{TWENTY_DIGITS}".encode()),))
    headers = (("trace", b"t"), ("dup", b"1"), ("dup", None), ("dup", b"2"))
    return [*small, Record(1, b"odd-big", b"y" * (3 * CAP // 4), headers, now_ms)]


def _transactional(source, topic: str, unique: str, now_ms: int) -> None:
    """60 committed records, then 10 aborted, then 20 committed: the range ends in a commit marker."""
    producer = testbed_clients.producer(source.admin, {"transactional.id": f"gen-{unique}-{topic}"})
    producer.init_transactions(30)
    for count, commit in ((60, True), (10, False), (20, True)):
        producer.begin_transaction()
        for i in range(count):
            producer.produce(
                topic, key=f"k{i}".encode(), value=f"v{i}-{commit}".encode(), partition=0, timestamp=now_ms
            )
        producer.flush(30)  # so the aborted ones are in the log, not purged before they were sent
        (producer.commit_transaction if commit else producer.abort_transaction)(30)


@pytest.mark.parametrize("seed", [7])
def test_the_compiled_core_writes_and_accounts_exactly_what_the_python_loop_does(
    source_cluster, target_cluster, unique, tmp_path, monkeypatch, seed
):
    source, target = source_cluster, target_cluster
    rng = random.Random(seed)
    now_ms = int(time.time() * 1000)
    records = _generated(rng, target.client.alias, now_ms)
    refusing = [Record(0, None if i == 5 else f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(10)]

    used, by_core = _spy_on_the_core(monkeypatch)

    results: dict[str, tuple[list[list[Record]], list[Record], list[dict]]] = {}
    c_end = 0
    for core in ("python", "compiled"):
        flow, rules, ends = _inputs(source, target, core, unique, tmp_path, records, refusing, now_ms)
        a, b, c, d = flow.topics.include
        copier = RangeCopier(flow, source.client, target.client, None, rules)
        c_end = ends[(c, 0)]
        landings: list[Landing] = []
        for task in ([(a, 0), (a, 1)], [(b, 0)], [(c, 0)], [(d, 0), (d, 1)]):  # one task each, as Spark hands them
            landings += copier.copy([OffsetRange(t, p, 0, ends[(t, p)]) for t, p in task])
        written = sum(x.records for x in landings)
        # A record the target refused after it was sent counts as sent and as dead-lettered.
        copied = [read_all(target.admin, t, _landed(landings, t)) for t in (a, b, c, d)]
        assert sum(map(len, copied)) == written - sum(x.dead_lettered for x in landings)
        _kept_append_times(source, d, copied[3])
        rows = [_comparable(x) for x in landings]
        results[core] = (copied, read_all(target.admin, flow.dead_letter_topic or "", 2), rows)

    assert used == [True, True, True, True], "the compiled core copied every task of its flow, the Python loop none"
    python, compiled_ = results["python"], results["compiled"]
    assert by_core[0] >= 0.9 * sum(row["records"] for row in compiled_[2]), "the core did the work, not its fallback"
    for role, got, want in zip("abcd", compiled_[0], python[0], strict=True):
        assert _whole(got, role) == _whole(want, role)
    assert sorted(map(_dead_letter, compiled_[1])) == sorted(map(_dead_letter, python[1])), "the same dead letters"
    assert compiled_[2] == python[2], "the same landings"

    # And the reference itself did what the input asks, so the two cannot agree on a wrong answer.
    rows = {(row["topic"], row["partition"]): row for row in python[2]}
    echo = f"{target.client.alias}:".encode()
    echoes = sum(1 for r in records if any(v and v.startswith(echo) for _, v in r.headers))
    assert rows[("a", 0)]["dropped"] + rows[("a", 1)]["dropped"] == echoes
    assert rows[("a", 1)]["dead_lettered"] == 1 and rows[("a", 1)]["held_from"] == -1
    assert rows[("a", 0)]["records"] + rows[("a", 1)]["records"] == len(records) - echoes
    assert (rows[("b", 0)]["held_from"], rows[("b", 0)]["records"]) == (5, 5), "held at the null key, none past it"
    assert rows[("c", 0)]["records"] == 80 and rows[("c", 0)]["end_offset"] == c_end, "aborted ones skipped"
    stamped = python[0][0]
    assert all(r.headers[-1][0] == PROVENANCE_HEADER for r in stamped), "each record says where it came from"
    _odd_ones_as_the_contract_says(rows, python[0][3], python[1])


def test_exactly_once_the_compiled_core_commits_what_the_python_loop_does(
    source_cluster, target_cluster, unique, tmp_path, monkeypatch
):
    """Throughput exactly once: each core writes the slot's transactions, the compiled one until its first event
    (the record over the cap, the null key the compacted topic refuses, the record only the broker refuses), where it
    hands the slot to the Python loop. The same input gives a read_committed reader the same records in each
    partition's order, the same dead letters, the same landings (but where their records landed: aborted attempts
    and commit markers take target offsets of their own) and the same committed positions."""
    source, target = source_cluster, target_cluster
    rng = random.Random(11)
    now_ms = int(time.time() * 1000)
    records = _generated(rng, target.client.alias, now_ms)
    refusing = [Record(0, None if i == 5 else f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(10)]
    by_core = [0]
    compiled = spark_app.range_copy.copy_with

    def spy(copier, flow, source, target, cursors, *rest, **bounds):
        before = sum(c.landing.records for c in cursors.values())
        taken = compiled(copier, flow, source, target, cursors, *rest, **bounds)
        by_core[0] += sum(c.landing.records for c in cursors.values()) - before
        return taken

    monkeypatch.setattr(spark_app.range_copy, "copy_with", spy)
    results: dict[str, tuple[list[dict], list[tuple], list[dict], list[dict[int, int]]]] = {}
    for core in ("python", "compiled"):
        flow, rules, ends = _inputs(source, target, core, f"eo-{unique}", tmp_path, records, refusing, now_ms,
                                    exactly_once=True)  # fmt: skip
        a, b, c, d = topics = flow.topics.include
        copier = RangeCopier(flow, source.client, target.client, None, rules)
        landings: list[Landing] = []
        for task in ([(a, 0), (a, 1)], [(b, 0)], [(c, 0)], [(d, 0), (d, 1)]):  # one task each, as Spark hands them
            landings += copier.copy([OffsetRange(t, p, 0, ends[(t, p)]) for t, p in task])
        # A dead letter is written in place of its record, not after it was sent: it counts as dead-lettered alone.
        sent = {t: sum(x.records for x in landings if x.topic == t) for t in topics}
        copied = [_in_order(read_all(target.admin, t, sent[t]), role) for t, role in zip(topics, "abcd", strict=True)]
        positions = [_positions(target.admin, positions_group(flow), t) for t in topics]
        assert {p: o for p, (o, _) in positions[0].items()} == {0: ends[(a, 0)], 1: ends[(a, 1)]}, positions[0]
        assert all(json.loads(note)["gaps"] == [] for p, (_, note) in positions[0].items()), "notes a reader can read"
        rows = [_comparable(x) | {"runs": None, "last_target_offset": None} for x in landings]
        letters = map(_dead_letter, read_all(target.admin, flow.dead_letter_topic or "", 2))
        dead = sorted(_letter_anywhere(x) for x in letters)
        results[core] = (copied, dead, rows, positions)
        assert by_core[0] == 0 if core == "python" else by_core[0] > 0
    python, compiled_ = results["python"], results["compiled"]
    assert by_core[0] >= 0.5 * sum(row["records"] for row in compiled_[2]), "the core did the work, not its fallback"
    assert compiled_[0] == python[0], "the same records, in each partition's order"
    assert compiled_[1] == python[1], "the same dead letters"
    assert compiled_[2] == python[2], "the same landings"
    assert compiled_[3] == python[3], "the same committed positions"


def _letter_anywhere(letter: tuple) -> tuple:
    """A dead letter (`_dead_letter`) without its offset (aborted attempts take offsets too) and, for the append-time
    topic, without the source timestamp it names (each core's run has a source topic of its own)."""
    partition, _offset, *rest, headers = letter
    if (DLQ_TOPIC, b"d") in headers:
        headers = tuple(h for h in headers if h[0] != DLQ_TIMESTAMP)
    return (partition, *rest, headers)


DLQ_TOPIC, DLQ_TIMESTAMP = "mirrorkit.dlq.topic", "mirrorkit.dlq.timestamp"


def _positions(cluster, group: str, topic: str) -> dict[int, tuple[int, str | None]]:
    """Each partition's committed position in `group`, with its note as a reader reads it."""
    reader = testbed_clients.consumer(cluster, group, {"enable.auto.commit": False})
    try:
        got = reader.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
    finally:
        reader.close()
    return {tp.partition: (tp.offset, tp.metadata) for tp in got if tp.offset >= 0}


def _in_order(records: list[Record], role: str) -> dict[int, list[tuple]]:
    """Target records per partition in their order, without their offsets (and, as `_whole` says, without the
    append-time topic's timestamps)."""
    out: dict[int, list[tuple]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        whole = _bytes(r)[2:]
        out.setdefault(r.partition, []).append(whole[:-1] if role == "d" else whole)
    return out


def _whole(records: list[Record], role: str) -> list[tuple]:
    """Target records whole, sorted; those of the append-time topic without their timestamps: each core's run has a
    source topic of its own, stamped when it was loaded (`_kept_append_times` checks them against it)."""
    return sorted(_bytes(r)[:-1] if role == "d" else _bytes(r) for r in records)


def _kept_append_times(source, topic: str, copied: list[Record]) -> None:
    """Each record copied from the append-time topic has the timestamp its source broker stamped."""
    stamped = {r.key: r.timestamp_ms for r in read_all(source.admin, topic, len(_odd("", 0)))}
    assert copied and all(r.timestamp_ms == stamped[r.key] for r in copied)


def _odd_ones_as_the_contract_says(rows: dict[tuple[str, int], dict], copied: list[Record], dead: list[Record]) -> None:
    """The `_odd` topic's records as the reference copies them: each of partition 0 written and timed (the target
    kept its append-time timestamp), the 20-digit provenance value copied as it came, and the record the broker refused
    dead-lettered with its headers, in order and with duplicates, then the provenance stamp and the coordinates."""
    assert (rows[("d", 0)]["records"], rows[("d", 0)]["dropped"], rows[("d", 0)]["latency_counts"]) == (30, 0, 30)
    twenty = [r for r in copied if any(v and TWENTY_DIGITS.encode() in v for _, v in r.headers)]
    assert len(twenty) == 1 and len(twenty[0].headers) == 1, "copied with its own value, not stamped again"
    assert rows[("d", 1)]["dead_lettered"] == 1 and rows[("d", 1)]["held_from"] == -1
    letter = next(r for r in dead if r.key == b"odd-big")
    assert [h for h in letter.headers if not h[0].startswith(("mirrorkit.dlq.", PROVENANCE_HEADER))] == [
        ("trace", b"t"), ("dup", b"1"), ("dup", None), ("dup", b"2"),
    ]  # fmt: skip


def test_a_real_time_task_with_the_compiled_core_writes_and_reports_what_the_python_loop_does(
    source_cluster, target_cluster, unique, tmp_path, monkeypatch
):
    """The same input, copied in real time (`run --available-now`, one task per topic, as `LiveCopy` runs in a Spark
    task) into the Event Hubs-like target, whose slots write no transactions: the core copies until its first event
    (the record over the cap, the null key), then the Python loop goes on from there. The target records, the dead
    letter and what the reports add up to per partition are the Python loop's."""
    source, target = source_cluster, target_cluster
    rng = random.Random(11)
    now_ms = int(time.time() * 1000)
    records = _generated(rng, target.client.alias, now_ms)
    refusing = [Record(0, None if i == 5 else f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(10)]
    copies = _spy_on_live_copies(monkeypatch)

    results, python_consumers = {}, {}
    for core in ("python", "compiled"):
        flow, rules, ends = _inputs(source, target, core, unique, tmp_path, records, refusing, now_ms, realtime=True)
        task = CopierTask(flow, source.client, target.client, ("127.0.0.1", 9), b"unused", rules)
        reports, made_consumer = _run_slots(task, ends)
        python_consumers |= {(core, role): made for role, made in made_consumer.items()}
        copied = [read_all(target.admin, t, _landed_rows(reports, t)) for t in flow.topics.include or ()]
        _kept_append_times(source, (flow.topics.include or [])[3], copied[3])
        results[core] = (copied, read_all(target.admin, flow.dead_letter_topic or "", 2), _per_partition(reports))

    assert sum(n for n, _ in copies) >= 0.9 * len(records), "the core copied most records, not its fallback"
    assert sum(event for _, event in copies) == 3, "the core stopped at the records over the caps and at the null key"
    made = {role for (core, role), made in python_consumers.items() if core == "compiled" and made}
    assert made == {"a", "b", "d"}, "only a task whose core met an event makes the Python loop's consumer"
    python, compiled_ = results["python"], results["compiled"]
    for role, got, want in zip("abcd", compiled_[0], python[0], strict=True):
        assert _whole(got, role) == _whole(want, role)
    assert sorted(map(_dead_letter, compiled_[1])) == sorted(map(_dead_letter, python[1])), "the same dead letters"
    assert compiled_[2] == python[2], "the same reports, partition by partition"
    assert python[2][("b", 0)]["held_from"] == 5 and python[2][("a", 1)]["dead_lettered"] == 1
    _odd_ones_as_the_contract_says(python[2], python[0][3], python[1])


def test_a_real_time_slot_in_transactions_on_the_compiled_core_commits_what_the_python_loop_does(
    source_cluster, target_cluster, unique, tmp_path, monkeypatch
):
    """Real time, exactly once, with the compiled core writing the slot's transactions (`choose` gives it a slot whose
    cluster logs in with a token, which Kafka's Java clients cannot; here it is set on the task): it copies until its
    first event, the transaction that event fell in ends, and the Python loop's producer takes the slot, fencing the
    core's. A read_committed reader sees the same records in each partition's order, the same dead letters, the same
    reports and the same committed positions as from the Python loop alone."""
    source, target = source_cluster, target_cluster
    rng = random.Random(11)
    now_ms = int(time.time() * 1000)
    records = _generated(rng, target.client.alias, now_ms)
    refusing = [Record(0, None if i == 5 else f"k{i}".encode(), f"v{i}".encode(), (), now_ms) for i in range(10)]
    copies = _spy_on_live_copies(monkeypatch)

    results = {}
    for core in ("python", "compiled"):
        flow, rules, ends = _inputs(source, target, core, f"eo-{unique}", tmp_path, records, refusing, now_ms,
                                    realtime=True, exactly_once=True)  # fmt: skip
        task = CopierTask(flow, source.client, target.client, ("127.0.0.1", 9), b"unused", rules)
        task.core = Core.RUST if core == "compiled" else Core.PYTHON
        reports, _ = _run_slots(task, ends)
        topics = flow.topics.include or []
        # In a transaction a dead letter is written in place of its record, not after it was sent: counted alone.
        sent = {t: sum(row["records"] for row in reports if row["topic"] == t) for t in topics}
        copied = [_in_order(read_all(target.admin, t, sent[t]), role) for t, role in zip(topics, "abcd", strict=True)]
        positions = [_positions(target.admin, positions_group(flow), t) for t in topics]
        assert {p: o for p, (o, _) in positions[0].items()} == {0: ends[(topics[0], 0)], 1: ends[(topics[0], 1)]}
        letters = read_all(target.admin, flow.dead_letter_topic or "", 2)
        dead = sorted(_letter_anywhere(_dead_letter(x)) for x in letters)
        results[core] = (copied, dead, _per_partition(reports), positions)

    assert sum(n for n, _ in copies) >= 0.5 * len(records), "the core copied most records, not its fallback"
    assert sum(event for _, event in copies) == 3, "the core stopped at the records over the caps and at the null key"
    python, compiled_ = results["python"], results["compiled"]
    assert compiled_[0] == python[0], "the same records, in each partition's order"
    assert compiled_[1] == python[1], "the same dead letters"
    assert compiled_[2] == python[2], "the same reports, partition by partition"
    assert compiled_[3] == python[3], "the same committed positions"


def _spy_on_live_copies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """What each of a real-time task's copies with the compiled core returned: records taken, and whether it stopped
    at an event it leaves to the Python loop."""
    copies: list[tuple[int, bool]] = []
    copy_with = spark_app.realtime.task.copy_with
    monkeypatch.setattr(spark_app.realtime.task, "copy_with", lambda *a: copies.append(copy_with(*a)) or copies[-1])
    return copies


def _run_slots(task: CopierTask, ends: dict[tuple[str, int], int]) -> tuple[list[dict], dict[str, bool]]:
    """One available-now real-time task per topic of the task's flow, each from 0 to its partitions' ends, as
    `LiveCopy` runs in a Spark task: the rows they reported, and per topic (by role) whether it made the Python loop's
    consumer."""
    reports: list[dict] = []
    made_consumer: dict[str, bool] = {}
    for slot, topic in enumerate(task.flow.topics.include or ()):
        keys = [key for key in ends if key[0] == topic]
        conn = AvailableNowDriver()
        live = LiveCopy(task, Assignment(dict.fromkeys(keys, 0), {key: ends[key] for key in keys}), slot)
        live.run(conn)
        reports += conn.rows
        made_consumer[topic.split("-", 1)[0]] = live.consumer is not None
    return reports, made_consumer


def _per_partition(rows: list[dict]) -> dict[tuple[str, int], dict]:
    """What a task's reports add up to for each partition (topic named by role): records, drops and dead letters,
    how many were timed, where it ended and where it first held."""
    out: dict[tuple[str, int], dict] = {}
    for row in rows:
        key = (row["topic"].split("-", 1)[0], row["partition"])
        got = out.setdefault(key, {"records": 0, "dropped": 0, "dead_lettered": 0, "latency_counts": 0,
                                   "end_offset": 0, "held_from": -1})  # fmt: skip
        got["latency_counts"] += sum(row["latency_counts"])
        for name in ("records", "dropped", "dead_lettered"):
            got[name] += row[name]
        got["end_offset"] = max(got["end_offset"], row["end_offset"])
        if row["held_from"] >= 0 and got["held_from"] < 0:
            got["held_from"] = row["held_from"]
    return out


def _landed_rows(rows: list[dict], topic: str) -> int:
    return sum(row["records"] - row["dead_lettered"] for row in rows if row["topic"] == topic)


def _inputs(
    source, target, core: str, unique: str, tmp_path, records: list[Record], refusing: list[Record], now_ms: int,
    realtime: bool = False, exactly_once: bool = False,
) -> tuple[FlowConfig, TargetRules, dict[tuple[str, int], int]]:  # fmt: skip
    """Topics a, b, c and d of `core`'s run on both clusters, loaded (a: `records`, b: `refusing`, c: transactions,
    d: `_odd`), and its flow, the target's rules and each source partition's end."""
    a, b, c, d, dlq = (f"{name}-{core}-{'rt-' if realtime else ''}{unique}" for name in ("a", "b", "c", "d", "dlq"))
    create_topics(source.admin, {a: 2, b: 1, c: 1})
    create_topics(source.admin, {d: 2}, {"message.timestamp.type": "LogAppendTime"})
    create_topics(target.admin, {a: 2, c: 1, dlq: 1}, {"max.message.bytes": str(CAP)})
    create_topics(target.admin, {b: 1}, {"max.message.bytes": str(CAP), "cleanup.policy": "compact"})
    create_topics(target.admin, {d: 2}, {"max.message.bytes": str(ODD_CAP)})
    produce(source.admin, a, records)
    produce(source.admin, b, refusing)
    _transactional(source, c, f"{unique}-{realtime}", now_ms)
    produce(source.admin, d, _odd(target.client.alias, now_ms))
    flow = FlowConfig(
        source=source.client.alias, target=target.client.alias, topics=TopicSelection(include=[a, b, c, d]),
        checkpoint_location=str(tmp_path / f"{core}-{realtime}"), replication_policy="identity", dead_letter_topic=dlq,
        copy_core=core, mode=FlowMode.REALTIME if realtime else FlowMode.THROUGHPUT, exactly_once=exactly_once,
    )  # fmt: skip
    rules = TargetRules(max_message_bytes=CAP, topics={b: TargetRule(compacted=True)})
    return flow, rules, end_offsets(source.admin, [(a, 0), (a, 1), (b, 0), (c, 0), (d, 0), (d, 1)])


def _spy_on_the_core(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], list[int]]:
    """One True per task the compiled core copied for, and how many records it wrote before it handed over to the
    Python loop, if it did (one counter, in a list)."""
    used: list[bool] = []
    by_core = [0]
    compiled = spark_app.range_copy.copy_compiled

    def spy(flow, source, target, cursors, *rest):
        compiled(flow, source, target, cursors, *rest)
        used.append(True)
        by_core[0] += sum(c.landing.records for c in cursors.values())

    monkeypatch.setattr(spark_app.range_copy, "copy_compiled", spy)
    return used, by_core


def _dead_letter(r: Record) -> tuple:
    """A dead letter whole, with the refused record's topic named by role."""
    role = tuple((k, v.split(b"-", 1)[0] if k == "mirrorkit.dlq.topic" and v else v) for k, v in r.headers)
    return _bytes(replace(r, headers=role))[:-1]  # its own timestamp is when it was written


def _landed(landings: list[Landing], topic: str) -> int:
    return sum(x.records - x.dead_lettered for x in landings if x.topic == topic)


def _comparable(landing: Landing) -> dict:
    """A landing's row with its topic named by role and its latency reduced to how many landed with a create time
    (the figures themselves depend on the clock)."""
    row = replace(landing, topic=landing.topic.split("-", 1)[0]).to_row()
    row["latency_counts"], row["latency_sum_ms"] = sum(row["latency_counts"]), None
    return row


def _bytes(r: Record) -> tuple:
    """A target record whole, in an order that sorts by partition and offset."""
    return r.partition, r.offset, r.key or b"", r.key is None, r.value, r.headers, r.timestamp_ms


def test_the_compiled_core_reads_and_writes_with_a_client_certificate(testbed, unique, tmp_path, monkeypatch):
    """The `mtls` profile: the core's consumer and producer both present the client certificate, to a listener that
    refuses a TLS client without one."""
    cluster = testbed.start(f"mtls-{unique}"[:40], ListenerKind.MTLS)
    tls_alone = ClusterConfig(alias="tls-alone", bootstrap_servers=cluster.client.bootstrap_servers,
                              profile="kafka", tls=True, ca_file=cluster.client.ca_file)  # fmt: skip
    with pytest.raises(KafkaException):  # the listener demands a certificate: TLS alone does not get in
        testbed_clients.admin(tls_alone).list_topics(timeout=5)
    source = cluster.client
    target = source.model_copy(update={"alias": "mtls-dr"})  # the same broker, written as another cluster
    topic = f"certs-{unique}"
    create_topics(cluster.admin, {topic: 2, f"{source.alias}.{topic}": 2})
    now_ms = int(time.time() * 1000)
    records = [
        Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("h", bytes([i % 256])),), now_ms + i) for i in range(300)
    ]
    produce(source, topic, records)  # the test's own producer signs in with the certificate too

    _, by_core = _spy_on_the_core(monkeypatch)
    flow = FlowConfig(source=source.alias, target=target.alias, topics=TopicSelection(include=[topic]),
                      checkpoint_location=str(tmp_path))  # fmt: skip
    landings = RangeCopier(flow, source, target).copy([OffsetRange(topic, p, 0, 150) for p in (0, 1)])

    assert by_core[0] == sum(x.records for x in landings) == 300, "the compiled core copied every record"
    copied = read_all(cluster.admin, f"{source.alias}.{topic}", 300)
    assert by_partition(copied) == by_partition(records), "each record whole, in its partition's order"
