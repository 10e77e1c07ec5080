"""Make Spark's class-data-sharing archive for the mirror's JVMs, once per Spark install.

A Spark JVM reads and verifies some 15,000 classes from Spark's jars at every start. Mapped from one archive
instead, the mirror starts 3-5 s sooner on a 2-core machine (bench/results/20261128-startup-cds.txt). The archive
must list the classes a mirror's start loads, and be made by the same `java` on the same class path as the JVM
that maps it.

So this script runs a short local Spark job shaped like the mirror's start, with the JVM listing every class it loads
(-XX:DumpLoadedClassList). The job is the mirror's own Spark (spark_app.mirror.start_spark) and one job of Python
tasks that each return Python objects to the driver, as a micro-batch's copy and a real-time flow's tasks are. Then
`java -Xshare:dump` writes those classes, from the job JVM's own class path, into
`<SPARK_HOME>/mirrorkit-classes.jsa`, which the mirror's JVM options name (spark_app.config.spark_jvm_conf). Set-up
(.ci/setup) runs it. The image makes none: Spark on Kubernetes puts its mounted configuration folder on the pods' class
path, past which JDK 17 maps no archive (images/mirror/Dockerfile).

Usage: python images/spark_classes.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spark_app.config import SPARK_CLASS_ARCHIVE  # noqa: E402
from spark_app.mirror import spark_home  # noqa: E402

CLASS_LIST, CLASS_PATH = "classes.lst", "classpath"


def main() -> None:
    archive = Path(spark_home()) / SPARK_CLASS_ARCHIVE
    archive.unlink(missing_ok=True)  # the job's JVM must load every class from the jars, to list it
    with tempfile.TemporaryDirectory(prefix="mirrorkit-spark-classes-") as tmp:
        work = Path(tmp)
        env = os.environ | {
            "SPARK_SUBMIT_OPTS": f"-XX:DumpLoadedClassList={work / CLASS_LIST}",  # the driver JVM's, not the launcher's
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        _run([sys.executable, __file__, "--job", tmp], env, "the training job")
        classes = (work / CLASS_LIST).read_text().count("\n")
        java = Path(os.environ["JAVA_HOME"], "bin", "java") if "JAVA_HOME" in os.environ else Path("java")
        dump = [str(java), "-Xshare:dump", f"-XX:SharedClassListFile={work / CLASS_LIST}"]
        dump += [f"-XX:SharedArchiveFile={archive}", "-cp", (work / CLASS_PATH).read_text()]
        _run(dump, env, "java -Xshare:dump")
    print(f"{archive}: {classes:,} classes listed, {archive.stat().st_size / 2**20:.0f} MB")


def _run(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"images/spark_classes.py: {what} failed (exit {done.returncode}):\n{tail}")


def job(work: Path) -> None:
    """The mirror's Spark and one job of Python tasks, as a batch's copy runs them; then the driver JVM's class
    path, which the archive is made for."""
    from spark_app.mirror import start_spark

    spark = start_spark("local[2]")
    groups = [[("topic", 0, 0, 1)], [("topic", 1, 0, 1)]]
    spark.parallelize(groups, len(groups)).mapPartitionsWithIndex(lambda slot, tasks: [slot]).collect()
    jvm = spark._jvm
    assert jvm is not None  # a running SparkContext's
    (work / CLASS_PATH).write_text(jvm.System.getProperty("java.class.path"))
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        job(Path(sys.argv[2]))
    else:
        main()
