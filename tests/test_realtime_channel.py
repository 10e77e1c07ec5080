"""The real-time report channel serves the job's tasks whatever else reaches its port: a peer that connects and says
nothing, answers the challenge with the wrong key, claims a gigabyte frame or sends a pickle is dropped and logged
(never with the key) and holds up no task; a man in the middle who forges, replays or reflects a frame on a live
connection moves no position and stops no task; the task closure carries no key; and an assignment, landings and how
far the tasks reached between commits cross it exactly.

No Spark: the job runs on a stand-in session whose Spark job is the test's own connections, made as a task makes them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import pickle
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

from spark_app import channel
from spark_app.config import ClusterConfig, FlowConfig, TopicSelection
from spark_app.errors import MirrorFailed
from spark_app.ranges import Landing
from spark_app.realtime.job import CopyJob
from spark_app.realtime.task import DONE, LANDED, REACHED, STOP, Assignment, CopierTask, hello, offsets_to_json
from spark_app.topics import TargetRules

SOURCE = ClusterConfig(alias="a", bootstrap_servers="127.0.0.1:9", profile="kafka")
TARGET = ClusterConfig(alias="b", bootstrap_servers="127.0.0.1:9", profile="kafka")
FLOW = FlowConfig(source="a", target="b", topics=TopicSelection(include=["t"]), checkpoint_location="/tmp/x")
# Two tasks: slot 0 copies ("a", 0) and ("b", 0), slot 1 copies ("a", 1).
STARTS = {("a", 0): 10, ("a", 1): 11, ("b", 0): 20}
WAIT_S = 30  # a bound for what must happen, so a broken channel fails the test instead of hanging it

pytestmark = pytest.mark.timeout(120)


class StandInSpark:
    """Just enough of a SparkContext for a CopyJob: each slot's Spark job hands the test the task, and runs until
    `end`."""

    def __init__(self, master: str = "local[2]", conf: dict[str, str] | None = None, secret: str | None = None):
        settings = {"spark.driver.host": "127.0.0.1"} | (conf or {})
        conf = SimpleNamespace(get=lambda key, default=None: settings.get(key, default))
        self.getConf = lambda: conf
        self.master = master
        # The driver's SecurityManager, as py4j shows it: where a cluster's job finds Spark's secret.
        security = SimpleNamespace(getSecretKey=lambda: secret)
        env = SimpleNamespace(get=lambda: SimpleNamespace(securityManager=lambda: security))
        self._jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(SparkEnv=env))))
        self.tasks: queue.Queue[CopierTask] = queue.Queue()
        self._ended = threading.Event()

    def setJobGroup(self, *_args: object, **_kwargs: object) -> None:
        pass

    def parallelize(self, *_args: object) -> StandInSpark:
        return self

    def mapPartitions(self, slot_task: functools.partial[Iterator[int]]) -> StandInSpark:
        self.tasks.put(slot_task.func)  # a slot's job: its CopierTask, given the slot
        return self

    def collect(self) -> list[int]:
        self._ended.wait()
        return []

    def cancelJobGroup(self, _group: str) -> None:
        self.end()

    def end(self) -> None:
        self._ended.set()


@pytest.fixture
def start_job() -> Iterator[Callable[..., SimpleNamespace]]:
    """Start a CopyJob on a stand-in Spark; its task (address and key) and what it filed come back with it."""
    started: list[SimpleNamespace] = []

    def start(
        assignment: Assignment | None = None, tasks: int = 2, spark: StandInSpark | None = None
    ) -> SimpleNamespace:
        spark = spark or StandInSpark()
        filed: list[Landing] = []
        assignment = assignment or Assignment(STARTS, None)
        job = CopyJob(spark, FLOW, SOURCE, TARGET, assignment, tasks, TargetRules(), 3600, filed.extend).start()
        started.append(SimpleNamespace(job=job, spark=spark, task=spark.tasks.get(timeout=WAIT_S), filed=filed))
        return started[-1]

    yield start
    for run in started:
        run.spark.end()
        run.job.stop()


def eventually(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def raw_frame(conn: channel.Channel, header: bytes, payload: bytes | None = None) -> bytes:
    """Send a header alone past the channel's framing, or a payload framed and MAC'd as the channel does but not
    JSON-encoded; return all the driver sends back before it closes."""
    sock = conn._sock
    if payload is None:
        sock.sendall(header)
    else:
        conn._send_frame(payload)
    sock.settimeout(WAIT_S)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_a_peer_that_connects_and_says_nothing_does_not_keep_a_task_from_its_assignment(start_job, caplog):
    caplog.set_level(logging.INFO)
    run = start_job()
    with socket.create_connection(run.task.address) as silent:
        with channel.connect(run.task.address, run.task.key) as conn:
            assert hello(conn, 1) == Assignment({("a", 1): 11}, None)
        # The silent peer got its challenge, and is dropped once the handshake's time is up.
        silent.settimeout(WAIT_S)
        assert len(silent.recv(64)) == channel.NONCE_BYTES
        assert silent.recv(64) == b""
    eventually(lambda: "did not finish the handshake" in caplog.text)


def test_a_peer_with_the_wrong_key_is_refused_and_the_key_never_appears_in_the_log(start_job, caplog):
    caplog.set_level(logging.DEBUG)
    run = start_job()
    with pytest.raises(channel.ChannelError) as refused:
        channel.connect_with(run.task.address, channel.new_key())
    eventually(lambda: "answered the challenge wrong" in caplog.text)
    said = caplog.text + str(refused.value)
    for key in (run.job._key, secret_of(run)):
        for spelling in spellings(key):
            assert spelling not in said
    with channel.connect(run.task.address, run.task.key) as conn:  # the job's tasks are still served
        assert hello(conn, 0) == Assignment({("a", 0): 10, ("b", 0): 20}, None)


def test_a_task_refuses_a_driver_that_cannot_prove_it_holds_the_key():
    with socket.create_server(("127.0.0.1", 0)) as server:

        def pretend() -> None:
            sock, _ = server.accept()
            with sock:
                sock.sendall(os.urandom(channel.NONCE_BYTES))
                sock.recv(64)
                sock.sendall(os.urandom(32))  # no key, so no right answer to the task's nonce
                sock.recv(1)

        threading.Thread(target=pretend, daemon=True).start()
        with pytest.raises(channel.ChannelError, match="answered the challenge wrong"):
            channel.connect_with(server.getsockname(), channel.new_key())


def test_a_frame_header_claiming_a_gigabyte_is_refused_unread_and_its_peer_dropped(start_job, caplog):
    run = start_job()
    with channel.connect(run.task.address, run.task.key) as conn:
        assert raw_frame(conn, struct.pack(">I", 1 << 30)) == b""  # closed, with no assignment
    eventually(lambda: f"frame of {1 << 30} bytes, over the limit" in caplog.text)


RAN = threading.Event()


def _ran() -> None:
    RAN.set()


class Payload:
    """Unpickling this runs `_ran`: a pickle is code."""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _ran, ()


def test_a_pickle_is_refused_as_not_json_and_never_unpickled(start_job, caplog):
    run = start_job()
    payload = pickle.dumps([Payload(), 0])
    with channel.connect(run.task.address, run.task.key) as conn:
        assert raw_frame(conn, b"", payload) == b""
    eventually(lambda: "sent a frame that is not JSON" in caplog.text)
    assert not RAN.is_set()


def test_an_assignment_and_landings_cross_the_channel_exactly_and_are_filed_in_order_after_stop(start_job):
    """Between a slot's commits it says how far it reached: that moves the lag gauge's positions, never the positions
    a retried task restarts from, which only landings (committed) move."""
    starts = {("tópico.ü", 0): 5, ("t", 3): 2**40, ("t", 12): 0}
    assignment = Assignment(starts, {key: offset + 7 for key, offset in starts.items()})
    run = start_job(assignment, tasks=1)
    landed = Landing(
        "tópico.ü", 0, 5, 9, last_offset=8, last_target_offset=2**40 + 3, records=3, bytes=4_096, dropped=1,
        latency_counts=[0, 2, 1] + [0] * 13, latency_sum_ms=0.1 + 0.2, runs=[[5, 100, 6], [8, 2**40 + 3, 8]],
        echoes=[[7, 55, 7]],
    )  # fmt: skip
    held = Landing("t", 3, 2**40, 2**40 + 2, held_from=2**40 + 2, held_until=2**40 + 2, refused_bytes=2_000_001)
    done = Landing("t", 12, 0, 0, held_error='target: topic "t" refused: TOPIC_AUTHORIZATION_FAILED', reset_from=3)
    with channel.connect(run.task.address, run.task.key) as conn:
        assert hello(conn, 0) == assignment
        conn.send([REACHED, offsets_to_json({("t", 3): 2**40 + 1, ("t", 12): 4})])
        eventually(lambda: run.job.lag_positions() == starts | {("t", 3): 2**40 + 1, ("t", 12): 4})
        assert run.job.reached == starts
        conn.send([LANDED, [landed.to_row(), held.to_row()]])
        stopping = threading.Thread(target=run.job.stop)
        stopping.start()
        assert conn.recv() == STOP
        conn.send([DONE, [done.to_row()]])
    run.spark.end()  # the task returned: the Spark job ends
    stopping.join(WAIT_S)
    assert run.filed == [landed, held, done]
    assert run.job.reached == {("tópico.ü", 0): 9, ("t", 3): 2**40 + 2, ("t", 12): 0}
    assert run.job.lag_positions() == {("tópico.ü", 0): 9, ("t", 3): 2**40 + 2, ("t", 12): 4}
    assert run.job.held_any()


def test_a_retried_task_shows_lag_from_the_last_landings_again_not_from_where_its_dead_attempt_reached(start_job):
    run = start_job(tasks=1)
    with channel.connect(run.task.address, run.task.key) as dead:
        hello(dead, 0)
        dead.send([REACHED, offsets_to_json({("a", 0): 500, ("b", 0): 700})])
        eventually(lambda: run.job.lag_positions() == STARTS | {("a", 0): 500, ("b", 0): 700})
    with channel.connect(run.task.address, run.task.key) as retried:
        assert hello(retried, 0) == Assignment(STARTS, None)
        assert run.job.lag_positions() == STARTS


def test_both_ends_of_a_channel_probe_a_silent_peer_so_a_vanished_one_ends_its_reader():
    """A task on a node that is lost sends no FIN: without keepalive its reader would wait for the job's end."""
    key, listener = channel.new_key(), channel.Listener()
    accepted: list[channel.Channel] = []
    threading.Thread(target=lambda: accepted.append(channel.challenge(listener.accept(), key)), daemon=True).start()
    try:
        with channel.connect_with(("127.0.0.1", listener.port), key) as task_end:
            deadline = time.monotonic() + 5
            while not accepted and time.monotonic() < deadline:
                time.sleep(0.01)
            for end in (task_end, accepted[0]):
                sock = end._sock
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == channel.KEEPALIVE["TCP_KEEPIDLE"]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == channel.KEEPALIVE["TCP_KEEPCNT"]
            accepted[0].close()
    finally:
        listener.close()


