"""Plans each micro-batch of a throughput flow, in the driver, as source offset ranges, one per topic-partition.

The flow's batch log (spark_app.batch_log) keeps its positions: each batch's end offsets are logged before the batch
runs, and a restart resumes from the last committed batch. The offsets are the Kafka source's own shape,
`{"topic": {"partition": next offset}}`. `BatchPlanner.latest` says where the next batch ends, `ranges` splits it
into one group of ranges per Spark task, and each task copies its group (spark_app.range_copy).

Where a partition starts: at the offset adopted from MirrorMaker 2 (spark_app.dr.adopt) when the flow has one for it,
else at the flow's `start_from` (earliest or latest) for a topic the log meets for the first time, and at its
earliest offset for a partition added to a topic it already copies. End offsets are the last stable offsets
(read_committed), so an open transaction is waited for, never half copied. A partition that does not answer (its
leader offline) gets no range while the others are planned as usual: it keeps its position, and is asked again
every `OFFLINE_RECHECK_S`. A source that stops answering altogether is waited for up to `UNREACHABLE_GIVE_UP_S` (no
new batch meanwhile); then planning fails with a message naming the cluster.

The log holds more than offsets: per topic, the topic id (KIP-516) its positions belong to, so a topic deleted and
made again, even refilled past the old position, is told from the same one and copied from its log start (reported
as offsets that went back); and the topics the flow stopped selecting, with their positions, for TOPIC_GONE_GRACE_S:
a topic whose metadata failed for one topic-sync round, or that was not allowed for a while, resumes where it stood
when it returns, instead of being met as a new topic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec

from . import clients
from .batch_log import LogOffsets, Planned
from .clients import Partition, PartitionOffsets
from .config import TOPIC_GONE_GRACE_S, ClusterConfig
from .errors import ClusterUnreachable
from .ranges import Landing, OffsetRange

log = logging.getLogger(__name__)
T = TypeVar("T")

UNREACHABLE_GIVE_UP_S = 300.0  # a source or target down this long stops the mirror (the producer's delivery timeout)
# A partition that did not answer is asked again alone, this often and with this short a wait: librdkafka waits its
# whole request timeout for a leader it cannot reach, and asked with the others it would hold up every batch.
OFFLINE_RECHECK_S = 10.0
OFFLINE_ASK_S = 2.0
# How long `run --available-now` waits for every partition to answer before it fixes where it ends.
AVAILABLE_NOW_WAIT_S = 60.0

# A topic none of whose records has landed since the mirror started has no mean record size yet. The planner reads a
# sample of the records it is about to copy (clients.mean_record_bytes, once per topic and planner), so the first
# batch is held to max_bytes like the others, not cut short. Where the sample read nothing, each of its records counts
# as `max_bytes / FIRST_BATCH_RECORDS`, so a batch takes at most this many of them (plus one per partition). Not the
# flow's mean: a 1 MB topic joining a flow of 1 KB ones would be planned as 1 KB records, the very overshoot the
# per-topic bound is there to prevent.
FIRST_BATCH_RECORDS = 10_000


def split_ranges(ranges: list[OffsetRange], tasks: int) -> list[list[OffsetRange]]:
    """At most `tasks` groups of whole ranges, balanced by record count (largest first to the lightest group)."""
    groups: list[list[OffsetRange]] = [[] for _ in range(max(1, min(tasks, len(ranges))))]
    loads = [0] * len(groups)
    for r in sorted(ranges, key=lambda r: -r.size):
        i = loads.index(min(loads))
        groups[i].append(r)
        loads[i] += r.size
    return [g for g in groups if g]


class PlanningStopped(Exception):
    """The run was asked to stop while its planning waited for the source to answer."""


class BatchPlanner:
    """Plans one run of a flow's batches over a subscription, in the driver; one instance per run.

    `adopted` starts partitions the log does not hold where MirrorMaker 2 stopped; `resume` starts partitions where a
    real-time run of the flow got to, past its older log (spark_app.realtime). Once `stopping` is set, a wait for the
    source to answer ends with `PlanningStopped`.
    """

    def __init__(
        self, source: ClusterConfig, subscription: dict[str, int], start_from: str, tasks: int, max_records: int,
        max_bytes: int, adopted: LogOffsets | None = None, resume: LogOffsets | None = None,
        stopping: threading.Event | None = None,
    ) -> None:  # fmt: skip
        self.source = source
        self.subscription = subscription
        self.start_from = start_from
        self.tasks = tasks
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.adopted: LogOffsets = adopted or {}
        self.resume: LogOffsets = resume or {}
        self._stopping = stopping or threading.Event()
        self._admin: AdminClient | None = None
        self._available_now_end: LogOffsets | None = None
        self._available_now_ids: dict[str, str] = {}
        self._down_since: float | None = None
        self._offline: dict[Partition, float] = {}  # partitions that did not answer -> when to ask again
        self._sampled: dict[str, float | None] = {}  # per topic sampled, its mean record size (None: nothing read)

    def prepare_available_now(self) -> None:
        """Fix the end offsets this run copies to. A partition that does not answer (a new topic whose leader is not
        known yet, or one offline) is asked again for up to AVAILABLE_NOW_WAIT_S, so a run does not end without it
        by chance; one still silent then is left for the next run, with the warning that names it."""
        deadline = time.monotonic() + AVAILABLE_NOW_WAIT_S
        while True:
            ends = self._until_answered(lambda: self._list(OffsetSpec.latest()))
            silent = [tp for tp in self._offline if str(tp[1]) not in ends.get(tp[0], {})]
            if not silent or time.monotonic() > deadline:
                break
            self._pause()
            self._offline.update(dict.fromkeys(silent, 0.0))  # due again now
        self._available_now_end = ends
        self._available_now_ids = self._until_answered(self._topic_ids)

    def drop_other_lives(self, ids: Mapping[str, str]) -> None:
        """Topics made again in the middle of a batch, with the ids of their new lives: where an available-now run
        fixed its ends in another life (it started before the topic was made again), it copies nothing more of them;
        the next run goes on from the new life's positions."""
        if self._available_now_end is None:
            return
        for topic, new in ids.items():
            if self._available_now_ids.get(topic, new) != new:
                self._available_now_end.pop(topic, None)
                self._available_now_ids.pop(topic, None)

    def latest(self, start: Planned, mean_bytes: Mapping[str, float]) -> Planned:
        """Where the next batch ends: `start` itself when there is nothing new (or the source does not answer now),
        else at most `max_records` records and `max_bytes` bytes further, counting each topic's records at
        `mean_bytes` (what landed so far)."""
        if self._available_now_end is not None:  # an empty answer would end the run early: wait for a real one
            end = self.end_of(start, self._available_now_end, self._available_now_ids, time.time())
            starts = self._until_answered(lambda: self._starts(start, end))
        else:
            try:
                end = self.end_of(start, self._list(OffsetSpec.latest()), self._topic_ids(), time.time())
                starts = self._starts(start, end)
            except KafkaException as err:
                self._note_down(err)
                return start  # no new batch until the source answers
            self._down_since = None
        sizes = self._record_bytes(mean_bytes, starts, end.offsets)
        limited = limit_offsets(starts, end.offsets, self.max_records, self.max_bytes, sizes)
        return Planned(limited, end.ids, end.gone)

    def end_of(self, start: Planned, latest: LogOffsets, ids: dict[str, str], now: float) -> Planned:
        """The newest positions: `latest` where a partition answered; the log's where it did not (no range,
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

    def ranges(self, start: Planned, end: Planned) -> list[list[OffsetRange]]:
        """The batch from `start` to `end` as one group of ranges per task. It reads only the two entries (and the
        log starts of partitions that start over), so a batch run again after a crash plans the same."""
        starts = self._starts(start, end)
        ranges = [
            OffsetRange(topic, int(p), min(starts[topic][p], offset), offset, reset_from(start, end, topic, p))
            for topic, offsets in end.offsets.items()
            for p, offset in offsets.items()
            if offset > starts[topic][p] or reset_from(start, end, topic, p) >= 0  # an empty one too: it is reported
        ]
        return split_ranges(ranges, self.tasks)

    def _topic_ids(self) -> dict[str, str]:
        if self._admin is None:
            self._admin = clients.admin(self.source)
        return clients.topic_ids(self._admin, self.subscription, timeout_s=OFFLINE_ASK_S)

    def _record_bytes(self, landed: Mapping[str, float], starts: LogOffsets, latest: LogOffsets) -> dict[str, float]:
        """Each topic's mean record size: what `landed` says, else from a sample of the records its partition
        furthest behind is about to copy. A topic is sampled once per planner, and only with a backlog."""
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
        return {t: mean for t, mean in self._sampled.items() if mean is not None} | dict(landed)

    def _until_answered(self, call: Callable[[], T]) -> T:
        while True:
            try:
                answer = call()
            except KafkaException as err:
                self._note_down(err)
                self._pause()
                continue
            self._down_since = None
            return answer

    def _pause(self) -> None:
        """A second before the source is asked again, unless the run stops meanwhile."""
        if self._stopping.wait(1.0):
            raise PlanningStopped(self.source.alias)

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

    def _starts(self, start: Planned, end: Planned) -> LogOffsets:
        """Each end partition's start: the log's, else the adopted one, else `start_from` (new topic) or
        earliest (new partition, or one whose offsets went backwards or whose topic was made again, so its new records
        are copied from the log start). Where the log start does not answer, 0: the copier's consumer reads such a
        start from the log start."""
        held = start.offsets
        starts: LogOffsets = {t: self.adopted.get(t, {}) | held.get(t, {}) for t in end.offsets}
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

    def _list(self, spec: OffsetSpec, partitions: list[tuple[str, str]] | None = None) -> LogOffsets:
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
        offsets: LogOffsets = {}
        for (topic, partition), offset in found.items():
            offsets.setdefault(topic, {})[str(partition)] = offset
        return offsets


def kept_where_unanswered(
    latest: LogOffsets, start: LogOffsets, topics: dict[str, int], remade: set[str] | None = None
) -> LogOffsets:
    """`latest`, plus the log's position for each partition of `topics` it lacks (that partition did not
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


