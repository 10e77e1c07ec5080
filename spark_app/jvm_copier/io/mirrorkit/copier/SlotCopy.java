package io.mirrorkit.copier;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.EOFException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One real-time slot's copy on the executor's JVM: spark_app.realtime.task's loop for the common case, with Kafka's
 * Java clients, which put every ready partition of a broker in one produce request (librdkafka sends one partition
 * per request, which costs the target broker about three times MirrorMaker 2's CPU at the same rate).
 *
 * <p>It asks the driver for its partitions, starts the slot's transactional producer (fencing every earlier attempt
 * of the slot, in either language), and copies each record as it comes: the source's key, value, headers, partition
 * and timestamp; under the identity policy it drops the echoes of the target's own records and stamps the others'
 * provenance, as the contract says. Every commit interval it commits, with the source positions when the flow is exactly-once, and
 * reports landings; between commits it says how far each partition reached the target. At the first event the
 * Python loop treats with more care (a record the target's rules refuse, a delivery error, offsets that went back, a
 * position outside the log, any read error, and for an exactly-once slot a topic made again at the source since the
 * life its positions belong to, found by the topic's id before a commit) it aborts the open transaction and hands the
 * slot back: the driver runs the slot's Python task from the last commit, which meets the same event and deals with
 * it.
 *
 * <p>What it obeys per record (the target topics' refusal rules, the size cap, the slot's transactional id, the
 * latency histogram, the landing row) is the flow's copy contract, read by field name from the config (Contract).
 */
final class SlotCopy {
    private static final Logger LOG = LoggerFactory.getLogger(SlotCopy.class);
    private static final String HELLO = "hello", STARTED = "started", LANDED = "landed", REACHED = "reached",
            DONE = "done", ON = "on", STOP = "stop";
    /** How long an exactly-once slot waits for its topics' ids before a commit (spark_app.realtime.task's
     * LIFE_CHECK_TIMEOUT_S); unanswered, a transaction that carries records of a topic it asked for is aborted. */
    private static final long LIFE_CHECK_TIMEOUT_MS = 10_000;

    /** A source partition the slot copies: where it reads next, where it stops, and its landing since the report. */
    private static final class Cursor {
        final String target;
        final Contract.Refusal rule;
        long next;
        final Long stop;
        boolean seen;
        boolean done;
        boolean reported;
        Landing landing;
        final ArrayDeque<Long> inFlight = new ArrayDeque<>();

        Cursor(String target, Contract.Refusal rule, long start, Long stop) {
            this.target = target;
            this.rule = rule;
            this.next = start;
            this.stop = stop;
            this.done = stop != null && start >= stop;
        }
    }

    /** Why the slot hands back to the Python loop. */
    private static final class HandBack extends Exception {
        private static final long serialVersionUID = 1L;

        HandBack(String why) {
            super(why, null, false, false);
        }
    }

    private final SlotConfig config;
    private final Contract contract;
    private final int slot;
    private final Map<TopicPartition, Cursor> cursors = new TreeMap<>(
            (a, b) -> a.topic().equals(b.topic()) ? Integer.compare(a.partition(), b.partition())
                    : a.topic().compareTo(b.topic()));
    private final AtomicReference<Exception> deliveryFailed = new AtomicReference<>();
    /** Per topic, the id (KIP-516) of the life the slot's positions belong to, as the driver handed it over. */
    private final Map<String, String> ids = new TreeMap<>();
    /** Per partition, the next offset as of the last commit (or the start): a topic read past it is read since. */
    private final Map<TopicPartition, Long> committed = new HashMap<>();
    private Admin idsAdmin;
    long copied;

    SlotCopy(SlotConfig config, int slot) {
        this.config = config;
        this.contract = config.contract;
        this.slot = slot;
    }

    /** Copy until the driver says stop or every partition reached its stop; false when the slot was handed back. */
    boolean run() throws IOException {
        byte[] key = Channel.runKey(config.channel, config.keySource);
        try (Channel channel = Channel.connect(config.driverHost, config.driverPort, config.channel, key)) {
            channel.send(List.of(HELLO, slot));
            assign(channel.recv());
            boolean copiedAll = false;
            try {
                String cannot = contract.cannotCopy();
                if (cannot != null) {
                    throw new HandBack(cannot);
                }
                try (KafkaProducer<byte[], byte[]> producer = made(() -> Clients.producer(config, slot));
                        KafkaConsumer<byte[], byte[]> consumer = made(() -> Clients.consumer(config))) {
                    copiedAll = copy(channel, producer, consumer);
                }
            } catch (HandBack why) {
                LOG.warn("flow {}: slot {} goes on with the Python loop: {}", config.flow, slot,
                        why.getMessage());
            } finally {
                if (idsAdmin != null) {
                    idsAdmin.close(Duration.ofSeconds(5));
                }
            }
            channel.send(List.of(DONE, List.of()));
            return copiedAll;
        }
    }

    private void assign(JsonNode assignment) {
        Map<TopicPartition, Long> stops = offsets(assignment.get("stops"));
        for (Map.Entry<TopicPartition, Long> start : offsets(assignment.get("starts")).entrySet()) {
            TopicPartition tp = start.getKey();
            Cursor cursor = new Cursor(config.topics.get(tp.topic()), contract.refusals.get(tp.topic()),
                    start.getValue(), stops == null ? null : stops.get(tp));
            cursor.landing = newLanding(tp, start.getValue());
            cursors.put(tp, cursor);
            committed.put(tp, start.getValue());
        }
        JsonNode given = assignment.get("ids"); // absent from a driver that hands none over: nothing to check
        if (given != null && !given.isNull()) {
            for (Map.Entry<String, JsonNode> e : given.properties()) { // in either base64 alphabet: as Python's
                ids.put(e.getKey(), e.getValue().asText().replace('-', '+').replace('_', '/'));
            }
        }
    }

    private boolean copy(Channel channel, KafkaProducer<byte[], byte[]> producer,
            KafkaConsumer<byte[], byte[]> consumer) throws IOException, HandBack {
        long reportMs = config.reportMs, commitMs = config.commitMs;
        long tickMs = Math.min(reportMs, commitMs);
        Duration wait = Duration.ofMillis(config.pollMs);
        long now = System.currentTimeMillis(), reportAt = now + tickMs, commitAt = now + commitMs;
        boolean stopped = false;
        try {
            List<TopicPartition> open = start(producer, consumer);
            stopped = config.exactlyOnce && !stillOn(channel);
            while (!stopped && !open.isEmpty()) {
                for (ConsumerRecord<byte[], byte[]> record : poll(consumer, wait)) {
                    take(producer, record);
                }
                open = stillOpen(consumer, open);
                now = System.currentTimeMillis();
                if (now < reportAt) {
                    continue;
                }
                reportAt = now + tickMs;
                failIfDeliveryFailed();
                if (now < commitAt) {
                    channel.send(List.of(REACHED, reached()));
                } else {
                    commit(producer);
                    channel.send(List.of(LANDED, report()));
                    producer.beginTransaction();
                    commitAt = now + commitMs;
                }
                stopped = channel.ready() && STOP.equals(channel.recv().asText());
            }
            commit(producer);
            channel.send(List.of(LANDED, report()));
            return true;
        } catch (HandBack why) {
            abort(producer);
            throw why;
        }
    }

    /** Ask the driver, once the slot's producer started, whether the run is still on; false when it also said stop.
     * A run that is over (its job ended, its driver gone) throws: the slot commits nothing. Its producer's start fenced
     * the slot's earlier attempts, and the mirror's start every slot id of the runs before; a task of a run that is
     * over whose producer started only after that (its JVM paused, or slow) is fenced by neither (as the Python task's
     * still_on says). */
    private boolean stillOn(Channel channel) throws IOException {
        channel.send(List.of(STARTED, slot));
        boolean stop = false;
        String answer;
        try {
            while (STOP.equals(answer = channel.recv().asText())) {
                stop = true;
            }
        } catch (EOFException gone) {
            throw new IOException("flow " + config.flow + ": slot " + slot + ": its driver does not answer: a task of"
                    + " a run that is over, it commits nothing", gone);
        }
        if (!ON.equals(answer)) {
            throw new IOException("flow " + config.flow + ": slot " + slot + ": its driver answered '" + answer
                    + "': its run is over, it commits nothing");
        }
        return !stop;
    }

    /** A client, or a hand-back when it cannot be made (a secret not found, a setting refused). */
    private static <T> T made(Callable<T> make) throws HandBack {
        try {
            return make.call();
        } catch (Exception error) {
            throw new HandBack("making its clients: " + error.getMessage());
        }
    }

    /** Start the slot's producer (fencing every earlier attempt of the slot) and its first transaction, and read the
     * open partitions from where they stand; a refusal on the way is the Python task's to put in words. */
    private List<TopicPartition> start(KafkaProducer<byte[], byte[]> producer, KafkaConsumer<byte[], byte[]> consumer)
            throws HandBack {
        try {
            producer.initTransactions();
            if (config.exactlyOnce) {
                resumeFromCommittedPositions();
            }
            producer.beginTransaction();
            List<TopicPartition> open = openPartitions();
            consumer.assign(open);
            for (TopicPartition tp : open) {
                consumer.seek(tp, cursors.get(tp).next);
            }
            return open;
        } catch (KafkaException | IOException error) {
            throw new HandBack("starting: " + error);
        }
    }

    private Iterable<ConsumerRecord<byte[], byte[]>> poll(KafkaConsumer<byte[], byte[]> consumer, Duration wait)
            throws HandBack {
        try {
            return consumer.poll(wait);
        } catch (KafkaException error) { // a position outside the log, a refused read: the Python loop decides
            throw new HandBack("reading the source: " + error);
        }
    }

    private void take(KafkaProducer<byte[], byte[]> producer, ConsumerRecord<byte[], byte[]> record)
            throws HandBack {
        TopicPartition tp = new TopicPartition(record.topic(), record.partition());
        Cursor cursor = cursors.get(tp);
        if (cursor == null || cursor.done) {
            return;
        }
        long offset = record.offset();
        if (cursor.stop != null && offset >= cursor.stop) {
            cursor.done = true;
            return;
        }
        if (cursor.seen && offset < cursor.next) {
            throw new HandBack("the offsets of " + tp + " went back to " + offset);
        }
        // The identity policy: drop an echo of the target's own record, stamp where a record came from.
        Headers headers = record.headers();
        int stampBytes = 0;
        if (contract.dropEchoes || contract.stampProvenance) {
            byte[] cameFrom = provenanceOf(headers);
            long echoOf = contract.dropEchoes && cameFrom != null ? contract.echoOf(cameFrom) : -1;
            if (echoOf >= 0) {
                if (!cursor.seen) {
                    cursor.seen = true;
                    cursor.landing.firstOffset = offset;
                }
                cursor.landing.echoed(offset, echoOf);
                passed(cursor, offset);
                return;
            }
            if (contract.stampProvenance && cameFrom == null) {
                byte[] stamp = (contract.sourceAlias + ":" + offset).getBytes(StandardCharsets.UTF_8);
                headers = new RecordHeaders(headers.toArray()).add(contract.provenanceHeader, stamp);
                stampBytes = contract.provenanceHeader.getBytes(StandardCharsets.UTF_8).length + stamp.length;
            }
        }
        long timestamp = record.timestamp();
        if (cursor.rule != null && cursor.rule.refuses(record.key(), timestamp, contract.clockSlackMs)) {
            throw new HandBack("the target's rules for " + cursor.target + " refuse the record at " + tp + "@"
                    + offset);
        }
        if (contract.maxRecordBytes != null && size(record) + stampBytes > contract.maxRecordBytes) {
            throw new HandBack("the record at " + tp + "@" + offset + " is over the target's cap");
        }
        if (!cursor.seen) {
            cursor.seen = true;
            cursor.landing.firstOffset = offset;
        }
        Landing landing = cursor.landing;
        synchronized (cursor.inFlight) {
            cursor.inFlight.addLast(offset);
        }
        try {
            producer.send(new ProducerRecord<>(cursor.target, record.partition(), timestamp, record.key(),
                    record.value(), headers), (metadata, error) -> {
                        synchronized (cursor.inFlight) {
                            cursor.inFlight.pollFirst();
                        }
                        if (error != null) {
                            deliveryFailed.compareAndSet(null, error);
                            return;
                        }
                        // The contract's rule: timed when the target kept the record's timestamp, whatever the
                        // source's type (an append-time target answers with its own time: no latency from that).
                        double latency = metadata.timestamp() == timestamp
                                ? Math.max(0, System.currentTimeMillis() - timestamp) : -1;
                        landing.landed(offset, metadata.offset(), latency);
                    });
        } catch (ProducerFencedException | InvalidProducerEpochException fenced) {
            throw fenced;
        } catch (KafkaException error) {
            throw new HandBack("sending to " + cursor.target + ": " + error);
        }
        landing.sent((record.key() == null ? 0 : record.key().length)
                + (record.value() == null ? 0 : record.value().length));
        passed(cursor, offset);
        copied++;
    }

    /** The record at `offset` was passed on (sent, or dropped as an echo): the cursor moves past it. */
    private static void passed(Cursor cursor, long offset) {
        cursor.next = offset + 1;
        if (cursor.stop != null && cursor.next >= cursor.stop) {
            cursor.done = true;
        }
    }

    /** The first provenance header's value, or null when it has none (a null value counts as none, as in Python). */
    private byte[] provenanceOf(Headers headers) {
        for (Header header : headers) {
            if (header.key().equals(contract.provenanceHeader)) {
                return header.value();
            }
        }
        return null;
    }

    /** The open partitions; one with a stop whose log position passed it (past transaction markers) is done. */
    private List<TopicPartition> stillOpen(KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> open) {
        List<TopicPartition> still = new ArrayList<>(open.size());
        for (TopicPartition tp : open) {
            Cursor cursor = cursors.get(tp);
            if (!cursor.done && cursor.stop != null) {
                long position = consumer.position(tp);
                if (position >= cursor.stop) {
                    if (!cursor.seen) {
                        cursor.seen = true;
                        cursor.landing.firstOffset = Math.min(position, cursor.stop);
                    }
                    cursor.next = Math.max(cursor.next, position);
                    cursor.done = true;
                }
            }
            if (!cursor.done) {
                still.add(tp);
            }
        }
        if (still.size() < open.size()) {
            consumer.pause(open.stream().filter(tp -> !still.contains(tp)).toList());
        }
        return still;
    }

    private void failIfDeliveryFailed() throws HandBack {
        Exception error = deliveryFailed.get();
        if (error instanceof ProducerFencedException || error instanceof InvalidProducerEpochException) {
            throw (KafkaException) error;
        }
        if (error != null) {
            throw new HandBack("a delivery failed: " + error);
        }
    }

    /** Commit what was sent, with each partition's next offset when the flow is exactly-once. */
    private void commit(KafkaProducer<byte[], byte[]> producer) throws HandBack {
        producer.flush();
        failIfDeliveryFailed();
        Map<TopicPartition, Long> positions = new HashMap<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            positions.put(e.getKey(), e.getValue().next);
        }
        if (config.exactlyOnce) {
            String why = otherLives();
            if (why != null) {
                throw new HandBack("its transaction was aborted: " + why + "; copying again from its last commit");
            }
        }
        try {
            if (config.exactlyOnce) {
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (Map.Entry<TopicPartition, Long> e : positions.entrySet()) {
                    Cursor cursor = cursors.get(e.getKey());
                    offsets.put(new TopicPartition(cursor.target, e.getKey().partition()),
                            new OffsetAndMetadata(e.getValue()));
                }
                producer.sendOffsetsToTransaction(offsets,
                        new ConsumerGroupMetadata(config.positionsGroup));
            }
            producer.commitTransaction();
            committed.putAll(positions);
        } catch (ProducerFencedException | InvalidProducerEpochException fenced) {
            throw fenced;
        } catch (KafkaException error) {
            throw new HandBack("committing: " + error);
        }
    }

    /**
     * Before an exactly-once commit (spark_app.realtime.task's LiveCopy._other_lives): why the transaction must not
     * be committed, in the Python slot's words, or null. A consumer reads a topic deleted and made again on from
     * where it stood, with nothing in the records to tell the new life's from the old one's; the topic's id, asked
     * after the records were read, can. Another id than the driver's: what was read since the last commit may be
     * the new life's. No answer for a topic read since the last commit: it cannot say. Either way the slot aborts
     * and hands back; the Python task goes on from the last commit and checks the same ids.
     */
    private String otherLives() throws HandBack {
        Set<String> asked = new TreeSet<>(), moved = new HashSet<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            String topic = e.getKey().topic();
            if (ids.containsKey(topic)) {
                asked.add(topic);
            }
            if (e.getValue().next != committed.getOrDefault(e.getKey(), e.getValue().next)) {
                moved.add(topic);
            }
        }
        if (asked.isEmpty()) {
            return null;
        }
        Map<String, String> now = new TreeMap<>();
        try {
            if (idsAdmin == null) {
                idsAdmin = Clients.sourceAdmin(config);
            }
            Map<String, KafkaFuture<TopicDescription>> described = idsAdmin.describeTopics(asked,
                    new DescribeTopicsOptions().timeoutMs((int) LIFE_CHECK_TIMEOUT_MS)).topicNameValues();
            long deadline = System.currentTimeMillis() + LIFE_CHECK_TIMEOUT_MS;
            for (Map.Entry<String, KafkaFuture<TopicDescription>> e : described.entrySet()) {
                try {
                    long left = Math.max(1, deadline - System.currentTimeMillis());
                    Uuid found = e.getValue().get(left, TimeUnit.MILLISECONDS).topicId();
                    if (found != null && !Uuid.ZERO_UUID.equals(found)) { // all zero: no id yet
                        now.put(e.getKey(), idText(found));
                    }
                } catch (ExecutionException | TimeoutException error) { // gone, not allowed, failing: no answer
                    continue;
                }
            }
        } catch (IOException | KafkaException error) {
            now.clear(); // the client could not be made or asked: no topic answered
        } catch (InterruptedException interrupted) {
            Thread.currentThread().interrupt();
            throw new HandBack("interrupted while asking for its topics' ids");
        }
        List<String> words = new ArrayList<>();
        Set<String> unsure = new TreeSet<>();
        for (String topic : asked) {
            String id = now.get(topic);
            if (id != null && !id.equals(ids.get(topic))) {
                words.add("'" + topic + "' was made again at the source (id " + ids.get(topic) + " -> " + id
                        + "); what the slot read of it since its last commit may be the new life's, and it copies"
                        + " the topic no further until the job starts it again from the new life's log start");
            } else if (id == null && moved.contains(topic)) {
                unsure.add(topic);
            }
        }
        if (!unsure.isEmpty()) {
            words.add("the source did not say whether " + String.join(", ", unsure) + " was made again");
        }
        return words.isEmpty() ? null : String.join("; ", words);
    }

    /** A topic id as the Python side writes it (librdkafka's standard base64, unpadded); Java's Uuid.toString()
     * writes the URL-safe alphabet, another text for the same id. */
    private static String idText(Uuid id) {
        byte[] bytes = new byte[16];
        for (int i = 0; i < 8; i++) {
            bytes[i] = (byte) (id.getMostSignificantBits() >>> (56 - 8 * i));
            bytes[8 + i] = (byte) (id.getLeastSignificantBits() >>> (56 - 8 * i));
        }
        return Base64.getEncoder().withoutPadding().encodeToString(bytes);
    }

    /** Drop the open transaction: the Python task copies again from the last commit. */
    private void abort(KafkaProducer<byte[], byte[]> producer) {
        try {
            producer.abortTransaction();
        } catch (RuntimeException error) { // not started, or a fatal state: closing leaves it to the coordinator
            LOG.warn("slot {}: aborting its transaction failed: {}", slot, error.toString());
        }
    }

    /** An exactly-once slot resumes where its positions were committed, when that is past where the driver says. */
    private void resumeFromCommittedPositions() throws IOException {
        Map<TopicPartition, TopicPartition> copies = new HashMap<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            copies.put(new TopicPartition(e.getValue().target, e.getKey().partition()), e.getKey());
        }
        if (copies.isEmpty()) {
            return;
        }
        try (KafkaConsumer<byte[], byte[]> reader = Clients.positionsReader(config)) {
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e : reader.committed(copies.keySet()).entrySet()) {
                if (e.getValue() == null) {
                    continue;
                }
                Cursor cursor = cursors.get(copies.get(e.getKey()));
                long offset = e.getValue().offset();
                if (offset > cursor.next) { // copied by an attempt that crashed before it reported
                    cursor.next = cursor.landing.endOffset = offset;
                    committed.put(copies.get(e.getKey()), offset);
                    cursor.seen = true;
                    cursor.done = cursor.stop != null && offset >= cursor.stop;
                }
            }
        }
    }

    private List<TopicPartition> openPartitions() {
        List<TopicPartition> open = new ArrayList<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            if (!e.getValue().done) {
                open.add(e.getKey());
            }
        }
        return open;
    }

    /** Per partition, the first offset the target lacks as far as the slot knows: its first record in flight. */
    private List<List<Object>> reached() {
        List<List<Object>> out = new ArrayList<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            Cursor cursor = e.getValue();
            Long first;
            synchronized (cursor.inFlight) {
                first = cursor.inFlight.peekFirst();
            }
            out.add(List.of(List.of(e.getKey().topic(), e.getKey().partition()),
                    first == null ? cursor.next : Math.min(first, cursor.next)));
        }
        return out;
    }

    /** Each partition's landing up to its next offset (all of it landed: a commit flushed it); each goes on anew. */
    private List<Map<String, Object>> report() {
        List<Map<String, Object>> rows = new ArrayList<>();
        for (Map.Entry<TopicPartition, Cursor> e : cursors.entrySet()) {
            Cursor cursor = e.getValue();
            Landing landing = cursor.landing;
            landing.endOffset = cursor.next;
            if (!cursor.reported || landing.changed()) {
                rows.add(landing.toRow(contract.landingFields));
                cursor.landing = newLanding(e.getKey(), cursor.next);
            }
            cursor.reported = true;
        }
        return rows;
    }

    private Landing newLanding(TopicPartition tp, long start) {
        return new Landing(tp.topic(), tp.partition(), start, contract.latencyBoundsMs, contract.maxRuns);
    }

    /** A record's size as the contract's cap counts it: key, value, and each header's name and value. */
    private static long size(ConsumerRecord<byte[], byte[]> record) {
        long size = (record.key() == null ? 0 : record.key().length)
                + (record.value() == null ? 0 : record.value().length);
        for (Header header : record.headers()) {
            size += header.key().getBytes(StandardCharsets.UTF_8).length
                    + (header.value() == null ? 0 : header.value().length);
        }
        return size;
    }

    /** Offsets as the channel carries them, [[topic, partition], offset] each; null for null. */
    private static Map<TopicPartition, Long> offsets(JsonNode pairs) {
        if (pairs == null || pairs.isNull()) {
            return null;
        }
        Map<TopicPartition, Long> out = new LinkedHashMap<>();
        for (Iterator<JsonNode> it = pairs.elements(); it.hasNext();) {
            JsonNode pair = it.next();
            out.put(new TopicPartition(pair.get(0).get(0).asText(), pair.get(0).get(1).asInt()),
                    pair.get(1).asLong());
        }
        return out;
    }
}
