"""The copy contract (spark_app.copy_wing.contract) against the cores that read it: the Rust core and the Java copier
each read every field of `CopyContract` by name and nothing else, refuse a contract with a field too many or one
missing (naming it), and hand the landing row back by the contract's names. The Java side runs in the session's
Spark driver, on the jar set-up builds (the `spark` fixture), the Rust side through the installed module (the
`compiled_core` fixture). Neither is skipped when missing: set-up builds both."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from types import ModuleType
from typing import Any

import pytest
from py4j.java_gateway import JavaClass

from spark_app.config import ClusterConfig, FlowConfig
from spark_app.copy_wing.contract import CONTRACT_FIELDS, LANDING_FIELDS, REFUSAL_FIELDS, CopyContract
from spark_app.policy import MAX_OFFSET, origin
from spark_app.ranges import Landing
from spark_app.topics import TargetRule, TargetRules
from spark_app.transactions import transactional_id


def _flow(**overrides: object) -> FlowConfig:
    return FlowConfig.model_validate(
        {"source": "a", "target": "b", "topics": {"include": ["t"]}, "checkpoint_location": "/c"} | overrides
    )


def _contract(**overrides: object) -> CopyContract:
    flow = _flow(**overrides)
    clusters = [ClusterConfig(alias=alias, bootstrap_servers="127.0.0.1:9", profile="kafka") for alias in "ab"]
    rules = TargetRules(10_000, {"t": TargetRule(compacted=True), "u": TargetRule(before_max_ms=5, after_max_ms=None)})
    return CopyContract.of(flow, *clusters, rules)


IDENTITY = _contract(replication_policy="identity")  # stamps and drops, writes no transactions: the Rust core's kind
REALTIME = _contract(mode="realtime")  # writes in transactions: the Java copier's kind
CONTRACTS = [IDENTITY, REALTIME, replace(IDENTITY, max_record_bytes=None, refusals={})]


def _without(contract: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in contract.items() if k != name}


def test_the_contract_is_made_from_the_python_loops_own_rules():
    assert tuple(Landing("t", 0, 0, 0).to_row()) == LANDING_FIELDS, "the landing row is the reference's"
    assert tuple(IDENTITY.to_json()) == CONTRACT_FIELDS, "the JSON has every field, and only those"
    assert (IDENTITY.stamp_provenance, IDENTITY.drop_echoes, IDENTITY.transactional_id_prefix) == (True, True, None)
    assert (REALTIME.stamp_provenance, REALTIME.drop_echoes) == (False, False)
    for slot in (0, 1, 7):
        assert REALTIME.transactional_id(slot) == transactional_id(_flow(mode="realtime"), slot)


def test_a_provenance_offset_past_64_bits_is_no_stamp_of_ours():
    assert origin(f"b:{MAX_OFFSET}") == (b"b", MAX_OFFSET)
    assert origin(f"b:{MAX_OFFSET + 1}") is None
    assert origin("b:" + "9" * 20) is None
    assert IDENTITY.max_provenance_offset == MAX_OFFSET


# The Rust core.


@pytest.mark.parametrize("contract", CONTRACTS, ids=["identity", "realtime", "no-cap"])
def test_the_rust_core_reads_every_field_of_the_contract_by_name(compiled_core: ModuleType, contract: CopyContract):
    assert json.loads(compiled_core.read_contract(contract.dumps())) == contract.to_json()


def test_the_rust_core_refuses_a_contract_with_a_field_too_many_or_one_missing(compiled_core: ModuleType):
    contract = IDENTITY.to_json()
    with pytest.raises(ValueError, match="unknown field `spare`"):
        compiled_core.read_contract(json.dumps(contract | {"spare": 1}))
    for name in CONTRACT_FIELDS:
        with pytest.raises(ValueError, match=f"missing field `{name}`"):
            compiled_core.read_contract(json.dumps(_without(contract, name)))
    rule = contract["refusals"]["t"]
    for changed in (rule | {"spare": 1}, *(_without(rule, name) for name in REFUSAL_FIELDS)):
        with pytest.raises(ValueError, match="unknown field `spare`|missing field `"):
            compiled_core.read_contract(json.dumps(contract | {"refusals": {"t": changed}}))


def test_the_rust_core_hands_back_landing_fields_by_the_contracts_names_and_refuses_what_it_cannot_obey(
    compiled_core: ModuleType,
):
    assert set(compiled_core.landing_fields()) <= set(LANDING_FIELDS)
    copier = compiled_core.Copier(
        [("bootstrap.servers", "127.0.0.1:9"), ("group.id", "contract-test")], [("bootstrap.servers", "127.0.0.1:9")],
        None,
    )  # fmt: skip
    try:
        short = IDENTITY.to_json() | {"landing_fields": [f for f in LANDING_FIELDS if f != "latency_counts"]}
        with pytest.raises(ValueError, match="landing row has no field `latency_counts`"):
            copier.copy(json.dumps(short), [], 1.0)
        with pytest.raises(ValueError, match="writes transactions .* none of its slots'"):
            copier.copy(REALTIME.dumps(), [], 1.0)
        done = copier.copy(IDENTITY.dumps(), [], 1.0)
        assert done["ranges"] == [] and done["stopped"]["kind"] == "" and done["undelivered"] == 0
    finally:
        copier.close()
    slot = compiled_core.Copier(
        [("bootstrap.servers", "127.0.0.1:9"), ("group.id", "contract-test")],
        [("bootstrap.servers", "127.0.0.1:9"), ("transactional.id", REALTIME.transactional_id(3))], None,
    )  # fmt: skip
    try:
        with pytest.raises(ValueError, match="writes no transactions, and this copier's producer is slot"):
            slot.copy(IDENTITY.dumps(), [], 1.0)
        assert slot.copy(REALTIME.dumps(), [], 1.0)["stopped"]["kind"] == ""
    finally:
        slot.close()


# The Java copier.


def _java(spark, contracts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the Java copier made of each contract, asked on the driver's JVM (CopierJob.checkContract)."""
    job = spark._jvm.io.mirrorkit.copier.CopierJob
    assert isinstance(job, JavaClass), "the JVM copier is not on Spark's class path: `bash .ci/setup` builds it"
    return [json.loads(job.checkContract(json.dumps(c))) for c in contracts]


