package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Reading what Python hands over (the copy contract, the slot's config) by field name: a field unknown, missing or of
 * the wrong type refuses it with an IllegalArgumentException that names the field and where it is.
 */
final class Fields {
    private Fields() {}

    /** `node` is an object with exactly the fields `known`; else the first unknown or missing one is named. */
    static JsonNode are(JsonNode node, List<String> known, String where) {
        if (node == null || !node.isObject()) {
            throw new IllegalArgumentException(where + " is not an object: " + node);
        }
        List<String> names = new ArrayList<>();
        node.fieldNames().forEachRemaining(names::add);
        are(names, known, where);
        return node;
    }

    /** `names` are exactly `known`, each once; else the first unknown, repeated or missing one is named. */
    static void are(List<String> names, List<String> known, String where) {
        Set<String> seen = new HashSet<>();
        for (String name : names) {
            if (!known.contains(name)) {
                throw new IllegalArgumentException(where + " has the field `" + name + "`, which the JVM copier does"
                        + " not know (it knows " + known + ")");
            }
            if (!seen.add(name)) {
                throw new IllegalArgumentException(where + " has the field `" + name + "` twice");
            }
        }
        for (String name : known) {
            if (!seen.contains(name)) {
                throw new IllegalArgumentException(where + " lacks the field `" + name + "`");
            }
        }
    }

    static String text(JsonNode node, String name, String where) {
        return field(node, name, node.get(name).isTextual(), "a string", where).asText();
    }

    static String optionalText(JsonNode node, String name, String where) {
        JsonNode value = node.get(name);
        return value.isNull() ? null : field(node, name, value.isTextual(), "a string or null", where).asText();
    }

    static boolean bool(JsonNode node, String name, String where) {
        return field(node, name, node.get(name).isBoolean(), "a boolean", where).asBoolean();
    }

    static long integer(JsonNode node, String name, String where) {
        JsonNode value = node.get(name);
        return field(node, name, value.isIntegralNumber() && value.canConvertToLong(), "a 64-bit integer", where)
                .asLong();
    }

    static Long optionalLong(JsonNode node, String name, String where) {
        return node.get(name).isNull() ? null : integer(node, name, where);
    }

    static JsonNode array(JsonNode node, String name, String where) {
        return field(node, name, node.get(name).isArray(), "a list", where);
    }

    static JsonNode object(JsonNode node, String name, String where) {
        return field(node, name, node.get(name).isObject(), "an object", where);
    }

    /** An object of strings, in its order. */
    static Map<String, String> strings(JsonNode node, String name, String where) {
        Map<String, String> out = new LinkedHashMap<>();
        for (Map.Entry<String, JsonNode> e : object(node, name, where).properties()) {
            if (!e.getValue().isTextual()) {
                throw new IllegalArgumentException(where + "'s field `" + name + "` maps `" + e.getKey()
                        + "` to a value that is not a string: " + e.getValue());
            }
            out.put(e.getKey(), e.getValue().asText());
        }
        return out;
    }

    private static JsonNode field(JsonNode node, String name, boolean ok, String type, String where) {
        JsonNode value = node.get(name);
        if (!ok) {
            throw new IllegalArgumentException(where + "'s field `" + name + "` is not " + type + ": " + value);
        }
        return value;
    }
}
