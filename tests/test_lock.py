"""requirements.lock is current: it holds pyproject.toml's direct pins as they are, and this virtualenv runs it.

When this fails, regenerate the lock with the command in its header and run `bash .ci/setup`.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from infra.versions import normalize, pins

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
_DIRECT = "mirrorkit (pyproject.toml)"


def read_lock() -> tuple[dict[str, str], set[str]]:
    """Normalized name -> locked version, and the names the lock says pyproject.toml asked for directly."""
    versions: dict[str, str] = {}
    direct: set[str] = set()
    current = None
    for line in LOCK.read_text().splitlines():
        if match := _ENTRY.match(line):
            current = normalize(match["name"])
            versions[current] = match["version"]
        elif current is not None and line.lstrip().startswith("#") and _DIRECT in line:
            direct.add(current)
    return versions, direct


def test_the_lock_holds_every_direct_pin_at_its_version_and_no_dropped_one():
    locked, direct = read_lock()
    pinned = pins()
    assert {n: (v, locked.get(n)) for n, v in pinned.items() if locked.get(n) != v} == {}
    assert direct == set(pinned), "the lock names direct dependencies that pyproject.toml no longer has"


def test_this_virtualenv_runs_the_locked_versions():
    locked, _ = read_lock()
    installed = {normalize(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    assert len(set(locked) & set(installed)) > len(pins()), "too few locked packages installed to compare"
    stale = {n: (installed[n], v) for n, v in locked.items() if n in installed and installed[n] != v}
    assert stale == {}, "installed != locked; run: bash .ci/setup"
