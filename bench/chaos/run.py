"""One run of the fault-injection checker: topics and the mirror's config on the test bed's clusters, the generator
and the groups, the nemesis for `duration_s`, then a drain with every fault healed, and the checker's verdict."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from confluent_kafka import KafkaException

from bench.testbed import clients
from bench.testbed.kafka_cluster import KafkaCluster, MultiBrokerCluster, cluster_entry
from bench.testbed.ports import free_port
from bench.testbed.spark_standalone import SparkStandalone
from spark_app.config import MirrorConfig, parse_config
from spark_app.dr.internal import compacted_topics, read_checkpoints
from spark_app.policy import event_hubs_topics, target_topic

from .check import Report, check_partition, read_partition, reported_ahead, reported_losses
from .load import Groups, Load, Topics
from .nemesis import HOLD_S, Nemesis, Remote, Scene, placement
from .process import MirrorProcess

# At least once: a fault that stops a copy mid-way copies again what it wrote since its last saved position (the
# batch in flight; in real time what landed since the last commit). At the generator's rate that is well under this
# many seconds of load per fault, which bounds the duplicates the checker allows (docs/testing/adversary.md).
DUPLICATE_WINDOW_S = 30.0
DRAIN_S = 420.0  # after the last fault, how long the mirror gets to copy what it owes (a held topic retries each 60 s)
# How long the mirror may take to start and copy a first record of every partition: about a minute on a quiet
# machine; two long runs side by side on two cores took over three.
WARM_UP_S = 600.0


@dataclass
class Outcome:
    mode: str
    seed: int
    rate: int
    faults: int
    events: list[str]
    sent: int
    report: Report
    drained_in_s: float
    exit_code: int | None
    starts: int
    extra: dict[str, int] = field(default_factory=dict)
    load_error: str | None = None  # the generator or the groups stopped early: the run proves less
    exactly_once: bool = False  # the flow was `exactly_once`: a read_committed reader may see no duplicate at all
    violations: list[str] = field(default_factory=list)  # what a fault saw the mirror do that it never may


def duplicate_bound(outcome: Outcome) -> int:
    """The duplicates a run may leave: none exactly once (the checker reads read_committed), else DUPLICATE_WINDOW_S
    of load per fault."""
    return 0 if outcome.exactly_once else int(outcome.faults * outcome.rate * DUPLICATE_WINDOW_S)


def chaos_config(source: MultiBrokerCluster, target: KafkaCluster, topics: Topics, mode: str, folder: Path,
                 suffix: str, exactly_once: bool = False) -> MirrorConfig:  # fmt: skip
    # Aliases of the run's own: the flow's internal topics, its DR lease and its names on the target are its alone.
    raw = {
        "clusters": [cluster_entry(source, f"src-{suffix}", proxied=True),
                     cluster_entry(target, f"dr-{suffix}", proxied=True)],
        "flows": [{
            "source": f"src-{suffix}", "target": f"dr-{suffix}", "topics": {"include": topics.all},
            "groups": {"include": [f"chaos-group-{suffix}-.*"]}, "checkpoint_location": str(folder / "checkpoint"),
            "mode": mode, "emit_heartbeats": False, "realtime_tasks": 2, "exactly_once": exactly_once,
        }],
        "metrics_port": free_port(),
    }  # fmt: skip
    return parse_config(raw)


def prepare(source: MultiBrokerCluster, target: KafkaCluster, topics: Topics, config: MirrorConfig) -> None:
    """The source topics (partition 1 of each on the broker the nemesis stops), and on an Event Hubs-like target,
    which takes no topic from the mirror, every hub infra would make. On an MSK-like target the mirror makes its own."""
    placed = {t: placement(topics.partitions) for t in topics.all if t != topics.compacted}
    clients.create_placed_topics(source.admin, placed)
    clients.create_placed_topics(source.admin, {topics.compacted: placement(topics.partitions)},
                                 {"cleanup.policy": "compact"})  # fmt: skip
    alias = config.flows[0].target
    if alias not in (hubs_on := event_hubs_topics(config)):
        return
    hubs, compacted = set(hubs_on[alias]), compacted_topics(config)[alias]
    clients.create_topics(target.admin, {h: topics.partitions for h in hubs if h not in compacted})
    clients.create_topics(target.admin, dict.fromkeys(compacted & hubs, 1), {"cleanup.policy": "compact"})


def run_chaos(
    source: MultiBrokerCluster, target: KafkaCluster, folder: Path, mode: str, seed: int, duration_s: float,
    fault_every_s: float, rate: int, suffix: str, hold_s: tuple[float, float] = HOLD_S,
    spark: SparkStandalone | None = None, exactly_once: bool = False, only: tuple[str, ...] = (),
    at_least: int = 0, first: tuple[str, ...] = (),
) -> Outcome:  # fmt: skip
    """Run the mirror through `duration_s` of random faults (those whose names contain one of `only`, when given;
    those naming one of `first` drawn first; past it until `at_least` have acted) and check both clusters at the
    end; its executors on `spark`, or in Spark's local mode."""
    topics = Topics(f"chaos-plain-{suffix}", f"chaos-txn-{suffix}", f"chaos-compact-{suffix}", f"chaos-remade-{suffix}")
    config = chaos_config(source, target, topics, mode, folder, suffix, exactly_once)
    prepare(source, target, topics, config)
    config_file = folder / "mirror.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True)))
    mirror = MirrorProcess(config_file, folder / "mirror.log", spark.master_url if spark else "local[4]",
                           spark.driver_env if spark else None)  # fmt: skip
    flow = config.flows[0]

    def remote(topic: str) -> str:
        return target_topic(flow, topic)

    group_names = [f"chaos-group-{suffix}-{i}" for i in range(3)]
    load = Load(source.client, topics, rate, seed)
    nemesis = Nemesis(Scene(source, target, mirror, topics, remote, load, spark), seed, hold_s=hold_s, only=only,
                      first=first)  # fmt: skip
    groups = Groups(source.client, [topics.plain, topics.transactional], topics.partitions, group_names, seed)
    mirror.start()
    try:
        with load, groups:
            _warm_up(target, topics, remote, time.monotonic() + WARM_UP_S)
            faults = nemesis.run(time.monotonic() + duration_s, fault_every_s, at_least)
        if not mirror.alive():
            mirror.start()
        started = time.monotonic()
        _drain(source, target, topics, remote, mirror, started + DRAIN_S)
        drained_in = time.monotonic() - started
        time.sleep(2 * config.checkpoint_interval_s)  # a last checkpoint round after the last records landed
        exit_code = mirror.term()
    finally:
        nemesis.heal()
        mirror.kill()
    report = check(source, target, topics, remote, load.acknowledged(), (folder / "mirror.log").read_text(
        errors="replace"))  # fmt: skip
    _check_translation(config, source, target, topics, remote, report)
    sent = sum(len(v) for v in load.acknowledged().values())
    return Outcome(mode, seed, rate, faults, nemesis.events, sent, report, drained_in, exit_code, mirror.starts,
                   {"group_commits": groups.commits, "failed_sends": load.failed,
                    "transactional_restarts": load.txn_restarts}, load.error or groups.error, exactly_once,
                   nemesis.violations)  # fmt: skip


