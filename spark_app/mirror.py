"""The mirror: every flow of a config in one Spark application, its run loop, and how it stops.

Each flow runs in its mode: `throughput` as micro-batches (spark_app.throughput), `realtime` as long-running copier
tasks (spark_app.realtime). Both are runners (spark_app.runner) with the same face: start, stop, wait, failure,
catch-up.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyspark
from confluent_kafka import KafkaError, KafkaException
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import ensure_callback_server_started

from . import range_copy
from .config import SPARK_DEFAULTS, STOP_BATCH_TIMEOUT_S, FlowMode, MirrorConfig, cores_needed, spark_jvm_conf
from .copy_wing.choice import choices
from .dr.service import DrSync
from .errors import ClusterUnreachable, MirrorFailed, first_cause
from .metrics import LagPoller, MirrorMetrics
from .planner import UNREACHABLE_GIVE_UP_S
from .realtime import jvm
from .realtime.flow import RealtimeRunner
from .runner import FlowRunner, Subscription
from .throughput import ThroughputRunner

log = logging.getLogger(__name__)

# A stop waits STOP_BATCH_TIMEOUT_S for each flow's batch in flight, then cancels it; one still running well past
# that has each Python thread's stack dumped, within the pod's STOP_GRACE_S.
STOP_DUMP_S = STOP_BATCH_TIMEOUT_S + 30
FIRST_SYNC_RETRY_S = 2.0  # between tries of a flow's first topic sync that failed for a moment


def start_spark(master: str | None = None, app_name: str = "mirrorkit") -> SparkContext:
    """The Spark `run` uses; spark-submit's own settings win inside the image. Given a master, this process starts
    the JVM itself, with the mirror's JVM options (inside the image, infra's SparkApplication sets them).

    A SparkContext, not a SparkSession: the mirror runs plain jobs, and a session's SQL state took 0.6-1.0 s of every
    start (bench/results/JOURNAL.md)."""
    conf = SparkConf().setAppName(app_name)
    # Spark's console progress bar would draw over the mirror's own progress line (spark_app.progress).
    conf.set("spark.ui.showConsoleProgress", "false")
    if master:
        # PYSPARK_SUBMIT_ARGS, which pyspark hands spark-submit, may set a default otherwise (`--conf key=value`).
        submitted = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
        defaults = [(key, value) for key, value in SPARK_DEFAULTS.items() if f"{key}=" not in submitted]
        conf.setMaster(master).setAll([*spark_jvm_conf(spark_home()).items(), *defaults])
        if jars := jvm.local_jars():  # the real-time JVM copier, as set-up built it
            conf.set("spark.jars", ",".join(jars))
    return SparkContext.getOrCreate(conf.set("spark.task.maxFailures", "4"))


def spark_home() -> str:
    """The Spark that pyspark starts for `start_spark`: $SPARK_HOME, else the installed pyspark's own."""
    return os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)


