"""Run the sync store's model-based test (bench/testbed/translation_model.py) on a long budget.

    python -m bench.translation_model --examples 2000 --steps 120

Prints the examples and steps run per machine and writes bench/results/translation-model-<time>.json; exits 1
with the shrunk counterexample when one is found.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hypothesis import seed, settings
from hypothesis.stateful import get_state_machine_test

from bench.testbed.translation_model import ExactlyOnceTranslation, IdentityTranslation, Translation

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--examples", type=int, default=2_000)
    args.add_argument("--steps", type=int, default=120)
    args.add_argument("--seed", type=int, default=None, help="without one, the run is the same every time")
    opts = args.parse_args(argv)
    result: dict[str, object] = {"examples": opts.examples, "steps_per_example": opts.steps, "seed": opts.seed}
    result["machines"] = {}
    failed = False
    for machine in (Translation, ExactlyOnceTranslation, IdentityTranslation):
        steps = [0]
        original = machine.check

        def counting(self: Translation, group: str, committed: int, _orig=original, _n=steps) -> None:  # noqa: ANN001
            _n[0] += 1
            _orig(self, group, committed)

        machine.check = counting  # type: ignore[method-assign]
        started = time.monotonic()
        outcome = "passed"
        try:
            test = get_state_machine_test(
                machine,
                settings=settings(max_examples=opts.examples, stateful_step_count=opts.steps, deadline=None,
                                  derandomize=opts.seed is None, database=None),
            )  # fmt: skip
            (test if opts.seed is None else seed(opts.seed)(test))()
        except Exception as err:  # noqa: BLE001 - the counterexample is the result
            outcome, failed = f"failed: {err}", True
        finally:
            machine.check = original  # type: ignore[method-assign]
        took = round(time.monotonic() - started, 1)
        result["machines"][machine.__name__] = {"outcome": outcome, "group_checks": steps[0], "seconds": took}  # type: ignore[index]
        print(f"{machine.__name__}: {opts.examples} examples of up to {opts.steps} steps, {steps[0]} group checks,"
              f" {took} s: {outcome}")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"translation-model-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
