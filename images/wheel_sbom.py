"""Make the software bill of materials maturin writes into a wheel the same from build to build.

maturin puts a CycloneDX SBOM of the crates it linked into the wheel (`<name>.dist-info/sboms/*.cyclonedx.json`), with
a random serial number and the time of the build: two builds of the same sources give the same library and two
different wheels. This rewrites those two fields in place, the serial number as a UUID derived from the rest of the
SBOM (so it changes when the crates do) and the time as 1980-01-01, updates the wheel's RECORD, and writes the wheel
again with its entries in their order, dates and compression. The image's copy-core stage runs it
(images/mirror/Dockerfile).

Usage: python wheel_sbom.py WHEEL...
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import uuid
import zipfile
from pathlib import Path

SERIAL = re.compile(rb'"serialNumber"(\s*):(\s*)"urn:uuid:[0-9a-fA-F-]+"')
TIMESTAMP = re.compile(rb'"timestamp"(\s*):(\s*)"[^"]*"')
EPOCH = b"1980-01-01T00:00:00Z"


def steady_sbom(text: bytes) -> bytes:
    """The SBOM with its serial number derived from its content and its time at 1980-01-01."""
    blank = TIMESTAMP.sub(rb'"timestamp"\1:\2"' + EPOCH + b'"', text)
    serial = uuid.uuid5(uuid.NAMESPACE_URL, hashlib.sha256(SERIAL.sub(b"", blank)).hexdigest())
    return SERIAL.sub(rb'"serialNumber"\1:\2"urn:uuid:' + str(serial).encode() + b'"', blank)


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def steady_wheel(wheel: Path) -> bool:
    """Rewrite `wheel` with steady SBOMs; whether it held any."""
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
        data = {info.filename: archive.read(info) for info in infos}
    sboms = [name for name in data if "/sboms/" in name and name.endswith(".json")]
    if not sboms:
        return False
    for name in sboms:
        data[name] = steady_sbom(data[name])
    (record,) = [name for name in data if name.endswith(".dist-info/RECORD")]
    lines = data[record].decode().splitlines()
    for i, line in enumerate(lines):
        name = line.rsplit(",", 2)[0]
        if name in sboms:
            lines[i] = record_line(name, data[name])
    data[record] = ("\n".join(lines) + "\n").encode()
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w") as out:
        for info in infos:
            out.writestr(info, data[info.filename])
    partial.replace(wheel)
    return True


def main(paths: list[str]) -> None:
    for path in paths:
        print(f"{path}: {'SBOM made steady' if steady_wheel(Path(path)) else 'no SBOM'}")


if __name__ == "__main__":
    main(sys.argv[1:])
