"""Which copy core copies a flow's records, and why: the one place that decides it, for both modes.

Three cores copy records (docs/mirror/copy.md, "The copy wing"): the Python reference loop (spark_app.outbox), the
Rust core in the Python worker (spark_app.compiled_copy, librdkafka) and the Java copier on the executors' JVM
(spark_app.realtime.jvm, Kafka's Java clients). `choose` picks one per flow from its config and both clusters'
profiles; the throughput copy, the real-time job and task ask it rather than repeat its rules, the mirror logs its
answer at start, `mirrorkit describe` and `status` print it, and the metrics carry it as a label. A compiled core
copies the common case only: at the first event it leaves to the Python loop (a refused record, offsets that went
back, a read error) it hands its cursors or its slot to that loop, which goes on from there; so the choice is where a
flow starts, and the Python loop is where every rare path has its one implementation.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..config import ClusterConfig, FlowConfig, FlowMode, MirrorConfig
from ..policy import transactional
from ..profiles import why_no_java_client


class Core(enum.StrEnum):
    """A copy core, by the language its per-record loop runs in."""

    PYTHON = "python"  # the reference loop, confluent-kafka's clients (spark_app.outbox)
    RUST = "rust"  # the compiled core in the Python worker, librdkafka (spark_app.compiled_copy)
    JVM = "jvm"  # the Java copier on the executor's JVM, Kafka's Java clients (spark_app.realtime.jvm)


@dataclass(frozen=True)
class CoreChoice:
    """The core that copies one flow, what it copies (`copies`: the flow's batches or slots, and how they commit) and
    why that core: for a compiled one the Java clients could not take, what rules them out."""

    flow: str
    copies: str
    core: Core
    reason: str

    def __str__(self) -> str:
        return f"flow {self.flow}: {self.copies} copy with the {self.core.value} core ({self.reason})"


_HANDS_BACK = "handing over to the Python loop at the first event it leaves to it"


def choose(flow: FlowConfig, source: ClusterConfig, target: ClusterConfig) -> CoreChoice:
    """The core that copies `flow` from `source` to `target`, and why."""
    in_transactions = transactional(flow, target.is_eventhubs)
    copies = _copies(flow, in_transactions)

    def chosen(core: Core, reason: str) -> CoreChoice:
        return CoreChoice(flow.name, copies, core, reason)

    if flow.copy_core == "python":
        return chosen(Core.PYTHON, "the flow's copy_core is 'python'")
    how = "a slot's transactions with librdkafka" if in_transactions else "librdkafka"
    if in_transactions and flow.mode is FlowMode.REALTIME:
        why = next((why for cluster in (source, target) if (why := why_no_java_client(cluster))), None)
        if why is None:
            return chosen(Core.JVM, f"a slot's transactions with Kafka's Java clients, {_HANDS_BACK}")
        how = f"{why}: {how}"
    return chosen(Core.RUST, f"{how} without Python per record, {_HANDS_BACK}")


def choices(config: MirrorConfig) -> list[CoreChoice]:
    """`choose`'s answer for every flow of the config, in its order."""
    return [choose(flow, config.cluster(flow.source), config.cluster(flow.target)) for flow in config.flows]


def _copies(flow: FlowConfig, in_transactions: bool) -> str:
    """What the flow's copy runs as, e.g. 'real-time slots (transactions, exactly once)'."""
    what = "throughput batches" if flow.mode is FlowMode.THROUGHPUT else "real-time slots"
    how = ("transactions, exactly once" if flow.exactly_once else "transactions") if in_transactions else None
    return f"{what} ({how})" if how else what
