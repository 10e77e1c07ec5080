package io.mirrorkit.copier;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What copying one source partition did since its last report, as spark_app.ranges.Landing keeps it; `toRow` gives
 * the fields by the names the report channel's rows carry. Delivery callbacks file into it from the producer's thread,
 * reports read it from the task's: every method is synchronized.
 */
final class Landing {
    final String topic;
    final int partition;
    long firstOffset;
    long endOffset;
    long lastOffset = -1;
    long lastTargetOffset = -1;
    long records;
    long bytes;
    final long[] latencyCounts;
    double latencySumMs;
    final List<long[]> runs = new ArrayList<>();
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
        if (!runs.isEmpty()) { // spark_app.ranges.extend_runs
            long[] run = runs.get(runs.size() - 1);
            if (offset == run[2] + 1 && targetOffset == run[1] + offset - run[0]) {
                run[2] = offset;
                return;
            }
            if (runs.size() >= maxRuns) { // the newest replaces the last
                runs.set(runs.size() - 1, new long[] {offset, targetOffset, offset});
                return;
            }
        }
        runs.add(new long[] {offset, targetOffset, offset});
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
        return endOffset != firstOffset || records > 0 || !runs.isEmpty();
    }

    synchronized Map<String, Object> toRow() {
        Map<String, Object> row = new LinkedHashMap<>();
        row.put("topic", topic);
        row.put("partition", partition);
        row.put("first_offset", firstOffset);
        row.put("end_offset", endOffset);
        row.put("last_offset", lastOffset);
        row.put("last_target_offset", lastTargetOffset);
        row.put("records", records);
        row.put("bytes", bytes);
        row.put("dropped", 0);
        row.put("dead_lettered", 0);
        row.put("latency_counts", latencyCounts);
        row.put("latency_sum_ms", latencySumMs);
        row.put("held_from", -1);
        row.put("held_until", -1);
        row.put("refused_bytes", 0);
        row.put("held_error", "");
        row.put("runs", runs);
        row.put("echoes", List.of());
        row.put("reset_from", -1);
        return row;
    }
}
