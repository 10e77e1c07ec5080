"""The sync store against a brute-force model of where every record landed (bench/testbed/translation_model.py), on
a fixed budget that runs in the fast selection: plain flows, exactly-once flows (a commit marker on the target after
every batch, crashed batches aborted), and identity active/active with a target that held data first.
bench/translation_model.py runs the same machines longer."""

from __future__ import annotations

from hypothesis import settings

from bench.testbed.translation_model import ExactlyOnceTranslation, IdentityTranslation, Translation

FAST = settings(max_examples=150, stateful_step_count=60, deadline=None, derandomize=True, database=None)

TestPlainFlowTranslation = Translation.TestCase
TestPlainFlowTranslation.settings = FAST
TestIdentityActiveActiveTranslation = IdentityTranslation.TestCase
TestIdentityActiveActiveTranslation.settings = FAST
TestExactlyOnceTranslation = ExactlyOnceTranslation.TestCase
TestExactlyOnceTranslation.settings = FAST
