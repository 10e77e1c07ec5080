"""Each stack file runs once through the whole program under mocks; tests read the recorded registrations."""

from __future__ import annotations

import pytest

from tests.infra.harness import PLATFORM_STACKS, STACKS, Run, run_stack


@pytest.fixture(scope="session")
def stack_runs() -> dict[str, Run]:
    assert STACKS, "stacks/ holds no Pulumi.<stack>.yaml"
    return {path.name.split(".")[1]: run_stack(path) for path in STACKS}


@pytest.fixture(scope="session")
def platform_runs() -> dict[str, Run]:
    """The platform stacks, each the Spark Operator of one Kubernetes cluster for the deployments there."""
    assert PLATFORM_STACKS, "stacks/ holds no platform stack (mirrorkit:platform)"
    return {path.name.split(".")[1]: run_stack(path) for path in PLATFORM_STACKS}
