"""The Spark streaming source that plans each micro-batch as source offset ranges, one per topic-partition.

Spark Structured Streaming keeps the mirror's positions: each batch's end offsets go to the query's offset log
before the batch runs, and a restart resumes from the last committed batch. The offsets are the Kafka source's
own shape, `{"topic": {"partition": next offset}}`. Each task the source plans copies its ranges as it reads them:
the driver hands the planner the batch's copier (spark_app.range_copy) as a pickle in COPIER_FILE, each planned
partition carries it, and the task's read runs it and yields one landing row per range (LANDED_SCHEMA). Records are
read and written with librdkafka inside that task, so they never pass through the JVM, and a batch takes one Python
worker per task, not one to read the ranges and another to copy them.

Where a partition starts: at the offset adopted from MirrorMaker 2 (spark_app.dr.adopt) when the flow has one for it,
else at the flow's `start_from` (earliest or latest) for a topic the query meets for the first time, and at its
earliest offset for a partition added to a topic it already copies. End offsets are the last stable offsets
(read_committed), so an open transaction is waited for, never half copied. A partition that does not answer (its
leader offline) gets no range while the others are planned as usual: it keeps its position, and is asked again
every `OFFLINE_RECHECK_S`. A source that stops answering altogether is waited for up to `UNREACHABLE_GIVE_UP_S` (no
new batch meanwhile); then the query fails with a message naming the cluster. While the driver's pause file exists
no new batch is planned either, so the driver can stop the query between batches (Spark's own stop cancels a batch in
flight).

Spark's offset log holds more than offsets: per topic, the topic id (KIP-516) its positions belong to, so a topic
deleted and made again, even refilled past the old position, is told from the same one and copied from its log
start (reported as offsets that went back); and the topics the flow stopped selecting, with their positions, for
TOPIC_GONE_GRACE_S: a topic whose metadata failed for one topic-sync round, or that was not allowed for a while, resumes
where it stood when it returns, instead of being met as a new topic.
"""

from __future__ import annotations

import json
import logging
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark import TaskContext
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from . import clients
from .clients import Partition, PartitionOffsets
from .config import TOPIC_GONE_GRACE_S, ClusterConfig
from .errors import ClusterUnreachable
from .ranges import LANDED_SCHEMA, Landing, OffsetRange

log = logging.getLogger(__name__)
T = TypeVar("T")

UNREACHABLE_GIVE_UP_S = 300.0  # a source or target down this long stops the mirror (the producer's delivery timeout)
# A partition that did not answer is asked again alone, this often and with this short a wait: librdkafka waits its
# whole request timeout for a leader it cannot reach, and asked with the others it would hold up every batch.
OFFLINE_RECHECK_S = 10.0
OFFLINE_ASK_S = 2.0
# How long `run --available-now` waits for every partition to answer before it fixes where it ends.
AVAILABLE_NOW_WAIT_S = 60.0

SparkOffsets = dict[str, dict[str, int]]  # {"topic": {"partition": offset}}: the shape of Spark's offset log
# Keys of the offset log that are no topic names (Kafka's names hold only letters, digits, '.', '_' and '-').
IDS_KEY = "#ids"  # per topic, the id of the topic its positions belong to
GONE_KEY = "#gone"  # per topic the flow no longer selects, since when (epoch seconds)

PAUSE_FILE = "pause"
RECORD_BYTES_FILE = "record-bytes.json"
COPIER_FILE = "copier.pickle"
# A topic none of whose records has landed since the mirror started has no mean record size yet. The planner reads a
# sample of the records it is about to copy (clients.mean_record_bytes, once per topic and query run), so the first
# batch is held to max_bytes like the others, not cut short. Where the sample read nothing, each of its records counts
# as `max_bytes / FIRST_BATCH_RECORDS`, so a batch takes at most this many of them (plus one per partition). Not the
# flow's mean: a 1 MB topic joining a flow of 1 KB ones would be planned as 1 KB records, the very overshoot the
# per-topic bound is there to prevent.
FIRST_BATCH_RECORDS = 10_000


