"""The GitHub Actions pipeline: linted by actionlint, and shaped as the deployment needs."""

from __future__ import annotations

import functools
import json
import re
import subprocess

import yaml

from tests.conftest import FAST_SELECTION
from tests.infra.harness import (
    CONTEXT_REGIONS,
    PART_STACKS,
    ROOT,
    SETS,
    STACK_FILES,
    STACKS,
    Exports,
    Run,
    run_stack,
    shared_values,
    stack_values,
    up,
)

WORKFLOW = ROOT / ".github" / "workflows" / "infra.yml"
ACTIONLINT = ROOT / ".cache" / "bin" / "actionlint"
PINNED = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}$")


def steps(job: dict) -> list[dict]:
    return job["steps"]


def test_actionlint_finds_nothing_in_any_workflow():
    assert ACTIONLINT.exists(), f"{ACTIONLINT} is missing; `bash .ci/setup` builds it"
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert {w.name for w in workflows} == {"infra.yml", "stack.yml"}
    # Run from the checkout's root, so actionlint reads .github/actionlint.yaml (the self-hosted runners' labels).
    done = subprocess.run(
        [str(ACTIONLINT), *map(str, workflows)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr


STACK_WORKFLOW = ROOT / ".github" / "workflows" / "stack.yml"
STAGES = ("platform", "accounts", "sites")  # the deploy jobs, each after the one before
COMMAND = (
    "${{ github.event_name == 'pull_request' && 'preview' || github.event_name == 'schedule' && 'drift' || 'up' }}"
)
PIPELINE_DOC = ROOT / "docs" / "deploy" / "pipeline.md"


def staged() -> dict[str, tuple[int, list[str]]]:
    """Each stack the pipeline deploys: its stage's place in the order, and its runner's labels."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    found = {}
    for n, stage in enumerate(STAGES):
        for entry in jobs[stage]["strategy"]["matrix"]["include"]:
            assert entry["stack"] not in found, f"{entry['stack']} is deployed twice"
            found[entry["stack"]] = (n, json.loads(entry["runner"]))
    return found


def test_unit_tests_run_then_the_stages_deploy_through_one_workflow_per_stack():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the bare key `on` as true
    assert triggers["pull_request"]["branches"] == ["main"] and triggers["push"]["branches"] == ["main"]
    assert triggers["schedule"], "no scheduled drift check"
    unit, jobs = workflow["jobs"]["unit"], workflow["jobs"]
    # The fast selection holds tests/infra (tests/test_markers.py checks that).
    assert any("pytest" in s.get("run", "") and f'-m "{FAST_SELECTION}"' in s.get("run", "") for s in steps(unit))
    assert set(jobs) == {"unit", "fork", *STAGES}
    assert [jobs[s]["needs"] for s in STAGES] == ["unit", *STAGES[:-1]]
    for stage in STAGES:
        job = jobs[stage]
        assert job["uses"] == "./.github/workflows/stack.yml"
        assert job["with"] == {"stack": "${{ matrix.stack }}", "runner": "${{ matrix.runner }}", "command": COMMAND}
        assert job["permissions"] == {"contents": "read", "id-token": "write", "pull-requests": "write"}


def test_the_pipeline_deploys_the_per_region_sets_and_only_single_region_stacks_whole():
    shipped = {p.name.split(".")[1] for p in STACK_FILES}
    deployed = set(staged())
    assert deployed == shipped, "the pipeline deploys every shipped stack file, and nothing else"
    assert SETS and not deployed & set(SETS), "a set's topology is deployed by its parts, never whole"
    for stack in deployed & {p.name.split(".")[1] for p in STACKS}:
        settings = run_stack(ROOT / "stacks" / f"Pulumi.{stack}.yaml").result["settings"]
        assert len({s.region for s in settings.model.sites}) == 1, f"{stack} deploys more than one region whole"


@functools.cache
def pipeline_runs() -> dict[str, Run]:
    """Every stack the pipeline deploys, brought up in the stages' order against one backend, as a first deployment
    does."""
    order = staged()
    by_stage = sorted(order, key=lambda stack: order[stack][0])
    backend = {p.name.split(".")[1]: Exports() for p in PART_STACKS}
    whole = {p.name.split(".")[1] for p in STACKS}
    runs = up([s for s in by_stage if s not in whole], backend)
    return runs | {s: run_stack(ROOT / "stacks" / f"Pulumi.{s}.yaml") for s in by_stage if s not in runs}


def test_each_stack_deploys_after_every_stack_it_reads_by_stack_reference():
    """Every StackReference a stack makes names a stack of an earlier stage, which has exported what it reads."""
    order = staged()
    read = {
        stack: sorted(r.inputs["name"].rsplit("/", 1)[1] for r in run.of_type("pulumi:pulumi:StackReference"))
        for stack, run in pipeline_runs().items()
    }
    assert set(read) == set(order)
    assert any(read.values()), "no stack reads another: the order is not tested"
    late = {stack: [r for r in refs if order[r][0] >= order[stack][0]] for stack, refs in read.items()}
    assert {stack: refs for stack, refs in late.items() if refs} == {}


def test_a_stack_that_reaches_a_private_endpoint_runs_on_a_self_hosted_runner_the_docs_name():
    """Kubernetes objects go to a private EKS API server, ACLs to private brokers: such a stack's runner is a
    self-hosted one in that network, labelled by region; docs/deploy/pipeline.md names each label."""
    doc = PIPELINE_DOC.read_text()
    for stack, (_, labels) in staged().items():
        values = stack_values(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
        topology = shared_values(stack)
        part = values.get("mirrorkit:part", "")
        private = part.startswith(("platform:", "site:", "msk:")) or not part
        if not private:
            continue
        assert labels[0] == "self-hosted", f"{stack} reaches a private endpoint from {labels}"
        kind, _, name = part.partition(":")
        regions = {
            s["region"] for s in topology.get("mirrorkit:sites", []) if kind in ("", "site") and name in ("", s["name"])
        }
        regions |= {c["region"] for c in topology.get("mirrorkit:clusters", []) if kind == "msk" and c["alias"] == name}
        if kind == "platform":
            regions = {CONTEXT_REGIONS[values["mirrorkit:platform"]["context"]]}
        assert len(regions) == 1, f"{stack} reaches {regions}"
        (label,) = [x for x in labels if x.startswith("mirrorkit-")]
        assert {label.removeprefix("mirrorkit-")} == regions, f"{stack}: {label}"
        assert f"`{label}`" in doc, f"docs/deploy/pipeline.md does not name the label {label}"


def stack_steps() -> list[dict]:
    return steps(yaml.safe_load(STACK_WORKFLOW.read_text())["jobs"]["pulumi"])


def test_each_stack_previews_with_the_policy_pack_on_prs_ups_on_merge_and_checks_drift_on_schedule():
    pulumi = {s["name"]: s for s in stack_steps() if s.get("uses", "").startswith("pulumi/actions@")}
    by_command = {s["if"].split("'")[1]: s for s in pulumi.values()}
    assert set(by_command) == {"preview", "up", "drift"}
    for command, step in by_command.items():
        assert step["if"] == f"inputs.command == '{command}'"
        assert step["with"]["stack-name"] == "${{ inputs.stack }}" and step["with"]["policyPacks"] == "policies"
    assert by_command["preview"]["with"]["command"] == "preview" and by_command["preview"]["with"]["comment-on-pr"]
    assert by_command["up"]["with"]["command"] == "up"
    drift = by_command["drift"]["with"]
    assert drift["command"] == "preview" and drift["expect-no-changes"] and drift["refresh"]


def test_pulumi_and_the_clusters_are_reached_without_a_long_lived_credential():
    text = WORKFLOW.read_text() + STACK_WORKFLOW.read_text()
    assert "secrets." not in text, "the pipeline holds no secret: OIDC signs in to Pulumi and the clouds"
    auth = [s for s in stack_steps() if s.get("uses", "").startswith("pulumi/auth-actions@")]
    assert [s["with"]["requested-token-type"] for s in auth] == ["urn:pulumi:token-type:access_token:organization"]
    names = [s.get("uses", s.get("name", "")) for s in stack_steps()]
    first_pulumi = next(i for i, n in enumerate(names) if n.startswith("pulumi/actions@"))
    assert names.index(auth[0]["uses"]) < first_pulumi
    assert any("aws eks update-kubeconfig" in s.get("run", "") for s in stack_steps())


def test_every_action_is_pinned_to_a_commit():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    uses = [s["uses"] for job in workflow["jobs"].values() for s in job.get("steps", []) if "uses" in s]
    uses += [s["uses"] for s in stack_steps() if "uses" in s]
    assert uses and [u for u in uses if not PINNED.match(u)] == []


def test_the_unit_job_builds_what_its_tests_need_before_running_them():
    unit = yaml.safe_load(WORKFLOW.read_text())["jobs"]["unit"]
    runs = [s.get("run", "") for s in steps(unit)]
    tests = next(i for i, r in enumerate(runs) if "pytest" in r)
    built = next(i for i, r in enumerate(runs) if "GOBIN=" in r and "actionlint" in r)
    assert "$PWD/.cache/bin" in runs[built] and built < tests  # tests/infra/test_pipeline.py runs .cache/bin/actionlint
    assert any("fetch_jars.py" in r for r in runs[:tests])
    assert not re.search(r"pytest\S* .*tests/\S+\.py", runs[tests]), "tests are picked by marker, not by file"
    # mypy follows `import mirrorkit_copy_core`, which only .ci/setup builds: the job gives it the crate's stub.
    typed = next(i for i, r in enumerate(runs) if r.strip() == ".venv/bin/mypy")
    stub = next(i for i, r in enumerate(runs) if "mirrorkit_copy_core-stubs" in r)
    assert stub < typed and "cp spark_app/copy_core/mirrorkit_copy_core.pyi" in runs[stub]
    assert (ROOT / "spark_app" / "copy_core" / "mirrorkit_copy_core.pyi").is_file()


def test_deploys_sign_in_to_azure_with_oidc_and_every_id_it_needs():
    deploy = yaml.safe_load(STACK_WORKFLOW.read_text())["jobs"]["pulumi"]
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
    assert "inputs.stack" in str(environment) and "''" not in str(environment)  # previews run in one too


def evaluated(condition: str, event: str, head_repo: str = "example/mirrorkit") -> bool:
    """A job's `if:` as GitHub evaluates it, for the few operators the pipeline's conditions use."""
    context = {
        "github.event_name": event,
        "github.repository": "example/mirrorkit",
        "github.event.pull_request.head.repo.full_name": head_repo if event == "pull_request" else None,
    }
    python = condition.replace("&&", " and ").replace("||", " or ").replace("!(", " not (")
    return bool(eval(re.sub(r"github(\.[\w]+)+", lambda m: repr(context[m[0]]), python), {}))  # noqa: S307


def test_a_forks_pull_request_runs_the_unit_job_and_skips_the_cloud_stages_saying_why():
    """A fork's pull request gets no OIDC token (and its code must not reach the self-hosted runners): every stage
    is skipped for it, and only for it, and the `fork` job says why on a hosted runner with no permissions."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    events = {
        "push": ("push", "example/mirrorkit"),
        "schedule": ("schedule", "example/mirrorkit"),
        "a branch's pull request": ("pull_request", "example/mirrorkit"),
        "a fork's pull request": ("pull_request", "someone/mirrorkit"),
    }
    for what, (event, head) in events.items():
        fork = what == "a fork's pull request"
        assert "if" not in jobs["unit"]
        assert {s: evaluated(jobs[s]["if"], event, head) for s in STAGES} == dict.fromkeys(STAGES, not fork), what
        assert evaluated(jobs["fork"]["if"], event, head) == fork, what
    notice = jobs["fork"]
    assert notice["runs-on"] == "ubuntu-24.04" and notice["permissions"] == {} and notice["needs"] == "unit"
    (step,) = notice["steps"]
    assert "::notice title=Cloud preview skipped::" in step["run"] and "GITHUB_STEP_SUMMARY" in step["run"]
    assert "OIDC token" in step["run"] and "${{" not in step["run"], "the fork's name reaches the shell as a variable"


def test_a_stack_job_without_an_oidc_token_stops_before_any_sign_in_saying_why():
    names = [s.get("uses", s.get("name", "")) for s in stack_steps()]
    (check,) = [s for s in stack_steps() if "ACTIONS_ID_TOKEN_REQUEST_URL" in s.get("run", "")]
    first_sign_in = next(i for i, n in enumerate(names) if n.startswith("pulumi/auth-actions@"))
    assert names.index(check["name"]) < first_sign_in
    assert "::error title=No OIDC token::" in check["run"] and "exit 1" in check["run"]
