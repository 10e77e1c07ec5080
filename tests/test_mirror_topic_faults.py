"""A fault that concerns one topic quarantines that topic only: the others flow on, and once it is fixed the topic
catches up in order, with nothing lost, and the batches after its catch-up write it (it is never held again)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from bench.testbed import clients
from bench.testbed.clients import Record, create_topics, produce, read_all
from bench.testbed.kafka_cluster import EVENTHUBS_USER
from bench.testbed.ports import free_port
from spark_app import quarantine
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config
from tests.support.polling import wait_until
from tests.support.running import mirror_running

ROUNDS = 6  # of PER_ROUND records on each topic, each sent once the other topic's previous round landed
PER_ROUND = 20


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
def test_a_topic_whose_write_acl_is_removed_mid_run_is_quarantined_alone_and_catches_up_in_order(
    mode, spark, plaintext_cluster, target_cluster, tmp_path, unique, monkeypatch, caplog
):
    monkeypatch.setattr(quarantine, "RECORD_RETRY_S", 2.0)  # try a held topic again every 2 s, not every 60 s
    ok, denied = f"ok-{unique}", f"denied-{unique}"
    create_topics(plaintext_cluster.admin, {ok: 2, denied: 2})
    create_topics(target_cluster.admin, {f"onprem.{ok}": 2, f"onprem.{denied}": 2})
    config = parse_config(
        one_flow_config(
            plaintext_cluster,
            target_cluster,
            [ok, denied],
            tmp_path / "ckpt",
            emit_heartbeats=False,
            metrics_port=free_port(),
            mode=mode,
        )  # fmt: skip
    )
    admin = clients.admin(target_cluster.admin)
    deny = AclBinding(
        ResourceType.TOPIC, f"onprem.{denied}", ResourcePatternType.LITERAL, f"User:{EVENTHUBS_USER}", "*",
        AclOperation.WRITE, AclPermissionType.DENY,
    )  # fmt: skip
    sent: dict[str, list[Record]] = {ok: [], denied: []}

    def send_round(r: int) -> None:
        now = int(time.time() * 1000)
        for topic in (ok, denied):
            records = [Record(i % 2, f"{r}-{i}".encode(), f"{topic}-{r}-{i}".encode(), (), now + i) for i in
                       range(PER_ROUND)]  # fmt: skip
            produce(plaintext_cluster.client, topic, records)
            sent[topic] += records

    mirror = Mirror(spark, config)
    flow = mirror.flows[0]

    def ok_landed(what: str) -> None:
        """Until every record sent to `ok` so far landed: the rounds go to separate batches, and `ok` flows."""
        wait_until(lambda: flow.totals.records.get(ok, 0) >= len(sent[ok]), f"'{ok}' {what}", errors=errors)

    with mirror_running(mirror) as errors:
        send_round(0)
        wait_until(lambda: sum(flow.totals.records.values()) >= 2 * PER_ROUND, "the first round", errors=errors)
        for future in admin.create_acls([deny], request_timeout=15).values():
            future.result()
        for r in range(1, ROUNDS // 2):
            send_round(r)
            ok_landed(f"round {r} landing while '{denied}' is denied")
        wait_until(lambda: denied in flow.ledger.quarantined, f"'{denied}' quarantined", errors=errors)
        reason = flow.ledger.quarantined[denied]
        assert "TOPIC_AUTHORIZATION_FAILED" in reason and f"topic '{denied}'" in reason, reason
        # The other topic goes on meanwhile.
        ok_landed("flowing while the other topic is held")
        assert ok not in flow.ledger.quarantined

        for future in admin.delete_acls([AclBindingFilter(*deny_fields(deny))], request_timeout=15).values():
            future.result()
        for r in range(ROUNDS // 2, ROUNDS):
            send_round(r)
            ok_landed(f"round {r} landing after the ACL is gone")
        wait_until(lambda: denied not in flow.ledger.quarantined, f"'{denied}' caught up", errors=errors)
        wait_until(lambda: flow.totals.records.get(denied, 0) >= len(sent[denied]), "every record", errors=errors)
        send_round(ROUNDS)  # after the catch-up: the next batch writes it, while the mirror runs
        read_all(target_cluster.client, f"onprem.{denied}", expected=len(sent[denied]))
        assert denied not in flow.ledger.quarantined

    if mode == "throughput":  # a batch planned before the topic rejoined would have held it again, and said so
        quarantined = [r.getMessage() for r in caplog.records if f"topic '{denied}' quarantined" in r.getMessage()]
        assert len(quarantined) == 1, quarantined

    for topic in (ok, denied):
        got = read_all(target_cluster.client, f"onprem.{topic}", expected=len(sent[topic]))
        assert_each_record_once_in_order(f"onprem.{topic}", got, sent[topic])  # 0 lost, none twice, in order


def deny_fields(binding: AclBinding) -> tuple:
    return (binding.restype, binding.name, binding.resource_pattern_type, binding.principal, binding.host,
            binding.operation, binding.permission_type)  # fmt: skip
