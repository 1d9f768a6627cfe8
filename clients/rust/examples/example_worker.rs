//! example_worker - an idemproxy worker built on idemproxy_worker::Worker.
//!
//! It connects to idemproxy (which may start later: NNG keeps dialing), answers
//! every delivery and prints one line per delivery on stdout, "<key> attempt=<n>".
//! Everything else goes to stderr. SIGTERM or SIGINT: the deliveries in hand are
//! finished and answered, then it exits 0.
//!
//! The environment turns it into a test double (as clients/c/example_worker.c):
//!   IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
//!   WORKER_CONCURRENCY   handle up to n deliveries at the same time (1)
//!   WORKER_DELAY_MS      work this long before answering each delivery
//!   WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
//!   WORKER_RETRY_AFTER_MS  those RETRYs ask for a redelivery after this many ms
//!   WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
//!   WORKER_SLOW_KEYS     k4: work WORKER_SLOW_MS (1000) on these before answering
//!   WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
//!   WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but no later than
//!                        d.deadline (a thread cannot be stopped: the work stops
//!                        itself there) and answer RETRY
//!   WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised (-1: no limit)
//!   WORKER_VERBOSE=1     describe each delivery on stderr
//!   WORKER_REPORT        a file: one JSON object per answered delivery is appended
//!                        (tests/integration/test_clients.py reads it; remaining_ms is
//!                        d.remaining() at the start, -1 without a deadline; stopped is
//!                        "deadline" when the work stopped there)
//! Built with the `opentelemetry` feature (`make example` does) and WORKER_REPORT set,
//! it installs an SDK tracer provider (no exporter), so each handler runs in the
//! crate's real span; the report gives that span's trace id and parent span id
//! (span_trace_id, span_parent_id), "" without the feature.
//! (WORKER_NOACK_KEYS is not offered: with contexts, a delivery left unanswered
//! would hold a handler slot forever, and the library always answers.)
use std::fs::OpenOptions;
use std::io::Write;
use std::process::exit;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idemproxy_worker::{DEFAULT_ENDPOINT, Delivery, Error, Worker};
use serde_json::json;

fn env_list(name: &str) -> Vec<String> {
    std::env::var(name).unwrap_or_default().split(',').filter(|s| !s.is_empty()).map(String::from).collect()
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

struct Config {
    retry_keys: Vec<String>,
    retry_times: u64,
    retry_after_ms: u64,
    drop_keys: Vec<String>,
    slow_keys: Vec<String>,
    slow_ms: u64,
    crash_keys: Vec<String>,
    deadline_keys: Vec<String>,
    delay_ms: u64,
    verbose: bool,
    report: Option<Mutex<std::fs::File>>,
}

impl Config {
    fn from_env() -> Config {
        let report = std::env::var("WORKER_REPORT").ok().filter(|p| !p.is_empty()).map(|path| {
            let file = OpenOptions::new().create(true).append(true).open(&path);
            Mutex::new(file.unwrap_or_else(|e| {
                eprintln!("example_worker: {path}: {e}");
                exit(1)
            }))
        });
        Config {
            retry_keys: env_list("WORKER_RETRY_KEYS"),
            retry_times: env_u64("WORKER_RETRY_TIMES", 1),
            retry_after_ms: env_u64("WORKER_RETRY_AFTER_MS", 0),
            drop_keys: env_list("WORKER_DROP_KEYS"),
            slow_keys: env_list("WORKER_SLOW_KEYS"),
            slow_ms: env_u64("WORKER_SLOW_MS", 1000),
            crash_keys: env_list("WORKER_CRASH_KEYS"),
            deadline_keys: env_list("WORKER_DEADLINE_KEYS"),
            delay_ms: env_u64("WORKER_DELAY_MS", 0),
            verbose: env_u64("WORKER_VERBOSE", 0) != 0,
            report,
        }
    }

    /// The application's work; its result is the answer. `stopped` is set
    /// when the work ended at the delivery's deadline.
    fn work(&self, d: &Delivery, stopped: &mut &'static str) -> Result<(), Error> {
        sleep(Duration::from_millis(self.delay_ms));
        if self.slow_keys.contains(&d.key) {
            sleep(Duration::from_millis(self.slow_ms));
        }
        if self.deadline_keys.contains(&d.key) {
            let done = Instant::now() + Duration::from_millis(self.slow_ms);
            match d.deadline {
                Some(deadline) if deadline <= done => {
                    sleep(deadline.saturating_duration_since(Instant::now()));
                    *stopped = "deadline";
                    return Err(Error::retry("stopped at the deadline"));
                }
                _ => sleep(done.saturating_duration_since(Instant::now())),
            }
        }
        if self.drop_keys.contains(&d.key) {
            return Err(Error::Drop("dropped by worker".into()));
        }
        if self.retry_keys.contains(&d.key) && u64::from(d.attempt) <= self.retry_times {
            if self.retry_after_ms > 0 {
                return Err(Error::RetryAfter(Duration::from_millis(self.retry_after_ms)));
            }
            return Err(Error::retry("retry requested by worker"));
        }
        Ok(())
    }

    /// The handler given to the library: work, then report and print.
    fn handle(&self, d: &Delivery) -> Result<(), Error> {
        if self.verbose {
            eprintln!(
                "delivery {} {} key={} attempt={} fencing={} deadline={}",
                d.stream, d.entry_id, d.key, d.attempt, d.fencing_token, d.deadline_unix_ms
            );
            for (name, value) in &d.fields {
                eprintln!("  {name} = {}", text(value));
            }
            eprintln!("  payload = {}", text(&d.payload));
        }
        if self.crash_keys.contains(&d.key) {
            eprintln!("example_worker: crashing on {} as asked", d.key);
            exit(3);
        }
        let start = now_ms();
        let remaining = d.remaining().map_or(-1, |r| r.as_millis() as i64);
        let mut stopped = "";
        let result = self.work(d, &mut stopped);
        let status = match &result {
            Ok(()) => "ack",
            Err(Error::Retry(_) | Error::RetryAfter(_)) => "retry",
            Err(Error::Drop(_)) => "drop",
        };
        self.report(d, status, start, now_ms(), remaining, stopped);
        println!("{} attempt={}", d.key, d.attempt); // stdout is line-buffered: flushed here
        result
    }

    fn report(&self, d: &Delivery, status: &str, start: u64, end: u64, remaining: i64, stopped: &str) {
        let Some(file) = &self.report else { return };
        let fields: serde_json::Map<_, _> =
            d.fields.iter().map(|(n, v)| (n.clone(), text(v).into())).collect();
        let (span_trace_id, span_parent_id) = span_ids();
        let mut line = json!({
            "key": d.key, "stream": d.stream, "entry_id": d.entry_id, "attempt": d.attempt,
            "fencing_token": d.fencing_token, "deadline_unix_ms": d.deadline_unix_ms,
            "payload": text(&d.payload), "fields": fields, "status": status,
            "start_ms": start, "end_ms": end, "traceparent": d.traceparent,
            "tracestate": d.tracestate, "span_trace_id": span_trace_id,
            "span_parent_id": span_parent_id, "remaining_ms": remaining, "stopped": stopped,
        })
        .to_string();
        line.push('\n');
        // One write per line, under a lock: concurrent handlers never interleave.
        let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("example_worker: report: {e}");
        }
    }
}

