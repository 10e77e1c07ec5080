"""The mirror image: what its Dockerfile copies exists, its stages build the compiled parts, and its entrypoint
starts Spark's driver and executors as Spark on Kubernetes asks and runs the mirror in local mode."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from bench.testbed.clients import Record, create_topics, produce, read_all
from images.build_copier import write_jar
from images.wheel_sbom import record_line, steady_wheel
from tests.support.assertions import assert_each_record_once_in_order
from tests.support.mirror_config import one_flow_config

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "images" / "mirror"
ENTRYPOINT = IMAGE / "entrypoint.sh"
BUILD = IMAGE / "build"
DIST = "images/mirror/dist"


def test_every_path_the_dockerfile_copies_exists_and_nothing_is_staged_by_the_build_script():
    """Every compiled part is built by a stage of the Dockerfile: the context holds only the checkout's files."""
    sources = []
    for line in (IMAGE / "Dockerfile").read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        words = shlex.split(line)
        if not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    assert len(sources) >= 6
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert missing == []
    assert not [s for s in sources if s.startswith(f"{DIST}/")], "nothing comes from the old staging folder"
    build = BUILD.read_text()
    assert ".whl" not in build and "$dist/" not in build, "the build script stages no wheel"


def steps() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    joined, current = [], ""
    for line in (IMAGE / "Dockerfile").read_text().splitlines():
        if line.startswith("#") and not current:
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            joined.append(current.strip())
            current = ""
    return [s for s in joined if s]


def stage_of(name: str) -> list[str]:
    """The instructions of the stage `FROM ... AS name`, its FROM first."""
    found: list[str] = []
    for step in steps():
        if step.startswith("FROM "):
            if found:
                break
            if step.split()[2:] == ["AS", name]:
                found.append(step)
        elif found:
            found.append(step)
    assert found, f"the Dockerfile has no stage {name}"
    return found


def test_the_jvm_copier_is_compiled_in_a_stage_by_debians_jdk_at_the_runtimes_version():
    """The image's jar comes from the Dockerfile alone: a stage on the image's Spark (its jars and the manifest's
    kafka-clients) installs Debian's JDK 17 at the JRE's pinned version and runs the recipe set-up runs too."""
    stage = stage_of("copier")
    assert stage[0] == "FROM spark AS copier", "the stage compiles against the image's own jars"
    fetch = [s for s in stage_of("spark") if "fetch_jars.py --image" in s]
    assert fetch and "cp /tmp/jars/*/*.jar /opt/spark/jars/" in fetch[0], "kafka-clients is fetched as every image jar"
    body = " ".join(stage)
    assert '"openjdk-17-jdk-headless=$JAVA_DEB"' in body
    assert '"openjdk-17-jre-headless=$JAVA_DEB"' in " ".join(stage_of("system"))
    assert re.search(
        r"build_copier\.py --classpath '/opt/spark/jars/\*' --sources src --jar mirrorkit-copier\.jar", body
    )
    assert "COPY spark_app/jvm_copier /opt/mirrorkit/copier/src" in stage
    final = [s for s in steps() if s.startswith("COPY ") and "mirrorkit-copier.jar" in s]
    assert final == ["COPY --from=copier /opt/mirrorkit/copier/mirrorkit-copier.jar /opt/spark/jars/"]
    setup = (ROOT / ".ci" / "setup").read_text()
    assert "images/build_copier.py --classpath" in setup and "-Xlint" not in setup, "one recipe, javac's flags in it"


