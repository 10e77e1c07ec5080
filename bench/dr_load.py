"""The DR bookkeeping under load: what offset syncs and checkpoints cost, and how long `status`, `failover` and a
restart take to read them back, on a flow with many partitions and consumer groups.

Why: every batch hands the DR service where each partition landed (spark_app/dr/offset_syncs.py), checkpoints
are translated for every group and partition each `checkpoint_interval_s` (spark_app/dr/checkpoints.py), and
`status`, `failover` and a restarting mirror read both internal topics back (spark_app/dr/internal.py). This
measures the volume written and those read times at a stated size, so a change to the bookkeeping is compared
against the same load; bench/results/dr-load-20261124-02*.json are the figures from before syncs became runs and
checkpoints were written on change.

What is real and what is synthetic:
- Real: two single-node Kafka clusters of the test bed (plaintext, loopback, this machine), the source topics
  (`--topics` x `--partitions`) and their remote copies `src.<topic>` on the target, the consumer groups and their
  committed offsets on the source, and the whole DR service as the mirror runs it: one `spark_app.dr.service.DrSync`,
  started with `start()` (its own checkpoint and heartbeat loop at the config's default intervals), stopped with
  `stop()`; `spark_app.dr.views.flow_status` and `failover_plan`; the CLI's `status --json` and
  `failover --dry-run` in a subprocess; a restart's `DrSync(...).prepare()`.
- Synthetic: there is no Spark and no copy. The records a mirror would copy are produced up front, the same count
  per partition to each source topic and its remote topic, so source and target offsets exist and match one to
  one. A driver thread then plays the stream: `--batch-rate` times a second it hands `DrSync.on_landed` one
  `spark_app.ranges.Landing` per partition, as a batch of `--batch-records` records per partition would land (every
  partition busy in every batch: the most syncs a batch can cause). A batch that takes longer than its trigger
  delays the next, as Spark's trigger does. The heartbeats the mirror would copy to the target are stood in for: the
  driver writes one MM2 heartbeat to `src.heartbeats` on the target every `heartbeat_interval_s`.
- Consumer groups: `--groups` groups, each committing on every partition of the flow, through the AdminClient from a
  separate process, every `--commit-interval-s`. Each follows the synthetic mirror: group g commits
  `mirrored - (g % 10) * B + (g % 3)` (B = `--batch-records`), so some stop at a batch boundary, some mid-batch, some
  a little ahead of the mirror, and all move between checkpoints. Offsets are kept at or above B so that no group
  sits before the first sync (that path opens one consumer per group and partition, see the report).

Measured, over a `--window-s` window that starts after `--warmup-s`:
- offset syncs and checkpoints written per second, from the end offsets of the offset-syncs topic and
  `src.checkpoints.internal` on the target before and after the window (not from the service's own counters); the
  batch rate achieved and `on_landed` time per batch; each checkpoint round's duration and outcome;
- then, with the driver, the committer and the service stopped: the wall time of `flow_status`, `failover_plan`, the
  CLI's `status --json` and `failover --dry-run` (including interpreter start-up; `validate` is timed as its
  baseline), and a restart's `DrSync(...).prepare()`, each as a figure or as "timed out after N s";
- the size in records of both internal topics at the end, and CPU seconds of this process and of each broker.

Results: a Markdown table on stdout and bench/results/dr-load-<stamp>.json and .md.

Usage: PYTHONPATH=$PWD .venv/bin/python bench/dr_load.py [--topics 10] [--partitions 100] [--groups 200]
       [--batch-records 5] [--batch-rate 4] [--window-s 60] [--warmup-s 15] [--commit-interval-s 10]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, OffsetSpec  # noqa: E402

from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed.clients import plaintext  # noqa: E402
from bench.testbed.proc import TreeMonitor  # noqa: E402
from spark_app import clients  # noqa: E402
from spark_app.config import MirrorConfig, load_config  # noqa: E402
from spark_app.dr.formats import Heartbeat  # noqa: E402
from spark_app.dr.internal import read_checkpoints, read_offset_syncs, source_ends  # noqa: E402
from spark_app.dr.service import DrSync  # noqa: E402
from spark_app.dr.views import STATUS_SOURCE_TIMEOUT_S, failover_plan, flow_status  # noqa: E402
from spark_app.policy import HEARTBEATS_TOPIC, checkpoints_topic, offset_syncs_topic, target_topic  # noqa: E402
from spark_app.ranges import Landing  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SOURCE, TARGET = "src", "tgt"
GROUP_LAGS = 10  # group g trails the mirror by (g % GROUP_LAGS) batches
SAMPLE_S = 1.0  # how often the internal topics' end offsets are sampled


# -- the layout: topics, partitions, where the synthetic mirror is -----------------------------------------------------


class Layout:
    """The flow's source partitions and the synthetic batches over them."""

    def __init__(self, topics: int, partitions: int, batch_records: int, batches: int) -> None:
        self.topics = [f"load-{t:03d}" for t in range(topics)]
        self.partitions = partitions
        self.batch_records = batch_records
        self.batches = batches  # batches the preloaded records cover
        self.slots = [(t, p) for t in self.topics for p in range(partitions)]

    @property
    def records_per_partition(self) -> int:
        return self.batches * self.batch_records

    def landings(self, batch: int) -> list[Landing]:
        """Batch `batch` (0-based) as the writer would report it: B records per partition, each landed at the same
        offset on the target, as the target topics were filled one to one."""
        b = self.batch_records
        first, end = batch * b, (batch + 1) * b
        return [
            Landing(
                t,
                p,
                first,
                end,
                last_offset=end - 1,
                last_target_offset=end - 1,
                records=b,
                runs=[[first, first, end - 1]],
            )
            for t, p in self.slots
        ]

    def group_offset(self, group: int, mirrored_batches: int) -> int:
        """Where group `group` commits on every partition once the mirror landed `mirrored_batches` batches."""
        b = self.batch_records
        wanted = mirrored_batches * b - (group % GROUP_LAGS) * b + group % 3
        return max(b, min(self.records_per_partition, wanted))


