"""Versions that must agree come from one source: Spark from the pyspark pin, Python from requires-python."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from images.fetch_jars import load_manifest
from infra.schema import MirrorSpec
from infra.versions import pinned

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "images" / "mirror" / "Dockerfile"


def pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)


def test_the_image_takes_spark_from_the_lock_at_the_pyspark_pin():
    """The image's Spark is the pyspark it installs from requirements.lock (its `spark` extra), so one pin decides
    the image's Spark, the test bed's and the SparkApplication's `sparkVersion`."""
    text = DOCKERFILE.read_text()
    assert "apache/spark" not in text, "the image's Spark comes from the lock, not from another image"
    assert re.search(r"-c requirements\.lock .*--extra spark", text), "the venv installs the spark extra from the lock"
    assert f"pyspark=={pinned('pyspark')}" in (ROOT / "requirements.lock").read_text().splitlines()
    printed = subprocess.run(
        [sys.executable, "-m", "infra.versions", "pyspark"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert printed.stdout.strip() == pinned("pyspark")


def test_the_spark_application_runs_the_pinned_spark_unless_the_stack_says_otherwise():
    assert MirrorSpec().spark_version == pinned("pyspark")


def test_python_is_3_11_wherever_it_is_named():
    floor = "3.11"
    config = pyproject()
    assert config["project"]["requires-python"] == f">={floor}"
    assert config["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert config["tool"]["mypy"]["python_version"] == floor
    assert "sys.version_info >= (3, 11)" in (ROOT / ".ci" / "setup").read_text()
    assert f'PYTHON_VERSION: "{floor}"' in (ROOT / ".github" / "workflows" / "infra.yml").read_text()
    assert f"--python-version {floor} " in (ROOT / "requirements.lock").read_text()
    pythons = re.findall(r"\bpython(3\.\d+)\b", DOCKERFILE.read_text())  # Debian's, which the venv is made with
    assert pythons and set(pythons) == {floor}


def test_the_benchmarks_spark_connector_is_at_the_pyspark_pin():
    spark = load_manifest()["spark"]
    assert {a.version for a in spark.artifacts if a.group == "org.apache.spark"} == {pinned("pyspark")}
