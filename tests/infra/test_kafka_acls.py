"""Kafka ACLs as code for the mirror's SCRAM or mTLS user on a self-managed cluster, and for its SCRAM user on MSK
where the stack asks for them: least privilege, from the same flows and naming policy the mirror runs with."""

from __future__ import annotations

import copy
import json

import pytest

from infra.kafka.acls import AclSpec, mirror_acls
from infra.settings import load_settings
from spark_app.config import ConfigError, FlowConfig
from spark_app.transactions import transactional_id
from tests.infra.harness import (
    BOOTSTRAPS,
    ROOT,
    Run,
    a_set_is_up,
    is_secret,
    part_values,
    run_values,
    sentinel,
    set_config,
    stack_values,
    with_secrets,
)
from tests.infra.test_regions import SPARK_APP

ONPREM = ROOT / "stacks" / "Pulumi.onprem-to-msk.yaml"
ACL = "kafka:index/acl:Acl"
PRINCIPAL = "User:CN=mirror,OU=dr"


def onprem(reverse: bool = False, heartbeats: bool = True) -> dict:
    values = copy.deepcopy(stack_values(ONPREM))
    values["mirrorkit:clusters"][0]["kafka"]["acls"] = {"principal": PRINCIPAL}
    flow = values["mirrorkit:flows"][0]
    flow["emit_heartbeats"] = heartbeats
    if reverse:
        flow |= {"source": "aws", "target": "dc1", "groups": {"include": ["billing"]}, "sync_group_offsets": True}
    return with_secrets(values)


def acls(run: Run) -> set[tuple[str, str, str, str]]:
    found = set()
    for acl in run.of_type(ACL):
        p = acl.plain
        assert (p["aclPrincipal"], p["aclPermissionType"], p["aclHost"]) == (PRINCIPAL, "Allow", "*")
        found.add((p["aclResourceType"], p["resourcePatternTypeFilter"], p["aclResourceName"], p["aclOperation"]))
    return found


def test_on_a_source_the_mirror_reads_its_topics_describes_groups_and_writes_heartbeats():
    run = run_values(onprem())
    got = acls(run)
    for pattern, name in (("Prefixed", "orders"), ("Literal", "payments")):
        for operation in ("Read", "Describe", "DescribeConfigs"):
            assert ("Topic", pattern, name, operation) in got
        assert ("Topic", pattern, name, "Write") not in got
    assert ("Group", "Literal", "*", "Describe") in got and ("Group", "Literal", "*", "Read") not in got
    assert {("Topic", "Literal", "heartbeats", op) for op in ("Write", "Describe", "Create")} <= got
    assert not [a for a in got if a[3] in ("All", "Alter", "Delete", "ClusterAction")]
    # The admin credential that sets the ACLs reaches no pod.
    (secret,) = [s for s in run.of_type("kubernetes:core/v1:Secret") if s.plain["metadata"]["name"] == "mirrorkit-dc1"]
    assert set(secret.plain["stringData"]) == {"client_cert", "client_key"}
    (provider,) = run.of_type("pulumi:providers:kafka")
    assert json.loads(provider.plain["bootstrapServers"]) == ["kafka-0.dc1.example:9093", "kafka-1.dc1.example:9093"]
    assert is_secret(provider.inputs["clientKey"])


def test_no_heartbeat_write_when_heartbeats_are_off():
    got = acls(run_values(onprem(heartbeats=False)))
    assert not [a for a in got if a[2] == "heartbeats"]


def test_on_a_target_the_mirror_writes_its_copies_and_own_topics_and_moves_only_its_groups():
    got = acls(run_values(onprem(reverse=True)))
    for pattern, name in (("Prefixed", "aws.orders"), ("Literal", "aws.payments")):
        for operation in ("Write", "Describe", "Create", "DescribeConfigs", "AlterConfigs"):
            assert ("Topic", pattern, name, operation) in got
    for own in ("aws.checkpoints.internal", "mirrorkit-offset-syncs.aws.internal", "aws.heartbeats"):
        assert ("Topic", "Literal", own, "Write") in got and ("Topic", "Literal", own, "Read") in got
    assert ("Group", "Literal", "billing", "Read") in got and ("Group", "Literal", "*", "Read") not in got
    # Heartbeats are written on the source, which is MSK here; the toolbox's adopt reads MM2's there, no more.
    assert {a for a in got if a[2] == "heartbeats"} == {
        ("Topic", "Literal", "heartbeats", op) for op in ("Read", "Describe")
    }


