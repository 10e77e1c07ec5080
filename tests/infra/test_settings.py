"""A bad stack fails before any resource exists, with an error that names the key as the user wrote it."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from infra.naming import PROJECT
from infra.settings import load_settings, topology_file
from spark_app.config import ConfigError
from tests.infra.harness import (
    PLATFORM_STACKS,
    ROOT,
    SETS,
    STACK_FILES,
    part_values,
    run_values,
    set_config,
    stack_values,
    with_secrets,
)

DR = ROOT / "stacks" / "topologies" / "dr-msk-to-eventhubs.yaml"
ACTIVE_ACTIVE = ROOT / "stacks" / "topologies" / "active-active.yaml"
ONPREM = ROOT / "stacks" / "Pulumi.onprem-to-msk.yaml"
SHIPPED = [p for p in STACK_FILES if p not in PLATFORM_STACKS]  # every stack file that deploys mirrors' resources


def refused(values: dict[str, Any]) -> str:
    set_config(values)
    with pytest.raises(ConfigError) as err:
        load_settings()
    return str(err.value)


def edited(path, **changes) -> dict[str, Any]:
    values = copy.deepcopy(with_secrets(stack_values(path)))
    for key, edit in changes.items():
        edit(values[f"{PROJECT}:{key}"])
    return values


@pytest.mark.parametrize("stack", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_stack_file_loads_with_its_secrets_set(stack):
    set_config(part_values(stack.name.split(".")[1]))
    settings = load_settings()
    assert settings.mirror_config.flows and all(f.name in settings.site_of_flow for f in settings.mirror_config.flows)


def test_a_missing_key_is_named():
    values = with_secrets(stack_values(DR))
    del values[f"{PROJECT}:clusters"]
    assert refused(values) == f"{PROJECT}:clusters: missing; the stack file must give it"


def test_a_part_naming_a_topology_with_no_file_names_the_key_and_the_file_looked_for():
    values = part_values("active-active-site-use1") | {f"{PROJECT}:topology": "active-activ"}
    assert refused(values) == (
        f"{PROJECT}:topology: no topology 'active-activ': there is no file stacks/topologies/active-activ.yaml"
    )


def test_a_topology_is_read_from_its_file_never_from_a_stack_file():
    assert topology_file("active-active") == ROOT / "stacks" / "topologies" / "active-active.yaml"
    # The whole of a set as a stack file would be deployable in one stack, and strand a region; none is shipped.
    assert not [t for t in SETS if (ROOT / "stacks" / f"Pulumi.{t}.yaml").exists()]


def test_a_missing_nested_key_is_named():
    values = edited(DR, clusters=lambda c: c[0]["msk"].pop("security_group_id"))
    assert f"{PROJECT}:clusters[0].msk.security_group_id: Field required" in refused(values)


def test_a_missing_secret_names_the_command_that_sets_it():
    values = stack_values(DR)  # no credentials set
    assert (
        f"{PROJECT}:credentials.primary.password: missing; set it with"
        f" `pulumi config set --secret --path '{PROJECT}:credentials.primary.password' ...`"
    ) in refused(values)


def test_the_basic_tier_is_refused_because_it_has_no_kafka_endpoint():
    values = edited(DR, clusters=lambda c: c[1]["eventhubs"].update(tier="Basic"))
    assert f"{PROJECT}:clusters[1].eventhubs.tier: 'Basic' has no Kafka endpoint" in refused(values)


def test_more_partitions_than_the_tier_allows_is_refused():
    def standard_with_a_wide_topic(clusters):
        clusters[1]["eventhubs"].update(tier="Standard", retention_hours=24)
        clusters[0]["topics"]["orders"]["partitions"] = 40

    message = refused(edited(DR, clusters=standard_with_a_wide_topic))
    assert (
        f"{PROJECT}:clusters[1].eventhubs.tier: hub 'primary.orders' needs 40 partitions (its source topic's)"
        " but tier Standard allows 32"
    ) in message


def test_an_exactly_once_flow_into_a_standard_event_hubs_namespace_is_refused_naming_the_key_and_the_cluster():
    values = edited(
        DR,
        clusters=lambda c: c[1]["eventhubs"].update(tier="Standard"),
        flows=lambda f: f[0].update(exactly_once=True),
    )
    assert (
        f"{PROJECT}:flows[0].exactly_once: exactly_once commits in Kafka transactions on the flow's target, Event Hubs"
        f" cluster 'dr', whose namespace is of tier Standard ({PROJECT}:clusters[1].eventhubs.tier); Event Hubs has"
        " Kafka transactions only on Premium and Dedicated, in preview."
    ) in refused(values)
    set_config(edited(DR, flows=lambda f: f[0].update(exactly_once=True)))  # Premium
    assert load_settings().mirror_config.flows[0].exactly_once
    set_config(edited(DR, clusters=lambda c: c[1]["eventhubs"].update(tier="Standard")))
    assert not load_settings().mirror_config.flows[0].exactly_once


def test_an_unknown_cluster_alias_in_a_flow_is_named():
    values = edited(DR, flows=lambda f: f[0].update(target="dr2"))
    assert f"{PROJECT}:flows[0].target: unknown cluster 'dr2' (clusters: primary, dr)" in refused(values)


def test_a_stopped_flow_the_stack_does_not_have_is_named():
    values = with_secrets(stack_values(DR)) | {f"{PROJECT}:stopped": ["primary->dr", "dr->primary"]}
    assert f"{PROJECT}:stopped[1]: no such flow 'dr->primary'" in refused(values)


def test_an_identity_loop_is_refused():
    values = edited(ACTIVE_ACTIVE, flows=lambda f: f[1].update(provenance_header=False))
    assert f"{PROJECT}:flows[1]: identity flows eu->us and us->eu would loop records forever" in refused(values)


def test_a_flow_into_event_hubs_needs_the_source_topic_sizes():
    values = edited(DR, clusters=lambda c: c[0]["topics"].pop("payments"))
    assert f"{PROJECT}:clusters[0].topics.payments: missing; the event hub for it is sized" in refused(values)


def test_a_self_managed_scram_cluster_without_its_user_is_named_at_the_kafka_key():
    values = edited(ONPREM, clusters=lambda c: c[0]["kafka"].update(auth="scram", acls=None))
    assert f"{PROJECT}:clusters[0].kafka.username: give the mirror's SCRAM user" in refused(values)


def test_a_java_client_name_in_client_overrides_is_named_at_the_cluster():
    values = edited(DR, clusters=lambda c: c[1].update(client_overrides={"max.request.size": "1048576"}))
    assert (
        f"{PROJECT}:clusters[1]: client_overrides.max.request.size: a Kafka Java client name; the mirror's clients"
        " are librdkafka, which calls it 'message.max.bytes'"
    ) in refused(values)


def test_a_runtime_setting_is_named_under_mirror_runtime():
    values = edited(DR, mirror=lambda m: m.update(runtime={"topic_sync_interval_s": 600}))
    assert f"{PROJECT}:mirror.runtime.topic_sync_interval_s: Input should be less than or equal to 30" in refused(
        values
    )


def test_a_flow_without_a_site_in_its_targets_region_must_be_placed():
    values = edited(DR, placement=lambda p: p.clear())
    assert f"{PROJECT}:flows[0]: 0 sites in region 'westeurope' (the target's) to run primary->dr" in refused(values)


def test_an_entra_only_namespace_needs_the_sites_workload_identity_issuer():
    values = edited(DR, clusters=lambda c: c[1]["eventhubs"].update(disable_local_auth=True))
    assert (
        f"{PROJECT}:sites[0].azure: missing; its mirror reaches Event Hubs cluster(s) dr with local auth disabled"
        in (refused(values))
    )


def test_a_standard_namespace_takes_ten_event_hubs_counting_the_mirrors_own():
    def more_topics(clusters):
        clusters[0]["topics"] |= {f"t{i}": {"partitions": 1} for i in range(4)}  # 7 hubs today, 11 with these

    def standard(clusters):
        clusters[1]["eventhubs"].update(tier="Standard")
        more_topics(clusters)

    values = edited(DR, clusters=standard, flows=lambda f: f[0]["topics"]["include"].extend(f"t{i}" for i in range(4)))
    assert (
        f"{PROJECT}:clusters[1].eventhubs.tier: namespace 'mirrorkit-dr-weu' needs 11 event hubs (4 of them the"
        " mirror's own) but tier Standard allows 10" in refused(values)
    )
    values = edited(
        DR, clusters=more_topics, flows=lambda f: f[0]["topics"]["include"].extend(f"t{i}" for i in range(4))
    )
    set_config(values)
    assert len(load_settings().hubs("dr")) == 11  # Premium allows 100 per processing unit


def test_premium_capacity_is_a_power_of_two_up_to_sixteen():
    values = edited(DR, clusters=lambda c: c[1]["eventhubs"].update(capacity=3))
    assert (
        f"{PROJECT}:clusters[1].eventhubs.capacity: Premium takes 1, 2, 4, 8 or 16 processing units, not 3"
        in refused(values)
    )


def test_a_secret_in_client_overrides_never_reaches_the_rendered_config():
    values = edited(DR, clusters=lambda c: c[1].update(client_overrides={"sasl.jaas.config": "x required;"}))
    message = refused(values)
    assert f"{PROJECT}:clusters[1].client_overrides: 'sasl.jaas.config' carries a secret" in message
    assert "x required;" not in message


def realtime(tasks: int, flow: int = 0) -> Callable[[list[dict[str, Any]]], None]:
    """A flows edit: flow `flow` runs `tasks` real-time tasks."""
    return lambda flows: flows[flow].update(mode="realtime", realtime_tasks=tasks)


def test_a_site_with_fewer_executor_cores_than_its_realtime_tasks_is_refused():
    # active-active: site euw1 runs us->eu alone, on 2 executors of 2 cores
    message = refused(edited(ACTIVE_ACTIVE, flows=realtime(5)))
    assert (
        f"{PROJECT}:mirror.executor: site 'euw1' gets 4 executor cores (instances 2 x cores 2) but needs 5: one per"
        f" real-time task of us->eu ({PROJECT}:flows[0].realtime_tasks: 5). Each real-time task holds its core"
    ) in message
    assert (
        f"raise {PROJECT}:mirror.executor.instances or {PROJECT}:mirror.executor.cores, or lower the flows'"
        " realtime_tasks"
    ) in message
    set_config(edited(ACTIVE_ACTIVE, flows=realtime(4)))
    assert load_settings().mirror_at("euw1").flows[0].realtime_tasks == 4


def test_a_site_running_realtime_and_throughput_flows_needs_one_more_core_for_the_batches():
    def both_on_use1(tasks: int) -> dict[str, Any]:
        values = edited(ACTIVE_ACTIVE, flows=realtime(tasks))
        return values | {f"{PROJECT}:placement": {"us->eu": "use1", "eu->us": "use1"}}

    message = refused(both_on_use1(4))
    assert (
        f"{PROJECT}:mirror.executor: site 'use1' gets 4 executor cores (instances 2 x cores 2) but needs 5: one per"
        f" real-time task of us->eu ({PROJECT}:flows[0].realtime_tasks: 4) and 1 for the batches of throughput"
        " flow(s) eu->us."
    ) in message
    set_config(both_on_use1(3))
    assert [f.mode for f in load_settings().mirror_at("use1").flows] == ["realtime", "throughput"]


def test_an_image_pull_secret_that_is_no_kubernetes_name_is_named_at_its_key():
    values = edited(DR, mirror=lambda m: m.update(image_pull_secrets=["regcred", "Reg_Cred"]))
    message = refused(values)
    assert f"{PROJECT}:mirror.image_pull_secrets[1]: 'Reg_Cred' is not a Kubernetes Secret name" in message
    assert "image_pull_secrets[0]" not in message


STORAGE_CLASS_MISSING = f"{PROJECT}:mirror.checkpoint.pvc.storage_class: missing; the mirror's checkpoint is a PVC"


@pytest.mark.parametrize(
    "checkpoint",
    [{"pvc": {"size": "20Gi"}}, None],
    ids=["a pvc naming no class", "no checkpoint key (a pvc by default)"],
)
def test_a_checkpoint_pvc_without_a_storage_class_is_refused_at_preview_naming_the_key(checkpoint):
    """The cluster's default class is unknown at preview (there may be none, or one binding a zonal volume at once)."""

    def without_a_class(mirror: dict[str, Any]) -> None:
        mirror.pop("checkpoint")
        if checkpoint is not None:
            mirror["checkpoint"] = checkpoint

    values = edited(DR, mirror=without_a_class)
    message = refused(values)
    assert STORAGE_CLASS_MISSING in message
    assert "ReadWriteOnce" in message and "WaitForFirstConsumer" in message
    # The whole program under mocks, as `pulumi preview` runs it, stops there: before any resource is registered.
    with pytest.raises(ConfigError, match=re.escape(STORAGE_CLASS_MISSING)):
        run_values(values, preview=True)


