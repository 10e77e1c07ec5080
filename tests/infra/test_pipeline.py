"""The GitHub Actions pipeline: linted by actionlint, and shaped as the deployment needs."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.conftest import FAST_SELECTION
from tests.infra.harness import ROOT, STACKS

WORKFLOW = ROOT / ".github" / "workflows" / "infra.yml"
ACTIONLINT = ROOT / ".cache" / "bin" / "actionlint"
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def steps(job: dict) -> list[dict]:
    return job["steps"]


def test_actionlint_finds_nothing():
    assert ACTIONLINT.exists(), f"{ACTIONLINT} is missing; `bash .ci/setup` builds it"
    done = subprocess.run([str(ACTIONLINT), str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_unit_tests_run_then_each_stack_is_previewed_on_pull_requests_and_deployed_on_merge():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the bare key `on` as true
    assert triggers["pull_request"]["branches"] == ["main"] and triggers["push"]["branches"] == ["main"]
    unit, deploy = workflow["jobs"]["unit"], workflow["jobs"]["deploy"]
    # The fast selection holds tests/infra (tests/test_markers.py checks that).
    assert any("pytest" in s.get("run", "") and f'-m "{FAST_SELECTION}"' in s.get("run", "") for s in steps(unit))
    assert deploy["needs"] == "unit"
    assert sorted(deploy["strategy"]["matrix"]["stack"]) == sorted(p.name.split(".")[1] for p in STACKS)
    pulumi = {s["with"]["command"]: s for s in steps(deploy) if s.get("uses", "").startswith("pulumi/actions@")}
    assert set(pulumi) == {"preview", "up"}
    assert pulumi["preview"]["if"] == "github.event_name == 'pull_request'"
    assert pulumi["up"]["if"] == "github.event_name == 'push'"
    for step in pulumi.values():
        assert PINNED.match(step["uses"]), f"{step['uses']} is not pinned to a commit"
        assert step["with"]["stack-name"] == "${{ matrix.stack }}" and step["with"]["policyPacks"] == "policies"


def test_every_action_is_pinned_to_a_commit():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    uses = [s["uses"] for job in workflow["jobs"].values() for s in steps(job) if "uses" in s]
    assert uses and [u for u in uses if not PINNED.match(u)] == []


def test_the_unit_job_builds_what_its_tests_need_before_running_them():
    unit = yaml.safe_load(WORKFLOW.read_text())["jobs"]["unit"]
    runs = [s.get("run", "") for s in steps(unit)]
    tests = next(i for i, r in enumerate(runs) if "pytest" in r)
    built = next(i for i, r in enumerate(runs) if "GOBIN=" in r and "actionlint" in r)
    assert "$PWD/.cache/bin" in runs[built] and built < tests  # tests/infra/test_pipeline.py runs .cache/bin/actionlint
    assert any("fetch_jars.py" in r for r in runs[:tests])
    assert not re.search(r"pytest\S* .*tests/\S+\.py", runs[tests]), "tests are picked by marker, not by file"


def test_deploys_sign_in_to_azure_with_oidc_and_every_id_it_needs():
    deploy = yaml.safe_load(WORKFLOW.read_text())["jobs"]["deploy"]
    env = deploy.get("env", {})
    assert env.get("ARM_USE_OIDC") == "true"
    for name in ("CLIENT_ID", "TENANT_ID", "SUBSCRIPTION_ID"):
        assert env.get(f"ARM_{name}") == f"${{{{ vars.AZURE_{name} }}}}", name  # read by azure-native
    login = next(s for s in steps(deploy) if s.get("uses", "").startswith("azure/login@"))
    assert login["with"] == {
        "client-id": "${{ vars.AZURE_CLIENT_ID }}",
        "tenant-id": "${{ vars.AZURE_TENANT_ID }}",
        "subscription-id": "${{ vars.AZURE_SUBSCRIPTION_ID }}",
    }
    assert deploy["permissions"]["id-token"] == "write"
    environment = deploy["environment"]
    assert "matrix.stack" in str(environment) and "''" not in str(environment)  # previews run in one too