def group_name(g: int) -> str:
    return f"app-{g:04d}"


# -- setting up the clusters ------------------------------------------------------------------------------------------


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Topics that keep every record (no retention), so old timestamps are not deleted in the middle of a run."""
    topics = dict.fromkeys(names, partitions)
    kafka_clients.create_topics(plaintext(bootstrap), topics, {"retention.ms": "-1"}, timeout_s=60)


def preload(bootstrap: str, topics: list[str], layout: Layout, size: int) -> None:
    """`records_per_partition` records of `size` B into every partition, in batch order across partitions."""
    producer = kafka_clients.producer(
        plaintext(bootstrap),
        {"linger.ms": 50, "batch.size": 1_048_576, "acks": "all"}
        | {"queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576},
    )
    value = b"x" * size
    per_partition = len(topics) * layout.partitions
    for i in range(layout.records_per_partition * per_partition):
        chunk, slot = divmod(i, per_partition)
        topic, partition = topics[slot // layout.partitions], slot % layout.partitions
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % chunk, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(300):
        raise RuntimeError(f"preloading {bootstrap}: records left undelivered")


def end_offset(admin: AdminClient, topic: str) -> int:
    """The end offset of partition 0 (the internal topics have one partition); 0 when the topic is not there yet."""
    try:
        futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=30)
        return next(iter(futures.values())).result().offset
    except KafkaException:
        return 0


def write_config(work: Path, source: str, target: str, topics: list[str]) -> Path:
    """A one-flow config with every DR setting at its default; the CLI and this process read the same file."""
    raw = {
        "clusters": [
            {"alias": SOURCE, "bootstrap_servers": source, "profile": "kafka"},
            {"alias": TARGET, "bootstrap_servers": target, "profile": "kafka"},
        ],
        "flows": [
            {"source": SOURCE, "target": TARGET, "topics": {"include": topics}, "checkpoint_location": str(work / "cp")}
        ],
    }
    path = work / "mirror.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# -- the consumer groups (a separate process, so their commits do not share this process's GIL) ----------------------


def commit_groups(
    bootstrap: str, layout: Layout, groups: int, interval_s: float, mirrored: Any, stop: Any, stats: Any
) -> None:
    """Commit every group on every partition every `interval_s`, following the synthetic mirror's progress.

    `stats` gets [rounds, seconds of the last round, failed commits]; the first round runs at once.
    """
    admin = kafka_clients.admin(plaintext(bootstrap))
    while True:
        began = time.monotonic()
        at = mirrored.value
        failed = 0
        for g in range(groups):
            offset = layout.group_offset(g, at)
            partitions = [TopicPartition(t, p, offset) for t, p in layout.slots]
            request = [ConsumerGroupTopicPartitions(group_name(g), partitions)]
            try:
                admin.alter_consumer_group_offsets(request, request_timeout=60)[group_name(g)].result()
            except KafkaException:
                failed += 1
        with stats.get_lock():
            stats[0] += 1
            stats[1] = time.monotonic() - began
            stats[2] += failed
        if stop.wait(max(0.0, interval_s - (time.monotonic() - began))):
            return


# -- timing helpers ---------------------------------------------------------------------------------------------------


def timed(what: str, call: Callable[[], Any]) -> tuple[dict, Any]:
    """Wall time of `call`; a failure is the figure ("timed out after N s" for a read that hit its deadline)."""
    began = time.monotonic()
    try:
        value = call()
    except TimeoutError as err:
        took = time.monotonic() - began
        return {"what": what, "seconds": round(took, 2), "outcome": f"timed out after {took:.0f} s: {err}"}, None
    except Exception as err:  # noqa: BLE001 - any failure is a result here, reported as it came
        took = time.monotonic() - began
        return {"what": what, "seconds": round(took, 2), "outcome": f"failed after {took:.0f} s: {err!r}"[:500]}, None
    return {"what": what, "seconds": round(time.monotonic() - began, 2), "outcome": "ok"}, value


def run_cli(what: str, args: list[str], timeout_s: float) -> tuple[dict, str]:
    """`python -m spark_app ARGS` in a subprocess, as an operator runs it; its wall time, exit code and stdout."""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "spark_app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"what": what, "seconds": timeout_s, "outcome": f"no answer within {timeout_s:.0f} s (killed)"}, ""
    took = round(time.monotonic() - began, 2)
    result = {"what": what, "seconds": took, "exit_code": done.returncode, "outcome": "ok"}
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        timed_out = "TimeoutError" in done.stderr or "did not reach its end" in done.stderr
        kind = "timed out" if timed_out else "failed"
        result["outcome"] = f"{kind} after {took:.0f} s (exit {done.returncode}): {tail}"[:500]
    return result, done.stdout


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the run ----------------------------------------------------------------------------------------------------------


class Driver:
    """The synthetic stream: one `on_landed` call per batch at `rate`, and the stand-in for mirrored heartbeats."""

    def __init__(self, dr: DrSync, layout: Layout, rate: float, mirrored: Any, target: str) -> None:
        self.dr, self.layout, self.rate, self.mirrored = dr, layout, rate, mirrored
        self.heartbeats = kafka_clients.producer(plaintext(target), {"linger.ms": 5})
        self.remote_heartbeats = target_topic(dr.flow, HEARTBEATS_TOPIC)
        self.batch = 0
        self.on_landed_s: list[tuple[float, float]] = []  # (monotonic start, seconds) per batch
        self.errors: list[str] = []
        self.error_at: list[float] = []  # monotonic start of each batch whose on_landed raised
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batches", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        self.heartbeats.flush(30)

    def _beat(self) -> None:
        beat = Heartbeat(self.dr.flow.source, self.dr.flow.target, int(time.time() * 1000))
        self.heartbeats.produce(self.remote_heartbeats, key=beat.key(), value=beat.value())
        self.heartbeats.poll(0)

    def _run(self) -> None:
        interval = 1 / self.rate
        due = beat_due = time.monotonic()
        while not self._stop.is_set() and self.batch < self.layout.batches:
            now = time.monotonic()
            if now >= beat_due:
                self._beat()
                beat_due = now + self.dr.config.heartbeat_interval_s
            rows = self.layout.landings(self.batch)
            began = time.monotonic()
            try:
                self.dr.on_landed(rows)
            except Exception as err:  # noqa: BLE001 - in the mirror this fails the batch; here it is counted
                self.errors.append(repr(err)[:300])
                self.error_at.append(began)
            self.on_landed_s.append((began, time.monotonic() - began))
            self.batch += 1
            self.mirrored.value = self.batch
            due = max(due + interval, time.monotonic())  # a late batch delays the next, as Spark's trigger does
            self._stop.wait(due - time.monotonic())
        if self.batch >= self.layout.batches:
            self.errors.append(f"ran out of preloaded records after {self.batch} batches")


class Sampler:
    """End offsets of both internal topics every SAMPLE_S, for the time series (the window uses exact reads)."""

    def __init__(self, target: str, topics: list[str]) -> None:
        self.admin = kafka_clients.admin(plaintext(target))
        self.topics = topics
        self.began = time.monotonic()
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def read(self) -> list[int]:
        return [end_offset(self.admin, t) for t in self.topics]

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.samples.append([round(time.monotonic() - self.began, 2), *self.read()])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def instrument_rounds(dr: DrSync) -> list[dict]:
    """Record each checkpoint round's start, duration, checkpoints returned and failure, without changing it."""
    rounds: list[dict] = []
    original = dr.checkpoint_once

    def checkpoint_once() -> Any:
        began = time.monotonic()
        entry: dict[str, Any] = {"at": began}
        rounds.append(entry)
        try:
            written = original()
        except Exception as err:
            entry |= {"seconds": round(time.monotonic() - began, 2), "error": repr(err)[:300]}
            raise
        entry |= {"seconds": round(time.monotonic() - began, 2), "checkpoints": len(written)}
        return written

    dr.checkpoint_once = checkpoint_once  # type: ignore[method-assign]  # the loop looks it up when it starts
    return rounds


