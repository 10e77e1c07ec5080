package io.mirrorkit.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
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

        Properties c = new Properties();
        c.put("bootstrap.servers", source);
        c.put("enable.auto.commit", "false");
        c.put("max.poll.records", "10000");
        c.put("fetch.max.bytes", "52428800");
        c.put("max.partition.fetch.bytes", "10485760");
        c.put("key.deserializer", ByteArrayDeserializer.class.getName());
        c.put("value.deserializer", ByteArrayDeserializer.class.getName());
        Properties p = new Properties();
        p.put("bootstrap.servers", target);
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("linger.ms", "20");
        p.put("batch.size", "1048576");
        p.put("buffer.memory", "134217728");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());

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
}
