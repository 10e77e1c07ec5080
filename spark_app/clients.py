"""Every Kafka client the mirror makes, with one timeout policy, and the reads built on them.

Each AdminClient, Consumer and Producer gets the cluster's profile settings (spark_app.profiles) and an error
callback that turns a failed sign-in into `AuthenticationFailed` at once: librdkafka reports bad credentials only
on that callback, and otherwise retries until a request times out. Requests and whole-topic reads wait at most
`REQUEST_TIMEOUT_S`. Clients that outlive a Spark task (the copier's) are kept one per cluster and settings per
process, as Spark reuses its Python workers, at most SHARED_CLIENTS of each kind: the least recently used beyond
that is closed, so a changed override (a new key each time) never piles up producers. The compiled copy core's
consumer and producer (a `Copier`, spark_app.copy_core) are made and kept here the same way.
"""

from __future__ import annotations

import faulthandler
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar, cast

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType, TopicMetadata

from .config import ClusterConfig
from .errors import AuthenticationFailed, ClusterUnreachable
from .profiles import OAuthCallback, Role, Settings, librdkafka_settings

if TYPE_CHECKING:
    from mirrorkit_copy_core import Copier

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
READ_BATCH = 10_000  # records asked of each consume() in whole-topic reads
# What `mean_record_bytes` reads of each partition it samples: this many records, or about this many bytes of them.
SAMPLE_RECORDS = 500
SAMPLE_BYTES = 4 << 20
METADATA_CHECK_S = 5.0  # how long a check that the cluster answers at all waits for its metadata
# What a partition answers while its leader is being elected, e.g. just after the topic was created.
LEADER_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
# What a group's coordinator answers while it loads or moves, e.g. on a broker just started.
COORDINATOR_MOVING = frozenset(
    {KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR}
)
_AUTH_FAILED = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
_TRANSPORT_FAILURE = "Broker transport failure"
# A reader of internal topics: it assigns partitions itself, never joins a group and never commits.
_READER = {"group.id": "mirrorkit-reader", "enable.auto.commit": False, "enable.partition.eof": True}
_T = TypeVar("_T")

# Shared producers, and shared consumers, kept per process. A Spark worker runs one task at a time, with one producer
# and one consumer, so this covers the flows and modes a worker serves in turn; past it the least recently used is
# closed (a producer flushes first), and a worker serving more costs a new client per task, never a leak.
SHARED_CLIENTS = 8
# Consumers kept to read groups' committed offsets (`group_offsets`), one per cluster and group: past this many groups
# a round makes the least recently read group's reader again.
GROUP_READERS = 32
# A consume() that has not returned this long is stuck, not slow: a copy asks it to wait a fraction of a second. After a
# source broker came back, one of librdkafka's consumers was seen to stay inside a single call for good, its task with
# it (docs/mirror/adversary.md).
READ_STUCK_S = 60.0

Partition = tuple[str, int]  # (topic, partition), the one name every module uses for it
PartitionOffsets = dict[Partition, int]  # (topic, partition) -> offset


def consume(consumer: Consumer, most: int, wait_s: float) -> list[Message]:
    """`consumer.consume(most, wait_s)` in a Spark task: should the call not return within READ_STUCK_S, the process
    writes every thread's stack to its stderr (the executor's log) and exits with status 1.

    A task's process is a Python worker; its exit fails the task, and Spark runs it again in a new worker with a new
    consumer, from the same ranges. The watch is faulthandler's own thread, which needs neither the GIL nor the stuck
    call's cooperation. Elsewhere (a test that copies in its own process) a stuck read ends that process the same way.
    """
    faulthandler.dump_traceback_later(READ_STUCK_S, exit=True, file=2)  # fd 2: the worker's own stderr
    try:
        return consumer.consume(most, wait_s)
    finally:
        faulthandler.cancel_dump_traceback_later()


