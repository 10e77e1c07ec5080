"""Disaster recovery end to end on real brokers and real Spark: checkpoints MM2 can read, failover, group sync."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import TopicPartition

from bench.testbed import clients
from bench.testbed.clients import Record, commit, committed, create_topics, java_settings, produce
from bench.testbed.kafka_cluster import cluster_entry, kafka_classpath, require_java
from bench.testbed.ports import free_port
from spark_app import clients as spark_clients
from spark_app.cli import main as cli_main
from spark_app.clients import read_topic, topic_configs, watermarks
from spark_app.config import STOP_GRACE_S, ClusterConfig, parse_config
from spark_app.dr.formats import Checkpoint, OffsetSync
from spark_app.dr.internal import INTERNAL_TOPIC_CONFIG, ensure_topic, read_checkpoints
from spark_app.dr.service import DrSync
from spark_app.dr.views import failover_plan
from spark_app.errors import MirrorFailed
from spark_app.mirror import Mirror
from spark_app.policy import checkpoints_topic, offset_syncs_topic, target_topic
from tests.support.mirror_config import create_event_hubs, one_flow_config
from tests.support.polling import wait_until

TRANSLATE_OFFSETS = Path(__file__).parent / "support" / "TranslateOffsets.java"


def mm2_translate(
    target: ClusterConfig, source_alias: str, groups: list[str], folder: Path, separator: str = ".",
    before_checkpoints: bool = False,
) -> dict:  # fmt: skip
    """{(group, topic, partition): offset} as MM2's RemoteClusterUtils.translateOffsets reads them on the target,
    configured with `replication.policy.separator` as MM2 would be. `before_checkpoints`: MM2 may not have made its
    checkpoints topic yet, which RemoteClusterUtils fails on; then nothing is translated yet ({})."""
    props = folder / "target.properties"
    settings = java_settings(target) | {"replication.policy.separator": separator}
    props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    cmd = [require_java(), "-cp", kafka_classpath(), str(TRANSLATE_OFFSETS), str(props), source_alias, *groups]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if run.returncode != 0 and before_checkpoints:
        return {}
    assert run.returncode == 0, run.stderr[-3000:]
    out = {}
    for line in run.stdout.splitlines():
        group, topic, partition, offset = line.split("\t")
        out[(group, topic, int(partition))] = int(offset)
    return out


Decoded = TypeVar("Decoded")


def written(cluster: ClusterConfig, topic: str, decode: Callable[[bytes, bytes], Decoded]) -> list[tuple[Decoded, int]]:
    """Every record of one of the mirror's internal topics, decoded, with its timestamp: when the mirror wrote it."""
    return [(decode(m.key(), m.value()), m.timestamp()[1]) for m in read_topic(cluster, topic)]


def values_from(settings: ClusterConfig, topic: str, partition: int, offset: int) -> list[bytes]:
    consumer = clients.consumer(settings, "dr-test-reader", {"enable.auto.commit": False})
    low, high = watermarks(consumer, topic, partition)
    consumer.assign([TopicPartition(topic, partition, offset)])
    values = []
    deadline = time.monotonic() + 60
    while offset + len(values) < high and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
    consumer.close()
    return values


def test_an_internal_topic_someone_made_with_cleanup_policy_delete_is_refused_naming_topic_cluster_and_key(
    plaintext_cluster, target_cluster, unique
):
    kafka, hubs = ClusterConfig.model_validate(cluster_entry(plaintext_cluster, "onprem")), target_cluster
    deleting, compacted = f"{unique}.checkpoints.internal", f"mirrorkit-offset-syncs.{unique}.internal"
    create_topics(plaintext_cluster.admin, {deleting: 1}, {"cleanup.policy": "delete"})
    create_topics(plaintext_cluster.admin, {compacted: 1}, {"cleanup.policy": "compact"})
    reason = ensure_topic(kafka, deleting)
    assert reason is not None and f"'{deleting}' on 'onprem' has cleanup.policy=delete" in reason
    assert "--add-config cleanup.policy=compact" in reason
    assert ensure_topic(kafka, compacted) is None
    assert ensure_topic(kafka, deleting, compacted=False) is None  # heartbeats: read by their tail, any policy does
    create_topics(hubs.admin, {deleting: 1}, {"cleanup.policy": "compact,delete"})
    reason = ensure_topic(ClusterConfig.model_validate(cluster_entry(hubs, "eh")), deleting)
    assert reason is not None and f"'{deleting}' on 'eh' has cleanup.policy=compact,delete" in reason
    assert "cleanupPolicy Compact" in reason
    made = f"mirrorkit-made.{unique}.internal"  # made by the mirror: compacted, in segments the broker compacts soon
    assert ensure_topic(kafka, made) is None
    configs = topic_configs(spark_clients.admin(kafka), made)
    assert {k: configs[k] for k in INTERNAL_TOPIC_CONFIG} == INTERNAL_TOPIC_CONFIG


