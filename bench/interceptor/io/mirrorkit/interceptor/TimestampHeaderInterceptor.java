package io.mirrorkit.interceptor;

import java.nio.charset.StandardCharsets;
import java.util.Map;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;

/**
 * Lets Spark's Kafka sink keep each record's original CreateTime.
 *
 * <p>The sink has no timestamp column, but the producer runs {@code onSend} before it stamps a record that has no
 * timestamp. The write path appends one header, {@value #HEADER}, whose value is the original timestamp in epoch
 * milliseconds as decimal ASCII. This interceptor moves that value into the record's timestamp and drops that one
 * header, so the record lands with exactly the source's headers, in order and with duplicates.
 *
 * <p>Only the last header is inspected: the write path always appends its header last, and a source header that happens
 * to share the name stays untouched. A record without the header passes through unchanged.
 */
public final class TimestampHeaderInterceptor implements ProducerInterceptor<byte[], byte[]> {
    public static final String HEADER = "__mirrorkit.ts";

    @Override
    public ProducerRecord<byte[], byte[]> onSend(ProducerRecord<byte[], byte[]> record) {
        Header[] headers = record.headers().toArray();
        if (headers.length == 0) {
            return record;
        }
        Header last = headers[headers.length - 1];
        if (!HEADER.equals(last.key()) || last.value() == null) {
            return record;
        }
        long timestamp = Long.parseLong(new String(last.value(), StandardCharsets.US_ASCII));
        RecordHeaders kept = new RecordHeaders();
        for (int i = 0; i < headers.length - 1; i++) {
            kept.add(headers[i]);
        }
        return new ProducerRecord<>(
                record.topic(), record.partition(), timestamp, record.key(), record.value(), kept);
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {}

    @Override
    public void close() {}

    @Override
    public void configure(Map<String, ?> configs) {}
}
