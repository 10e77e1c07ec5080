package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The slot's Kafka clients, from the settings the driver derived from the clusters' profiles (spark_app.realtime.jvm),
 * in Java names. A SASL password is read here, on the executor, from the env var or file the config names, as the
 * Python loop reads it: it never travels with the task, and never appears in an error.
 */
final class Clients {
    private Clients() {}

    /** The slot's transactional producer, its id made by the contract's rule, as every attempt of the slot makes it. */
    static KafkaProducer<byte[], byte[]> producer(JsonNode config, Contract contract, int slot) throws IOException {
        Properties props = settings(config.get("target"), config.get("producer"));
        props.put("transactional.id", contract.transactionalId(slot));
        return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static KafkaConsumer<byte[], byte[]> consumer(JsonNode config) throws IOException {
        Properties props = settings(config.get("source"), config.get("consumer"));
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    /** A reader of the flow's positions group on the target: it never subscribes, so it never joins. */
    static KafkaConsumer<byte[], byte[]> positionsReader(JsonNode config) throws IOException {
        Properties props = settings(config.get("target"), config.get("consumer"));
        props.put("group.id", config.get("positions_group").asText());
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    /** An admin client of the source, from the cluster's settings alone (no consumer's): it asks for topics' ids. */
    static Admin sourceAdmin(JsonNode config) throws IOException {
        return Admin.create(settings(config.get("source"), null));
    }

    private static Properties settings(JsonNode cluster, JsonNode role) throws IOException {
        Properties props = new Properties();
        put(props, cluster.get("settings"));
        if (role != null) {
            put(props, role);
        }
        JsonNode login = cluster.get("login");
        if (login != null && !login.isNull()) {
            props.put("sasl.jaas.config", login.get("module").asText() + " required username=\""
                    + quoted(login.get("username").asText()) + "\" password=\"" + quoted(secret(login, cluster))
                    + "\";");
        }
        return props;
    }

    private static void put(Properties props, JsonNode settings) {
        for (Map.Entry<String, JsonNode> e : settings.properties()) {
            props.put(e.getKey(), e.getValue().asText());
        }
    }

    /** The password, from the env var or file the config names; errors name where, never what. */
    private static String secret(JsonNode login, JsonNode cluster) throws IOException {
        String what = "cluster '" + cluster.get("alias").asText() + "'";
        JsonNode env = login.get("env"), file = login.get("file");
        if (env != null && !env.isNull()) {
            String value = System.getenv(env.asText());
            if (value == null || value.isEmpty()) {
                throw new IOException(what + ": env var " + env.asText() + " is not set");
            }
            return value;
        }
        try {
            return Files.readString(Path.of(file.asText())).strip();
        } catch (IOException error) {
            throw new IOException(what + ": cannot read secret file " + file.asText(), null);
        }
    }

    /** A JAAS option value inside double quotes. */
    private static String quoted(String value) {
        return value.replace("\\", "\\\\").replace("\"", "\\\"");
    }
}
