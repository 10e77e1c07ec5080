//! The mirror's compiled copy core: the per-record path of spark_app.outbox, with no Python per record.
//!
//! `Copier.copy` copies offset ranges (one per source partition) from the source to the target as the Python loop
//! does: records in source order with the source's key, value, headers (order, duplicates and null values kept),
//! partition and timestamp; identity echoes dropped and the provenance header stamped; each delivery filed into its
//! range's landing (runs, replication-latency histogram). The GIL is released for the whole copy.
//!
//! It takes the common case only. At the first event the Python loop treats with more care (a record the target
//! refuses or would refuse, a delivery error, offsets that went back or a position outside the log, a read error, a
//! partition that reads nothing, a refused login) it stops producing, lets what it sent land (purging what is only
//! queued when a delivery failed for the target), and returns the event with every range's cursor and landing: the
//! Python loop (spark_app.compiled_copy) goes on from there. So the rare paths have one implementation.
//!
//! What it obeys per record (refusal rules, error classes, provenance, the size cap, the landing row) comes with each
//! copy as the flow's contract (spark_app.copy_wing.contract), JSON read by field name into `Contract`: a field it
//! does not know, or one missing, refuses the contract by name. Its results come back by name too, as dicts.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::error::Error;
use std::ffi::{c_void, CStr, CString};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::raw::c_char;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use rdkafka::bindings as rdsys;
use rdkafka::client::OAuthToken;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext, PurgeConfig,
};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

/// Delivery reports are served after this many records sent, at least this often while records are sent (so a
/// landing's replication latency is timed when it lands, not when a later poll came), and whenever the consumer waits.
const POLL_EVERY: u32 = 1024;
const POLL_AFTER: Duration = Duration::from_millis(5);
/// How long one wait for the source lasts before the copy looks at its clock again.
const WAIT: Duration = Duration::from_millis(100);
/// How long one wait for the transaction coordinator lasts before the producer is polled (`init_transactions`).
const INIT_STEP: Duration = Duration::from_millis(500);

/// The flow's per-record contract (spark_app.copy_wing.contract.CopyContract), read by field name. An Option field
/// must be there too, as null: `Option::deserialize` keeps serde from taking a missing one for None.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Contract {
    flow: String,
    refusals: BTreeMap<String, Refusal>,
    clock_slack_ms: i64,
    partition_errors: Vec<i32>,
    provenance_header: String,
    stamp_provenance: bool,
    drop_echoes: bool,
    source_alias: String,
    target_alias: String,
    max_provenance_offset: u64,
    #[serde(deserialize_with = "Option::deserialize")]
    max_record_bytes: Option<i64>,
    #[serde(deserialize_with = "Option::deserialize")]
    transactional_id_prefix: Option<String>,
    transactional_id_rule: String,
    latency_bounds_ms: Vec<f64>,
    max_runs: usize,
    landing_fields: Vec<String>,
}

/// What a target topic refuses that a record shows (spark_app.copy_wing.contract.TopicRefusal).
#[derive(Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Refusal {
    compacted: bool,
    #[serde(deserialize_with = "Option::deserialize")]
    before_max_ms: Option<i64>,
    #[serde(deserialize_with = "Option::deserialize")]
    after_max_ms: Option<i64>,
}

/// The landing fields a copy hands back, each by the name spark_app.ranges.Landing gives it: a contract must name
/// every one of them.
const LANDING_FIELDS: [&str; 10] = [
    "first_offset",
    "records",
    "bytes",
    "dropped",
    "last_offset",
    "last_target_offset",
    "runs",
    "echoes",
    "latency_counts",
    "latency_sum_ms",
];

impl Contract {
    fn read(json: &str) -> PyResult<Contract> {
        serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("copy contract: {e}")))
    }

    /// The contract, when a copier whose producer has `slot_id` (its transactional.id, if any) can obey it: a flow
    /// that writes transactions is copied by one of its slots' producers, any other by a producer of none.
    fn for_copy(json: &str, slot_id: Option<&str>) -> PyResult<Contract> {
        let contract = Contract::read(json)?;
        if let Some(missing) = LANDING_FIELDS
            .iter()
            .find(|f| !contract.landing_fields.iter().any(|g| g == *f))
        {
            return Err(PyValueError::new_err(format!(
                "copy contract of flow {}: its landing row has no field `{missing}`",
                contract.flow
            )));
        }
        match (contract.transactional_id_prefix.as_deref(), slot_id) {
            (Some(prefix), Some(id)) if id.starts_with(prefix) => Ok(contract),
            (None, None) => Ok(contract),
            (Some(prefix), _) => Err(PyValueError::new_err(format!(
                "copy contract of flow {}: it writes transactions (ids '{prefix}...'), and this copier's producer is \
                 none of its slots'",
                contract.flow
            ))),
            (None, Some(id)) => Err(PyValueError::new_err(format!(
                "copy contract of flow {}: it writes no transactions, and this copier's producer is slot '{id}'",
                contract.flow
            ))),
        }
    }
}

/// A record the target refused in a delivery report, for the dead-letter topic or a hold: its key, value and headers
/// as sent (the provenance stamp among them), and no timestamp once it failed, as the Python loop's report has
/// (spark_app.outbox.Refused.of).
struct Refused {
    range: usize,
    offset: i64,
    code: i32,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Option<Vec<(String, Option<Vec<u8>>)>>,
    timestamp: i64,
}

/// What one range's delivery reports said, as spark_app.ranges.Landing keeps it.
#[derive(Clone)]
struct Landed {
    last_offset: i64,
    last_target_offset: i64,
    runs: Vec<[i64; 3]>,
    latency_counts: Vec<i64>,
    latency_sum_ms: f64,
    in_flight: VecDeque<i64>,
}

/// The landings of the copy under way, and the contract's rules for filing into them.
#[derive(Default)]
struct Landings {
    ranges: Vec<Landed>,
    latency_bounds_ms: Vec<f64>,
    max_runs: usize,
}

/// A token login's callback (spark_app.profiles: Entra ID, MSK IAM), the same Python callable confluent-kafka's
/// clients take as `oauth_cb`: given the cluster's `sasl.oauthbearer.config`, it returns the token and when it
/// expires (seconds since the epoch), and may name a principal. None for a cluster that logs in otherwise.
struct TokenSource(Option<Py<PyAny>>);

