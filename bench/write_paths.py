"""Measure the mirror's candidate write paths side by side on two real local clusters.

The mirror must copy key, value, headers (order and duplicates), partition and the original CreateTime of every
record, and should learn where each record landed (for offset syncs). Spark's built-in Kafka sink is fast but has
no timestamp column, so this script measures it against ways around that:

- `sink-default`, `sink`: the built-in sink with the connector's producer defaults and with tuned batching;
- `sink+interceptor`: the built-in sink plus a ProducerInterceptor (bench/interceptor) that moves a timestamp
  header into the record's timestamp;
- `batch+interceptor`: the same, as a batch write inside foreachBatch, followed by reading the target's end
  offsets, which give the landing offset of each batch's last record;
The mirror's own path as it ships (the driver plans offset ranges, and each Spark task copies its ranges with
librdkafka, so records never pass through the JVM) is measured by bench/harness.py's `mirror` candidate, through the
mirror's CLI. It used to run here too, as `ranges`, inside a Structured Streaming query; earlier rounds also measured
Python writers fed by Spark's Kafka source (Arrow batches through mapInArrow, pickled Rows, a Python data source
sink): at 18k-55k records/s they were all slower than `ranges` and are gone.

Every path runs in its own child process with a fresh SparkSession (local[2], Trigger.AvailableNow), copying the
whole source into fresh, empty target topics. Afterwards the script checks counts on every partition and compares
records at both ends of every partition with the source, then prints one table.

Usage: .venv/bin/python bench/write_paths.py --records 1000000 --size 512 --topics 4 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka import KafkaError, TopicPartition  # noqa: E402

from bench.testbed import clients as kafka_clients  # noqa: E402
from bench.testbed.clients import plaintext  # noqa: E402
from images.fetch_jars import cached_jars  # noqa: E402

INTERCEPTOR_SOURCE = ROOT / "bench" / "interceptor"
INTERCEPTOR_CLASS = "io.mirrorkit.interceptor.TimestampHeaderInterceptor"
TIMESTAMP_HEADER = "__mirrorkit.ts"  # must match TimestampHeaderInterceptor.HEADER
PATHS = ("sink-default", "sink", "sink+interceptor", "batch+interceptor")
# Batching the producers with big batches and a short linger is what mattered; acks=all + idempotence keep order.
JAVA_PRODUCER = {
    "kafka.acks": "all",
    "kafka.enable.idempotence": "true",
    "kafka.linger.ms": "20",
    "kafka.batch.size": "1048576",
    "kafka.buffer.memory": "134217728",
}
SAMPLE = 300  # records compared at each end of every partition


# -- the child: one path, one SparkSession ---------------------------------------------------------------------------


def build_jar(sources: Path, classpath: list[Path], work: Path, name: str) -> Path:
    """Compile the Java sources under `sources` against `classpath` and jar the classes as `work/name`."""
    classes = work / f"{name}-classes"
    classes.mkdir(parents=True, exist_ok=True)
    files = [str(p) for p in sources.rglob("*.java")]
    cp = os.pathsep.join(str(j) for j in classpath)
    subprocess.run(["javac", "--release", "17", "-cp", cp, "-d", str(classes), *files], check=True)
    jar = work / name
    with zipfile.ZipFile(jar, "w") as z:
        for f in classes.rglob("*.class"):
            z.write(f, f.relative_to(classes).as_posix())
    return jar


def build_interceptor(work: Path) -> Path:
    """The interceptor, compiled against the kafka-clients jar Spark's connector ships with."""
    clients = [j for j in cached_jars("spark") if j.name.startswith("kafka-clients-")]
    return build_jar(INTERCEPTOR_SOURCE, clients, work, "mirrorkit-interceptor.jar")