def test_the_rust_copy_core_is_built_in_a_stage_by_debians_pinned_rust_as_set_up_builds_it():
    """The image's wheel comes from the Dockerfile alone: Debian's rustc-web and cargo-web at one pinned version, the
    crates Cargo.lock pins, maturin at its version in requirements.lock with set-up's own command line, no RUSTFLAGS
    (set-up sets none), and the wheel the final stage installs."""
    stage = stage_of("copy-core")
    assert stage[0] == "FROM system AS copy-core"
    (pin,) = [s for s in steps() if s.startswith("ARG RUST_DEB=")]
    assert re.fullmatch(r"ARG RUST_DEB=\d+\.\d+\.\d+\S*-\S+", pin), "the toolchain is pinned to a Debian version"
    body = " ".join(stage)
    assert "ARG RUST_DEB" in stage
    assert '"rustc-web=$RUST_DEB"' in body and '"cargo-web=$RUST_DEB"' in body
    for dev in ("libssl-dev=", "zlib1g-dev=", "pkg-config="):
        assert dev in body, f"{dev} is pinned: librdkafka links Debian's libssl 3 and zlib"
    assert "COPY spark_app/copy_core /opt/mirrorkit/copy-core/src" in stage
    assert "cargo fetch --locked --manifest-path src/Cargo.toml" in body
    assert "-c requirements.lock maturin" in body, "maturin at the lock's version"
    setup = (ROOT / ".ci" / "setup").read_text()
    flags = "maturin build --quiet --release --locked --compatibility linux -m "
    assert flags in " ".join(setup.replace("\\\n", " ").split()) and flags in body, "set-up's command line, as it is"
    assert "RUSTFLAGS=" not in body and not re.search(r"^\s*(export )?RUSTFLAGS=", setup, re.M)
    installs = [s for s in steps() if s.startswith("COPY ") and "/opt/mirrorkit/wheels" in s]
    assert installs == ["COPY --from=copy-core /opt/mirrorkit/copy-core/wheels /opt/mirrorkit/wheels"]
    final = [s for s in steps() if "uv pip install" in s and "/opt/mirrorkit/wheels/*.whl" in s]
    assert len(final) == 1


def test_uv_is_installed_once_and_mounted_where_packages_are_installed():
    text = "\n".join(steps())
    assert text.count("'^uv=='") == 1 and text.count("pip install --quiet") == 1
    installs = [s for s in steps() if "uv pip install" in s and "/opt/mirrorkit/venv/bin/python" in s]
    assert len(installs) == 2
    assert all(s.startswith("RUN --mount=type=bind,from=uv,source=/opt/uv,target=/tmp/uv ") for s in installs)
    # uv's lock file for an sdist's build environment, named at random, goes in the step that made it: removed by a
    # later step, it would stay in the install's layer and give each build another digest.
    assert all("&& rm -f /tmp/uv-*.lock " in s for s in installs)
    # The copy core's build stage, which never reaches the image, takes a copy: a stage named only by a RUN's mount
    # is not always built before the stage that mounts it.
    assert "COPY --from=uv /opt/uv /opt/uv" in stage_of("copy-core")
    assert len([s for s in steps() if "uv pip install" in s]) == 3


def test_the_build_is_dated_at_one_fixed_time_with_hash_based_bytecode_and_pinned_debian_packages():
    """Every file, the history, the bytecode and /etc/shadow are dated 1980-01-01, whatever the commit or the day: a
    layer from the build cache is then dated as one built again, and a commit of docs alone keeps the digest."""
    build = BUILD.read_text()
    assert re.search(r"^epoch=315532800 ", build, re.M) and '--timestamp "$epoch"' in build
    assert "git log" not in build, "no date of the checkout's"
    for step in steps():
        if "--compile-bytecode" in step:
            assert "SOURCE_DATE_EPOCH=315532800" in step, "checked-hash .pyc, whatever the files' dates"
        if "useradd" in step:
            assert "SOURCE_DATE_EPOCH=315532800 useradd " in step, "/etc/shadow's last change, not the build's day"
        if "apt-get install" in step:
            packages = step.split("--no-install-recommends", 1)[1].split("&&")[0].split()
            assert packages and all("=" in p for p in packages), packages


def test_the_copiers_jar_is_the_same_bytes_whenever_it_is_made(tmp_path):
    for run, when in (("a", 1_000_000_000), ("b", 1_700_000_000)):
        classes = tmp_path / run / "classes" / "io" / "mirrorkit"
        classes.mkdir(parents=True)
        for name in ("B.class", "A.class"):
            (classes / name).write_bytes(name.encode())
            os.utime(classes / name, (when, when))
        write_jar(tmp_path / run / "classes", tmp_path / f"{run}.jar")
    assert (tmp_path / "a.jar").read_bytes() == (tmp_path / "b.jar").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.jar") as jar:
        assert jar.namelist() == ["META-INF/", "META-INF/MANIFEST.MF", "io/mirrorkit/A.class", "io/mirrorkit/B.class"]
        assert jar.read("io/mirrorkit/A.class") == b"A.class"