impl TokenSource {
    /// A new token, from the callback, with the GIL taken for the call (the copy runs without it).
    fn token(&self, config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        let Some(callback) = &self.0 else {
            return Err("an OAUTHBEARER login with no token callback".into());
        };
        Python::attach(|py| -> PyResult<OAuthToken> {
            let reply = callback.call1(py, (config.unwrap_or(""),))?;
            let reply = reply.bind(py);
            let token: String = reply.get_item(0)?.extract()?;
            let expiry_s: f64 = reply.get_item(1)?.extract()?;
            let principal_name = match reply.len()? {
                n if n > 2 => reply
                    .get_item(2)?
                    .extract::<Option<String>>()?
                    .unwrap_or_default(),
                _ => String::new(),
            };
            Ok(OAuthToken {
                token,
                principal_name,
                lifetime_ms: (expiry_s * 1000.0) as i64,
            })
        })
        .map_err(|e| {
            Python::attach(|py| format!("the token callback failed: {}", e.value(py))).into()
        })
    }

    /// Hand a client the token librdkafka asked for (its refresh event), or the callback's failure, which librdkafka
    /// reports as a failed login.
    unsafe fn refresh(&self, client: *mut rdsys::rd_kafka_t, config: Option<&str>) {
        let mut err = [0 as c_char; 512];
        let failure = match self.token(config) {
            Ok(t) => match (CString::new(t.token), CString::new(t.principal_name)) {
                (Ok(token), Ok(principal)) => {
                    let code = rdsys::rd_kafka_oauthbearer_set_token(
                        client,
                        token.as_ptr(),
                        t.lifetime_ms,
                        principal.as_ptr(),
                        std::ptr::null_mut(),
                        0,
                        err.as_mut_ptr(),
                        err.len(),
                    );
                    if code == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                        return;
                    }
                    c_str(err.as_ptr())
                }
                _ => {
                    "the token callback returned a token or principal with a NUL in it".to_string()
                }
            },
            Err(e) => e.to_string(),
        };
        let failure = CString::new(failure.replace('\0', " ")).unwrap_or_default();
        rdsys::rd_kafka_oauthbearer_set_token_failure(client, failure.as_ptr());
    }
}

/// The consumer's context: its token login, served where the copy reads its queue (`Copier::serve`).
struct Reads {
    tokens: TokenSource,
}

impl ClientContext for Reads {}
impl ConsumerContext for Reads {}

/// The producer's context: the landings, the refused records, a refused login, and its token login, whose refresh
/// events rdkafka serves with its own `poll` (`Copier::serve_reports`).
struct Deliveries {
    landed: Mutex<Landings>,
    refused: Mutex<Vec<Refused>>,
    auth_failed: Mutex<Option<String>>,
    tokens: TokenSource,
}

/// Whether a client error is the cluster refusing the credentials, not a connection lost during the handshake
/// (spark_app.clients.auth_error_callback says the same).
fn is_auth_failure(code: RDKafkaErrorCode, reason: &str) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed
    ) && !reason.contains("Broker transport failure")
}

impl ClientContext for Deliveries {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, config: Option<&str>) -> Result<OAuthToken, Box<dyn Error>> {
        self.tokens.token(config)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code() {
            if is_auth_failure(code, reason) {
                self.auth_failed
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| reason.to_string());
            }
        }
    }
}

/// spark_app.ranges.extend_runs: `offset` -> `target` added to runs that grow in order.
fn extend_runs(runs: &mut Vec<[i64; 3]>, offset: i64, target: i64, max_runs: usize) {
    if let Some(run) = runs.last_mut() {
        if offset == run[2] + 1 && target == run[1] + offset - run[0] {
            run[2] = offset;
            return;
        }
        if runs.len() >= max_runs {
            *runs.last_mut().unwrap() = [offset, target, offset];
            return;
        }
    }
    runs.push([offset, target, offset]);
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, range: usize) {
        let mut landed = self.landed.lock().unwrap();
        let Landings {
            ranges,
            latency_bounds_ms,
            max_runs,
        } = &mut *landed;
        // A report after its copy returned (one that did not land within its flush) has no landing to file into.
        let Some(l) = ranges.get_mut(range) else {
            return;
        };
        let Some(offset) = l.in_flight.pop_front() else {
            return;
        };
        match result {
            Ok(msg) => {
                l.last_offset = offset;
                l.last_target_offset = msg.offset();
                extend_runs(&mut l.runs, offset, msg.offset(), *max_runs);
                if let rdkafka::Timestamp::CreateTime(ts) = msg.timestamp() {
                    // The report says the target kept the record's timestamp; an append-time target replaced it:
                    // no latency from that (the contract's rule, whatever the source's timestamp type).
                    let latency = (now_ms() - ts as f64).max(0.0);
                    let bucket = latency_bounds_ms.partition_point(|b| *b < latency);
                    l.latency_counts[bucket] += 1;
                    l.latency_sum_ms += latency;
                }
            }
            Err((err, msg)) => {
                let code = err.rdkafka_error_code().map(|c| c as i32).unwrap_or(-1);
                self.refused.lock().unwrap().push(Refused {
                    range,
                    offset,
                    code,
                    key: msg.key().map(<[u8]>::to_vec),
                    value: msg.payload().map(<[u8]>::to_vec),
                    headers: msg.headers().map(|headers| {
                        headers
                            .iter()
                            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    }),
                    timestamp: msg.timestamp().to_millis().unwrap_or(-1),
                });
            }
        }
    }
}

impl Refusal {
    /// Whether the target topic refuses the record (spark_app.topics.TargetRule.refusal).
    fn refuses(&self, key: Option<&[u8]>, timestamp_ms: i64, clock_slack_ms: i64) -> bool {
        if self.compacted && key.is_none() {
            return true;
        }
        if self.before_max_ms.is_none() && self.after_max_ms.is_none() {
            return false;
        }
        let skew = now_ms() as i64 - timestamp_ms;
        self.before_max_ms
            .is_some_and(|m| skew > m + clock_slack_ms)
            || self
                .after_max_ms
                .is_some_and(|m| -skew > m + clock_slack_ms)
    }
}

