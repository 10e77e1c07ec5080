"""The mirror against MirrorMaker 2 and against a plain Java copy loop: same brokers, same machine, one run.

It starts two clusters with the test bed, the source plaintext and the target of `--target-kind` (TARGET_KINDS:
plaintext, SASL_SSL PLAIN as Event Hubs', SASL_SSL SCRAM-SHA-512 as MSK's, or TLS with a client certificate), loads
the source (bench/write_paths.py's records: tricky headers, null keys, explicit timestamps), and copies everything
into empty, pre-created target topics with each candidate in turn:

- `mirror`: `python -m spark_app run --available-now --master local[2]`, the real CLI and the shipped write path
  (the compiled copy core); `mirror-python`: the same with the flow's `copy_core: python`, the per-record Python loop;
  `mirror-eos`, `mirror-eos-python`: those two with `exactly_once: true`, timed from the first record written to the
  last one a read_committed reader can see (the flow's committed positions, which commit with the records) and
  checked by reading the copies so;
- `wp:<path>`: a write path of bench/write_paths.py (e.g. `wp:sink+interceptor`), in its own Spark child;
- `mm2`, `mm2-untuned`: MirrorMaker 2 in dedicated mode (org.apache.kafka.connect.mirror.MirrorMaker), tasks.max=2,
  with the tuned batching of FACTS.md or Connect's defaults; `mm2-eos`: tuned, with KIP-618 exactly-once source
  support, timed from the first record written to the last one a read_committed consumer of the target sees, and
  checked as `mirror-eos` is;
- `limit`: bench/java CopyLoop, one KafkaConsumer feeding one KafkaProducer with the same delivery settings.

For each it samples the candidate's whole process tree from /proc (CPU seconds, peak RSS) and the target's end
offsets: start-up is launch to the first record on the target, records/s is the copy from first to last record.
A copy counts only if every target partition ends exactly at the source's end offset (an exactly-once copy: holds
exactly the source's records for a read_committed reader, its commit markers and aborted attempts aside), and its
first and last records equal the source's (key, value, headers, timestamp). `--topics-scale 1,10,100` repeats the
copy at each topic count to show how start-up, throughput and memory grow.

Then it measures end-to-end replication latency at a steady rate for each of `--latency-candidates`
(LATENCY_CANDIDATES), each started first on fresh topics of the same shape:

- `mirror`: throughput mode run continuously (`run` without --available-now, the shipped trigger_interval_s);
- `mirror-realtime`, `mirror-realtime-eos`: `mode: realtime`, at least once (its transactions only fence zombie
  tasks) or with `exactly_once: true` (records and positions committed every exactly_once_commit_interval_s);
  `mirror-realtime-python`, `mirror-realtime-eos-python`: those two with `copy_core: python`, whose slots copy with
  the Python loop and librdkafka instead of the compiled core (Kafka's Java clients on the executors' JVMs, or the
  Rust core into Event Hubs); `mirror-realtime-identity`, `mirror-realtime-eos-identity`: the first two with
  `replication_policy: identity`, whose copies keep their source topics' names and carry the provenance header;
- `mm2`, `mm2-eos`: tuned MM2, at least once or with KIP-618 exactly-once source support;
- `limit`, `limit-txn`: bench/java's CopyLoop, `loop`, `loop-txn`: bench/copy_loop.py's librdkafka loop, each in
  `--realtime-tasks` slots with the real-time task's linger, without transactions or committing every TXN_COMMIT_S as
  an at-least-once real-time slot does: the floor of each client library, with and without the slot's transactions.
  `limit-eos`: CopyLoop committing as often as the mirror's exactly-once slots do in this run
  (`eos_commit_interval_s`), read read_committed: the floor of `mirror-realtime-eos`, whose transactions hold its
  positions too. The copy loops write through the target's plaintext listener, whatever `--target-kind`.
  `limit-txn-mm2-linger` is `limit-txn` with tuned MM2's producer linger (20 ms): what real-time tasks copying with
  Kafka's Java clients would do (docs/benchmarks.md).

Before the first of them, the plain `loop` copies under the same load for `--latency-broker-warmup` seconds (120),
not counted: freshly started brokers answer slowly for minutes, and the first candidate paid for it.

Once a warm-up record has crossed every partition, bench/latency.py's probe sends, at each of `--latency-rates`,
that many records/s of `--size` B for `--latency-seconds`, stamped with their send time as CreateTime, and reads the
target as the candidate's consumers would: read_committed for an exactly-once candidate (and `limit-eos`),
read_uncommitted (the Java consumer's default) for the others. It reads through the target's plaintext admin listener
whatever `--target-kind` (its own login left out of the figures). Per record: receive time minus that timestamp.
Records sent in the first `--latency-warmup` seconds do not count. It reports the isolation level read at, when the
candidate commits on the target, the achieved send rate, records sent and received, p50, p99, p99.9 and max, and the
candidate's CPU seconds over the counted window.

Results go to bench/results/<stamp>.json, .md (each figure with its ratio to MM2 and to the limit; p99 with its
ratio to MM2 read at the same isolation level) and .png.

Usage: .venv/bin/python bench/harness.py [--records 1000000] [--size 512] [--topics 4] [--partitions 4]
       [--target-kind plaintext|eventhubs|msk-scram|mtls]
       [--candidates mirror,mirror-python,mirror-eos,mirror-eos-python,mm2,mm2-untuned,mm2-eos,limit]
       [--topics-scale 1,10,100 --scale-records 100000]
       [--latency-candidates mirror,mirror-realtime,mirror-realtime-eos,mirror-realtime-python,
                             mirror-realtime-eos-python,mirror-realtime-identity,mirror-realtime-eos-identity,
                             mm2,mm2-eos,limit,limit-txn,limit-eos,loop,loop-txn,limit-txn-mm2-linger]
       [--latency-rates 10000,50000] [--realtime-tasks 2] [--eos-commit-interval 0.2]
       [--latency-seconds 60] [--latency-warmup 15] [--latency-broker-warmup 120] [--out /tmp/run]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, OffsetSpec  # noqa: E402

from bench import latency  # noqa: E402
from bench import write_paths as wp  # noqa: E402
from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed import mm2  # noqa: E402
from bench.testbed.clients import plaintext  # noqa: E402
from bench.testbed.kafka_cluster import ListenerKind  # noqa: E402
from bench.testbed.ports import free_port  # noqa: E402
from bench.testbed.proc import TreeMonitor  # noqa: E402
from images.fetch_jars import cached_jars  # noqa: E402
from spark_app.config import EXACTLY_ONCE_COMMIT_S, ClusterConfig, FlowMode, MirrorConfig  # noqa: E402
from spark_app.policy import positions_group, target_topic, transactional  # noqa: E402
from spark_app.profiles import read_secret  # noqa: E402
from spark_app.realtime.task import LIBRDKAFKA_LINGER_MS, TXN_COMMIT_S  # noqa: E402

RESULTS = ROOT / "bench" / "results"
COPY_LOOP = ROOT / "bench" / "java"
MM2_TUNED = {"target.producer.linger.ms": "20", "target.producer.batch.size": "1048576"}
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
# How the copiers reach the target (a test-bed listener kind), as the results say it.
TARGET_KINDS = {
    ListenerKind.PLAINTEXT: "plaintext",
    ListenerKind.EVENTHUBS: "the target in SASL_SSL PLAIN as Event Hubs',",
    ListenerKind.MSK_SCRAM: "the target in SASL_SSL SCRAM-SHA-512 as MSK's,",
    ListenerKind.MTLS: "the target in TLS with a client certificate,",
}


# The mirror as a throughput candidate: the shipped core or the Python loop, at least once or exactly once; MM2 tuned
# or not, or tuned with exactly-once source support.
MIRROR_CANDIDATES = ("mirror", "mirror-python", "mirror-eos", "mirror-eos-python")
MM2_CANDIDATES = ("mm2", "mm2-untuned", "mm2-eos")
# Those that copy exactly once: timed and checked as a read_committed reader sees the copy.
EXACTLY_ONCE_CANDIDATES = ("mirror-eos", "mirror-eos-python", "mm2-eos")


@dataclass(frozen=True)
class LatencyCandidate:
    """A copier under the latency probe, and the isolation level the probe reads its target at: the one its
    consumers would use. Exactly once holds only for read_committed readers, who wait for each commit; at least once,
    read as Kafka's Java consumer does by default (read_uncommitted), not as librdkafka's (read_committed)."""

    copier: Literal["mirror", "mm2", "limit", "loop"]
    isolation: str
    mode: FlowMode = FlowMode.THROUGHPUT  # the mirror's
    exactly_once: bool = False
    # The copy loops' transactions: none; `fencing`, committed every TXN_COMMIT_S as an at-least-once real-time slot
    # of the mirror does; `eos`, as often as its exactly-once slots commit in this run (eos_commit_interval_s).
    transactions: Literal["fencing", "eos"] | None = None
    linger_ms: int = LIBRDKAFKA_LINGER_MS  # the copy loops' producer linger: by default the librdkafka slots'
    copy_core: str = "compiled"  # the mirror's
    policy: Literal["default", "identity"] = "default"  # the mirror's replication_policy


LATENCY_CANDIDATES = {
    "mirror": LatencyCandidate("mirror", READ_UNCOMMITTED),
    "mirror-realtime": LatencyCandidate("mirror", READ_UNCOMMITTED, FlowMode.REALTIME),
    "mirror-realtime-eos": LatencyCandidate("mirror", READ_COMMITTED, FlowMode.REALTIME, exactly_once=True),
    "mirror-realtime-python": LatencyCandidate("mirror", READ_UNCOMMITTED, FlowMode.REALTIME, copy_core="python"),
    "mirror-realtime-eos-python": LatencyCandidate(
        "mirror", READ_COMMITTED, FlowMode.REALTIME, exactly_once=True, copy_core="python"
    ),
    "mirror-realtime-identity": LatencyCandidate("mirror", READ_UNCOMMITTED, FlowMode.REALTIME, policy="identity"),
    "mirror-realtime-eos-identity": LatencyCandidate(
        "mirror", READ_COMMITTED, FlowMode.REALTIME, exactly_once=True, policy="identity"
    ),
    "mm2": LatencyCandidate("mm2", READ_UNCOMMITTED),
    "mm2-eos": LatencyCandidate("mm2", READ_COMMITTED, exactly_once=True),
    "limit": LatencyCandidate("limit", READ_UNCOMMITTED),
    "limit-txn": LatencyCandidate("limit", READ_UNCOMMITTED, transactions="fencing"),
    "limit-eos": LatencyCandidate("limit", READ_COMMITTED, transactions="eos"),
    "loop": LatencyCandidate("loop", READ_UNCOMMITTED),
    "loop-txn": LatencyCandidate("loop", READ_UNCOMMITTED, transactions="fencing"),
    "limit-txn-mm2-linger": LatencyCandidate(
        "limit", READ_UNCOMMITTED, transactions="fencing", linger_ms=int(MM2_TUNED["target.producer.linger.ms"])
    ),
}
# When Connect commits an exactly-once task's transaction: after each poll, its default `transaction.boundary`.
MM2_EOS_COMMITS = "per poll"


def end_offsets(admin: AdminClient, topics: list[str], partitions: int) -> dict[tuple[str, int], int]:
    """End offset of every partition; retried while new topics' leaders settle."""
    wanted = {TopicPartition(t, p): OffsetSpec.latest() for t in topics for p in range(partitions)}
    for attempt in range(20):
        try:
            return {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(wanted).items()}
        except KafkaException:
            if attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def launch(cmd: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> tuple[subprocess.Popen, TreeMonitor]:
    """Start a candidate in its own session (so it is stopped with all its children), sampled from the start."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, TreeMonitor(proc.pid)


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the candidate's whole session (the mirror stops after its batch in flight), SIGKILL after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def log_tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def run_candidate(
    name: str, cmd: list[str], env: dict[str, str], target: str, out_topics: list[str], partitions: int,
    expected: int, exits_by_itself: bool, log: Path, timeout: float, committed: Callable[[], int] | None = None,
    cwd: Path = ROOT,
) -> dict:  # fmt: skip
    """Launch, watch the target fill up, stop; timings, CPU and memory of the whole process tree. With `committed`
    (an exactly-once copy's count of the source records a read_committed reader can see so far), the copy ends once
    it reaches every record (what such a reader sees, not what was written: the end offsets count commit markers and
    aborted attempts too); it starts, as any, at the first record written, and `visible_s` says when a read_committed
    reader saw the first ones (the first transaction's commit)."""
    admin = kafka_clients.admin(plaintext(target))
    began = time.monotonic()
    proc, monitor = launch(cmd, env, log, cwd)
    first = done = visible = None
    written = total = 0
    try:
        while time.monotonic() - began < timeout:
            if committed is None or first is None:
                written = sum(end_offsets(admin, out_topics, partitions).values())
            total = written if committed is None else committed()
            now = time.monotonic()
            if committed is not None and total and visible is None:
                visible = now
            if written and first is None:
                first = now
            if total >= expected:
                done = now
                break
            if proc.poll() is not None:
                break
            time.sleep(0.2)
        if exits_by_itself and done is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=120)
    finally:
        terminate(proc)
        cpu, peak = monitor.stop()
    result = {"candidate": name, "records": expected, "cpu_s": round(cpu, 1), "peak_rss_mb": round(peak),
              "peak_pss_mb": round(monitor.peak_pss / 1e6)}  # fmt: skip
    if done is None or first is None:
        tail = log_tail(log)
        return result | {"error": f"copied {total} of {expected} (exit {proc.returncode}); log tail:\n{tail}"}
    copy_s = max(done - first, 0.2)
    if visible is not None:
        result["visible_s"] = round(visible - began, 1)
    return result | {
        "startup_s": round(first - began, 1),
        "copy_s": round(copy_s, 1),
        "wall_s": round(done - began, 1),
        "records_per_s": round(expected / copy_s),
        "exit_code": proc.returncode,
    }


def committed_total(target: str, group: str, topics: list[str], partitions: int) -> int:
    """How many source records `group` has committed positions past, over every partition of `topics`."""
    return sum(sum(kafka_clients.committed(plaintext(target), group, t, partitions).values()) for t in topics)


@contextlib.contextmanager
def visible_records(target: str, topics: list[str], partitions: int) -> Iterator[Callable[[], int]]:
    """A count of the records a read_committed consumer of `topics` has read so far, read on at each call: how an
    exactly-once copy is timed when it keeps no positions the bench can ask for (MM2's sit in Connect's offsets
    topic). The count costs the bench's own process a consumer's reads of the whole copy."""
    consumer = kafka_clients.consumer(
        plaintext(target), f"bench-visible-{os.getpid()}",
        {"isolation.level": READ_COMMITTED, "enable.auto.commit": False},
    )  # fmt: skip
    consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in range(partitions)])
    seen = 0

    def count() -> int:
        nonlocal seen
        while batch := consumer.consume(10_000, 0.05):
            seen += sum(msg.error() is None for msg in batch)
        return seen

    try:
        yield count
    finally:
        consumer.close()


