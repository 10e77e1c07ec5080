package io.mirrorkit.copier;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What copying one source partition did since its last report, as spark_app.ranges.Landing keeps it; `toRow` gives
 * its fields by the names the flow's contract gives the landing row (spark_app.copy_wing.contract), which must be
 * exactly FIELDS. Delivery callbacks file into it from the producer's thread, reports read it from the task's: every
 * method is synchronized.
 */
final class Landing {
    /** The landing row's fields this copier fills, by name. */
    static final List<String> FIELDS = List.of("topic", "partition", "first_offset", "end_offset", "last_offset",
            "last_target_offset", "records", "bytes", "dropped", "dead_lettered", "latency_counts", "latency_sum_ms",
            "held_from", "held_until", "refused_bytes", "held_error", "runs", "echoes", "reset_from");

    final String topic;
    final int partition;
    long firstOffset;
    long endOffset;
    long lastOffset = -1;
    long lastTargetOffset = -1;
    long records;
    long bytes;
    long dropped;
    final long[] latencyCounts;
    double latencySumMs;
    final List<long[]> runs = new ArrayList<>();
    /** Identity only: the dropped echoes of the target's own records, as runs (spark_app.ranges.Landing.echoes). */
    final List<long[]> echoes = new ArrayList<>();
    private final double[] boundsMs;
    private final int maxRuns;

    Landing(String topic, int partition, long start, double[] boundsMs, int maxRuns) {
        this.topic = topic;
        this.partition = partition;
        this.firstOffset = this.endOffset = start;
        this.boundsMs = boundsMs;
        this.maxRuns = maxRuns;
        this.latencyCounts = new long[boundsMs.length + 1];
    }

    synchronized void sent(int size) {
        records++;
        bytes += size;
    }

    /** Source `offset` landed at `targetOffset`, `latencyMs` after its timestamp (negative: not known). */
    synchronized void landed(long offset, long targetOffset, double latencyMs) {
        lastOffset = offset;
        lastTargetOffset = targetOffset;
        countLatency(latencyMs);
        extendRuns(runs, offset, targetOffset);
    }

    /** Source `offset` was dropped as an echo of the target's record at `targetOffset` (spark_app.ranges.echoed). */
    synchronized void echoed(long offset, long targetOffset) {
        dropped++;
        lastOffset = Math.max(lastOffset, offset);
        if (targetOffset >= 0) {
            extendRuns(echoes, offset, targetOffset);
        }
    }

    /** spark_app.ranges.extend_runs: runs grow at their end; past maxRuns the newest replaces the last. */
    private void extendRuns(List<long[]> into, long offset, long targetOffset) {
        if (!into.isEmpty()) {
            long[] run = into.get(into.size() - 1);
            if (offset == run[2] + 1 && targetOffset == run[1] + offset - run[0]) {
                run[2] = offset;
                return;
            }
            if (into.size() >= maxRuns) {
                into.set(into.size() - 1, new long[] {offset, targetOffset, offset});
                return;
            }
        }
        into.add(new long[] {offset, targetOffset, offset});
    }

    private void countLatency(double latencyMs) {
        if (latencyMs < 0) {
            return;
        }
        int bucket = 0;
        while (bucket < boundsMs.length && boundsMs[bucket] < latencyMs) {
            bucket++;
        }
        latencyCounts[bucket]++;
        latencySumMs += latencyMs;
    }

    /** Whether it says anything a position does not already (spark_app.realtime.task._changed). */
    synchronized boolean changed() {
        return endOffset != firstOffset || records + dropped > 0 || !runs.isEmpty();
    }

    /** The row by the contract's names (`names`, checked against FIELDS when the contract was read). */
    synchronized Map<String, Object> toRow(List<String> names) {
        Map<String, Object> row = new LinkedHashMap<>();
        for (String name : names) {
            row.put(name, value(name));
        }
        return row;
    }

    private Object value(String name) {
        return switch (name) {
            case "topic" -> topic;
            case "partition" -> partition;
            case "first_offset" -> firstOffset;
            case "end_offset" -> endOffset;
            case "last_offset" -> lastOffset;
            case "last_target_offset" -> lastTargetOffset;
            case "records" -> records;
            case "bytes" -> bytes;
            case "latency_counts" -> latencyCounts.clone();
            case "latency_sum_ms" -> latencySumMs;
            case "runs" -> new ArrayList<>(runs);
            case "dropped" -> dropped;
            case "echoes" -> new ArrayList<>(echoes);
            // What only the Python loop does: dead-letter or hold records, start over.
            case "dead_lettered", "refused_bytes" -> 0;
            case "held_from", "held_until", "reset_from" -> -1;
            case "held_error" -> "";
            default -> throw new IllegalArgumentException("a landing row has no field `" + name + "`");
        };
    }
}