/// One range's cursor, as spark_app.outbox.Cursor is the Python loop's, and the counts its sends add to its landing.
struct Cursor {
    topic: String,
    partition: i32,
    target: String,
    rule: Option<Refusal>,
    next: i64,
    stop: i64,
    seen: bool,
    done: bool,
    first_offset: i64,
    records: i64,
    bytes: i64,
    dropped: i64,
    last_offset: i64,
    echoes: Vec<[i64; 3]>,
    read_at: Instant,
}

/// A consumed event, read off librdkafka's message: a record, the end of a partition's log, or an error.
struct Event {
    err: RDKafkaRespErr,
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<&'static [u8]>,
    value: Option<&'static [u8]>,
    timestamp: Option<i64>,
    headers: *mut rdsys::rd_kafka_headers_t,
    reason: String,
}

unsafe fn bytes(ptr: *mut c_void, len: usize) -> Option<&'static [u8]> {
    if ptr.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts(ptr as *const u8, len))
    }
}

unsafe fn c_str(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

/// Why the copy stopped early, and on what; None when every range reached its stop.
#[derive(Default)]
struct Stopped {
    kind: &'static str,
    range: i64,
    offset: i64,
    detail: String,
}

/// The compiled copy core of one flow's source and target clients, kept per worker like the Python loop's clients.
#[pyclass(module = "mirrorkit_copy_core")]
struct Copier {
    consumer: BaseConsumer<Reads>,
    queue: *mut rdsys::rd_kafka_queue_t,
    /// The producer's main queue, where its delivery reports wait to be served.
    reports: *mut rdsys::rd_kafka_queue_t,
    /// Readable once a report lands in an empty `reports`: librdkafka writes a byte to its pair,
    /// `_report_writer`, kept open for it.
    report_signal: UnixStream,
    _report_writer: UnixStream,
    producer: BaseProducer<Deliveries>,
    idle: Option<Duration>,
    /// The producer's transactional.id, when it writes a slot's transactions.
    slot_id: Option<String>,
    /// The (topic, partition, next offset) the consumer was left reading by a copy that ran out of time; a copy
    /// that goes on from exactly there keeps the assignment, and what the consumer fetched meanwhile.
    kept: Mutex<Vec<(String, i32, i64)>>,
}

// The raw queue is librdkafka's, which is thread-safe; the copier is used by one task at a time.
unsafe impl Send for Copier {}
unsafe impl Sync for Copier {}

fn config(settings: Vec<(String, String)>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (k, v) in settings {
        config.set(k, v);
    }
    config
}

/// A range to copy, read by name from its dict: the source partition, its target topic, from `next` up to `stop`.
#[derive(FromPyObject)]
struct RangeIn {
    #[pyo3(item)]
    topic: String,
    #[pyo3(item)]
    partition: i32,
    #[pyo3(item)]
    target: String,
    #[pyo3(item)]
    next: i64,
    #[pyo3(item)]
    stop: i64,
}

/// A range's cursor and what landed of it, as `copy` hands them back.
struct RangeOut {
    next: i64,
    seen: bool,
    done: bool,
    first_offset: i64,
    records: i64,
    bytes: i64,
    dropped: i64,
    last_offset: i64,
    last_target_offset: i64,
    runs: Vec<[i64; 3]>,
    echoes: Vec<[i64; 3]>,
    latency_counts: Vec<i64>,
    latency_sum_ms: f64,
}

impl RangeOut {
    /// `{"next", "seen", "done", "landing": {...}}`, the landing keyed by LANDING_FIELDS' names.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let landing = PyDict::new(py);
        landing.set_item("first_offset", self.first_offset)?;
        landing.set_item("records", self.records)?;
        landing.set_item("bytes", self.bytes)?;
        landing.set_item("dropped", self.dropped)?;
        landing.set_item("last_offset", self.last_offset)?;
        landing.set_item("last_target_offset", self.last_target_offset)?;
        landing.set_item("runs", &self.runs)?;
        landing.set_item("echoes", &self.echoes)?;
        landing.set_item("latency_counts", &self.latency_counts)?;
        landing.set_item("latency_sum_ms", self.latency_sum_ms)?;
        let out = PyDict::new(py);
        out.set_item("next", self.next)?;
        out.set_item("seen", self.seen)?;
        out.set_item("done", self.done)?;
        out.set_item("landing", landing)?;
        Ok(out)
    }
}

fn optional_bytes<'py>(py: Python<'py>, value: &Option<Vec<u8>>) -> Option<Bound<'py, PyBytes>> {
    value.as_deref().map(|v| PyBytes::new(py, v))
}

impl Refused {
    /// `{"range", "offset", "code", "key", "value", "headers", "timestamp"}`; headers as [(name, value)] or None.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        out.set_item("range", self.range)?;
        out.set_item("offset", self.offset)?;
        out.set_item("code", self.code)?;
        out.set_item("key", optional_bytes(py, &self.key))?;
        out.set_item("value", optional_bytes(py, &self.value))?;
        let headers = match &self.headers {
            None => None,
            Some(headers) => {
                let list = PyList::empty(py);
                for (name, value) in headers {
                    list.append((name, optional_bytes(py, value)))?;
                }
                Some(list)
            }
        };
        out.set_item("headers", headers)?;
        out.set_item("timestamp", self.timestamp)?;
        Ok(out)
    }
}

