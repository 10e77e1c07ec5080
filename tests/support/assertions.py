"""What a mirror promises about the records it copies, as assertions that say where a copy went wrong."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from bench.testbed.clients import Record, by_partition
from spark_app.policy import PROVENANCE_HEADER, provenance


def stamped(sent: Sequence[Record], alias: str) -> list[Record]:
    """The records an `identity` flow from `alias` writes for `sent` (produced in this order to a new topic): each
    with the provenance header last, naming the alias and the record's source offset."""
    offsets: dict[int, int] = {}
    out = []
    for r in sent:
        offset = offsets[r.partition] = offsets.get(r.partition, -1) + 1
        out.append(dataclasses.replace(r, headers=(*r.headers, (PROVENANCE_HEADER, provenance(alias, offset)))))
    return out


def stamped_at(held: Sequence[Record], alias: str) -> list[Record]:
    """The records an `identity` flow from `alias` writes for the records its source `held` (as `read_all` read them,
    with their offsets): each with the provenance header last, naming the alias and the record's offset there."""
    return [dataclasses.replace(r, headers=(*r.headers, (PROVENANCE_HEADER, provenance(alias, _at(r))))) for r in held]


def _at(record: Record) -> int:
    if record.offset is None:
        raise ValueError(f"{record} carries no offset: read it with read_all")
    return record.offset


def assert_each_record_once_in_order(
    topic: str, got: Sequence[Record], sent: Sequence[Record], *, at_least_once: bool = False
) -> None:
    """Each partition of `topic` as read back (`got`) holds exactly the records `sent` to it, each once, in order.

    With `at_least_once`, a record may come again after its first copy (a killed run wrote a batch again): then
    the first copies must be exactly the records sent, in order. The sent records must then be unique, so that a
    repeat cannot be taken for a record sent twice.

    Fails naming the topic, every partition that differs, and the first offset there that does not match.
    """
    if at_least_once and len(set(sent)) != len(sent):
        raise ValueError("at_least_once needs records that differ from each other, to tell a repeat from a record")
    expected, found = by_partition(sent), by_partition(got)
    problems = []
    for partition in sorted(expected.keys() | found.keys()):
        read = found.get(partition, [])
        end = f"the partition ends at offset {_end(read)}" if read else "nothing was read from it"
        problem = _first_difference(expected.get(partition, []), _first_copies(read) if at_least_once else read, end)
        if problem:
            problems.append(f"  partition {partition}: {problem}")
    if problems:
        repeats = f"; {len(got) - len(set(got))} repeat(s) allowed" if at_least_once else ""
        head = f"topic '{topic}': {len(got)} record(s) read for {len(sent)} sent{repeats}"
        raise AssertionError("\n".join([head, *problems]))


def _first_copies(records: list[Record]) -> list[Record]:
    seen: set[Record] = set()
    firsts = []
    for r in records:
        if r not in seen:
            seen.add(r)
            firsts.append(r)
    return firsts


def _first_difference(sent: list[Record], read: list[Record], end: str) -> str | None:
    """Where `read` first departs from `sent`, or None if they are equal; `end` says where the partition ends."""
    at = next((i for i, (s, r) in enumerate(zip(sent, read, strict=False)) if s != r), min(len(sent), len(read)))
    if at == len(sent) == len(read):
        return None
    if at == len(sent):
        return f"{len(read) - at} record(s) more than sent, the first at offset {_offset(read, at)}: {_show(read[at])}"
    if at == len(read):
        return f"{len(sent) - at} record(s) missing ({end}), from its record #{at} as sent: {_show(sent[at])}"
    r = read[at]
    if r in read[:at]:
        why = "a repeat of a record read before it"
    elif r in sent[at:]:
        why = f"its record #{sent.index(r, at)} as sent: one before it was lost or comes later"
    else:
        why = "not a record that was sent (a field differs)"
    return (
        f"at offset {_offset(read, at)}, expected its record #{at} as sent {_show(sent[at])}, found {_show(r)}: {why}"
    )


def _offset(read: list[Record], at: int) -> str:
    """The offset read[at] was read at; its position in the read when the offset is not known."""
    return str(read[at].offset) if read[at].offset is not None else f"#{at} (read position)"


def _end(read: list[Record]) -> str:
    """The offset after the last record read."""
    return str(read[-1].offset + 1) if read[-1].offset is not None else f"#{len(read)} (read position)"


def _show(r: Record) -> str:
    """A record, short: long keys and values shortened with their length."""

    def short(b: bytes | None) -> str:
        return "None" if b is None else repr(b) if len(b) <= 40 else f"{b[:32]!r}...({len(b)} bytes)"

    headers = ", ".join(f"{k}={short(v)}" for k, v in r.headers)
    return f"(key={short(r.key)}, value={short(r.value)}, headers=[{headers}], timestamp_ms={r.timestamp_ms})"
