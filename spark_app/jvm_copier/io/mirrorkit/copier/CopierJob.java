package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.List;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function;

/**
 * The driver's entry (through py4j, from spark_app.realtime.jvm): one real-time slot as a Spark job of one task,
 * which holds an executor core while it copies on the executor's JVM (SlotCopy).
 */
public final class CopierJob {
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

    /** What the task runs: the config travels as its JSON text, parsed on the executor. */
    private static final class Task implements Function<Integer, long[]> {
        private static final long serialVersionUID = 1L;
        private final String config;

        Task(String config) {
            this.config = config;
        }

        @Override
        public long[] call(Integer slot) throws Exception {
            JsonNode parsed = new ObjectMapper().readTree(config);
            SlotCopy copy = new SlotCopy(parsed, slot);
            boolean all = copy.run();
            return new long[] {copy.copied, all ? 0 : 1};
        }
    }
}
