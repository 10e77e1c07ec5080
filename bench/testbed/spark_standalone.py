"""A Spark standalone cluster on loopback, started from the pyspark install: a master and workers, each its own JVM.

Each worker offers one core and 1 GB, so an application gets one 1 GB executor per worker (Spark's default executor
memory), in a JVM of its own that the worker starts. A worker runs in a session of its own with everything it starts
(its executors and their Python workers), so `kill_worker` loses all of them at once, as a node lost would.

The cluster runs with Spark's authentication on, as a platform secures one: the master, the workers and every
application read `spark.authenticate` and the cluster's secret from a spark-defaults.conf only this user can read, so
the secret is on no command line. A driver joins with `driver_env`, which names that folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from bench.testbed.kafka_cluster import require_java
from bench.testbed.ports import free_ports
from bench.testbed.processes import DAEMON, kill_session, python_workers, session_processes

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
READY_TIMEOUT_S = 90.0
DAEMON_MEMORY = "256m"  # the master's and each worker's own heap; executors get their own JVMs


class SparkStartError(RuntimeError):
    pass


class SparkStandalone:
    """`start` launches the master and the workers and waits until every worker is registered."""

    def __init__(self, folder: Path, workers: int = 2, env: dict[str, str] | None = None) -> None:
        require_java()
        if not SPARK_CLASS.exists():
            raise SparkStartError(f"{SPARK_CLASS} is missing: pyspark is installed by `bash .ci/setup`")
        self.folder = folder
        self.conf = folder / "conf"  # spark-defaults.conf, with the cluster's secret
        self.env = os.environ | {"SPARK_DAEMON_MEMORY": DAEMON_MEMORY, "SPARK_LOCAL_IP": "127.0.0.1"} | (env or {})
        self.env["SPARK_CONF_DIR"] = str(self.conf)
        self.port, self.ui_port = free_ports(2)
        self.workers: list[subprocess.Popen | None] = [None] * workers
        self.worker_ui_ports = [0] * workers
        self._master: subprocess.Popen | None = None

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def driver_env(self) -> dict[str, str]:
        """What a driver's environment needs to join: the folder of the cluster's spark-defaults.conf."""
        return {"SPARK_CONF_DIR": str(self.conf)}

    def start(self) -> SparkStandalone:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.conf.mkdir(mode=0o700, exist_ok=True)
        defaults = self.conf / "spark-defaults.conf"
        defaults.touch(mode=0o600)
        defaults.write_text(f"spark.authenticate true\nspark.authenticate.secret {secrets.token_hex(32)}\n")
        self._master = self._launch(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for index in range(len(self.workers)):
            self.start_worker(index)
        return self

    def start_worker(self, index: int) -> None:
        """Start worker `index` (again, after `kill_worker`) and wait until the master counts it alive."""
        running = self.workers[index]
        if running is not None and running.poll() is None:
            raise ValueError(f"worker {index} is running already")
        (ui_port,) = self.worker_ui_ports[index : index + 1] = free_ports(1)
        work = self.folder / f"worker-{index}"
        self.workers[index] = self._launch(
            f"worker-{index}", "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(ui_port),
            "--work-dir", str(work), self.master_url,
        )  # fmt: skip
        self._wait_for_workers()

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` with its executors and their Python workers: a node lost."""
        process = self.workers[index]
        if process is not None and process.poll() is None:
            kill_session(process.pid)
            process.wait(10)
        self.workers[index] = None

    def stop_executor(self, index: int) -> bool:
        """SIGTERM the executor JVMs worker `index` runs, as a node drained or a pod evicted stops them; the worker
        starts the application new executors. False when it runs none now."""
        process = self.workers[index]
        if process is None or process.poll() is not None:
            return False
        executors = [pid for pid, cmd, _ in session_processes(process.pid) if "CoarseGrainedExecutorBackend" in cmd]
        for pid in executors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        return bool(executors)

    def python_workers(self) -> list[int]:
        """The Python workers the executors of every worker forked for tasks."""
        return [pid for p in self.workers if p is not None and p.poll() is None for pid in python_workers(p.pid)]

    def kill_executors(self, spare: frozenset[int] = frozenset()) -> None:
        """SIGKILL every executor JVM and Python daemon of every worker, and their Python workers but `spare`: an
        application's executors lost, the workers kept."""
        for process in self.workers:
            if process is None or process.poll() is not None:
                continue
            for pid, cmd, _ in session_processes(process.pid):
                if pid not in spare and ("CoarseGrainedExecutorBackend" in cmd or DAEMON in cmd):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

    def alive_workers(self) -> int:
        """Workers the master counts alive, from its web UI's JSON; none while the UI answers with its HTML page
        instead (seen on a loaded machine, as the master was starting)."""
        try:
            return int(_json(self.ui_port, "/json/")["aliveworkers"])
        except json.JSONDecodeError:
            return 0

    def cores_used(self) -> list[int]:
        """Per worker the master counts alive, the cores its executors hold now."""
        return [int(w["coresused"]) for w in _json(self.ui_port, "/json/")["workers"] if w["state"] == "ALIVE"]

    def worker_of(self, executor_id: str) -> int:
        """The index of the worker that runs executor `executor_id`."""
        for index, process in enumerate(self.workers):
            if process is not None and process.poll() is None:
                executors = _json(self.worker_ui_ports[index], "/json/")["executors"]
                if any(str(e["id"]) == executor_id for e in executors):
                    return index
        raise LookupError(f"no live worker runs executor {executor_id}")

    def log_tail(self, lines: int = 40) -> str:
        tails = []
        for log in sorted(self.folder.glob("*.log")):
            tails.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(tails)

    def close(self) -> None:
        for index in range(len(self.workers)):
            self.kill_worker(index)
        if self._master is not None and self._master.poll() is None:
            os.killpg(self._master.pid, signal.SIGKILL)
            self._master.wait(10)

    def _launch(self, name: str, main_class: str, *args: str) -> subprocess.Popen:
        with (self.folder / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                [str(SPARK_CLASS), main_class, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    def _wait_for_workers(self) -> None:
        wanted = sum(1 for w in self.workers if w is not None)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for process in (self._master, *self.workers):
                if process is not None and process.poll() is not None:
                    raise SparkStartError(f"a Spark daemon exited with {process.returncode}:\n{self.log_tail()}")
            try:
                if self.alive_workers() >= wanted:
                    return
            except OSError:
                pass  # the master's UI is not listening yet
            time.sleep(0.2)
        raise SparkStartError(
            f"the Spark standalone cluster did not have {wanted} worker(s) within {READY_TIMEOUT_S:.0f} s:\n"
            f"{self.log_tail()}"
        )


def running_tasks(driver_ui_port: int) -> list[str]:
    """The executor ids of the tasks an application runs now, from its driver's REST API."""
    base = "/api/v1/applications"
    app = _json(driver_ui_port, base)[0]["id"]
    return [
        task["executorId"]
        for stage in _json(driver_ui_port, f"{base}/{app}/stages?status=active")
        for task in _json(driver_ui_port, f"{base}/{app}/stages/{stage['stageId']}/{stage['attemptId']}/taskList")
        if task["status"] == "RUNNING"
    ]


def _json(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as answer:
        return json.load(answer)
