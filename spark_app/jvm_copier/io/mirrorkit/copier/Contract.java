package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The flow's per-record contract (spark_app.copy_wing.contract.CopyContract), read by field name from the slot's
 * config: built once in Python, obeyed here. A field it does not know, one missing, or one of the wrong type refuses
 * the contract, naming the field; so does a landing row with a field {@link Landing} does not fill, or without one it
 * does. `check` says what it made of a contract, for tests/test_copy_contract.py (through CopierJob, on the driver).
 */
final class Contract {
    /** Every field of the contract, by its name in the JSON. */
    static final List<String> FIELDS = List.of("flow", "refusals", "clock_slack_ms", "partition_errors",
            "provenance_header", "stamp_provenance", "drop_echoes", "source_alias", "target_alias",
            "max_provenance_offset", "max_record_bytes", "transactional_id_prefix", "transactional_id_rule",
            "latency_bounds_ms", "max_runs", "landing_fields");
    static final List<String> REFUSAL_FIELDS = List.of("compacted", "before_max_ms", "after_max_ms");
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String WHERE = "the copy contract";

    /** What a target topic refuses that a record shows (spark_app.topics.TargetRule.refusal). */
    record Refusal(boolean compacted, Long beforeMaxMs, Long afterMaxMs) {
        boolean refuses(byte[] key, long timestampMs, long clockSlackMs) {
            if (compacted && key == null) {
                return true;
            }
            if (beforeMaxMs == null && afterMaxMs == null) {
                return false;
            }
            long skew = System.currentTimeMillis() - timestampMs;
            return (beforeMaxMs != null && skew > beforeMaxMs + clockSlackMs)
                    || (afterMaxMs != null && -skew > afterMaxMs + clockSlackMs);
        }
    }

    final String flow;
    final Map<String, Refusal> refusals;
    final long clockSlackMs;
    final List<Integer> partitionErrors;
    final String provenanceHeader;
    final boolean stampProvenance;
    final boolean dropEchoes;
    final String sourceAlias;
    final String targetAlias;
    final long maxProvenanceOffset;
    final Long maxRecordBytes;
    final String transactionalIdPrefix;
    final String transactionalIdRule;
    final double[] latencyBoundsMs;
    final int maxRuns;
    final List<String> landingFields;

    private Contract(JsonNode node) {
        Fields.are(node, FIELDS, WHERE);
        flow = Fields.text(node, "flow", WHERE);
        Map<String, Refusal> byTopic = new TreeMap<>();
        JsonNode rules = Fields.object(node, "refusals", WHERE);
        for (Map.Entry<String, JsonNode> e : rules.properties()) {
            String where = "the copy contract's refusals of topic '" + e.getKey() + "'";
            JsonNode rule = e.getValue();
            Fields.are(rule, REFUSAL_FIELDS, where);
            byTopic.put(e.getKey(), new Refusal(Fields.bool(rule, "compacted", where),
                    Fields.optionalLong(rule, "before_max_ms", where),
                    Fields.optionalLong(rule, "after_max_ms", where)));
        }
        refusals = Collections.unmodifiableMap(byTopic);
        clockSlackMs = Fields.integer(node, "clock_slack_ms", WHERE);
        List<Integer> codes = new ArrayList<>();
        for (JsonNode code : Fields.array(node, "partition_errors", WHERE)) {
            codes.add(code.asInt());
        }
        partitionErrors = List.copyOf(codes);
        provenanceHeader = Fields.text(node, "provenance_header", WHERE);
        stampProvenance = Fields.bool(node, "stamp_provenance", WHERE);
        dropEchoes = Fields.bool(node, "drop_echoes", WHERE);
        sourceAlias = Fields.text(node, "source_alias", WHERE);
        targetAlias = Fields.text(node, "target_alias", WHERE);
        maxProvenanceOffset = Fields.integer(node, "max_provenance_offset", WHERE);
        maxRecordBytes = Fields.optionalLong(node, "max_record_bytes", WHERE);
        transactionalIdPrefix = Fields.optionalText(node, "transactional_id_prefix", WHERE);
        transactionalIdRule = Fields.text(node, "transactional_id_rule", WHERE);
        if (!transactionalIdRule.contains("{prefix}") || !transactionalIdRule.contains("{slot}")) {
            throw new IllegalArgumentException("the copy contract's field `transactional_id_rule` names no {prefix}"
                    + " or no {slot}: " + transactionalIdRule);
        }
        JsonNode bounds = Fields.array(node, "latency_bounds_ms", WHERE);
        latencyBoundsMs = new double[bounds.size()];
        for (int i = 0; i < latencyBoundsMs.length; i++) {
            latencyBoundsMs[i] = bounds.get(i).asDouble();
        }
        maxRuns = (int) Fields.integer(node, "max_runs", WHERE);
        List<String> names = new ArrayList<>();
        for (JsonNode name : Fields.array(node, "landing_fields", WHERE)) {
            names.add(name.asText());
        }
        landingFields = List.copyOf(names);
        Fields.are(landingFields, Landing.FIELDS, "the copy contract's landing row");
    }

