package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The task's side of the real-time report channel (spark_app.realtime.channel has the driver's side and the rules).
 *
 * <p>Frames are a 4-byte big-endian length and that many bytes of UTF-8 JSON. The connection opens with a challenge
 * each way on the job's key, which never goes over the wire: the driver's nonce is answered with
 * HMAC-SHA256(key, "task" + nonce) and a nonce of the task's own, which the driver answers with
 * HMAC-SHA256(key, "driver" + nonce).
 */
final class Channel implements AutoCloseable {
    static final int HANDSHAKE_TIMEOUT_MS = 5_000;
    static final int MAX_FRAME_BYTES = 64 * 1024 * 1024;
    private static final int NONCE_BYTES = 32;
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Socket socket;
    private final DataInputStream in;
    private final DataOutputStream out;

    private Channel(Socket socket) throws IOException {
        this.socket = socket;
        this.in = new DataInputStream(socket.getInputStream());
        this.out = new DataOutputStream(socket.getOutputStream());
    }

    /** Connect to the driver and prove, each way, that both hold `key`. */
    static Channel connect(String host, int port, byte[] key) throws IOException {
        Socket socket = new Socket();
        try {
            socket.connect(new InetSocketAddress(host, port), HANDSHAKE_TIMEOUT_MS);
            socket.setSoTimeout(HANDSHAKE_TIMEOUT_MS);
            socket.setTcpNoDelay(true);
            Channel channel = new Channel(socket);
            byte[] nonce = new byte[NONCE_BYTES];
            channel.in.readFully(nonce);
            byte[] mine = new byte[NONCE_BYTES];
            new SecureRandom().nextBytes(mine);
            channel.out.write(mac(key, "task", nonce));
            channel.out.write(mine);
            channel.out.flush();
            byte[] answer = new byte[32];
            channel.in.readFully(answer);
            if (!MessageDigest.isEqual(answer, mac(key, "driver", mine))) {
                throw new IOException("the driver at " + host + ":" + port + " answered the challenge wrong");
            }
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
        if (payload.length > MAX_FRAME_BYTES) {
            throw new IOException("a message of " + payload.length + " bytes is over the channel's limit");
        }
        synchronized (out) {
            out.writeInt(payload.length);
            out.write(payload);
            out.flush();
        }
    }

    JsonNode recv() throws IOException {
        int size = in.readInt();
        if (size < 0 || size > MAX_FRAME_BYTES) {
            throw new IOException("the driver sent a frame of " + size + " bytes, over the channel's limit");
        }
        byte[] payload = new byte[size];
        in.readFully(payload);
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

    private static byte[] mac(byte[] key, String side, byte[] nonce) throws IOException {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            mac.update(side.getBytes(StandardCharsets.US_ASCII));
            return mac.doFinal(nonce);
        } catch (GeneralSecurityException error) {
            throw new IOException("HMAC-SHA256 is not available: " + error.getMessage());
        }
    }
}