#[pymethods]
impl Copier {
    /// Clients from librdkafka settings (strings only), and for a cluster that logs in with a token its callback
    /// (`consumer_token`, `producer_token`). A partition with records left that reads nothing for `idle_s` (None:
    /// never) ends a copy; what each copy obeys comes with it, as the flow's contract.
    #[new]
    #[pyo3(signature = (consumer_settings, producer_settings, idle_s, consumer_token=None, producer_token=None))]
    fn new(
        consumer_settings: Vec<(String, String)>,
        producer_settings: Vec<(String, String)>,
        idle_s: Option<f64>,
        consumer_token: Option<Py<PyAny>>,
        producer_token: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let slot_id = producer_settings
            .iter()
            .find(|(k, _)| k == "transactional.id")
            .map(|(_, v)| v.clone());
        let reads = Reads {
            tokens: TokenSource(consumer_token),
        };
        let consumer: BaseConsumer<Reads> = config(consumer_settings)
            .create_with_context(reads)
            .map_err(|e| PyRuntimeError::new_err(format!("source consumer: {e}")))?;
        let deliveries = Deliveries {
            landed: Mutex::new(Landings::default()),
            refused: Mutex::new(Vec::new()),
            auth_failed: Mutex::new(None),
            tokens: TokenSource(producer_token),
        };
        let producer: BaseProducer<Deliveries> = config(producer_settings)
            .create_with_context(deliveries)
            .map_err(|e| PyRuntimeError::new_err(format!("target producer: {e}")))?;
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        if queue.is_null() {
            return Err(PyRuntimeError::new_err(
                "source consumer: no consumer queue (group.id unset?)",
            ));
        }
        let (report_signal, _report_writer) = UnixStream::pair()
            .and_then(|pair| pair.1.set_nonblocking(true).map(|()| pair))
            .map_err(|e| PyRuntimeError::new_err(format!("target producer: report signal: {e}")))?;
        let reports = unsafe { rdsys::rd_kafka_queue_get_main(producer.client().native_ptr()) };
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(
                reports,
                _report_writer.as_raw_fd(),
                b"r".as_ptr() as *const c_void,
                1,
            );
        }
        Ok(Copier {
            consumer,
            queue,
            reports,
            report_signal,
            _report_writer,
            producer,
            idle: idle_s.map(Duration::from_secs_f64),
            slot_id,
            kept: Mutex::new(Vec::new()),
        })
    }

    /// Copy the ranges (dicts: topic, partition, target, next, stop), each from `next` up to `stop`, as the flow's
    /// `contract` (JSON) says, for at most `until_s` (None: until every range is done) and, with `until_bytes`, until
    /// it has read that many bytes of keys and values (a transaction's bound). Returns a dict: `ranges`, per
    /// range its cursor and landing (RangeOut); `stopped`, why it stopped early (kind `""` when it did not, or ran
    /// out of time), with the range index, offset and detail; `refused`, the records refused in delivery reports;
    /// `undelivered`, how many records did not land within `flush_s`. Whatever stops it, what it sent has landed (or
    /// failed) by the time it returns.
    #[pyo3(signature = (contract, ranges, flush_s, until_s=None, until_bytes=None))]
    fn copy<'py>(
        &self,
        py: Python<'py>,
        contract: &str,
        ranges: Vec<RangeIn>,
        flush_s: f64,
        until_s: Option<f64>,
        until_bytes: Option<i64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let contract = Contract::for_copy(contract, self.slot_id.as_deref())?;
        let until = Until {
            at: until_s.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0))),
            bytes: until_bytes,
        };
        let (out, stopped, refused, undelivered) =
            py.detach(|| self.run(&contract, ranges, flush_s, until));
        let result = PyDict::new(py);
        let rows = PyList::empty(py);
        for range in &out? {
            rows.append(range.to_dict(py)?)?;
        }
        result.set_item("ranges", rows)?;
        let why = PyDict::new(py);
        why.set_item("kind", stopped.kind)?;
        why.set_item("range", stopped.range)?;
        why.set_item("offset", stopped.offset)?;
        why.set_item("detail", stopped.detail)?;
        result.set_item("stopped", why)?;
        let refusals = PyList::empty(py);
        for r in &refused {
            refusals.append(r.to_dict(py)?)?;
        }
        result.set_item("refused", refusals)?;
        result.set_item("undelivered", undelivered)?;
        Ok(result)
    }

    /// Whether the producer hit an error librdkafka calls fatal: it cannot be used again.
    fn fatal(&self) -> bool {
        let mut buf = [0 as c_char; 256];
        let code = unsafe {
            rdsys::rd_kafka_fatal_error(self.producer.client().native_ptr(), buf.as_mut_ptr(), 256)
        };
        code != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
    }

    /// The producer's transactions, as confluent-kafka's Producer calls them (its `transactional.id` comes with
    /// the producer settings): spark_app.compiled_copy.CoreTransactions drives them for a slot. Each of these returns
    /// None, or the error as (code, reason, fatal, retriable, txn_requires_abort).
    /// Start the producer's transactions, fencing the id's earlier producers. A producer that logs in with a token
    /// gets its first one from a refresh event, which only a poll serves: the wait is cut into short ones with a
    /// poll before each (librdkafka takes an init that timed out again, "retry call to resume"), or it would run out
    /// with no login at all.
    fn init_transactions(&self, py: Python<'_>, timeout_s: f64) -> TxnError {
        let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
        py.detach(|| loop {
            self.producer.poll(Duration::ZERO);
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(INIT_STEP);
            let error = unsafe {
                txn_error(rdsys::rd_kafka_init_transactions(
                    self.rk(),
                    step.as_millis() as i32,
                ))
            };
            match error {
                Some((code, ..))
                    if code == RDKafkaErrorCode::OperationTimedOut as i32
                        && Instant::now() < deadline => {}
                other => return other,
            }
        })
    }

    fn begin_transaction(&self) -> TxnError {
        unsafe { txn_error(rdsys::rd_kafka_begin_transaction(self.rk())) }
    }

    /// Send source positions (topic, partition, offset, metadata) to the open transaction, as offsets of the group
    /// `group_metadata` names (confluent-kafka's `consumer_group_metadata()`, serialized by librdkafka).
    fn send_offsets_to_transaction(
        &self,
        py: Python<'_>,
        positions: Vec<(String, i32, i64, Option<String>)>,
        group_metadata: &[u8],
        timeout_s: f64,
    ) -> PyResult<TxnError> {
        let mut offsets = TopicPartitionList::new();
        for (topic, partition, offset, metadata) in positions {
            offsets
                .add_partition_offset(&topic, partition, Offset::Offset(offset))
                .map_err(|e| PyValueError::new_err(format!("{topic}[{partition}]: {e}")))?;
            if let (Some(note), Some(mut elem)) =
                (metadata, offsets.find_partition(&topic, partition))
            {
                // With its C string's NUL, as confluent-kafka writes a position's metadata, and as it reads one back
                // (up to the NUL): written without it, a reader reads past its end.
                elem.set_metadata(format!("{note}\0"));
            }
        }
        let mut group: *mut rdsys::rd_kafka_consumer_group_metadata_t = std::ptr::null_mut();
        let read = unsafe {
            rdsys::rd_kafka_consumer_group_metadata_read(
                &mut group,
                group_metadata.as_ptr() as *const c_void,
                group_metadata.len(),
            )
        };
        if let Some(error) = unsafe { txn_error(read) } {
            return Ok(Some(error));
        }
        let group = Native(group);
        let ms = millis(timeout_s);
        let sent = py.detach(|| unsafe {
            let group = &group;
            txn_error(rdsys::rd_kafka_send_offsets_to_transaction(
                self.rk(),
                offsets.ptr(),
                group.0,
                ms,
            ))
        });
        unsafe { rdsys::rd_kafka_consumer_group_metadata_destroy(group.0) };
        Ok(sent)
    }

    fn commit_transaction(&self, py: Python<'_>, timeout_s: f64) -> TxnError {
        let ms = millis(timeout_s);
        py.detach(|| unsafe { txn_error(rdsys::rd_kafka_commit_transaction(self.rk(), ms)) })
    }

    fn abort_transaction(&self, py: Python<'_>, timeout_s: f64) -> TxnError {
        let ms = millis(timeout_s);
        py.detach(|| unsafe { txn_error(rdsys::rd_kafka_abort_transaction(self.rk(), ms)) })
    }

    /// Drop what the producer queues (`in_queue`) and what it has in flight (`in_flight`), as confluent-kafka's.
    fn purge(&self, in_queue: bool, in_flight: bool) {
        let mut how = PurgeConfig::default();
        if in_queue {
            how = how.queue();
        }
        if in_flight {
            how = how.inflight();
        }
        self.producer.purge(how);
    }

    /// Serve the delivery reports waiting.
    fn poll(&self) {
        self.serve_reports();
    }

    /// Wait up to `timeout_s` for what was sent to land or fail; how many records did not (confluent-kafka's).
    #[pyo3(name = "flush")]
    fn flush_within(&self, py: Python<'_>, timeout_s: f64) -> usize {
        py.detach(|| {
            if self.flush(Duration::from_secs_f64(timeout_s.max(0.0))) {
                0
            } else {
                self.producer.in_flight_count().max(0) as usize
            }
        })
    }

    /// Let what was sent land, and close the clients.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            self.flush(Duration::from_secs(30));
            let _ = self.consumer.unassign();
            self.kept.lock().unwrap().clear();
        })
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        unsafe {
            rdsys::rd_kafka_queue_destroy(self.queue);
            // librdkafka writes to `_report_writer` no more before it is closed (after this, with the fields).
            rdsys::rd_kafka_queue_io_event_enable(self.reports, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.reports);
        }
    }
}

