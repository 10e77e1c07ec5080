"""Transactions on the target: a copier slot's fenced producer, and the source positions it commits with its records.

A slot (a real-time task, or the n-th task of a micro-batch) writes through a transactional producer whose
`transactional.id` is the flow's and the slot's (`transactional_id`). Starting it fences every earlier producer of
that id (KIP-98): a zombie attempt that still reaches the target, or its retry, gets PRODUCER_FENCED on its next
write or commit, and its open transaction is aborted, so a read_committed consumer never sees its records.

With `exactly_once` the slot also commits, inside each transaction, the next source offset of every partition it
copied: as the offsets of the flow's positions group (`positions_group`) on the copies' topic-partitions, by
TxnOffsetCommit (KIP-447). Records and positions land together or not at all, and a slot reads its partitions'
positions back after it started (`committed`): a copy resumes there, whatever an older batch log or ledger
says. The group's offsets are keyed by partition, read in one request and compacted by the broker's offsets topic,
so their size is the number of partitions, whatever the history.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from . import clients
from .clients import Partition, PartitionOffsets
from .config import ClusterConfig, FlowConfig, FlowMode, MirrorConfig
from .errors import DeliveryFailed, MirrorFailed
from .policy import positions_group, target_topic, transactional, transactional_id_prefix

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_S = 30.0  # how long init, commit and abort wait for the transaction coordinator
# How long asking a stopped producer for its cause may wait. librdkafka answers from its own thread, at once when the
# producer is stopped; asked with no wait, a busy thread answers _TIMED_OUT instead (5 of 25 tries on a loaded machine).
CAUSE_WAIT_S = 5.0
# The broker aborts a transaction left open this long (a slot that died mid-transaction); its partitions' last
# stable offset waits for it, so read_committed consumers see nothing past it until then.
TRANSACTION_TIMEOUT_MS = 60_000
_NO_TRANSACTIONS = (
    "the cluster does not support transactions (Kafka 3.x or later does; Event Hubs only on Premium and Dedicated)"
)
# Errors at the first start of a slot's producer that mean the target cannot do transactions for the mirror at all.
_CANNOT = {
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "the mirror's principal may not write its transactional ids"
    " (Kafka ACLs: TransactionalId Write and Describe on prefix '{prefix}'; MSK IAM:"
    " kafka-cluster:AlterTransactionalId and DescribeTransactionalId)",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the mirror's principal may not make idempotent writes",
    KafkaError.UNSUPPORTED_VERSION: _NO_TRANSACTIONS,
    KafkaError._UNSUPPORTED_FEATURE: _NO_TRANSACTIONS,
}


# A position's note keeps at most this many gaps: Event Hubs takes at most 1024 bytes of commit metadata, and a range
# meets one gap per deletion that overtook its copy (a handful in a long outage). Past it, the last ones merge.
NOTE_GAPS = 16


# A note's life when the copy found its partition gone backwards in the middle of its range: a life it has no id of.
OTHER_LIFE = "?"


@dataclass(frozen=True)
class PositionNote:
    """What an exactly-once position says besides its offset, committed with it as the offset's metadata: which life
    of the topic (its id, KIP-516) the offset is in, and the gaps (expected, first read) the copy that committed it
    met between the start of its range and the offset, where records were gone from the source before they were read.

    A copy that runs again after a crash between its commit and the driver's filing skips what the position says
    was committed: the note tells it whether the position is in the life it reads (a topic made again has other
    offsets), and which of the records it skips were never copied, so the flow's ledger reports them as it would
    have the first time."""

    life: str = ""  # the topic's id the offset is in; "" when not known (committed without a note), OTHER_LIFE
    gaps: tuple[tuple[int, int], ...] = ()
    # With OTHER_LIFE: the life the range was planned in, which the copy left when it found its partition gone
    # backwards; the offset is in the life after it, copied from its start.
    left: str = ""

    def dump(self) -> str:
        gaps = list(self.gaps)
        if len(gaps) > NOTE_GAPS:  # merged into one: its records read as deleted (reported, never skipped silently)
            gaps = [*gaps[: NOTE_GAPS - 1], (gaps[NOTE_GAPS - 1][0], gaps[-1][1])]
        left = {"left": self.left} if self.left else {}
        return json.dumps({"life": self.life, "gaps": gaps} | left, separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str | None) -> PositionNote:
        """A note as `dump` wrote it; an empty one for anything else (a position committed without a note)."""
        try:
            data = json.loads(raw or "")
            gaps = tuple((int(e), int(f)) for e, f in data["gaps"])
            return cls(str(data["life"]), gaps, str(data.get("left", "")))
        except (ValueError, KeyError, TypeError):
            return cls()


# How long an exactly-once copy waits for its topics' ids before a commit (`other_lives`).
LIFE_CHECK_TIMEOUT_S = 10.0


def other_lives(admin: AdminClient, lives: Mapping[str, str], read: Iterable[str]) -> tuple[dict[str, str], set[str]]:
    """Before an exactly-once commit: of the topics `lives` names (each with the id, KIP-516, of the life its
    positions belong to), those made again at the source since (with their id now), and those of `read` (read since
    the last commit) whose id did not answer.

    A consumer reads a topic made again on from where it stood, with nothing to tell the new life's records from the
    old one's (offsets, leader epoch 0 and record timestamps can all look alike); the id, asked after the records were
    read, can. The same id now means no record read before was another life's (an id is never given twice); another
    means records read since the last commit may be the new life's, and an id that does not answer cannot say: either
    way the transaction must not commit them as the old life's."""
    if not lives:
        return {}, set()
    try:
        now = clients.topic_ids(admin, lives, LIFE_CHECK_TIMEOUT_S)
    except KafkaException:
        now = {}
    remade = {t: i for t, i in now.items() if i != lives[t]}
    return remade, {t for t in read if t in lives and t not in now}


