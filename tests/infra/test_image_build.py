"""The mirror image's build: what goes into its context, and the cloud connectors it bakes in."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
from pathlib import Path

import pyspark

from images.fetch_jars import load_manifest
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


def test_the_image_makes_no_class_archive_its_pods_could_not_map():
    """Spark on Kubernetes puts its mounted configuration folder on every pod JVM's class path, and JDK 17 maps no
    class-data-sharing archive past a non-empty folder: the image makes none (its bytes differed by build)."""
    steps = instructions()
    assert not [s for s in steps if "spark_classes" in s or "Xshare:dump" in s]


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
    """Every toolchain is Debian's, pinned: the JDK for the JVM copier, rustc-web and cargo-web for the copy core."""
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
    assert "rustc-web" in text and "too old" in text, "the Dockerfile says why Rust is Debian's -web toolchain"
    named_stages = [words[3] for words in stages if len(words) == 4]
    assert "copy-core" in named_stages and "copier" in named_stages, "both compiled parts are built in stages"
    (pin,) = [s for s in steps if s.startswith("ARG RUST_DEB=")]
    assert re.fullmatch(r"ARG RUST_DEB=\d+\.\d+\.\d+\+dfsg\S*", pin), pin
    rust = [s for s in steps if "rustc-web" in s or "cargo-web" in s]
    assert rust and all('"rustc-web=$RUST_DEB"' in s and '"cargo-web=$RUST_DEB"' in s for s in rust), rust


def test_the_host_ca_is_mounted_for_the_build_only_and_never_baked_in():
    steps = instructions()
    naming = [s for s in steps if "pip-host-ca.crt" in s]
    secret = "--mount=type=secret,id=host-ca,target=/etc/pip-host-ca.crt if [ -s /etc/pip-host-ca.crt ]; then"
    assert len(naming) == 5 and all(s.startswith("RUN --mount=") and secret in s for s in naming), naming
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
    installs = [s for s in steps if "uv pip install" in s and "/opt/mirrorkit/venv/bin/python" in s]
    assert len(installs) == 2 and all("--compile-bytecode" in s for s in installs), "bytecode is made at build time"


def test_the_build_script_stages_nothing_compiled_and_clears_the_old_staging_folder():
    """The Dockerfile builds the copy core and the JVM copier in stages: the script needs no set-up's cache."""
    build = (ROOT / "images" / "mirror" / "build").read_text()
    for outside in ("copy-core", "core_want", "maturin", ".cargo", ".venv", "jvm-copier", "javac"):
        assert outside not in build, outside
    assert "dist=images/mirror/dist" in build and 'rm -rf "$dist"' in build
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "images/mirror/dist/wheels/x.whl"], cwd=ROOT, capture_output=True
    )
    assert ignored.returncode == 0, "what earlier builds staged stays out of git"