def run_child(spec: dict) -> dict:
    """Run one path from session start to AvailableNow completion; return timings and landings as JSON."""
    began = time.monotonic()
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    work = Path(spec["work"])
    jars = [str(j) for j in cached_jars("spark")]
    if spec["path"].endswith("+interceptor"):
        jars.append(str(build_interceptor(work / "interceptor")))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"write-path-{spec['path']}")
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", "3g")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    session_s = time.monotonic() - began

    path, prefix = spec["path"], spec["prefix"]
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", spec["source"])
        .option("subscribe", ",".join(spec["topics"]))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
    )
    if spec["max_offsets"]:
        reader = reader.option("maxOffsetsPerTrigger", str(spec["max_offsets"]))
    df = reader.load()
    checkpoint = str(work / "checkpoint")
    landed: list[dict] = []
    started = time.monotonic()

    if path.startswith(("sink", "batch")):
        headers = F.col("headers")
        if path.endswith("+interceptor"):
            headers = F.expr(
                "concat(coalesce(headers, cast(array() as array<struct<key:string,value:binary>>)),"
                f" array(named_struct('key', '{TIMESTAMP_HEADER}',"
                " 'value', cast(cast(unix_millis(timestamp) as string) as binary))))"
            )
        columns = [
            F.concat(F.lit(prefix), "topic").alias("topic"),
            "key",
            "value",
            headers.alias("headers"),
            "partition",
        ]
        options = {"kafka.bootstrap.servers": spec["target"]}
        if path != "sink-default":
            options |= spec["java_producer"]
        if path.endswith("+interceptor"):
            options["kafka.interceptor.classes"] = INTERCEPTOR_CLASS
    if path.startswith("sink"):
        writer = df.select(*columns).writeStream.format("kafka").options(**options)
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    elif path == "batch+interceptor":
        from confluent_kafka.admin import OffsetSpec

        admin = kafka_clients.admin(plaintext(spec["target"]))

        def write_then_sync(batch_df, batch_id: int) -> None:
            """JVM sink per batch, then landing offsets from the batch's end offsets and the target's end offsets.

            Valid while the mirror is the only writer of its target partitions: the target's end offset after the
            batch is where the batch's last record landed (exact unless a retried task duplicated records).
            """
            batch_df.select(*columns).write.format("kafka").options(**options).save()
            ends = json.loads((Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()[-1])
            wanted = {TopicPartition(prefix + t, int(p)): OffsetSpec.latest() for t, ps in ends.items() for p in ps}
            target_ends = {(tp.topic, tp.partition): f.result().offset for tp, f in admin.list_offsets(wanted).items()}
            for t, ps in ends.items():
                for p, end in ps.items():
                    landed.append(
                        {
                            "topic": t,
                            "partition": int(p),
                            "last_offset": end - 1,
                            "last_target_offset": target_ends[(prefix + t, int(p))] - 1,
                            "records": -1,
                        }
                    )

        query = (
            df.writeStream.foreachBatch(write_then_sync)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
    else:
        raise ValueError(f"unknown path {path}")

    query.awaitTermination()
    query_s = time.monotonic() - started
    progress = query.recentProgress
    batches = sum(1 for p in progress if p.numInputRows)
    add_batch_s = sum(p.durationMs.get("addBatch", 0) for p in progress) / 1000
    spark.stop()
    return {
        "session_s": session_s,
        "query_s": query_s,
        "add_batch_s": add_batch_s,
        "batches": batches,
        "landed": landed,
    }


# -- the parent: clusters, load, verification, table -----------------------------------------------------------------


@dataclass
class Result:
    path: str
    session_s: float = 0.0
    query_s: float = 0.0
    add_batch_s: float = 0.0
    batches: int = 0
    counts_ok: bool = False
    data_ok: bool = False
    ts_kept: bool = False
    headers_kept: bool = False
    offsets: str = "no"
    notes: list[str] = field(default_factory=list)
    spread: str = ""


def median_run(runs: list[Result], records: int) -> Result:
    """The run with the median query time; fidelity must hold in every run, and the spread shows the noise."""
    done = sorted((r for r in runs if r.query_s), key=lambda r: r.query_s)
    if not done:
        return runs[0]
    median = done[(len(done) - 1) // 2]
    for r in runs:
        median.counts_ok &= r.counts_ok
        median.data_ok &= r.data_ok
        median.ts_kept &= r.ts_kept
        median.headers_kept &= r.headers_kept
        if r.offsets != median.offsets:
            median.offsets = "varies"
        median.notes.extend(n for n in r.notes if n not in median.notes)
    if len(runs) > 1:
        median.spread = f"{records / done[-1].query_s:.0f}-{records / done[0].query_s:.0f} ({len(done)}/{len(runs)})"
    return median


_POOL = random.Random(7).randbytes(1 << 20)


def record_fields(i: int, size: int, base_ts: int = 0) -> tuple[bytes | None, bytes, list | None, int]:
    """The i-th test record's key, value, headers and timestamp (base_ts + i)."""
    start = (i * 7919) % (len(_POOL) - size)
    value = (b"%012d" % i + _POOL[start : start + size])[:size]
    headers = None if i % 10 == 0 else [("h", b"%d" % i), ("trace", b"t-%d" % (i % 97)), ("h", b"2"), ("n", None)]
    key = None if i % 7 == 0 else b"k-%d" % (i % 5000)
    return key, value, headers, base_ts + i


def load_source(bootstrap: str, topics: list[str], partitions: int, records: int, size: int, base_ts: int) -> None:
    """Spread records round-robin over all partitions, each with a distinct old timestamp and tricky headers.

    Headers repeat a key (order and duplicates must survive), carry a null value, and every 10th record has none
    at all; every 7th key is null.
    """
    producer = kafka_clients.producer(
        plaintext(bootstrap),
        {"linger.ms": 50, "batch.size": 1_048_576, "enable.idempotence": True}
        | {"queue.buffering.max.messages": 500_000, "queue.buffering.max.kbytes": 1_048_576},
    )
    slots = [(t, p) for t in topics for p in range(partitions)]
    for i in range(records):
        topic, partition = slots[i % len(slots)]
        key, value, headers, _ = record_fields(i, size)
        while True:
            try:
                producer.produce(
                    topic, value=value, key=key, partition=partition, timestamp=base_ts + i, headers=headers
                )
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError("loading the source: records left undelivered")


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Topics that keep every record (no retention), so old timestamps are not deleted in the middle of a run."""
    kafka_clients.create_topics(plaintext(bootstrap), dict.fromkeys(names, partitions), {"retention.ms": "-1"})


def delete_topics(bootstrap: str, names: list[str]) -> None:
    admin = kafka_clients.admin(plaintext(bootstrap))
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result()


def watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    consumer = kafka_clients.consumer(plaintext(bootstrap), "bench-watermarks")
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in range(partitions)]
    finally:
        consumer.close()


def read_range(bootstrap: str, topic: str, partition: int, start: int, count: int) -> list[tuple]:
    """Records [start, start+count) of one partition as (key, value, headers, timestamp type, timestamp)."""
    consumer = kafka_clients.consumer(
        plaintext(bootstrap), "bench-reader", {"enable.auto.commit": False, "fetch.max.bytes": 8_388_608}
    )
    consumer.assign([TopicPartition(topic, partition, start)])
    out: list[tuple] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(min(1000, count - len(out)), 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {topic}[{partition}]: {msg.error()}")
                out.append((msg.key(), msg.value(), tuple(msg.headers() or ()), *msg.timestamp()))
    finally:
        consumer.close()
    if len(out) != count:
        raise RuntimeError(f"{topic}[{partition}]: read {len(out)} of {count} records from offset {start}")
    return out


def verify(result: Result, spec: dict, source_hw: dict[str, list[int]], partitions: int) -> None:
    """Exact counts everywhere (no loss, no duplicates); exact records at both ends of every partition."""
    ts_ok = headers_ok = data_ok = counts_ok = True
    expected_landed: dict[tuple[str, int], int] = {}
    for topic in spec["topics"]:
        target = spec["prefix"] + topic
        hw = watermarks(spec["target"], target, partitions)
        if hw != source_hw[topic]:
            counts_ok = False
            result.notes.append(f"{target}: target end offsets {hw} != source {source_hw[topic]}")
        for p in range(partitions):
            expected_landed[(topic, p)] = hw[p] - 1
            n = min(SAMPLE, source_hw[topic][p], hw[p])
            for start in sorted({0, max(0, min(source_hw[topic][p], hw[p]) - n)}):
                src = read_range(spec["source"], topic, p, start, n)
                tgt = read_range(spec["target"], target, p, start, n)
                for s, t in zip(src, tgt, strict=True):
                    data_ok &= s[:2] == t[:2]
                    headers_ok &= s[2] == t[2]
                    ts_ok &= s[3:] == t[3:]
    result.counts_ok, result.data_ok, result.ts_kept, result.headers_kept = counts_ok, data_ok, ts_ok, headers_ok
    if not ts_ok:
        result.notes.append("timestamps differ from the source")
    if not headers_ok:
        result.notes.append("headers differ from the source")


def read_committed(bootstrap: str, topic: str, partition: int) -> list[tuple]:
    """Every record of one partition a read_committed reader sees, as `read_range` gives them."""
    consumer = kafka_clients.consumer(
        plaintext(bootstrap), "bench-reader",
        {"enable.auto.commit": False, "fetch.max.bytes": 8_388_608, "enable.partition.eof": True,
         "isolation.level": "read_committed"},
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, partition, 0)])
    out: list[tuple] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        return out
                    raise RuntimeError(f"reading {topic}[{partition}]: {msg.error()}")
                out.append((msg.key(), msg.value(), tuple(msg.headers() or ()), *msg.timestamp()))
    finally:
        consumer.close()
    raise RuntimeError(f"{topic}[{partition}]: no end after reading {len(out)} records for 120 s")


def verify_committed(result: Result, spec: dict, source_hw: dict[str, list[int]], partitions: int) -> None:
    """`verify` for an exactly-once copy, read as a read_committed reader does (commit markers and aborted attempts
    take target offsets of their own): each partition holds exactly the source's count, its first and last records
    the source's."""
    ts_ok = headers_ok = data_ok = counts_ok = True
    for topic in spec["topics"]:
        for p in range(partitions):
            count = source_hw[topic][p]
            got = read_committed(spec["target"], spec["prefix"] + topic, p)
            if len(got) != count:
                counts_ok = False
                result.notes.append(f"{spec['prefix']}{topic}[{p}]: {len(got)} committed records, not {count}")
                continue
            n = min(SAMPLE, count)
            for start in sorted({0, count - n}):
                src = read_range(spec["source"], topic, p, start, n)
                for s, t in zip(src, got[start : start + n], strict=True):
                    data_ok &= s[:2] == t[:2]
                    headers_ok &= s[2] == t[2]
                    ts_ok &= s[3:] == t[3:]
    result.counts_ok, result.data_ok, result.ts_kept, result.headers_kept = counts_ok, data_ok, ts_ok, headers_ok


def check_landings(result: Result, spec: dict, landed: list[dict], source_hw: dict[str, list[int]]) -> None:
    """The landings the path handed back must name each partition's last record and where it really landed."""
    if not landed:
        return
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for row in landed:
        k = (row["topic"], row["partition"])
        last[k] = max(last.get(k, (-1, -1)), (row["last_offset"], row["last_target_offset"]))
    ok = all(last.get((t, p)) == (hw[p] - 1, hw[p] - 1) for t, hw in source_hw.items() for p in range(len(hw)) if hw[p])
    result.offsets = "yes" if ok else "wrong"
    if not ok:
        result.notes.append(f"landings disagree with the target: {sorted(last.items())[:4]}")


def child_command(
    path: str, prefix: str, args: argparse.Namespace, source: str, target: str, topics: list[str], work: Path
) -> tuple[list[str], dict[str, str], Path]:
    """The command, environment and result file of one path's child process (bench/harness.py runs it too)."""
    spec = {
        "path": path,
        "source": source,
        "target": target,
        "topics": topics,
        "prefix": prefix,
        "work": str(work / prefix.rstrip(".")),
        "max_offsets": args.max_offsets_per_trigger,
        "partitions": args.partitions,
        "java_producer": JAVA_PRODUCER | {f"kafka.{k}": v for k, v in (kv.split("=", 1) for kv in args.java_producer)},
    }
    Path(spec["work"]).mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out_file = Path(spec["work"]) / "result.json"
    return [sys.executable, __file__, "--child", json.dumps(spec), "--child-out", str(out_file)], env, out_file


def run_path(
    path: str, prefix: str, args: argparse.Namespace, source: str, target: str, topics: list[str], work: Path
) -> dict:
    cmd, env, out_file = child_command(path, prefix, args, source, target, topics, work)
    spec = json.loads(cmd[3])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0 or not out_file.exists():
        tail = "\n".join((proc.stderr or "").splitlines()[-25:])
        return spec | {"error": f"child failed ({proc.returncode}):\n{tail}"}
    return spec | json.loads(out_file.read_text())


def print_table(results: list[Result], records: int, size: int) -> None:
    mb = records * size / 1e6
    head = (
        f"{'path':<17} {'rec/s':>8} {'MB/s':>6} {'rec/s*':>8} {'MB/s*':>6} {'query s':>7} {'sess s':>6} "
        f"{'write s':>7} {'batches':>7} {'counts':>6} {'k/v':>4} {'ts kept':>7} {'hdr kept':>8} {'offsets':>7} "
        f"{'runs rec/s':>16}"
    )
    print(head)
    print("-" * len(head))
    yn = {True: "yes", False: "NO"}
    for r in results:
        if not r.query_s:
            print(f"{r.path:<17} failed: {'; '.join(r.notes)[:200]}")
            continue
        total = r.query_s + r.session_s
        print(
            f"{r.path:<17} {records / r.query_s:>8.0f} {mb / r.query_s:>6.1f} {records / total:>8.0f} "
            f"{mb / total:>6.1f} {r.query_s:>7.1f} {r.session_s:>6.1f} {r.add_batch_s:>7.1f} {r.batches:>7} "
            f"{yn[r.counts_ok]:>6} {yn[r.data_ok]:>4} {yn[r.ts_kept]:>7} {yn[r.headers_kept]:>8} {r.offsets:>7} "
            f"{r.spread:>16}"
        )
    print("Each row is the run with the median query time (the faster of the middle two for an even count).")
    print("runs rec/s: slowest-fastest run (finished/started); the shared 2 cores make single runs noisy.")
    print("rec/s, MB/s: query start to AvailableNow completion; * also counts SparkSession start-up.")
    print("write s: Spark's addBatch time summed over batches (the write itself, without query start and planning).")
    print("MB/s counts value bytes only. counts: every target partition ends at the source's end offset.")
    for r in results:
        for note in r.notes:
            print(f"  {r.path}: {note}")


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """What a benchmark loads into the source: `--records` of `--size` bytes over `--topics` x `--partitions`."""
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(parser)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {', '.join(PATHS)}")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0, help="0: one batch for everything")
    parser.add_argument("--java-producer", action="append", default=[], metavar="K=V", help="sink producer override")
    parser.add_argument("--repeat", type=int, default=1, help="runs per path; the table shows the median run")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per path")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        Path(args.child_out).write_text(json.dumps(run_child(json.loads(args.child))))
        return

    from bench.testbed.testbed import TestBed

    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths: {sorted(unknown)}")
    bed = TestBed()
    work = Path(tempfile.mkdtemp(prefix="write-paths-"))
    try:
        src, tgt = bed.start("src", "plaintext"), bed.start("tgt", "plaintext")
        source, target = src.client.bootstrap_servers, tgt.client.bootstrap_servers
        topics = [f"bench-{i}" for i in range(args.topics)]
        create_topics(source, topics, args.partitions)
        base_ts = int(time.time() * 1000) - 86_400_000
        t = time.monotonic()
        load_source(source, topics, args.partitions, args.records, args.size, base_ts)
        took = time.monotonic() - t
        print(f"loaded {args.records} x {args.size} B into {len(topics)} x {args.partitions} partitions in {took:.1f}s")
        source_hw = {topic: watermarks(source, topic, args.partitions) for topic in topics}

        runs: dict[str, list[Result]] = {path: [] for path in paths}
        for round_ in range(args.repeat):  # paths interleaved, so drift in the machine's load hits all of them
            for path in paths:
                prefix = f"{path.replace('+', '-')}-r{round_}."
                create_topics(target, [prefix + x for x in topics], args.partitions)
                outcome = run_path(path, prefix, args, source, target, topics, work)
                result = Result(path)
                if "error" in outcome:
                    result.notes.append(outcome["error"])
                else:
                    for name in ("session_s", "query_s", "add_batch_s", "batches"):
                        setattr(result, name, outcome[name])
                    verify(result, outcome, source_hw, args.partitions)
                    check_landings(result, outcome, outcome["landed"], source_hw)
                runs[path].append(result)
                print(f"{path} #{round_}: query {result.query_s:.1f}s, session {result.session_s:.1f}s", flush=True)
                delete_topics(target, [prefix + x for x in topics])  # keep the target broker as light as at start
        results = [median_run(rs, args.records) for rs in runs.values()]
        print()
        print(
            f"{args.records} records x {args.size} B, {args.topics} topics x {args.partitions} partitions, local[2], "
            f"Trigger.AvailableNow, maxOffsetsPerTrigger={args.max_offsets_per_trigger or 'none'}, "
            f"{args.repeat} run(s) per path, "
            f"overrides: {args.java_producer or 'none'}"
        )
        print_table(results, args.records, args.size)
    finally:
        bed.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
