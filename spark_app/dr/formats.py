"""MirrorMaker 2's wire formats: Checkpoint and Heartbeat (connect-mirror-client 4.1.1), OffsetSync (connect-mirror).

Kafka's protocol types: INT16/INT32/INT64 big-endian, STRING an INT16 length then UTF-8. MM2's own classes decode
what these encode (tests/test_dr_formats.py runs them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TypeVar


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        size = self.take(">h")
        if size < 0 or self.at + size > len(self.data):
            raise ValueError("bad STRING length")
        value = self.data[self.at : self.at + size].decode()
        self.at += size
        return value

    def left(self) -> int:
        return len(self.data) - self.at

    def version(self) -> None:
        version = self.take(">h")
        if version != 0:
            raise ValueError(f"unknown record version {version}")


@dataclass(frozen=True)
class Checkpoint:
    """key {group, topic, partition}; value header {version=0} + {upstreamOffset, offset, metadata}."""

    group: str
    topic: str  # the target (renamed) topic
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""
    deleted: bool = False  # a tombstone: the group is gone, its key holds nothing any more (a null value)

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">hqq", 0, self.upstream_offset, self.downstream_offset) + _string(self.metadata)

    def record_value(self) -> bytes | None:
        """What the topic holds for this checkpoint: its value, or null for a tombstone."""
        return None if self.deleted else self.value()

    @classmethod
    def tombstone(cls, group: str, topic: str, partition: int) -> Checkpoint:
        return cls(group, topic, partition, -1, -1, deleted=True)

    @classmethod
    def decode_key(cls, key: bytes) -> tuple[str, str, int]:
        """(group, topic, partition) from a key."""
        k = _Reader(key)
        return k.string(), k.string(), k.take(">i")

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Checkpoint:
        group, topic, partition = cls.decode_key(key)
        v = _Reader(value)
        v.version()
        return cls(group, topic, partition, v.take(">q"), v.take(">q"), v.string())


@dataclass(frozen=True)
class OffsetSync:
    """MM2's key {topic, partition} and value {upstreamOffset, offset}, followed by fields of ours: an INT32 slot
    and an INT8 kind in the key, and the run's last source offset (INT64) in the value (spark_app.dr.syncs). MM2's
    own classes read the MM2 part and ignore the rest; a sync without them (an older mirror's) is a mirrored run of
    one record."""

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    slot: int = -1
    last_offset: int | None = None  # None: the same as upstream_offset
    kind: int = 0  # spark_app.dr.syncs: 0 a mirrored run, 1 an echo run, 2 a local span
    deleted: bool = False  # a tombstone: the slot holds nothing any more (its value is null on the topic)

    def key(self) -> bytes:
        return _string(self.topic) + struct.pack(">iib", self.partition, self.slot, self.kind)

    def value(self) -> bytes:
        last = self.upstream_offset if self.last_offset is None else self.last_offset
        return struct.pack(">qqq", self.upstream_offset, self.downstream_offset, last)

    def mm2_record(self) -> tuple[bytes, bytes]:
        """MM2's own key and value, without our fields: what MM2 writes, for an MM2 that takes the flow back."""
        return _string(self.topic) + struct.pack(">i", self.partition), struct.pack(
            ">qq", self.upstream_offset, self.downstream_offset
        )

    def record_value(self) -> bytes | None:
        """What the topic holds for this sync: its value, or null for a tombstone."""
        return None if self.deleted else self.value()

    @classmethod
    def tombstone(cls, topic: str, partition: int, slot: int, kind: int) -> OffsetSync:
        return cls(topic, partition, -1, -1, slot, None, kind, deleted=True)

    @classmethod
    def decode_key(cls, key: bytes) -> tuple[str, int, int, int]:
        """(topic, partition, slot, kind) from a key; slot -1 and kind 0 in MM2's own layout."""
        k = _Reader(key)
        topic, partition = k.string(), k.take(">i")
        slot = k.take(">i") if k.left() >= 4 else -1
        kind = k.take(">b") if k.left() >= 1 else 0
        return topic, partition, slot, kind

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> OffsetSync:
        topic, partition, slot, kind = cls.decode_key(key)
        v = _Reader(value)
        upstream, downstream = v.take(">q"), v.take(">q")
        return cls(topic, partition, upstream, downstream, slot, v.take(">q") if v.left() >= 8 else None, kind)


@dataclass(frozen=True)
class Heartbeat:
    """key {sourceClusterAlias, targetClusterAlias}; value header {version=0} + {timestamp}."""

    source: str
    target: str
    timestamp_ms: int

    def key(self) -> bytes:
        return _string(self.source) + _string(self.target)

    def value(self) -> bytes:
        return struct.pack(">hq", 0, self.timestamp_ms)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Heartbeat:
        k, v = _Reader(key), _Reader(value)
        source, target = k.string(), k.string()
        v.version()
        return cls(source, target, v.take(">q"))


_R = TypeVar("_R", Checkpoint, OffsetSync, Heartbeat)


def decode_or_none(kind: type[_R], key: bytes | None, value: bytes | None) -> _R | None:
    """The record decoded as `kind`, or None for a foreign or damaged record (MM2 skips those too)."""
    if key is None or value is None:
        return None
    try:
        return kind.decode(key, value)
    except (ValueError, struct.error):
        return None