def lives_word(ids: Mapping[str, str], remade: Mapping[str, str], unsure: set[str]) -> str:
    """Why `other_lives` aborted a transaction, in the log's words."""
    words = [
        f"'{t}' was made again at the source (id {ids[t]} -> {i}): what was read of it since the last commit may be the"
        " new life's, which is copied from its log start instead"
        for t, i in sorted(remade.items())
    ]
    if unsure:
        words.append(f"the source did not say whether {', '.join(sorted(unsure))} was made again")
    return "; ".join(words)


# What a producer hears once a newer attempt of its transactional id started.
FENCED_ERRORS = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class Fenced(DeliveryFailed):
    """A newer attempt of the same slot started: this one must write nothing more."""


class Aborted(DeliveryFailed):
    """The target refused a record of the transaction, so all of it was aborted: nothing of it is visible."""


class TransactionFailed(DeliveryFailed):
    """A record of the open transaction failed (the target refused it), so the producer takes no more records until
    the transaction is aborted."""


class TransactionsRefused(MirrorFailed):
    """The target cannot do transactions for this flow; the message names the cluster, the flow and the key."""


# How a slot's transactional.id is made from the flow's prefix (spark_app.policy.transactional_id_prefix, which infra
# grants) and the slot's number. The JVM copier makes its slots' ids by this rule too (spark_app.copy_wing.contract
# hands it over): an id made otherwise in one language would fence nothing of the other's.
TRANSACTIONAL_ID_RULE = "{prefix}{slot}"


def transactional_id(flow: FlowConfig, slot: int) -> str:
    """A slot's id: the same for every attempt of the slot, in any language, so each fences the ones before it."""
    return TRANSACTIONAL_ID_RULE.format(prefix=transactional_id_prefix(flow), slot=slot)


def _position(topic: str, partition: int, offset: int, note: PositionNote | None) -> TopicPartition:
    """A committed position, with its note as the offset's metadata where it has one (the client takes a str there,
    never None)."""
    if note is None:
        return TopicPartition(topic, partition, offset)
    return TopicPartition(topic, partition, offset, note.dump())


class TransactionalProducer(Protocol):
    """The calls a slot's transactions make on its producer: confluent-kafka's Producer has them, and so has the
    compiled core's (spark_app.compiled_copy.CoreTransactions), each raising KafkaException with librdkafka's error."""

    def init_transactions(self, timeout: float) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float
    ) -> None: ...
    def commit_transaction(self, timeout: float) -> None: ...
    def abort_transaction(self, timeout: float) -> None: ...
    def purge(self, in_queue: bool, in_flight: bool) -> None: ...
    def poll(self, timeout: float) -> int: ...
    def flush(self, timeout: float) -> int: ...


P = TypeVar("P", bound=TransactionalProducer)