def topic_ids_now(source: ClusterConfig, topics: set[str], flow: str) -> dict[str, str]:
    """The ids of `topics` at the source now, for a copy that found their partitions gone backwards within a batch or
    a real-time task (the topic made again): the new life's positions belong to them. None of a topic that does not
    answer: it keeps the id it had, and is taken as made again once more, copied again rather than skipped."""
    if not topics:
        return {}
    try:
        return clients.topic_ids(clients.admin(source), topics)
    except KafkaException as err:
        log.warning("flow %s: the ids of topics whose offsets went backwards did not answer (%s); they may be"
                    " copied again from their log start", flow, err.args[0])  # fmt: skip
        return {}


def remade_within(
    start: Planned, end: Planned, landed: list[Landing], ids_now: Callable[[set[str]], dict[str, str]]
) -> tuple[dict[str, str], list[Landing]]:
    """The ids now of topics whose partitions the copy found gone backwards where the plan had not, and that were
    made again after the batch was planned (a log truncated keeps its id): filed with the new life's positions,
    they tell the next batch's start. With them, a landing for each other partition of such a topic that starts it
    over at offset 0, where every new topic's log starts: the copy did not find it gone backwards (its range ended
    before the topic was made again, it had none in the batch, its leader was offline, or, rarely, its new life was
    already past where it stood when the copy read it), so it read nothing of the new life, or read on in it
    unnoticed and copies that part twice; never a gap, and records retention deleted from the new life meanwhile
    are reported as lost. Were the topic left to the next batch to take as made again, it would copy the whole new
    life from its log start, and the partitions the copy did find gone backwards twice.

    A topic whose id does not answer is left so (twice, rather than skip any of it)."""
    went_back: dict[str, set[int]] = {}
    for row in landed:
        if row.reset_from >= 0 and end.ids.get(row.topic) == start.ids.get(row.topic):
            went_back.setdefault(row.topic, set()).add(row.partition)
    ids = {t: i for t, i in ids_now(set(went_back)).items() if i != end.ids.get(t)}
    restarts = [
        Landing(t, p, 0, 0, reset_from=end.offsets[t][str(p)])
        for t in ids
        for p in sorted({int(p) for p in end.offsets.get(t, {})} - went_back[t])
    ]
    return ids, restarts


