"""Stack files become validated settings; a bad stack fails before any resource, naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pulumi
import pytest
import yaml

from infra.settings import PROJECT, load_settings
from spark_app.config import ConfigError

STACKS = sorted((Path(__file__).resolve().parents[2] / "stacks").glob("Pulumi.*.yaml"))


def stack_config(path: Path) -> pulumi.Config:
    """Load a stack file into Pulumi's runtime config, as `pulumi preview` would."""
    values = yaml.safe_load(path.read_text())["config"]
    pulumi.runtime.set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()})
    return pulumi.Config(PROJECT)


@pytest.mark.parametrize("stack", STACKS, ids=[p.name for p in STACKS])
def test_every_stack_file_yields_a_valid_mirror_config(stack):
    settings = load_settings(stack_config(stack))
    assert settings.image and settings.mirror.flows
    assert all(f.source != f.target for f in settings.mirror.flows)


def test_there_is_a_stack_file():
    assert STACKS, "stacks/ holds no Pulumi.<stack>.yaml"


def test_a_flow_to_an_unknown_cluster_fails_naming_the_key(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    raw = yaml.safe_load(STACKS[0].read_text())
    raw["config"]["mirrorkit:mirror"]["flows"][0]["target"] = "dr2"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as refused:
        load_settings(stack_config(bad))
    assert "mirrorkit:mirror:flows[0].target: unknown cluster 'dr2'" in str(refused.value)


def test_a_missing_mirror_key_is_named(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(yaml.safe_dump({"config": {"mirrorkit:image": "x"}}))
    with pytest.raises(ConfigError, match="mirrorkit:mirror: missing"):
        load_settings(stack_config(bad))