def auth_error_callback(cluster: ClusterConfig) -> Callable[[KafkaError], None]:
    """An `error_cb` that raises `AuthenticationFailed` when the cluster refuses the credentials.

    librdkafka also reports a connection lost during the SASL handshake (a broker restarting, a client closing
    while it reconnects) as an authentication error, with "Broker transport failure" in it: that is a network
    hiccup, retried like any other, not a refusal.
    """

    def on_error(err: KafkaError) -> None:
        if err.code() in _AUTH_FAILED and _TRANSPORT_FAILURE not in err.str():
            raise AuthenticationFailed(cluster)

    return on_error


def while_coordinator_moves(call: Callable[[], _T], within_s: float = REQUEST_TIMEOUT_S) -> _T:
    """`call()`, made again every half second while it fails because a group's coordinator loads or moves (a broker
    just started or restarted; librdkafka hands those to the caller of a group request), for up to `within_s`."""
    began = time.monotonic()
    while True:
        try:
            return call()
        except KafkaException as err:
            moving = err.args[0].retriable() or err.args[0].code() in COORDINATOR_MOVING
            if not moving or time.monotonic() - began > within_s:
                raise
            time.sleep(0.5)


def group_offsets(
    cluster: ClusterConfig, group: str, partitions: list[TopicPartition], timeout_s: float = REQUEST_TIMEOUT_S
) -> list[TopicPartition]:
    """A group's committed offsets and metadata on `partitions` (offset -1001 where it committed none), read through a
    consumer's group handle, which never joins the group nor commits.

    Not through the AdminClient: its group requests take librdkafka's admin coordinator path, which aborts the process
    when one times out while its coordinator look-up is still in flight (a broker down; librdkafka's issue 4605, seen
    in the mirror's DR loop) and crashes it on a NOT_COORDINATOR answer (a cluster just started). A consumer's
    OffsetFetch finds and follows the coordinator itself, and is asked again while it moves. A reader is kept per
    group (GROUP_READERS of them), so a checkpoint round every few seconds costs one request per group, not a new
    client's connections and coordinator look-up each time."""
    if not partitions:
        return []
    key = (cluster.model_dump_json(), group)
    reader = _group_readers.get(key, lambda: consumer(cluster, {"group.id": group, "enable.auto.commit": False}))
    return while_coordinator_moves(lambda: reader.committed(partitions, timeout=timeout_s), timeout_s)


def _settings(cluster: ClusterConfig, role: Role, extra: Mapping[str, object]) -> Settings:
    return dict(extra) | librdkafka_settings(cluster, role) | {"error_cb": auth_error_callback(cluster)}


def admin(cluster: ClusterConfig) -> AdminClient:
    return AdminClient(_settings(cluster, "admin", {}))


def consumer(cluster: ClusterConfig, defaults: Mapping[str, object] = _READER) -> Consumer:
    """A consumer; `defaults` are the caller's settings, under the profile's and the cluster's overrides."""
    return Consumer(_settings(cluster, "consumer", defaults))


def producer(cluster: ClusterConfig, defaults: Mapping[str, object]) -> Producer:
    """A producer; `defaults` are the caller's settings, under the profile's and the cluster's overrides."""
    return Producer(_settings(cluster, "producer", defaults))


class _Closable(Protocol):
    def close(self) -> object: ...


C = TypeVar("C", bound=_Closable)


class _Shared(Generic[C]):
    """Clients of one kind kept in this process by what makes them: the `bound` most recently used."""

    def __init__(self, bound: int = SHARED_CLIENTS) -> None:
        self._clients: OrderedDict[tuple[str, ...], C] = OrderedDict()
        self._lock = threading.Lock()
        self._bound = bound

    def get(self, key: tuple[str, ...], make: Callable[[], C]) -> C:
        with self._lock:
            if key in self._clients:
                self._clients.move_to_end(key)
                return self._clients[key]
            client = self._clients[key] = make()
            while len(self._clients) > self._bound:
                _close_unused(self._clients.popitem(last=False)[1])
            return client

    def discard(self, client: C) -> None:
        """Drop `client` without closing it (it failed for good); the next `get` for its key makes a new one."""
        with self._lock:
            for key in [k for k, c in self._clients.items() if c is client]:
                del self._clients[key]


