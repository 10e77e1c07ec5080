"""Compile the real-time JVM copier (spark_app/jvm_copier) into its jar: the one recipe set-up (.ci/setup) and the
mirror image's build stage (images/mirror/Dockerfile) both run, so javac's flags are written here alone.

The jar is the same bytes from the same sources and class path: its entries are sorted by name, each dated
1980-01-01 (the earliest a zip can hold), with a manifest of one line. JDK 17's `jar` tool dates every entry with
the time of the build and has no option to fix it (`--date` came in JDK 19).

Usage: python images/build_copier.py --classpath CP --jar OUT [--sources DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "spark_app" / "jvm_copier"
# Every lint but `path` (the class path's jars name others in their manifests that Spark does not ship), as errors.
JAVAC_FLAGS = ("--release", "17", "-Xlint:all,-path", "-Werror")
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
MANIFEST = b"Manifest-Version: 1.0\r\n\r\n"


def compile_classes(sources: Path, classpath: str, classes: Path) -> None:
    files = sorted(str(p) for p in sources.rglob("*.java"))
    if not files:
        raise SystemExit(f"no Java sources under {sources}")
    subprocess.run(["javac", *JAVAC_FLAGS, "-cp", classpath, "-d", str(classes), *files], check=True)


def write_jar(classes: Path, jar: Path) -> None:
    """A jar of every file under `classes`, in name order, each entry dated ZIP_EPOCH."""
    partial = jar.with_name(jar.name + ".part")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for name, data in [("META-INF/", b""), ("META-INF/MANIFEST.MF", MANIFEST)]:
            out.writestr(_entry(name), data)
        for path in sorted(p for p in classes.rglob("*") if p.is_file()):
            out.writestr(_entry(path.relative_to(classes).as_posix()), path.read_bytes())
    partial.rename(jar)


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
    info.compress_type = zipfile.ZIP_STORED if name.endswith("/") else zipfile.ZIP_DEFLATED
    info.external_attr = (0o40755 if name.endswith("/") else 0o100644) << 16
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classpath", required=True, help="Spark's jars and the `copier` group's kafka-clients")
    parser.add_argument("--jar", type=Path, required=True, help="the jar to write")
    parser.add_argument("--sources", type=Path, default=SOURCES, help=f"the copier's sources (default: {SOURCES})")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix=".copier-", dir=args.jar.parent))
    try:
        compile_classes(args.sources, args.classpath, work / "classes")
        write_jar(work / "classes", args.jar)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"built {args.jar}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