@dataclass(frozen=True)
class Planned:
    """One entry of the query's offset log: positions, the ids of their topics, and topics no longer selected."""

    offsets: SparkOffsets
    ids: dict[str, str] = field(default_factory=dict)
    gone: dict[str, float] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Planned:
        """Read what Spark hands back; an entry written before ids were kept has none (then none is compared)."""
        offsets = {t: {p: int(o) for p, o in parts.items()} for t, parts in raw.items() if not t.startswith("#")}
        return cls(offsets, dict(raw.get(IDS_KEY, {})), dict(raw.get(GONE_KEY, {})))

    def dump(self) -> dict[str, Any]:
        out: dict[str, Any] = {t: dict(parts) for t, parts in self.offsets.items()}
        if self.ids:
            out[IDS_KEY] = dict(sorted(self.ids.items()))
        if self.gone:
            out[GONE_KEY] = dict(sorted(self.gone.items()))
        return out


class RangeCopy(Protocol):
    """What copies a batch's ranges in its tasks (spark_app.range_copy.RangeCopier): one landing per range."""

    def copy(self, ranges: list[OffsetRange], slot: int = 0) -> list[Landing]: ...


class RangeGroup(InputPartition):
    """The ranges one Spark task copies, with one consumer and one producer, and the pickled `RangeCopy` that copies
    them: the planner never unpickles it, so its process does not import the copy's modules."""

    def __init__(self, ranges: list[OffsetRange], copier: bytes) -> None:
        self.ranges = ranges
        self.copier = copier


def plan_source_options(
    source: ClusterConfig, subscription: dict[str, int], start_from: str, tasks: int, max_records: int, max_bytes: int,
    driver_dir: Path, adopted: SparkOffsets | None = None, resume: SparkOffsets | None = None,
) -> dict[str, str]:  # fmt: skip
    """The options `spark.readStream.format(OffsetRangeSource.name())` takes (all strings, no secret).

    The source is planned in a Python worker, not in the driver's process, so the driver talks to it through three
    files in `driver_dir`: while PAUSE_FILE exists a continuous query plans no new batch (the driver stops it
    between batches, or catches up a quarantined topic), RECORD_BYTES_FILE holds each topic's mean record size so
    far, by which a batch is held to `max_bytes`, and COPIER_FILE the copier of the next batch (`write_copier`).
    `adopted` starts partitions the checkpoint does not hold where MirrorMaker 2 stopped; `resume` starts partitions
    where a real-time run of the flow got to, past its older checkpoint (spark_app.realtime).
    """
    return {
        "source": source.model_dump_json(),
        "subscription": json.dumps(subscription),
        "start_from": start_from,
        "tasks": str(tasks),
        "adopted": json.dumps(adopted or {}),
        "resume": json.dumps(resume or {}),
        "driver_dir": str(driver_dir),
        "max_records_per_trigger": str(max_records),
        "max_bytes_per_trigger": str(max_bytes),
    }


def write_record_bytes(driver_dir: Path, mean_bytes: Mapping[str, float]) -> None:
    """Tell the planner each topic's mean record size (key and value bytes), atomically. The file lives in the query
    run's own folder, written and read by the same release, so its format is free to change."""
    tmp = driver_dir / f"{RECORD_BYTES_FILE}.tmp"
    tmp.write_text(json.dumps(dict(mean_bytes)))
    tmp.replace(driver_dir / RECORD_BYTES_FILE)


def write_copier(driver_dir: Path, copier: RangeCopy) -> None:
    """Hand the planner the copier of the batches it plans from now on, atomically: the topics they may write (those
    not quarantined) and what the target topics take. Like RECORD_BYTES_FILE, written and read by the same release."""
    tmp = driver_dir / f"{COPIER_FILE}.tmp"
    tmp.write_bytes(pickle.dumps(copier))
    tmp.replace(driver_dir / COPIER_FILE)