def measure(args: argparse.Namespace, work: Path, bed: Any) -> dict:
    source = bed.clusters[SOURCE].client.bootstrap_servers
    target = bed.clusters[TARGET].client.bootstrap_servers
    interval_s = MirrorConfig.model_fields["checkpoint_interval_s"].default
    batches = int((args.warmup_s + args.window_s) * args.batch_rate) + int(4 * args.batch_rate) + 1
    layout = Layout(args.topics, args.partitions, args.batch_records, batches)
    config_path = write_config(work, source, target, layout.topics)
    config = load_config(config_path)
    flow = config.flows[0]
    remote = [target_topic(flow, t) for t in layout.topics]
    out: dict[str, Any] = {}

    began = time.monotonic()
    create_topics(source, layout.topics, args.partitions)
    create_topics(target, remote, args.partitions)
    create_topics(target, [target_topic(flow, HEARTBEATS_TOPIC)], 1)
    preload(source, layout.topics, layout, args.value_size)
    preload(target, remote, layout, args.value_size)
    out["setup_s"] = round(time.monotonic() - began, 1)
    print(f"loaded {layout.records_per_partition} records into each of {len(layout.slots)} partitions on both"
          f" clusters in {out['setup_s']} s", flush=True)  # fmt: skip

    ctx = multiprocessing.get_context("spawn")
    mirrored, stop_commits = ctx.Value("q", 0), ctx.Event()
    commit_stats = ctx.Array("d", 3)
    committer = ctx.Process(
        target=commit_groups,
        args=(source, layout, args.groups, args.commit_interval_s, mirrored, stop_commits, commit_stats),
        daemon=True,
    )
    committer.start()
    while commit_stats[0] < 1:  # every group exists before the service first looks
        if not committer.is_alive():
            raise RuntimeError(f"the group committer exited with {committer.exitcode}")
        time.sleep(0.2)
    print(f"{args.groups} groups committed on {len(layout.slots)} partitions in {commit_stats[1]:.1f} s", flush=True)

    internal = [offset_syncs_topic(flow), checkpoints_topic(flow)]
    dr = DrSync(config, flow)
    rounds = instrument_rounds(dr)
    dr.start()  # makes the internal topics, reads their (empty) history, starts the checkpoint and heartbeat loop
    driver = Driver(dr, layout, args.batch_rate, mirrored, target)
    sampler = Sampler(target, internal)
    monitors = {name: TreeMonitor(bed.clusters[name]._process.pid) for name in (SOURCE, TARGET)}
    committer_monitor = TreeMonitor(committer.pid)
    driver.start()
    time.sleep(args.warmup_s)

    t0, ends0, batch0 = time.monotonic(), sampler.read(), driver.batch
    cpu0 = time.process_time()
    broker_cpu0 = {name: m.cpu_s() for name, m in monitors.items()}
    committer_cpu0, commit_rounds0 = committer_monitor.cpu_s(), commit_stats[0]
    print(f"window: {args.window_s:.0f} s", flush=True)
    time.sleep(args.window_s)
    t1, ends1, batch1 = time.monotonic(), sampler.read(), driver.batch
    cpu1 = time.process_time()
    window = t1 - t0
    broker_cpu = {name: round(m.cpu_s() - broker_cpu0[name], 1) for name, m in monitors.items()}
    committer_cpu = round(committer_monitor.cpu_s() - committer_cpu0, 1)
    commit_rounds = commit_stats[0] - commit_rounds0
    rss_after_window_mb = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    driver.stop()
    stop_commits.set()
    committer.join(120)
    stop_timing, _ = timed("DrSync.stop (final flush and checkpoint)", dr.stop)
    sampler.stop()
    for m in [*monitors.values(), committer_monitor]:
        m.stop()

    in_window = [s for at, s in driver.on_landed_s if t0 <= at < t1]
    syncs_n, cps_n = ends1[0] - ends0[0], ends1[1] - ends0[1]
    batch_rate = (batch1 - batch0) / window
    window_rounds = [r for r in rounds if t0 <= r["at"] < t1]
    out["window"] = {
        "seconds": round(window, 1),
        "batches": batch1 - batch0,
        "batches_per_s": round(batch_rate, 2),
        "offset_syncs": syncs_n,
        "offset_syncs_per_s": round(syncs_n / window),
        "offset_syncs_per_s_expected": round(batch_rate * len(layout.slots)),
        "checkpoints": cps_n,
        "checkpoints_per_s": round(cps_n / window),
        "checkpoints_per_s_if_every_round_on_time": round(args.groups * len(layout.slots) / interval_s),
        "on_landed_ms": {
            "p50": round(percentile(in_window, 0.5) * 1000, 1),
            "p99": round(percentile(in_window, 0.99) * 1000, 1),
            "max": round(max(in_window, default=0) * 1000, 1),
            "mean": round(statistics.fmean(in_window) * 1000, 1) if in_window else 0,
        },
        "on_landed_errors": sum(t0 <= at < t1 for at in driver.error_at),
        "on_landed_errors_whole_run": len(driver.error_at),
        "checkpoint_rounds_started": len(window_rounds),
        "checkpoint_round_s": [r.get("seconds") for r in window_rounds],
        "checkpoint_round_errors": [r["error"] for r in window_rounds if "error" in r],
        "this_process_cpu_s": round(cpu1 - cpu0, 1),
        "broker_cpu_s": broker_cpu,
        "group_committer_cpu_s": committer_cpu,
        "group_commit_rounds": int(commit_rounds),
        "group_commit_last_round_s": round(commit_stats[1], 1),
        "group_commit_failures": int(commit_stats[2]),
        "rss_mb_after_window": round(rss_after_window_mb),
    }
    out["driver_errors"] = driver.errors[:5]
    out["checkpoint_rounds"] = [
        {k: (round(v - t0, 2) if k == "at" else v) for k, v in r.items()} for r in rounds
    ]  # fmt: skip
    out["samples"] = {"columns": ["s", *internal], "rows": sampler.samples}
    out["stop"] = stop_timing
    print(json.dumps(out["window"]), flush=True)

    # -- read-backs, with the load stopped ---------------------------------------------------------------------------
    admin = kafka_clients.admin(plaintext(target))
    out["topic_records"] = {t: end_offset(admin, t) for t in internal}
    out["total_batches"] = driver.batch
    reads: list[dict] = []

    def note(entry: dict) -> None:
        reads.append(entry)
        print(json.dumps(entry), flush=True)

    entry, status = timed("status: views.flow_status", lambda: flow_status(config, flow))
    if status is not None:
        entry |= {
            "partitions": len(status.partitions),
            "source_reachable": status.source_reachable,
            "lag_total": sum(p.lag or 0 for p in status.partitions),
            "heartbeat_age_s": status.heartbeat_age_s,
            "partitions_with_checkpoint_age": sum(p.checkpoint_age_s is not None for p in status.partitions),
        }
    note(entry)
    entry, plan = timed("failover --dry-run: views.failover_plan", lambda: failover_plan(config, flow))
    if plan is not None:
        entry |= {"rows": len(plan), "groups": len({r.group for r in plan})}
        entry["rows_without_reread"] = sum(r.reread is None for r in plan)
    note(entry)
    del status, plan
    entry, _ = run_cli(
        "CLI start-up baseline: validate", ["validate", "--config", str(config_path)], args.cli_timeout_s
    )
    note(entry)
    entry, stdout = run_cli(
        "status --json (CLI)", ["status", "--config", str(config_path), "--json"], args.cli_timeout_s
    )
    if entry["outcome"] == "ok":
        entry["partitions"] = sum(len(f["partitions"]) for f in json.loads(stdout)["flows"])
    note(entry)
    fail_args = ["failover", "--config", str(config_path), "--flow", flow.name, "--dry-run"]
    entry, stdout = run_cli("failover --dry-run (CLI)", fail_args, args.cli_timeout_s)
    if entry["outcome"] == "ok":
        entry["rows"] = max(0, len(stdout.splitlines()) - 1)
    note(entry)
    restarted = DrSync(config, flow)
    entry, _ = timed("restart read-back: DrSync.prepare", restarted.prepare)
    if entry["outcome"] == "ok" and not restarted._prepared:  # prepare logs a read that hit its deadline, and returns
        entry["outcome"] = "gave up: the read-back did not complete (see the log line above; it hit its deadline)"
    entry |= {
        "syncs_partitions": len(restarted.syncs.partitions()),
        "checkpoints_loaded": len(restarted.checkpoints.checkpoints),
    }
    note(entry)
    # Where the read-backs' time goes: the parts status, failover and prepare are made of.
    parts = [
        ("part: internal.read_offset_syncs", lambda: read_offset_syncs(config, flow)),
        ("part: internal.read_checkpoints", lambda: read_checkpoints(config, flow)),
        (
            "part: clients.read_topic of the checkpoints, not decoded",
            lambda: clients.read_topic(config.cluster(TARGET), internal[1]),
        ),
        (
            f"part: internal.source_ends ({len(layout.slots)} partitions, one batched request)",
            lambda: source_ends(config.cluster(SOURCE), layout.slots, STATUS_SOURCE_TIMEOUT_S),
        ),
    ]
    for what, call in parts:
        entry, value = timed(what, call)
        if isinstance(value, list):  # what the topic holds now, after whatever the broker compacted
            entry["records"] = len(value)
        note(entry)
    out["reads"] = reads
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out["read_deadline_s"] = clients.REQUEST_TIMEOUT_S
    return out


