package io.mirrorkit.copier;

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
 * in Java names. A SASL password or an mTLS client key is read here, on the executor, from the env var or file the
 * config names, as the Python loop reads it: it never travels with the task, and never appears in an error.
 */
final class Clients {
    private Clients() {}

    /** The slot's transactional producer, its id made by the contract's rule, as every attempt of the slot makes it. */
    static KafkaProducer<byte[], byte[]> producer(SlotConfig config, int slot) throws IOException {
        Properties props = settings(config.target, config.producer);
        props.put("transactional.id", config.contract.transactionalId(slot));
        return new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static KafkaConsumer<byte[], byte[]> consumer(SlotConfig config) throws IOException {
        Properties props = settings(config.source, config.consumer);
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    /** A reader of the flow's positions group on the target: it never subscribes, so it never joins. */
    static KafkaConsumer<byte[], byte[]> positionsReader(SlotConfig config) throws IOException {
        Properties props = settings(config.target, config.consumer);
        props.put("group.id", config.positionsGroup);
        return new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    /** An admin client of the source, from the cluster's settings alone (no consumer's): it asks for topics' ids. */
    static Admin sourceAdmin(SlotConfig config) throws IOException {
        return Admin.create(settings(config.source, Map.of()));
    }

    /** The role's settings, then the cluster's (its profile's and its tuning overrides, which win as they do over
     * the Python loop's own), then its login or client key. */
    private static Properties settings(SlotConfig.Client cluster, Map<String, String> role) throws IOException {
        Properties props = new Properties();
        props.putAll(role);
        props.putAll(cluster.settings());
        SlotConfig.Login login = cluster.login();
        if (login != null) {
            props.put("sasl.jaas.config", login.module() + " required username=\"" + quoted(login.username())
                    + "\" password=\"" + quoted(secret(login.env(), login.file(), cluster.alias())) + "\";");
        }
        SlotConfig.ClientKey key = cluster.clientKey();
        if (key != null) {
            String what = "cluster '" + cluster.alias() + "'";
            props.put("ssl.keystore.type", "PEM");
            try {
                props.put("ssl.keystore.certificate.chain", Files.readString(Path.of(key.certFile())));
            } catch (IOException error) {
                throw new IOException(what + ": cannot read client certificate " + key.certFile(), null);
            }
            props.put("ssl.keystore.key", secret(key.env(), key.file(), cluster.alias()));
        }
        return props;
    }

    /** A secret, from the env var or file the config names; errors name where, never what. */
    private static String secret(String env, String file, String alias) throws IOException {
        String what = "cluster '" + alias + "'";
        if (env != null) {
            String value = System.getenv(env);
            if (value == null || value.isEmpty()) {
                throw new IOException(what + ": env var " + env + " is not set");
            }
            return value;
        }
        try {
            return Files.readString(Path.of(file)).strip();
        } catch (IOException error) {
            throw new IOException(what + ": cannot read secret file " + file, null);
        }
    }

    /** A JAAS option value inside double quotes. */
    private static String quoted(String value) {
        return value.replace("\\", "\\\\").replace("\"", "\\\"");
    }
}