def _warm_up(target: KafkaCluster, topics: Topics, remote: Remote, deadline: float) -> None:
    """Wait until the mirror has copied something of every partition, so that every fault meets a mirror that
    holds positions: records deleted before it ever read a partition are not its to report."""
    wanted = [(remote(t), p) for t in topics.all for p in range(topics.partitions)]
    while time.monotonic() < deadline:
        try:
            if all(end > 0 for end in clients.end_offsets(target.client, wanted).values()):
                return
        except KafkaException:  # a hub made a moment ago whose leader is still being elected
            pass
        time.sleep(1.0)
    raise AssertionError(f"the mirror copied nothing of some partitions within {WARM_UP_S:.0f} s of its start")


def _drain(source: MultiBrokerCluster, target: KafkaCluster, topics: Topics, remote: Remote, mirror: MirrorProcess,
           deadline: float) -> None:  # fmt: skip
    """Wait until the target holds every record the source holds (or the deadline); restarts a mirror that died."""
    while time.monotonic() < deadline:
        if not mirror.alive():
            mirror.start()
        owed = 0
        for topic in topics.all:
            for p in range(topics.partitions):
                try:
                    held = {v for _, v in read_partition(source.client, topic, p)}
                    copied = {v for _, v in read_partition(target.client, remote(topic), p)}
                except AssertionError:  # a read with no answer (a loaded machine): not drained, asked again
                    owed += 1
                    continue
                owed += len(held - copied)
        if not owed:
            return
        time.sleep(5.0)


def check(source: MultiBrokerCluster, target: KafkaCluster, topics: Topics, remote: Remote,
          acked: dict[tuple[str, int], dict[bytes, int]], log_text: str) -> Report:  # fmt: skip
    report = Report()
    reported, ahead = reported_losses(log_text), reported_ahead(log_text)
    for topic in topics.all:
        for p in range(topics.partitions):
            verdict, _first = check_partition(
                topic, p, read_partition(source.client, topic, p), read_partition(target.client, remote(topic), p),
                acked.get((topic, p), {}), reported.get((topic, p), []), remade=topic == topics.remade,
                ahead=ahead.get((topic, p), []),
            )  # fmt: skip
            report.partitions.append(verdict)
    return report


def _check_translation(config: MirrorConfig, source: MultiBrokerCluster, target: KafkaCluster, topics: Topics,
                       remote: Remote, report: Report) -> None:  # fmt: skip
    """Each group's newest checkpoint points at or before the first copy of the first record it had not read."""
    for (group, topic, partition), (cp, _at) in read_checkpoints(config, config.flows[0]).items():
        source_topic = next((t for t in topics.all if topic in (t, remote(t))), None)
        if source_topic is None:
            continue
        held = read_partition(source.client, source_topic, partition)
        target_records = read_partition(target.client, remote(source_topic), partition)
        first: dict[bytes, int] = {}
        for offset, value in target_records:
            first.setdefault(value, offset)
        unread = next((v for o, v in held if o >= cp.upstream_offset), None)
        bound = first.get(unread, -1) if unread is not None else (target_records[-1][0] + 1 if target_records else 0)
        report.translation_checks += 1
        if unread is not None and bound < 0:
            continue  # not copied: already counted as lost
        if cp.downstream_offset > bound:
            report.translation_skips.append(
                f"{group} {source_topic}[{partition}]: source {cp.upstream_offset} -> target {cp.downstream_offset},"
                f" past {bound}, the first copy of the first record it had not read"
            )
