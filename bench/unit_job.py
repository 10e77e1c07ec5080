"""The pipeline's unit job, replayed on this machine from a clean checkout: its `run` steps, in order, as written.

`.github/workflows/infra.yml`'s `unit` job is what every push and pull request runs before any stack deploys. This
clones the repository's committed HEAD into an empty folder (no `.venv`, no `.cache`, nothing `.ci/setup` builds)
and runs each of the job's `run` steps there with bash, in the job's order, stopping at the first that fails. The
`uses` steps (checkout, Python, Java and Go set-up) are what this machine already has: Python 3.11, Java 17 and Go.
It prints each step's name, exit status and time, and writes the same to bench/results/<time>-unit-job.txt.

Usage: .venv/bin/python -m bench.unit_job [--keep]   # --keep leaves the clone in /tmp for a look
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "infra.yml"
RESULTS = ROOT / "bench" / "results"


def run_steps() -> list[tuple[str, str]]:
    """The unit job's `run` steps as (name, script), in order; the env the job sets is applied by `replay`."""
    job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["unit"]
    return [(step.get("name", step["run"].splitlines()[0]), step["run"]) for step in job["steps"] if "run" in step]


def replay(clone: Path, out: list[str]) -> bool:
    """Run each step in `clone`; True when all passed."""
    for name, script in run_steps():
        began = time.monotonic()
        done = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=clone, capture_output=True, text=True)
        took = time.monotonic() - began
        # The step's summary is on stdout; a failure's cause may be on stderr only.
        failed_with = done.stderr.strip().splitlines()[-3:] if done.returncode else []
        tail = done.stdout.strip().splitlines()[-3:] + failed_with
        out.append(f"- {name}: exit {done.returncode} in {took:.0f} s")
        out.extend(f"    {line}" for line in tail)
        print(out[-1 - len(tail)], *(f"    {line}" for line in tail), sep="\n", flush=True)
        if done.returncode != 0:
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the clone in /tmp")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    clone = Path(tempfile.mkdtemp(prefix="mirrorkit-unit-job-"))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone / "repo")], check=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = [f"# The unit job of .github/workflows/infra.yml, from a clean clone of {head.stdout.strip()} ({stamp})", ""]
    began = time.monotonic()
    try:
        passed = replay(clone / "repo", out)
    finally:
        if not args.keep:
            shutil.rmtree(clone, ignore_errors=True)
    out += ["", f"{'passed' if passed else 'FAILED'}: {len(run_steps())} run steps, {time.monotonic() - began:.0f} s"]
    print(out[-1])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stamp}-unit-job.txt").write_text("\n".join(out) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
