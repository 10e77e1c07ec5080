"""`python -m bench.chaos`: the fault-injection checker's long run on a test bed of its own, one mode or both, with
the result in bench/results/chaos-<stamp>.md and .json.

Usage: .venv/bin/python -m bench.chaos [--modes throughput,realtime] [--minutes 30] [--fault-every 6] [--rate 300]
       [--seed 1] [--hold 3,12] [--local] [--exactly-once] [--target eventhubs] [--only "kill the driver"]

The mirror's executors run on a Spark standalone cluster of two one-core workers, so the nemesis can lose and stop
them; `--local` runs them in Spark's local mode instead. `--exactly-once` makes the flow exactly-once, and then the
checker allows no duplicate; `--only` limits the nemesis to the faults whose names contain one of its
comma-separated words. `--target msk-scram` mirrors into an MSK-like cluster instead of the Event Hubs-like one:
there real-time slots write transactions even at least once (they fence their zombies with them), and the mirror
makes its own topics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.testbed.kafka_cluster import ListenerKind
from bench.testbed.spark_standalone import SparkStandalone
from bench.testbed.testbed import TestBed

from .nemesis import HOLD_S
from .run import Outcome, duplicate_bound, run_chaos

RESULTS = Path(__file__).resolve().parent.parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="throughput,realtime")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--fault-every", type=float, default=6.0, help="seconds between faults, on average")
    parser.add_argument("--rate", type=int, default=300, help="records/s the generator writes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hold", default=",".join(f"{s:g}" for s in HOLD_S), help="seconds a fault is held: low,high")
    parser.add_argument("--local", action="store_true", help="executors in Spark's local mode")
    parser.add_argument("--exactly-once", action="store_true", help="an exactly-once flow: no duplicate allowed")
    parser.add_argument("--only", default="", help="only the faults whose names contain one of these (a,b)")
    parser.add_argument("--target", default=ListenerKind.EVENTHUBS.value,
                        choices=[ListenerKind.EVENTHUBS.value, ListenerKind.MSK_SCRAM.value])  # fmt: skip
    args = parser.parse_args()
    only = tuple(w.strip() for w in args.only.split(",") if w.strip())
    low, high = (float(s) for s in args.hold.split(","))
    bed = TestBed()
    spark: SparkStandalone | None = None
    outcomes: list[Outcome] = []
    try:
        source = bed.start_multi("chaos-src", proxied=True)
        target = bed.start("chaos-dr", ListenerKind(args.target), proxied=True, acls=True)
        root = Path(__file__).resolve().parents[2]
        spark = None if args.local else SparkStandalone(bed.root / "spark", env={"PYTHONPATH": str(root)}).start()
        for i, mode in enumerate(args.modes.split(",")):
            folder = Path(tempfile.mkdtemp(prefix=f"mirrorkit-chaos-{mode}-"))
            outcome = run_chaos(source, target, folder, mode, args.seed + i, args.minutes * 60, args.fault_every,
                                args.rate, f"{mode[:2]}{args.seed + i}", (low, high), spark, args.exactly_once,
                                only)  # fmt: skip
            outcomes.append(outcome)
            if spark is not None and not passed(outcome):  # the executors' logs, for what the mirror's log lacks
                shutil.copytree(spark.folder, folder / "spark", ignore=shutil.ignore_patterns("*.jar", "*.zip"),
                                dirs_exist_ok=True)  # fmt: skip
            print(render([outcome]))
    finally:
        if spark is not None:
            spark.close()
        bed.close()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"chaos-{stamp}.json").write_text(json.dumps([_plain(o) for o in outcomes], indent=1))
    (RESULTS / f"chaos-{stamp}.md").write_text(render(outcomes, args))
    return 0 if all(passed(o) for o in outcomes) else 1


def passed(outcome: Outcome) -> bool:
    """Nothing lost, reordered or silently deleted, translation never skipped, duplicates within the bound, the load
    whole, the mirror stopped cleanly by the last SIGTERM, and no fault saw it do what it never may."""
    return (outcome.report.ok and outcome.report.total("duplicates") <= duplicate_bound(outcome)
            and outcome.load_error is None and outcome.exit_code == 0 and not outcome.violations)  # fmt: skip


def _plain(outcome: Outcome) -> dict[str, object]:
    raw = dataclasses.asdict(outcome)
    raw["report"] = outcome.report.summary() | {"translation_skips": outcome.report.translation_skips}
    return raw


def render(outcomes: list[Outcome], args: argparse.Namespace | None = None) -> str:
    lines = ["# The mirror against an adversary", ""]
    if args is not None:
        options = (" --local" if args.local else "") + (" --exactly-once" if args.exactly_once else "")
        options += f' --only "{args.only}"' if args.only else ""
        options += f" --target {args.target}" if args.target != ListenerKind.EVENTHUBS.value else ""
        lines += [f"`python -m bench.chaos --modes {args.modes} --minutes {args.minutes:g} --fault-every"
                  f" {args.fault_every:g} --rate {args.rate} --seed {args.seed} --hold {args.hold}{options}`",
                  ""]  # fmt: skip
    lines += ["| mode | faults | sent | on source | lost | out of order | out of order, reported | duplicates (bound)"
              " | deleted unmirrored, reported | silent losses | reported but copied | translation checks | skips |"
              " mirror starts | drained in |", "|---" * 15 + "|"]  # fmt: skip
    for o in outcomes:
        s = o.report.summary()
        mode = f"{o.mode} exactly once" if o.exactly_once else o.mode
        lines.append(
            f"| {mode} | {o.faults} | {o.sent} | {s['on_source']} | {s['lost']} | {s['out_of_order']} |"
            f" {s['reported_ahead']} | {s['duplicates']} ({duplicate_bound(o)}) | {s['deleted_unmirrored']} |"
            f" {s['silent_losses']} |"
            f" {s['reported_but_copied']} | {s['translation_checks']} | {s['translation_skips']} | {o.starts} |"
            f" {o.drained_in_s:.0f} s |"
        )
    for o in outcomes:
        lines += ["", f"{o.mode}: {'passed' if passed(o) else 'FAILED'}; the mirror's exit on the last SIGTERM"
                  f" {o.exit_code}; the generator {o.load_error or 'ran to the end'}; {o.extra}"]  # fmt: skip
    for o in outcomes:
        wrong = [v for v in o.report.partitions if v.lost or v.out_of_order or v.duplicates or v.silent_losses]
        if wrong:  # where a failure lies, to read the mirror's log for (its folder is kept)
            lines += ["", f"## {o.mode}: partitions with a finding", ""]
            for v in wrong:
                lines += [f"- {v.topic}[{v.partition}]: lost {v.lost}, out of order {v.out_of_order}, duplicates"
                          f" {v.duplicates}, silent losses {v.silent_losses}"]  # fmt: skip
                lines += [f"  - copied again: {run}" for run in v.duplicate_runs]
    for o in outcomes:
        lines += ["", f"## {o.mode}: faults", "", *[f"- {e}" for e in o.events]]
        lines += [f"- translation skip: {s}" for s in o.report.translation_skips]
        lines += [f"- violation: {v}" for v in o.violations]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
