"""Time the mirror's copy loop alone: `RangeCopier.copy` from a loaded source topic to a fresh target topic.

No Spark: one call copies every partition's whole range, as one Spark task would, so the per-record Python loop,
the librdkafka consumer and the producer show without Spark's own costs, and a change to the loop shows in seconds.
`--profile` adds a cProfile listing of where the time goes.

`--cores python,compiled,java` copies the same loaded records with each copy core in turn, each into its own fresh
target topic, to weigh the compiled core against the Python loop on CPU per record:

- `python`: `RangeCopier.copy` with the flow's `copy_core: python`, the per-record Python loop (spark_app.outbox);
- `compiled`: `RangeCopier.copy` with `copy_core: compiled`, the Rust core (spark_app.compiled_copy), the GIL
  released;
- `java`: bench/java's CopyLoop, the harness's "limit" (bench/harness.py), in a child JVM.

Python and compiled are charged this process's CPU (librdkafka's threads included), Java its child's, JVM start-up
included. Each core's target must end where the source does and hold the same records at both ends of every
partition (bench/write_paths.py's check); the target topic is deleted afterwards.

`--listener msk-scram` (or `eventhubs`, `mtls`) has the Python and Rust cores read and write through the test-bed
broker's listener of that kind, logging in as the mirror's profile for it does (SCRAM-SHA-512, PLAIN
`$ConnectionString`, a client certificate), where `plaintext` (the default) reads and writes without TLS; the topics
are made, loaded and checked through the broker's plaintext admin listener either way. The Java loop runs on
`plaintext` alone.

Usage: .venv/bin/python bench/profile_writer.py --records 200000 --size 512 --partitions 4 [--profile]
       [--cores python,compiled,java] [--listener plaintext|eventhubs|msk-scram|mtls]
       (starts a broker with the test bed, or uses --bootstrap HOST:PORT as source and target, in plaintext)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench import write_paths as wp  # noqa: E402
from bench.write_paths import create_topics, load_source, watermarks  # noqa: E402
from spark_app.config import ClusterConfig, FlowConfig, Profile, TopicSelection  # noqa: E402
from spark_app.range_copy import RangeCopier  # noqa: E402
from spark_app.ranges import OffsetRange  # noqa: E402

SOURCE_TOPIC = "bench"
# Each core's target topic prefix: the default policy's name for a source cluster aliased "src" or "core", so source
# and target can share the broker.
CORE_PREFIXES = {"python": "src.", "compiled": "core.", "java": "java."}


def python_copier(cluster: ClusterConfig, core: str = "python") -> RangeCopier:
    """The mirror's copier of SOURCE_TOPIC with a copy `core`, from and to `cluster` (as its profile logs in)."""
    alias = CORE_PREFIXES[core].rstrip(".")
    topics = TopicSelection(include=[SOURCE_TOPIC])
    flow = FlowConfig(source=alias, target="tgt", topics=topics, checkpoint_location="/unused", copy_core=core)
    source, target = cluster.model_copy(update={"alias": alias}), cluster.model_copy(update={"alias": "tgt"})
    return RangeCopier(flow, source, target)


def plaintext(bootstrap: str) -> ClusterConfig:
    return ClusterConfig(alias="plain", bootstrap_servers=bootstrap, profile=Profile.KAFKA)


def copy_python(
    cluster: ClusterConfig, partitions: int, per_partition: int, profiler: cProfile.Profile | None, core: str = "python"
) -> bool:
    """Copy with `RangeCopier.copy`; whether every range's landing names the partition's last record."""
    copier = python_copier(cluster, core)
    ranges = [OffsetRange(SOURCE_TOPIC, p, 0, per_partition) for p in range(partitions)]
    if profiler:
        profiler.enable()
    landed = copier.copy(ranges)
    if profiler:
        profiler.disable()
    return all(x.last_target_offset == per_partition - 1 for x in landed)