class Mirror:
    """All flows of a config in one Spark application."""

    def __init__(self, spark: SparkContext, config: MirrorConfig) -> None:
        self.spark = spark
        self.config = config
        self.metrics = MirrorMetrics()
        self.dr = {f.name: DrSync(config, f, self.metrics) for f in config.flows}  # offset syncs, checkpoints
        self.flows: list[FlowRunner] = [
            (RealtimeRunner if f.mode is FlowMode.REALTIME else ThroughputRunner)(
                spark, config, f, self.metrics, on_landed=self.dr[f.name].on_landed, on_forgotten=self.dr[f.name].forget
            )
            for f in config.flows
        ]
        self.stopping = threading.Event()
        _warn_if_cores_short(spark, config)
        if any(f.mode is FlowMode.THROUGHPUT for f in config.flows):
            _warm_copy_workers(spark)
        for choice in choices(config):
            log.info("%s", choice)
            self.metrics.core_chosen(choice.flow, choice.core.value, choice.copies)
        self._on_jvm_sigterm: _SetOnSignal | None = None

    def stop_on_sigterm(self) -> None:
        """Set `stopping` on SIGTERM, whether it reaches this Python process or the Spark driver's JVM.

        Under spark-submit (the image: the Spark Operator's driver pod) the JVM is the process the pod's SIGTERM
        reaches, and the Python driver is its child and gets no signal. The JVM's default answer is to exit (status
        143) through its shutdown hooks, which stop the SparkContext and so cancel the batch in flight: it would be
        copied again. So the JVM's SIGTERM handler is replaced, through py4j, by one that calls back into this
        process and only sets `stopping`. The JVM then stays up, `run_forever` stops every flow between batches,
        this process exits 0 and spark-submit with it. When Python started the JVM itself (`python -m spark_app`),
        the signal reaches Python, and its own handler does the same. Call it from the main thread.
        """
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        gateway = self.spark._gateway
        assert gateway is not None  # a live SparkContext has its py4j gateway
        ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]  # pyspark leaves it unannotated
        self._on_jvm_sigterm = _SetOnSignal(self)
        jvm_signal = gateway.jvm.sun.misc.Signal
        jvm_signal.handle(jvm_signal("TERM"), self._on_jvm_sigterm)

    def stop(self) -> None:
        """Ask every flow to stop between batches (`stopping`). Should the process still run STOP_DUMP_S later, every
        Python thread's stack goes to stderr, so a stop that hangs says where it waits."""
        self.stopping.set()
        faulthandler.dump_traceback_later(STOP_DUMP_S, exit=False)

    def run_available_now(self) -> None:
        """Mirror what is there now, write a final offset sync and checkpoint, then return. When `stopping` is set
        first (SIGTERM), every flow stops between batches instead, and a later run copies the rest."""
        with ThreadPoolExecutor(max(1, len(self.dr)), thread_name_prefix="dr-prepare") as preparing:
            prepared = []
            for dr in self.dr.values():
                dr.make_topics()
                prepared.append(preparing.submit(dr.prepare))  # beside the copy (DrSync.make_topics says why)
            for flow in self.flows:
                flow.start(first_topic_sync(flow, self.stopping), available_now=True)
        for done in prepared:
            done.result()
        while any(flow.running() for flow in self.flows) and not self.stopping.wait(0.2):
            continue
        if self.stopping.is_set():
            log.info("stopping before everything present is copied; the next run copies the rest")
            with ThreadPoolExecutor(max(1, len(self.flows))) as pool:
                list(pool.map(lambda flow: flow.stop(), self.flows))
        for flow in self.flows:
            flow.wait()
            _raise_if_failed(flow)
        for dr in self.dr.values():
            dr.stop()  # its final round learns whether another mirror of the flow took its DR state over
        if fenced := self._fenced():
            raise fenced

    def run_forever(self) -> None:
        """Mirror continuously, re-syncing topics every `topic_sync_interval_s`, until `stopping` is set.

        A cluster that stops answering is waited for (the writer's producer retries meanwhile) for up to
        `UNREACHABLE_GIVE_UP_S`; then the mirror stops with the error. Meanwhile the metrics endpoint listens on
        `metrics_port`, the lag poller runs, and so does each flow's DR loop.
        """
        with self.metrics.serve(self.config.metrics_port), LagPoller(self.metrics, [f.lag() for f in self.flows]):
            self._mirror_until_stopped()

    def _mirror_until_stopped(self) -> None:
        for dr in self.dr.values():
            dr.start()
        for flow in self.flows:
            flow.start(first_topic_sync(flow, self.stopping), available_now=False)
        unreachable_since: float | None = None
        fenced: MirrorFailed | None = None
        while not self.stopping.wait(self.config.topic_sync_interval_s):
            if fenced := self._fenced():
                break
            for flow in self.flows:
                _raise_if_failed(flow)
                try:
                    wanted = flow.sync_topics()
                except (ClusterUnreachable, KafkaException) as err:
                    if isinstance(err, KafkaException) and not _transient(err):
                        raise
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since > UNREACHABLE_GIVE_UP_S:
                        raise
                    log.warning("flow %s: topic sync skipped, retrying: %s", flow.flow.name, err)
                    continue
                unreachable_since = None
                if wanted != flow.subscription:
                    log.info("flow %s: topic set changed; restarting its copy where it stands", flow.flow.name)
                    flow.stop()
                    flow.start(wanted, available_now=False)
                else:
                    flow.catch_up()
        # Every flow at once, so a stop takes one flow's time (within STOP_GRACE_S), not the sum.
        with ThreadPoolExecutor(max(1, len(self.flows))) as pool:
            list(pool.map(self._stop_flow, self.flows))
        if fenced:
            raise fenced

    def _fenced(self) -> MirrorFailed | None:
        """The error the whole mirror stops with when another mirror of one of its flows took that flow over
        (spark_app.dr.lease): two copies of a flow would only copy everything twice. The caller stops every flow
        first, so the flows not taken over still write their final offset syncs and checkpoints."""
        for name, dr in self.dr.items():
            if dr.fenced is not None:
                self.metrics.error(name, "fenced")
                return MirrorFailed(f"flow {name}: {dr.fenced}; this mirror stops")
        return None

    def _stop_flow(self, flow: FlowRunner) -> None:
        """Stop the flow between batches, then write its final offset syncs and checkpoints."""
        flow.stop()
        self.dr[flow.flow.name].stop()


