"""The nemesis: faults picked at random (a seed makes a run repeatable) from a menu, each with its own undo.

A fault is injected, held for a few seconds, then healed, one at a time. The menu covers the processes (the driver
killed or stopped; on a standalone cluster an executor lost with its worker or stopped, in local mode a Python
worker killed), the brokers (a source broker stopped: the partitions it leads go
offline; the whole target stopped), the network between the mirror and each cluster (Toxiproxy: a cut, latency with
a bandwidth cap, connections reset, a black hole that drops what is sent until healed), the target refusing writes
(an ACL denied, a topic made to refuse records without a key, a topic's cap lowered under the generator's padded
records: a refusal only the broker judges until topic sync sees it; its timestamp bound lowered, with records stamped
past it inside the mirror's clock slack: a refusal only the broker judges), and the source changing under the mirror (a
topic deleted and made again, at once or left empty a while and then refilled past its old end; records deleted
before they were mirrored, as retention would while the mirror is down), a forger on the real-time report channel, and
zombies: copiers paused while their mirror restarts on another slot count, resumed once it runs.
Network faults act on the mirror's path alone: the generator, the groups and the checker reach the clusters
directly. Every fault and its outcome is logged in `events`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from bench.testbed import clients
from bench.testbed.kafka_cluster import PRINCIPALS, KafkaCluster, MultiBrokerCluster
from bench.testbed.spark_standalone import SparkStandalone
from bench.testbed.toxiproxy import Faults, Stream

from .load import Load, Topics
from .process import MirrorProcess

HOLD_S = (3.0, 12.0)  # how long a fault is held, drawn at random (by default)
OVERRUN_S = 300.0  # how long past its end a run goes on for the faults it was asked for at least
OFFLINE_BROKER = 2  # the source broker stopped: it alone holds partition 1 of every topic
SLOW_TARGET_BYTES_S = 20_000
# The plain topic's cap on the target while lowered: under the generator's padded records (bench.chaos.load), over
# what a batch of its other records takes while the mirror keeps up.
LOWERED_CAP_BYTES = 10_000
# The plain topic's message.timestamp.before.max.ms on the target while lowered, and how far in the past the generator
# stamps a share of its records meanwhile: inside the mirror's clock slack (spark_app.topics.CLOCK_SLACK_MS), so its
# pre-send rule lets them through and the broker alone refuses them, while the records beside them land. The bound
# stays far above the time the broker's own transaction markers take to be written: a marker it refuses would leave a
# transaction open for good (Kafka's marker writer treats that refusal as a state it never expects).
LOWERED_TIMESTAMP_BOUND_MS = 60_000
AGED_BY_MS = LOWERED_TIMESTAMP_BOUND_MS + 20_000
# A WAN gone bad: each chunk delayed (with jitter) and the rate capped, on the way back from the brokers.
WAN_LATENCY_MS, WAN_JITTER_MS, WAN_KB_S = 400, 150, 64
RESET_AFTER_MS = (200, 3_000)  # connections reset this long after data first flows on them, drawn at random
REFILL_PAST = 50  # a topic made again and left empty is refilled to this many records past its old end
# Where the mirror's log says its real-time copier tasks report (spark_app.realtime.job).
CHANNEL_PORT = re.compile(rb"the copier tasks report on port (\d+)")
NONCE_BYTES = 32  # the report channel's challenge (spark_app.channel)
# What the mirror logs once a flow's copy has started (spark_app.throughput, spark_app.realtime.flow): by then it has
# fenced every slot id any run of the flow started.
COPY_STARTED = re.compile(rb"flow \S+: mirroring \d+ topic\(s\)")
SUCCESSOR_WAIT_S = 240.0


Remote = Callable[[str], str]  # a source topic's name on the target


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[], str | None]  # returns what it did, for the log; None: nothing to act on (not counted)
    heal: Callable[[], None]


@dataclass
class Scene:
    """What the nemesis acts on."""

    source: MultiBrokerCluster
    target: KafkaCluster  # Event Hubs-like (no topic creation by the mirror) or MSK-like, checking ACLs
    mirror: MirrorProcess
    topics: Topics
    remote: Remote
    load: Load  # the generator, paused on a topic left empty and asked to refill it
    spark: SparkStandalone | None = None  # the mirror's executors run there; None: Spark's local mode


@dataclass
class Nemesis:
    scene: Scene
    seed: int
    events: list[str] = field(default_factory=list)
    hold_s: tuple[float, float] = HOLD_S
    only: tuple[str, ...] = ()  # when given, only the faults whose names contain one of these
    first: tuple[str, ...] = ()  # the faults whose names contain one of these are drawn first, in a random order
    active: Fault | None = None
    # What a fault found the mirror doing that it must never do (a forged frame heard): the run fails on any.
    violations: list[str] = field(default_factory=list)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._old_end = 0  # the end of the topic left empty, before it was made again
        self._cap: str | None = None  # the target topic's max.message.bytes before the nemesis lowered it
        self._timestamp_bound: str | None = None  # its message.timestamp.before.max.ms before, likewise
        self._zombies_left: list[int] = []  # Python workers paused, then resumed after their successor started

    def menu(self) -> list[Fault]:
        """The faults it draws from: every one, or those `only` names."""
        every = self._every_fault()
        chosen = [f for f in every if not self.only or any(name in f.name for name in self.only)]
        if not chosen:
            raise ValueError(f"no fault matches {self.only}; the menu: {[f.name for f in every]}")
        return chosen

    def _every_fault(self) -> list[Fault]:
        s = self.scene
        return [
            Fault("kill the driver", self._kill_driver, s.mirror.start),
            Fault("stop the driver (SIGTERM)", self._term_driver, s.mirror.start),
            *self._executor_faults(),
            Fault(
                "stop a source broker (its partitions' leader offline)",
                self._stop_source_broker,
                lambda: s.source.broker(OFFLINE_BROKER).start(),
            ),  # fmt: skip
            Fault("stop the target", self._stop_target, lambda: s.target.start()),
            Fault("cut the mirror's network to the source", self._cut(s.source.faults), s.source.faults.heal),
            Fault("cut the mirror's network to the target", self._cut(s.target.faults), s.target.faults.heal),
            Fault("a slow, narrow network to the source", self._slow(s.source.faults), s.source.faults.heal),
            Fault("a slow, narrow network to the target", self._slow(s.target.faults), s.target.faults.heal),
            Fault("reset the mirror's connections to the source", self._reset(s.source.faults), s.source.faults.heal),
            Fault("reset the mirror's connections to the target", self._reset(s.target.faults), s.target.faults.heal),
            Fault("black-hole the network to the target", self._black_hole(s.target.faults), s.target.faults.heal),
            self._acl_fault("deny the mirror's writes to a target topic", AclOperation.WRITE),
            self._acl_fault("deny the mirror describing a target topic", AclOperation.DESCRIBE),
            Fault("make a target topic refuse records without a key", self._compact_target, self._uncompact_target),
            Fault(
                "lower a target topic's max.message.bytes (a refusal only its broker judges)",
                self._lower_cap,
                self._restore_cap,
            ),  # fmt: skip
            Fault(
                "lower a target topic's timestamp bound inside the clock slack (a refusal only its broker judges)",
                self._lower_timestamp_bound,
                self._restore_timestamp_bound,
            ),  # fmt: skip
            Fault("delete a source topic and make it again", self._recreate, lambda: None),
            Fault(
                "make a source topic again, leave it empty, then refill it past its old end",
                self._remake_empty,
                self._refill,
            ),  # fmt: skip
            Fault("delete records not yet mirrored (retention)", self._retention, s.mirror.start),
            Fault("slow the target (a produce quota)", self._slow_target, s.target.unlimit_producers),
            Fault("forge a landing and a stop on the report channel", self._forge_frames, lambda: None),
            Fault(
                "pause the copiers, restart the mirror on another slot count, resume them after it started",
                self._zombies,
                self._end_zombies,
            ),  # fmt: skip
        ]

    def _executor_faults(self) -> list[Fault]:
        """On a standalone cluster, an executor lost with its worker (SIGKILL) or stopped (SIGTERM); in local mode,
        where tasks run in the driver's JVM, one of its Python workers killed."""
        spark = self.scene.spark
        if spark is None:
            return [Fault("kill a Python worker", self._kill_worker, lambda: None)]
        lost: list[int] = []

        def kill_node() -> str:
            index = self.rng.randrange(len(spark.workers))
            spark.kill_worker(index)
            lost.append(index)
            return f"worker {index} and its executor SIGKILLed"

        def restart_nodes() -> None:
            while lost:
                spark.start_worker(lost.pop())

        def stop_executor() -> str | None:
            index = self.rng.randrange(len(spark.workers))
            return f"worker {index}'s executor SIGTERMed" if spark.stop_executor(index) else None

        return [
            Fault("kill an executor with its worker (a node lost)", kill_node, restart_nodes),
            Fault("stop an executor (SIGTERM)", stop_executor, lambda: None),
        ]

    def run(self, until: float, every_s: float, at_least: int = 0) -> int:
        """Inject faults until `until` (monotonic), one every `every_s` on average, and on past it until `at_least`
        have acted (a loaded machine makes each heal slower: an executor's worker takes longer to come back), for
        at most OVERRUN_S more; returns how many."""
        menu, count = self.menu(), 0
        queue = [f for f in menu if any(name in f.name for name in self.first)]
        self.rng.shuffle(queue)
        while time.monotonic() + self.hold_s[1] < until or (count < at_least and time.monotonic() < until + OVERRUN_S):
            fault = queue.pop() if queue else self.rng.choice(menu)
            self.active = fault
            did = fault.inject()
            hold = self.rng.uniform(*self.hold_s)
            self.events.append(f"{time.strftime('%H:%M:%S')} {fault.name}: {did or 'nothing to act on, not counted'};"
                               f" held {hold:.0f} s")  # fmt: skip
            time.sleep(hold)
            self.heal()
            count += did is not None
            time.sleep(self.rng.uniform(0.5, 1.5) * every_s)
        return count

    def heal(self) -> None:
        """Undo the fault in effect, if any (also after a run that failed in the middle of one)."""
        if self.active is not None:
            fault, self.active = self.active, None
            fault.heal()

    # -- the faults ----------------------------------------------------------------------------------------------

    def _kill_driver(self) -> str:
        self.scene.mirror.kill()
        return "SIGKILL"

    def _term_driver(self) -> str:
        began = time.monotonic()
        code = self.scene.mirror.term()
        took = time.monotonic() - began
        return f"exited {code} in {took:.0f} s" if code is not None else f"did not stop in {took:.0f} s; killed"

    def _kill_worker(self) -> str | None:
        return "killed one" if self.scene.mirror.kill_worker() else None

    def _stop_source_broker(self) -> str:
        self.scene.source.broker(OFFLINE_BROKER).stop()
        return f"broker {OFFLINE_BROKER}"

    def _stop_target(self) -> str:
        self.scene.target.stop()
        return "stopped"

    @staticmethod
    def _cut(faults: Faults) -> Callable[[], str]:
        def inject() -> str:
            faults.cut()
            return "connections dropped, new ones refused"

        return inject

    @staticmethod
    def _slow(faults: Faults) -> Callable[[], str]:
        def inject() -> str:
            for stream in Stream:  # both ways: a target is slow to take what is sent, a source to send it
                faults.latency(WAN_LATENCY_MS, WAN_JITTER_MS, stream)
                faults.bandwidth(WAN_KB_S, stream)
            return f"{WAN_LATENCY_MS}±{WAN_JITTER_MS} ms, {WAN_KB_S} KB/s each way"

        return inject

    def _reset(self, faults: Faults) -> Callable[[], str]:
        def inject() -> str:
            after = self.rng.randint(*RESET_AFTER_MS)
            faults.reset_peer(after_ms=after)
            return f"each connection reset {after} ms after data flows"

        return inject

    @staticmethod
    def _black_hole(faults: Faults) -> Callable[[], str]:
        def inject() -> str:
            faults.timeout(0)
            return "what the brokers send is dropped, connections held open"

        return inject

    def _slow_target(self) -> str:
        self.scene.target.limit_producers(SLOW_TARGET_BYTES_S)
        return f"{SLOW_TARGET_BYTES_S} B/s per client"

    def _acl_fault(self, name: str, operation: AclOperation) -> Fault:
        """A DENY for the mirror's principal on the target copy of the plain topic, and its removal. An ALLOW of
        everything else goes with it: where the DENY would be the topic's only ACL, the broker would refuse the
        principal every operation on it, not just the one denied."""
        topic = self.scene.remote(self.scene.topics.plain)
        principal = PRINCIPALS[self.scene.target.kind]

        def binding(op: AclOperation, permission: AclPermissionType) -> AclBinding:
            return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", op, permission)

        bindings = [binding(AclOperation.ALL, AclPermissionType.ALLOW), binding(operation, AclPermissionType.DENY)]
        matches = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type) for b in bindings]  # fmt: skip

        def inject() -> str:
            admin = clients.admin(self.scene.target.admin)  # held until its answer: a dropped client fails it
            for future in admin.create_acls(bindings).values():
                future.result()
            return f"{operation.name} on {topic}"

        def heal() -> None:
            admin = clients.admin(self.scene.target.admin)
            for future in admin.delete_acls(matches).values():
                future.result()

        return Fault(name, inject, heal)

    def _set_cleanup(self, policy: str) -> str:
        return self._set_topic_config("cleanup.policy", policy)

    def _set_topic_config(self, name: str, value: str) -> str:
        topic = self.scene.remote(self.scene.topics.plain)
        entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        admin = clients.admin(self.scene.target.admin)
        for future in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])]
        ).values():
            future.result()
        return topic

    def _lower_cap(self) -> str:
        """Lower the plain topic's cap on the target under the padded records: until the mirror's topic sync sees it,
        the broker alone refuses them, after later records were sent (spark_app.ledger reports what landed ahead)."""
        self._cap, topic = self._lower_topic_config("max.message.bytes", LOWERED_CAP_BYTES)
        return f"{topic}: {self._cap} -> {LOWERED_CAP_BYTES}"

    def _restore_cap(self) -> None:
        if self._cap is not None:
            self._set_topic_config("max.message.bytes", self._cap)
            self._cap = None

    def _lower_timestamp_bound(self) -> str:
        """Lower the plain topic's timestamp bound on the target and have the generator stamp a share of its records
        past it, inside the mirror's clock slack: the broker alone refuses those, after records behind them in the
        partition were sent (spark_app.ledger reports what landed ahead), until the mirror's own rule or the undo."""
        name = "message.timestamp.before.max.ms"
        self._timestamp_bound, topic = self._lower_topic_config(name, LOWERED_TIMESTAMP_BOUND_MS)
        self.scene.load.age(self.scene.topics.plain, AGED_BY_MS)
        return f"{topic}: {name} {self._timestamp_bound} -> {LOWERED_TIMESTAMP_BOUND_MS}; stamped {AGED_BY_MS} ms back"

    def _restore_timestamp_bound(self) -> None:
        self.scene.load.age(self.scene.topics.plain, None)
        if self._timestamp_bound is not None:
            self._set_topic_config("message.timestamp.before.max.ms", self._timestamp_bound)
            self._timestamp_bound = None

    def _lower_topic_config(self, name: str, value: int) -> tuple[str, str]:
        """Set one config of the plain topic on the target; its value before, and the topic."""
        topic = self.scene.remote(self.scene.topics.plain)
        resource = ConfigResource(ResourceType.TOPIC, topic)
        admin = clients.admin(self.scene.target.admin)  # held until its answer: a dropped client fails it
        before = admin.describe_configs([resource])[resource].result()[name].value
        self._set_topic_config(name, str(value))
        return before, topic

    def _compact_target(self) -> str:
        return self._set_cleanup("compact")

    def _uncompact_target(self) -> None:
        self._set_cleanup("delete")

    def _recreate(self) -> str:
        topic, n = self.scene.topics.remade, self.scene.topics.partitions
        clients.remake_topic(self.scene.source.admin, topic, placement(n))
        return topic

    def _remake_empty(self) -> str:
        """Pause the generator on the topic, make it again and leave it empty until healed: the mirror first sees
        the new life with nothing in it."""
        topic, n = self.scene.topics.remade, self.scene.topics.partitions
        self.scene.load.paused.add(topic)
        ends = clients.end_offsets(self.scene.source.client, [(topic, p) for p in range(n)])
        self._old_end = max(ends.values())
        self._recreate()
        return f"{topic}, whose partitions ended at {sorted(ends.values())}, left empty"

    def _refill(self) -> None:
        self.scene.load.refill(self.scene.topics.remade, self._old_end + REFILL_PAST)

    def _forge_frames(self) -> str | None:
        """Connect to the driver's report channel as a task would, answer its challenge without the key, and send a
        landing far past the source's end and a stop: the driver must close the connection and move nothing."""
        ports = CHANNEL_PORT.findall(self.scene.mirror.log.read_bytes())
        if not ports:
            return None  # no real-time job has started (throughput mode, or not yet)
        port = int(ports[-1])
        landed = json.dumps(["LANDED", {"topic": self.scene.topics.plain, "partition": 0, "end": 10**12}]).encode()
        stop = json.dumps(["STOP"]).encode()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.recv(NONCE_BYTES)
                sock.sendall(bytes(64) + b"".join(len(f).to_bytes(4, "big") + f for f in (landed, stop)))
                sock.settimeout(10)
                answer = sock.recv(1024)
        except ConnectionRefusedError:
            return None  # the job that listened there has ended
        except TimeoutError:
            return f"port {port}: the driver neither answered nor closed the connection in 10 s"
        except OSError as err:
            return f"port {port}: the driver closed the connection ({err.__class__.__name__})"
        if answer:
            self.violations.append(f"the report channel on port {port} answered a forger: {answer[:64]!r}")
            return f"port {port}: ANSWERED"
        return f"port {port}: the driver closed the connection"

    def _zombies(self) -> str | None:
        """Pause (SIGSTOP) every Python worker copying for the mirror, kill the mirror and its executors but them, start
        it again with another real-time slot count (a throughput run plans its own), and once its copy has started,
        resume the paused ones: zombies of slots their successor may no longer run, whose writes must be fenced. With
        no Python worker running (slots on the JVM), the restart on another slot count alone."""
        s = self.scene
        paused = s.mirror.workers() + (s.spark.python_workers() if s.spark else [])
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        self._zombies_left = paused
        s.mirror.kill(spare=frozenset(paused))
        if s.spark is not None:
            s.spark.kill_executors(spare=frozenset(paused))
        slots = s.mirror.change_slots()
        seen = len(COPY_STARTED.findall(s.mirror.log.read_bytes()))
        s.mirror.start()
        deadline = time.monotonic() + SUCCESSOR_WAIT_S
        while len(COPY_STARTED.findall(s.mirror.log.read_bytes())) <= seen and time.monotonic() < deadline:
            time.sleep(0.5)
        started = len(COPY_STARTED.findall(s.mirror.log.read_bytes())) > seen
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return (
            f"{len(paused)} Python worker(s) paused; the mirror restarted with {slots} real-time slot(s);"
            f" resumed {'after its copy started' if started else f'after {SUCCESSOR_WAIT_S:.0f} s'}"
        )

    def _end_zombies(self) -> None:
        """Kill whatever of the resumed workers still runs (each ends on its own once it finds its JVM gone)."""
        for pid in self._zombies_left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._zombies_left = []

    def _retention(self) -> str:
        """Stop the mirror, let records pile up, then delete them as retention would before the mirror is back."""
        self.scene.mirror.kill()
        time.sleep(2.0)
        topic, partition = self.scene.topics.plain, self.rng.randrange(self.scene.topics.partitions)
        end = clients.end_offsets(self.scene.source.client, [(topic, partition)])[(topic, partition)]
        admin = clients.admin(self.scene.source.admin)
        tp = TopicPartition(topic, partition, end)
        admin.delete_records([tp])[tp].result()
        return f"{topic}[{partition}] before offset {end}"


def placement(partitions: int) -> list[int]:
    """Brokers for a topic's partitions: partition 1 on OFFLINE_BROKER, the others on broker 1 (the controller)."""
    return [OFFLINE_BROKER if p == 1 else 1 for p in range(partitions)]