def test_the_copy_cores_wheel_is_the_same_bytes_whatever_the_sbom_says_of_its_build(tmp_path):
    """maturin's SBOM carries a random serial number and the build's time: rewritten, two builds' wheels are one."""
    sbom = '{\n  "bomFormat": "CycloneDX",\n  "serialNumber": "urn:uuid:%s",\n  "metadata": {"timestamp": "%s"}\n}'
    wheels = []
    for run, (serial, when) in enumerate(
        [
            ("93ac5038-7890-4ba4-822f-f6841dd3ebb8", "2026-12-06T11:39:52Z"),
            ("d5a3ebe1-7f90-4f27-8497-cf42fb1123c4", "x"),
        ]
    ):
        wheel = tmp_path / f"{run}.whl"
        files = {"m/lib.so": b"same", "m-0.1.dist-info/sboms/m.cyclonedx.json": (sbom % (serial, when)).encode()}
        record = "".join(f"{record_line(n, d)}\n" for n, d in files.items()) + "m-0.1.dist-info/RECORD,,\n"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
            for name, data in [*files.items(), ("m-0.1.dist-info/RECORD", record.encode())]:
                out.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
        assert steady_wheel(wheel)
        wheels.append(wheel.read_bytes())
    assert wheels[0] == wheels[1]
    with zipfile.ZipFile(tmp_path / "0.whl") as done:
        steady = done.read("m-0.1.dist-info/sboms/m.cyclonedx.json")
        assert b'"timestamp": "1980-01-01T00:00:00Z"' in steady and b"93ac5038" not in steady
        assert (
            record_line("m-0.1.dist-info/sboms/m.cyclonedx.json", steady)
            in done.read("m-0.1.dist-info/RECORD").decode()
        )
    stage = " ".join(stage_of("copy-core"))
    assert "wheel_sbom.py /opt/mirrorkit/copy-core/wheels/*.whl" in stage


def stub(folder: Path, path: str) -> Path:
    """An executable at folder/path that prints its pid, then each argument on a line of its own."""
    exe = folder / path
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text('#!/bin/sh\necho "$$"\nfor a in "$@"; do printf \'%s\\n\' "$a"; done\n')
    exe.chmod(0o755)
    return exe


def run_entrypoint(args: list[str], env: dict[str, str]) -> tuple[int, list[str], str]:
    """The entrypoint's exit code, the arguments the stub it exec'd received, and its stderr; the stub must run in the
    entrypoint's own process (exec), so that the pod's SIGTERM reaches it."""
    base = {"PATH": os.environ["PATH"]}
    proc = subprocess.Popen(
        [str(ENTRYPOINT), *args], env=base | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        return proc.returncode, [], err
    pid, *got = out.splitlines()
    assert int(pid) == proc.pid, "the entrypoint must exec the command, not run it as a child"
    return proc.returncode, got, err


DRIVER_ARGS = [
    "--properties-file",
    "/opt/spark/conf/spark.properties",
    "--class",
    "org.apache.spark.deploy.PythonRunner",
    "local:///opt/mirrorkit/main.py",
    "run",
    "--config",
    "/etc/mirrorkit/mirror.yaml",
]


def test_entrypoint_runs_the_driver_as_spark_submit_in_client_mode_bound_to_the_pod_ip(tmp_path):
    stub(tmp_path, "bin/spark-submit")
    env = {"SPARK_HOME": str(tmp_path), "SPARK_DRIVER_BIND_ADDRESS": "10.1.2.3"}
    code, got, err = run_entrypoint(["driver", *DRIVER_ARGS], env)
    assert code == 0, err
    assert got == ["--conf", "spark.driver.bindAddress=10.1.2.3", "--deploy-mode", "client", *DRIVER_ARGS]


def test_entrypoint_refuses_a_driver_without_its_bind_address(tmp_path):
    stub(tmp_path, "bin/spark-submit")
    code, got, err = run_entrypoint(["driver", *DRIVER_ARGS], {"SPARK_HOME": str(tmp_path)})
    assert code == 64 and got == []
    assert "SPARK_DRIVER_BIND_ADDRESS" in err


EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@mirror-driver-svc.ns.svc:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "2",
    "SPARK_EXECUTOR_MEMORY": "1024m",
    "SPARK_APPLICATION_ID": "spark-0123abcd",
    "SPARK_EXECUTOR_POD_IP": "10.1.2.4",
    "SPARK_EXECUTOR_POD_NAME": "mirror-exec-3",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_CONF_DIR": "/opt/spark/conf",
}