def _warm_copy_workers(spark: SparkContext) -> None:
    """Start a Python worker on each core, with the copy's modules imported, while the driver makes topics, takes its
    DR lease and plans the first batch: that batch's tasks then reuse them (`spark.python.worker.reuse`, on by
    default) instead of waiting for their start, about half a second each (bench/results/JOURNAL.md). A job of its
    own in a daemon thread; should it fail, the first batch starts its workers itself."""
    cores = spark.defaultParallelism

    def run() -> None:
        try:
            spark.parallelize(range(cores), cores).foreach(range_copy.warm)
        except Exception as err:  # noqa: BLE001 - only a head start is lost
            log.info("the copy's Python workers were not started ahead: %s", first_cause(str(err)))

    threading.Thread(target=run, name="mirrorkit-warm-workers", daemon=True).start()


def _warn_if_cores_short(spark: SparkContext, config: MirrorConfig) -> None:
    """Tasks without a core wait, and so do their partitions (spark_app.config.cores_needed). Only a warning: on
    Kubernetes, executors may still be registering; infra refuses a site too small at preview."""
    needed, cores = cores_needed(config.flows), spark.defaultParallelism
    if needed > cores:
        log.warning(
            "the flows need %d core(s) (one per real-time task, one more for micro-batches) and the"
            " application has %d now; tasks without a core wait, and so do their partitions",
            needed,
            cores,
        )


class _SetOnSignal:
    """A `sun.misc.SignalHandler` for the driver's JVM, run in Python through py4j's callback server."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    def handle(self, jvm_signal: Any) -> None:
        log.info("SIG%s: stopping after the batch in flight", jvm_signal.getName())
        self.mirror.stop()

    class Java:
        implements = ["sun.misc.SignalHandler"]


def _transient(err: KafkaException) -> bool:
    """A Kafka error a later round of topic sync can outlive: a timeout (a controller being elected while a broker
    restarts, say) or one the client calls retriable. It counts toward UNREACHABLE_GIVE_UP_S like an unreachable
    cluster, rather than stopping the mirror at once."""
    error = err.args[0]
    return isinstance(error, KafkaError) and (
        error.retriable() or error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)
    )


def first_topic_sync(flow: FlowRunner, stopping: threading.Event) -> Subscription:
    """A flow's first topic sync, tried again every FIRST_SYNC_RETRY_S while it fails with a transient error (a
    controller being elected while a broker restarts answers "Failed while waiting for controller") for up to
    UNREACHABLE_GIVE_UP_S, as a later round's failure is outlived; any other error stops the mirror at once."""
    since = time.monotonic()
    while True:
        try:
            return flow.sync_topics()
        except KafkaException as err:
            if not _transient(err) or time.monotonic() - since > UNREACHABLE_GIVE_UP_S or stopping.is_set():
                raise
            log.warning("flow %s: first topic sync failed, retrying: %s", flow.flow.name, err)
        stopping.wait(FIRST_SYNC_RETRY_S)


def _raise_if_failed(flow: FlowRunner) -> None:
    error = flow.failure()
    if error is not None:
        flow.metrics.error(flow.flow.name, "batch_failed")
        raise MirrorFailed(f"flow {flow.flow.name} failed: {error}")
