"""Each shipped deployment runs once through the whole program under mocks; tests read the recorded registrations.
A topology deployed whole is its one stack's run; a set is its part stacks', brought up in order, read as one."""

from __future__ import annotations

import pytest

from tests.infra.harness import PLATFORM_STACKS, SETS, STACKS, Run, a_set_is_up, run_stack, stack_name, the_set


@pytest.fixture(scope="session")
def set_runs() -> dict[str, dict[str, Run]]:
    """Each set's stacks after its first `up`, in the order of up, by stack."""
    assert SETS, "stacks/topologies holds no topology"
    return {topology: a_set_is_up(topology)[1] for topology in SETS}


@pytest.fixture(scope="session")
def stack_runs(set_runs: dict[str, dict[str, Run]]) -> dict[str, Run]:
    """Each shipped deployment by its topology's name: a single-region stack deployed whole, or a set."""
    assert STACKS, "stacks/ holds no Pulumi.<stack>.yaml deployed whole"
    whole = {stack_name(path): run_stack(path) for path in STACKS}
    return whole | {topology: the_set(runs) for topology, runs in set_runs.items()}


@pytest.fixture(scope="session")
def platform_runs() -> dict[str, Run]:
    """The platform stacks, each the Spark Operator of one Kubernetes cluster for the deployments there."""
    assert PLATFORM_STACKS, "stacks/ holds no platform stack (mirrorkit:platform)"
    return {path.name.split(".")[1]: run_stack(path) for path in PLATFORM_STACKS}
