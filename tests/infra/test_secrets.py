"""The Kafka secrets: read from `pulumi config set --secret` or from a Pulumi ESC environment alike, never in plain
text; and a rotated secret restarts the mirror, through its Secrets' versions, which carry nothing of the values."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest
import yaml

import tests.infra.harness as harness
from infra.k8s.mirror_app import CONFIG_HASH_ANNOTATION, SECRETS_HASH_ANNOTATION, secrets_version_hash
from infra.naming import PROJECT
from tests.infra.harness import (
    ROOT,
    Exports,
    RecordingMocks,
    Run,
    a_set_is_up,
    is_secret,
    run_values,
    stack_values,
    topology_values,
    with_secrets,
)

SET = "dr-msk-to-eventhubs"
ESC_DEFINITION = ROOT / "stacks" / "esc" / f"{SET}.yaml"
USERS = (f"{SET}-msk-primary", f"{SET}-site-euw1")  # the stacks that import the environment
ONPREM = ROOT / "stacks" / "Pulumi.onprem-to-msk.yaml"
SPARK_APP = "kubernetes:sparkoperator.k8s.io/v1beta2:SparkApplication"
K8S_SECRET = "kubernetes:core/v1:Secret"
PASSWORD = "test-sentinel-rotated-scram-password"
CREDENTIALS = f"{PROJECT}:credentials"


@dataclass(frozen=True)
class EscSecret:
    value: Any


def esc_open(definition: dict[str, Any], sets: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What a stack that imports the environment gets, as ESC evaluates it: `sets` applied (as `esc env set`
    does), then each `pulumiConfig` key with its `${...}` references resolved; and the keys that hold a secret
    (`fn::secret`), which the engine hands the program as secret config."""
    values = copy.deepcopy(definition["values"])
    for path, value in sets.items():
        *parents, last = path.split(".")
        node = values
        for key in parents:
            node = node[key]
        node[last] = value

    def resolve(node: Any) -> Any:
        if isinstance(node, dict) and set(node) == {"fn::secret"}:
            return EscSecret(resolve(node["fn::secret"]))
        if isinstance(node, dict):
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, str) and (ref := re.fullmatch(r"\$\{([\w.]+)\}", node)):
            target = values
            for key in ref[1].split("."):
                target = target[key]
            return resolve(target)
        return node

    def secret(node: Any) -> bool:
        return isinstance(node, EscSecret) or (isinstance(node, dict) and any(map(secret, node.values())))

    def plain(node: Any) -> Any:
        if isinstance(node, EscSecret):
            return plain(node.value)
        return {k: plain(v) for k, v in node.items()} if isinstance(node, dict) else node

    config = resolve(values["pulumiConfig"])
    return {k: plain(v) for k, v in config.items()}, [k for k, v in config.items() if secret(v)]


def engine_config(secret_keys: list[str]) -> Callable[[dict[str, Any]], None]:
    """The harness's set_config, with the secret keys the engine would mark: those ESC marks, not every credential."""

    def set_config(values: dict[str, Any]) -> None:
        pulumi.runtime.set_all_config(
            {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()}, secret_keys=secret_keys
        )

    return set_config


def in_plain_text(value: Any, needle: str, where: str = "") -> list[str]:
    """Every place `needle` appears outside a secret."""
    if is_secret(value):
        return []
    if isinstance(value, dict):
        return [w for k, v in value.items() for w in in_plain_text(v, needle, f"{where}.{k}")]
    if isinstance(value, list):
        return [w for i, v in enumerate(value) for w in in_plain_text(v, needle, f"{where}[{i}]")]
    return [where] if isinstance(value, str) and needle in value else []


def stack_files_import_the_environment() -> dict[str, list[str]]:
    return {
        stack: yaml.safe_load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()).get("environment", [])
        for stack in USERS
    }


@pytest.fixture(scope="module")
def backend() -> dict[str, Exports]:
    """The set brought up once, as the pipeline's stages would; each path below runs its secrets' users against it."""
    return a_set_is_up(SET)[0]


PATHS = ("pulumi config set --secret", "ESC, fn::secret", "ESC, a value not marked secret")


@pytest.mark.parametrize("path", PATHS)
def test_the_scram_password_reaches_the_mirror_and_the_scram_user_alike_from_config_or_esc_never_in_plain_text(
    path, backend, monkeypatch
):
    """Both stacks that use the password import one environment; through either path the mirror's Kubernetes
    Secret and the MSK SCRAM user get the same value, as a secret, and no ConfigMap, input or export holds it in
    plain text (an ESC value not marked secret included: the program makes every credential a secret)."""
    assert stack_files_import_the_environment() == dict.fromkeys(USERS, [f"mirrorkit/{SET}"])
    definition = yaml.safe_load(ESC_DEFINITION.read_text())
    if path == "pulumi config set --secret":
        config, secret_keys = {CREDENTIALS: {"primary": {"password": PASSWORD}}}, [CREDENTIALS]
    else:
        value = {"fn::secret": PASSWORD} if path == "ESC, fn::secret" else PASSWORD
        config, secret_keys = esc_open(definition, {"kafka.primary.password": value})
        assert config == {CREDENTIALS: {"primary": {"password": PASSWORD}}}
        assert secret_keys == ([CREDENTIALS] if path == "ESC, fn::secret" else [])
    monkeypatch.setattr(harness, "set_config", engine_config(secret_keys))
    runs: dict[str, Run] = {}
    for stack in USERS:
        values = stack_values(ROOT / "stacks" / f"Pulumi.{stack}.yaml") | config
        runs[stack] = run_values(values, stack=stack, stacks=dict(backend))
    site, msk = runs[f"{SET}-site-euw1"], runs[f"{SET}-msk-primary"]

    (secret,) = [s for s in site.of_type(K8S_SECRET) if s.plain["metadata"]["name"] == "mirrorkit-primary"]
    assert secret.plain["stringData"] == {"password": PASSWORD}
    (version,) = msk.of_type("aws:secretsmanager/secretVersion:SecretVersion")
    assert is_secret(version.inputs["secretString"])
    assert json.loads(version.plain["secretString"])["password"] == PASSWORD
    for run in runs.values():
        assert all(run.result["credential_is_secret"].values()) and run.result["credential_is_secret"]
        plain = {r.name: w for r in run.resources if (w := in_plain_text(r.inputs, PASSWORD))}
        assert plain == {}, f"{path}: in plain text at {plain}"
        exports = run.result["exports"]
        assert [k for k, v in exports.values.items() if PASSWORD in repr(v) and k not in exports.secret] == []
    config_maps = site.of_type("kubernetes:core/v1:ConfigMap")
    assert config_maps and not [c.name for c in config_maps if PASSWORD in repr(c.plain)]


