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
 * The benchmark's limit: the plainest copy the Java clients allow, one consumer feeding one producer.
 *
 * <p>It keeps what a mirror must keep (key, value, headers, partition, CreateTime) with the same delivery settings
 * as the mirror (acks=all, idempotence) and stops once it has copied the expected number of records.
 * Arguments: source bootstrap, target bootstrap, target topic prefix, expected records, comma-separated topics.
 */
public final class CopyLoop {
    public static void main(String[] args) throws Exception {
        String source = args[0], target = args[1], prefix = args[2];
        long expected = Long.parseLong(args[3]);
        String[] topics = args[4].split(",");

        String bytesIn = ByteArrayDeserializer.class.getName(), bytesOut = ByteArraySerializer.class.getName();
        Properties c = properties(Map.of(
                "bootstrap.servers", source, "key.deserializer", bytesIn, "value.deserializer", bytesIn,
                "enable.auto.commit", "false", "max.poll.records", "10000",
                "fetch.max.bytes", "52428800", "max.partition.fetch.bytes", "10485760"));
        Properties p = properties(Map.of(
                "bootstrap.servers", target, "key.serializer", bytesOut, "value.serializer", bytesOut,
                "acks", "all", "enable.idempotence", "true",
                "linger.ms", "20", "batch.size", "1048576", "buffer.memory", "134217728"));

        AtomicReference<Exception> failed = new AtomicReference<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(c);
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            List<TopicPartition> assigned = new ArrayList<>();
            for (String topic : topics) {
                for (PartitionInfo info : consumer.partitionsFor(topic)) {
                    assigned.add(new TopicPartition(topic, info.partition()));
                }
            }
            consumer.assign(assigned);
            consumer.seekToBeginning(assigned);
            long copied = 0;
            while (copied < expected && failed.get() == null) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
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
            }
            producer.flush();
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