def test_the_java_copier_reads_every_field_of_the_contract_and_makes_the_same_transactional_ids(spark):
    read = _java(spark, [c.to_json() for c in CONTRACTS])
    for contract, got in zip(CONTRACTS, read, strict=True):
        assert got.get("read") == contract.to_json(), got
        assert got["landing_row"] == list(LANDING_FIELDS), "its report rows are keyed by the contract's names"
    assert "transactional_ids" not in read[0], "no prefix, no ids"
    flow = _flow(mode="realtime")
    assert read[1]["transactional_ids"] == [transactional_id(flow, slot) for slot in (0, 1, 7)], "fencing agrees"


def test_the_java_copier_refuses_a_contract_with_a_field_too_many_or_one_missing(spark):
    contract = REALTIME.to_json()
    rule = contract["refusals"]["t"]
    changed = [
        contract | {"spare": 1},
        *(_without(contract, name) for name in CONTRACT_FIELDS),
        contract | {"refusals": {"t": rule | {"spare": 1}}},
        *(contract | {"refusals": {"t": _without(rule, name)}} for name in REFUSAL_FIELDS),
        contract | {"landing_fields": [*LANDING_FIELDS, "spare"]},
        contract | {"landing_fields": [f for f in LANDING_FIELDS if f != "runs"]},
        contract | {"max_runs": "64"},
    ]
    names = ["spare", *CONTRACT_FIELDS, "spare", *REFUSAL_FIELDS, "spare", "runs", "max_runs"]
    for name, got in zip(names, _java(spark, changed), strict=True):
        assert "read" not in got and f"`{name}`" in got["refused"], (name, got)


def test_every_field_of_the_contract_is_one_the_cores_are_tested_on():
    """A field added to CopyContract is in both cores' tests above only when it is in the JSON they read."""
    assert {f.name for f in fields(CopyContract)} == set(CONTRACT_FIELDS) == set(REALTIME.to_json())
