//! A prototype compiled copy core for the mirror, to weigh against the Python loop and the Java clients.
//!
//! `copy_ranges` copies offset ranges from a source cluster to a target cluster the way the mirror's Python copy
//! loop (spark_app.range_copy) does, with no Python code per record: one librdkafka consumer assigned to every range
//! (no group, no commits) feeds one idempotent producer (acks=all) that writes each record to the same partition of
//! `<prefix><topic>` with its key, value, headers (order, duplicates and null values kept) and timestamp. Delivery
//! reports count each range's records and give its first and last target offsets. The GIL is released for the whole
//! copy. Plaintext only: this is a bench prototype (bench/profile_writer.py --cores).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// A range with no progress this long fails the copy (the source stopped answering).
const STALL: Duration = Duration::from_secs(60);
/// Delivery reports are served after this many records sent, and whenever the consumer waits.
const POLL_EVERY: u32 = 1024;

/// What the delivery reports of one range said: records landed, first and last target offsets (-1: none).
#[derive(Clone, Copy)]
struct Landed {
    records: i64,
    first: i64,
    last: i64,
}

/// The producer's context: one `Landed` per range, indexed by the delivery opaque, and the first delivery error.
struct Deliveries {
    landed: Mutex<Vec<Landed>>,
    error: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, range: usize) {
        match result {
            Ok(msg) => {
                let offset = msg.offset();
                let mut landed = self.landed.lock().unwrap();
                let l = &mut landed[range];
                l.records += 1;
                l.first = if l.first < 0 { offset } else { l.first.min(offset) };
                l.last = l.last.max(offset);
            }
            Err((err, msg)) => {
                let mut error = self.error.lock().unwrap();
                if error.is_none() {
                    *error = Some(format!("{}[{}]: {err}", msg.topic(), msg.partition()));
                }
            }
        }
    }
}

/// One range being read: where it stops, the next offset to read, and the target topic its records go to.
struct Cursor {
    topic: String,
    partition: i32,
    next: i64,
    end: i64,
    target: String,
}

fn client_config(bootstrap: &str, settings: &[(&str, &str)]) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    for (k, v) in settings {
        config.set(*k, *v);
    }
    config
}

