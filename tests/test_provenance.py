"""The identity policy's provenance header: what the mirror stamps, and which records it drops as echoes."""

from __future__ import annotations

from spark_app.config import FlowConfig
from spark_app.policy import drops_record, origin, provenance


def identity_flow(**overrides: object) -> FlowConfig:
    return FlowConfig.model_validate(
        {"source": "a", "target": "b", "topics": {"include": ["t"]}, "checkpoint_location": "/c"}
        | {"replication_policy": "identity"}
        | overrides
    )


def test_a_stamp_names_its_cluster_and_offset_and_only_the_targets_own_come_back_dropped():
    assert origin(provenance("b", 42)) == (b"b", 42)
    assert origin("b:7") == (b"b", 7), "headers may come as str"
    flow = identity_flow()
    assert drops_record(flow, origin(provenance("b", 42))), "it came from the target: an echo"
    assert not drops_record(flow, origin(provenance("c", 42))), "it came from a third cluster"
    assert not drops_record(identity_flow(provenance_header=False), origin(provenance("b", 42)))
    assert not drops_record(identity_flow(replication_policy="default"), origin(provenance("b", 42)))


def test_a_value_the_mirror_did_not_stamp_is_no_provenance_and_never_dropped():
    for value in (b"b", b"b:", b"b:x", b"", "b"):
        assert origin(value) is None, value
    assert not drops_record(identity_flow(), None)
