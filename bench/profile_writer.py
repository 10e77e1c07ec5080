"""Time the mirror's PartitionWriter alone: Arrow batches shaped like the Spark query's, straight into a broker.

No Spark: the batches are built once in memory (the columns of `spark_app.writer.SOURCE_COLUMNS`, with the test
source's header mix), then one `PartitionWriter` call per source partition writes them to a fresh target topic, as
one Spark task would. This isolates the per-record Python loop and the producer from Spark's own costs, so a change
to the loop shows in seconds. `--profile` adds a cProfile listing of where the time goes.

Usage: .venv/bin/python bench/profile_writer.py --records 200000 --size 512 --partitions 4 [--profile]
       (starts a plaintext broker with the test bed, or writes to --bootstrap HOST:PORT)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from bench.write_paths import create_topics, record_fields, watermarks  # noqa: E402
from spark_app.config import ClusterConfig, FlowConfig  # noqa: E402
from spark_app.writer import PartitionWriter  # noqa: E402

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def source_batches(topic: str, partition: int, records: int, size: int, batch: int) -> list[pa.RecordBatch]:
    """One partition's records as the query hands them to mapInArrow, `batch` rows per Arrow batch."""
    base_ts = int(time.time() * 1000) - 86_400_000
    out = []
    for start in range(0, records, batch):
        rows = [record_fields(i, size, base_ts) for i in range(start, min(records, start + batch))]
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([topic] * len(rows), pa.string()),
                    pa.array([partition] * len(rows), pa.int32()),
                    pa.array(range(start, start + len(rows)), pa.int64()),
                    pa.array([r[0] for r in rows], pa.binary()),
                    pa.array([r[1] for r in rows], pa.binary()),
                    pa.array([[{"key": k, "value": v} for k, v in r[2]] if r[2] else None for r in rows], HEADERS_TYPE),
                    pa.array([r[3] for r in rows], pa.int64()),
                ],
                names=["topic", "partition", "offset", "key", "value", "headers", "timestamp_ms"],
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="in total, spread over the partitions")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=20_000, help="rows per Arrow batch (the mirror's setting)")
    parser.add_argument("--policy", choices=("default", "identity"), default="default")
    parser.add_argument("--bootstrap", help="write here instead of a fresh test-bed broker")
    parser.add_argument("--profile", action="store_true", help="print a cProfile listing of the write")
    args = parser.parse_args()

    bed = None
    if args.bootstrap is None:
        from tests.support.testbed import TestBed

        bed = TestBed()
        args.bootstrap = bed.start("profile", "plaintext").client.bootstrap
    try:
        per_partition = args.records // args.partitions
        parts = [source_batches("bench", p, per_partition, args.size, args.batch) for p in range(args.partitions)]
        flow = FlowConfig(
            source="src",
            target="tgt",
            topics={"include": ["bench"]},
            replication_policy=args.policy,
            checkpoint_location="/unused",
        )
        target = ClusterConfig(alias="tgt", bootstrap_servers=args.bootstrap, profile="kafka")
        out_topic = "bench" if args.policy == "identity" else "src.bench"
        create_topics(args.bootstrap, [out_topic], args.partitions)
        writer = PartitionWriter(flow, target)
        profiler = cProfile.Profile() if args.profile else None
        began = time.process_time(), time.monotonic()
        if profiler:
            profiler.enable()
        landed = [list(writer(iter(batches))) for batches in parts]
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - began[0], time.monotonic() - began[1]
        total = per_partition * args.partitions
        ends = watermarks(args.bootstrap, out_topic, args.partitions)
        ok = ends == [per_partition] * args.partitions and all(
            b.column("last_target_offset")[0].as_py() == per_partition - 1 for rows in landed for b in rows
        )
        print(
            f"{total} records x {args.size} B, {args.partitions} partitions, policy {args.policy}: "
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