def test_a_checkpoint_pvc_gets_the_class_its_stack_names_and_object_storage_needs_none(stack_runs):
    expected = {"dr-msk-to-eventhubs": ["gp2"], "onprem-to-msk": ["gp2"], "active-active": []}
    for stack, run in stack_runs.items():
        claims = run.of_type("kubernetes:core/v1:PersistentVolumeClaim")
        assert [c.plain["spec"]["storageClassName"] for c in claims] == expected[stack], stack
        assert all(c.plain["spec"]["accessModes"] == ["ReadWriteOnce"] for c in claims)


def test_a_storage_class_that_is_no_kubernetes_name_is_named_at_its_key():
    values = edited(DR, mirror=lambda m: m.update(checkpoint={"pvc": {"storage_class": "GP3_fast"}}))
    message = refused(values)
    assert f"{PROJECT}:mirror.checkpoint.pvc.storage_class: 'GP3_fast' is not a Kubernetes StorageClass name" in message


def test_a_peer_cidr_overlapping_the_sites_own_vpc_is_refused_naming_both_keys():
    values = edited(DR, clusters=lambda cs: cs[0]["msk"].update(cidr="10.30.128.0/17"))
    message = refused(values)
    assert (
        f"{PROJECT}:clusters[0].msk.cidr: 10.30.128.0/17 overlaps {PROJECT}:sites[0].aws.cidr 10.30.0.0/16"
    ) in message


