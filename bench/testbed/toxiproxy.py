"""Toxiproxy between clients and the test bed's brokers, so tests can break the network on purpose.

One `toxiproxy-server` (Shopify's Toxiproxy v2.5.0, which `.ci/setup` builds from the Go module proxy) serves a whole
test bed on a free loopback port; each broker started with a proxied listener gets a proxy of its own
(bench/testbed/kafka_cluster.py). A proxy is cut by disabling it: Toxiproxy then closes its connections and its
listening socket, so new connections are refused. Toxics (latency, bandwidth, resets, timeouts, ...) act on one
direction of a proxy's traffic: `upstream` is client to broker, `downstream` broker to client. The REST API is
spoken with urllib: the test bed adds no dependency for it.
"""

from __future__ import annotations

import enum
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ports import free_port

VERSION = "2.5.0"
SERVER = Path(__file__).resolve().parents[2] / ".cache" / "bin" / "toxiproxy-server"
SETUP_HINT = f"run `bash .ci/setup` (it builds Toxiproxy's server {VERSION} from the Go module proxy)"
READY_TIMEOUT_S = 15.0
# Removing a toxic waits for its streams to let go, which a stalled peer can hold up past the server's own request
# timeout (it answers 503); the removal is asked again until the toxic is gone, for at most this long.
HEAL_WAIT_S = 120.0
# How often a GET or DELETE the server ended with 503 (it could not serve it in time) is asked again, a second apart.
BUSY_RETRIES = 5


class Stream(enum.StrEnum):
    UPSTREAM = "upstream"  # client to broker
    DOWNSTREAM = "downstream"  # broker to client


@dataclass(frozen=True)
class Toxic:
    """A toxic as the server reports it; `toxicity` is the share of connections it applies to."""

    name: str
    type: str
    stream: Stream
    toxicity: float
    attributes: dict[str, int]


class ToxiproxyError(RuntimeError):
    """The server refused a request; the message carries its own error text, `status` its HTTP status."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the Toxiproxy API on `port`; the decoded JSON reply, or None for an empty one. A refusal raises
    ToxiproxyError.

    The server ends a call it cannot serve in time with 503 (Go's timeout handler), as on a machine loaded by the
    nemesis's own faults: a GET or DELETE is asked again, a few times; a DELETE that then finds its object gone (404)
    had done its work the first time."""
    data = None if body is None else json.dumps(body).encode()
    retries = BUSY_RETRIES if method in ("GET", "DELETE") else 0
    for attempt in range(retries + 1):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                reply = response.read()
        except urllib.error.HTTPError as err:
            if err.code == 503 and attempt < retries:
                time.sleep(1.0)
                continue
            if err.code == 404 and method == "DELETE" and attempt > 0:
                return None
            raise ToxiproxyError(
                f"{method} {path}: HTTP {err.code}: {err.read().decode(errors='replace').strip()}", err.code
            ) from None
        return json.loads(reply) if reply else None
    raise AssertionError("unreachable")


def require_server() -> Path:
    """The server binary; fails naming the set-up command when it is missing."""
    if not SERVER.is_file():
        raise RuntimeError(f"{SERVER} is missing: {SETUP_HINT}")
    return SERVER


class ToxiproxyServer:
    """One toxiproxy-server process on a free loopback port, its log in `folder`; `proxy` makes proxies on it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = 0
        self._process: subprocess.Popen | None = None

    @property
    def log_file(self) -> Path:
        return self.folder / "toxiproxy.log"

    def start(self, attempts: int = 3) -> ToxiproxyServer:
        """Start the server and wait until its API answers; a port taken between probe and bind is picked anew."""
        server = require_server()
        self.folder.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            self.port = free_port()
            with self.log_file.open("ab") as log:
                self._process = subprocess.Popen(
                    [str(server), "-host", "127.0.0.1", "-port", str(self.port)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            version = self._wait_ready()
            if version == VERSION:
                return self
            if version is not None:
                self.stop()
                raise RuntimeError(f"{server} is version {version!r}, not {VERSION}: {SETUP_HINT}")
            log_text = self.log_file.read_text(errors="replace")
            if "address already in use" not in log_text or attempt == attempts:
                self.stop()
                raise RuntimeError(f"toxiproxy-server did not start on port {self.port}:\n{log_text[-3000:]}")
        raise AssertionError("unreachable")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)

    def proxy(self, name: str, upstream: str) -> Proxy:
        """A new enabled proxy forwarding to `upstream` (host:port), listening on a port the server picks."""
        made = self.request("POST", "/proxies", {"name": name, "listen": "127.0.0.1:0", "upstream": upstream})
        return Proxy(self, name, made["listen"])

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call (`call`) to this server."""
        return call(self.port, method, path, body)

    def _wait_ready(self) -> str | None:
        """The version the API answers with, once it answers; None if the process exits first."""
        assert self._process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/version", timeout=2) as response:
                    return response.read().decode()
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"toxiproxy-server not answering on port {self.port} after {READY_TIMEOUT_S:.0f}s")