@pytest.mark.parametrize(("mode", "separator"), [("throughput", "_"), ("realtime", ".")])
def test_checkpoints_read_by_mm2_match_failover_and_group_sync_spares_a_live_group(
    mode, separator, spark, source_cluster, target_cluster, tmp_path, unique, capsys
):
    """MSK-like -> Event Hubs-like. Three groups: one caught up, one lagging far behind, one with a consumer live
    on the target. MM2's RemoteClusterUtils, with the flow's separator as its `replication.policy.separator`, reads
    the same offsets `failover --dry-run` prints (with `_` from `<source>_checkpoints_internal`, as MM2 names it);
    none of them skips a record; group sync and failover commit the idle groups and leave the live one alone."""
    topic, alias = f"orders-{unique}", f"src{unique[-8:]}"
    remote = f"{alias}{separator}{topic}"
    groups = {"caught-up": f"caught-up-{unique}", "lagging": f"lagging-{unique}", "live": f"live-{unique}"}
    config = parse_config(
        one_flow_config(
            source_cluster,
            target_cluster,
            [topic],
            tmp_path / "ckpt",
            source_alias=alias,
            target_alias="eh",
            groups={"include": [f".*-{unique}"]},
            sync_group_offsets=True,
            mode=mode,
            separator=separator,
        )
    )
    assert checkpoints_topic(config.flows[0]) == f"{alias}{separator}checkpoints{separator}internal"
    create_topics(source_cluster.admin, {topic: 2})
    create_event_hubs(target_cluster.admin, config, "eh", {remote: 2})
    produce(source_cluster.client, topic, [Record(i % 2, str(i).encode(), str(i).encode()) for i in range(400)])
    commit(source_cluster.client, groups["caught-up"], topic, {0: 200, 1: 200})
    commit(source_cluster.client, groups["lagging"], topic, {0: 7, 1: 150})
    commit(source_cluster.client, groups["live"], topic, {0: 100, 1: 100})
    # A consumer of the live group is a member on the target, where it committed its own position.
    live = clients.consumer(target_cluster.client, groups["live"], {"enable.auto.commit": False})
    live.subscribe([remote])
    deadline = time.monotonic() + 60
    while not live.assignment() and time.monotonic() < deadline:
        live.poll(0.5)
    assert live.assignment(), "the live consumer never joined its group on the target"
    live.commit(offsets=[TopicPartition(remote, 0, 3)], asynchronous=False)
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))

    try:
        Mirror(spark, config).run_available_now()
        checkpoints = {k: cp for k, (cp, _) in read_checkpoints(config, config.flows[0]).items()}

        assert cli_main(["failover", "--config", str(config_file), "--flow", f"{alias}->eh", "--dry-run"]) == 0
        printed = {}
        for line in capsys.readouterr().out.splitlines()[1:]:
            group, topic_, partition, source_offset, target_offset, reread, _note = line.split()
            printed[(group, topic_, int(partition))] = (int(source_offset), int(target_offset), int(reread))
        assert sorted(printed) == sorted((g, remote, p) for g in groups.values() for p in (0, 1))
        # MirrorMaker 2's own client library reads our checkpoints and gets the very same offsets.
        mm2 = mm2_translate(target_cluster.client, alias, list(groups.values()), tmp_path, separator)
        assert mm2 == {k: v[1] for k, v in printed.items()}
        for (group, _, partition), (source_offset, target_offset, reread) in printed.items():
            assert checkpoints[(group, remote, partition)].upstream_offset == source_offset
            # Never skips: the next unread source record is among those read from the translated offset on,
            # and no more than `reread` records come before it.
            resumed = values_from(target_cluster.client, remote, partition, target_offset)
            if source_offset == 200:  # consumed all: resumes at the end, nothing read again
                assert (resumed, reread) == ([], 0), (group, partition)
                continue
            next_unread = str(2 * source_offset + partition).encode()
            assert next_unread in resumed, (group, partition)
            assert resumed.index(next_unread) <= reread, (group, partition)
        assert printed[(groups["caught-up"], remote, 0)][1:] == (200, 0)
        assert printed[(groups["lagging"], remote, 0)][0] == 7  # far behind, translated all the same

        # Group sync committed the idle groups on the target, and left the live one as its consumer set it.
        assert committed(target_cluster.client, groups["caught-up"], remote, 2) == {0: 200, 1: 200}
        lagging = committed(target_cluster.client, groups["lagging"], remote, 2)
        assert lagging == {p: printed[(groups["lagging"], remote, p)][1] for p in (0, 1)}
        assert committed(target_cluster.client, groups["live"], remote, 2) == {0: 3}

        # Failover refuses the live group by name and reports the others as done.
        assert cli_main(["failover", "--config", str(config_file), "--flow", f"{alias}->eh"]) == 1
        out = capsys.readouterr()
        assert f"group '{groups['live']}' has 1 active member(s) on 'eh'" in out.err
        assert f"kept {groups['caught-up']} {remote}[0] = 200" in out.out
        assert committed(target_cluster.client, groups["live"], remote, 2) == {0: 3}

        assert cli_main(["status", "--config", str(config_file), "--json"]) == 0
        (flow,) = json.loads(capsys.readouterr().out)["flows"]
        assert [(p["topic"], p["partition"], p["lag"]) for p in flow["partitions"]] == [(topic, 0, 0), (topic, 1, 0)]
        assert all(p["checkpoint_age_s"] is not None and p["checkpoint_age_s"] < 600 for p in flow["partitions"])
    finally:
        live.close()