def test_a_target_that_syncs_group_offsets_may_read_the_copies_the_groups_commit_on():
    # OffsetCommit for group G on topic T needs Read on T as well as on G.
    got = acls(run_values(onprem(reverse=True)))
    for pattern, name in (("Prefixed", "aws.orders"), ("Literal", "aws.payments")):
        assert ("Topic", pattern, name, "Read") in got


def test_a_target_that_does_not_sync_group_offsets_still_lets_failover_commit_the_groups_on_the_copies():
    # The site's toolbox runs `failover` as the mirror's principal, and it commits the groups' translated offsets on
    # the copies whether or not the mirror syncs them (spark_app.policy.operator_access; infra.k8s.toolbox).
    values = onprem(reverse=True)
    values["mirrorkit:flows"][0]["sync_group_offsets"] = False
    got = acls(run_values(values))
    for pattern, name in (("Prefixed", "aws.orders"), ("Literal", "aws.payments")):
        assert ("Topic", pattern, name, "Read") in got
    assert ("Group", "Literal", "billing", "Read") in got


def transactional_acls(flow: FlowConfig, alias: str) -> set[AclSpec]:
    return {a for a in mirror_acls(alias, [flow]) if a.resource_type == "TransactionalID"}


@pytest.mark.parametrize(
    "changes", [{"exactly_once": True}, {"mode": "realtime"}, {"mode": "realtime", "exactly_once": True}]
)
def test_a_flow_whose_slots_write_in_transactions_may_write_its_transactional_ids_on_its_target_only(changes):
    # Every slot's id is the flow's prefix and the slot's number (spark_app.transactions.transactional_id).
    flow = FlowConfig(source="dc1", target="aws", topics={"include": ["orders"]}, checkpoint_location="/c", **changes)
    assert transactional_acls(flow, "aws") == {
        AclSpec("TransactionalID", "Prefixed", "mirrorkit.dc1.aws.", "Write"),
        AclSpec("TransactionalID", "Prefixed", "mirrorkit.dc1.aws.", "Describe"),
    }
    assert transactional_id(flow, 7).startswith("mirrorkit.dc1.aws.")
    assert transactional_acls(flow, "dc1") == set()


def test_an_exactly_once_flow_may_commit_its_positions_with_its_records():
    # TxnOffsetCommit for the positions group on a copy needs Read on both.
    flow = FlowConfig(
        source="dc1", target="aws", topics={"include": ["orders"]}, checkpoint_location="/c", exactly_once=True
    )
    got = set(mirror_acls("aws", [flow]))
    assert {AclSpec("Group", "Literal", "mirrorkit-positions.dc1.aws", op) for op in ("Read", "Describe")} <= got
    assert AclSpec("Topic", "Literal", "dc1.orders", "Read") in got


def test_a_throughput_flow_without_exactly_once_gets_no_transactional_rights():
    flow = FlowConfig(source="dc1", target="aws", topics={"include": ["orders"]}, checkpoint_location="/c")
    assert transactional_acls(flow, "aws") == transactional_acls(flow, "dc1") == set()
    assert not [a for a in mirror_acls("aws", [flow]) if a.name.startswith("mirrorkit-positions.")]


def test_the_program_sets_the_transactional_id_acls_of_an_exactly_once_flow_into_its_cluster():
    values = onprem(reverse=True)
    values["mirrorkit:flows"][0]["exactly_once"] = True
    got = acls(run_values(values))
    assert {a for a in got if a[0] == "TransactionalID"} == {
        ("TransactionalID", "Prefixed", "mirrorkit.aws.dc1.", op) for op in ("Write", "Describe")
    }


def test_a_self_managed_scram_cluster_gets_the_mirrors_acls_under_its_scram_user():
    values = copy.deepcopy(stack_values(ONPREM))
    values["mirrorkit:clusters"][0]["kafka"] = {
        "bootstrap_servers": "kafka-0.dc1.example:9096",
        "auth": "scram",
        "username": "mirror",
        "acls": {"admin_username": "acl-admin"},
    }
    run = run_values(with_secrets(values))
    got = {(a.plain["aclPrincipal"], a.plain["aclResourceName"], a.plain["aclOperation"]) for a in run.of_type(ACL)}
    assert ("User:mirror", "orders", "Read") in got and ("User:mirror", "payments", "Read") in got
    assert {principal for principal, _, _ in got} == {"User:mirror"}
    (provider,) = run.of_type("pulumi:providers:kafka")
    assert (provider.plain["saslMechanism"], provider.plain["saslUsername"]) == ("scram-sha512", "acl-admin")
    assert is_secret(provider.inputs["saslPassword"])
    (secret,) = [s for s in run.of_type("kubernetes:core/v1:Secret") if s.plain["metadata"]["name"] == "mirrorkit-dc1"]
    assert set(secret.plain["stringData"]) == {"password"}  # the admin password reaches no pod


