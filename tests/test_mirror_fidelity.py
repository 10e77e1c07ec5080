"""The mirror copies records byte for byte: key, value, headers, partition, order and original timestamp."""

from __future__ import annotations

import random
import time

import pytest

from bench.testbed.clients import Record, create_topics, produce, read_all
from spark_app.config import parse_config
from spark_app.mirror import Mirror
from tests.support.assertions import assert_each_record_once_in_order, stamped
from tests.support.mirror_config import one_flow_config

TOPICS = 3
PARTITIONS = 4
PER_TOPIC = 3_400  # > 10,000 records in all


def tricky_records(seed: int, count: int) -> list[Record]:
    """Null keys, tombstones, empty and duplicate headers, binary header values, explicit timestamps."""
    rng = random.Random(seed)
    base_ms = int(time.time() * 1000) - 3_600_000  # an hour ago: old enough to differ from append time
    records = []
    for i in range(count):
        key = None if i % 7 == 0 else f"k{i}".encode()
        value = None if i % 11 == 0 else rng.randbytes(rng.randint(0, 600))
        if i % 5 == 0:
            headers: tuple = ()
        else:
            headers = (("dup", b"first"), ("bin", bytes([0, 255, i % 256])), ("dup", b"second"), ("empty", b""))
        records.append(Record(i % PARTITIONS, key, value, headers, base_ms + i))
    return records


@pytest.mark.parametrize("mode", ["throughput", "realtime"])
@pytest.mark.parametrize("policy", ["default", "identity"])
def test_mirror_preserves_every_record_exactly(policy, mode, spark, source_cluster, target_cluster, tmp_path, unique):
    """MSK-like source (SCRAM) to Event Hubs-like target (PLAIN $ConnectionString), end to end."""
    names = [f"fid{i}-{unique}" for i in range(TOPICS)]
    create_topics(source_cluster.admin, dict.fromkeys(names, PARTITIONS))
    sent = {name: tricky_records(seed, PER_TOPIC) for seed, name in enumerate(names)}
    for name, records in sent.items():
        produce(source_cluster.client, name, records)
    target_name = {n: (f"msk.{n}" if policy == "default" else n) for n in names}
    # Event Hubs topics are made by infra (ARM), here by the test bed's admin.
    create_topics(target_cluster.admin, dict.fromkeys(target_name.values(), PARTITIONS))

    config = parse_config(
        one_flow_config(
            source_cluster,
            target_cluster,
            names,
            tmp_path / "ckpt",
            source_alias="msk",
            target_alias="eh",
            replication_policy=policy,
            mode=mode,
        )
    )
    mirror = Mirror(spark, config)
    mirror.run_available_now()

    ledger = mirror.flows[0].ledger
    assert ledger.quarantined == {}
    assert sum(ledger.totals.records.values()) == TOPICS * PER_TOPIC
    for name in names:
        expected = sent[name]
        if policy == "identity":
            expected = stamped(expected, "msk")
        got = read_all(target_cluster.client, target_name[name], expected=PER_TOPIC)
        assert_each_record_once_in_order(target_name[name], got, expected)