def test_history_under_an_older_mirrors_dotted_names_is_never_dropped_silently(
    source_cluster, target_cluster, tmp_path, unique
):
    """An older mirror named the internal topics with dots whatever the separator. A flow with `_` whose checkpoints
    are only there (infra has made MM2's `_` names, empty) refuses to start, and `status` and `failover` refuse to
    read it, naming the setting; with it set, the mirror reads the old checkpoints back."""
    alias = f"old{unique[-8:]}"
    raw = one_flow_config(source_cluster, target_cluster, [f"orders-{unique}"], tmp_path / "ckpt",
                          source_alias=alias, target_alias="eh", separator="_")  # fmt: skip
    flow = parse_config(raw).flows[0]
    dotted = flow.model_copy(update={"internal_topic_separator": False})
    create_topics(target_cluster.admin, {checkpoints_topic(flow): 1, offset_syncs_topic(flow): 1} |
                  {checkpoints_topic(dotted): 1, offset_syncs_topic(dotted): 1}, INTERNAL_TOPIC_CONFIG)  # fmt: skip
    old = Checkpoint(f"app-{unique}", target_topic(flow, f"orders-{unique}"), 0, 40, 38)
    produce(target_cluster.client, checkpoints_topic(dotted), [Record(0, old.key(), old.value())])
    with pytest.raises(MirrorFailed) as refused:
        DrSync(parse_config(raw), flow).prepare()
    with pytest.raises(MirrorFailed) as refused_too:  # what `status` and `failover` read
        read_checkpoints(parse_config(raw), flow)
    assert str(refused_too.value) == str(refused.value)
    assert (
        f"its DR history is in '{alias}.checkpoints.internal' on 'eh', as an older mirror named it; with separator '_'"
        f" the mirror now names it '{alias}_checkpoints_internal', as MirrorMaker 2 does. Set"
        " flows[0].internal_topic_separator: false" in str(refused.value)
    )
    raw["flows"][0]["internal_topic_separator"] = False
    kept = DrSync(parse_config(raw), parse_config(raw).flows[0])
    kept.prepare()
    assert kept.checkpoints.checkpoints == {(old.group, old.topic, 0): old}


