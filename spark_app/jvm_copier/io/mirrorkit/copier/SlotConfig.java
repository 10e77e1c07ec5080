package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What every slot of a job is told (spark_app.realtime.jvm.SlotConfig), read by field name: built once in Python,
 * obeyed here. A field it does not know, one missing, or one of the wrong type refuses the config, naming the field.
 * `check` says what it made of a config, for tests/test_jvm_copier.py (through CopierJob, on the driver).
 */
final class SlotConfig {
    static final List<String> FIELDS = List.of("flow", "driver", "key_source", "channel", "source", "target",
            "consumer", "producer", "exactly_once", "positions_group", "commit_ms", "report_ms", "poll_ms", "topics",
            "contract");
    static final List<String> DRIVER_FIELDS = List.of("host", "port");
    static final List<String> CLIENT_FIELDS = List.of("alias", "settings", "login", "client_key");
    static final List<String> LOGIN_FIELDS = List.of("module", "username", "env", "file");
    static final List<String> CLIENT_KEY_FIELDS = List.of("cert_file", "env", "file");
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String WHERE = "the slot's config";

    /** A SASL password login: where the password lives (an env var or a file), never the password. */
    record Login(String module, String username, String env, String file) {}

    /** An mTLS client certificate, and where its key lives (an env var or a file), never the key. */
    record ClientKey(String certFile, String env, String file) {}

    /** A cluster's client settings in Java names (spark_app.profiles.JavaClient). */
    record Client(String alias, Map<String, String> settings, Login login, ClientKey clientKey) {}

    final String flow;
    final String driverHost;
    final int driverPort;
    /** Where the slot finds the channel's key (Channel.runKey reads it); never the key. */
    final JsonNode keySource;
    final Channel.Rules channel;
    final Client source;
    final Client target;
    final Map<String, String> consumer;
    final Map<String, String> producer;
    final boolean exactlyOnce;
    final String positionsGroup;
    final long commitMs;
    final long reportMs;
    final long pollMs;
    /** Each source topic the job copies, and its target topic. */
    final Map<String, String> topics;
    final Contract contract;

    private SlotConfig(JsonNode node) {
        Fields.are(node, FIELDS, WHERE);
        flow = Fields.text(node, "flow", WHERE);
        JsonNode driver = Fields.are(node.get("driver"), DRIVER_FIELDS, WHERE + "'s driver");
        driverHost = Fields.text(driver, "host", WHERE + "'s driver");
        driverPort = (int) Fields.integer(driver, "port", WHERE + "'s driver");
        keySource = Fields.object(node, "key_source", WHERE);
        channel = Channel.Rules.read(node.get("channel"));
        source = client(node, "source");
        target = client(node, "target");
        consumer = Fields.strings(node, "consumer", WHERE);
        producer = Fields.strings(node, "producer", WHERE);
        exactlyOnce = Fields.bool(node, "exactly_once", WHERE);
        positionsGroup = Fields.text(node, "positions_group", WHERE);
        commitMs = Fields.integer(node, "commit_ms", WHERE);
        reportMs = Fields.integer(node, "report_ms", WHERE);
        pollMs = Fields.integer(node, "poll_ms", WHERE);
        topics = Fields.strings(node, "topics", WHERE);
        contract = Contract.read(node.get("contract"));
    }

    /** The slot's config in `node`; IllegalArgumentException, naming the field, for one it cannot obey. */
    static SlotConfig read(JsonNode node) {
        return new SlotConfig(node);
    }

    private static Client client(JsonNode node, String name) {
        String where = WHERE + "'s " + name;
        JsonNode client = Fields.are(node.get(name), CLIENT_FIELDS, where);
        Login login = null;
        if (!client.get("login").isNull()) {
            String at = where + "'s login";
            JsonNode given = Fields.are(client.get("login"), LOGIN_FIELDS, at);
            login = new Login(Fields.text(given, "module", at), Fields.text(given, "username", at),
                    Fields.optionalText(given, "env", at), Fields.optionalText(given, "file", at));
            if ((login.env() == null) == (login.file() == null)) {
                throw new IllegalArgumentException(at + " names neither or both of `env` and `file`");
            }
        }
        ClientKey clientKey = null;
        if (!client.get("client_key").isNull()) {
            String at = where + "'s client_key";
            JsonNode given = Fields.are(client.get("client_key"), CLIENT_KEY_FIELDS, at);
            clientKey = new ClientKey(Fields.text(given, "cert_file", at), Fields.optionalText(given, "env", at),
                    Fields.optionalText(given, "file", at));
            if ((clientKey.env() == null) == (clientKey.file() == null)) {
                throw new IllegalArgumentException(at + " names neither or both of `env` and `file`");
            }
        }
        return new Client(Fields.text(client, "alias", where), Fields.strings(client, "settings", where), login,
                clientKey);
    }

    /** The config as read, by field name: what the test compares with the config it sent. */
    Map<String, Object> asRead() {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("flow", flow);
        out.put("driver", Map.of("host", driverHost, "port", driverPort));
        out.put("key_source", keySource);
        out.put("channel", channel.asRead());
        out.put("source", clientRead(source));
        out.put("target", clientRead(target));
        out.put("consumer", consumer);
        out.put("producer", producer);
        out.put("exactly_once", exactlyOnce);
        out.put("positions_group", positionsGroup);
        out.put("commit_ms", commitMs);
        out.put("report_ms", reportMs);
        out.put("poll_ms", pollMs);
        out.put("topics", topics);
        out.put("contract", contract.asRead());
        return out;
    }

    private static Map<String, Object> clientRead(Client client) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("alias", client.alias());
        out.put("settings", client.settings());
        Map<String, Object> login = null;
        if (client.login() != null) {
            login = new LinkedHashMap<>();
            login.put("module", client.login().module());
            login.put("username", client.login().username());
            login.put("env", client.login().env());
            login.put("file", client.login().file());
        }
        out.put("login", login);
        Map<String, Object> clientKey = null;
        if (client.clientKey() != null) {
            clientKey = new LinkedHashMap<>();
            clientKey.put("cert_file", client.clientKey().certFile());
            clientKey.put("env", client.clientKey().env());
            clientKey.put("file", client.clientKey().file());
        }
        out.put("client_key", clientKey);
        return out;
    }

    /** What was made of `json`, a slot's config, as JSON: {"read": the config as read}, or {"refused": why}. */
    static String check(String json) throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            out.put("read", read(JSON.readTree(json)).asRead());
        } catch (IllegalArgumentException error) {
            out.put("refused", error.getMessage());
        }
        return JSON.writeValueAsString(out);
    }
}
