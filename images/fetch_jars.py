"""Fetch the JVM artifacts listed in images/jars.toml into a local cache, idempotently.

Each group lands in `<cache>/<group>/` next to a stamp that records what was fetched. A second run whose stamp
matches the manifest and whose jars are all present touches no network. The test bed, the demo and the benchmarks
read the same manifest, so they cannot drift apart. `--image` selects the groups marked `image = true`, which the
mirror image bakes into Spark's jars (the Hadoop cloud connectors, 0.7 GB with the AWS SDK bundle); with no group
named, every other group is fetched, so a local set-up does not download what only the image needs.

Usage: python images/fetch_jars.py [--image] [--cache DIR] [GROUP ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = Path(__file__).resolve().parent / "jars.toml"
DEFAULT_CACHE = ROOT / ".cache" / "jars"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
STAMP = ".fetched.json"
FETCH_COMMAND = "python3 images/fetch_jars.py"


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str
    classifier: str = ""

    @classmethod
    def parse(cls, coordinate: str) -> Artifact:
        parts = coordinate.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(f"{MANIFEST.name}: '{coordinate}' is not group:artifact:version[:classifier]")
        return cls(*parts)

    @property
    def file_name(self) -> str:
        suffix = f"-{self.classifier}" if self.classifier else ""
        return f"{self.artifact}-{self.version}{suffix}.jar"

    @property
    def url(self) -> str:
        return f"{MAVEN_CENTRAL}/{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


@dataclass(frozen=True)
class JarGroup:
    name: str
    artifacts: tuple[Artifact, ...]
    transitive: bool
    image: bool

    def spec(self) -> dict:
        """What the stamp must match for the cached copy to count as current."""
        return {"artifacts": [a.url for a in self.artifacts], "transitive": self.transitive}


def load_manifest(path: Path = MANIFEST) -> dict[str, JarGroup]:
    with path.open("rb") as fh:
        raw = tomllib.load(fh)
    return {
        name: JarGroup(
            name=name,
            artifacts=tuple(Artifact.parse(c) for c in body["artifacts"]),
            transitive=bool(body.get("transitive", False)),
            image=bool(body.get("image", False)),
        )
        for name, body in raw.items()
    }


def cache_dir() -> Path:
    return Path(os.environ.get("MIRRORKIT_JAR_CACHE", DEFAULT_CACHE))


def cached_jars(group: str, cache: Path | None = None) -> list[Path]:
    """The jars of a fetched group; raises with the command to run when the cache is missing or stale."""
    groups = load_manifest()
    if group not in groups:
        raise KeyError(f"{MANIFEST}: no jar group '{group}'")
    folder = (cache or cache_dir()) / group
    jars = _current_jars(groups[group], folder)
    if jars is None:
        raise FileNotFoundError(
            f"jar group '{group}' is missing or out of date in {folder}; fetch it with: {FETCH_COMMAND} {group}"
        )
    return jars


def _current_jars(group: JarGroup, folder: Path) -> list[Path] | None:
    stamp = folder / STAMP
    if not stamp.is_file():
        return None
    recorded = json.loads(stamp.read_text())
    if recorded.get("spec") != group.spec():
        return None
    jars = [folder / name for name in recorded.get("files", [])]
    if not jars or not all(j.is_file() for j in jars):
        return None
    return jars


def fetch_group(group: JarGroup, cache: Path) -> tuple[list[Path], bool]:
    """Returns the group's jars and whether anything had to be downloaded."""
    folder = cache / group.name
    jars = _current_jars(group, folder)
    if jars is not None:
        return jars, False
    staging = Path(tempfile.mkdtemp(prefix=f".{group.name}-", dir=cache))
    try:
        if group.transitive:
            _resolve_with_maven(group, staging)
        else:
            for artifact in group.artifacts:
                _download(artifact.url, staging / artifact.file_name)
        files = sorted(p.name for p in staging.glob("*.jar"))
        (staging / STAMP).write_text(json.dumps({"spec": group.spec(), "files": files}, indent=1))
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [folder / f for f in files], True


def _download(url: str, dest: Path) -> None:
    partial = dest.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:
        shutil.copyfileobj(response, out)
    partial.rename(dest)


def _resolve_with_maven(group: JarGroup, dest: Path) -> None:
    """Let Maven resolve the runtime closure; a throwaway POM keeps the manifest the only list we maintain."""
    if shutil.which("mvn") is None:
        raise SystemExit(f"jar group '{group.name}' needs Maven ('mvn') on PATH to resolve its dependencies")
    deps = "".join(
        "<dependency>"
        f"<groupId>{a.group}</groupId><artifactId>{a.artifact}</artifactId><version>{a.version}</version>"
        + (f"<classifier>{a.classifier}</classifier>" if a.classifier else "")
        + "</dependency>"
        for a in group.artifacts
    )
    pom = dest / "pom.xml"
    pom.write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>mirrorkit.jars</groupId><artifactId>{group.name}</artifactId><version>0</version>"
        "<packaging>pom</packaging>"
        f"<dependencies>{deps}</dependencies></project>"
    )
    cmd = [
        "mvn", "-B", "-q", "-f", str(pom),
        "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={dest}",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True)
    pom.unlink()
    if result.returncode != 0:
        raise SystemExit(f"Maven could not resolve jar group '{group.name}':\n{result.stdout[-4000:]}{result.stderr}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("groups", nargs="*", help="groups to fetch (default: all but the image's)")
    parser.add_argument("--image", action="store_true", help="only the groups the mirror image bakes in")
    parser.add_argument("--cache", type=Path, default=None, help=f"cache folder (default: {DEFAULT_CACHE})")
    args = parser.parse_args(argv)

    manifest = load_manifest()
    unknown = [g for g in args.groups if g not in manifest]
    if unknown:
        parser.error(f"unknown jar group(s) {unknown}; {MANIFEST.name} has {sorted(manifest)}")
    names = args.groups or [n for n, g in manifest.items() if g.image == args.image]
    cache = args.cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    for name in names:
        jars, downloaded = fetch_group(manifest[name], cache)
        state = "fetched" if downloaded else "already present"
        print(f"jars {name}: {len(jars)} jar(s) {state} in {cache / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