/// A transaction call's error as confluent-kafka's KafkaError takes it: code, reason, and whether it is fatal,
/// retriable, or requires the transaction to be aborted. None when the call succeeded.
type TxnError = Option<(i32, String, bool, bool, bool)>;

/// The error a librdkafka transaction call returned, freed; None for none.
unsafe fn txn_error(error: *mut rdsys::rd_kafka_error_t) -> TxnError {
    if error.is_null() {
        return None;
    }
    let out = (
        rdsys::rd_kafka_error_code(error) as i32,
        c_str(rdsys::rd_kafka_error_string(error)),
        rdsys::rd_kafka_error_is_fatal(error) != 0,
        rdsys::rd_kafka_error_is_retriable(error) != 0,
        rdsys::rd_kafka_error_txn_requires_abort(error) != 0,
    );
    rdsys::rd_kafka_error_destroy(error);
    Some(out)
}

fn millis(seconds: f64) -> i32 {
    (seconds.max(0.0) * 1000.0).min(i32::MAX as f64) as i32
}

/// A librdkafka object handed to a call made without the GIL; librdkafka's objects are thread-safe.
struct Native<T>(*mut T);
unsafe impl<T> Send for Native<T> {}
unsafe impl<T> Sync for Native<T> {}

/// Where a copy ends short of its ranges' stops: at an instant, and after reading so many bytes.
#[derive(Clone, Copy)]
struct Until {
    at: Option<Instant>,
    bytes: Option<i64>,
}

impl Copier {
    fn rk(&self) -> *mut rdsys::rd_kafka_t {
        self.producer.client().native_ptr()
    }

