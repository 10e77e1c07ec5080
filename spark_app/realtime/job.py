"""A real-time flow's job: the Spark jobs of its copier slots, the driver's side of their report channel, and the
filing of what they report.

The driver runs the flow's `realtime_tasks` slots, each a Spark job of one task that holds a core for as long as the
flow runs: on the executor's JVM where that serves the flow (spark_app.realtime.jvm), going on with the slot's Python
task at an event it leaves to Python, else the Python task from the start. Each task connects back
(spark_app.realtime.task) over the report channel (spark_app.channel), gets its partitions from the newest
reports (a task Spark retries, or a slot handed back, resumes where its partitions' reports ended), and reports. Each
connection is served in its own thread from its handshake on, so a peer that is not one of the tasks holds up none of
them. Every `realtime_commit_interval_s` the job hands what it heard to `on_landed` (the flow's ledger), and once more
when the job ends.

The channel's key for the run comes from a secret no task carries (`channel_secret`, spark_app.channel).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable

from pyspark import SparkContext

from .. import channel
from ..channel import Channel
from ..clients import Partition
from ..config import STOP_BATCH_TIMEOUT_S, ClusterConfig, FlowConfig
from ..copy_wing.choice import Core, choose
from ..errors import MirrorFailed, first_cause
from ..ranges import Landing
from ..run_check import run_keys
from ..topics import TargetRules
from . import jvm
from .task import ON, OVER, REACHED, STARTED, STOP, Assignment, CopierTask, offsets_from_json

log = logging.getLogger(__name__)


class CopyJob:
    """One run of a real-time flow's tasks: the Spark job, the socket they report on, and the filing of reports.

    `on_landed` gets what the tasks reported, every `commit_interval_s` and once more when the job ends.
    """

    def __init__(
        self, spark: SparkContext, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig,
        assignment: Assignment, tasks: int, rules: TargetRules, commit_interval_s: float,
        on_landed: Callable[[list[Landing]], None],
    ) -> None:  # fmt: skip
        self.spark = spark
        self.flow = flow
        self.reached = dict(assignment.starts)  # per partition, where its newest report ended
        self._delivered: dict[Partition, int] = {}  # per partition, how far the tasks last said it reached the target
        self.error: str | None = None
        # Whether `error` would fail again at once, so the flow must stop: bad credentials, or a filing that failed
        # (the state cannot be saved, or records were lost under `fail_on_data_loss`). Else the tasks failed past
        # Spark's retries, and the flow's runner starts them again.
        self.terminal = False
        self._stops = assignment.stops
        self._ids = dict(assignment.ids)  # per topic, the life its positions belong to (a task checks it: exactly once)
        keys = sorted(assignment.starts)
        self._slots = [keys[i :: max(1, tasks)] for i in range(min(max(1, tasks), len(keys)))]
        self._held: set[Partition] = set()
        self._on_landed = on_landed
        self._commit_interval_s = commit_interval_s
        self._inbox: list[Landing] = []
        self._lock = threading.Lock()  # the fields above that tasks' reports change
        self._filing = threading.Lock()  # one filing at a time, in the order the reports came
        self._conns: list[Channel] = []
        self._serving: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._ended = threading.Event()  # the Spark job returned
        self._done = threading.Event()  # and its last reports are filed
        self._closed = False
        self._group = f"mirrorkit-realtime-{uuid.uuid4().hex[:8]}"
        # The report channel's key for this run (local mode: its secret in a file, removed when the job ends).
        self._keys = run_keys(spark, f"flow {flow.name}: real-time mode")
        self._key, source_of_key = self._keys.key, self._keys.source
        self._listener = channel.Listener()
        address = (spark.getConf().get("spark.driver.host") or "127.0.0.1", self._listener.port)
        log.info("flow %s: the copier tasks report on port %d", flow.name, self._listener.port)
        # The task carries where its executor finds the key, never the key (spark_app.channel).
        self._task = CopierTask(flow, source, target, address, source_of_key.encode(), rules)
        self._jvm_config = (
            jvm.SlotConfig.of(self._task, sorted({t for t, _ in assignment.starts})).dumps()
            if choose(flow, source, target).core is Core.JVM else None
        )  # fmt: skip

    def start(self) -> CopyJob:
        for target in (self._accept, self._run, self._file_every):
            threading.Thread(target=target, name=f"{self._group}-{target.__name__}", daemon=True).start()
        return self

    @property
    def tasks(self) -> int:
        return len(self._slots)

    def running(self) -> bool:
        return not self._done.is_set()

    def lag_positions(self) -> dict[Partition, int]:
        """Per partition, the first offset not yet on the target as the tasks last said, committed or not: between a
        transactional slot's commits (seconds apart) the landings say less, and restarts go from those."""
        with self._lock:
            return {key: max(offset, self._delivered.get(key, offset)) for key, offset in self.reached.items()}

    def note_ids(self, ids: dict[str, str]) -> None:
        """Topics filed in a new life while the job runs (every partition found gone backwards): a task Spark retries
        checks their records against the new id."""
        with self._lock:
            self._ids.update(ids)

    def held_any(self) -> bool:
        """Whether a task held a partition: its topic is quarantined, and its other partitions stop at a restart."""
        with self._lock:
            return bool(self._held)

    def wait(self) -> None:
        """Until every task has stopped (available-now: reached its stops) and its last reports are filed."""
        self._done.wait()

    def stop(self, timeout_s: float = STOP_BATCH_TIMEOUT_S) -> None:
        """Tell every task to stop, and wait for them to flush and report; past `timeout_s` cancel the job (what
        was in flight is copied again from the newest reports)."""
        self._stop_tasks()
        if not self._ended.wait(timeout_s):
            log.warning("flow %s: copier tasks did not stop within %.0f s; cancelling them", self.flow.name, timeout_s)
            self.spark.cancelJobGroup(self._group)
        self._done.wait()

    def _stop_tasks(self) -> None:
        self._stopping.set()
        with self._lock:
            for conn in self._conns:
                _send(conn, STOP)

    def _run(self) -> None:
        """Each slot as a Spark job of its own, until every one ended."""
        slots = [
            threading.Thread(target=self._run_slot, args=(slot,), name=f"{self._group}-slot-{slot}", daemon=True)
            for slot in range(len(self._slots))
        ]
        for thread in slots:
            thread.start()
        for thread in slots:
            thread.join()
        self._ended.set()
        self._finish()

    def _run_slot(self, slot: int) -> None:
        """One slot: on the executors' JVM where it serves the flow (spark_app.realtime.jvm), and with the Python task
        from where it handed the slot back, or from the start. A slot that fails past Spark's retries stops the
        others, and the job ends with its error."""
        sc = self.spark
        sc.setJobGroup(self._group, f"mirror {self.flow.name} (real time, slot {slot})", interruptOnCancel=True)
        try:
            if self._jvm_config is not None:
                if jvm.run_slot(self.spark, self._jvm_config, slot):
                    return
                log.info("flow %s: slot %d handed over to the Python loop by the JVM copier", self.flow.name, slot)
            if not self._stopping.is_set():
                sc.parallelize([slot], 1).mapPartitions(functools.partial(self._task, slot)).collect()
        except Exception as err:  # noqa: BLE001 - a failed slot is reported through `error`, in the mirror's words
            if self._stopping.is_set():
                return
            with self._lock:
                if self.error is None:
                    self.error = first_cause(str(err))
                    # A cause on the driver (no JVM copier to run) or bad credentials would fail again at once.
                    self.terminal = isinstance(err, MirrorFailed) or self.error.startswith("AuthenticationFailed")
            self._stop_tasks()

    def _finish(self) -> None:
        """After the job: take the tasks' last reports (each connection ends after its task's), file them, close."""
        with self._lock:
            serving = list(self._serving)
        for thread in serving:
            thread.join(30)
        self._closed = True
        self._listener.close()
        self._keys.close()
        self._file()
        self._done.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock = self._listener.accept()
            except OSError:  # closed (the job is over), or a connection that broke before it was accepted
                if not self._closed:
                    time.sleep(0.1)
                continue
            thread = threading.Thread(target=self._serve, args=(sock,), name=f"{self._group}-task", daemon=True)
            with self._lock:  # every connection gets a thread now, a port scanner's too: keep only the live ones
                self._serving = [t for t in self._serving if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        """One connection: its handshake, then the task's assignment (from the newest reports: a retried task
        resumes there), then its reports until it ends. A peer that breaks the channel's rules is dropped."""
        try:
            conn = channel.challenge(sock, self._key)
        except channel.ChannelError as err:
            _dropped(self.flow.name, err)
            return
        with conn:
            try:
                _hello, slot = conn.recv()
                with self._lock:
                    keys = [k for k in self._slots[slot] if k not in self._held]
                    stops = {k: self._stops[k] for k in keys} if self._stops is not None else None
                    for key in self._slots[slot]:  # a retried task copies again from its last landings
                        self._delivered.pop(key, None)
                    ids = {t: i for t, i in self._ids.items() if any(k[0] == t for k in keys)}
                    _send(conn, Assignment({k: self.reached[k] for k in keys}, stops, ids).to_json())
                    self._conns.append(conn)
                    if self._stopping.is_set():
                        _send(conn, STOP)
                while True:
                    kind, message = conn.recv()
                    if kind == STARTED:  # a task of a job that ended is a zombie: it must commit nothing
                        with self._lock:
                            _send(conn, OVER if self._ended.is_set() or self._closed else ON)
                        continue
                    if kind == REACHED:
                        with self._lock:
                            self._delivered.update(offsets_from_json(message))
                        continue
                    rows = [Landing.from_row(row) for row in message]
                    with self._lock:
                        for row in rows:
                            self.reached[(row.topic, row.partition)] = row.end_offset
                            if row.held_from >= 0:
                                self._held.add((row.topic, row.partition))
                        self._inbox.extend(rows)
            except channel.ChannelError as err:
                _dropped(self.flow.name, err)
            except (EOFError, OSError):  # the task ended, or died (Spark retries it)
                pass
            finally:
                with self._lock:
                    if conn in self._conns:
                        self._conns.remove(conn)

    def _file_every(self) -> None:
        while not self._done.wait(self._commit_interval_s):
            self._file()

    def _file(self) -> None:
        """Hand what the tasks reported to `on_landed`, in order. If that fails (a state file that cannot be saved,
        records lost at the source under `fail_on_data_loss`), the job stops with the error: its tasks would copy on
        with nothing saved."""
        with self._filing:
            with self._lock:
                rows, self._inbox = self._inbox, []
            if not rows:
                return
            try:
                self._on_landed(rows)
            except Exception as err:  # noqa: BLE001 - reported through `error`, which stops the mirror
                log.error("flow %s: filing what the copier tasks reported failed: %s", self.flow.name, err)
                self.error = self.error or f"filing what the copier tasks reported failed: {err}"
                self.terminal = True
                self._stop_tasks()


def _send(conn: Channel, message: object) -> None:
    """Send to a task that may have just ended: then there is no one left to tell."""
    with contextlib.suppress(OSError):
        conn.send(message)


def _dropped(flow: str, err: channel.ChannelError) -> None:
    log.warning("flow %s: dropped a connection to its copier tasks' report channel: %s", flow, err)