def test_two_peer_cidrs_of_one_site_that_overlap_are_refused_naming_both_keys():
    values = edited(ACTIVE_ACTIVE, clusters=lambda cs: cs[1]["msk"].update(cidr="10.20.16.0/20"))
    message = refused(values)
    overlap = f"{PROJECT}:clusters[1].msk.cidr: 10.20.16.0/20 overlaps {PROJECT}:clusters[0].msk.cidr 10.20.0.0/16"
    assert overlap in message


@pytest.mark.parametrize("image", ["ghcr.io/example/mirrorkit-mirror:0.1.0", "mirror@sha256:abc", "mirror:latest"])
def test_an_image_not_pinned_by_digest_is_refused_at_its_key(image):
    values = with_secrets(stack_values(DR)) | {f"{PROJECT}:image": image}
    message = refused(values)
    assert message.startswith(f"{PROJECT}:image: '{image}' is not pinned by digest"), message
    assert "@sha256:<64 hex digits>" in message


def test_a_mirror_role_whose_inline_kafka_grants_pass_iams_limit_is_refused_naming_the_flow():
    """Each literal topic is a resource of its own in the role's inline policy; IAM refuses a role whose inline
    policies pass 10,240 characters, which `up` would find only after preview passed."""
    from infra.aws.identity import kafka_policy
    from infra.checks import ROLE_INLINE_POLICIES_MAX, policy_size
    from infra.k8s.toolbox import TOOLBOX_GRANTED

    def topics(n: int) -> Callable[[list[dict[str, Any]]], None]:
        def edit(flows: list[dict[str, Any]]) -> None:
            flows[0]["topics"] = {"include": [f"events\\.orders\\.region-{k:03d}" for k in range(n)]}

        return edit

    set_config(edited(ACTIVE_ACTIVE, flows=topics(20)))
    settings = load_settings()  # 20 literal topics fit
    site = settings.site_of_flow[settings.mirror_config.flows[0].name]
    iam = {c.alias: c.msk for c in settings.clusters_at(site) if c.msk is not None}
    assert policy_size(kafka_policy(settings.flows_at(site), iam, TOOLBOX_GRANTED)) <= ROLE_INLINE_POLICIES_MAX
    message = refused(edited(ACTIVE_ACTIVE, flows=topics(120)))
    assert message.startswith(f"{PROJECT}:flows[0].topics: the mirror role of site '{site}'")
    assert "over IAM's 10240" in message and "lists 120 topics" in message
    first, *rest = settings.flows_at(site)
    names = [f"events\\.orders\\.region-{k:03d}" for k in range(120)]
    wide = [first.model_copy(update={"topics": first.topics.model_copy(update={"include": names})}), *rest]
    held = policy_size(kafka_policy(wide, iam, TOOLBOX_GRANTED))  # the role's, as the program renders it
    assert f"would hold {held} characters" in message, "sized without the toolbox's grants the role holds too"


def test_an_event_hubs_namespace_open_to_the_internet_is_refused_until_it_lists_the_addresses_let_in():
    def dr_cluster(**changes: Any) -> Callable[[list[dict[str, Any]]], None]:
        def edit(clusters: list[dict[str, Any]]) -> None:
            (hubs,) = [c for c in clusters if "eventhubs" in c]
            hubs["eventhubs"] = {k: v for k, v in hubs["eventhubs"].items() if k != "allowed_ips"} | changes

        return edit

    message = refused(edited(DR, clusters=dr_cluster()))
    assert ".eventhubs.allowed_ips: public_network_access 'Enabled' lets in the whole internet" in message
    assert "0.0.0.0/0" in refused(edited(DR, clusters=dr_cluster(allowed_ips=["0.0.0.0/0"])))
    set_config(edited(DR, clusters=dr_cluster(public_network_access="Disabled")))
    load_settings()
