package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.spark.SparkEnv;

/**
 * The task's side of the real-time report channel (spark_app.channel has the driver's side and the rules).
 *
 * <p>Frames are a 4-byte big-endian length, that many bytes of UTF-8 JSON, and a MAC. The connection opens with a
 * challenge each way on the run's key: the driver's nonce is answered with HMAC-SHA256(key, task label + nonce) and a
 * nonce of the task's own, which the driver answers with HMAC-SHA256(key, driver label + nonce). Both then derive the
 * connection's session key, HMAC-SHA256(key, session label + driver's nonce + task's nonce), and every frame carries
 * HMAC-SHA256(session key, direction label + 8-byte sequence number + length + payload); the first frame that fails
 * ends the connection. The labels, sizes and limits are Python's ChannelRules, read by name from the slot config.
 *
 * <p>The run's key is HMAC-SHA256(secret, key label + run id), the secret found where the config's key source says:
 * a file (local mode), else Spark's own application secret, from this executor's SecurityManager. The key itself
 * never travels in the config.
 */
final class Channel implements AutoCloseable {
    /** The channel's wire rules (spark_app.channel.ChannelRules), by field name. */
    record Rules(int nonceBytes, int macBytes, int maxFrameBytes, int handshakeTimeoutMs, String taskLabel,
            String driverLabel, String keyLabel, String sessionLabel, String toDriverLabel, String toTaskLabel) {
        static final List<String> FIELDS = List.of("nonce_bytes", "mac_bytes", "max_frame_bytes",
                "handshake_timeout_ms", "task_label", "driver_label", "key_label", "session_label", "to_driver_label",
                "to_task_label");

        /** The rules in `node`; IllegalArgumentException naming the first field unknown, missing or mistyped. */
        static Rules read(JsonNode node) {
            if (node == null || !node.isObject()) {
                throw new IllegalArgumentException("the slot config lacks the channel's rules (`channel`)");
            }
            List<String> names = new ArrayList<>();
            node.fieldNames().forEachRemaining(names::add);
            for (String name : names) {
                if (!FIELDS.contains(name)) {
                    throw new IllegalArgumentException("the channel's rules have the field `" + name
                            + "`, which the JVM copier does not know (it knows " + FIELDS + ")");
                }
            }
            for (String name : FIELDS) {
                if (!names.contains(name)) {
                    throw new IllegalArgumentException("the channel's rules lack the field `" + name + "`");
                }
            }
            return new Rules(size(node, "nonce_bytes"), size(node, "mac_bytes"), size(node, "max_frame_bytes"),
                    size(node, "handshake_timeout_ms"), label(node, "task_label"), label(node, "driver_label"),
                    label(node, "key_label"), label(node, "session_label"), label(node, "to_driver_label"),
                    label(node, "to_task_label"));
        }

        /** The rules as read, by field name: for tests/test_jvm_copier.py (through CopierJob.checkChannel). */
        Map<String, Object> asRead() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("nonce_bytes", nonceBytes);
            out.put("mac_bytes", macBytes);
            out.put("max_frame_bytes", maxFrameBytes);
            out.put("handshake_timeout_ms", handshakeTimeoutMs);
            out.put("task_label", taskLabel);
            out.put("driver_label", driverLabel);
            out.put("key_label", keyLabel);
            out.put("session_label", sessionLabel);
            out.put("to_driver_label", toDriverLabel);
            out.put("to_task_label", toTaskLabel);
            return out;
        }

        private static int size(JsonNode node, String name) {
            JsonNode value = node.get(name);
            if (!value.isInt() || value.asInt() <= 0) {
                throw new IllegalArgumentException("the channel's rules' `" + name + "` is not a positive integer");
            }
            return value.asInt();
        }

        private static String label(JsonNode node, String name) {
            JsonNode value = node.get(name);
            if (!value.isTextual() || value.asText().isEmpty()) {
                throw new IllegalArgumentException("the channel's rules' `" + name + "` is not a label");
            }
            return value.asText();
        }
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    private final Socket socket;
    private final DataInputStream in;
    private final DataOutputStream out;
    private final Rules rules;
    private final String peer;
    private byte[] session;
    private long sent;
    private long received;

    private Channel(Socket socket, Rules rules, String peer) throws IOException {
        this.socket = socket;
        this.in = new DataInputStream(socket.getInputStream());
        this.out = new DataOutputStream(socket.getOutputStream());
        this.rules = rules;
        this.peer = peer;
    }

