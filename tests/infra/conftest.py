"""Each stack file runs once through the whole program under mocks; tests read the recorded registrations."""

from __future__ import annotations

import pytest

from tests.infra.harness import STACKS, Run, run_stack


@pytest.fixture(scope="session")
def stack_runs() -> dict[str, Run]:
    assert STACKS, "stacks/ holds no Pulumi.<stack>.yaml"
    return {path.name.split(".")[1]: run_stack(path) for path in STACKS}
