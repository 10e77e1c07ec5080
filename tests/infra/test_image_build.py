"""The mirror image's build: what goes into its context, and the cloud connectors it bakes in."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
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
    version = re.fullmatch(r"hadoop-client-api-(.+)\.jar", api.name)
    assert version, api.name
    return version[1]


def test_the_image_bakes_the_hadoop_cloud_connectors_at_sparks_hadoop_version():
    baked = [a for g in load_manifest().values() if g.image for a in g.artifacts]
    by_name = {a.artifact: a for a in baked}
    hadoop = pyspark_hadoop_version()
    assert by_name["hadoop-aws"].version == by_name["hadoop-azure"].version == hadoop
    assert "bundle" in by_name and by_name["bundle"].group == "software.amazon.awssdk"
    text = DOCKERFILE.read_text()
    assert "fetch_jars.py --image" in text and "/opt/spark/jars" in text


def test_the_image_makes_sparks_class_archive_in_the_spark_home_the_jvm_options_name():
    steps = instructions()
    env = max(i for i, step in enumerate(steps) if step.startswith("ENV "))
    made = [i for i, step in enumerate(steps) if step.startswith("RUN ") and "images/spark_classes.py" in step]
    assert made and made[0] > env, "the archive is made after the ENV that sets SPARK_HOME and PATH"
    assert f"SPARK_HOME={IMAGE_SPARK_HOME}" in steps[env].split()


def instructions() -> list[str]:
    """The Dockerfile's instructions, each with its continuation lines joined, comments left out."""
    joined, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            joined.append(current.strip())
            current = ""
    return [i for i in joined if i]


def test_the_image_builds_on_debian_bookworm_slim_with_no_toolchain_fetched_by_script():
    steps = instructions()
    (base_arg,) = [s for s in steps if s.startswith("ARG BASE_IMAGE=")]
    assert base_arg == "ARG BASE_IMAGE=debian:bookworm-slim"
    stages = [s.split() for s in steps if s.startswith("FROM ")]
    assert stages[0][1] == "${BASE_IMAGE}", "the first stage is on the base"
    named = [words[3] for words in stages if len(words) == 4 and words[2] == "AS"]
    assert all(words[1] in named for words in stages[1:]), "every other stage builds on an earlier one"
    text = DOCKERFILE.read_text()
    for fetched in ("curl", "wget", "rustup", "sh.rustup.rs", "| sh", "|sh"):
        assert fetched not in "\n".join(steps), fetched
    assert "no pinned Rust toolchain is reachable" in text, "the Dockerfile says why the wheel comes from outside"


def test_the_host_ca_is_mounted_for_the_build_only_and_never_baked_in():
    steps = instructions()
    naming = [s for s in steps if "pip-host-ca.crt" in s]
    secret = "--mount=type=secret,id=host-ca,target=/etc/pip-host-ca.crt if [ -s /etc/pip-host-ca.crt ]; then"
    assert len(naming) == 4 and all(s.startswith("RUN --mount=") and secret in s for s in naming), naming
    assert not [s for s in steps if s.split()[0] in ("COPY", "ADD", "ENV") and ("ca.crt" in s or "CERT" in s)]
    build = (ROOT / "images" / "mirror" / "build").read_text()
    assert '--secret "id=host-ca,src=$host_ca"' in build and " -v " not in build, "a -v mount point stays in the image"
    assert "buildah build --isolation chroot --pull=never --layers --force-rm -f images/mirror/Dockerfile" in build


def test_the_image_runs_as_185_under_tini_with_nothing_to_write_outside_tmp():
    steps = instructions()
    assert steps[-3:] == [
        "USER 185",
        "WORKDIR /opt/mirrorkit",
        'ENTRYPOINT ["/usr/bin/tini", "-s", "--", "/opt/mirrorkit/entrypoint.sh"]',
    ]
    (env,) = [s for s in steps if s.startswith("ENV ")]
    settings = dict(word.split("=", 1) for word in env.split()[1:])
    assert settings["PYTHONDONTWRITEBYTECODE"] == "1" and settings["HOME"] == "/tmp"
    assert settings["PYSPARK_PYTHON"] == "/opt/mirrorkit/venv/bin/python"
    assert settings["PATH"].startswith("/opt/mirrorkit/venv/bin:")
    installs = [s for s in steps if "uv pip install" in s]
    assert len(installs) == 2 and all("--compile-bytecode" in s for s in installs), "bytecode is made at build time"


def shell_block(text: str, variable: str) -> str:
    """The command substitution that sets `variable` in a shell script, as written."""
    match = re.search(rf"^{variable}=\$\(.*?\| sha256sum \| cut -d' ' -f1\)$", text, re.M | re.S)
    assert match, f"no {variable}=$(... | sha256sum ...) in the script"
    return match[0]


def test_the_build_script_finds_the_compiled_parts_by_set_ups_own_keys():
    setup = (ROOT / ".ci" / "setup").read_text()
    build = (ROOT / "images" / "mirror" / "build").read_text()
    assert shell_block(build, "core_want") == shell_block(setup, "core_want")
    assert "core=spark_app/copy_core" in setup and "core=spark_app/copy_core" in build
    assert "core_wheels=$cache/copy-core/$core_want" in setup and "core_wheels=$cache/copy-core/$core_want" in build
    assert "jvm-copier" not in build and "javac" not in build, "the Dockerfile compiles the JVM copier in a stage"


def test_the_staging_folder_is_git_ignored_and_sent_to_the_build():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "images/mirror/dist/wheels/x.whl"], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0, "images/mirror/dist must stay out of git"
    assert sent("images/mirror/dist/wheels/x.whl")
