"""Date every entry of a Java KeyStore (JKS) of trusted certificates at one fixed time, in alias order.

Debian's ca-certificates-java writes the JVM's trust store (/etc/ssl/certs/java/cacerts) when Java is installed,
each certificate dated with the time of the install, so two builds of the image differ there alone. This rewrites the
store with the same certificates and aliases, each dated 1980-01-01, and its integrity digest computed again with
the store's password (Debian's, `changeit`, unless given). Only trusted-certificate entries are expected: a store
with a private key is refused, untouched.

Usage: python3 images/java_truststore.py STORE [--password PASSWORD]
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
from pathlib import Path

MAGIC, VERSION, TRUSTED = 0xFEEDFEED, 2, 2
FIXED_MS = 315_532_800_000  # 1980-01-01T00:00:00Z


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise ValueError("the key store ends early")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def int(self) -> int:
        (value,) = struct.unpack(">I", self.take(4))
        return int(value)

    def utf(self) -> bytes:
        """A Java writeUTF string, raw: its two-byte length and its bytes."""
        size = self.take(2)
        return size + self.take(struct.unpack(">H", size)[0])


def integrity(password: str, body: bytes) -> bytes:
    key = b"".join(struct.pack(">H", ord(c)) for c in password)
    return hashlib.sha1(key + b"Mighty Aphrodite" + body, usedforsecurity=False).digest()


def normalise(data: bytes, password: str) -> bytes:
    reader = Reader(data)
    if reader.int() != MAGIC or reader.int() != VERSION:
        raise ValueError("not a version 2 Java KeyStore (JKS)")
    entries = []
    for _ in range(reader.int()):
        tag = reader.int()
        if tag != TRUSTED:
            raise ValueError(f"entry of kind {tag}: only trusted certificates are expected")
        alias = reader.utf()
        reader.take(8)  # the entry's date
        kind = reader.utf()
        cert = reader.take(reader.int())
        entries.append((alias, kind, cert))
    body_end = reader.at
    if integrity(password, data[:body_end]) != reader.take(20) or reader.at != len(data):
        raise ValueError("the key store's integrity digest does not match its password")
    out = struct.pack(">III", MAGIC, VERSION, len(entries))
    for alias, kind, cert in sorted(entries):
        out += struct.pack(">I", TRUSTED) + alias + struct.pack(">q", FIXED_MS) + kind
        out += struct.pack(">I", len(cert)) + cert
    return out + integrity(password, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path)
    parser.add_argument("--password", default="changeit")
    args = parser.parse_args(argv)
    args.store.write_bytes(normalise(args.store.read_bytes(), args.password))
    return 0


if __name__ == "__main__":
    sys.exit(main())