def mirror_config(
    alias: str,
    source: str,
    target: ClusterConfig,
    topics: list[str],
    work: Path,
    mode: FlowMode = FlowMode.THROUGHPUT,
    realtime_tasks: int = 1,
    exactly_once: bool = False,
    copy_core: str = "compiled",
    eos_commit_interval_s: float | None = None,
    policy: Literal["default", "identity"] = "default",
) -> dict:
    """A config with the shipped defaults and one flow from `alias` to the `target` cluster in `mode` (real time: with
    `realtime_tasks`), exactly once or not (its `exactly_once_commit_interval_s` as given), copied by `copy_core`, its
    copies named by `policy` (identity: the source's names, and the provenance header the flow stamps by default)."""
    interval = {} if eos_commit_interval_s is None else {"exactly_once_commit_interval_s": eos_commit_interval_s}
    return {
        "clusters": [
            {"alias": alias, "bootstrap_servers": source, "profile": "kafka"},
            target.model_dump(mode="json", exclude_none=True, exclude_defaults=True),
        ],
        "flows": [
            {
                "source": alias,
                "target": target.alias,
                "topics": {"include": topics},
                "replication_policy": policy,
                "checkpoint_location": str(work / alias),
                "mode": mode.value,
                "realtime_tasks": realtime_tasks,
                "exactly_once": exactly_once,
                "copy_core": copy_core,
            }
            | interval
        ],
    }