def spellings(secret: bytes) -> list[str]:
    """The ways a secret could show in a log or an error."""
    return [
        secret.hex(),
        secret.hex().upper(),
        repr(secret),
        base64.b64encode(secret).decode(),
        secret.decode("latin-1"),
    ]


def secret_of(run: SimpleNamespace) -> bytes:
    """The local-mode run's secret, from the file its tasks are told of."""
    source = channel.KeySource.decode(run.task.key)
    assert source.file is not None
    with open(source.file, "rb") as file:
        return file.read()


class Relay:
    """A man in the middle on the report channel: it passes every byte between one task and the driver, keeps what
    the task sent, and puts bytes of its own into either direction between frames."""

    def __init__(self, driver: tuple[str, int]) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._server.getsockname()
        self._driver = driver
        self.from_task = bytearray()
        self._ends: dict[str, socket.socket] = {}
        self._ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        task, _ = self._server.accept()
        driver = socket.create_connection(self._driver)
        self._ends = {"task": task, "driver": driver}
        self._ready.set()
        threading.Thread(target=self._pump, args=(task, driver, self.from_task), daemon=True).start()
        threading.Thread(target=self._pump, args=(driver, task, bytearray()), daemon=True).start()

    @staticmethod
    def _pump(reader: socket.socket, writer: socket.socket, kept: bytearray) -> None:
        with contextlib.suppress(OSError):
            while chunk := reader.recv(65536):
                kept += chunk
                writer.sendall(chunk)
        with contextlib.suppress(OSError):
            writer.shutdown(socket.SHUT_WR)

    def inject(self, to: str, data: bytes) -> None:
        assert self._ready.wait(WAIT_S)
        self._ends[to].sendall(data)

    def close(self) -> None:
        for sock in (self._server, *self._ends.values()):
            sock.close()