def _close_unused(client: _Closable) -> None:
    """Close a client no one uses any more. Closing serves its last callbacks, and its `error_cb` raises what its
    cluster refused (a stopped broker's flow, a token refused long ago): that belongs to no caller now, and raised
    here it would fail whichever flow asked for a client (seen: one flow's copy failing on another's login)."""
    try:
        client.close()
    except Exception as err:  # noqa: BLE001 - its owner is gone; say so and go on
        log.info("a client closed for want of use reported on its way out: %s", err)


_consumers: _Shared[Consumer] = _Shared()
_producers: _Shared[Producer] = _Shared()
_copiers: _Shared[Copier] = _Shared()
_group_readers: _Shared[Consumer] = _Shared(GROUP_READERS)


def _key(cluster: ClusterConfig, defaults: Mapping[str, object]) -> tuple[str, str]:
    return cluster.model_dump_json(), repr(sorted(defaults.items()))


def shared_consumer(cluster: ClusterConfig, defaults: Mapping[str, object]) -> Consumer:
    """One consumer per cluster and settings in this process (SHARED_CLIENTS at most); each user assigns it what it
    reads."""
    return _consumers.get(_key(cluster, defaults), lambda: consumer(cluster, defaults))


def shared_producer(cluster: ClusterConfig, defaults: Mapping[str, object]) -> Producer:
    """One producer per cluster and settings in this process (a changed override, e.g. a raised cap, gets its own;
    SHARED_CLIENTS at most)."""
    return _producers.get(_key(cluster, defaults), lambda: producer(cluster, defaults))


def shared_copier(
    source: ClusterConfig, target: ClusterConfig, consumer_defaults: Mapping[str, object],
    producer_defaults: Mapping[str, object], idle_s: float | None,
) -> Copier:  # fmt: skip
    """A `copier` kept like the shared clients."""
    key = (*_key(source, consumer_defaults), *_key(target, producer_defaults), repr(idle_s))
    return _copiers.get(key, lambda: copier(source, target, consumer_defaults, producer_defaults, idle_s))


def copier(
    source: ClusterConfig, target: ClusterConfig, consumer_defaults: Mapping[str, object],
    producer_defaults: Mapping[str, object], idle_s: float | None,
) -> Copier:  # fmt: skip
    """The compiled copy core's consumer and producer (spark_app.compiled_copy), its own; a partition that reads
    nothing for `idle_s` (None: never) goes back to the Python loop. A cluster that logs in with a token gives the
    core its profile's callback, the same one confluent-kafka's clients call."""
    consumer_conf, consumer_token = _core_settings(dict(consumer_defaults) | librdkafka_settings(source, "consumer"))
    producer_conf, producer_token = _core_settings(dict(producer_defaults) | librdkafka_settings(target, "producer"))
    return _copier_class()(consumer_conf, producer_conf, idle_s, consumer_token, producer_token)


def _copier_class() -> type[Copier]:
    try:  # here, not at the top: only a worker that copies needs the compiled module
        from mirrorkit_copy_core import Copier
    except ImportError as err:
        raise ImportError(
            "copy_core 'compiled' needs the mirrorkit_copy_core module: `bash .ci/setup` builds and installs it, and"
            " the mirror image ships it; or set the flow's copy_core to 'python'"
        ) from err
    return Copier


def discard_copier(copier: Copier) -> None:
    """Forget a copier whose producer cannot be used again (a fatal error); the next user gets a new one."""
    _copiers.discard(copier)


def _core_settings(settings: Mapping[str, object]) -> tuple[list[tuple[str, str]], OAuthCallback | None]:
    """Settings as librdkafka's strings for the compiled core, and the token callback (`oauth_cb`) apart: the core
    calls it itself. Any other callback cannot cross into it; one here is the caller's mistake."""
    token = settings.get("oauth_cb")
    callbacks = sorted(k for k, v in settings.items() if callable(v) and k != "oauth_cb")
    if callbacks:
        raise ValueError(
            f"the compiled copy core takes no callback setting but a token login's ({', '.join(callbacks)})"
        )
    plain = [
        (k, ("true" if v else "false") if isinstance(v, bool) else str(v))
        for k, v in settings.items()
        if k != "oauth_cb"
    ]
    return plain, cast("OAuthCallback | None", token)


