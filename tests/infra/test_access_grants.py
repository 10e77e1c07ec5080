"""The IAM policy and the Kafka ACLs render from one access set (spark_app.policy.access), so they agree."""

from __future__ import annotations

from infra.aws.identity import kafka_policy
from infra.kafka.acls import mirror_acls
from infra.schema import MskSpec
from spark_app.config import FlowConfig

MSK = MskSpec(
    cluster_arn="arn:aws:kafka:eu-west-1:222222222222:cluster/src/abc-1",
    auth="iam",
    vpc_id="vpc-0b",
    cidr="10.20.0.0/16",
    route_table_ids=["rtb-0b1"],
    security_group_id="sg-0b",
)


def flows(emit_heartbeats: bool) -> list[FlowConfig]:
    return [
        FlowConfig(
            source="src",
            target="dst",
            topics={"include": ["orders"]},
            checkpoint_location="/c",
            emit_heartbeats=emit_heartbeats,
        )
    ]


def iam_writes(emit_heartbeats: bool) -> set[str]:
    policy = kafka_policy(flows(emit_heartbeats), {"src": MSK})
    return {
        r.rsplit("/", 1)[1]
        for s in policy["Statement"]
        if "kafka-cluster:WriteData" in s["Action"]
        for r in s["Resource"]
        if ":topic/" in r
    }


def acl_writes(emit_heartbeats: bool) -> set[str]:
    return {a.name for a in mirror_acls("src", flows(emit_heartbeats)) if a.operation == "Write"}


def test_a_flow_that_emits_no_heartbeats_gets_no_heartbeat_write_from_either():
    assert "heartbeats" not in iam_writes(False)
    assert "heartbeats" not in acl_writes(False)


def test_a_flow_that_emits_heartbeats_may_write_them_on_its_source_in_both():
    assert "heartbeats" in iam_writes(True)
    assert "heartbeats" in acl_writes(True)


def test_iam_and_acls_grant_the_same_topics_on_a_source():
    for emit in (True, False):
        assert iam_writes(emit) == acl_writes(emit)
        iam_reads = {
            r.rsplit("/", 1)[1]
            for s in kafka_policy(flows(emit), {"src": MSK})["Statement"]
            if "kafka-cluster:ReadData" in s["Action"]
            for r in s["Resource"]
            if ":topic/" in r
        }
        assert iam_reads == {a.name for a in mirror_acls("src", flows(emit)) if a.operation == "Read"}


def test_iam_and_acls_both_let_a_target_that_syncs_group_offsets_read_the_copies():
    synced = [
        FlowConfig(
            source="src",
            target="dst",
            topics={"include": ["orders"]},
            checkpoint_location="/c",
            groups={"include": ["billing"]},
            sync_group_offsets=True,
        )
    ]
    iam_reads = {
        r.rsplit("/", 1)[1]
        for s in kafka_policy(synced, {"dst": MSK})["Statement"]
        if "kafka-cluster:ReadData" in s["Action"]
        for r in s["Resource"]
        if ":topic/" in r
    }
    acl_reads = {a.name for a in mirror_acls("dst", synced) if a.resource_type == "Topic" and a.operation == "Read"}
    assert "src.orders" in iam_reads and "src.orders" in acl_reads
    assert acl_reads <= iam_reads


def test_iam_and_acls_grant_the_same_transactional_ids_on_a_target():
    for changes in ({"exactly_once": True}, {"mode": "realtime"}, {}):
        flow = FlowConfig.model_validate(
            {"source": "src", "target": "dst", "topics": {"include": ["orders"]}, "checkpoint_location": "/c"} | changes
        )
        iam_ids = {
            r.rsplit("/", 1)[1]
            for s in kafka_policy([flow], {"dst": MSK})["Statement"]
            for r in s["Resource"]
            if ":transactional-id/" in r
        }
        prefixes = {a.name for a in mirror_acls("dst", [flow]) if a.resource_type == "TransactionalID"}
        assert iam_ids == {f"{p}*" for p in prefixes} == ({"mirrorkit.src.dst.*"} if changes else set())


def test_the_iam_policy_lets_the_toolbox_delete_probe_groups_and_write_connects_offsets_without_creating_it():
    # The same operator access set the ACLs render from (spark_app.policy.operator_access).
    flow = FlowConfig(source="src", target="dst", topics={"include": [".*"]}, checkpoint_location="/c")
    plain = kafka_policy([flow], {"src": MSK, "dst": MSK})
    policy = kafka_policy([flow], {"src": MSK, "dst": MSK}, operator=True)

    def actions_on(doc: dict, resource: str) -> set[str]:
        return {a for s in doc["Statement"] for r in s["Resource"] if r.endswith(resource) for a in s["Action"]}

    assert "kafka-cluster:DeleteGroup" in actions_on(policy, ":group/src/abc-1/mirrorkit_drill*")
    assert {"kafka-cluster:CreateTopic", "kafka-cluster:WriteData"} <= actions_on(
        policy, ":topic/src/abc-1/mirrorkit_drill*"
    )
    offsets = actions_on(policy, ":topic/src/abc-1/mm2-offsets.src.internal")
    assert "kafka-cluster:WriteData" in offsets and "kafka-cluster:CreateTopic" not in offsets
    assert "kafka-cluster:ReadData" in actions_on(policy, ":topic/src/abc-1/heartbeats")
    assert not actions_on(plain, "mirrorkit_drill*") and not actions_on(plain, "mm2-offsets.src.internal")
    assert "kafka-cluster:DeleteGroup" not in {a for s in plain["Statement"] for a in s["Action"]}