def mirror_command(config: dict, work: Path, available_now: bool) -> list[str]:
    """The mirror's CLI on `config`, written to `work`; a continuous run gets a free metrics port."""
    if not available_now:
        config = config | {"metrics_port": free_port()}
    path = work / f"{config['flows'][0]['source']}.yaml"
    path.write_text(yaml.safe_dump(config))
    run = [sys.executable, "-m", "spark_app", "run", "--config", str(path), "--master", "local[2]"]
    return run + ["--available-now"] if available_now else run


def mirror_commits(config: dict) -> str:
    """When the mirror's flow commits on the target, which is when a read_committed reader sees its records: never
    (no transactions), per micro-batch, or every so many seconds in real time (at least once, its transactions only
    fence zombie tasks and commit with each report)."""
    mirror = MirrorConfig.model_validate(config)
    flow = mirror.flows[0]
    target = next(c for c in mirror.clusters if c.alias == flow.target)
    if not transactional(flow, target.is_eventhubs):
        return "none"
    if flow.mode is not FlowMode.REALTIME:
        return "per batch"
    return f"every {eos_commit_interval_s(config) if flow.exactly_once else TXN_COMMIT_S} s"


def eos_commit_interval_s(config: dict) -> float:
    """How often the exactly-once real-time slots of `config`'s flow commit their records and positions: the one
    place the harness reads it, for the mirror's rows and for `limit-eos`, which commits as often."""
    return MirrorConfig.model_validate(config).flows[0].exactly_once_commit_interval_s