def discard_producer(client: Producer) -> None:
    """Forget a shared producer that cannot be used again (a fatal error); the next user gets a new one."""
    _producers.discard(client)


Delivered = Callable[[KafkaError | None, Message], None]  # a delivery callback: the error, None when written


def produce(
    client: Producer, topic: str, key: bytes, value: bytes | None, on_delivery: Delivered | None = None
) -> None:
    """Hand a record to the producer, waiting for room when its queue is full (a round of a few hundred thousand
    checkpoints is more than librdkafka queues at once) instead of failing; `on_delivery` hears whether the cluster
    took it."""
    while True:
        try:
            client.produce(topic, key=key, value=value, on_delivery=on_delivery)
            client.poll(0)
            return
        except BufferError:
            client.poll(0.1)


def list_topics(
    client: AdminClient, cluster: ClusterConfig, timeout_s: float | None = None
) -> dict[str, TopicMetadata]:
    """Topic metadata; fails at once on bad credentials, and after `timeout_s` when nothing answers (by default
    `REQUEST_TIMEOUT_S` as it stands at the call: every reach for a cluster that may be down waits this long)."""
    timeout_s = REQUEST_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.list_topics(timeout=min(2.0, timeout_s)).topics
        except KafkaException as err:
            detail = err.args[0].str()
        # Outside the except block, so the error raised here holds no cycle back to this frame and the client is
        # freed as soon as the caller lets the error go: a librdkafka client left for the interpreter's exit to
        # destroy, still retrying its sign-in, crashed the process (SIGSEGV instead of exit 1).
        client.poll(0)  # serves error_cb, which raises on an authentication failure
        if time.monotonic() >= deadline:
            raise ClusterUnreachable(cluster, timeout_s, detail)


def topic_ids(client: AdminClient, topics: Iterable[str], timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, str]:
    """Each topic's id (KIP-516), which tells a topic deleted and made again from the same one. A topic that does
    not answer (gone, not allowed, its metadata failing for a moment) is left out; the caller keeps what it knew."""
    names = sorted(set(topics))
    if not names:
        return {}
    ids: dict[str, str] = {}
    for name, future in client.describe_topics(TopicCollection(names), request_timeout=timeout_s).items():
        try:
            found = future.result().topic_id
        except KafkaException:
            continue
        if found.get_most_significant_bits() or found.get_least_significant_bits():  # all zero: no id yet
            ids[name] = str(found)
    return ids


def topic_configs(client: AdminClient, topic: str, timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, str]:
    """A topic's configuration as the cluster reports it, name -> value."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = client.describe_configs([resource], request_timeout=timeout_s)[resource].result()
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def check_reachable(clusters: Iterable[ClusterConfig], timeout_s: float) -> None:
    """Every cluster answers with these credentials, or a clear error naming it."""
    for cluster in clusters:
        list_topics(admin(cluster), cluster, timeout_s)


def list_offsets(
    client: AdminClient,
    partitions: Iterable[Partition],
    spec: OffsetSpec,
    read_committed: bool = False,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> PartitionOffsets:
    """One offset per partition (earliest, latest...) in one request; raises the first partition's error."""
    request = {TopicPartition(t, p): spec for t, p in partitions}
    if not request:
        return {}
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    futures = client.list_offsets(request, isolation_level=isolation, request_timeout=timeout_s)
    return {(tp.topic, tp.partition): future.result().offset for tp, future in futures.items()}