    fn run(
        &self,
        contract: &Contract,
        ranges_in: Vec<RangeIn>,
        flush_s: f64,
        until: Until,
    ) -> (PyResult<Vec<RangeOut>>, Stopped, Vec<Refused>, usize) {
        let now = Instant::now();
        let mut ranges: Vec<Cursor> = Vec::with_capacity(ranges_in.len());
        for RangeIn {
            topic,
            partition,
            target,
            next,
            stop,
        } in ranges_in
        {
            ranges.push(Cursor {
                rule: contract.refusals.get(&topic).copied(),
                topic,
                partition,
                target,
                next,
                stop,
                seen: false,
                done: next >= stop,
                first_offset: stop,
                records: 0,
                bytes: 0,
                dropped: 0,
                last_offset: -1,
                echoes: Vec::new(),
                read_at: now,
            });
        }
        {
            let ctx = self.producer.context();
            let bounds = contract.latency_bounds_ms.len();
            *ctx.landed.lock().unwrap() = Landings {
                ranges: ranges
                    .iter()
                    .map(|_| Landed {
                        last_offset: -1,
                        last_target_offset: -1,
                        runs: Vec::new(),
                        latency_counts: vec![0; bounds + 1],
                        latency_sum_ms: 0.0,
                        in_flight: VecDeque::new(),
                    })
                    .collect(),
                latency_bounds_ms: contract.latency_bounds_ms.clone(),
                max_runs: contract.max_runs,
            };
            ctx.refused.lock().unwrap().clear();
            *ctx.auth_failed.lock().unwrap() = None;
        }
        let mut stopped = match self.assign(&ranges) {
            Ok(()) => self.copy_until_stopped(contract, &mut ranges, until),
            Err(e) => Stopped {
                kind: "read_error",
                range: -1,
                offset: -1,
                detail: e,
            },
        };
        let mut kept = self.kept.lock().unwrap();
        kept.clear();
        if stopped.kind.is_empty() && ranges.iter().any(|r| !r.done) {
            *kept = open_positions(&ranges); // out of time: the next copy may go on from here
        } else {
            let _ = self.consumer.unassign();
        }
        drop(kept);
        let ctx = self.producer.context();
        let failed = ctx
            .refused
            .lock()
            .unwrap()
            .iter()
            .any(|r| !contract.partition_errors.contains(&r.code));
        if failed {
            // What is only queued must not land ahead of the failed record's retry; what is in flight may.
            self.producer.purge(PurgeConfig::default().queue());
        }
        let undelivered = if self.flush(Duration::from_secs_f64(flush_s)) {
            0
        } else {
            self.producer.in_flight_count().max(0) as usize
        };
        if let Some(reason) = ctx.auth_failed.lock().unwrap().take() {
            stopped = Stopped {
                kind: "auth_target",
                range: -1,
                offset: -1,
                detail: reason,
            };
        }
        let landed = std::mem::take(&mut ctx.landed.lock().unwrap().ranges);
        let refused = std::mem::take(&mut *ctx.refused.lock().unwrap());
        let out = ranges
            .into_iter()
            .zip(landed)
            .map(|(r, l)| RangeOut {
                next: r.next,
                seen: r.seen,
                done: r.done,
                first_offset: r.first_offset,
                records: r.records,
                bytes: r.bytes,
                dropped: r.dropped,
                last_offset: r.last_offset.max(l.last_offset),
                last_target_offset: l.last_target_offset,
                runs: l.runs,
                echoes: r.echoes,
                latency_counts: l.latency_counts,
                latency_sum_ms: l.latency_sum_ms,
            })
            .collect();
        (Ok(out), stopped, refused, undelivered)
    }

    /// Serve every delivery report waiting. rdkafka's `poll(0)` serves one event, and a report event covers one
    /// partition's batch: polled once per fetch, reports of many small batches piled up unserved (seen: thousands
    /// of records at the end of a real-time copy, and a flush of a second).
    fn serve_reports(&self) {
        while unsafe { rdsys::rd_kafka_queue_length(self.reports) } > 0 {
            self.producer.poll(Duration::ZERO);
        }
    }

    /// Wait until a delivery report waits to be served, or for at most `timeout`: woken by librdkafka, so a wait
    /// costs no CPU. Never rdkafka's `BaseProducer::poll` with a timeout: it waits that out even once reports came,
    /// spinning on the clock for its last millisecond, so polled 1 ms at a time a real-time task's flush after each
    /// report and a wait for room in a full queue kept a core busy (bench/results/20261128-core-wait.txt). A byte
    /// left from a report served meanwhile ends one wait early, no more.
    fn wait_for_reports(&self, timeout: Duration) {
        if timeout.is_zero() || unsafe { rdsys::rd_kafka_queue_length(self.reports) } > 0 {
            return;
        }
        let mut signal = &self.report_signal;
        if signal.set_read_timeout(Some(timeout)).is_ok() {
            let _ = signal.read(&mut [0u8; 64]); // a wake-up, or the timeout
        }
    }

    /// Whether the target refused the producer's login: nothing more it sends can land.
    fn login_refused(&self) -> bool {
        self.producer
            .context()
            .auth_failed
            .lock()
            .unwrap()
            .is_some()
    }