/// The handler's span (the crate's, with the `opentelemetry` feature): its trace id
/// and its parent's span id, "" when there is none.
#[cfg(not(feature = "opentelemetry"))]
fn span_ids() -> (String, String) {
    (String::new(), String::new())
}

#[cfg(not(feature = "opentelemetry"))]
fn use_otel_sdk() {}

#[cfg(feature = "opentelemetry")]
use otel::{span_ids, use_otel_sdk};

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex};
    use std::time::Duration;

    use opentelemetry::Context;
    use opentelemetry::trace::{Span as _, SpanId, TraceContextExt as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, Span, SpanData, SpanProcessor};

    /// The parent the SDK started each live span with, by the span's own id (the
    /// API hands a handler no parent id; the SDK's processor sees it).
    static PARENTS: LazyLock<Mutex<HashMap<SpanId, SpanId>>> = LazyLock::new(Default::default);

    #[derive(Debug)]
    struct Parents;

    impl SpanProcessor for Parents {
        fn on_start(&self, span: &mut Span, cx: &Context) {
            let parent = cx.span().span_context().span_id();
            if parent != SpanId::INVALID {
                PARENTS.lock().unwrap().insert(span.span_context().span_id(), parent);
            }
        }
        fn on_end(&self, span: SpanData) {
            PARENTS.lock().unwrap().remove(&span.span_context.span_id());
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    pub fn use_otel_sdk() {
        let provider = SdkTracerProvider::builder().with_span_processor(Parents).build();
        opentelemetry::global::set_tracer_provider(provider);
    }

    pub fn span_ids() -> (String, String) {
        let cx = Context::current();
        let sc = cx.span().span_context().clone();
        if !sc.is_valid() {
            return (String::new(), String::new());
        }
        let parent = PARENTS.lock().unwrap().get(&sc.span_id()).map(|p| p.to_string());
        (sc.trace_id().to_string(), parent.unwrap_or_default())
    }
}

/// The library logs through the `log` facade; this worker's logger writes each
/// record on stderr (an application would install env_logger or the like).
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("example_worker: {} {}: {}", r.level(), r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    log::set_logger(&StderrLog).expect("the only logger");
    log::set_max_level(log::LevelFilter::Info);
    let mut endpoint = std::env::var("IDEMPROXY_ENDPOINT").unwrap_or_else(|_| DEFAULT_ENDPOINT.into());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--endpoint", Some(ep)) => endpoint = ep,
            _ => {
                eprintln!("usage: example_worker [--endpoint URL]   (default {DEFAULT_ENDPOINT})");
                exit(if arg == "--help" { 0 } else { 2 });
            }
        }
    }
    let config = Config::from_env();
    if config.report.is_some() {
        use_otel_sdk();
    }
    let concurrency = env_u64("WORKER_CONCURRENCY", 1) as usize;

    let worker = Worker::connect(&endpoint).unwrap_or_else(|e| {
        eprintln!("example_worker: {endpoint}: {e}");
        exit(1)
    });
    let max_bytes: i64 = std::env::var("WORKER_MAX_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if max_bytes != 0 {
        if let Err(e) = worker.set_max_entry_bytes(max_bytes.max(0) as usize) {
            eprintln!("example_worker: WORKER_MAX_BYTES: {e}");
        }
    }
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, worker.stop_flag()).expect("installing a signal handler");
    }
    eprintln!("example_worker: waiting for deliveries on {endpoint} ({concurrency} at a time)");

    if let Err(e) = worker.run(concurrency, |d: &Delivery| config.handle(d)) {
        eprintln!("example_worker: {e}");
        exit(1);
    }
    if worker.stop_flag().load(Ordering::SeqCst) {
        eprintln!("example_worker: stopped");
    }
}
