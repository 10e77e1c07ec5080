"""The mirror image's build: what goes into its context, and the cloud connectors it bakes in."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import pyspark

from images.fetch_jars import load_manifest
from spark_app.config import IMAGE_SPARK_HOME
from tests.infra.harness import ROOT

DOCKERFILE = ROOT / "images" / "mirror" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


def copied_sources() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += shlex.split(line)[1:-1]
    return sources


def sent(path: str) -> bool:
    """Whether `docker build .` sends this path, by .dockerignore's rules (the last matching pattern wins)."""
    assert DOCKERIGNORE.is_file(), ".dockerignore is missing: the build context would carry .venv, .cache and .git"
    keep = True
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated, pattern = line.startswith("!"), line.lstrip("!").rstrip("/")
        parts = Path(path).parts
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            keep = negated
    return keep


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_local_state():
    sources = copied_sources()
    assert sources and all(sent(s) for s in sources), [s for s in sources if not sent(s)]
    for local in (".venv/bin/python", ".cache/jars/kafka/x.jar", ".git/HEAD", "bench/results/r.json", "tests/x.py"):
        assert not sent(local), local
    assert not sent("spark_app/__pycache__/config.cpython-311.pyc")


def pyspark_hadoop_version() -> str:
    jars = Path(pyspark.__file__).parent / "jars"
    (api,) = jars.glob("hadoop-client-api-*.jar")
    return re.fullmatch(r"hadoop-client-api-(.+)\.jar", api.name)[1]


def test_the_image_bakes_the_hadoop_cloud_connectors_at_sparks_hadoop_version():
    baked = [a for g in load_manifest().values() if g.image for a in g.artifacts]
    by_name = {a.artifact: a for a in baked}
    hadoop = pyspark_hadoop_version()
    assert by_name["hadoop-aws"].version == by_name["hadoop-azure"].version == hadoop
    assert "bundle" in by_name and by_name["bundle"].group == "software.amazon.awssdk"
    text = DOCKERFILE.read_text()
    assert "fetch_jars.py --image" in text and "/opt/spark/jars" in text


def test_the_image_makes_sparks_class_archive_in_the_spark_home_the_jvm_options_name():
    lines = DOCKERFILE.read_text().splitlines()
    env = max(i for i, line in enumerate(lines) if line.startswith("ENV "))
    made = [i for i, line in enumerate(lines) if line.startswith("RUN ") and "images/spark_classes.py" in line]
    assert made and made[0] > env, "the archive is made after the ENV that sets SPARK_HOME and PYTHONPATH"
    assert f"SPARK_HOME={IMAGE_SPARK_HOME}" in "\n".join(lines[env : made[0]])
