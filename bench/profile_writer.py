"""Time the mirror's copy loop alone: `RangeCopier.copy` from a loaded source topic to a fresh target topic.

No Spark: one call copies every partition's whole range, as one Spark task would, so the per-record Python loop,
the librdkafka consumer and the producer show without Spark's own costs, and a change to the loop shows in seconds.
`--profile` adds a cProfile listing of where the time goes.

Usage: .venv/bin/python bench/profile_writer.py --records 200000 --size 512 --partitions 4 [--profile]
       (starts a plaintext broker with the test bed, or uses --bootstrap HOST:PORT as source and target)
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

from bench.write_paths import create_topics, load_source, watermarks  # noqa: E402
from spark_app.config import ClusterConfig, FlowConfig  # noqa: E402
from spark_app.range_copy import RangeCopier  # noqa: E402
from spark_app.ranges import OffsetRange  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="in total, spread over the partitions")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--bootstrap", help="write here instead of a fresh test-bed broker")
    parser.add_argument("--profile", action="store_true", help="print a cProfile listing of the write")
    args = parser.parse_args()

    bed = None
    if args.bootstrap is None:
        from bench.testbed.testbed import TestBed

        bed = TestBed()
        args.bootstrap = bed.start("profile", "plaintext").client.bootstrap_servers
    try:
        per_partition = args.records // args.partitions
        total = per_partition * args.partitions
        create_topics(args.bootstrap, ["bench"], args.partitions)
        load_source(args.bootstrap, ["bench"], args.partitions, total, args.size, int(time.time() * 1000) - 86_400_000)
        flow = FlowConfig(
            source="src",
            target="tgt",
            topics={"include": ["bench"]},
            checkpoint_location="/unused",
        )
        source = ClusterConfig(alias="src", bootstrap_servers=args.bootstrap, profile="kafka")
        target = ClusterConfig(alias="tgt", bootstrap_servers=args.bootstrap, profile="kafka")
        out_topic = "src.bench"  # the default policy's name: source and target can share the broker
        create_topics(args.bootstrap, [out_topic], args.partitions)
        copier = RangeCopier(flow, source, target)
        ranges = [OffsetRange("bench", p, 0, per_partition) for p in range(args.partitions)]
        profiler = cProfile.Profile() if args.profile else None
        began = time.process_time(), time.monotonic()
        if profiler:
            profiler.enable()
        landed = copier.copy(ranges)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - began[0], time.monotonic() - began[1]
        ends = watermarks(args.bootstrap, out_topic, args.partitions)
        landed_right = all(x.last_target_offset == per_partition - 1 for x in landed)
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