class SlotTransactions(Generic[P]):
    """One slot's transactional producer on the flow's target, started (so fencing its earlier attempts), and the
    positions it commits with its records when the flow is `exactly_once`. `make` makes the producer from its
    settings (the slot's transactional id among them): confluent-kafka's (`python_slot`), or the compiled core's."""

    def __init__(
        self, flow: FlowConfig, target: ClusterConfig, settings: Mapping[str, object], slot: int,
        make: Callable[[dict[str, object]], P],
    ) -> None:  # fmt: skip
        self.flow = flow
        self.target = target
        self.slot = slot
        self.id = transactional_id(flow, slot)
        self.producer = make(
            dict(settings) | {"transactional.id": self.id, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS}
        )
        self._group = clients.consumer(target, _positions_reader(flow))
        self._open = False
        try:
            self.producer.init_transactions(TRANSACTION_TIMEOUT_S)
        except KafkaException as err:
            self.close()
            raise _refused(flow, target, err) from None

    def committed(self, partitions: Iterable[Partition]) -> PartitionOffsets:
        """Where each source partition's records were committed up to (the next offset to copy), for those that have
        a position; read after this slot started, so no earlier attempt can commit past it unless it is fenced."""
        return {key: offset for key, (offset, _note) in self.committed_notes(partitions).items()}

    def committed_notes(self, partitions: Iterable[Partition]) -> dict[Partition, tuple[int, PositionNote]]:
        """`committed`, each position with the note it was committed with (`PositionNote`; an empty one where it was
        committed without)."""
        copies = {(target_topic(self.flow, t), p): (t, p) for t, p in partitions}
        if not copies:
            return {}
        request = [TopicPartition(t, p) for t, p in copies]
        try:
            found = clients.while_coordinator_moves(
                lambda: self._group.committed(request, timeout=clients.REQUEST_TIMEOUT_S)
            )
        except KafkaException as err:
            raise DeliveryFailed(f"flow {self.flow.name}: reading its positions on target '{self.target.alias}':"
                                 f" {err.args[0].str()}") from None  # fmt: skip
        return {
            copies[(tp.topic, tp.partition)]: (tp.offset, PositionNote.parse(tp.metadata))
            for tp in found
            if tp.offset >= 0 and tp.error is None
        }

    def went_through(
        self, positions: PartitionOffsets, notes: Mapping[Partition, PositionNote] | None = None,
        before: PartitionOffsets | None = None,
    ) -> bool:  # fmt: skip
        """After a commit with `positions` that answered abort: whether it went through after all (its end retried
        after a lost answer and refused, INVALID_TXN_STATE, once the first had committed). The positions read back,
        as a read_committed reader reads them (a transaction still ending is waited for), are the ones it committed,
        with the `notes` it sent; without notes, at least one of them moved from where the slot's last commit left
        it (`before`). Offsets alone cannot tell this commit from an older one at the same offsets (another life of
        the topic), and a commit with no position cannot say: either is taken as failed."""
        found = self.committed_notes(positions) if positions else {}
        if not positions or {key: offset for key, (offset, _) in found.items()} != dict(positions):
            return False
        if notes is not None:
            return all(found[key][1] == PositionNote.parse(note.dump()) for key, note in notes.items() if key in found)
        return before is not None and any(before.get(key) != offset for key, offset in positions.items())

    def begin(self) -> None:
        if not self._open:
            self._call(self.producer.begin_transaction)
            self._open = True

    def commit(self, positions: PartitionOffsets, notes: Mapping[Partition, PositionNote] | None = None) -> None:
        """Commit what was sent since `begin`, with each source partition's next offset when the flow is
        `exactly_once`, and its note where `notes` has one. Raises `Fenced` when a newer attempt took the slot over,
        DeliveryFailed when the target refused a record (the transaction is aborted then: nothing of it is visible)."""
        if not self._open:
            return
        if self.flow.exactly_once and positions:
            noted = notes or {}
            offsets = [
                _position(target_topic(self.flow, t), p, o, noted.get((t, p)))
                for (t, p), o in sorted(positions.items())
            ]
            metadata = self._group.consumer_group_metadata()
            self._call(lambda: self.producer.send_offsets_to_transaction(offsets, metadata, TRANSACTION_TIMEOUT_S))
        self._call(lambda: self.producer.commit_transaction(TRANSACTION_TIMEOUT_S))
        self._open = False

    def abort(self) -> None:
        """Drop what was sent since `begin`: purged if still queued, aborted (invisible to read_committed) if not.
        Then the reports of all of it are served, so none arrives among the records copied next."""
        if self._open:
            self._open = False
            self.producer.purge(in_queue=True, in_flight=False)
            self.producer.poll(0)
            self._call(lambda: self.producer.abort_transaction(TRANSACTION_TIMEOUT_S))
        self.producer.poll(0)

    def close(self) -> None:
        """Let go of the slot (its transaction committed or aborted already, or the slot fenced, when the producer
        answers every call with that error)."""
        self._group.close()
        with contextlib.suppress(KafkaException):
            self.producer.flush(0)

    @contextlib.contextmanager
    def fenced_raises(self) -> Iterator[None]:
        """Around a copy with the slot's producer: once fenced, librdkafka raises the fatal error from any call
        (`poll`, `produce`, `flush`); it leaves as `Fenced`."""
        try:
            yield
        except KafkaException as err:
            error = self._cause(err.args[0])
            if error.code() not in FENCED_ERRORS:
                raise
            raise self._fenced(error) from None

    def _call(self, step: object) -> None:
        """Run one transaction step; a fatal error (fenced, or a state the producer cannot leave) as `Fenced` or
        DeliveryFailed, an abortable one after aborting."""
        assert callable(step)
        try:
            step()
        except KafkaException as err:
            error = self._cause(err.args[0])
            if error.code() in FENCED_ERRORS:
                raise self._fenced(error) from None
            if error.txn_requires_abort() and self._open:
                self._open = False
                self.producer.abort_transaction(TRANSACTION_TIMEOUT_S)
                raise Aborted(f"flow {self.flow.name}: the transaction of slot {self.slot} was aborted:"
                              f" {error.name()}: {error.str()}") from None  # fmt: skip
            raise DeliveryFailed(f"flow {self.flow.name}: transaction of slot {self.slot} on target"
                                 f" '{self.target.alias}' failed: {error.name()}: {error.str()}") from None  # fmt: skip

    def _cause(self, error: KafkaError) -> KafkaError:
        """The error that stopped the producer, where `error` only says it stopped (_FATAL: every call after the
        first that heard the cause, say a produce retried after the one that was fenced); the transaction API
        answers a stopped producer with the cause itself."""
        if error.code() != KafkaError._FATAL:
            return error
        try:
            self.producer.abort_transaction(CAUSE_WAIT_S)
        except KafkaException as err:
            cause = cast(KafkaError, err.args[0])
            return cause if cause.fatal() else error
        return error

    def _fenced(self, error: KafkaError) -> Fenced:
        return Fenced(f"flow {self.flow.name}: slot {self.slot} was taken over by a newer attempt ({error.name()});"
                      " this one writes nothing more")  # fmt: skip


