"""The nemesis: faults picked at random (a seed makes a run repeatable) from a menu, each with its own undo.

A fault is injected, held for a few seconds, then healed, one at a time. The menu covers the process (the driver
killed or stopped, a Python worker killed), the brokers (a source broker stopped: the partitions it leads go
offline; the whole target stopped), the target refusing writes (an ACL denied, a topic made to refuse records
without a key), and the source changing under the mirror (a topic deleted and made again; records deleted before
they were mirrored, as retention would while the mirror is down). Every fault and its outcome is logged in `events`.
"""

from __future__ import annotations

import random
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
from bench.testbed.kafka_cluster import EVENTHUBS_USER, KafkaCluster, MultiBrokerCluster

from .load import Topics
from .process import MirrorProcess

HOLD_S = (3.0, 12.0)  # how long a fault is held, drawn at random (by default)
OFFLINE_BROKER = 2  # the source broker stopped: it alone holds partition 1 of every topic
SLOW_TARGET_BYTES_S = 20_000


Remote = Callable[[str], str]  # a source topic's name on the target


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[], str]  # returns what it did, for the log
    heal: Callable[[], None]


@dataclass
class Scene:
    """What the nemesis acts on."""

    source: MultiBrokerCluster
    target: KafkaCluster  # the Event Hubs-like cluster: ACLs, no topic creation by the mirror
    mirror: MirrorProcess
    topics: Topics
    remote: Remote


@dataclass
class Nemesis:
    scene: Scene
    seed: int
    events: list[str] = field(default_factory=list)
    hold_s: tuple[float, float] = HOLD_S
    active: Fault | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def menu(self) -> list[Fault]:
        s = self.scene
        return [
            Fault("kill the driver", self._kill_driver, s.mirror.start),
            Fault("stop the driver (SIGTERM)", self._term_driver, s.mirror.start),
            Fault("kill a Python worker", self._kill_worker, lambda: None),
            Fault(
                "stop a source broker (its partitions' leader offline)",
                self._stop_source_broker,
                lambda: s.source.broker(OFFLINE_BROKER).start(),
            ),  # fmt: skip
            Fault("stop the target", self._stop_target, lambda: s.target.start()),
            Fault("deny the mirror's writes to a target topic", self._deny_write, self._allow_write),
            Fault("make a target topic refuse records without a key", self._compact_target, self._uncompact_target),
            Fault("delete a source topic and make it again", self._recreate, lambda: None),
            Fault("delete records not yet mirrored (retention)", self._retention, s.mirror.start),
            Fault("slow the target (a produce quota)", self._slow_target, s.target.unlimit_producers),
        ]

    def run(self, until: float, every_s: float) -> int:
        """Inject faults until `until` (monotonic), one every `every_s` on average; returns how many."""
        menu, count = self.menu(), 0
        while time.monotonic() + self.hold_s[1] < until:
            fault = self.rng.choice(menu)
            self.active = fault
            did = fault.inject()
            hold = self.rng.uniform(*self.hold_s)
            self.events.append(f"{time.strftime('%H:%M:%S')} {fault.name}: {did}; held {hold:.0f} s")
            time.sleep(hold)
            self.heal()
            count += 1
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
        code = self.scene.mirror.term()
        return f"exited {code}" if code is not None else "did not stop in time; killed"

    def _kill_worker(self) -> str:
        return "killed one" if self.scene.mirror.kill_worker() else "none running"

    def _stop_source_broker(self) -> str:
        self.scene.source.broker(OFFLINE_BROKER).stop()
        return f"broker {OFFLINE_BROKER}"

    def _stop_target(self) -> str:
        self.scene.target.stop()
        return "stopped"

    def _slow_target(self) -> str:
        self.scene.target.limit_producers(SLOW_TARGET_BYTES_S)
        return f"{SLOW_TARGET_BYTES_S} B/s per client"

    def _acl(self) -> AclBinding:
        topic = self.scene.remote(self.scene.topics.plain)
        return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{EVENTHUBS_USER}", "*",
                          AclOperation.WRITE, AclPermissionType.DENY)  # fmt: skip

    def _deny_write(self) -> str:
        admin = clients.admin(self.scene.target.admin)
        for future in admin.create_acls([self._acl()]).values():
            future.result()
        return self._acl().name

    def _allow_write(self) -> None:
        b = self._acl()
        match = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                 b.permission_type)  # fmt: skip
        admin = clients.admin(self.scene.target.admin)
        for future in admin.delete_acls([match]).values():
            future.result()

    def _set_cleanup(self, policy: str) -> str:
        topic = self.scene.remote(self.scene.topics.plain)
        entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
        admin = clients.admin(self.scene.target.admin)
        for future in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])]
        ).values():
            future.result()
        return topic

    def _compact_target(self) -> str:
        return self._set_cleanup("compact")

    def _uncompact_target(self) -> None:
        self._set_cleanup("delete")

    def _recreate(self) -> str:
        topic, n = self.scene.topics.remade, self.scene.topics.partitions
        admin = clients.admin(self.scene.source.admin)
        admin.delete_topics([topic], operation_timeout=30)[topic].result()
        deadline = time.monotonic() + 60
        while True:
            try:
                clients.create_placed_topics(self.scene.source.admin, {topic: placement(n)})
                return topic
            except AssertionError:  # still being deleted
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

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