def rebased(start: Planned, end: Planned | None, topic_ids: Mapping[str, str], positions: PartitionOffsets) -> Planned:
    """`start` with each topic the ledger (`topic_ids`, `positions`) filed as made again since: its copy found the
    partitions gone backwards in the middle of the batch `start` ended, so its positions there belong to the new life,
    not to the id `start` names. Those positions and that id replace `start`'s, so the next batch goes on from them
    instead of taking the topic as made again once more and copying the new life from its log start.

    A batch planned already (`end`, run again after a crash) is rebased only where it was planned in the new life: one
    planned in the old life runs again from the old start, and skips what its slots committed."""
    moved = {
        t: new for t, i in start.ids.items()
        if (new := topic_ids.get(t, i)) != i and (end is None or end.ids.get(t) == new)
    }  # fmt: skip
    if not moved:
        return start
    offsets = {t: dict(o) for t, o in start.offsets.items()}
    for (t, p), offset in positions.items():
        if t in moved:
            offsets.setdefault(t, {})[str(p)] = offset
    return Planned(offsets, start.ids | moved, start.gone)


def reset_from(start: Planned, end: Planned, topic: str, partition: str) -> int:
    """The log's position when the partition's offsets went backwards since (it lies past the end now, or
    its topic was deleted and made again: another id), else -1.

    This is the one place that notices it; the range carries it to the driver, which reports it. It reads only
    `start` and `end`, so a batch run again after a crash finds the same answer.
    """
    position = start.offsets.get(topic, {}).get(partition)
    if position is None:
        return -1
    was, now = start.ids.get(topic), end.ids.get(topic)
    return position if position > end.offsets[topic][partition] or (was and now and was != now) else -1


def limit_offsets(
    starts: LogOffsets, latest: LogOffsets, max_rows: int, max_bytes: int, mean_bytes: Mapping[str, float]
) -> LogOffsets:
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
    out: LogOffsets = {t: {} for t in latest}
    for (t, p), behind in backlog.items():
        out[t][p] = starts[t][p] + min(behind, max(1, behind * share.numerator // share.denominator) if behind else 0)
    return out