def test_entrypoint_runs_an_executor_as_sparks_kubernetes_executor_backend(tmp_path):
    stub(tmp_path, "java/bin/java")
    options = {i: f"-Dopt{i}=v {i}" for i in range(12)}  # 10 and 11 sort after 9; a value with a space stays one
    env = EXECUTOR_ENV | {f"SPARK_JAVA_OPT_{i}": v for i, v in reversed(options.items())}
    env |= {"JAVA_HOME": str(tmp_path / "java"), "SPARK_HOME": "/opt/spark", "SPARK_CLASSPATH": "/extra/*"}
    code, got, err = run_entrypoint(["executor"], env | {"SPARK_JAVA_OPT_X": "-Dnot=an-option"})
    assert code == 0, err
    assert got == [
        "-Xms1024m",
        "-Xmx1024m",
        *options.values(),
        "-cp",
        "/extra/*:/opt/spark/conf:/opt/spark/jars/*",
        "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
        *("--driver-url", EXECUTOR_ENV["SPARK_DRIVER_URL"], "--executor-id", "3", "--cores", "2"),
        *("--app-id", "spark-0123abcd", "--hostname", "10.1.2.4", "--resourceProfileId", "0"),
        *("--podName", "mirror-exec-3"),
    ]


def test_entrypoint_refuses_an_executor_missing_what_spark_sets(tmp_path):
    stub(tmp_path, "java/bin/java")
    for name in ("SPARK_DRIVER_URL", "SPARK_EXECUTOR_MEMORY", "SPARK_EXECUTOR_POD_NAME"):
        env = {k: v for k, v in EXECUTOR_ENV.items() if k != name} | {"JAVA_HOME": str(tmp_path / "java")}
        code, got, err = run_entrypoint(["executor"], env)
        assert code == 64 and got == [], name
        assert name in err


def test_entrypoint_runs_anything_else_as_a_mirror_command():
    out = subprocess.run(
        [str(ENTRYPOINT), "--help"],
        env=os.environ | {"MIRRORKIT_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.startswith("usage: mirrorkit")
    assert "validate" in out.stdout


def test_entrypoint_validates_and_runs_the_mirror_in_local_mode(
    plaintext_cluster, source_cluster, mirror_cli, tmp_path, unique
):
    topic = f"img-{unique}"
    create_topics(plaintext_cluster.admin, {topic: 2})
    now = int(time.time() * 1000)  # an old timestamp would let the broker's retention delete the records mid-test
    records = [Record(i % 2, f"k{i}".encode(), f"v{i}".encode(), (("h", b"1"),), now + i) for i in range(500)]
    produce(plaintext_cluster.client, topic, records)
    raw = one_flow_config(plaintext_cluster, source_cluster, [topic], tmp_path / "ckpt", target_alias="cloud")
    config = mirror_cli.config_file(raw)
    env = mirror_cli.env | {"MIRRORKIT_PYTHON": sys.executable}
    checked = subprocess.run([str(ENTRYPOINT), "validate", "--config", str(config)], env=env, capture_output=True)
    assert checked.returncode == 0, checked.stderr

    run = subprocess.run(
        mirror_cli.command(config, "--available-now", "--master", "local[2]", launcher=[str(ENTRYPOINT)]),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "flow onprem->cloud: 500 records" in run.stderr
    assert "flow onprem->cloud: 500 of 500 records (100.0%)" in run.stderr, "the progress line's final figures"
    assert source_cluster.secret not in run.stderr + run.stdout
    got = read_all(source_cluster.client, f"onprem.{topic}", expected=500)
    assert_each_record_once_in_order(f"onprem.{topic}", got, records)
