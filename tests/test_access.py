"""The access set: what the mirror of some flows reads, writes and creates on each cluster, which infra grants and
creates from, derived from the same naming policy the mirror runs with."""

from __future__ import annotations

import re
from typing import Any

import pytest

from spark_app.config import FlowConfig
from spark_app.policy import (
    PROBE_TOPIC,
    Access,
    access,
    literal_prefix,
    operator_access,
    transactional,
    transactional_id_prefix,
)

SELECTED = {"include": [r"orders\..*", "payments"]}
BASE = {"source": "src", "target": "dst", "topics": SELECTED, "checkpoint_location": "/c"}


def flow(**changes: Any) -> FlowConfig:
    return FlowConfig.model_validate(BASE | changes)


def names(patterns: frozenset[str]) -> set[str]:
    """Each pattern's literal text, with `*` where a pattern goes on."""
    return {prefix + ("" if whole else "*") for prefix, whole in map(literal_prefix, patterns)}


def test_on_the_source_the_mirror_reads_the_selection_describes_groups_and_owns_heartbeats_and_syncs_there():
    grant = access([flow(offset_syncs_location="source", groups={"include": ["app-.*"]})], "src")
    assert grant.read == {r"orders\..*", "payments"}
    assert names(grant.owned) == {"heartbeats", "mirrorkit-offset-syncs.dst.internal"}
    assert grant.groups_described == {"app-.*"}
    assert grant.written == grant.dead_letters == grant.groups_altered == frozenset()


def test_on_the_target_the_mirror_writes_copies_owns_its_topics_and_lease_writes_dead_letters_moves_synced_groups():
    grant = access([flow(dead_letter_topic="mirror.dlq", sync_group_offsets=True)], "dst")
    assert names(grant.written) == {"src.orders.*", "src.payments"}
    assert all(re.fullmatch(p, "src.orders.eu") for p in grant.written if p.endswith("*"))
    assert names(grant.owned) == {"src.checkpoints.internal", "src.heartbeats", "mirrorkit-offset-syncs.src.internal"}
    assert names(grant.dead_letters) == {"mirror.dlq"}
    assert grant.groups_altered == {".*"} and grant.read == grant.groups_described == frozenset()
    assert names(grant.groups_joined) == {"mirrorkit-lease.src.dst"}, "the flow's DR lease is held on its target"
    assert access([flow()], "src").groups_joined == frozenset()
    assert grant.created == grant.written | grant.owned | grant.dead_letters


def test_no_heartbeat_write_on_the_source_unless_the_flow_emits_them():
    assert "heartbeats" not in names(access([flow(emit_heartbeats=False)], "src").created)
    assert "heartbeats" in names(access([flow()], "src").owned)
    assert "src.heartbeats" in names(access([flow(emit_heartbeats=False)], "dst").owned)  # the copy still travels


def test_identity_copies_keep_their_names_and_a_cluster_in_no_flow_gets_nothing():
    identity = flow(replication_policy="identity")
    assert access([identity], "dst").written == access([identity], "src").read
    assert access([identity], "elsewhere") == Access()


def test_a_flow_of_plain_names_reads_and_writes_exactly_those_it_mirrors():
    listed = flow(topics={"include": ["orders", "payments", "__consumer_offsets"], "exclude": ["payments"]})
    assert names(access([listed], "src").read) == {"orders"}
    assert names(access([listed], "dst").written) == {"src.orders"}


def test_a_copy_of_an_alternation_covers_every_branch():
    (copies,) = access([flow(topics={"include": ["orders|payments"]})], "dst").written
    assert re.fullmatch(copies, "src.orders") and re.fullmatch(copies, "src.payments")
    assert not re.fullmatch(copies, "payments")


def test_active_active_flows_add_up_on_each_cluster():
    both = [flow(), flow(source="dst", target="src")]
    grant = access(both, "src")
    assert grant.read == {r"orders\..*", "payments"} and names(grant.written) == {"dst.orders.*", "dst.payments"}
    assert {"heartbeats", "dst.heartbeats", "dst.checkpoints.internal"} <= names(grant.owned)


PATTERNS = [
    "payments", r"orders\..*", "events[0-9]+", ".*", "orders|payments", r"orders\.(eu|us)", "orders?", r"a\.b*",
    "x{0,2}y", "[|]z", "[]|]z", r"a\|b", "(a|b)c", "ab+",
]  # fmt: skip
NAMES = ["payments", "orders.eu", "orders.us", "order", "orders", "events1", "a.", "a.bb", "y", "xy", "|z", "]z",
         "a|b", "ac", "bc", "ab", "abbb", "x"]  # fmt: skip


def test_every_name_a_pattern_takes_starts_with_its_literal_prefix_and_is_it_when_whole():
    for pattern in PATTERNS:
        prefix, whole = literal_prefix(pattern)
        for name in NAMES:
            if re.fullmatch(pattern, name):
                assert name == prefix if whole else name.startswith(prefix), (pattern, name, prefix)
    assert literal_prefix(r"orders\.(eu|us)") == ("orders.", False)
    assert literal_prefix("orders|payments") == ("", False)
    assert literal_prefix(r"mirrorkit\-offset\-syncs\.a\.internal") == ("mirrorkit-offset-syncs.a.internal", True)


