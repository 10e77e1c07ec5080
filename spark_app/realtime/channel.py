"""The report channel between a real-time job's driver and its copier tasks: framing and authenticating messages.

A message is a JSON value in one frame, a 4-byte big-endian length and then that many bytes of UTF-8 JSON: what a
peer sends is data, never code, and no Python class layout is part of the format. A frame whose header claims more
than MAX_FRAME_BYTES is refused before it is read.

A connection opens with a challenge each way on a key made for the job's run, which never goes over the wire: the
driver sends a random nonce, the task answers HMAC-SHA256(key, "task" + nonce) and a nonce of its own, and the
driver answers that with HMAC-SHA256(key, "driver" + nonce), so each side knows the other holds the key. The
handshake must end within HANDSHAKE_TIMEOUT_S, and the driver runs each one in its own thread
(spark_app.realtime.job), so a peer that connects and says nothing, or answers wrong, is dropped without holding up
the tasks that connect after it. After it, TCP keepalive ends a connection whose peer vanished without closing it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from types import TracebackType
from typing import Any

HANDSHAKE_TIMEOUT_S = 5.0  # a peer that has not proved it holds the key by then is dropped
# A task's first report has a landing for each of its partitions, with up to MAX_RUNS_PER_RANGE runs and as many
# echoes: about 5 KB each at most, so thousands of partitions fit.
MAX_FRAME_BYTES = 64 * 1024 * 1024
KEY_BYTES = NONCE_BYTES = 32
# A silent connection is probed after a minute, then every 10 s; six probes unanswered (two minutes in all) end it.
KEEPALIVE = {"TCP_KEEPIDLE": 60, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 6}
_DIGEST_BYTES = hashlib.sha256().digest_size
_HEADER = struct.Struct(">I")
# What each side's answer is for, so that one side's answer can never pass as the other's.
_TASK, _DRIVER = b"task", b"driver"


class ChannelError(ConnectionError):
    """A peer broke the channel's rules: it failed the handshake, or sent a frame too large or not JSON."""


def new_key() -> bytes:
    """A key for one job's run."""
    return os.urandom(KEY_BYTES)


class Channel:
    """One authenticated connection: JSON messages each way."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        sock.settimeout(None)  # after the handshake a task reports at its own pace, for as long as it runs
        # But a peer whose host is gone (a node lost, a cut network) sends no FIN: keepalive probes find it, so the
        # thread that reads it ends instead of waiting for the job's end.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in KEEPALIVE.items():
            if hasattr(socket, option):  # Linux names them all; elsewhere the system's defaults stand
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self.peer = peer
        self._sock = sock

    def send(self, message: object) -> None:
        payload = json.dumps(message, separators=(",", ":")).encode()
        if len(payload) > MAX_FRAME_BYTES:
            raise ChannelError(f"a message of {len(payload)} bytes is over the channel's limit of {MAX_FRAME_BYTES}")
        self._sock.sendall(_HEADER.pack(len(payload)) + payload)

    def recv(self) -> Any:
        """The next message, a JSON value; EOFError when the peer closed the connection."""
        (size,) = _HEADER.unpack(_read(self._sock, _HEADER.size))
        if size > MAX_FRAME_BYTES:
            raise ChannelError(f"{self.peer} sent a frame of {size} bytes, over the limit of {MAX_FRAME_BYTES}")
        try:
            return json.loads(_read(self._sock, size))
        except (ValueError, RecursionError):
            raise ChannelError(f"{self.peer} sent a frame that is not JSON") from None

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
        if not hmac.compare_digest(answer[:_DIGEST_BYTES], _mac(key, _TASK, nonce)):
            raise ChannelError(f"{peer} answered the challenge wrong: it is not one of this job's tasks")
        sock.sendall(_mac(key, _DRIVER, answer[_DIGEST_BYTES:]))
    except (EOFError, OSError) as err:
        sock.close()
        raise _failed(peer, err) from None
    return Channel(sock, peer)


def connect(address: tuple[str, int], key: bytes) -> Channel:
    """The task's side: connect to the driver and run the handshake within HANDSHAKE_TIMEOUT_S; ChannelError when
    the peer there does not prove it holds `key`."""
    peer = f"{address[0]}:{address[1]}"
    sock = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
    try:
        nonce = _read(sock, NONCE_BYTES, deadline)
        mine = os.urandom(NONCE_BYTES)
        sock.sendall(_mac(key, _TASK, nonce) + mine)
        if not hmac.compare_digest(_read(sock, _DIGEST_BYTES, deadline), _mac(key, _DRIVER, mine)):
            raise ChannelError(f"the driver at {peer} answered the challenge wrong")
    except (EOFError, OSError) as err:
        sock.close()
        raise _failed(peer, err) from None
    return Channel(sock, peer)


def _mac(key: bytes, side: bytes, nonce: bytes) -> bytes:
    return hmac.digest(key, side + nonce, "sha256")


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