DR = ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml"
MSK_PART, SITE_PART = "dr-msk-to-eventhubs-msk-primary", "dr-msk-to-eventhubs-site-euw1"


def msk_with_acls() -> dict:
    """dr-msk-to-eventhubs with the program setting the mirror's ACLs on its MSK (SCRAM) source."""
    values = copy.deepcopy(stack_values(DR))
    values["mirrorkit:clusters"][0]["msk"]["acls"] = {"admin_username": "acl-admin"}
    return values


def msk_acls(run: Run) -> set[AclSpec]:
    found = set()
    for acl in run.of_type(ACL):
        p = acl.plain
        assert (p["aclPrincipal"], p["aclPermissionType"], p["aclHost"]) == ("User:mirror", "Allow", "*")
        found.add(
            AclSpec(p["aclResourceType"], p["resourcePatternTypeFilter"], p["aclResourceName"], p["aclOperation"])
        )
    return found


def test_an_msk_scram_cluster_with_acls_gets_the_mirrors_acls_under_its_scram_user_set_by_its_admin():
    run = run_values(with_secrets(msk_with_acls()))
    flows = run.result["settings"].mirror_config.flows
    assert msk_acls(run) == set(mirror_acls("primary", flows, operator=True))  # the toolbox's principal too
    assert ("Topic", "Literal", "orders", "Read") in {
        (a.resource_type, a.pattern, a.name, a.operation) for a in msk_acls(run)
    }
    (provider,) = run.of_type("pulumi:providers:kafka")
    assert json.loads(provider.plain["bootstrapServers"]) == BOOTSTRAPS["bootstrapBrokersSaslScram"].split(",")
    assert (provider.plain["saslMechanism"], provider.plain["saslUsername"]) == ("scram-sha512", "acl-admin")
    assert provider.plain["tlsEnabled"] == "true" and is_secret(provider.inputs["saslPassword"])
    assert provider.plain["saslPassword"] == sentinel("primary", "admin_password")
    secret = run.named("euw1-primary")  # the mirror's Kubernetes Secret: the admin password reaches no pod
    assert set(secret.plain["stringData"]) == {"password"}


def test_an_msk_cluster_without_acls_gets_none():
    assert run_values(with_secrets(stack_values(DR))).of_type(ACL) == []


def test_msk_acls_without_the_admin_password_fail_at_preview_naming_the_key():
    values = msk_with_acls() | {"mirrorkit:credentials": {"primary": {"password": "p"}}}
    set_config(values)
    with pytest.raises(ConfigError, match=r"mirrorkit:credentials\.primary\.admin_password: missing"):
        load_settings()


def test_msk_acls_are_refused_on_an_iam_cluster_at_their_key():
    values = copy.deepcopy(stack_values(ROOT / "stacks" / "topologies" / "active-active.yaml"))
    values["mirrorkit:clusters"][1]["msk"]["acls"] = {"admin_username": "acl-admin"}
    set_config(values)  # IAM: no secrets
    with pytest.raises(ConfigError, match=r"mirrorkit:clusters\[1\]\.msk\.acls: .*scram"):
        load_settings()


def test_in_a_set_the_msk_part_sets_the_acls_and_only_it_needs_the_admin_password():
    backend, _ = a_set_is_up("dr-msk-to-eventhubs")
    clusters = {"mirrorkit:clusters": msk_with_acls()["mirrorkit:clusters"]}
    admin = {"primary": {"password": sentinel("primary", "password"), "admin_password": "a"}}
    msk = run_values(
        part_values(MSK_PART) | clusters | {"mirrorkit:credentials": admin}, stack=MSK_PART, stacks=backend
    )
    assert msk_acls(msk) and msk.of_type("mirrorkit:aws:MskScramUser")
    site = run_values(part_values(SITE_PART) | clusters, stack=SITE_PART, stacks=backend)  # the mirror's password only
    assert site.of_type(SPARK_APP) and not site.of_type(ACL)
    with pytest.raises(Exception, match=r"mirrorkit:credentials\.primary\.admin_password: missing"):
        run_values(part_values(MSK_PART) | clusters, stack=MSK_PART, stacks=backend)


CLUSTER_ACL = ("Cluster", "Literal", "kafka-cluster")