def forged(message: object) -> bytes:
    """A frame as a man in the middle makes it: the message, and a guess at its MAC (no key, no better guess)."""
    payload = json.dumps(message).encode()
    return struct.pack(">I", len(payload)) + payload + b"\xff" * 32


def frames(stream: bytes) -> list[bytes]:
    """What a task sent, frame by frame (each with its MAC), after its answer to the challenge."""
    out, at = [], channel.RULES.mac_bytes + channel.RULES.nonce_bytes
    while at < len(stream):
        (size,) = struct.unpack(">I", stream[at : at + 4])
        end = at + 4 + size + channel.RULES.mac_bytes
        out.append(stream[at:end])
        at = end
    return out


def test_a_forged_landing_and_a_forged_stop_on_a_live_channel_are_refused_and_no_position_moves(start_job, caplog):
    """A LANDED row forged into a live connection would move a partition's position past records never copied (a
    skip); a STOP forged toward a task would stop it. Each is dropped, with its connection, and logged."""
    run = start_job()
    relay = Relay(run.task.address)
    try:
        with channel.connect(relay.address, run.task.key) as conn:
            assert hello(conn, 0) == Assignment({("a", 0): 10, ("b", 0): 20}, None)
            skip = Landing("a", 0, 10, 5_000, last_offset=4_999, records=1)
            relay.inject("driver", forged([LANDED, [skip.to_row()]]))
            with pytest.raises(EOFError):  # the driver dropped the connection the frame came on
                conn.recv()
        assert run.job.reached == STARTS
        assert run.job.lag_positions() == STARTS
        eventually(lambda: "failed authentication" in caplog.text)
    finally:
        relay.close()
    relay = Relay(run.task.address)
    try:
        with channel.connect(relay.address, run.task.key) as conn:
            assert hello(conn, 1) == Assignment({("a", 1): 11}, None)
            relay.inject("task", forged(STOP))
            with pytest.raises(channel.ChannelError, match="failed authentication"):
                conn.recv()
    finally:
        relay.close()
    with channel.connect(run.task.address, run.task.key) as conn:  # the job's tasks are still served
        assert hello(conn, 1) == Assignment({("a", 1): 11}, None)
    secret = secret_of(run)
    run.spark.end()
    run.job.stop()
    assert run.filed == []
    assert run.job.reached == STARTS
    for key in (run.job._key, secret):
        for spelling in spellings(key):
            assert spelling not in caplog.text