def list_offsets_each(
    client: AdminClient,
    partitions: Iterable[Partition],
    spec: OffsetSpec,
    read_committed: bool = False,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> tuple[PartitionOffsets, dict[Partition, str]]:
    """One offset per partition in one request: the partitions that answered, and why each other one did not.

    A partition fails alone when its leader is offline or moving, or its topic is gone; librdkafka then answers
    with an error, or (a leader it cannot reach) with no offset and no error once `timeout_s` has passed. When one
    fails, the cluster's metadata is asked too: that refreshes the client's leaders, without which librdkafka keeps
    asking the leader it last knew (waiting out the timeout while that broker is down, FENCED_LEADER_EPOCH once it
    is back: seen on Kafka 4.1 with librdkafka 2.16). When nothing answered and the metadata does not answer either,
    the cluster is down, and its error is raised.
    """
    request = {TopicPartition(t, p): spec for t, p in partitions}
    if not request:
        return {}, {}
    isolation = IsolationLevel.READ_COMMITTED if read_committed else IsolationLevel.READ_UNCOMMITTED
    found: PartitionOffsets = {}
    failed: dict[Partition, str] = {}
    futures = client.list_offsets(request, isolation_level=isolation, request_timeout=timeout_s)
    for tp, future in futures.items():
        key = (tp.topic, tp.partition)
        try:
            offset = future.result().offset
        except KafkaException as err:
            failed[key] = err.args[0].str()
            continue
        if offset < 0:
            failed[key] = f"its leader did not answer within {timeout_s:.0f} s"
        else:
            found[key] = offset
    if failed:
        try:
            client.list_topics(timeout=min(timeout_s, METADATA_CHECK_S))
        except KafkaException:
            if not found:
                raise
    return found, failed


def watermarks(reader: Consumer, topic: str, partition: int, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[int, int]:
    """A partition's (log start, end), waiting out a leader that is still moving, up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            low, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=max(left, 1.0))
            return low, high
        except KafkaException as err:
            if err.args[0].code() not in LEADER_MOVING or left <= 0:
                raise
            time.sleep(0.2)


def log_ranges(
    client: AdminClient, partitions: Iterable[Partition], timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[Partition, tuple[int, int]]:
    """Each partition's (log start, end) in two batched requests, waiting out leaders still moving up to
    `timeout_s`."""
    wanted = list(partitions)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low = list_offsets(client, wanted, OffsetSpec.earliest())
            high = list_offsets(client, wanted, OffsetSpec.latest())
            return {tp: (low[tp], high[tp]) for tp in wanted}
        except KafkaException as err:
            if err.args[0].code() not in LEADER_MOVING or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def group_members(cluster: ClusterConfig, group: str, timeout_s: float = REQUEST_TIMEOUT_S) -> int:
    """How many members a group has now, of any protocol (a Connect cluster's group too, which the consumer-group
    API refuses to describe); 0 when there is no such group."""
    found = admin(cluster).list_groups(group, timeout=timeout_s)
    return sum(len(g.members) for g in found if g.id == group)


def read_topic(
    cluster: ClusterConfig, topic: str, tail: int | None = None, timeout_s: float | None = None
) -> list[Message]:
    """Every record of a topic (or the last `tail` of each partition) up to its end now; [] if it does not exist."""
    return list(records(cluster, topic, tail, timeout_s))


def read_latest(cluster: ClusterConfig, topic: str, timeout_s: float | None = None) -> dict[bytes, Message]:
    """The newest record per key of a compacted topic up to its end now, as compaction leaves it: a tombstone (a
    null value) removes its key, a record without a key is left out. It holds one record per live key, however
    much history the topic has not compacted yet."""
    latest: dict[bytes, Message] = {}
    for msg in records(cluster, topic, None, timeout_s):
        key = msg.key()
        if key is None:
            continue
        if msg.value() is None:
            latest.pop(key, None)
        else:
            latest[key] = msg
    return latest


def records(
    cluster: ClusterConfig, topic: str, tail: int | None = None, timeout_s: float | None = None
) -> Iterator[Message]:
    """The records of a topic (or the last `tail` of each partition) up to its end now, in order per partition;
    none if it does not exist.

    Partitions are read to their ends in bulk; the read fails only when it makes no progress for `timeout_s` (by
    default `REQUEST_TIMEOUT_S` as it stands at the call), so a large internal topic is read whole however long that
    takes.
    """
    timeout_s = REQUEST_TIMEOUT_S if timeout_s is None else timeout_s
    client = admin(cluster)
    metadata = list_topics(client, cluster, timeout_s).get(topic)
    if metadata is None or metadata.error is not None:
        return
    ranges = log_ranges(client, [(topic, p) for p in metadata.partitions], timeout_s)
    ends = {p: high for (_, p), (low, high) in ranges.items() if high > low}
    if not ends:
        return
    reader = consumer(cluster)
    try:
        starts = {
            p: max(ranges[(topic, p)][0], high - tail) if tail else ranges[(topic, p)][0] for p, high in ends.items()
        }
        reader.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
        progress_at = time.monotonic()
        while ends:
            batch = reader.consume(READ_BATCH, 0.5)
            if batch:
                progress_at = time.monotonic()
            elif time.monotonic() - progress_at > timeout_s:
                raise TimeoutError(f"reading '{topic}' on '{cluster.alias}' made no progress for {timeout_s:.0f}s")
            for msg in batch:
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                # A partition is done at its end offset, or at its end of log: the records before its end may have
                # been compacted away.
                offset, partition = msg.offset(), msg.partition()
                if offset is not None and partition is not None and offset + (err is None) >= ends.get(partition, 0):
                    ends.pop(partition, None)
    finally:
        reader.close()


def mean_record_bytes(
    cluster: ClusterConfig, starts: Mapping[Partition, int], timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[str, float]:
    """Per topic, the mean size (key and value bytes) of the records read from `starts`: up to SAMPLE_RECORDS or
    SAMPLE_BYTES of each partition. A topic of which nothing was read within `timeout_s` (its partitions empty there,
    or silent) is left out: this is an estimate, and the caller has a fallback."""
    read: dict[Partition, tuple[int, int]] = dict.fromkeys(starts, (0, 0))  # records, bytes
    todo = set(starts)
    if not todo:
        return {}
    reader = consumer(cluster)
    try:
        reader.assign([TopicPartition(t, p, offset) for (t, p), offset in starts.items()])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for msg in reader.consume(READ_BATCH, 0.1):
                tp = (msg.topic() or "", msg.partition() or 0)
                if tp not in todo:
                    continue
                if msg.error() is not None:  # its end, or an error: what was read so far is the sample
                    todo.discard(tp)
                    continue
                records, size = read[tp]
                read[tp] = records + 1, size + len(msg.key() or b"") + len(msg.value() or b"")
                if records + 1 >= SAMPLE_RECORDS or read[tp][1] >= SAMPLE_BYTES:
                    todo.discard(tp)
    finally:
        reader.close()
    by_topic: dict[str, tuple[int, int]] = {}
    for (topic, _), (records, size) in read.items():
        was = by_topic.get(topic, (0, 0))
        by_topic[topic] = was[0] + records, was[1] + size
    return {topic: size / records for topic, (records, size) in by_topic.items() if records}


def read_at(
    cluster: ClusterConfig, wanted: Mapping[Partition, int], timeout_s: float = REQUEST_TIMEOUT_S
) -> dict[Partition, Message | None]:
    """The record at one offset per partition, read together; None where that offset holds no record (outside the
    log, compacted away, a transaction marker)."""
    found: dict[Partition, Message | None] = dict.fromkeys(wanted)
    if not wanted:
        return found
    ranges = log_ranges(admin(cluster), wanted, timeout_s)
    todo = {tp for tp, offset in wanted.items() if ranges[tp][0] <= offset < ranges[tp][1]}
    if not todo:
        return found
    reader = consumer(cluster)
    try:
        reader.assign([TopicPartition(t, p, wanted[(t, p)]) for t, p in sorted(todo)])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {len(todo)} partition(s) on '{cluster.alias}' made no progress")
            msg = reader.poll(0.5)
            if msg is None:
                continue
            err, topic, partition = msg.error(), msg.topic(), msg.partition()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                continue
            assert topic is not None and partition is not None  # a record, not an event
            if (topic, partition) in todo:
                todo.discard((topic, partition))
                found[(topic, partition)] = msg if msg.offset() == wanted[(topic, partition)] else None
        return found
    finally:
        reader.close()
