"""Whether a copy task's run is still the one running: its driver answers, on the report channel's handshake.

A slot's transactional producer, started, fences every earlier attempt of the slot (spark_app.transactions), and a
mirror's start fences every slot id any run started. What neither can fence is a task of a dead run that starts its
producer only after the new run's fence: a Python worker paused, or slow to start, while its driver died and the next
one started. It would then hold the slot's newest epoch, copy its run's ranges beside the new run's copy of the same
partitions, and commit both records and positions: records copied twice under exactly once.

So an exactly-once slot, once its producer started, asks its driver whether the run is still on: it connects with
the run's key and passes the channel's handshake (spark_app.channel; the key is found where Spark keeps its
secret, never carried by the task), and the driver answers that its run goes on. A run whose driver is gone cannot
answer, and a new driver does not hold the old run's key: the task commits nothing. The order makes it whole: a run's
fence comes after its predecessor's driver is gone, so a task whose producer started after the fence finds its
driver gone, and one whose producer started before is fenced.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid
from dataclasses import dataclass

from pyspark import SparkContext

from . import channel
from .errors import MirrorFailed

log = logging.getLogger(__name__)

ON = {"run": "on"}  # what a driver answers a task of its run


@dataclass(frozen=True)
class RunKeys:
    """A run's channel key, where its tasks find it (`source`, carried by the tasks: not secret), and in local mode
    the folder holding the run's secret, removed by `close`."""

    key: bytes
    source: channel.KeySource
    folder: str | None

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def run_keys(spark: SparkContext, needs: str) -> RunKeys:
    """A new run's channel key: in local mode from a secret of the run's in a file only this user can read; with
    `spark.authenticate`, from Spark's own application secret, which Spark hands its executors itself. On a cluster
    without it nothing Spark protects reaches the executors: refused, saying `needs` it."""
    run = uuid.uuid4().hex
    master = spark.master or ""
    if master == "local" or master.startswith("local["):
        secret = channel.new_key()
        folder = tempfile.mkdtemp(prefix="mirrorkit-channel-")  # 0700
        path = os.path.join(folder, "secret")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(secret)
        return RunKeys(channel.run_key(secret, run), channel.KeySource(run, file=path), folder)
    if (spark.getConf().get("spark.authenticate", "false") or "").lower() != "true":
        raise MirrorFailed(
            f"{needs} on a Spark cluster ({master}) needs spark.authenticate=true: its tasks find the report channel's"
            " key through Spark's own secret, which Spark sends its executors only with authentication on (and"
            " spark.network.crypto.enabled=true encrypts what they say); the mirror's SparkApplication sets both"
        )
    secret = spark._jvm.org.apache.spark.SparkEnv.get().securityManager().getSecretKey()  # type: ignore[union-attr]
    files = [spark.getConf().get(f"spark.authenticate.secret{role}.file", None) for role in (".executor", "")]
    source = channel.KeySource(run, spark_secret_file=next((f for f in files if f), None))
    return RunKeys(channel.run_key(str(secret).encode(), run), source, None)


@dataclass(frozen=True)
class RunAddress:
    """Where a task asks whether its run is on, and where its executor finds the run's key: what the task carries."""

    host: str
    port: int
    key_source: bytes  # an encoded channel.KeySource


class RunWitness:
    """The driver's side: answers each task of its run that proves it holds the run's key, until closed."""

    def __init__(self, spark: SparkContext, needs: str) -> None:
        self._keys = run_keys(spark, needs)
        self._listener = channel.Listener()
        self._closed = threading.Event()
        host = spark.getConf().get("spark.driver.host") or "127.0.0.1"
        self.address = RunAddress(host, self._listener.port, self._keys.source.encode())
        threading.Thread(target=self._accept, name="mirrorkit-run-witness", daemon=True).start()

    def close(self) -> None:
        """The run is over: no task of it is answered from now on."""
        self._closed.set()
        self._listener.close()
        self._keys.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock = self._listener.accept()
            except OSError:  # closed, or a connection that broke before it was accepted
                continue
            threading.Thread(target=self._answer, args=(sock,), daemon=True).start()

    def _answer(self, sock: socket.socket) -> None:
        try:
            with channel.challenge(sock, self._keys.key) as conn:
                conn.send(ON)
        except (channel.ChannelError, OSError) as err:
            log.warning("run check: a peer was not answered: %s", err)


class RunGone(MirrorFailed):
    """A task's run is over: its driver does not answer as its run's. The task is a zombie and commits nothing."""


def confirm_run(address: RunAddress, what: str) -> None:
    """That the task's run is on (its driver answers, holding the run's key); RunGone, saying `what` stops, if not."""
    try:
        with channel.connect((address.host, address.port), address.key_source) as conn:
            answer = conn.recv()
    except (channel.ChannelError, OSError, EOFError) as err:
        raise RunGone(f"{what}: its run's driver at {address.host}:{address.port} does not answer ({err}): a task"
                      " of a run that is over, it commits nothing") from None  # fmt: skip
    if answer != ON:
        raise RunGone(f"{what}: its run's driver answered {answer!r}: it commits nothing")