def test_a_landing_replayed_or_a_frame_sent_back_on_a_live_channel_is_refused(start_job, caplog):
    """A task's own earlier frame, replayed after a newer one, would move its partition back (copies again); a frame
    of the driver's sent back to it is not the task's. Both fail the frame's MAC: a sequence number and a direction
    are in it."""
    run = start_job(tasks=1)
    relay = Relay(run.task.address)
    try:
        with channel.connect(relay.address, run.task.key) as conn:
            hello(conn, 0)
            conn.send([LANDED, [Landing("a", 0, 10, 15).to_row()]])
            conn.send([LANDED, [Landing("a", 0, 15, 20).to_row()]])
            eventually(lambda: run.job.reached[("a", 0)] == 20)
            eventually(lambda: len(frames(bytes(relay.from_task))) == 3)
            relay.inject("driver", frames(bytes(relay.from_task))[1])  # the landing up to 15, again
            with pytest.raises(EOFError):
                conn.recv()
        assert run.job.reached[("a", 0)] == 20
        eventually(lambda: "failed authentication" in caplog.text)
    finally:
        relay.close()
    relay = Relay(run.task.address)
    try:
        with channel.connect(relay.address, run.task.key) as conn:
            hello(conn, 0)
            eventually(lambda: len(frames(bytes(relay.from_task))) == 1)
            relay.inject("task", frames(bytes(relay.from_task))[0])  # the task's HELLO, back to it
            with pytest.raises(channel.ChannelError, match="failed authentication"):
                conn.recv()
    finally:
        relay.close()