def mm2_command(
    alias: str, source: str, target: ClusterConfig, topics: list[str], tuned: bool, work: Path,
    exactly_once: bool = False,
) -> list[str]:  # fmt: skip
    """MirrorMaker 2 in dedicated mode into the `target` cluster (aliased `target` there, signed in as the mirror
    is), tuned as FACTS.md says a user would, with exactly-once source support or not. A client certificate and its
    key go into one PEM keystore file in `work` (0600), as Kafka's Java clients read them from a properties file."""
    signed_in = {f"target.{k}": v for k, v in kafka_clients.java_settings(target).items() if k != "bootstrap.servers"}
    if target.client_cert_file is not None and target.client_key is not None:
        keystore = work / f"mm2-{alias}-keystore.pem"
        keystore.touch(mode=0o600)
        key = read_secret(target.client_key, f"cluster '{target.alias}' client_key")
        keystore.write_text(f"{key}\n{Path(target.client_cert_file).read_text()}")
        signed_in |= {"target.ssl.keystore.type": "PEM", "target.ssl.keystore.location": str(keystore)}
    tuning = MM2_TUNED | {f"{alias}.consumer.max.poll.records": "10000"} if tuned else {}
    return mm2.mm2_command(alias, source, "target", target.bootstrap_servers, topics, work, signed_in | tuning,
                           exactly_once)  # fmt: skip


def make_mm2_topics(target: str, target_client: ClusterConfig, alias: str) -> list[str]:
    """On a target where topics cannot be made from Kafka (an Event Hubs-like one), MM2's own topics there, made first
    through the bench's admin access as an operator would; the names made, to delete after the run."""
    if not target_client.is_eventhubs:
        return []
    existing = kafka_clients.admin(plaintext(target)).list_topics(timeout=15).topics
    wanted = {name: n for name, n in mm2.target_topics(alias).items() if name not in existing}
    kafka_clients.create_topics(plaintext(target), wanted, {"cleanup.policy": "compact"})
    return list(wanted)


def show(result: dict) -> None:
    """One line of JSON per candidate as it finishes, then its error (with the log tail) if it failed."""
    print(json.dumps({k: v for k, v in result.items() if k != "error"}), result.get("error", ""), flush=True)


def candidate_env(checkout: Path = ROOT) -> dict[str, str]:
    """The environment every candidate runs in: Spark's Python workers import `checkout`'s spark_app."""
    return os.environ | {
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(checkout),
    }


def copy_loop_command(
    work: Path, source: str, target: str, prefix: str, records: int, topics: list[str], linger_ms: int = 20,
    commit_ms: int = 0, slots: int = 1,
) -> list[str]:  # fmt: skip
    """The command that runs bench/java's CopyLoop (compiled into `work` on first use): every partition of `topics`
    from `source` to `<prefix><topic>` on `target`, exiting once it has copied `records` (0: copying until stopped);
    in `slots` threads, transactions committed every `commit_ms` when set."""
    kafka = list(cached_jars("kafka"))
    jar = work / "copy-loop.jar"
    if not jar.exists():
        wp.build_jar(COPY_LOOP, kafka, work, jar.name)
    cp = os.pathsep.join(str(j) for j in [jar, *kafka])
    return ["java", "-Xmx1g", "-cp", cp, "io.mirrorkit.bench.CopyLoop", source, target, prefix, str(records),
            ",".join(topics), str(linger_ms), str(commit_ms), str(slots)]  # fmt: skip


