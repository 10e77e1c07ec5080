"""One writer per flow's DR state: a lease on the target, held as the static member of the flow's lease group.

Two mirrors of one flow (a zombie driver pod beside its replacement, or a run started twice) would overwrite each
other's offset-sync slots and checkpoints. So a mirror's DR service joins the flow's lease group
(`spark_app.policy.lease_group`) on the target before it writes anything, with the group's name as its
`group.instance.id` (Kafka's static membership, KIP-345): the broker lets one member hold an instance id, and a
newer join with it fences the older member. The newest mirror wins, as a replacement should, and the older one
learns it at its next look (`held`), which the service takes before every round of writes; a round already under
way finishes, so a fenced mirror writes at most one more round. The lease rides on the flow's checkpoints topic
(paused: nothing is read), which the target always has while DR runs, and needs Read on the group there.

While a mirror holds the lease, the group has a member: `holder` says who, from the metadata of the commit the
holder made when it joined, so `failover` can refuse to move groups a running mirror would move again. A mirror
that stops marks its lease released; a crashed one's lapses `SESSION_S` after it died.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import MemberDescription

from .. import clients
from ..config import ClusterConfig, FlowConfig, MirrorConfig
from ..policy import checkpoints_topic, lease_group

log = logging.getLogger(__name__)

SESSION_S = 10  # how long a lease outlives a mirror that crashed
RELEASED = "released by"  # how the mark of a mirror that stopped starts
JOIN_TIMEOUT_S = clients.REQUEST_TIMEOUT_S


class DrLease:
    """The flow's DR lease, as one mirror holds it. `fenced` says why it was lost, once it was."""

    def __init__(self, cluster: ClusterConfig, flow: FlowConfig) -> None:
        self.cluster = cluster
        self.flow = flow
        self.group = lease_group(flow)
        self.topic = checkpoints_topic(flow)
        self.fenced: str | None = None
        self._consumer: Consumer | None = None
        self._mark = TopicPartition(self.topic, 0, 0)  # committed with who holds the lease, by `acquire`
        # Unique per lease, so its mark tells it from another mirror's (even one in this process).
        self._client_id = f"mirrorkit-lease-{socket.gethostname()}-{uuid.uuid4().hex[:12]}"

    def acquire(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Join the lease group, fencing any other mirror of the flow, and say who holds it now; a no-op while held."""
        if self._consumer is not None:
            return
        consumer = clients.consumer(
            self.cluster,
            {
                "group.id": self.group,
                "group.instance.id": self.group,
                "session.timeout.ms": SESSION_S * 1000,
                "enable.auto.commit": False,
                "client.id": self._client_id,
            },
        )
        consumer.subscribe([self.topic], on_assign=lambda c, parts: c.pause(parts))
        deadline = time.monotonic() + timeout_s
        while not consumer.assignment():
            if time.monotonic() >= deadline:
                consumer.close()
                raise TimeoutError(f"flow {self.flow.name}: no answer from '{self.cluster.alias}' to join {self.group}")
            error = _error_of(consumer.poll(0.2))
            if error is not None and error.fatal():
                consumer.close()
                raise KafkaException(error)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._mark = TopicPartition(
            self.topic, 0, 0, metadata=f"{socket.gethostname()} pid {os.getpid()} since {since} ({self._client_id})"
        )
        consumer.commit(offsets=[self._mark], asynchronous=False)
        self._consumer = consumer

    def held(self) -> bool:
        """Whether this mirror still holds the lease, asked of the broker: the holder's mark is committed again, which
        the group coordinator refuses to a member another mirror of the flow has fenced. A transient refusal
        (the coordinator moving) raises, so the round is tried again at the next interval."""
        if self.fenced is not None or self._consumer is None:
            return False
        err = _error_of(self._consumer.poll(0))
        if err is None:
            try:
                self._consumer.commit(offsets=[self._mark], asynchronous=False)
            except KafkaException as failed:
                err = failed.args[0]
                if not _fenced(err):
                    raise
        if err is not None and _fenced(err) and not self._taken():
            # librdkafka's own rejoin after the target came back (a broker restart, a coordinator that moved) took
            # the instance id from the member id the commit carried: no other mirror holds the lease, so take it again.
            log.warning("flow %s: the DR lease's consumer lost its membership to its own rejoin; joining again",
                        self.flow.name)  # fmt: skip
            self._consumer = None  # unusable after a fatal error
            self.acquire()
            return True
        if err is not None and _fenced(err):
            self.fenced = f"another mirror of flow {self.flow.name} took over its DR state ({err.str()})"
            log.error("flow %s: fenced: %s; this mirror stops writing its DR state", self.flow.name, self.fenced)
            self._consumer = None  # a fenced consumer is unusable; closing it would only report the error again
            return False
        return True

    def _taken(self) -> bool:
        """Whether a consumer other than this lease's is the lease group's member now. Asked of the member, not of
        the committed mark: a mirror that takes the lease is the member from its join on but commits its mark a
        moment later, and a look between the two would take the lease back. Told by member id: a static member that
        replaces another keeps the other's client id in the group's description."""
        mine = self._consumer.memberid() if self._consumer is not None else None
        return any(member.member_id != mine for member in _members(self.cluster, self.group))

    def release(self) -> None:
        """Give the lease up: a static member does not leave its group (the session ends `SESSION_S` on), so the
        holder's mark says it was released, and `holder` reads that as no mirror running."""
        if self._consumer is None:
            return
        released = TopicPartition(self.topic, 0, 0, metadata=f"{RELEASED} {self._mark.metadata}")
        try:
            self._consumer.commit(offsets=[released], asynchronous=False)
        except KafkaException as err:  # fenced meanwhile, or the target gone: the lease lapses on its own
            log.info("flow %s: DR lease left to lapse: %s", self.flow.name, err.args[0].str())
        self._consumer.close()
        self._consumer = None


def _fenced(err: KafkaError) -> bool:
    """A member took the lease's instance id: another mirror, or this one's own consumer joining again after the
    target came back (`held` tells which). An unknown member is neither: the holder's session lapsed while the
    target did not answer and the consumer joins again by itself; the round is tried again at the next interval."""
    return err.fatal() or err.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID)


def _error_of(msg: Message | None) -> KafkaError | None:
    return None if msg is None else msg.error()


def holder(config: MirrorConfig, flow: FlowConfig) -> str | None:
    """Who holds the flow's DR lease (host, pid, since when), or None when no mirror of the flow runs."""
    group = lease_group(flow)
    members = _members(config.cluster(flow.target), group)
    if not members:
        return None
    marks = _marks(config.cluster(flow.target), group, checkpoints_topic(flow))
    if marks and marks[0].startswith(RELEASED):
        return None  # stopped: its membership lapses, but it writes nothing more
    return marks[0] if marks else f"a member at {members[0].host}"


def _members(cluster: ClusterConfig, group: str) -> list[MemberDescription]:
    """The lease group's members, asked again while its coordinator loads or moves (a target that just started)."""
    admin = clients.admin(cluster)
    described = clients.while_coordinator_moves(
        lambda: admin.describe_consumer_groups([group], request_timeout=clients.REQUEST_TIMEOUT_S)[group].result()
    )
    return list(described.members)


def _marks(cluster: ClusterConfig, group: str, topic: str) -> list[str]:
    """The metadata of the lease group's commit: who took the lease, or released it."""
    return [tp.metadata for tp in clients.group_offsets(cluster, group, [TopicPartition(topic, 0)]) if tp.metadata]