def test_dr_drill_primary_lost_group_resumes_on_dr_without_loss(spark, own_cluster, target_cluster, tmp_path, unique):
    """Steady producer, committing consumer, running mirror; the primary's broker is killed; failover; the same
    group resumes on DR. No record it had not processed (and that reached DR) is lost; duplicates stay within the
    records processed since the last checkpoint plus a re-read under one batch, and within what failover printed."""
    primary = own_cluster(f"drill-{unique[-8:]}", "plaintext")
    topic, group = f"orders-{unique}", f"app-{unique}"
    remote = f"primary.{topic}"
    config = parse_config(
        one_flow_config(
            primary,
            target_cluster,
            [topic],
            tmp_path / "ckpt",
            source_alias="primary",
            target_alias="dr",
            groups={"include": [group]},
            checkpoint_interval_s=2,
            heartbeat_interval_s=1,
            trigger_interval_s=1,
            metrics_port=free_port(),
        )
    )
    flow, dr_cluster = config.flows[0], config.cluster("dr")
    create_topics(primary.admin, {topic: 2})
    create_event_hubs(target_cluster.admin, config, "dr", {remote: 2})
    config_file = tmp_path / "mirror.json"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))

    stop = threading.Event()
    acked: dict[bytes, float] = {}  # value -> when the primary acknowledged it
    processed: list[tuple[int, int, bytes]] = []  # (partition, offset, value) the application handled on primary

    def producer_loop() -> None:
        producer = clients.producer(primary.client, {"linger.ms": 5, "message.timeout.ms": 5000})
        i = 0
        while not stop.is_set():
            value = str(i).encode()
            producer.produce(topic, value=value, partition=i % 2, on_delivery=lambda e, m: e or acked.__setitem__(
                m.value(), time.time()))  # fmt: skip
            producer.poll(0)
            i += 1
            time.sleep(0.01)  # a steady load's pacing: about 100 records a second
        producer.flush(5)

    def consumer_loop() -> None:
        consumer = clients.consumer(
            primary.client, group, {"enable.auto.commit": False, "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            processed.append((msg.partition(), msg.offset(), msg.value()))
            time.sleep(0.02)  # slower than the producer: the application lags, as real ones do
            if len(processed) % 25 == 0:
                with contextlib.suppress(Exception):
                    consumer.commit(asynchronous=False)

    def batch_ends_below_checkpoint() -> int:
        """The fewest, over the partitions, of the mirror's batch ends below the group's checkpointed offset."""
        checkpoints_now = [cp for cp, _ in read_checkpoints(config, flow).values() if cp.group == group]
        checkpointed = {cp.partition: cp.upstream_offset for cp in checkpoints_now}
        ends = [s for s, _ in written(dr_cluster, offset_syncs_topic(flow), OffsetSync.decode) if s.topic == topic]
        below = [sum(1 for s in ends if s.partition == p and s.upstream_offset < c) for p, c in checkpointed.items()]
        return min(below) if len(below) == 2 else 0

    mirror = Mirror(spark, config)
    threads = [threading.Thread(target=f, daemon=True) for f in (producer_loop, consumer_loop, mirror.run_forever)]
    for t in threads:
        t.start()

    def checkpoints_of_the_group() -> dict[int, int]:
        """How many checkpoints of the group the mirror wrote, per partition."""
        written_now = written(dr_cluster, checkpoints_topic(flow), Checkpoint.decode)
        return {p: sum(1 for cp, _ in written_now if cp.group == group and cp.partition == p) for p in (0, 1)}

    # The first batches are large (the first carries all that was written while the query started): wait until the
    # group's checkpoint is past three batch ends, so the translation is tried among batches of steady size, as in
    # a mirror that has run a while; then until two more checkpoints of the group on each partition, under load.
    waited = wait_until(lambda: batch_ends_below_checkpoint() >= 3, "its checkpoint past 3 batch ends", every_s=1)
    before = checkpoints_of_the_group()
    waited += wait_until(
        lambda: all(n >= before[p] + 2 for p, n in checkpoints_of_the_group().items()),
        f"two more checkpoints of the group on each partition (it had {before})",
        every_s=1,
    )
    print(f"\nDR drill: the primary is killed {waited:.1f} s after the load started")
    primary.kill()
    killed_at = time.time()
    stop.set()
    mirror.stopping.set()
    for t in threads:
        t.join(STOP_GRACE_S)
    assert not threads[-1].is_alive(), "the mirror did not stop within the pod's grace period after its source died"
    for flow_mirror in mirror.flows:  # the loop may have ended on the unreachable source; stop what is left
        flow_mirror.stop()
    for dr in mirror.dr.values():
        dr.stop()

    on_dr = {p: values_from(target_cluster.client, remote, p, 0) for p in (0, 1)}
    mirrored = {v for values in on_dr.values() for v in values}
    unmirrored = [at for v, at in acked.items() if v not in mirrored]
    rpo_s = killed_at - min(unmirrored) if unmirrored else 0.0

    checkpoints = {cp.partition: cp for cp, _ in read_checkpoints(config, flow).values() if cp.group == group}
    printed_reread = {r.partition: r.reread for r in failover_plan(config, flow) if r.group == group}
    began = time.time()
    assert cli_main(["failover", "--config", str(config_file), "--flow", "primary->dr"]) == 0
    resumed = clients.consumer(
        target_cluster.client, group, {"enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )
    resumed.subscribe([remote])
    consumed: list[bytes] = []
    first_at = None
    end = time.monotonic() + 120
    while len(set(consumed) | {v for _, _, v in processed}) < len(mirrored | {v for _, _, v in processed}):
        assert time.monotonic() < end, "the group did not reach the end of the DR copy"
        msg = resumed.poll(0.5)
        if msg is not None and msg.error() is None:
            first_at = first_at or time.time()
            consumed.append(msg.value())
    resumed.close()

    done = {v for _, _, v in processed}
    assert first_at is not None and mirrored - done, "the drill needs records mirrored but not yet processed"
    assert mirrored - done <= set(consumed), "a record that reached DR and was never processed was not consumed"
    duplicates = set(consumed) & done

    # Duplicates, per partition. The group's last checkpoint carries its committed offset C on the primary (the next
    # record it would have read) and the DR offset failover resumed it at. A duplicate is a record the group
    # processed on the primary and reads again on DR, and it is one of two kinds:
    # - at an offset >= C: processed after the commit the checkpoint carries (the group commits every 25 records,
    #   the mirror checkpoints every 2 s); at most `since`, the records processed at offsets >= C.
    # - at an offset < C: the translation's re-read. Offset syncs mark batch ends only: for the newest synced batch
    #   end u <= C, C == u resumes exactly at u and u < C resumes right after u, re-reading offsets u+1..C-1, that
    #   is max(0, C - 1 - u) records, under one batch. u counts only if the mirror knew it when it translated:
    #   its sync was written before the group's previous checkpoint (the translation runs after that one). Had the
    #   group been ahead of the mirror, u is where the mirror was, and the re-read is the mirror's lag behind it.
    #   The allowance comes from the syncs and the checkpoints' write times, not from the resume offset under test,
    #   so a translation that resumes a batch early fails here (a bound of C minus the resume offset would not).
    # When every processed record reached DR (the group is slower than the mirror) and the mirror's newest batch end
    # below C was synced before the previous checkpoint, duplicates equal the bound exactly: it is tight, not off by
    # one. It is asserted as <= because records processed just before the kill may never have been mirrored.
    syncs = [(s, at) for s, at in written(dr_cluster, offset_syncs_topic(flow), OffsetSync.decode) if s.topic == topic]
    checkpoints_written = written(dr_cluster, checkpoints_topic(flow), Checkpoint.decode)
    checkpointed_at = sorted((cp.partition, at) for cp, at in checkpoints_written if cp.group == group)
    since_checkpoint = within_batch = 0
    for p, cp in sorted(checkpoints.items()):
        times = [at for q, at in checkpointed_at if q == p]
        assert len(times) >= 2, f"partition {p}: the drill needs two checkpoints of the group"
        known = [s.upstream_offset for s, at in syncs if s.partition == p and at <= times[-2]]
        known = [u for u in known if u <= cp.upstream_offset]
        allowed = max(0, cp.upstream_offset - 1 - max(known)) if known else cp.upstream_offset
        offsets = {v: o for q, o, v in processed if q == p}
        since = sum(1 for o in offsets.values() if o >= cp.upstream_offset)
        reread = sum(1 for v in duplicates if v in offsets and offsets[v] < cp.upstream_offset)
        assert printed_reread[p] is not None and reread <= printed_reread[p], (p, reread, printed_reread[p])
        dups = sum(1 for v in duplicates if v in offsets)
        assert dups <= since + allowed, f"partition {p}: {dups} duplicates > {since} since checkpoint + {allowed}"
        since_checkpoint, within_batch = since_checkpoint + since, within_batch + allowed
    print(
        f"\nDR drill: {len(acked)} produced, {len(mirrored)} mirrored, {len(done)} processed on primary;"
        f" RPO {len(unmirrored)} records / {rpo_s:.1f}s; RTO {first_at - began:.1f}s; {len(duplicates)} duplicates"
        f" (bound {since_checkpoint} since checkpoint + {within_batch} re-read within a batch)"
    )
