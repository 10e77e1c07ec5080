package io.mirrorkit.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The benchmark's limit: the plainest copy the Java clients allow, one consumer feeding one producer per slot.
 *
 * <p>It keeps what a mirror must keep (key, value, headers, partition, CreateTime) with the same delivery settings
 * as the mirror (acks=all, idempotence). Arguments: source bootstrap, target bootstrap, target topic prefix, expected
 * records (0: copy until stopped), comma-separated topics; then optionally the producer's linger in ms (20, tuned for
 * throughput), a transaction commit interval in ms (0: no transactions; else each slot's producer is transactional
 * and commits that often, as a real-time slot of the mirror does) and the number of slots (1), each a thread of its
 * own with every n-th partition, as the mirror's real-time tasks share them. With slots, the expected records count
 * per slot.
 */
public final class CopyLoop {
    public static void main(String[] args) throws Exception {
        String source = args[0], target = args[1], prefix = args[2];
        long expected = Long.parseLong(args[3]);
        String[] topics = args[4].split(",");
        String linger = args.length > 5 ? args[5] : "20";
        long commitMs = args.length > 6 ? Long.parseLong(args[6]) : 0;
        int slots = args.length > 7 ? Integer.parseInt(args[7]) : 1;

        AtomicReference<Exception> failed = new AtomicReference<>();
        List<Thread> threads = new ArrayList<>();
        for (int slot = 0; slot < slots; slot++) {
            int share = slot;
            Thread thread = new Thread(() -> {
                try {
                    copy(source, target, prefix, expected, topics, linger, commitMs, share, slots);
                } catch (Exception error) {
                    failed.compareAndSet(null, error);
                }
            });
            thread.setDaemon(true); // a slot that fails ends the loop, whatever the others are doing
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) {
            while (thread.isAlive() && failed.get() == null) {
                thread.join(100);
            }
        }
        if (failed.get() != null) {
            throw failed.get();
        }
    }

    private static void copy(String source, String target, String prefix, long expected, String[] topics,
            String linger, long commitMs, int slot, int slots) throws Exception {
        String bytesIn = ByteArrayDeserializer.class.getName(), bytesOut = ByteArraySerializer.class.getName();
        Properties c = properties(Map.of(
                "bootstrap.servers", source, "key.deserializer", bytesIn, "value.deserializer", bytesIn,
                "enable.auto.commit", "false", "max.poll.records", "10000",
                "fetch.max.bytes", "52428800", "max.partition.fetch.bytes", "10485760"));
        Properties p = properties(Map.of(
                "bootstrap.servers", target, "key.serializer", bytesOut, "value.serializer", bytesOut,
                "acks", "all", "enable.idempotence", "true",
                "linger.ms", linger, "batch.size", "1048576", "buffer.memory", "134217728"));
        if (commitMs > 0) {
            p.put("transactional.id", prefix + "copy-loop-" + slot);
        }
        AtomicReference<Exception> failed = new AtomicReference<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            List<TopicPartition> assigned = new ArrayList<>();
            int index = 0;
            for (String topic : topics) {
                for (PartitionInfo info : consumer.partitionsFor(topic)) {
                    if (index++ % slots == slot) {
                        assigned.add(new TopicPartition(topic, info.partition()));
                    }
                }
            }
            consumer.assign(assigned);
            consumer.seekToBeginning(assigned);
            if (commitMs > 0) {
                producer.initTransactions();
                producer.beginTransaction();
            }
            long copied = 0, commitAt = System.nanoTime() + commitMs * 1_000_000;
            Duration wait = Duration.ofMillis(commitMs > 0 ? Math.min(commitMs, 5) : 500);
            while ((expected == 0 || copied < expected) && failed.get() == null) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(wait);
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    producer.send(
                            new ProducerRecord<>(
                                    prefix + r.topic(), r.partition(), r.timestamp(), r.key(), r.value(), r.headers()),
                            (metadata, error) -> {
                                if (error != null) {
                                    failed.compareAndSet(null, error);
                                }
                            });
                    copied++;
                }
                if (commitMs > 0 && System.nanoTime() >= commitAt) {
                    producer.commitTransaction();
                    producer.beginTransaction();
                    commitAt = System.nanoTime() + commitMs * 1_000_000;
                }
            }
            producer.flush();
            if (commitMs > 0) {
                producer.commitTransaction();
            }
        }
        if (failed.get() != null) {
            throw failed.get();
        }
    }

    private static Properties properties(Map<String, String> settings) {
        Properties props = new Properties();
        props.putAll(settings);
        return props;
    }
}