    /// Wait up to `timeout` for every record sent to land or fail, serving delivery reports as they come; whether
    /// they all did.
    fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let rk = self.producer.client().native_ptr();
        loop {
            if unsafe { rdsys::rd_kafka_flush(rk, 0) } == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                return true;
            }
            let now = Instant::now();
            // A refused login lands nothing more: the copy stops with it (`auth_target`) rather than wait it out.
            if now >= deadline || self.login_refused() {
                return false;
            }
            self.wait_for_reports((deadline - now).min(WAIT));
            self.serve_reports();
        }
    }

    fn assign(&self, ranges: &[Cursor]) -> Result<(), String> {
        let kept = std::mem::take(&mut *self.kept.lock().unwrap());
        if !kept.is_empty() && kept == open_positions(ranges) {
            return Ok(()); // the consumer reads on from where the last copy left each range
        }
        let mut assignment = TopicPartitionList::new();
        for r in ranges.iter().filter(|r| !r.done) {
            assignment
                .add_partition_offset(&r.topic, r.partition, Offset::Offset(r.next))
                .map_err(|e| e.to_string())?;
        }
        self.consumer
            .assign(&assignment)
            .map_err(|e| format!("assign: {e}"))
    }

    /// Read and send until every range is done, an event stops the copy, or `until` says.
    fn copy_until_stopped(
        &self,
        contract: &Contract,
        ranges: &mut [Cursor],
        bound: Until,
    ) -> Stopped {
        let until = bound.at;
        let mut open = ranges.iter().filter(|r| !r.done).count();
        let mut unpolled = 0u32;
        let mut polled_at = Instant::now();
        let mut idle_check = Instant::now();
        while open > 0
            && until.is_none_or(|u| Instant::now() < u)
            && bound
                .bytes
                .is_none_or(|b| ranges.iter().map(|r| r.bytes).sum::<i64>() < b)
        {
            if !self.producer.context().refused.lock().unwrap().is_empty() {
                return Stopped {
                    kind: "refused",
                    range: -1,
                    offset: -1,
                    detail: String::new(),
                };
            }
            if self.login_refused() {
                return Stopped {
                    kind: "auth_target",
                    ..Stopped::default()
                };
            }
            let wait = until.map_or(WAIT, |u| {
                WAIT.min(u.saturating_duration_since(Instant::now()))
            });
            let event = unsafe { rdsys::rd_kafka_queue_poll(self.queue, wait.as_millis() as i32) };
            if event.is_null() {
                self.serve_reports();
                if let Some(idle) = self
                    .idle
                    .filter(|_| idle_check.elapsed() >= Duration::from_secs(1))
                {
                    idle_check = Instant::now();
                    if let Some(i) = ranges
                        .iter()
                        .position(|r| !r.done && r.read_at.elapsed() >= idle)
                    {
                        return Stopped {
                            kind: "idle",
                            range: i as i64,
                            offset: ranges[i].next,
                            ..Stopped::default()
                        };
                    }
                }
                continue;
            }
            let stop = unsafe { self.serve(contract, event, ranges, &mut open, &mut unpolled) };
            unsafe { rdsys::rd_kafka_event_destroy(event) };
            if let Some(stop) = stop {
                return stop;
            }
            if unpolled > 0 && polled_at.elapsed() >= POLL_AFTER {
                self.serve_reports();
                unpolled = 0;
                polled_at = Instant::now();
            }
        }
        Stopped::default()
    }

    /// Serve one event of the consumer queue; Some when it stops the copy.
    unsafe fn serve(
        &self,
        contract: &Contract,
        event: *mut rdsys::rd_kafka_event_t,
        ranges: &mut [Cursor],
        open: &mut usize,
        unpolled: &mut u32,
    ) -> Option<Stopped> {
        match rdsys::rd_kafka_event_type(event) {
            rdsys::RD_KAFKA_EVENT_FETCH => loop {
                let msg = rdsys::rd_kafka_event_message_next(event);
                if msg.is_null() {
                    return None;
                }
                let e = read_event(msg);
                if let Some(stop) = self.take(contract, e, ranges, open, unpolled) {
                    return Some(stop);
                }
            },
            rdsys::RD_KAFKA_EVENT_ERROR => {
                let code = rdsys::rd_kafka_event_error(event);
                let reason = c_str(rdsys::rd_kafka_event_error_string(event));
                let tp = rdsys::rd_kafka_event_topic_partition(event);
                if tp.is_null() {
                    // A client error: a refused login stops the copy; librdkafka retries the rest (a broker down).
                    if is_auth_failure(RDKafkaErrorCode::from(code), &reason) {
                        return Some(Stopped {
                            kind: "auth_source",
                            detail: reason,
                            ..Stopped::default()
                        });
                    }
                    return None;
                }
                // A partition's event: the end of its log, a position outside it, or a read error.
                let e = Event {
                    err: code,
                    topic: c_str((*tp).topic),
                    partition: (*tp).partition,
                    offset: (*tp).offset,
                    key: None,
                    value: None,
                    timestamp: None,
                    headers: std::ptr::null_mut(),
                    reason,
                };
                rdsys::rd_kafka_topic_partition_destroy(tp);
                self.take(contract, e, ranges, open, unpolled)
            }
            rdsys::RD_KAFKA_EVENT_OAUTHBEARER_TOKEN_REFRESH => {
                let config = rdsys::rd_kafka_event_config_string(event);
                let config = (!config.is_null()).then(|| c_str(config));
                let consumer = self.consumer.client();
                consumer
                    .context()
                    .tokens
                    .refresh(consumer.native_ptr(), config.as_deref());
                None
            }
            _ => None,
        }
    }

    /// Take one consumed event (spark_app.outbox.copy_some's loop body); Some when it stops the copy.
    unsafe fn take(
        &self,
        contract: &Contract,
        e: Event,
        ranges: &mut [Cursor],
        open: &mut usize,
        unpolled: &mut u32,
    ) -> Option<Stopped> {
        let Some(i) = ranges
            .iter()
            .position(|r| r.partition == e.partition && r.topic == e.topic)
        else {
            return None; // a partition no range reads
        };
        let r = &mut ranges[i];
        if r.done {
            return None; // fetched past its stop
        }
        let here = |kind: &'static str, detail: String| {
            Some(Stopped {
                kind,
                range: i as i64,
                offset: e.offset,
                detail,
            })
        };
        if e.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET {
            return here("outside", e.reason);
        }
        if e.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__PARTITION_EOF {
            first_event(r, e.offset);
            r.next = r.next.max(e.offset);
            r.read_at = Instant::now();
            if r.next >= r.stop {
                r.done = true;
                *open -= 1;
            }
            return None;
        }
        if e.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            let name = c_str(rdsys::rd_kafka_err2name(e.err));
            return here("read_error", format!("{name}: {}", e.reason));
        }
        if e.offset >= r.stop {
            r.done = true;
            *open -= 1;
            return None;
        }
        if r.seen && e.offset < r.next {
            return here("went_back", String::new());
        }
        // The identity policy: drop an echo of the target's own record, stamp where a record came from.
        let mut stamp: Option<Vec<u8>> = None;
        if contract.drop_echoes || contract.stamp_provenance {
            let came_from = provenance_of(e.headers, &contract.provenance_header);
            if contract.drop_echoes {
                let stamped = came_from
                    .as_ref()
                    .and_then(|v| origin(v, contract.max_provenance_offset));
                if let Some((alias, offset)) = stamped {
                    if alias == contract.target_alias.as_bytes() {
                        taken(r, e.offset, open);
                        r.dropped += 1;
                        r.last_offset = r.last_offset.max(e.offset);
                        extend_runs(&mut r.echoes, e.offset, offset, contract.max_runs);
                        return None;
                    }
                }
            }
            if contract.stamp_provenance && came_from.is_none() {
                let mut value = contract.source_alias.clone().into_bytes();
                value.extend_from_slice(format!(":{}", e.offset).as_bytes());
                stamp = Some(value);
            }
        }
        let ts = e.timestamp.unwrap_or(-1);
        if r.rule
            .is_some_and(|rule| rule.refuses(e.key, ts, contract.clock_slack_ms))
        {
            return here("refused", String::new()); // the Python loop holds it with the rule's own words
        }
        if contract
            .max_record_bytes
            .is_some_and(|cap| record_bytes(&e, stamp.as_deref()) > cap)
        {
            return here("refused", String::new()); // over the target's cap: dead-lettered or held there
        }
        let headers = owned_headers(e.headers, &contract.provenance_header, stamp.as_deref());
        {
            let mut landed = self.producer.context().landed.lock().unwrap();
            landed.ranges[i].in_flight.push_back(e.offset);
        }
        let mut record =
            BaseRecord::<[u8], [u8], usize>::with_opaque_to(&r.target, i).partition(e.partition);
        record.key = e.key;
        record.payload = e.value;
        record.headers = headers;
        record.timestamp = e.timestamp;
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    self.wait_for_reports(WAIT); // room comes with the reports of what landed
                    self.serve_reports();
                }
                Err((err, _)) => {
                    // Refused before it was sent (too large, its topic or partition unknown or denied): the Python
                    // loop reads it again and decides.
                    self.producer.context().landed.lock().unwrap().ranges[i]
                        .in_flight
                        .pop_back();
                    return here("refused", err.to_string());
                }
            }
        }
        taken(r, e.offset, open);
        r.records += 1;
        r.bytes += (e.key.map_or(0, <[u8]>::len) + e.value.map_or(0, <[u8]>::len)) as i64;
        *unpolled += 1;
        if *unpolled >= POLL_EVERY {
            self.serve_reports();
            *unpolled = 0;
        }
        None
    }
}