def copy_loop_latency_command(
    spec: LatencyCandidate, work: Path, source: str, target: str, prefix: str, topics: list[str], slots: int,
    eos_commit_s: float,
) -> tuple[list[str], str]:  # fmt: skip
    """A copy loop's command as a latency candidate, and when it commits: in `slots` slots with the candidate's
    linger, in `spec.transactions` committed every TXN_COMMIT_S as an at-least-once real-time slot does, or every
    `eos_commit_s` as an exactly-once one does."""
    commit_s = {None: 0.0, "fencing": TXN_COMMIT_S, "eos": eos_commit_s}[spec.transactions]
    commit_ms = round(commit_s * 1000)
    if spec.copier == "limit":
        cmd = copy_loop_command(work, source, target, prefix, 0, topics, spec.linger_ms, commit_ms, slots)
    else:
        cmd = [sys.executable, str(ROOT / "bench" / "copy_loop.py"), source, target, prefix, ",".join(topics),
               "--slots", str(slots), "--commit-ms", str(commit_ms)]  # fmt: skip
    return cmd, f"every {commit_s} s" if commit_s else "none"


def run_all(args: argparse.Namespace, bed, work: Path, topics: list[str], records: int, tag: str) -> list[dict]:
    """Every candidate over one loaded topic set; each into its own fresh target topics."""
    source = bed.clusters["src"].client.bootstrap_servers
    target, target_client = bed.clusters["tgt"].admin.bootstrap_servers, bed.clusters["tgt"].client
    source_hw = {t: wp.watermarks(source, t, args.partitions) for t in topics}
    env = candidate_env()
    results = []
    for n, name in enumerate(c for c in args.candidates.split(",") if c):
        alias = f"{tag}c{n}"
        out_topics = [f"{alias}.{t}" for t in topics]
        wp.create_topics(target, out_topics, args.partitions)
        made = make_mm2_topics(target, target_client, alias) if name in MM2_CANDIDATES else []
        exits = True
        run_env = env
        exactly_once = name in EXACTLY_ONCE_CANDIDATES
        committed: Callable[[], int] | None = None
        stack = contextlib.ExitStack()
        if name in MIRROR_CANDIDATES:
            core = "python" if name.endswith("-python") else "compiled"
            config = mirror_config(alias, source, target_client, topics, work, exactly_once=exactly_once,
                                   copy_core=core)  # fmt: skip
            cmd = mirror_command(config, work, available_now=True)
            if exactly_once:
                group = positions_group(MirrorConfig.model_validate(config).flows[0])
                committed = functools.partial(committed_total, target, group, out_topics, args.partitions)
        elif name in MM2_CANDIDATES:
            cmd = mm2_command(alias, source, target_client, topics, name != "mm2-untuned", work, exactly_once)
            exits = False
            if exactly_once:
                committed = stack.enter_context(visible_records(target, out_topics, args.partitions))
        elif name == "limit":
            cmd = copy_loop_command(work, source, target, alias + ".", records, topics)
        elif name.startswith("wp:"):
            ns = argparse.Namespace(max_offsets_per_trigger=0, partitions=args.partitions, java_producer=[])
            cmd, run_env, _ = wp.child_command(name[3:], alias + ".", ns, source, target, topics, work)
        else:
            raise SystemExit(f"unknown candidate '{name}'")
        log = work / f"{alias}.log"
        # The load (or the previous candidate's copy) leaves hundreds of MB of the brokers' writes in the page cache:
        # written back during a candidate, they cost it seconds of start-up and throughput that the next one is spared.
        os.sync()
        with stack:
            result = run_candidate(name, cmd, run_env, target, out_topics, args.partitions, records, exits, log,
                                   args.timeout, committed)  # fmt: skip
        result["scenario"] = f"{len(topics)}x{args.partitions}"
        result["mb_per_s"] = round(result.get("records_per_s", 0) * args.size / 1e6, 1)
        if "error" not in result:
            check = wp.Result(name)
            spec = {"topics": topics, "prefix": alias + ".", "target": target, "source": source}
            pairs = [(t, p) for t in topics for p in range(args.partitions)]
            if exactly_once:  # the copies as a read_committed reader reads them, whole
                wp.verify_committed(check, spec, source_hw, args.partitions)
                result["counts_ok"] = check.counts_ok
            else:
                if len(topics) <= 10:  # sampling both ends of hundreds of partitions would dominate the run
                    wp.verify(check, spec, source_hw, args.partitions)
                ends = end_offsets(kafka_clients.admin(plaintext(target)), out_topics, args.partitions)
                result["counts_ok"] = all(ends[(alias + "." + t, p)] == source_hw[t][p] for t, p in pairs)
            if len(topics) <= 10:
                result["records_equal"] = check.data_ok and check.ts_kept and check.headers_kept
        show(result)
        results.append(result)
        wp.delete_topics(target, out_topics + made)
    return results


