"""Topic ACLs synced from source to target as MirrorMaker 2 does, against real brokers that check ACLs, with the
mirror holding only the grants infra renders for it (infra/kafka/acls.py): ALLOW rules appear on the copies with
WRITE kept off, a rule removed on the source goes (only one the mirror made), and the copies stay read-only to
every principal but the mirror's until failover lifts the block; failback restores it."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from bench.testbed.kafka_cluster import PRINCIPALS, KafkaCluster, ListenerKind, cluster_entry
from infra.kafka.acls import AclSpec, mirror_acls
from spark_app import clients
from spark_app.config import ClusterConfig, ConfigError, FlowConfig, MirrorConfig, parse_config
from spark_app.dr.failback import failback
from spark_app.dr.views import lift
from spark_app.topic_acls import Phase, Rule, ledger_topic, plan, read_ledger
from spark_app.topics import TopicSync

MIRROR = PRINCIPALS[ListenerKind.MSK_SCRAM]
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
_RESOURCES = {
    "Topic": ResourceType.TOPIC,
    "Group": ResourceType.GROUP,
    "TransactionalID": ResourceType.TRANSACTIONAL_ID,
    "Cluster": ResourceType.BROKER,
}


def as_binding(spec: AclSpec, principal: str) -> AclBinding:
    """An ACL infra renders (the Kafka provider's spelling), as a binding the test bed's super user sets."""
    pattern = ResourcePatternType.PREFIXED if spec.pattern == "Prefixed" else ResourcePatternType.LITERAL
    operation = AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", spec.operation).upper()]
    return AclBinding(_RESOURCES[spec.resource_type], spec.name, pattern, principal, "*", operation, ALLOW)


def set_acls(cluster: KafkaCluster, bindings: list[AclBinding]) -> None:
    admin = clients.admin(cluster.admin)
    for future in admin.create_acls(bindings, request_timeout=15).values():
        future.result()


def delete_acls(cluster: KafkaCluster, bindings: list[AclBinding]) -> None:
    filters = [
        AclBindingFilter(
            b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type
        )
        for b in bindings
    ]
    admin = clients.admin(cluster.admin)
    for future in admin.delete_acls(filters, request_timeout=15).values():
        future.result()


def topic_rules(cluster: KafkaCluster, topic: str) -> set[tuple[str, str, str]]:
    """(principal, operation, permission) of every literal ACL on the topic, as the super user sees them."""
    found = AclBindingFilter(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    admin = clients.admin(cluster.admin)  # held until the answer comes: a dropped client cancels its requests
    bindings = admin.describe_acls(found, request_timeout=15).result()
    return {(b.principal, b.operation.name, b.permission_type.name) for b in bindings}


def topic_acl(topic: str, principal: str, operation: AclOperation, permission: AclPermissionType = ALLOW) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", operation, permission)


def mirror_config(
    source: KafkaCluster, target: KafkaCluster, topic: str, tmp_path, back: str | None = None
) -> MirrorConfig:
    """A flow src -> dst of one topic, and with `back` the reverse flow dst -> src of that topic and group (an
    active/active config, as failback takes); `sync_topic_acls` left unset, so on by default between two ACL
    clusters."""
    flows = [{"source": "src", "target": "dst", "topics": {"include": [re.escape(topic)]}}]
    if back is not None:
        flows.append(
            {"source": "dst", "target": "src", "topics": {"include": [re.escape(back)]}, "groups": {"include": [back]}}
        )
    return parse_config(
        {
            "clusters": [cluster_entry(source, "src"), cluster_entry(target, "dst")],
            "flows": [f | {"checkpoint_location": str(tmp_path / f"cp-{f['source']}")} for f in flows],
        }
    )


def grant_the_mirror(config: MirrorConfig, source: KafkaCluster, target: KafkaCluster) -> None:
    """What infra renders for the mirror's principal on each cluster, and nothing more."""
    set_acls(source, [as_binding(s, MIRROR) for s in mirror_acls("src", config.flows)])
    set_acls(target, [as_binding(s, MIRROR) for s in mirror_acls("dst", config.flows)])


def source_topic(cluster: KafkaCluster, topic: str) -> None:
    admin = clients.admin(cluster.admin)
    admin.create_topics([NewTopic(topic, 2)], request_timeout=15)[topic].result()


def test_allow_rules_on_the_source_appear_on_the_copy_with_write_kept_off_and_a_removed_rule_goes(
    acl_source_cluster: KafkaCluster, acl_target_cluster: KafkaCluster, unique: str, tmp_path
):
    topic, other = f"orders-{unique}", f"skipped-{unique}"
    app, admin_app, denied, bystander = (f"User:{n}-{unique}" for n in ("app", "ops", "denied", "bystander"))
    config = mirror_config(acl_source_cluster, acl_target_cluster, topic, tmp_path)
    flow = config.flows[0]
    assert flow.sync_topic_acls is True  # the default between two clusters with Kafka ACLs
    grant_the_mirror(config, acl_source_cluster, acl_target_cluster)
    source_topic(acl_source_cluster, topic)
    copy = f"src.{topic}"
    on_source = [
        topic_acl(topic, app, AclOperation.READ),
        topic_acl(topic, app, AclOperation.DESCRIBE),
        topic_acl(topic, app, AclOperation.WRITE),
        topic_acl(topic, admin_app, AclOperation.ALL),
        topic_acl(topic, denied, AclOperation.READ, DENY),
        topic_acl(topic, denied, AclOperation.WRITE, DENY),
        topic_acl(other, app, AclOperation.READ),  # a topic the flow does not mirror
        AclBinding(ResourceType.TOPIC, topic[:6], ResourcePatternType.PREFIXED, app, "*", AclOperation.READ, ALLOW),
    ]
    set_acls(acl_source_cluster, on_source)
    by_hand = topic_acl(copy, bystander, AclOperation.DESCRIBE_CONFIGS)  # set on the target by its own operator
    set_acls(acl_target_cluster, [by_hand])

    sync = TopicSync(flow, config.cluster("src"), config.cluster("dst"))
    assert sync.sync().mirrored == {topic: 2}

    # The mirror's own rules (infra's on the copies, and its source grants synced like any) aside.
    theirs = {(p, op, perm) for p, op, perm in topic_rules(acl_target_cluster, copy) if p != MIRROR}
    assert theirs == {
        (app, "READ", "ALLOW"),
        (app, "DESCRIBE", "ALLOW"),
        (admin_app, "READ", "ALLOW"),  # ALLOW ALL comes over as READ
        (denied, "READ", "DENY"),
        (bystander, "DESCRIBE_CONFIGS", "ALLOW"),
    }
    assert not [r for r in theirs if r[1] in ("WRITE", "ALL")]
    # The grants kept off are remembered on the target, for failover.
    ledger = read_ledger(config.cluster("dst"), flow)
    withheld = {(r.principal, r.operation, r.permission) for r, p in ledger.items() if p is Phase.WITHHELD}
    withheld.discard((MIRROR, "WRITE", "ALLOW"))
    assert withheld == {(app, "WRITE", "ALLOW"), (admin_app, "ALL", "ALLOW"), (denied, "WRITE", "DENY")}
    assert not topic_rules(acl_target_cluster, f"src.{other}")

    delete_acls(acl_source_cluster, [on_source[0], on_source[2]])  # app may no longer read, nor write
    assert sync.acls is not None
    sync.acls.sync([topic])
    assert {r for r in topic_rules(acl_target_cluster, copy) if r[0] != MIRROR} == {
        (app, "DESCRIBE", "ALLOW"),
        (admin_app, "READ", "ALLOW"),
        (denied, "READ", "DENY"),
        (bystander, "DESCRIBE_CONFIGS", "ALLOW"),  # not the mirror's: left alone
    }
    ledger = read_ledger(config.cluster("dst"), flow)
    assert not [r for r in ledger if r.principal == app and r.operation in ("READ", "WRITE")]


def produce_one(cluster: ClusterConfig, topic: str) -> KafkaError | None:
    """One record from an application's own producer; the error it was refused with, None when it was written."""
    producer = clients.producer(cluster, {"acks": "all", "message.timeout.ms": 30_000})
    outcome: list[KafkaError | None] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        outcome.append(err)

    producer.produce(topic, key=b"k", value=b"written on the DR side", on_delivery=delivered)
    producer.flush(60)
    assert len(outcome) == 1, "the record was neither written nor refused"
    return outcome[0]


def test_a_producer_on_the_dr_side_is_refused_on_a_copy_before_failover_accepted_after_and_failback_blocks_it(
    acl_source_cluster: KafkaCluster, acl_target_cluster: KafkaCluster, unique: str, tmp_path
):
    topic = f"payments-{unique}"
    name = f"app-{unique}"
    application = acl_target_cluster.add_user(name)  # the same application, signed in on the DR side
    config = mirror_config(acl_source_cluster, acl_target_cluster, topic, tmp_path, back=f"local-{unique}")
    flow = config.flows[0]
    grant_the_mirror(config, acl_source_cluster, acl_target_cluster)
    source_topic(acl_source_cluster, topic)
    principal = f"User:{name}"
    ops = (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.READ)
    set_acls(acl_source_cluster, [topic_acl(topic, principal, op) for op in ops])
    copy = f"src.{topic}"

    sync = TopicSync(flow, config.cluster("src"), config.cluster("dst"))
    assert sync.sync().mirrored == {topic: 2}
    assert (principal, "DESCRIBE", "ALLOW") in topic_rules(acl_target_cluster, copy)

    refused = produce_one(application, copy)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused

    lift(config, flow)  # failover's step after the groups
    assert (principal, "WRITE", "ALLOW") in topic_rules(acl_target_cluster, copy)
    assert produce_one(application, copy) is None
    assert produce_one(config.cluster("dst"), copy) is None  # the mirror still writes its copies

    # Failback of the reverse flow (forced: nothing was mirrored back here) puts the original flow's block back.
    result = failback(config, config.flow("dst->src"), force=True)
    assert result.actions == [] and result.refused == []
    assert read_ledger(config.cluster("dst"), flow)[Rule(copy, principal, "*", "WRITE", "ALLOW")] is Phase.WITHHELD
    assert (principal, "WRITE", "ALLOW") not in topic_rules(acl_target_cluster, copy)
    refused = produce_one(application, copy)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    # The next sync round keeps it so: the grant is withheld again, not set.
    assert sync.acls is not None
    sync.acls.sync([topic])
    assert (principal, "WRITE", "ALLOW") not in topic_rules(acl_target_cluster, copy)


def test_a_rule_set_by_hand_on_a_copy_is_never_claimed_nor_removed_by_the_sync():
    by_hand = Rule("src.t", "User:ops", "*", "READ", "ALLOW")
    steps = plan({by_hand: Phase.COPIED}, {}, {by_hand})
    assert steps.create == [] and steps.record == {}
    gone = plan({}, {}, {by_hand})
    assert gone.delete == [] and gone.record == {}


def test_a_lifted_grant_stays_lifted_while_the_source_keeps_it_and_goes_when_the_source_drops_it():
    grant = Rule("src.t", "User:app", "*", "WRITE", "ALLOW")
    kept = plan({grant: Phase.WITHHELD}, {grant: Phase.LIFTED}, {grant})
    assert kept.create == kept.delete == [] and kept.record == {}
    dropped = plan({}, {grant: Phase.LIFTED}, {grant})
    assert dropped.delete == [grant] and dropped.record == {grant: None}


def test_the_ledger_lives_on_the_target_under_a_name_no_flow_mirrors():
    from spark_app.policy import never_mirrored

    flow = FlowConfig(source="src", target="dst", topics={"include": [".*"]}, checkpoint_location="/c")
    assert ledger_topic(flow) == "mirrorkit-acls.src.dst" and never_mirrored(ledger_topic(flow))


def two_clusters(target: dict, **flow: object) -> dict:
    return {
        "clusters": [
            {"alias": "src", "bootstrap_servers": "src:9096", "profile": "msk-scram", "username": "m",
             "password": {"env": "P"}},
            {"alias": "dst", "bootstrap_servers": "dst:9093"} | target,
        ],
        "flows": [
            {"source": "src", "target": "dst", "topics": {"include": ["orders"]}, "checkpoint_location": "/c"} | flow
        ],
    }  # fmt: skip


KAFKA_ACL_TARGETS = [
    {"profile": "kafka"},
    {"profile": "msk-scram", "username": "m", "password": {"env": "P"}},
    {"profile": "mtls", "client_cert_file": "/c.pem", "client_key": {"file": "/k.pem"}},
]
NO_ACL_TARGETS = [
    {"profile": "eventhubs", "password": {"env": "P"}},
    {"profile": "msk-iam", "region": "eu-west-1"},
]


@pytest.mark.parametrize("target", KAFKA_ACL_TARGETS, ids=lambda t: t["profile"])
def test_topic_acls_sync_by_default_where_both_clusters_have_kafka_acls(target):
    assert parse_config(two_clusters(target)).flows[0].sync_topic_acls is True
    assert parse_config(two_clusters(target, sync_topic_acls=False)).flows[0].sync_topic_acls is False


@pytest.mark.parametrize("target", NO_ACL_TARGETS, ids=lambda t: t["profile"])
def test_no_topic_acl_sync_where_the_target_has_no_kafka_acls_and_asking_for_it_names_the_key(target):
    assert parse_config(two_clusters(target)).flows[0].sync_topic_acls is False
    with pytest.raises(ConfigError, match=r"^config:flows\[0\]\.sync_topic_acls: 'dst' \(.*\) has no Kafka ACLs"):
        parse_config(two_clusters(target, sync_topic_acls=True))


def test_a_sync_topic_acls_that_is_not_a_boolean_names_the_key():
    with pytest.raises(ConfigError, match=r"config:flows\[0\]\.sync_topic_acls: Input should be a valid boolean"):
        parse_config(two_clusters(KAFKA_ACL_TARGETS[0], sync_topic_acls="sometimes"))
