"""The mirror's Spark: what its JVM and the Python processes Spark starts for it run with."""

from __future__ import annotations

from spark_app.config import SPARK_CLASS_ARCHIVE, SPARK_DEFAULTS, SPARK_JVM_OPTIONS, spark_jvm_conf
from spark_app.mirror import spark_home


def test_python_workers_import_the_installed_pyspark_not_sparks_source_zip(spark):
    # Spark puts $SPARK_HOME/python/lib/pyspark.zip first on each worker's PYTHONPATH; importing from it compiles
    # every module again in every process (.ci/setup and the image remove it).
    files = spark.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()
    assert len(files) == 1 and ".zip" not in files[0], files


def test_the_jvm_the_mirror_starts_runs_with_the_mirrors_jvm_options(spark):
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    options = spark_jvm_conf(spark_home())["spark.driver.extraJavaOptions"]
    assert set(SPARK_JVM_OPTIONS.split()) < set(options.split()) <= set(arguments), arguments
    assert spark.getConf().get("spark.executor.extraJavaOptions").endswith(options)  # after Spark's own defaults


def test_the_jvm_maps_sparks_classes_from_the_archive_set_up_made(spark):
    # Without the archive, or on a class path it was not made for, the JVM starts without it, silently: slower.
    archive = f"{spark_home()}/{SPARK_CLASS_ARCHIVE}"
    jvm = spark._jvm
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert diagnostics.getVMOption("SharedArchiveFile").getValue() == archive
    assert diagnostics.getVMOption("UseSharedSpaces").getValue() == "true", (
        f"the JVM does not map {archive}: run images/spark_classes.py (bash .ci/setup does)"
    )


def test_the_mirrors_spark_starts_without_its_web_ui_unless_spark_submit_is_told_otherwise(spark):
    # tests/test_mirror_standalone.py turns it on through PYSPARK_SUBMIT_ARGS, and reads the driver's REST API.
    assert spark.getConf().get("spark.ui.enabled") == SPARK_DEFAULTS["spark.ui.enabled"] == "false"
    assert spark.uiWebUrl is None