def split_ranges(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """At most `tasks` groups of whole ranges, balanced by record count (largest first to the lightest group)."""
    groups: list[list[OffsetRange]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    loads = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: -r.size):
        i = loads.index(min(loads))
        groups[i].append(r)
        loads[i] += r.size
    return [g for g in groups if g]


class OffsetRangeSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "mirrorkit-offset-ranges"

    def schema(self) -> str:
        return LANDED_SCHEMA

    def streamReader(self, schema: StructType) -> OffsetRangeReader:
        return OffsetRangeReader(dict(self.options))


class OffsetRangeReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Runs in Spark's Python planner process next to the driver; one instance per query run."""

    def __init__(self, options: dict[str, str]) -> None:
        self.source = ClusterConfig.model_validate_json(options["source"])
        self.subscription: dict[str, int] = json.loads(options["subscription"])
        self.start_from = options["start_from"]
        self.tasks = int(options["tasks"])
        self.max_records = int(options["max_records_per_trigger"])
        self.max_bytes = int(options["max_bytes_per_trigger"])
        self.pause_file = Path(options["driver_dir"]) / PAUSE_FILE
        self.record_bytes_file = Path(options["driver_dir"]) / RECORD_BYTES_FILE
        self.copier_file = Path(options["driver_dir"]) / COPIER_FILE
        self.adopted: SparkOffsets = json.loads(options.get("adopted") or "{}")
        self.resume: SparkOffsets = json.loads(options.get("resume") or "{}")
        self._admin: AdminClient | None = None
        self._available_now_end: SparkOffsets | None = None
        self._available_now_ids: dict[str, str] = {}
        self._down_since: float | None = None
        self._offline: dict[Partition, float] = {}  # partitions that did not answer -> when to ask again
        self._sampled: dict[str, float | None] = {}  # per topic sampled, its mean record size (None: nothing read)

    def initialOffset(self) -> SparkOffsets:
        return {}  # every partition starts where `_starts` says: the checkpoint holds no position yet

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end offsets this run copies to. A partition that does not answer (a new topic whose leader is not
        known yet, or one offline) is asked again for up to AVAILABLE_NOW_WAIT_S, so a run does not end without it
        by chance; one still silent then is left for the next run, with the warning that names it."""
        deadline = time.monotonic() + AVAILABLE_NOW_WAIT_S
        while True:
            ends = self._until_answered(lambda: self._list(OffsetSpec.latest()))
            silent = [tp for tp in self._offline if str(tp[1]) not in ends.get(tp[0], {})]
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(1.0)
            self._offline.update(dict.fromkeys(silent, 0.0))  # due again now
        self._available_now_end = ends
        self._available_now_ids = self._until_answered(self._topic_ids)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if self.pause_file.exists():
            return start  # the driver is stopping this query: no new batch (an available-now run ends here)
        was = Planned.parse(start)
        if self._available_now_end is not None:  # an empty answer would end the run early: wait for a real one
            end = self.end_of(was, self._available_now_end, self._available_now_ids, time.time())
            starts = self._until_answered(lambda: self._starts(was, end))
        else:
            try:
                end = self.end_of(was, self._list(OffsetSpec.latest()), self._topic_ids(), time.time())
                starts = self._starts(was, end)
            except KafkaException as err:
                self._note_down(err)
                return start  # no new batch until the source answers
            self._down_since = None
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else self.max_records
        limited = limit_offsets(starts, end.offsets, max_rows, self.max_bytes, self._record_bytes(starts, end.offsets))
        return Planned(limited, end.ids, end.gone).dump()

    def end_of(self, start: Planned, latest: SparkOffsets, ids: dict[str, str], now: float) -> Planned:
        """The newest positions: `latest` where a partition answered; the checkpoint's where it did not (no range,
        nothing skipped), unless its topic was made again; and the positions of topics the flow no longer selects,
        kept for TOPIC_GONE_GRACE_S. A topic whose id did not answer keeps the one it had."""
        ids = {t: i for t, i in start.ids.items() if t in start.offsets or t in self.subscription} | ids
        remade = {t for t, i in ids.items() if start.ids.get(t, i) != i}
        offsets = kept_where_unanswered(latest, start.offsets, self.subscription, remade)
        gone: dict[str, float] = {}
        for topic, positions in start.offsets.items():
            since = start.gone.get(topic, now)
            if topic not in self.subscription and now - since < TOPIC_GONE_GRACE_S:
                offsets[topic], gone[topic] = positions, since
        return Planned(offsets, {t: i for t, i in ids.items() if t in offsets}, gone)

    def _topic_ids(self) -> dict[str, str]:
        if self._admin is None:
            self._admin = clients.admin(self.source)
        return clients.topic_ids(self._admin, self.subscription, timeout_s=OFFLINE_ASK_S)

    def _mean_bytes(self) -> dict[str, float]:
        """Each topic's mean record size as the driver wrote it last; none before a record landed."""
        try:
            means: dict[str, float] = json.loads(self.record_bytes_file.read_text())
        except (OSError, ValueError):
            return {}
        return means

    def _record_bytes(self, starts: SparkOffsets, latest: SparkOffsets) -> dict[str, float]:
        """Each topic's mean record size: as the driver wrote it last, else from a sample of the records its partition
        furthest behind is about to copy. A topic is sampled once per query run, and only with a backlog."""
        landed = self._mean_bytes()
        furthest: dict[str, tuple[int, str]] = {}  # per topic to sample: its largest backlog, and that partition
        for topic, offsets in latest.items():
            if topic in landed or topic in self._sampled:
                continue
            for p, end in offsets.items():
                behind = end - starts[topic][p]
                if behind > furthest.get(topic, (0, ""))[0] and (topic, int(p)) not in self._offline:
                    furthest[topic] = behind, p
        if furthest:
            at = {(t, int(p)): starts[t][p] for t, (_, p) in furthest.items()}
            found = clients.mean_record_bytes(self.source, at, timeout_s=OFFLINE_ASK_S)
            self._sampled.update({t: found.get(t) for t in furthest})
        return {t: mean for t, mean in self._sampled.items() if mean is not None} | landed

    def _until_answered(self, call: Callable[[], T]) -> T:
        while True:
            try:
                answer = call()
            except KafkaException as err:
                self._note_down(err)
                time.sleep(1.0)
                continue
            self._down_since = None
            return answer

    def _note_down(self, err: KafkaException) -> None:
        """Log a failed call; past `UNREACHABLE_GIVE_UP_S` of failures, stop with the cluster named."""
        self._down_since = self._down_since or time.monotonic()
        waited = time.monotonic() - self._down_since
        if waited > UNREACHABLE_GIVE_UP_S:
            raise ClusterUnreachable(self.source, waited, err.args[0].str()) from None
        log.warning("cluster '%s' did not answer (retrying): %s", self.source.alias, err.args[0].str())

    def _note_offline(self, found: PartitionOffsets, failed: dict[Partition, str], now: float) -> None:
        """Remember which partitions did not answer, saying so once when one stops and once when it answers again."""
        for (topic, partition), why in failed.items():
            if (topic, partition) not in self._offline:
                log.warning("cluster '%s': topic '%s' partition %d did not answer (%s); it gets no new range until it"
                            " does, the other partitions go on", self.source.alias, topic, partition, why)  # fmt: skip
            self._offline[(topic, partition)] = now + OFFLINE_RECHECK_S
        for topic, partition in found.keys() & self._offline.keys():
            del self._offline[(topic, partition)]
            log.info("cluster '%s': topic '%s' partition %d answers again", self.source.alias, topic, partition)

    def partitions(self, start_raw: dict[str, Any], end_raw: dict[str, Any]) -> list[InputPartition]:
        start, end = Planned.parse(start_raw), Planned.parse(end_raw)
        starts = self._starts(start, end)
        ranges = [
            OffsetRange(topic, int(p), min(starts[topic][p], offset), offset, reset_from(start, end, topic, p))
            for topic, offsets in end.offsets.items()
            for p, offset in offsets.items()
            if offset > starts[topic][p] or reset_from(start, end, topic, p) >= 0  # an empty one too: it is reported
        ]
        copier = self.copier_file.read_bytes()
        return [RangeGroup(g, copier) for g in split_ranges(ranges, self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """Copy the task's ranges; their landings. The task's index is its slot, as a transactional flow's producer
        is named (spark_app.transactions)."""
        assert isinstance(partition, RangeGroup)  # Spark hands back what `partitions` planned
        copier: RangeCopy = pickle.loads(partition.copier)
        context = TaskContext.get()
        for landing in copier.copy(partition.ranges, context.partitionId() if context is not None else 0):
            yield landing.to_tuple()

    def _starts(self, start: Planned, end: Planned) -> SparkOffsets:
        """Each end partition's start: the checkpoint's, else the adopted one, else `start_from` (new topic) or
        earliest (new partition, or one whose offsets went backwards or whose topic was made again, so its new records
        are copied from the log start). Where the log start does not answer, 0: the copier's consumer reads such a
        start from the log start."""
        held = start.offsets
        starts: SparkOffsets = {t: self.adopted.get(t, {}) | held.get(t, {}) for t in end.offsets}
        for t, offsets in self.resume.items():  # where a real-time run got to, unless the log is shorter now
            for p, offset in offsets.items():
                if p in end.offsets.get(t, {}) and starts[t].get(p, -1) < offset <= end.offsets[t][p]:
                    starts[t][p] = offset
        missing = [
            (t, p)
            for t, offsets in end.offsets.items()
            for p in offsets
            if p not in starts[t] or reset_from(start, end, t, p) >= 0
        ]
        earliest = self._list(OffsetSpec.earliest(), missing) if missing else {}
        for t, p in missing:
            new_topic = t not in held and t not in self.adopted and t not in self.resume  # copied before
            at_end = new_topic and self.start_from == "latest"
            starts[t][p] = end.offsets[t][p] if at_end else earliest.get(t, {}).get(p, 0)
        return starts

    def _list(self, spec: OffsetSpec, partitions: list[tuple[str, str]] | None = None) -> SparkOffsets:
        """The offsets of `partitions` (by default every partition of the flow's topics) that answer now.

        A partition that does not is left out, with a warning naming it, and is asked again alone every
        OFFLINE_RECHECK_S with a short wait. Raises KafkaException when the cluster does not answer at all.
        """
        if self._admin is None:
            self._admin = clients.admin(self.source)
        every = [(t, p) for t, n in self.subscription.items() for p in range(n)]
        wanted = [(t, int(p)) for t, p in partitions] if partitions is not None else every
        now = time.monotonic()
        found, failed = clients.list_offsets_each(
            self._admin, [tp for tp in wanted if tp not in self._offline], spec, read_committed=True
        )
        due = [tp for tp in wanted if tp in self._offline and self._offline[tp] <= now]
        if due:
            back, still = clients.list_offsets_each(
                self._admin, due, spec, read_committed=True, timeout_s=OFFLINE_ASK_S
            )
            found, failed = found | back, failed | still
        self._note_offline(found, failed, now)
        offsets: SparkOffsets = {}
        for (topic, partition), offset in found.items():
            offsets.setdefault(topic, {})[str(partition)] = offset
        return offsets


def kept_where_unanswered(
    latest: SparkOffsets, start: SparkOffsets, topics: dict[str, int], remade: set[str] | None = None
) -> SparkOffsets:
    """`latest`, plus the checkpoint's position for each partition of `topics` it lacks (that partition did not
    answer): it gets no range in this batch and keeps its position, so nothing of it is skipped or copied twice. A
    topic `remade` (deleted and made again) keeps none: its old positions mean nothing in the new log."""
    out = {t: dict(offsets) for t, offsets in latest.items()}
    for topic, count in topics.items():
        if topic in (remade or set()):
            continue
        for p, position in start.get(topic, {}).items():
            if int(p) < count:
                out.setdefault(topic, {}).setdefault(p, position)
    return out


def reset_from(start: Planned, end: Planned, topic: str, partition: str) -> int:
    """The checkpoint's position when the partition's offsets went backwards since (it lies past the end now, or
    its topic was deleted and made again: another id), else -1.

    This is the one place that notices it; the range carries it to the driver, which reports it. It reads only
    `start` and `end`, so a batch Spark runs again after a crash finds the same answer.
    """
    position = start.offsets.get(topic, {}).get(partition)
    if position is None:
        return -1
    was, now = start.ids.get(topic), end.ids.get(topic)
    return position if position > end.offsets[topic][partition] or (was and now and was != now) else -1


def limit_offsets(
    starts: SparkOffsets, latest: SparkOffsets, max_rows: int, max_bytes: int, mean_bytes: Mapping[str, float]
) -> SparkOffsets:
    """End offsets that take at most `max_rows` records and `max_bytes` bytes, each partition the same share of its
    backlog.

    A record counts at its topic's mean size (`mean_bytes`; FIRST_BATCH_RECORDS says what a record of a topic without
    one counts), so a backlog of large records makes the share smaller. Each partition with a backlog moves at least
    one record, so a bound is exceeded by at most one record per backlogged partition whose share rounds down to
    nothing (tests/test_planner.py checks these bounds). The share is a fraction, not a float, so rounding never takes
    a batch past a bound.
    """
    backlog = {(t, p): max(0, e - starts[t][p]) for t, offsets in latest.items() for p, e in offsets.items()}
    unknown = Fraction(max_bytes, FIRST_BATCH_RECORDS)
    cost = {t: Fraction(mean_bytes[t]) if t in mean_bytes else unknown for t in latest}
    records = sum(backlog.values())
    size = sum((behind * cost[t] for (t, _), behind in backlog.items()), Fraction(0))
    share = min(Fraction(1), Fraction(max_rows, max(records, 1)), max_bytes / size if size else Fraction(1))
    if share == 1:
        return latest
    out: SparkOffsets = {t: {} for t in latest}
    for (t, p), behind in backlog.items():
        out[t][p] = starts[t][p] + min(behind, max(1, behind * share.numerator // share.denominator) if behind else 0)
    return out
