"""The mirror under test as the process a pod runs: `run` in a session of its own, so the nemesis can kill it whole
(SIGKILL), stop it as Kubernetes does (SIGTERM), or kill one of its Python workers (an executor's task), and start
it again on the same checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from bench.testbed.processes import kill_session, python_workers
from spark_app.config import STOP_GRACE_S

# A SIGTERM lets the batch in flight finish (or cancels it past its own bound); past this the process is killed, as
# Kubernetes kills a pod past its grace period, which the mirror's SparkApplication sets to the same.
STOP_WAIT_S = float(STOP_GRACE_S)


class MirrorProcess:
    """`python -m spark_app run --config <file>` with its output appended to `log`."""

    def __init__(
        self, config_file: Path, log: Path, master: str = "local[4]", env: dict[str, str] | None = None
    ) -> None:
        self.config_file = config_file
        self.log = log
        self.master = master
        # Spark binds the driver to loopback, as every process of the test bed does, not to the host's own address.
        self.env = os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"} | (env or {})
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert not self.alive(), "the mirror is already running"
        with self.log.open("ab") as out:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "spark_app", "run", "--config", str(self.config_file), "--master", self.master],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
            )  # fmt: skip
        self.starts += 1

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def kill(self, spare: frozenset[int] = frozenset()) -> None:
        """SIGKILL the driver and everything it started (its JVM, Spark's Python workers) but `spare`: a pod
        killed."""
        if self._proc is None:
            return
        kill_session(self._proc.pid, spare)
        self._proc.wait(60)

    def change_slots(self) -> int:
        """Give the next start another real-time slot count (1 and 2 in turn); the count it will run."""
        raw = yaml.safe_load(self.config_file.read_text())
        flow = raw["flows"][0]
        flow["realtime_tasks"] = 1 if flow.get("realtime_tasks", 1) > 1 else 2
        self.config_file.write_text(yaml.safe_dump(raw))
        return int(flow["realtime_tasks"])

    def workers(self) -> list[int]:
        """The Python workers Spark forked for its tasks in this process's session (local mode's executors)."""
        return python_workers(self._proc.pid) if self.alive() and self._proc is not None else []

    def term(self) -> int | None:
        """SIGTERM the driver and wait for it to stop between batches; its exit code (None if it had to be killed)."""
        if not self.alive():
            return self.exit_code()
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)
        try:
            code = self._proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        self.kill()  # whatever of its session is left (a Spark JVM still exiting)
        return code

    def kill_worker(self) -> bool:
        """SIGKILL one Python worker that Spark forked for a task; False when none runs now."""
        if self._proc is None:
            return False
        workers = python_workers(os.getsid(self._proc.pid))
        if not workers:
            return False
        try:
            os.kill(workers[0], signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True