def test_a_flow_that_syncs_topic_acls_may_describe_the_sources_acls_and_set_the_targets():
    # DescribeAcls needs Describe on the cluster; CreateAcls and DeleteAcls need Alter on it, which implies Describe.
    on_source = acls(run_values(onprem()))  # dc1 (mTLS) -> aws (MSK SCRAM): both have Kafka ACLs, so on by default
    assert (*CLUSTER_ACL, "Describe") in on_source and (*CLUSTER_ACL, "Alter") not in on_source
    on_target = acls(run_values(onprem(reverse=True)))  # aws -> dc1
    assert (*CLUSTER_ACL, "Alter") in on_target and (*CLUSTER_ACL, "Describe") not in on_target
    for operation in ("Read", "Write", "Describe", "Create"):  # its record of what it set there, read back by failover
        assert ("Topic", "Literal", "mirrorkit-acls.aws.dc1", operation) in on_target
    assert not [a for a in on_target if a[3] in ("All", "Delete", "ClusterAction")]


def test_a_flow_that_does_not_sync_topic_acls_gets_no_right_on_the_clusters_acls():
    for reverse in (False, True):
        values = onprem(reverse=reverse)
        values["mirrorkit:flows"][0]["sync_topic_acls"] = False
        got = acls(run_values(values))
        assert not [a for a in got if a[0] == "Cluster" or a[2].startswith("mirrorkit-acls.")]


def test_topic_acl_sync_asked_of_a_cluster_without_kafka_acls_is_refused_at_its_key():
    values = copy.deepcopy(stack_values(DR))  # MSK (SCRAM) -> Event Hubs, which has no Kafka ACLs
    values["mirrorkit:flows"][0]["sync_topic_acls"] = True
    set_config(with_secrets(values))
    with pytest.raises(ConfigError, match=r"mirrorkit:flows\[0\]\.sync_topic_acls: .*eventhubs.* no Kafka ACLs"):
        load_settings()


def acl_set(alias: str, flows: list[FlowConfig], operator: bool) -> set[tuple[str, str, str, str]]:
    return {(a.resource_type, a.pattern, a.name, a.operation) for a in mirror_acls(alias, flows, operator)}


DRILLED = FlowConfig(
    source="p", target="d", topics={"include": [".*"]}, groups={"include": [".*"]}, checkpoint_location="/c"
)


def test_the_toolbox_principal_may_run_a_drill_and_the_mirrors_own_acls_hold_none_of_it():
    # The drill makes its probe topic on the source, writes it and reads it back with a probe group that commits;
    # it reads the probe's copy with that group on the target after failing it over; it deletes the group on both.
    source, target = acl_set("p", [DRILLED], True), acl_set("d", [DRILLED], True)
    probe = [("Topic", "Prefixed", "mirrorkit_drill", op) for op in ("Create", "Write", "Read", "Describe")]
    groups = [("Group", "Prefixed", "mirrorkit_drill", op) for op in ("Read", "Describe", "Delete")]
    assert {*probe, *groups} <= source
    assert {*groups, ("Topic", "Prefixed", "p.", "Read")} <= target
    assert not {a for a in target if a[0] == "Topic" and a[3] == "Create" and a[2].startswith("mirrorkit_drill")}
    mirror = acl_set("p", [DRILLED], False) | acl_set("d", [DRILLED], False)
    assert not {a for a in mirror if a[2].startswith("mirrorkit_drill") or a[3] == "Delete"}


def test_the_toolbox_principal_may_adopt_from_and_hand_back_to_mirrormaker_2():
    # adopt reads Connect's offsets topic, MM2's heartbeats and offset syncs, and describes Connect's group; handback
    # writes the offsets topic (never creates it) and makes and writes MM2's offset syncs where they are read.
    source, target = acl_set("p", [DRILLED], True), acl_set("d", [DRILLED], True)
    offsets = "mm2-offsets.p.internal"
    assert {("Topic", "Literal", offsets, op) for op in ("Read", "Write", "Describe")} <= target
    assert ("Topic", "Literal", offsets, "Create") not in target
    assert {("Topic", "Literal", "heartbeats", op) for op in ("Read", "Describe")} <= target
    assert ("Topic", "Literal", "heartbeats", "Write") not in target
    assert ("Group", "Literal", "p-mm2", "Describe") in target and ("Group", "Literal", "p-mm2", "Read") not in target
    for acls_there, syncs in ((source, "mm2-offset-syncs.d.internal"), (target, "mm2-offset-syncs.p.internal")):
        assert {("Topic", "Literal", syncs, op) for op in ("Create", "Write", "Read", "Describe")} <= acls_there
    mirror = acl_set("p", [DRILLED], False) | acl_set("d", [DRILLED], False)
    assert not {a for a in mirror if a[2].startswith("mm2-") or a[2] == "p-mm2"}
    assert not {a for a in acl_set("d", [DRILLED], False) if a[2] == "heartbeats"}  # written on the source