def python_slot(
    flow: FlowConfig, target: ClusterConfig, settings: Mapping[str, object], slot: int
) -> SlotTransactions[Producer]:
    """A slot's transactions through confluent-kafka's producer (the Python loop's)."""
    return SlotTransactions(flow, target, settings, slot, lambda conf: clients.producer(target, conf))


def _positions_reader(flow: FlowConfig) -> dict[str, object]:
    """A consumer of the positions group: it never subscribes, so it never joins; it reads and names the group."""
    return {"group.id": positions_group(flow), "enable.auto.commit": False, "isolation.level": "read_committed"}


def _refused(flow: FlowConfig, target: ClusterConfig, err: KafkaException) -> MirrorFailed:
    error: KafkaError = err.args[0]
    why = _CANNOT.get(error.code())
    if why is None:
        return DeliveryFailed(f"flow {flow.name}: starting a transactional producer on target '{target.alias}'"
                              f" failed: {error.name()}: {error.str()}")  # fmt: skip
    needs = "'exactly_once'" if flow.exactly_once else "'mode: realtime' (its copier tasks are fenced)"
    return TransactionsRefused(
        f"flow {flow.name}: {needs} needs transactions on target '{target.alias}', which refused them:"
        f" {why.format(prefix=transactional_id_prefix(flow))} ({error.name()})"
    )


def fence(flow: FlowConfig, target: ClusterConfig, settings: Mapping[str, object], first: int, end: int) -> None:
    """Start and drop a producer for each of the flow's slot ids from `first` up to `end`: every earlier attempt of
    them (a zombie of a run before this one) is fenced, and its open transaction aborted."""
    for slot in range(first, end):
        python_slot(flow, target, settings, slot).close()


def check_transactions(config: MirrorConfig) -> None:
    """Before Spark starts: each flow whose slots write in transactions starts its slot ids on its target (every
    real-time task's, the first of a micro-batch's), which fences the zombies of a mirror before this one and fails
    at once, naming the flow's key and the cluster, where the target cannot do transactions for it. The slot ids
    past those that any run of the flow ever started (the flow's mark, `LedgerState.slots`) are fenced by each start
    of its batches or real-time job, which read the mark from the flow's state."""
    for i, flow in enumerate(config.flows):
        target = config.cluster(flow.target)
        if not transactional(flow, target.is_eventhubs):
            continue
        key = f"flows[{i}].{'exactly_once' if flow.exactly_once else 'mode'}"
        try:
            fence(flow, target, {}, 0, flow.realtime_tasks if flow.mode is FlowMode.REALTIME else 1)
        except TransactionsRefused as err:
            raise TransactionsRefused(f"{key}: {err}") from None


def reset_positions(flow: FlowConfig, target: ClusterConfig, starts: PartitionOffsets) -> None:
    """Set the positions of partitions that start over (their topic made again, their offsets gone backwards): a
    position of the old life would skip the new one's records. The group has no members, so a plain commit does."""
    if not starts:
        return
    reader = clients.consumer(target, _positions_reader(flow))
    try:
        offsets = [TopicPartition(target_topic(flow, t), p, o) for (t, p), o in sorted(starts.items())]
        clients.while_coordinator_moves(lambda: reader.commit(offsets=offsets, asynchronous=False))
    finally:
        reader.close()
    log.info("flow %s: %d partition(s) start over; their committed positions moved there", flow.name, len(starts))