/// The ranges not done, each with where it reads next.
fn open_positions(ranges: &[Cursor]) -> Vec<(String, i32, i64)> {
    ranges
        .iter()
        .filter(|r| !r.done)
        .map(|r| (r.topic.clone(), r.partition, r.next))
        .collect()
}

/// A record at `offset` was passed on (sent or dropped as an echo): the cursor moves past it, and is done at its stop.
fn taken(r: &mut Cursor, offset: i64, open: &mut usize) {
    first_event(r, offset);
    r.next = offset + 1;
    r.read_at = Instant::now();
    if r.next >= r.stop {
        r.done = true;
        *open -= 1;
    }
}

/// The first event read fixes where the landing starts (spark_app.outbox._first_event).
fn first_event(r: &mut Cursor, offset: i64) {
    if !r.seen {
        r.seen = true;
        r.first_offset = offset.min(r.stop);
    }
}

unsafe fn read_event(msg: *const rdsys::rd_kafka_message_t) -> Event {
    let m = &*msg;
    let topic = if m.rkt.is_null() {
        String::new()
    } else {
        c_str(rdsys::rd_kafka_topic_name(m.rkt))
    };
    let mut headers: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
    let mut timestamp = None;
    let mut reason = String::new();
    if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        if rdsys::rd_kafka_message_headers(msg, &mut headers)
            != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            headers = std::ptr::null_mut();
        }
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        let ts = rdsys::rd_kafka_message_timestamp(msg, &mut kind);
        if kind != rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE {
            timestamp = Some(ts);
        }
    } else if !m.payload.is_null() {
        reason = String::from_utf8_lossy(std::slice::from_raw_parts(m.payload as *const u8, m.len))
            .into_owned();
    }
    Event {
        err: m.err,
        topic,
        partition: m.partition,
        offset: m.offset,
        key: if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            bytes(m.key, m.key_len)
        } else {
            None
        },
        value: if m.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            bytes(m.payload, m.len)
        } else {
            None
        },
        timestamp,
        headers,
        reason,
    }
}

/// Each header of a consumed record, in order, as (name, value or None).
unsafe fn each_header(
    headers: *mut rdsys::rd_kafka_headers_t,
) -> Vec<(String, Option<&'static [u8]>)> {
    let mut out = Vec::new();
    if headers.is_null() {
        return out;
    }
    let mut idx = 0;
    loop {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size: usize = 0;
        let err = rdsys::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size);
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            return out;
        }
        out.push((c_str(name), bytes(value as *mut c_void, size)));
        idx += 1;
    }
}

/// The first provenance header's value, when it has one (a null value counts as none, as in the Python loop).
unsafe fn provenance_of(headers: *mut rdsys::rd_kafka_headers_t, name: &str) -> Option<Vec<u8>> {
    each_header(headers)
        .into_iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.map(<[u8]>::to_vec))
}

/// spark_app.outbox.stamp_origin: a provenance value's alias and source offset; None for a value no core of the mirror
/// made, whose offset is not a non-negative 64-bit offset up to `max_offset` among them (the contract's rule).
fn origin(value: &[u8], max_offset: u64) -> Option<(&[u8], i64)> {
    let colon = value.iter().position(|b| *b == b':')?;
    let (alias, offset) = (&value[..colon], &value[colon + 1..]);
    if offset.is_empty() || !offset.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let offset = std::str::from_utf8(offset).ok()?.parse::<u64>().ok()?;
    if offset > max_offset {
        return None;
    }
    i64::try_from(offset).ok().map(|o| (alias, o))
}

/// A record's size as the contract's cap counts it: key, value, and each header's name and value, the stamp among them.
unsafe fn record_bytes(e: &Event, stamp: Option<&[u8]>) -> i64 {
    let headers: usize = each_header(e.headers)
        .iter()
        .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len))
        .sum();
    let stamped = stamp.map_or(0, |s| s.len());
    (e.key.map_or(0, <[u8]>::len) + e.value.map_or(0, <[u8]>::len) + headers + stamped) as i64
}

/// The record's headers to send: the source's, in order, then the stamp when there is one.
unsafe fn owned_headers(
    headers: *mut rdsys::rd_kafka_headers_t,
    provenance_header: &str,
    stamp: Option<&[u8]>,
) -> Option<OwnedHeaders> {
    let source = each_header(headers);
    if source.is_empty() && stamp.is_none() {
        return None;
    }
    let mut out = OwnedHeaders::new_with_capacity(source.len() + 1);
    for (key, value) in &source {
        out = out.insert(Header { key, value: *value });
    }
    if let Some(stamp) = stamp {
        out = out.insert(Header {
            key: provenance_header,
            value: Some(stamp),
        });
    }
    Some(out)
}

/// The contract as this core reads it, written back as JSON: every field it knows, by name. Refuses one with a field
/// it does not know or without one it needs, naming the field.
#[pyfunction]
fn read_contract(contract: &str) -> PyResult<String> {
    let contract = Contract::read(contract)?;
    serde_json::to_string(&contract)
        .map_err(|e| PyValueError::new_err(format!("copy contract: {e}")))
}

/// The landing fields a copy hands back, by name.
#[pyfunction]
fn landing_fields() -> Vec<&'static str> {
    LANDING_FIELDS.to_vec()
}

#[pymodule]
fn mirrorkit_copy_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Copier>()?;
    m.add_function(wrap_pyfunction!(read_contract, m)?)?;
    m.add_function(wrap_pyfunction!(landing_fields, m)?)
}