    /** The contract in the slot's config; IllegalArgumentException, naming the field, for one it cannot obey. */
    static Contract read(JsonNode node) {
        if (node == null || !node.isObject()) {
            throw new IllegalArgumentException("the slot's config has no copy contract");
        }
        return new Contract(node);
    }

    /**
     * The target offset a provenance value says the record came from, when it names the target (an echo of the
     * target's own record, to drop); -1 otherwise, and for a value no core of the mirror made (spark_app.policy.origin:
     * `alias:offset`, the offset all digits and at most `max_provenance_offset`).
     */
    long echoOf(byte[] value) {
        int colon = 0;
        while (colon < value.length && value[colon] != ':') {
            colon++;
        }
        if (colon >= value.length - 1) {
            return -1;
        }
        for (int i = colon + 1; i < value.length; i++) {
            if (value[i] < '0' || value[i] > '9') {
                return -1;
            }
        }
        BigInteger offset = new BigInteger(new String(value, colon + 1, value.length - colon - 1,
                StandardCharsets.US_ASCII));
        if (offset.compareTo(BigInteger.valueOf(maxProvenanceOffset)) > 0) {
            return -1;
        }
        byte[] target = targetAlias.getBytes(StandardCharsets.UTF_8);
        return Arrays.equals(value, 0, colon, target, 0, target.length) ? offset.longValue() : -1;
    }

    /** Why this copier cannot copy under the contract (the Python task does), or null when it can. */
    String cannotCopy() {
        if (transactionalIdPrefix == null) {
            return "the JVM copier writes only in transactions, and the contract has no transactional_id_prefix";
        }
        return null;
    }

    /** Slot `slot`'s transactional.id, by the contract's rule (spark_app.transactions.transactional_id). */
    String transactionalId(int slot) {
        if (transactionalIdPrefix == null) {
            throw new IllegalStateException("flow " + flow + ": its copies write no transactions");
        }
        return transactionalIdRule.replace("{prefix}", transactionalIdPrefix).replace("{slot}", Integer.toString(slot));
    }

    /** The contract as read, by field name: what the test compares with the contract it sent. */
    Map<String, Object> asRead() {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("flow", flow);
        Map<String, Object> rules = new TreeMap<>();
        for (Map.Entry<String, Refusal> e : refusals.entrySet()) {
            Map<String, Object> rule = new LinkedHashMap<>();
            rule.put("compacted", e.getValue().compacted());
            rule.put("before_max_ms", e.getValue().beforeMaxMs());
            rule.put("after_max_ms", e.getValue().afterMaxMs());
            rules.put(e.getKey(), rule);
        }
        out.put("refusals", rules);
        out.put("clock_slack_ms", clockSlackMs);
        out.put("partition_errors", partitionErrors);
        out.put("provenance_header", provenanceHeader);
        out.put("stamp_provenance", stampProvenance);
        out.put("drop_echoes", dropEchoes);
        out.put("source_alias", sourceAlias);
        out.put("target_alias", targetAlias);
        out.put("max_provenance_offset", maxProvenanceOffset);
        out.put("max_record_bytes", maxRecordBytes);
        out.put("transactional_id_prefix", transactionalIdPrefix);
        out.put("transactional_id_rule", transactionalIdRule);
        out.put("latency_bounds_ms", latencyBoundsMs);
        out.put("max_runs", maxRuns);
        out.put("landing_fields", landingFields);
        return out;
    }

    /**
     * What was made of `json`, a contract, as JSON: {"read": the contract as read, "landing_row": a landing's row's keys,
     * "transactional_ids": slots 0, 1 and 7's ids when it has a prefix}, or {"refused": why}.
     */
    static String check(String json) throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            Contract contract = read(JSON.readTree(json));
            out.put("read", contract.asRead());
            Landing landing = new Landing("t", 0, 0, contract.latencyBoundsMs, contract.maxRuns);
            out.put("landing_row", new ArrayList<>(landing.toRow(contract.landingFields).keySet()));
            if (contract.transactionalIdPrefix != null) {
                out.put("transactional_ids", List.of(contract.transactionalId(0), contract.transactionalId(1),
                        contract.transactionalId(7)));
            }
        } catch (IllegalArgumentException error) {
            out.put("refused", error.getMessage());
        }
        return JSON.writeValueAsString(out);
    }
}