@pytest.mark.parametrize("eventhubs", [False, True])
@pytest.mark.parametrize("exactly_once", [False, True])
@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_the_transactional_ids_granted_on_a_target_are_those_its_slots_write_with(
    mode: str, exactly_once: bool, eventhubs: bool
):
    """Exactly once anywhere, and real time but into Event Hubs (no transactions below Premium): one rule, asked by
    the copy and by the grant."""
    one = flow(mode=mode, exactly_once=exactly_once)
    granted = access([one], "dst", eventhubs=eventhubs).transactional_ids
    writes = exactly_once or (mode == "realtime" and not eventhubs)
    assert transactional(one, eventhubs) == writes
    assert names(granted) == ({transactional_id_prefix(one) + "*"} if writes else set())


def test_the_operator_verbs_are_granted_only_with_operator_and_on_top_of_the_mirrors_own():
    """`failover`, `drill`, `adopt` and `handback` run with the mirror's identity from the site's toolbox: their
    rights come with `operator`, beside the mirror's, and the mirror's own set holds none of them."""
    f = flow(topics={"include": [".*"]}, groups={"include": [".*"]})
    for alias in ("src", "dst"):
        mirror, operator = access([f], alias), access([f], alias, operator=True)
        assert operator == mirror | operator_access([f], alias)
        assert mirror.probe_topics == mirror.groups_deleted == mirror.foreign_read == mirror.foreign_written == set()
    source, target = access([f], "src", operator=True), access([f], "dst", operator=True)
    # drill: its probe topics on the source (made, written, read back), its probe groups joined and deleted on both
    assert names(source.probe_topics) == {f"{PROBE_TOPIC}*"} and source.probe_topics <= source.created
    assert names(source.groups_joined) == names(source.groups_deleted) == {f"{PROBE_TOPIC}*"}
    assert names(target.groups_deleted) == {f"{PROBE_TOPIC}*"} and target.probe_topics == set()
    # failover (and the drill's failover of its probe group): the groups' offsets, on the copies they commit on
    assert target.groups_altered == {".*"} and names(target.offsets_committed) == {"src.*"}
    # adopt and handback: MM2's offset syncs where either location puts them, Connect's offsets topic and group and
    # MM2's heartbeats on the target
    assert "mm2-offset-syncs.dst.internal" in names(source.owned)
    assert "mm2-offset-syncs.src.internal" in names(target.owned)
    assert names(target.foreign_written) == {"mm2-offsets.src.internal"}
    assert names(target.foreign_read) == {"heartbeats"}
    assert "src-mm2" in names(target.groups_described)
    assert access([f], "elsewhere", operator=True) == Access()


def test_a_connect_cluster_of_its_own_named_in_the_flow_is_granted_for_adopt_and_handback():
    """Strimzi's KafkaMirrorMaker2 names its Connect offsets topic and group itself: named in the flow's
    `mirrormaker2`, they are what the toolbox is granted on the target, in place of dedicated mode's."""
    names_ = {"offsets_topic": "mirrormaker2-cluster-offsets", "connect_group": "mirrormaker2-cluster"}
    strimzi = access([flow(mirrormaker2=names_)], "dst", operator=True)
    assert names(strimzi.foreign_written) == {"mirrormaker2-cluster-offsets"}
    assert "mirrormaker2-cluster" in names(strimzi.groups_described)
    assert "src-mm2" not in names(strimzi.groups_described)
    assert access([flow(mirrormaker2=names_)], "dst") == access([flow()], "dst"), "the mirror's own set holds none"
    with pytest.raises(ValueError, match="mirrormaker2.offsets_topic"):
        flow(mirrormaker2={"offsets_topic": "no spaces"})


def test_a_drill_probe_is_granted_where_the_flow_mirrors_it_and_checkpoints_its_groups():
    listed = flow(topics={"include": ["orders", f"{PROBE_TOPIC}_eu"]}, groups={"include": [f"{PROBE_TOPIC}_eu-.*"]})
    grant = access([listed], "src", operator=True)
    assert names(grant.probe_topics) == {f"{PROBE_TOPIC}_eu"}  # the listed name alone, not the prefix
    assert names(grant.groups_deleted) == {f"{PROBE_TOPIC}_eu-*"}
    assert all(re.fullmatch(g, f"{PROBE_TOPIC}_eu-0123456789ab") for g in grant.groups_deleted)
    # a flow that does not mirror the default probe, or does not checkpoint probe groups, grants no drill
    assert access([flow()], "src", operator=True).probe_topics == set()
    unchecked = flow(topics={"include": [".*"]}, groups={"include": ["app-.*"]})
    assert access([unchecked], "src", operator=True).groups_deleted == set()
    excluded = flow(topics={"include": [".*"], "exclude": [f"{PROBE_TOPIC}.*"]})
    assert access([excluded], "src", operator=True).probe_topics == set()