def copy_java(cmd: list[str], log: Path) -> float:
    """Run CopyLoop to its end; its CPU seconds (user and system, from the reaped child's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("wb") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=1800)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def compare_cores(
    bootstrap: str, client: ClusterConfig, cores: list[str], partitions: int, per_partition: int, size: int
) -> bool:
    """Copy the loaded source with each core in turn into its own fresh target topic, the Python and Rust cores as
    `client` says (the Java loop through `bootstrap`); one line per core. Whether every core's copy was right."""
    total = per_partition * partitions
    source_hw = {SOURCE_TOPIC: watermarks(bootstrap, SOURCE_TOPIC, partitions)}
    print(f"{total} records x {size} B, {partitions} partitions; cores in this order: {', '.join(cores)}")
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="cores-") as tmp:
        work = Path(tmp)
        for core in cores:
            prefix = CORE_PREFIXES[core]
            create_topics(bootstrap, [prefix + SOURCE_TOPIC], partitions)
            landings = "n/a"
            if core == "java":
                cmd = harness.copy_loop_command(work, bootstrap, bootstrap, prefix, total, [SOURCE_TOPIC])
                began = time.monotonic()
                cpu = copy_java(cmd, work / "copy-loop.log")
                wall = time.monotonic() - began
            else:
                began_cpu, began = time.process_time(), time.monotonic()
                landed_ok = copy_python(client, partitions, per_partition, None, core)
                cpu, wall = time.process_time() - began_cpu, time.monotonic() - began
                landings = "right" if landed_ok else "WRONG"
                all_ok &= landed_ok
            check = wp.Result(core)
            spec = {"topics": [SOURCE_TOPIC], "prefix": prefix, "target": bootstrap, "source": bootstrap}
            wp.verify(check, spec, source_hw, partitions)
            records_ok = check.data_ok and check.ts_kept and check.headers_kept
            all_ok &= check.counts_ok and records_ok
            print(
                f"{core:>6}: {wall:6.2f} s wall, {cpu:6.2f} s CPU, {total / wall:9,.0f} records/s, "
                f"{cpu * 1e6 / total:5.2f} CPU us/record; target ends {'right' if check.counts_ok else 'WRONG'}, "
                f"records {'right' if records_ok else 'WRONG'}, landings {landings}"
                + "".join(f"; {note}" for note in check.notes),
                flush=True,
            )
            wp.delete_topics(bootstrap, [prefix + SOURCE_TOPIC])
    return all_ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="in total, spread over the partitions")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="write here instead of a fresh test-bed broker")
    parser.add_argument("--profile", action="store_true", help="print a cProfile listing of the write")
    parser.add_argument("--cores", help=f"compare these copy cores, in this order: some of {', '.join(CORE_PREFIXES)}")
    parser.add_argument("--listener", default="plaintext", choices=["plaintext", "eventhubs", "msk-scram", "mtls"],
                        help="the test-bed listener the Python and Rust cores read and write through")  # fmt: skip
    args = parser.parse_args()
    cores = [c for c in (args.cores or "").split(",") if c]
    if unknown := [c for c in cores if c not in CORE_PREFIXES]:
        parser.error(f"unknown cores {unknown}; known: {', '.join(CORE_PREFIXES)}")
    if cores and args.profile:
        parser.error("--profile times the Python loop alone: leave out --cores")
    if args.listener != "plaintext" and ("java" in cores or args.bootstrap):
        parser.error(f"--listener {args.listener}: the Java loop and --bootstrap read and write in plaintext only")

    bed = None
    if args.bootstrap is None:
        from bench.testbed.testbed import TestBed

        bed = TestBed()
        cluster = bed.start("profile", args.listener)
        args.bootstrap, client = cluster.admin.bootstrap_servers, cluster.client
    else:
        client = plaintext(args.bootstrap)
    try:
        per_partition = args.records // args.partitions
        total = per_partition * args.partitions
        create_topics(args.bootstrap, [SOURCE_TOPIC], args.partitions)
        load_source(
            args.bootstrap, [SOURCE_TOPIC], args.partitions, total, args.size, int(time.time() * 1000) - 86_400_000
        )
        if cores:
            if not compare_cores(args.bootstrap, client, cores, args.partitions, per_partition, args.size):
                raise SystemExit(1)
            return
        out_topic = CORE_PREFIXES["python"] + SOURCE_TOPIC
        create_topics(args.bootstrap, [out_topic], args.partitions)
        profiler = cProfile.Profile() if args.profile else None
        began = time.process_time(), time.monotonic()
        landed_right = copy_python(client, args.partitions, per_partition, profiler)
        cpu, wall = time.process_time() - began[0], time.monotonic() - began[1]
        ends = watermarks(args.bootstrap, out_topic, args.partitions)
        ok = ends == [per_partition] * args.partitions and landed_right
        print(
            f"{total} records x {args.size} B, {args.partitions} partitions, "
            f"{wall:.2f} s wall, {cpu:.2f} s CPU, {total / wall:,.0f} records/s, {total / cpu:,.0f} records/CPU-s; "
            f"target ends {ends}, landings {'right' if ok else 'WRONG'}"
        )
        if profiler:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(15)
            print(text.getvalue())
        if not ok:
            raise SystemExit(1)
    finally:
        if bed is not None:
            bed.close()


if __name__ == "__main__":
    main()