class Proxy:
    """One proxy: clients connect to `listen` (127.0.0.1:<port>), it forwards to its upstream."""

    def __init__(self, server: ToxiproxyServer, name: str, listen: str) -> None:
        self.server, self.name, self.listen = server, name, listen

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def enabled(self) -> bool:
        return bool(self.server.request("GET", f"/proxies/{self.name}")["enabled"])

    def point_at(self, upstream: str) -> None:
        """Forward to another upstream (a broker that restarted on new ports); `listen` stays."""
        self.server.request("POST", f"/proxies/{self.name}", {"upstream": upstream})

    def disable(self) -> None:
        """Cut: close every connection through the proxy and refuse new ones until `enable`."""
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": False})

    def enable(self) -> None:
        self.server.request("POST", f"/proxies/{self.name}", {"enabled": True})

    def add_toxic(
        self, kind: str, stream: Stream = Stream.DOWNSTREAM, toxicity: float = 1.0, **attributes: int
    ) -> Toxic:
        """Add a toxic of any type Toxiproxy knows; the server names it `<type>_<stream>`, so one of each per stream."""
        body = {"type": kind, "stream": str(stream), "toxicity": toxicity, "attributes": attributes}
        return _toxic(self.server.request("POST", f"/proxies/{self.name}/toxics", body))

    def latency(self, ms: int, jitter_ms: int = 0, stream: Stream = Stream.DOWNSTREAM) -> Toxic:
        """Delay each chunk of data by `ms` plus or minus up to `jitter_ms`."""
        return self.add_toxic("latency", stream, latency=ms, jitter=jitter_ms)

    def bandwidth(self, kb_per_s: int, stream: Stream = Stream.DOWNSTREAM) -> Toxic:
        """Cap the rate at `kb_per_s` kilobytes a second."""
        return self.add_toxic("bandwidth", stream, rate=kb_per_s)

    def reset_peer(self, after_ms: int = 0, stream: Stream = Stream.DOWNSTREAM, toxicity: float = 1.0) -> Toxic:
        """Reset (TCP RST) each connection `after_ms` after data first flows on it while the toxic is in place."""
        return self.add_toxic("reset_peer", stream, toxicity, timeout=after_ms)

    def timeout(self, ms: int, stream: Stream = Stream.DOWNSTREAM) -> Toxic:
        """Let no data through; close the connection after `ms` (never, if 0)."""
        return self.add_toxic("timeout", stream, timeout=ms)

    def toxics(self) -> list[Toxic]:
        return [_toxic(t) for t in self.server.request("GET", f"/proxies/{self.name}/toxics")]

    def remove_toxic(self, name: str) -> None:
        self.server.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def heal(self) -> None:
        """Remove every toxic and enable the proxy again: the path is clean. A toxic whose stream a stalled peer holds
        (a client that stopped reading) is not removed until the stream lets go, the server answering 503 meanwhile:
        past HEAL_WAIT_S the proxy's connections are closed, as a peer's reset would, and the removal goes on."""
        deadline, closed = time.monotonic() + HEAL_WAIT_S, False
        while toxics := self.toxics():
            for toxic in toxics:
                try:
                    self.remove_toxic(toxic.name)
                except ToxiproxyError as err:  # timed out (503), or gone meanwhile (404): look again
                    if err.status not in (503, 404):
                        raise
                    if time.monotonic() > deadline:
                        if closed:
                            raise
                        closed = self._close_connections()
                        deadline = time.monotonic() + HEAL_WAIT_S if closed else deadline
            time.sleep(0.2)
        self.enable()

    def _close_connections(self) -> bool:
        """Close every connection through the proxy (`disable`); False when the busy server did not get to it."""
        try:
            self.disable()
        except ToxiproxyError as err:
            if err.status != 503:
                raise
            return False
        return True


class Faults:
    """The proxies of one cluster's brokers, acted on together: a fault on the cluster is a fault on each broker."""

    def __init__(self, proxies: Sequence[Proxy]) -> None:
        self.proxies = list(proxies)

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.disable()

    def heal(self) -> None:
        """Heal every proxy, even past one that fails (its error is raised once the others are healed)."""
        errors = []
        for proxy in self.proxies:
            try:
                proxy.heal()
            except ToxiproxyError as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def latency(self, ms: int, jitter_ms: int = 0, stream: Stream = Stream.DOWNSTREAM) -> None:
        for proxy in self.proxies:
            proxy.latency(ms, jitter_ms, stream)

    def bandwidth(self, kb_per_s: int, stream: Stream = Stream.DOWNSTREAM) -> None:
        for proxy in self.proxies:
            proxy.bandwidth(kb_per_s, stream)

    def reset_peer(self, after_ms: int = 0, stream: Stream = Stream.DOWNSTREAM, toxicity: float = 1.0) -> None:
        for proxy in self.proxies:
            proxy.reset_peer(after_ms, stream, toxicity)

    def timeout(self, ms: int, stream: Stream = Stream.DOWNSTREAM) -> None:
        for proxy in self.proxies:
            proxy.timeout(ms, stream)

    def toxics(self) -> dict[str, list[Toxic]]:
        """Each proxy's toxics, by proxy name."""
        return {proxy.name: proxy.toxics() for proxy in self.proxies}


def _toxic(reply: dict[str, Any]) -> Toxic:
    return Toxic(reply["name"], reply["type"], Stream(reply["stream"]), reply["toxicity"], reply["attributes"])