def run_latency(
    args: argparse.Namespace, name: str, rate: int, n: int, source: str, target: str, target_client: ClusterConfig,
    work: Path, brokers_cpu: Mapping[str, Callable[[], float]],
) -> dict:  # fmt: skip
    """One candidate running continuously on fresh topics, under the probe's steady `rate` (bench/latency.py), read
    at the candidate's isolation level; with its CPU, each broker's CPU over the same window (`brokers_cpu`): the
    load a candidate's requests put on the brokers shares this machine's cores with it."""
    spec = LATENCY_CANDIDATES[name]
    alias = f"lat{n}"
    topics = [f"{alias}-{t}" for t in range(args.topics)]
    out_topics = [f"{alias}.{t}" for t in topics]  # MM2's default policy, and the copy loops' prefix
    made: list[str] = []
    if spec.copier == "mirror":
        config = mirror_config(alias, source, target_client, topics, work, spec.mode, args.realtime_tasks,
                               spec.exactly_once, spec.copy_core, args.eos_commit_interval,
                               spec.policy)  # fmt: skip
        out_topics = [target_topic(MirrorConfig.model_validate(config).flows[0], t) for t in topics]
        cmd, commits = mirror_command(config, work, available_now=False), mirror_commits(config)
    elif spec.copier == "mm2":
        made = make_mm2_topics(target, target_client, alias)
        cmd = mm2_command(alias, source, target_client, topics, True, work, spec.exactly_once)
        commits = MM2_EOS_COMMITS if spec.exactly_once else "none"
    else:
        # as often as the mirror's exactly-once slots would commit in this run
        eos = mirror_config(alias, source, target_client, topics, work, FlowMode.REALTIME, args.realtime_tasks, True,
                            eos_commit_interval_s=args.eos_commit_interval)  # fmt: skip
        cmd, commits = copy_loop_latency_command(spec, work, source, target, f"{alias}.", topics, args.realtime_tasks,
                                                 eos_commit_interval_s(eos))  # fmt: skip
    wp.create_topics(source, topics, args.partitions)
    wp.create_topics(target, out_topics, args.partitions)
    log = work / f"{alias}.log"
    result: dict = {"candidate": name, "scenario": f"{args.topics}x{args.partitions}", "rate": rate}
    result |= {"exactly_once": spec.exactly_once, "isolation": spec.isolation, "commits": commits}
    proc, monitor = launch(cmd, candidate_env(), log)
    try:
        result |= latency.measure(
            source, target, topics, out_topics, args.partitions, rate, args.latency_seconds,
            args.latency_warmup, args.size, spec.isolation, {"cpu_s": monitor.cpu_s, **brokers_cpu},
            lambda: proc.poll() is None, args.timeout,
        )  # fmt: skip
    except RuntimeError as err:
        result["error"] = f"{err} (exit {proc.poll()}); log tail:\n{log_tail(log)}"
    finally:
        terminate(proc)
        monitor.stop()
    show(result)
    wp.delete_topics(source, topics)
    wp.delete_topics(target, out_topics + made)
    return result


def warm_brokers(
    args: argparse.Namespace, rate: int, source: str, target: str, target_client: ClusterConfig, work: Path,
    brokers_cpu: Mapping[str, Callable[[], float]],
) -> None:  # fmt: skip
    """Run the plain copy loop under the probe's load for `--latency-broker-warmup` seconds, not counted.

    The test bed starts fresh brokers for each run, and the first candidate paid for it: in all eight runs without
    this it had the highest p99 of its run; MirrorMaker 2 run first had 4.5 times its p99 of later in the same run
    (bench/results/20261129-latency-order.txt). Why the brokers start slow is not taken apart."""
    warm = argparse.Namespace(**vars(args) | {"latency_seconds": args.latency_broker_warmup, "latency_warmup": 0.0})
    print(f"warming the brokers up: the copy loop at {rate} records/s for {args.latency_broker_warmup:.0f} s, not"
          " counted", flush=True)  # fmt: skip
    run_latency(warm, "loop", rate, -1, source, target, target_client, work, brokers_cpu)


def ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}" if value and base else "-"


