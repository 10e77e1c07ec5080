"""The direct pins of pyproject.toml, read with the standard library only, so that what derives a version from a
pin (the lock test, the SparkApplication's `sparkVersion`; the image installs pyspark from the lock) reads the one
source.

Usage: python3 -m infra.versions PACKAGE   # prints the version pyproject.toml pins, e.g. for pyspark
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
# A PEP 508 requirement pinned exactly: name, optional extras, `==version`, optional environment marker.
_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*(?P<version>[^;\s]+)\s*(?:;.*)?$")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it: `PyYAML` and `pyyaml`, `types_x` and `types-x` are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(path: Path = PYPROJECT) -> list[str]:
    """Every requirement string of the project: its dependencies and all its extras."""
    with path.open("rb") as fh:
        project = tomllib.load(fh)["project"]
    extras = project.get("optional-dependencies", {})
    return [*project.get("dependencies", []), *(r for group in extras.values() for r in group)]


def pins(path: Path = PYPROJECT) -> dict[str, str]:
    """Normalized name -> pinned version, for every requirement; raises on one that is not pinned exactly."""
    out: dict[str, str] = {}
    for requirement in requirements(path):
        match = _PIN.match(requirement)
        if match is None:
            raise ValueError(f"{path.name}: '{requirement}' is not pinned with '=='; every direct dependency is")
        out[normalize(match["name"])] = match["version"]
    return out


def pinned(package: str, path: Path = PYPROJECT) -> str:
    """The version pyproject.toml pins for `package`."""
    try:
        return pins(path)[normalize(package)]
    except KeyError:
        raise KeyError(f"{path.name} pins no '{package}'") from None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(pinned(sys.argv[1]))