def test_the_shipped_esc_environment_holds_no_secret_and_feeds_the_credential_key_the_stacks_read():
    definition = yaml.safe_load(ESC_DEFINITION.read_text())
    config, secret_keys = esc_open(definition, {})
    assert set(config) == {CREDENTIALS} and secret_keys == [CREDENTIALS]
    assert config[CREDENTIALS] == {"primary": {"password": "replace-me-with-esc-env-set"}}  # a placeholder
    needed = with_secrets(topology_values(SET))[CREDENTIALS]
    assert {a: set(files) for a, files in config[CREDENTIALS].items()} == {a: set(f) for a, f in needed.items()}


class ApiServerVersions(RecordingMocks):
    """The mocks, with each Kubernetes Secret's metadata.resourceVersion as the API server keeps it: raised by a write
    that changes the Secret, kept by one that does not."""

    held: dict[str, tuple[dict[str, Any], int]] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        found, outputs = super().new_resource(args)
        if args.typ == K8S_SECRET:
            urn = self.options[(args.typ, args.name)]["urn"]
            before, version = self.held.get(urn, ({}, 0))
            version += dict(args.inputs) != before
            self.held[urn] = (dict(args.inputs), version)
            outputs = outputs | {"metadata": outputs["metadata"] | {"resourceVersion": str(version)}}
        return found, outputs


def test_a_rotated_secret_resubmits_the_mirror_an_unchanged_one_does_not_and_the_hash_holds_nothing_of_it(
    monkeypatch,
):
    monkeypatch.setattr(ApiServerVersions, "held", {})
    monkeypatch.setattr(harness, "RecordingMocks", ApiServerVersions)
    first = with_secrets(stack_values(ONPREM))

    def driver_annotations(values: dict[str, Any]) -> tuple[dict[str, str], Run]:
        run = run_values(values, stack="onprem-to-msk")
        (app,) = run.of_type(SPARK_APP)
        return app.plain["spec"]["driver"]["annotations"], run

    up1, run = driver_annotations(first)
    up2, _ = driver_annotations(copy.deepcopy(first))
    rotated = copy.deepcopy(first)
    rotated[CREDENTIALS]["aws"]["password"] = PASSWORD
    up3, _ = driver_annotations(rotated)
    resized = copy.deepcopy(rotated)
    resized[f"{PROJECT}:mirror"]["executor"]["instances"] = 4
    up4, _ = driver_annotations(resized)

    assert up2[SECRETS_HASH_ANNOTATION] == up1[SECRETS_HASH_ANNOTATION]  # unchanged: no restart
    assert up3[SECRETS_HASH_ANNOTATION] != up1[SECRETS_HASH_ANNOTATION]  # rotated: a new submission
    assert up3[CONFIG_HASH_ANNOTATION] == up1[CONFIG_HASH_ANNOTATION]  # the config hash alone would not restart it
    assert up4[SECRETS_HASH_ANNOTATION] == up3[SECRETS_HASH_ANNOTATION]  # nor does a change beside the secrets
    # The hash is of the Secrets' versions alone: no value of theirs goes in, so no guess can be tested against it.
    assert up1[SECRETS_HASH_ANNOTATION] == secrets_version_hash({"aws": "1", "dc1": "1"})
    assert up3[SECRETS_HASH_ANNOTATION] == secrets_version_hash({"aws": "2", "dc1": "1"})
    sentinels = [v for files in first[CREDENTIALS].values() for v in files.values()] + [PASSWORD]
    assert not [v for v in sentinels if hashlib.sha256(v.encode()).hexdigest() in repr(up3) or v in repr(up3)]
    # The Secret is written before the application is resubmitted: the application depends on both Secrets.
    (app,) = run.of_type(SPARK_APP)
    secrets = {s.urn for s in run.of_type(K8S_SECRET)}
    assert len(secrets) == 2 and secrets <= set(app.dependencies)


def test_a_mirror_with_no_secret_carries_no_secrets_hash(stack_runs):
    (app,) = [a for a in stack_runs["active-active"].of_type(SPARK_APP) if "use1" in a.name]
    assert SECRETS_HASH_ANNOTATION not in app.plain["spec"]["driver"]["annotations"]  # IAM on both sides
    (app,) = stack_runs["dr-msk-to-eventhubs"].of_type(SPARK_APP)
    assert SECRETS_HASH_ANNOTATION in app.plain["spec"]["driver"]["annotations"]
