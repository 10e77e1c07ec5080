package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.EOFException;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function;

/**
 * The driver's entry (through py4j, from spark_app.realtime.jvm): one real-time slot as a Spark job of one task,
 * which holds an executor core while it copies on the executor's JVM (SlotCopy).
 */
public final class CopierJob {
    private static final ObjectMapper JSON = new ObjectMapper();

    private CopierJob() {}

    /**
     * Run slot `slot` of the flow `config` (JSON) describes, until the driver says stop or its partitions reached
     * their stops. Returns the records it copied, and 1 when it handed the slot back to the Python loop (else 0).
     */
    public static long[] run(JavaSparkContext context, String config, int slot) {
        List<long[]> out = context.parallelize(List.of(slot), 1).map(new Task(config)).collect();
        return out.get(0);
    }

    /**
     * What the copier makes of a copy contract (JSON, spark_app.copy_wing.contract): the contract as it read it, or
     * why it refuses it (Contract.check). tests/test_copy_contract.py holds it to Python's CopyContract with this.
     */
    public static String checkContract(String contract) throws IOException {
        return Contract.check(contract);
    }

    /**
     * What the copier makes of a slot's config (JSON, spark_app.realtime.jvm.SlotConfig): the config as it read it, or
     * why it refuses it. tests/test_jvm_copier.py holds it to Python's SlotConfig with this.
     */
    public static String checkSlotConfig(String config) throws IOException {
        return SlotConfig.check(config);
    }

    /**
     * What the copier makes of the report channel's rules (JSON, spark_app.channel.ChannelRules): the rules
     * as it read them, or why it refuses them. tests/test_jvm_copier.py holds it to Python's rules with this.
     */
    public static String checkChannel(String rules) throws IOException {
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            out.put("read", Channel.Rules.read(JSON.readTree(rules)).asRead());
        } catch (IllegalArgumentException error) {
            out.put("refused", error.getMessage());
        }
        return JSON.writeValueAsString(out);
    }

    /**
     * The task's side of the report channel alone, for tests/test_jvm_copier.py: connect as a slot with `config`
     * (`driver`, `channel`, `key_source`), send `[hello, -1]`, send back each message the driver sends until it
     * closes, and say how it ended: "closed", or why it broke the connection.
     */
    public static String echoChannel(String config) throws IOException {
        JsonNode parsed = JSON.readTree(config);
        Channel.Rules rules = Channel.Rules.read(parsed.get("channel"));
        JsonNode driver = parsed.get("driver");
        byte[] key = Channel.runKey(rules, parsed.get("key_source"));
        try (Channel channel = Channel.connect(driver.get("host").asText(), driver.get("port").asInt(), rules, key)) {
            channel.send(List.of("hello", -1));
            while (true) {
                channel.send(channel.recv());
            }
        } catch (EOFException closed) {
            return "closed";
        } catch (IOException broken) {
            return broken.getMessage();
        }
    }

    /** What the task runs: the config travels as its JSON text, parsed on the executor. */
    private static final class Task implements Function<Integer, long[]> {
        private static final long serialVersionUID = 1L;
        private final String config;

        Task(String config) {
            this.config = config;
        }

        @Override
        public long[] call(Integer slot) throws Exception {
            SlotCopy copy = new SlotCopy(SlotConfig.read(new ObjectMapper().readTree(config)), slot);
            boolean all = copy.run();
            return new long[] {copy.copied, all ? 0 : 1};
        }
    }
}
