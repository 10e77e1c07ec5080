"""The mirror's `run` as a test starts it in a subprocess: the config file, the command line and the environment.

Tests get it from the `mirror_cli` fixture (tests/conftest.py), whose presence marks them `spark`: `run` starts Spark
in the subprocess, which no fixture of the test would otherwise show.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# `python -m spark_app`, and the console script set-up installs next to this interpreter, as `mirrorkit` is on PATH
# in the image.
PYTHON_MODULE = (sys.executable, "-m", "spark_app")
CONSOLE_SCRIPT = (str(Path(sys.executable).parent / "mirrorkit"),)


@dataclass(frozen=True)
class MirrorCli:
    folder: Path  # where config files go: the test's tmp_path
    env: dict[str, str] = field(default_factory=lambda: os.environ | {"PYSPARK_PYTHON": sys.executable})

    def config_file(self, config: dict, name: str = "mirror.yaml") -> Path:
        """`config` written as the YAML file `run --config` reads."""
        path = self.folder / name
        path.write_text(yaml.safe_dump(config))
        return path

    def command(self, config: Path, *options: str, launcher: Sequence[str] = PYTHON_MODULE) -> list[str]:
        """`run --config <config> <options>` behind `launcher`: the mirror's module by default, or the console script,
        or the image's entrypoint with its arguments."""
        return [*launcher, "run", "--config", str(config), *options]