# -- output -----------------------------------------------------------------------------------------------------------


def figure(entry: dict) -> str:
    return f"{entry['seconds']} s" if entry["outcome"] == "ok" else entry["outcome"].split(":")[0]


def markdown(meta: dict, out: dict) -> str:
    w = out["window"]
    size = f"{meta['topics']} x {meta['partitions']} partitions, {meta['groups']} groups"
    rounds = [s for s in w["checkpoint_round_s"] if s is not None]
    lines = [
        f"# DR load {meta['stamp']}",
        "",
        f"{meta['machine']}; {size}; batches of {meta['batch_records']} records per partition at"
        f" {meta['batch_rate']}/s; checkpoint_interval_s {meta['checkpoint_interval_s']}; groups commit every"
        f" {meta['commit_interval_s']} s; window {w['seconds']} s after {meta['warmup_s']} s of warm-up; two"
        f" plaintext test-bed clusters on loopback; code at {meta['commit']}.",
        "",
        "| measure | figure |",
        "|---|---|",
        f"| batches/s achieved (target {meta['batch_rate']}) | {w['batches_per_s']} |",
        f"| offset syncs written/s | {w['offset_syncs_per_s']:,} (P x batches/s ="
        f" {w['offset_syncs_per_s_expected']:,}) |",
        f"| `on_landed` per batch, ms p50 / p99 / max | {w['on_landed_ms']['p50']} / {w['on_landed_ms']['p99']} /"
        f" {w['on_landed_ms']['max']} |",
        f"| checkpoints written/s | {w['checkpoints_per_s']:,} (G x P / interval ="
        f" {w['checkpoints_per_s_if_every_round_on_time']:,}) |",
        f"| checkpoint rounds started in window, seconds each | {w['checkpoint_rounds_started']}:"
        f" {', '.join(str(s) for s in rounds) or '-'} |",
        f"| failed checkpoint rounds: in window / whole run | {len(w['checkpoint_round_errors'])} /"
        f" {sum('error' in r for r in out['checkpoint_rounds'])} of {len(out['checkpoint_rounds'])} |",
        f"| batches whose `on_landed` raised: in window / whole run | {w['on_landed_errors']} /"
        f" {w['on_landed_errors_whole_run']} of {out['total_batches']} |",
    ]
    for topic, n in out["topic_records"].items():
        lines.append(f"| `{topic}` size at end, records | {n:,} |")
    for entry in out["reads"]:
        extra = ""
        if "rows" in entry:
            extra = f" ({entry['rows']:,} rows)"
        elif "partitions" in entry:
            extra = f" ({entry['partitions']:,} partitions)"
        elif "records" in entry:
            extra = f" ({entry['records']:,} records)"
        elif "checkpoints_loaded" in entry:
            extra = f" ({entry['syncs_partitions']:,} partitions' syncs, {entry['checkpoints_loaded']:,} checkpoints)"
        lines.append(f"| {entry['what']} | {figure(entry)}{extra} |")
    lines += [
        f"| `DrSync.stop` (final flush and checkpoint) | {figure(out['stop'])} |",
        f"| CPU s in window: this process / source broker / target broker / group committer |"
        f" {w['this_process_cpu_s']} / {w['broker_cpu_s'][SOURCE]} / {w['broker_cpu_s'][TARGET]} /"
        f" {w['group_committer_cpu_s']} |",
        "",
        "Rates: end offsets of the internal topics before and after the window. Read-backs ran after the load stopped;"
        f" each internal read has a {out['read_deadline_s']:.0f} s deadline. CLI times include interpreter start-up"
        " (the `validate` row).",
    ]
    if w["checkpoint_round_errors"]:
        lines.append(
            "A failed checkpoint round stops at its error: the checkpoints it produced before it still reach the topic"
            " and count in the rate, but the service does not record them as written."
        )
    failures = [e for e in out["reads"] if e["outcome"] != "ok"] + w["checkpoint_round_errors"]
    for entry in failures:
        lines.append(f"\n- {entry['what']}: {entry['outcome']}" if isinstance(entry, dict) else f"\n- round: {entry}")
    if out["driver_errors"]:
        lines.append(f"\n- on_landed: {out['driver_errors'][0]}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100, help="per topic")
    parser.add_argument("--groups", type=int, default=200, help="consumer groups, each on every partition")
    parser.add_argument("--batch-records", type=int, default=5, help="records per partition per batch (B)")
    parser.add_argument("--batch-rate", type=float, default=4.0, help="batches/s (the default trigger is 0.25 s)")
    parser.add_argument("--window-s", type=float, default=60.0, help="the measured window")
    parser.add_argument("--warmup-s", type=float, default=15.0, help="load before the window, not counted")
    parser.add_argument("--commit-interval-s", type=float, default=10.0, help="how often each group commits")
    parser.add_argument("--value-size", type=int, default=64, help="bytes per preloaded record")
    parser.add_argument("--cli-timeout-s", type=float, default=600.0, help="kill a CLI run after this long")
    parser.add_argument("--out", type=Path, default=None, help="result path without suffix")
    args = parser.parse_args()
    if min(args.topics, args.partitions, args.groups, args.batch_records) < 1 or args.batch_rate <= 0:
        parser.error("sizes must be at least 1 and --batch-rate positive")

    from bench.testbed.testbed import TestBed

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    meta = {
        "stamp": stamp,
        "machine": f"{os.cpu_count()} cores, {mem_gb:.0f} GB",
        "commit": commit.stdout.strip() or "unknown",
        "argv": sys.argv[1:],
        "topics": args.topics,
        "partitions": args.partitions,
        "partitions_total": args.topics * args.partitions,
        "groups": args.groups,
        "batch_records": args.batch_records,
        "batch_rate": args.batch_rate,
        "window_s": args.window_s,
        "warmup_s": args.warmup_s,
        "commit_interval_s": args.commit_interval_s,
        "checkpoint_interval_s": MirrorConfig.model_fields["checkpoint_interval_s"].default,
        "heartbeat_interval_s": MirrorConfig.model_fields["heartbeat_interval_s"].default,
    }
    bed = TestBed()
    work = Path(tempfile.mkdtemp(prefix="mirrorkit-dr-load-"))
    try:
        bed.start(SOURCE, "plaintext")
        bed.start(TARGET, "plaintext")
        out = measure(args, work, bed)
    finally:
        bed.close()
    path = args.out or RESULTS / f"dr-load-{stamp}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": out}, indent=2))
    text = markdown(meta, out)
    path.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
