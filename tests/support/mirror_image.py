"""The mirror's image as `images/mirror/build` leaves it: an OCI archive in the cache, and the name it carries."""

from __future__ import annotations

import json
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHIVES = Path.home() / ".cache" / "mirrorkit" / "image"
BUILD_HINT = "run `images/mirror/build` (or `bench/node/build`, which runs it)"


@dataclass(frozen=True)
class MirrorImage:
    ref: str  # the tag the build gives it
    digest: str  # its manifest's, as a node stores it
    archive: Path


def built_image() -> MirrorImage:
    """The image of this checkout's version, or a failure that says how to build it."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    archive = ARCHIVES / f"mirrorkit-mirror-{version}.tar"
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} is missing: {BUILD_HINT}")
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive} holds no index.json: not an OCI archive"
        (manifest,) = json.load(member)["manifests"]
    return MirrorImage(f"localhost/mirrorkit/mirror:{version}", manifest["digest"], archive)
