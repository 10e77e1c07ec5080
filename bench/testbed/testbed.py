"""A set of independent clusters sharing one run folder, one throwaway CA and, for proxied clusters, one Toxiproxy.

Each run gets its own folder under the system temp dir and its own ports, so two runs never collide. A cluster is
proxied on request only (`proxied=True`). Not for the cost: measured on two busy cores, the Toxiproxy server started
in about 30 ms and held 13 MB, a proxy was made in 2 ms, and a broker with the extra listener started as fast as one
without (within the noise of 8 to 24 s starts). But the server is a binary `.ci/setup` builds, which the benchmarks
should not need.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from .kafka_cluster import KafkaCluster, ListenerKind, MultiBrokerCluster, kafka_classpath, require_java
from .tls import TlsFiles, make_loopback_tls
from .toxiproxy import ToxiproxyServer


class TestBed:
    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(self, root: Path | None = None) -> None:
        require_java()
        kafka_classpath()  # fail now, naming the fetch command, rather than at the first broker
        self.root = root or Path(tempfile.mkdtemp(prefix="mirrorkit-testbed-"))
        self.clusters: dict[str, KafkaCluster] = {}
        self._tls: TlsFiles | None = None
        self._toxiproxy: ToxiproxyServer | None = None
        atexit.register(self.close)

    @property
    def tls(self) -> TlsFiles:
        if self._tls is None:
            self._tls = make_loopback_tls(self.root / "tls")
        return self._tls

    @property
    def toxiproxy(self) -> ToxiproxyServer:
        """The bed's Toxiproxy server, started on first use and stopped with the bed."""
        if self._toxiproxy is None:
            self._toxiproxy = ToxiproxyServer(self.root / "toxiproxy").start()
        return self._toxiproxy

    def start(self, name: str, kind: ListenerKind | str, proxied: bool = False, **options) -> KafkaCluster:
        """A single-node cluster; `proxied` gives it a proxy on the bed's Toxiproxy (`cluster.proxied`, `.faults`)."""
        if name in self.clusters:
            raise ValueError(f"the test bed already has a cluster named '{name}'")
        kind = ListenerKind(kind)
        tls = None if kind is ListenerKind.PLAINTEXT else self.tls
        toxiproxy = self.toxiproxy if proxied else None
        cluster = KafkaCluster(name=name, kind=kind, folder=self.root / name, tls=tls, toxiproxy=toxiproxy, **options)
        self.clusters[name] = cluster
        return cluster.start()

    def start_multi(self, name: str, brokers: int = 2, proxied: bool = False) -> MultiBrokerCluster:
        """A plaintext cluster of `brokers` nodes (node 1 also its controller); each node is listed in `clusters` as
        `<name>-<node id>`, so it is stopped with the bed and its log tail lands in a failing test's report. `proxied`
        gives each node a proxy of its own."""
        if brokers < 2:
            raise ValueError("a multi-broker cluster needs at least two brokers; use `start` for one")
        toxiproxy = self.toxiproxy if proxied else None
        controller = KafkaCluster(
            name=f"{name}-1", kind=ListenerKind.PLAINTEXT, folder=self.root / f"{name}-1", toxiproxy=toxiproxy
        )
        nodes = [controller] + [
            KafkaCluster(
                name=f"{name}-{n}",
                kind=ListenerKind.PLAINTEXT,
                folder=self.root / f"{name}-{n}",
                node_id=n,
                quorum=controller,
                toxiproxy=toxiproxy,
            )  # fmt: skip
            for n in range(2, brokers + 1)
        ]
        for node in nodes:
            if node.name in self.clusters:
                raise ValueError(f"the test bed already has a cluster named '{node.name}'")
            self.clusters[node.name] = node
        return MultiBrokerCluster(name, nodes).start()

    def retire(self, name: str) -> None:
        """Kill a cluster the bed started and forget it: a test's own cluster, so that idle brokers do not pile up on
        the machine for the rest of a run. Its folder stays until the bed closes."""
        self.clusters.pop(name).kill()

    def close(self, keep_files: bool = False) -> None:
        for cluster in self.clusters.values():
            cluster.kill()
        if self._toxiproxy is not None:
            self._toxiproxy.stop()
        if not keep_files and not os.environ.get("MIRRORKIT_KEEP_TESTBED"):
            shutil.rmtree(self.root, ignore_errors=True)