fn copy(
    source: &str,
    target: &str,
    ranges: &[(String, i32, i64, i64)],
    prefix: &str,
) -> Result<Vec<Landed>, String> {
    // The Python loop's consumer settings (spark_app.outbox.CONSUMER_DEFAULTS) and CopyLoop's producer batching.
    let consumer: BaseConsumer = client_config(
        source,
        &[
            ("group.id", "mirrorkit-core-proto"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "true"),
            ("auto.offset.reset", "error"),
            ("isolation.level", "read_committed"),
            ("fetch.max.bytes", "52428800"),
            ("max.partition.fetch.bytes", "10485760"),
        ],
    )
    .create()
    .map_err(|e| format!("consumer: {e}"))?;
    let deliveries = Deliveries {
        landed: Mutex::new(vec![Landed { records: 0, first: -1, last: -1 }; ranges.len()]),
        error: Mutex::new(None),
    };
    let producer: BaseProducer<Deliveries> = client_config(
        target,
        &[
            ("acks", "all"),
            ("enable.idempotence", "true"),
            ("linger.ms", "20"),
            ("batch.size", "1048576"),
            ("queue.buffering.max.messages", "500000"),
            ("queue.buffering.max.kbytes", "262144"),
        ],
    )
    .create_with_context(deliveries)
    .map_err(|e| format!("producer: {e}"))?;

    let mut cursors: Vec<Cursor> = ranges
        .iter()
        .map(|(topic, partition, start, end)| Cursor {
            topic: topic.clone(),
            partition: *partition,
            next: *start,
            end: *end,
            target: format!("{prefix}{topic}"),
        })
        .collect();
    let mut assignment = TopicPartitionList::new();
    for c in cursors.iter().filter(|c| c.next < c.end) {
        assignment
            .add_partition_offset(&c.topic, c.partition, Offset::Offset(c.next))
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| format!("assign: {e}"))?;
    let mut open = cursors.iter().filter(|c| c.next < c.end).count();
    let mut progress_at = Instant::now();
    let mut unpolled = 0u32;

    while open > 0 {
        if let Some(error) = producer.context().error.lock().unwrap().take() {
            return Err(format!("delivery failed: {error}"));
        }
        let msg = match consumer.poll(Duration::from_millis(100)) {
            None => {
                producer.poll(Duration::ZERO);
                if progress_at.elapsed() > STALL {
                    return Err(format!("no progress reading the source for {STALL:?}"));
                }
                continue;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // The log ends before the range's end (transaction markers take the last offsets): the consumer's
                // position says how far it got. The event names no topic, so every open range is looked at.
                let positions = consumer.position().map_err(|e| format!("position: {e}"))?;
                for c in cursors.iter_mut().filter(|c| c.next < c.end) {
                    let reached = positions
                        .find_partition(&c.topic, c.partition)
                        .and_then(|tp| tp.offset().to_raw())
                        .unwrap_or(-1);
                    if reached >= c.end {
                        c.next = c.end;
                        open -= 1;
                        pause(&consumer, c)?;
                    }
                }
                continue;
            }
            Some(Err(e)) => return Err(format!("consuming: {e}")),
            Some(Ok(msg)) => msg,
        };
        let (topic, partition, offset) = (msg.topic(), msg.partition(), msg.offset());
        let Some(index) = cursors.iter().position(|c| c.partition == partition && c.topic == topic) else {
            return Err(format!("a record of {topic}[{partition}], which no range reads"));
        };
        let cursor = &mut cursors[index];
        if offset < cursor.next || offset >= cursor.end {
            continue; // fetched past the range's end before its partition was paused
        }
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&cursor.target, index)
            .partition(partition);
        record.key = msg.key();
        record.payload = msg.payload();
        record.headers = msg.headers().map(|h| h.detach());
        record.timestamp = msg.timestamp().to_millis();
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(format!("producing to {}[{partition}]: {e}", cursor.target)),
            }
        }
        cursor.next = offset + 1;
        progress_at = Instant::now();
        if cursor.next >= cursor.end {
            open -= 1;
            pause(&consumer, cursor)?;
        }
        unpolled += 1;
        if unpolled >= POLL_EVERY {
            producer.poll(Duration::ZERO);
            unpolled = 0;
        }
    }
    consumer.unassign().map_err(|e| format!("unassign: {e}"))?;
    producer.flush(Duration::from_secs(300)).map_err(|e| format!("flush: {e}"))?;
    if let Some(error) = producer.context().error.lock().unwrap().take() {
        return Err(format!("delivery failed: {error}"));
    }
    let landed = producer.context().landed.lock().unwrap().clone();
    Ok(landed)
}

/// Stop fetching a partition whose range is copied.
fn pause(consumer: &BaseConsumer, cursor: &Cursor) -> Result<(), String> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&cursor.topic, cursor.partition);
    consumer.pause(&tpl).map_err(|e| format!("pause: {e}"))
}

/// Copy each (topic, partition, start, end) range [start, end) to `<target_prefix><topic>`, same partition; per range
/// (topic, partition, records landed, first target offset, last target offset), -1 for none.
#[pyfunction]
fn copy_ranges(
    py: Python<'_>,
    source_bootstrap: String,
    target_bootstrap: String,
    ranges: Vec<(String, i32, i64, i64)>,
    target_prefix: String,
) -> PyResult<Vec<(String, i32, i64, i64, i64)>> {
    let landed = py
        .detach(|| copy(&source_bootstrap, &target_bootstrap, &ranges, &target_prefix))
        .map_err(PyRuntimeError::new_err)?;
    Ok(ranges
        .into_iter()
        .zip(landed)
        .map(|((topic, partition, _, _), l)| (topic, partition, l.records, l.first, l.last))
        .collect())
}

#[pymodule]
fn mirrorkit_core_proto(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(copy_ranges, m)?)
}