def latency_lines(rows: list[dict], meta: dict) -> list[str]:
    """The Markdown section of the latency runs: one table per rate, each p99 as a ratio to MM2's of the same
    isolation level at that rate (`mm2` for rows read read_uncommitted, `mm2-eos` for those read read_committed)."""
    lat = meta["latency"]
    lines = [
        "",
        "## Replication latency",
        "",
        f"Over {rows[0]['scenario']} for {lat['seconds']} s at each rate, {meta['size']} B records; records sent in the"
        f" first {lat['warmup_s']} s are not counted, and before the first candidate the plain copy loop ran under the"
        f" same load for {lat.get('broker_warmup_s', 0)} s to warm the brokers up. `mirror`: throughput mode"
        f" (micro-batches) run continuously at the shipped trigger_interval_s ({lat['mirror_trigger_interval_s']} s);"
        " `mirror-realtime`: `mode: realtime` with"
        f" {lat.get('realtime_tasks', 1)} task(s), at least once (`-python`: copied by the Python loop instead of"
        " the compiled core; `-identity`: `replication_policy: identity`, the copies keep their topics' names and carry"
        " the provenance header); `mirror-realtime-eos`: the same with `exactly_once: true`, committing as its"
        " Commits say; MM2 tuned; `mm2-eos`: the same with exactly-once source support (KIP-618); `limit`, `loop`:"
        " the Java and librdkafka copy loops in as many slots, without transactions (`-txn`: committing as an"
        " at-least-once real-time slot does, to fence; `limit-eos`: as often as the exactly-once slots do). Each row"
        " is read at the isolation level its consumers would use: read_committed for exactly-once candidates and"
        " `limit-eos`, else read_uncommitted (the Java consumer's default). Commits: when the candidate's transactions"
        " commit on the target, which is when a read_committed reader sees its records.",
    ]
    for rate in dict.fromkeys(r["rate"] for r in rows):
        at_rate = [r for r in rows if r["rate"] == rate]
        mm2 = {r["isolation"]: r.get("p99_ms") for r in at_rate if LATENCY_CANDIDATES[r["candidate"]].copier == "mm2"}
        lines += [
            "",
            f"### {rate:,} records/s",
            "",
            "| candidate | isolation | commits | sent/s | sent | received | duplicates | p50 ms | p99 ms | p99 vs MM2"
            " | p99.9 ms | max ms | CPU s in window | source / target broker CPU s | window s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in at_rate:
            if "error" in r:
                lines.append(
                    f"| {r['candidate']} | {r['isolation']} | {r['commits']} | failed: {r['error'].splitlines()[0]} |"
                )
                continue
            lines.append(
                f"| {r['candidate']} | {r['isolation']} | {r['commits']} | {r['send_rate']:,} | {r['sent']:,} |"
                f" {r['received']:,} | {r['duplicates']:,} | {r['p50_ms']} | {r['p99_ms']} |"
                f" {ratio(r['p99_ms'], mm2.get(r['isolation']))} | {r['p999_ms']} | {r['max_ms']} | {r['cpu_s']} |"
                f" {r.get('source_broker_cpu_s', '-')} / {r.get('target_broker_cpu_s', '-')} | {r['window_s']} |"
            )
        lines += [f"\n{r['candidate']}: {r['warning']}" for r in at_rate if r.get("warning")]
    return lines + [
        "",
        "Latency: the probe consumer's receive wall time minus the target record's timestamp (the source CreateTime,",
        "set when the probe producer sent it); probe producer, consumer and candidate on this machine, one clock, 1 ms",
        "resolution. p99 vs MM2: against `mm2` for rows read read_uncommitted, `mm2-eos` for rows read read_committed.",
        "CPU s: the candidate's process tree over the counted window; broker CPU s: each broker JVM's over the same",
        "window (the probe's load, the candidate's reads and writes, and the probe consumer's reads).",
    ]


def throughput_lines(results: list[dict]) -> list[str]:
    """The Markdown table of the copies: per scenario and candidate, each figure with its ratio to MM2 and the limit."""
    lines = [
        "",
        "| scenario | candidate | records/s | vs MM2 | vs limit | MB/s | start-up s | CPU s | peak RSS MB"
        " | peak PSS MB | counts | records equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in dict.fromkeys(r["scenario"] for r in results):
        rows = [r for r in results if r["scenario"] == scenario]
        mm2 = next((r.get("records_per_s") for r in rows if r["candidate"] == "mm2"), None)
        limit = next((r.get("records_per_s") for r in rows if r["candidate"] == "limit"), None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {scenario} | {r['candidate']} | failed: {r['error'].splitlines()[0]} |")
                continue
            rate = r["records_per_s"]
            lines.append(
                f"| {scenario} | {r['candidate']} | {rate:,} | {ratio(rate, mm2)} | {ratio(rate, limit)} |"
                f" {r['mb_per_s']} | {r['startup_s']} | {r['cpu_s']} | {r['peak_rss_mb']} | {r['peak_pss_mb']} |"
                f" {'yes' if r.get('counts_ok') else 'NO'} | {r.get('records_equal', 'not sampled')} |"
            )
    return lines + [
        "",
        "records/s: first record written to the target to the last (exactly once: to the last committed, as a",
        "read_committed reader sees it; the first it sees came with the first commit, `visible_s` in the JSON);",
        "start-up: launch to first record on the target; CPU, peak",
        "RSS and peak PSS: the candidate's whole process tree (JVM, Python workers) sampled from /proc every 0.25 s.",
        "RSS counts a page shared by several processes (shared libraries, forked workers) once in each; PSS splits it.",
    ]


def plot(results: list[dict], latencies: list[dict], meta: dict, path: Path) -> None:
    """Bars of the parts that ran: records/s, start-up and peak RSS per copy; percentiles per latency run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "error" not in r]
    measured = [r for r in latencies if r.get("p50_ms") is not None]
    panels = (3 if ok else 0) + (1 if measured else 0)
    if not panels:
        return
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.5), squeeze=False)
    if ok:
        labels = [f"{r['candidate']}\n{r['scenario']}" for r in ok]
        for ax, key, title in zip(
            axes[0][:3], ("records_per_s", "startup_s", "peak_rss_mb"), ("records/s", "start-up s", "peak RSS MB"),
            strict=True,
        ):  # fmt: skip
            ax.bar(range(len(ok)), [r[key] for r in ok])
            ax.set_xticks(range(len(ok)), labels, fontsize=7, rotation=60)
            ax.set_title(title)
    if measured:
        ax = axes[0][-1]
        for i, (key, label) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"))):
            ax.bar([x + (i - 1) * 0.27 for x in range(len(measured))], [r[key] for r in measured], 0.27, label=label)
        ax.set_xticks(range(len(measured)), [f"{r['candidate']}\n{r['rate']:,}/s" for r in measured], fontsize=7)
        ax.set_yscale("log")
        ax.set_title("replication latency ms")
        ax.legend()
    fig.suptitle(f"{meta['machine']}, {meta['records']:,} x {meta['size']} B" if ok else meta["machine"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_outputs(results: list[dict], latencies: list[dict], meta: dict, out: Path) -> None:
    """The run as JSON, Markdown and PNG; a part that did not run (no --candidates, no latency runs) is left out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results, "latency": latencies}, indent=2))
    scope = f"{meta['records']:,} records x {meta['size']} B per scenario; " if results else ""
    reach = TARGET_KINDS[ListenerKind(meta["target_kind"])]
    lines = [f"# Benchmark {meta['stamp']}", "", f"{meta['machine']}; {scope}{reach} loopback."]
    if results:
        lines += throughput_lines(results)
    if latencies:
        lines += latency_lines(latencies, meta)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    plot(results, latencies, meta, out.with_suffix(".png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    wp.add_load_arguments(parser)
    parser.add_argument("--candidates", default="mirror,mm2,mm2-untuned,limit", help="also wp:<write_paths path>")
    parser.add_argument("--topics-scale", default="", help="e.g. 1,10,100: repeat at these topic counts")
    parser.add_argument("--scale-records", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per candidate")
    parser.add_argument("--latency-rates", default="10000", help="probe records/s over all partitions: 10000,50000")
    parser.add_argument("--realtime-tasks", type=int, default=1, help="mirror-realtime's realtime_tasks")
    parser.add_argument("--eos-commit-interval", type=float, default=None,
                        help="the flow's exactly_once_commit_interval_s (default: the shipped one)")  # fmt: skip
    parser.add_argument("--latency-seconds", type=float, default=60, help="how long the probe sends")
    parser.add_argument("--latency-warmup", type=float, default=15, help="first seconds of the load not counted")
    parser.add_argument(
        "--latency-broker-warmup", type=float, default=120, help="seconds of load before the first candidate; 0: none"
    )
    parser.add_argument(
        "--latency-candidates",
        default="mirror,mirror-realtime,mirror-realtime-eos,mm2,mm2-eos",
        help="empty: no latency runs",
    )
    parser.add_argument("--out", type=Path, default=None, help="result path without suffix")
    parser.add_argument("--target-kind", choices=[k.value for k in TARGET_KINDS], default="plaintext",
                        help="how the copiers but the bare copy loops reach the target: eventhubs is SASL_SSL PLAIN as"
                        " Event Hubs' Kafka endpoint, where the mirror's at-least-once slots write no transactions;"
                        " msk-scram is SASL_SSL SCRAM-SHA-512 as MSK's; mtls is TLS with a client"
                        " certificate")  # fmt: skip
    args = parser.parse_args()
    latency_candidates = [c for c in args.latency_candidates.split(",") if c]
    if unknown := set(latency_candidates) - set(LATENCY_CANDIDATES):
        choices = ", ".join(LATENCY_CANDIDATES)
        parser.error(f"--latency-candidates: unknown {', '.join(sorted(unknown))}; choose from {choices}")
    if args.target_kind != "plaintext" and (bare := [c for c in args.candidates.split(",") if c == "limit" or
                                                     c.startswith("wp:")]):  # fmt: skip
        parser.error(f"--target-kind {args.target_kind}: {', '.join(bare)} write(s) in PLAINTEXT only")
    if latency_candidates and not 0 <= args.latency_warmup < args.latency_seconds:
        parser.error("--latency-warmup must be shorter than --latency-seconds")
    if args.latency_broker_warmup < 0:
        parser.error("--latency-broker-warmup must be 0 (none) or more seconds")

    from bench.testbed.testbed import TestBed

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    meta = {"stamp": stamp, "machine": f"{os.cpu_count()} cores, {mem_gb:.0f} GB", "records": args.records}
    meta |= {"size": args.size, "argv": sys.argv[1:], "target_kind": args.target_kind}
    meta["latency"] = {
        "rates": [int(r) for r in args.latency_rates.split(",")],
        "seconds": args.latency_seconds,
        "warmup_s": args.latency_warmup,
        "broker_warmup_s": args.latency_broker_warmup,
        "realtime_tasks": args.realtime_tasks,
        "mirror_trigger_interval_s": MirrorConfig.model_fields["trigger_interval_s"].default,
        "eos_commit_interval_s": args.eos_commit_interval or EXACTLY_ONCE_COMMIT_S,
    }
    bed = TestBed()
    work = Path(tempfile.mkdtemp(prefix="mirrorkit-bench-"))
    results: list[dict] = []
    latencies: list[dict] = []
    try:
        bed.start("src", "plaintext")
        bed.start("tgt", args.target_kind)
        source = bed.clusters["src"].client.bootstrap_servers
        base_ts = int(time.time() * 1000) - 86_400_000
        scales = [(args.topics, args.records)]
        scales += [(int(t), args.scale_records) for t in args.topics_scale.split(",") if t]
        for i, (count, records) in enumerate(scales if args.candidates else []):
            topics = [f"b{i}-{t}" for t in range(count)]
            wp.create_topics(source, topics, args.partitions)
            began = time.monotonic()
            wp.load_source(source, topics, args.partitions, records, args.size, base_ts)
            took = time.monotonic() - began
            print(f"loaded {records} x {args.size} B into {count} x {args.partitions} in {took:.0f}s", flush=True)
            results += run_all(args, bed, work, topics, records, f"s{i}")
            wp.delete_topics(source, topics)
        target, target_client = bed.clusters["tgt"].admin.bootstrap_servers, bed.clusters["tgt"].client
        runs = [(rate, c) for rate in meta["latency"]["rates"] for c in latency_candidates]
        brokers = {"source_broker_cpu_s": bed.clusters["src"].pid, "target_broker_cpu_s": bed.clusters["tgt"].pid}
        monitors = {name: TreeMonitor(pid) for name, pid in brokers.items()}
        brokers_cpu = {name: monitor.cpu_s for name, monitor in monitors.items()}
        if runs and args.latency_broker_warmup:
            warm_brokers(args, runs[0][0], source, target, target_client, work, brokers_cpu)
        latencies = [run_latency(args, c, rate, n, source, target, target_client, work, brokers_cpu)
                     for n, (rate, c) in enumerate(runs)]  # fmt: skip
        for monitor in monitors.values():
            monitor.stop()
    finally:
        bed.close()
    out = args.out or RESULTS / stamp
    write_outputs(results, latencies, meta, out)
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
