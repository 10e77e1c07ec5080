"""Real-time copier slots on the executors' JVMs: what they are told, and how one runs.

librdkafka puts one partition's batch in each produce request, so a real-time task writing 32 partitions costs the
target broker about three times MirrorMaker 2's CPU at the same rate, and on a loaded machine that CPU is the
records' latency (README, Benchmarks). Kafka's Java producer sends every ready partition of a broker in one request.
So a slot that writes in transactions (every real-time flow into Kafka) copies with Kafka's Java clients, in the
executor's JVM (spark_app/jvm_copier, SlotCopy), where spark_app.copy_wing.choice gives the flow this core. It speaks
the same report channel and the same slot transactions as the Python task, takes the common case only, and at the
first event the Python loop treats with more care it aborts its open transaction and hands the slot back: the slot's
Python task (spark_app.realtime.task) copies on from the last commit. So every rare path has one implementation.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from py4j.java_gateway import JavaClass  # type: ignore[import-untyped]
from pyspark import SparkContext

from ..channel import RULES, ChannelRules, KeySource
from ..copy_wing.contract import CopyContract
from ..errors import MirrorFailed
from ..outbox import BATCH_BYTES, transaction_queue_kbytes
from ..policy import positions_group, target_topic
from ..profiles import JavaClient, java_client, why_no_java_client
from ..transactions import TRANSACTION_TIMEOUT_MS
from .task import REPORT_S, SLOT_CONSUME_BATCH, TXN_COMMIT_S, CopierTask

# Where set-up puts the copier's jar and the kafka-clients jar it runs on (.ci/setup); the image has both in Spark's
# own jars instead (images/mirror/Dockerfile).
LOCAL_JARS = Path(__file__).resolve().parents[2] / ".cache" / "jvm-copier"
COPIER_CLASS = "io.mirrorkit.copier.CopierJob"
# Tuned MirrorMaker 2's producer batching (bench/): a 20 ms linger costs the Java producer no latency at 10,000
# records/s, since it sends every ready partition of a broker at once, and keeps its requests few.
JAVA_LINGER_MS = 20
POLL_MS = 5  # how long one consumer poll waits for records, as the Python task's consume wait
# The Java consumer's reads: the Python task's (spark_app.outbox.CONSUMER_DEFAULTS), in Java names.
_CONSUMER = {
    "enable.auto.commit": "false",
    "auto.offset.reset": "none",
    "isolation.level": "read_committed",
    "max.poll.records": str(SLOT_CONSUME_BATCH),
    "fetch.max.bytes": "52428800",
    "max.partition.fetch.bytes": "10485760",
}


def local_jars() -> list[str]:
    """The jars a Spark this process starts needs for the JVM slots; none where set-up did not make them (the image
    has them in Spark's jars)."""
    return sorted(str(p) for p in LOCAL_JARS.glob("*.jar"))


@dataclass(frozen=True)
class DriverAddress:
    """Where a slot reaches the driver's report channel."""

    host: str
    port: int


@dataclass(frozen=True)
class SlotConfig:
    """What every JVM slot of a job is told: sent as JSON, which the copier reads by field name (its SlotConfig),
    refusing one with a field it does not know or without one it needs, naming the field (tests/test_jvm_copier.py)."""

    flow: str
    driver: DriverAddress
    # Where the slot finds the channel's key (never the key: spark_app.channel), and the channel's rules.
    key_source: KeySource
    channel: ChannelRules
    source: JavaClient
    target: JavaClient
    consumer: dict[str, str]
    producer: dict[str, str]
    exactly_once: bool
    positions_group: str
    commit_ms: int  # how often the slot commits its transaction
    report_ms: int  # how often it reports landings to the driver
    poll_ms: int
    topics: dict[str, str]  # each source topic the job copies, and its target topic
    contract: CopyContract

    @classmethod
    def of(cls, task: CopierTask, topics: list[str]) -> SlotConfig:
        """What the slots of `task`'s job are told, for `topics`: the clients as the clusters' profiles say them in
        Java names, the channel, and the flow's copy contract (spark_app.copy_wing.contract)."""
        flow, rules = task.flow, task.rules
        source, target = java_client(task.source, "consumer"), java_client(task.target, "producer")
        if source is None or target is None:
            why = why_no_java_client(task.source) or why_no_java_client(task.target)
            raise MirrorFailed(f"flow {flow.name}: a JVM slot cannot copy it: {why}")
        producer = {
            "acks": "all",
            "enable.idempotence": "true",
            "linger.ms": str(JAVA_LINGER_MS),
            "batch.size": str(min(BATCH_BYTES, rules.max_message_bytes or BATCH_BYTES)),
            "transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS),
            # Bounded as the Python loop's transactions are: a send waits for room rather than queueing more than a
            # slow target takes before the slot's next commit.
            "buffer.memory": str(transaction_queue_kbytes(rules.max_message_bytes or BATCH_BYTES) * 1024),
        }
        if rules.max_message_bytes is not None:
            producer["max.request.size"] = str(rules.max_message_bytes)
        return cls(
            flow=flow.name,
            driver=DriverAddress(*task.address),
            key_source=KeySource.decode(task.key),
            channel=RULES,
            source=source,
            target=target,
            consumer=dict(_CONSUMER),
            producer=producer,
            exactly_once=flow.exactly_once,
            positions_group=positions_group(flow),
            commit_ms=round(1000 * (task.commit_s if flow.exactly_once else TXN_COMMIT_S)),
            report_ms=round(1000 * REPORT_S),
            poll_ms=POLL_MS,
            topics={topic: target_topic(flow, topic) for topic in topics},
            contract=CopyContract.of(flow, task.source, task.target, rules),
        )

    def to_json(self) -> dict[str, Any]:
        """The config by field name, as the copier reads it."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return row | {
            "driver": asdict(self.driver),
            "key_source": self.key_source.to_json(),
            "channel": self.channel.to_json(),
            "source": asdict(self.source),
            "target": asdict(self.target),
            "contract": self.contract.to_json(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


SLOT_CONFIG_FIELDS = tuple(f.name for f in fields(SlotConfig))


def run_slot(spark: SparkContext, config: str, slot: int) -> bool:
    """Run one slot as a Spark job on the JVM until it stops; False when it handed the slot back to the Python loop."""
    copier = spark._jvm.io.mirrorkit.copier.CopierJob  # type: ignore[union-attr]
    if not isinstance(copier, JavaClass):
        raise MirrorFailed(
            f"copy_core 'compiled' needs the mirror's JVM copier ({COPIER_CLASS}) on Spark's class path for real-time"
            " flows into Kafka: `bash .ci/setup` builds it, and the mirror image ships it; or set the flow's"
            " copy_core to 'python'"
        )
    _copied, handed_back = copier.run(spark._jsc, config, slot)
    return not handed_back
