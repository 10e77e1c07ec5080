"""A flow's replication policy is one object that names copies and stops loops; no other module compares its name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from spark_app.config import parse_config
from spark_app.policy import DefaultPolicy, IdentityPolicy, access, replication_policy, should_mirror

PACKAGE = Path(__file__).resolve().parent.parent / "spark_app"
# The schema checks what a pair of flows configures (config), and adopt compares a flow's policy with MM2's by name.
NAME_READERS = {"policy.py", "config.py", "dr/adopt.py"}


def flow(**keys: object):
    raw = {
        "clusters": [
            {"alias": "a", "bootstrap_servers": "a.example:9092", "profile": "kafka"},
            {"alias": "b", "bootstrap_servers": "b.example:9092", "profile": "kafka"},
        ],
        "flows": [{"source": "a", "target": "b", "topics": {"include": ["orders.*", "b.*"]},
                   "checkpoint_location": "/c"} | keys],
    }  # fmt: skip
    return parse_config(raw, source="test").flows[0]


def test_the_default_policy_prefixes_the_source_alias_and_never_mirrors_the_targets_copies_back():
    f = flow(separator="_")
    policy = replication_policy(f)
    assert policy == DefaultPolicy("a", "b", "_") and policy.renames and not policy.stamps
    assert policy.target_topic("orders") == "a_orders"
    assert policy.came_from_target("b_orders") and not policy.came_from_target("a_orders")
    assert not policy.came_from_target("b_") and not policy.came_from_target("b")
    assert not should_mirror(f, "b_orders") and should_mirror(f, "orders.eu")
    assert re.fullmatch(policy.copies("orders.*|x"), "a_x") and not re.fullmatch(policy.copies("orders.*"), "orders")
    assert policy.drops((b"b", 1)) is False


def test_the_identity_policy_keeps_names_and_drops_only_its_targets_stamped_echoes():
    stamping = replication_policy(flow(replication_policy="identity"))
    assert stamping == IdentityPolicy("b", True) and not stamping.renames and stamping.stamps
    assert stamping.target_topic("orders") == "orders" and stamping.copies("orders.*") == "orders.*"
    assert not stamping.came_from_target("b.orders")
    assert stamping.drops((b"b", 7)) and not stamping.drops((b"a", 7)) and not stamping.drops(None)
    plain = replication_policy(flow(replication_policy="identity", provenance_header=False))
    assert not plain.stamps and not plain.drops((b"b", 7))


def test_infra_grants_the_copies_each_policy_names():
    default = access([flow()], "b").written
    identity = access([flow(replication_policy="identity")], "b").written
    assert all(p.startswith(re.escape("a.")) for p in default) and default
    assert identity == {"orders.*", "b.*"}


def test_no_module_but_the_policy_compares_a_flows_policy_name():
    comparing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                if any(isinstance(p, ast.Attribute) and p.attr == "replication_policy" for p in parts):
                    comparing.append(name)
    assert set(comparing) <= NAME_READERS, comparing