def test_the_task_closure_carries_no_key_and_a_local_runs_secret_is_its_users_alone_and_gone_after(start_job):
    run = start_job()
    closure = pickle.dumps(run.task)
    secret = secret_of(run)
    for key in (run.job._key, secret):
        assert key not in closure
        for spelling in spellings(key):
            assert spelling.encode() not in closure
    source = channel.KeySource.decode(run.task.key)
    assert source.file is not None
    assert os.stat(source.file).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(source.file)).st_mode & 0o777 == 0o700
    assert source.key() == run.job._key
    run.spark.end()
    run.job.stop()
    assert not os.path.exists(os.path.dirname(source.file))


def test_on_a_cluster_the_key_comes_from_sparks_own_secret_where_an_executor_finds_it(start_job, monkeypatch, tmp_path):
    spark_secret = "5f" * 32  # as Spark's SecurityManager makes one: hex text
    cluster = StandInSpark("spark://127.0.0.1:7077", {"spark.authenticate": "true"}, secret=spark_secret)
    run = start_job(spark=cluster)
    source = channel.KeySource.decode(run.task.key)
    assert source == channel.KeySource(source.run)  # no file: the executor's own Spark has the secret
    assert spark_secret.encode() not in pickle.dumps(run.task)
    with pytest.raises(channel.ChannelError, match="not in this executor's environment"):
        source.key()
    monkeypatch.setenv(channel.SPARK_SECRET_ENV, spark_secret)  # what Spark sets in an executor's environment
    with channel.connect(run.task.address, run.task.key) as conn:
        assert hello(conn, 1) == Assignment({("a", 1): 11}, None)
    # Spark's secret from a file (spark.authenticate.secret.executor.file), as Spark reads it: its bytes in base64.
    raw = os.urandom(32)
    (tmp_path / "secret").write_bytes(raw)
    filed = StandInSpark(
        "k8s://https://127.0.0.1:6443",
        {"spark.authenticate": "true", "spark.authenticate.secret.executor.file": str(tmp_path / "secret")},
        secret=base64.b64encode(raw).decode(),
    )
    monkeypatch.delenv(channel.SPARK_SECRET_ENV)
    run = start_job(spark=filed)
    with channel.connect(run.task.address, run.task.key) as conn:
        assert hello(conn, 1) == Assignment({("a", 1): 11}, None)


def test_a_real_time_job_on_a_cluster_without_spark_authentication_is_refused():
    with pytest.raises(MirrorFailed, match="needs spark.authenticate=true"):
        CopyJob(StandInSpark("spark://127.0.0.1:7077"), FLOW, SOURCE, TARGET, Assignment(STARTS, None), 2,
                TargetRules(), 3600, lambda _rows: None)  # fmt: skip