    /** The run's key, from the secret where `source` (the config's `key_source`) says it is. */
    static byte[] runKey(Rules rules, JsonNode source) throws IOException {
        if (source == null || !source.isObject() || !source.path("run").isTextual()) {
            throw new IOException("the slot config lacks the channel's key source (`key_source`)");
        }
        byte[] secret;
        JsonNode file = source.path("file");
        if (file.isTextual()) {
            secret = Files.readAllBytes(Path.of(file.asText()));
        } else {
            SparkEnv env = SparkEnv.get();
            String spark;
            try {
                spark = env == null ? null : env.securityManager().getSecretKey();
            } catch (IllegalArgumentException missing) {
                spark = null;
            }
            if (spark == null) {
                throw new IOException("Spark's secret is not on this executor: the report channel needs"
                        + " spark.authenticate=true on a cluster");
            }
            secret = spark.getBytes(StandardCharsets.UTF_8);
        }
        return hmac(secret, bytes(rules.keyLabel), bytes(source.get("run").asText()));
    }

    /** Connect to the driver and prove, each way, that both hold `key`; then every frame is MAC'd. */
    static Channel connect(String host, int port, Rules rules, byte[] key) throws IOException {
        Socket socket = new Socket();
        String peer = host + ":" + port;
        try {
            socket.connect(new InetSocketAddress(host, port), rules.handshakeTimeoutMs);
            socket.setSoTimeout(rules.handshakeTimeoutMs);
            socket.setTcpNoDelay(true);
            Channel channel = new Channel(socket, rules, peer);
            byte[] nonce = new byte[rules.nonceBytes];
            channel.in.readFully(nonce);
            byte[] mine = new byte[rules.nonceBytes];
            new SecureRandom().nextBytes(mine);
            channel.out.write(hmac(key, bytes(rules.taskLabel), nonce));
            channel.out.write(mine);
            channel.out.flush();
            byte[] answer = new byte[rules.macBytes];
            channel.in.readFully(answer);
            if (!MessageDigest.isEqual(answer, hmac(key, bytes(rules.driverLabel), mine))) {
                throw new IOException("the driver at " + peer + " answered the challenge wrong");
            }
            channel.session = hmac(key, bytes(rules.sessionLabel), nonce, mine);
            socket.setSoTimeout(0); // a task reports at its own pace once the handshake is done
            socket.setKeepAlive(true);
            return channel;
        } catch (IOException | RuntimeException error) {
            socket.close();
            throw error;
        }
    }

    void send(Object message) throws IOException {
        byte[] payload = JSON.writeValueAsBytes(message);
        if (payload.length > rules.maxFrameBytes) {
            throw new IOException("a message of " + payload.length + " bytes is over the channel's limit");
        }
        synchronized (out) {
            byte[] header = ByteBuffer.allocate(4).putInt(payload.length).array();
            out.write(header);
            out.write(payload);
            out.write(frameMac(rules.toDriverLabel, sent, header, payload));
            out.flush();
            sent++;
        }
    }

    /** The driver's next message; IOException when its frame is too large, not authentic or not JSON. */
    JsonNode recv() throws IOException {
        int size = in.readInt();
        if (size < 0 || size > rules.maxFrameBytes) {
            throw new IOException("the driver at " + peer + " sent a frame of " + size + " bytes, over the limit");
        }
        byte[] payload = new byte[size];
        in.readFully(payload);
        byte[] mac = new byte[rules.macBytes];
        in.readFully(mac);
        byte[] header = ByteBuffer.allocate(4).putInt(size).array();
        if (!MessageDigest.isEqual(mac, frameMac(rules.toTaskLabel, received, header, payload))) {
            close(); // nothing more is read from a connection that carried a frame not the driver's
            throw new IOException("the driver at " + peer + " sent a frame that failed authentication (frame "
                    + received + " of the connection): forged, replayed or reordered");
        }
        received++;
        return JSON.readTree(new String(payload, StandardCharsets.UTF_8));
    }

    /** Whether a message is waiting to be read. */
    boolean ready() throws IOException {
        return in.available() > 0;
    }

    @Override
    public void close() throws IOException {
        socket.close();
    }

    private byte[] frameMac(String label, long sequence, byte[] header, byte[] payload) throws IOException {
        return hmac(session, bytes(label), ByteBuffer.allocate(8).putLong(sequence).array(), header, payload);
    }

    private static byte[] bytes(String label) {
        return label.getBytes(StandardCharsets.UTF_8);
    }

    private static byte[] hmac(byte[] key, byte[]... parts) throws IOException {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            for (byte[] part : parts) {
                mac.update(part);
            }
            return mac.doFinal();
        } catch (GeneralSecurityException error) {
            throw new IOException("HMAC-SHA256 is not available: " + error.getMessage());
        }
    }
}
