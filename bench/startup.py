"""Where the mirror's start-up goes: launch to its first record on the target, in phases, for one or more checkouts.

The harness gives one figure per copy (launch to the first record). This runs the same `run --available-now` of the
same config (bench/harness.py's `mirror_config` over 4 topics x 4 partitions of 512 B records, the test bed's two
plaintext clusters) and splits that time by the mirror's own log lines, each taken from launch:

- `config`: the first line `run` logs (its flows), once Python has started and imported the CLI;
- `spark`: the copy core's choice, which `Mirror` logs once Spark is up (its JVM, and the checks beside it);
- `flow`: `mirroring N topic(s)`, once the flow synced its topics and started its batches;
- `first`: the first record on the target (the harness's start-up), and `done`: every record there.

`--checkouts` names folders of this repository at other commits (made with `git worktree add`), run in turns with
this one, each with its own virtualenv where it has one (so its Spark's class archive is the one its set-up made),
else this checkout's: a before and after of one change on the same brokers in the same run. Medians over `--runs`
rounds, whose order turns each round.

Usage: .venv/bin/python bench/startup.py [--runs 3] [--records 200000] [--exactly-once] [--checkouts /tmp/before]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
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
from spark_app.config import MirrorConfig  # noqa: E402
from spark_app.policy import positions_group  # noqa: E402

TOPICS, PARTITIONS, SIZE = 4, 4, 512
# The phases' log lines, in the order a start reaches them.
PHASES = {
    "config": re.compile(r"INFO spark_app: flow \S+: "),
    "spark": re.compile(r"INFO spark_app\.mirror: flow \S+: .* copy with "),
    "flow": re.compile(r"INFO spark_app\.throughput: flow \S+: mirroring "),
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def commit_of(checkout: Path) -> str:
    """The checkout's commit, as a result names it (a folder's path says nothing once the run is over)."""
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (done.stdout.strip() or str(checkout)) + (" (uncommitted changes)" if dirty else "")


def phases(log: Path, launched: float) -> dict[str, float]:
    """When each phase's line was logged, seconds from `launched` (wall clock)."""
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        stamp = STAMP.match(line)
        if stamp is None:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - launched
        for name, pattern in PHASES.items():
            if name not in found and pattern.search(line):
                found[name] = round(at, 2)
    return found


def run_once(checkout: Path, n: int, source: str, bed, topics: list[str], work: Path, args) -> dict:
    """One start of the mirror of `checkout` into fresh target topics; its phases and the harness's figures."""
    target, target_client = bed.clusters["tgt"].admin.bootstrap_servers, bed.clusters["tgt"].client
    alias = f"s{n}"
    out_topics = [f"{alias}.{t}" for t in topics]
    wp.create_topics(target, out_topics, PARTITIONS)
    config = harness.mirror_config(alias, source, target_client, topics, work, exactly_once=args.exactly_once)
    committed = None
    if args.exactly_once:
        group = positions_group(MirrorConfig.model_validate(config).flows[0])

        def committed() -> int:
            return harness.committed_total(target, group, out_topics, PARTITIONS)

    log = work / f"{alias}.log"
    # The checkout's own virtualenv where it has one: its Spark carries the class archive its own set-up made.
    python = str(checkout / ".venv" / "bin" / "python") if (checkout / ".venv").is_dir() else sys.executable
    command = [python, *harness.mirror_command(config, work, available_now=True)[1:]]
    env = harness.candidate_env(checkout) | {"PYSPARK_PYTHON": python}
    os.sync()
    launched = time.time()
    result = harness.run_candidate(
        str(checkout), command, env, target, out_topics, PARTITIONS, args.records, True, log, 300, committed,
        cwd=checkout,
    )  # fmt: skip
    wp.delete_topics(target, out_topics)
    if "error" in result:
        raise SystemExit(f"{checkout}: {result['error']}")
    return (
        {"checkout": str(checkout)}
        | phases(log, launched)
        | {"first": result["startup_s"], "done": result["wall_s"], "cpu_s": result["cpu_s"]}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--exactly-once", action="store_true")
    parser.add_argument("--checkouts", default="", help="other checkouts, comma-separated, run in turns with this one")
    parser.add_argument("--out", type=Path, default=None, help="result path without suffix")
    args = parser.parse_args()
    checkouts = [ROOT, *(Path(c).resolve() for c in args.checkouts.split(",") if c)]
    for checkout in checkouts:
        if not (checkout / "spark_app").is_dir():
            parser.error(f"--checkouts: '{checkout}' holds no spark_app: give a worktree of this repository")

    from bench.testbed.testbed import TestBed

    bed, work = TestBed(), Path(tempfile.mkdtemp(prefix="mirrorkit-startup-"))
    rows: list[dict] = []
    try:
        bed.start("src", "plaintext")
        bed.start("tgt", "plaintext")
        source = bed.clusters["src"].client.bootstrap_servers
        topics = [f"st-{t}" for t in range(TOPICS)]
        wp.create_topics(source, topics, PARTITIONS)
        wp.load_source(source, topics, PARTITIONS, args.records, SIZE, int(time.time() * 1000) - 3_600_000)
        for round_ in range(args.runs):
            turn = checkouts[round_ % len(checkouts) :] + checkouts[: round_ % len(checkouts)]
            for checkout in turn:
                rows.append(run_once(checkout, len(rows), source, bed, topics, work, args))
                print(rows[-1], flush=True)
    finally:
        bed.close()
    columns = ["config", "spark", "flow", "first", "done", "cpu_s"]
    lines = [
        f"Start-up of `run --available-now`, {args.records:,} x {SIZE} B over {TOPICS} x {PARTITIONS}"
        f"{', exactly once' if args.exactly_once else ''}; seconds from launch, medians of {args.runs} run(s)"
        " (each run's figures in brackets).",
        "",
        "| commit | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for checkout in checkouts:
        mine = [r for r in rows if r["checkout"] == str(checkout)]
        cells = []
        for column in columns:
            values = [r[column] for r in mine if column in r]
            runs = " · ".join(f"{v}" for v in values)
            cells.append(f"{statistics.median(values):.2f} [{runs}]" if values else "-")
        lines.append(f"| {commit_of(checkout)} | " + " | ".join(cells) + " |")
    out = args.out or harness.RESULTS / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-startup"
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
