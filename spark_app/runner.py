"""What runs one flow, in either mode: its topic sync, its ledger, and the face the mirror's loop drives.

`ThroughputRunner` (spark_app.throughput) runs a flow as micro-batches, `RealtimeRunner` (spark_app.realtime) as
long-running copier tasks. Both stand on what is here: topic sync says what the flow subscribes to and what the target
can take, and the flow's ledger (spark_app.ledger) files what either copied. A lock keeps copies apart from
quarantine catch-ups and topic-sync updates.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from pyspark import SparkContext

from .clients import PartitionOffsets
from .config import STOP_BATCH_TIMEOUT_S, FlowConfig, MirrorConfig
from .ledger import FlowLedger, LedgerState
from .metrics import FlowTotals, LagSource, MirrorMetrics
from .ranges import Landing
from .storage import checkpoint_files
from .topics import TopicPlan, TopicSync

log = logging.getLogger(__name__)

# What a flow's copy subscribes to: (source topic, partition count), sorted. A change restarts the copy.
Subscription = tuple[tuple[str, int], ...]
# How long the mirror's loop waits for the lock a batch in flight holds, for topic sync's update or a catch-up, before
# it leaves that to its next round: a batch that hangs must never keep the loop from hearing a stop.
BETWEEN_COPIES_WAIT_S = 5.0


class FlowRunner(abc.ABC):
    """One flow: sync its topics, start its copy on a subscription, stop it, and tell where it stands."""

    def __init__(
        self, spark: SparkContext, config: MirrorConfig, flow: FlowConfig, metrics: MirrorMetrics,
        on_landed: Callable[[list[Landing]], None] | None = None, topic_sync: TopicSync | None = None,
        on_forgotten: Callable[[list[str]], None] | None = None,
    ) -> None:  # fmt: skip
        self.spark = spark
        self.config = config
        self.flow = flow
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self.metrics = metrics
        self.topic_sync = topic_sync or TopicSync(flow, self.source, self.target)
        self.ledger = FlowLedger(
            flow, LedgerState.load(checkpoint_files(flow.checkpoint_location, spark)), self.topic_sync.earliest_offsets,
            metrics, on_landed, topic_ids=self.topic_sync.topic_ids,
        )  # fmt: skip
        self._on_forgotten = on_forgotten  # told the topics the ledger forgot, gone for good (DR drops their history)
        self.plan = TopicPlan()
        self.subscription: Subscription = ()
        self.lock = threading.Lock()  # between copies: a batch, a report's filing, a catch-up, a topic-sync update
        self._reached: PartitionOffsets = {}

    @contextlib.contextmanager
    def between_copies(self) -> Iterator[bool]:
        """The lock between copies, for the mirror's loop: True once held, False when a copy kept it past
        BETWEEN_COPIES_WAIT_S (the caller leaves its work to its next round)."""
        if not self.lock.acquire(timeout=BETWEEN_COPIES_WAIT_S):
            log.warning("flow %s: the copy in flight kept its lock past %.0f s; topic sync and catch-ups wait for"
                        " their next round", self.flow.name, BETWEEN_COPIES_WAIT_S)  # fmt: skip
            yield False
            return
        try:
            yield True
        finally:
            self.lock.release()

    @property
    def totals(self) -> FlowTotals:
        return self.ledger.totals

    def sync_topics(self) -> Subscription:
        """Run topic sync; quarantine what the target cannot take; let the ledger forget topics gone for good.
        Returns what the copy should subscribe to: its subscription as it is while a batch in flight holds the lock
        past BETWEEN_COPIES_WAIT_S (the next round updates it)."""
        plan = self.topic_sync.sync()
        with self.between_copies() as free:
            if not free:
                return self.subscription
            self.plan = plan
            self.metrics.topics_selected(self.flow.name, plan.wanted)
            self.ledger.refused(plan.quarantined)
            gone = self.ledger.topics_seen(plan.wanted)
        if gone and self._on_forgotten is not None:
            self._on_forgotten(gone)
        return tuple(sorted(plan.wanted.items()))

    def next_offsets(self) -> PartitionOffsets:
        """Per source partition of the topics topic sync found last, the next offset the flow will copy. Kept across
        restarts of the copy, so a topic that leaves it (quarantined) still shows its lag; a topic topic sync no
        longer finds is dropped. Called by the lag poller's thread alone."""
        wanted = self.plan.wanted
        reached = self._reached | self._positions()
        self._reached = {tp: offset for tp, offset in reached.items() if tp[0] in wanted}
        return dict(self._reached)

    def lag(self) -> LagSource:
        """The flow as the lag poller reads it: a held partition's lag counts from its first held offset."""
        return LagSource(self.flow.name, self.source, self.next_offsets, lambda: self.ledger.held)

    @abc.abstractmethod
    def start(self, subscription: Subscription, available_now: bool) -> None:
        """Start copying `subscription`; `available_now` copies what is there now, then ends."""

    @abc.abstractmethod
    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        """Stop between copies, so nothing is cut in half; past `timeout_s` cancel (copied again: at least once)."""

    @abc.abstractmethod
    def running(self) -> bool: ...

    @abc.abstractmethod
    def wait(self) -> None:
        """Until the copy ends (`run --available-now`: it has copied what was there); a failure is `failure`'s."""

    @abc.abstractmethod
    def failure(self) -> str | None:
        """Why the copy stopped, when it failed; None while it runs or after a clean end."""

    @abc.abstractmethod
    def catch_up(self) -> None:
        """Let quarantined topics whose cause may be gone rejoin; safe while the copy runs."""

    @abc.abstractmethod
    def _positions(self) -> PartitionOffsets:
        """The newest positions the running copy reports."""
