"""The channel between a run's driver and its tasks (real-time reports, the run check): framing and authenticating.

A message is a JSON value in one frame: a 4-byte big-endian length, that many bytes of UTF-8 JSON, and a MAC. What a
peer sends is data, never code, and no Python class layout is part of the format. A frame whose header claims more
than MAX_FRAME_BYTES is refused before it is read.

The key. Each job's run has a channel key, derived (HMAC-SHA256, RULES.key_label) from a secret and the run's id; the
secret never travels with the tasks. The task closure carries only a `KeySource`: the run's id and where an
executor finds the secret, which Spark itself keeps:
- with `spark.authenticate` (Kubernetes, standalone, YARN) the secret is Spark's own application secret: the driver
  reads it from its SecurityManager, an executor from the `_SPARK_AUTH_SECRET` variable Spark sets in its environment
  (its Python workers inherit it) or from the file `spark.authenticate.secret.executor.file` names, and the JVM copier
  from its SecurityManager; Spark sends it to the executors itself, never in a task;
- in local mode the executors are threads of the driver's JVM and its Python workers are its children, on the same
  host as the same user, where Spark's secret does not reach a Python worker: the driver writes a random secret for
  the run into a file only its user can read, in a folder of its own, and removes both when the run ends.
On a cluster without `spark.authenticate` nothing Spark protects reaches the executors (nor is Spark's own channel
authenticated), so a real-time flow there is refused (spark_app.realtime.job).

A connection opens with a challenge each way on the run's key: the driver sends a random nonce, the task answers
HMAC-SHA256(key, "task" + nonce) and a nonce of its own, and the driver answers that with HMAC-SHA256(key, "driver" +
nonce), so each side knows the other holds the key. Both then derive the connection's session key, HMAC-SHA256(key,
session label + driver's nonce + task's nonce), and every frame after that carries HMAC-SHA256(session key, the
direction's label + the frame's sequence number in its direction (8 bytes, big-endian, from 0) + length + payload).
So a frame cannot be forged, replayed (in this connection or another), reordered, or sent back to its sender; the
first frame that fails ends the connection. The labels, sizes and limits are `RULES`, which the JVM copier reads from
its slot config (spark_app.realtime.jvm), never from constants of its own.

The handshake must end within HANDSHAKE_TIMEOUT_S, and the driver runs each one in its own thread
(spark_app.realtime.job), so a peer that connects and says nothing, or answers wrong, is dropped without holding up
the tasks that connect after it. After it, TCP keepalive ends a connection whose peer vanished without closing it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

HANDSHAKE_TIMEOUT_S = 5.0  # a peer that has not proved it holds the key by then is dropped
# A task's first report has a landing for each of its partitions, with up to MAX_RUNS_PER_RANGE runs and as many
# echoes: about 5 KB each at most, so thousands of partitions fit.
MAX_FRAME_BYTES = 64 * 1024 * 1024
KEY_BYTES = NONCE_BYTES = 32
# A silent connection is probed after a minute, then every 10 s; six probes unanswered (two minutes in all) end it.
KEEPALIVE = {"TCP_KEEPIDLE": 60, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 6}
# Where Spark puts its application secret in an executor's environment when `spark.authenticate` is on
# (SecurityManager.ENV_AUTH_SECRET); an executor's Python workers inherit the executor's environment.
SPARK_SECRET_ENV = "_SPARK_AUTH_SECRET"
_DIGEST_BYTES = hashlib.sha256().digest_size
_HEADER = struct.Struct(">I")
_SEQUENCE = struct.Struct(">Q")


@dataclass(frozen=True)
class ChannelRules:
    """The channel's wire rules, which both languages obey: built here, handed to the JVM copier in its slot config
    as JSON, which it reads by field name (tests/test_jvm_copier.py holds it to them)."""

    nonce_bytes: int = NONCE_BYTES
    mac_bytes: int = _DIGEST_BYTES
    max_frame_bytes: int = MAX_FRAME_BYTES
    handshake_timeout_ms: int = round(HANDSHAKE_TIMEOUT_S * 1000)
    # What each side's answer to the challenge is for, so that one side's answer can never pass as the other's.
    task_label: str = "task"
    driver_label: str = "driver"
    key_label: str = "mirrorkit report channel key"  # the run's key, from the secret and the run's id
    session_label: str = "mirrorkit report channel session"  # a connection's key, from the run's key and the nonces
    # Each direction's frames are MAC'd with its own label, so a frame cannot be sent back to its sender.
    to_driver_label: str = "to driver"
    to_task_label: str = "to task"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


RULES = ChannelRules()


class ChannelError(ConnectionError):
    """A peer broke the channel's rules: it failed the handshake, or sent a frame too large, not authentic or not
    JSON."""


def new_key() -> bytes:
    """A random secret: a local-mode run's, or a test's."""
    return os.urandom(KEY_BYTES)


def run_key(secret: bytes, run: str) -> bytes:
    """The channel key of the run `run`, from `secret`."""
    return hmac.digest(secret, RULES.key_label.encode() + run.encode(), "sha256")


@dataclass(frozen=True)
class KeySource:
    """What a task carries in place of the run's key: the run's id and where the executor finds the secret. None of
    it is secret."""

    run: str
    # Local mode: the file holding the run's secret, readable by the driver's user alone. None: Spark's own secret.
    file: str | None = None
    # Spark's secret from a file (`spark.authenticate.secret.executor.file`) where Spark sets no variable for it.
    spark_secret_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> KeySource:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            raise ChannelError("a task's key source is not one a job made") from None

    def key(self) -> bytes:
        """The run's key, found where an executor finds the secret; ChannelError (never naming the secret) when it is
        not there."""
        return run_key(self.secret(), self.run)

    def secret(self) -> bytes:
        if self.file is not None:
            try:
                return Path(self.file).read_bytes()
            except OSError as err:
                raise ChannelError(
                    f"the report channel's secret is not readable at {self.file}: {err.strerror}"
                ) from None
        if (spark := os.environ.get(SPARK_SECRET_ENV)) is not None:
            return spark.encode()
        if self.spark_secret_file is not None:  # as Spark's SecurityManager reads it: the file's bytes, in base64
            try:
                return base64.b64encode(Path(self.spark_secret_file).read_bytes())
            except OSError as err:
                raise ChannelError(
                    f"Spark's secret is not readable at {self.spark_secret_file}: {err.strerror}"
                ) from None
        raise ChannelError(f"Spark's secret is not in this executor's environment ({SPARK_SECRET_ENV})")


class Channel:
    """One authenticated connection: JSON messages each way, each frame MAC'd under the connection's session key."""

    def __init__(self, sock: socket.socket, peer: str, session: bytes, sends: str, receives: str) -> None:
        sock.settimeout(None)  # after the handshake a task reports at its own pace, for as long as it runs
        # But a peer whose host is gone (a node lost, a cut network) sends no FIN: keepalive probes find it, so the
        # thread that reads it ends instead of waiting for the job's end.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in KEEPALIVE.items():
            if hasattr(socket, option):  # Linux names them all; elsewhere the system's defaults stand
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self.peer = peer
        self._sock = sock
        self._session = session
        self._sends, self._receives = sends.encode(), receives.encode()
        self._sent = self._received = 0  # each direction's sequence number: the next frame's
        self._sending = threading.Lock()  # one frame at a time, numbered in the order it goes out

    def send(self, message: object) -> None:
        payload = json.dumps(message, separators=(",", ":")).encode()
        if len(payload) > MAX_FRAME_BYTES:
            raise ChannelError(f"a message of {len(payload)} bytes is over the channel's limit of {MAX_FRAME_BYTES}")
        self._send_frame(payload)

    def _send_frame(self, payload: bytes) -> None:
        with self._sending:
            frame = _HEADER.pack(len(payload)) + payload
            self._sock.sendall(frame + self._mac(self._sends, self._sent, frame))
            self._sent += 1

    def recv(self) -> Any:
        """The next message, a JSON value; EOFError when the peer closed the connection, ChannelError when its frame
        is too large, not authentic (forged, replayed, reordered or sent back) or not JSON."""
        header = _read(self._sock, _HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME_BYTES:
            raise ChannelError(f"{self.peer} sent a frame of {size} bytes, over the limit of {MAX_FRAME_BYTES}")
        body = _read(self._sock, size + _DIGEST_BYTES)
        payload, mac = body[:size], body[size:]
        if not hmac.compare_digest(mac, self._mac(self._receives, self._received, header + payload)):
            raise ChannelError(
                f"{self.peer} sent a frame that failed authentication (frame {self._received} of the connection):"
                " forged, replayed or reordered"
            )
        self._received += 1
        try:
            return json.loads(payload)
        except (ValueError, RecursionError):
            raise ChannelError(f"{self.peer} sent a frame that is not JSON") from None

    def _mac(self, label: bytes, sequence: int, frame: bytes) -> bytes:
        return hmac.digest(self._session, label + _SEQUENCE.pack(sequence) + frame, "sha256")

    def poll(self) -> bool:
        """Whether a message, or the end of the connection, is waiting to be read."""
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _traceback: TracebackType | None
    ) -> None:
        self.close()


class Listener:
    """The driver's listening socket, on every interface and a free port. `accept` reads nothing from the peer:
    `challenge` does, where a peer that never answers holds up no one else."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("0.0.0.0", 0), backlog=64)
        self.port: int = self._sock.getsockname()[1]

    def accept(self) -> socket.socket:
        return self._sock.accept()[0]

    def close(self) -> None:
        """Stop listening; an `accept` waiting in another thread raises OSError (closing alone does not wake it)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def challenge(sock: socket.socket, key: bytes) -> Channel:
    """The driver's side of the handshake on a connection just accepted. A peer that does not prove within
    HANDSHAKE_TIMEOUT_S that it holds `key` is closed, and ChannelError says why."""
    peer = _peer(sock)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    try:
        nonce = os.urandom(NONCE_BYTES)
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        sock.sendall(nonce)
        answer = _read(sock, _DIGEST_BYTES + NONCE_BYTES, deadline)
        if not hmac.compare_digest(answer[:_DIGEST_BYTES], _mac(key, RULES.task_label, nonce)):
            raise ChannelError(f"{peer} answered the challenge wrong: it is not one of this job's tasks")
        theirs = answer[_DIGEST_BYTES:]
        sock.sendall(_mac(key, RULES.driver_label, theirs))
    except (EOFError, OSError) as err:
        sock.close()
        raise _failed(peer, err) from None
    return Channel(sock, peer, _session(key, nonce, theirs), RULES.to_task_label, RULES.to_driver_label)


def connect(address: tuple[str, int], source: bytes) -> Channel:
    """The task's side: find the run's key where `source` (a `KeySource`, encoded) says, connect to the driver and
    run the handshake within HANDSHAKE_TIMEOUT_S; ChannelError when the key cannot be found or the peer there does
    not prove it holds it."""
    return connect_with(address, KeySource.decode(source).key())


def connect_with(address: tuple[str, int], key: bytes) -> Channel:
    """The task's side, with the run's key in hand."""
    peer = f"{address[0]}:{address[1]}"
    sock = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    try:
        nonce = _read(sock, NONCE_BYTES, deadline)
        mine = os.urandom(NONCE_BYTES)
        sock.sendall(_mac(key, RULES.task_label, nonce) + mine)
        if not hmac.compare_digest(_read(sock, _DIGEST_BYTES, deadline), _mac(key, RULES.driver_label, mine)):
            raise ChannelError(f"the driver at {peer} answered the challenge wrong")
    except (EOFError, OSError) as err:
        sock.close()
        raise _failed(peer, err) from None
    return Channel(sock, peer, _session(key, nonce, mine), RULES.to_driver_label, RULES.to_task_label)


def _mac(key: bytes, side: str, nonce: bytes) -> bytes:
    return hmac.digest(key, side.encode() + nonce, "sha256")


def _session(key: bytes, drivers: bytes, tasks: bytes) -> bytes:
    """A connection's session key: fresh for each connection, since both sides' nonces are."""
    return hmac.digest(key, RULES.session_label.encode() + drivers + tasks, "sha256")


def _read(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """Exactly `size` bytes: EOFError if the peer closes first, TimeoutError past `deadline`."""
    data = bytearray()
    while len(data) < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:  # gone already
        return "a peer"
    return f"{host}:{port}"


def _failed(peer: str, err: BaseException) -> ChannelError:
    """Why a handshake failed, in words that name the peer and never the key."""
    if isinstance(err, ChannelError):
        return err
    if isinstance(err, TimeoutError):
        return ChannelError(f"{peer} did not finish the handshake within {HANDSHAKE_TIMEOUT_S:g} s")
    if isinstance(err, EOFError):
        return ChannelError(f"{peer} closed the connection during the handshake")
    return ChannelError(f"the connection with {peer} broke during the handshake: {err}")
