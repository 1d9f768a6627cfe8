//! Write an idemproxy worker in Rust.
//!
//! idemproxy binds an endpoint with a raw REQ socket and sends one protobuf
//! `idemproxy.v1.Delivery` per unique stream entry; a worker connects a REP
//! socket, handles each delivery and answers with an `Ack`. This crate does the
//! socket (NNG, through the `nng` crate) and the protobuf (prost, generated at
//! build time from the crate's copy of `proto/idemproxy/v1/idemproxy.proto`); you
//! write the handler:
//!
//! ```no_run
//! use idemproxy_worker::{serve, Delivery, Error};
//!
//! fn main() -> Result<(), idemproxy_worker::SocketError> {
//!     serve("ipc:///tmp/idemproxy.sock", 4, |d: &Delivery| -> Result<(), Error> {
//!         if d.payload.is_empty() {
//!             return Err(Error::Drop("empty payload".into())); // DROP: dead-lettered
//!         }
//!         let text = std::str::from_utf8(&d.payload)?;         // any error: RETRY
//!         println!("{} attempt={} {text}", d.key, d.attempt);
//!         Ok(())                                                // ACK
//!     })
//! }
//! ```
//!
//! - `Ok(())` answers ACK. `Err(Error::Retry(reason))`, and every error that `?`
//!   turns into an [`Error`], answers RETRY with the error's text as the reason: the
//!   delivery comes again later with `attempt + 1`. A panicking handler also
//!   answers RETRY. `Err(Error::Drop(reason))` answers DROP: idemproxy dead-letters
//!   the entry with the reason and never delivers it again.
//! - `Err(Error::RetryAfter(duration))` answers RETRY with `retry_after_ms`:
//!   idemproxy redelivers no earlier (at most an hour) instead of its backoff.
//!   `traceparent`/`tracestate` carry idemproxy's delivery span (protocol 1.1).
//! - Every Ack echoes the delivery's stream and entry id. A message that does not
//!   decode (a string that is not UTF-8, a known field with the wrong wire type) is
//!   answered RETRY without calling the handler.
//! - Concurrency: one REP socket with one NNG context per handler thread, so up to
//!   `concurrency` deliveries are handled at once. (A plain REP socket holds one
//!   request at a time; contexts are NNG's independent REP state machines.)
//! - The socket dials in the background and re-dials whenever the connection is
//!   gone, so a worker may start before idemproxy and survives its restarts; a peer
//!   that sends no SP header within 10 s (NNG's handshake timeout) is hung up on.
//!   Without a connection for 5 s (`IDEMPROXY_DIAL_LOG_MS`, or
//!   [`Worker::set_dial_log`]), [`Worker::run`] logs a warning that it is still
//!   dialing and where, then one every six times as long (30 s) until connected,
//!   so a wrong endpoint shows.
//! - `deadline_unix_ms` is the delivery's ack deadline: an answer after it is
//!   ignored and the entry is delivered again. idemproxy paces deliveries per
//!   worker, so the ack timer measures the handler's own work, not a queue in front
//!   of it. A delivery that arrives already past its deadline is answered RETRY
//!   without calling the handler. `fencing_token` lets your database refuse the
//!   writes of a holder whose lease ran out; `lock` names the lock it is for.
//! - With the `postgres` feature, `postgres::handle` runs a handler's writes
//!   in one PostgreSQL transaction with an inbox row for the key and the fence
//!   check of the token (docs/database.md): each effect lands once.
//! - Deliveries of up to [`DEFAULT_MAX_ENTRY_BYTES`] (idemproxy's default
//!   `app.max_entry_bytes`) are received; a bigger message drops the connection.
//!   If you raise `app.max_entry_bytes`, call [`Worker::set_max_entry_bytes`] too.
//! - To stop, set [`Worker::stop_flag`]: handlers in progress finish and answer,
//!   then [`Worker::run`] returns. The library never prints and never exits.
//! - Logging goes through the [`log`](https://docs.rs/log) facade (target
//!   `idemproxy_worker`), to whatever logger the application installs: a handler's
//!   error (warn, "handler failed, answered RETRY"), a DROP (warn), a panic
//!   (error), a delivery past its deadline (warn), one that does not decode and an
//!   answer that could not be sent (error). A record about a delivery names its
//!   stream, entry id, key and attempt.

use std::collections::HashSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nng::options::{MaxTtl, Options as _, RecvMaxSize};
use nng::{Aio, AioResult, Context, Pipe, PipeEvent, Protocol, Socket};
use prost::Message as _;

pub use nng;

#[cfg(feature = "postgres")]
pub mod postgres;

/// The protobuf messages of `proto/idemproxy/v1/idemproxy.proto`, as prost generates them.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/idemproxy.v1.rs"));
}
use proto::ack::Status;

/// What setting up or running the socket can fail with.
pub type SocketError = nng::Error;

/// idemproxy's default `app.endpoint`.
pub const DEFAULT_ENDPOINT: &str = "ipc:///tmp/idemproxy.sock";

/// idemproxy's default `app.max_entry_bytes`: the largest Delivery it sends.
pub const DEFAULT_MAX_ENTRY_BYTES: usize = 1 << 20;
/// Room for the SP header in front of a Delivery (8 backtrace words; idemproxy
/// sends one): NNG's receive limit counts it too.
const SP_HEADER_BYTES: usize = 32;
/// The reason sent with the RETRY of a delivery that arrived after its deadline.
const STALE: &str = "deadline passed before the handler ran";

/// How often the worker's watcher thread looks at the stop flag (handler
/// threads sleep in their receive until a delivery comes or it wakes them).
const POLL: Duration = Duration::from_millis(200);
/// A reply normally leaves at once; this bounds a peer that stopped reading.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// NNG has no linger: give the last replies time to leave before the socket closes.
const LINGER: Duration = Duration::from_millis(100);
/// idemproxy caps a retry-after at an hour; a longer one is sent as an hour.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// One delivery: a unique stream entry that idemproxy asks the worker to handle.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The stream key.
    pub stream: String,
    /// The Redis entry id, "1700000000000-0".
    pub entry_id: String,
    /// The rendered dedup key, without prefix.
    pub key: String,
    /// The entry's field/value pairs in stream order, except the payload field.
    pub fields: Vec<(String, Vec<u8>)>,
    /// The value of the configured payload field, else empty.
    pub payload: Vec<u8>,
    /// 1 on the first delivery, then one more on each redelivery.
    pub attempt: u32,
    /// Strictly increasing per lock; 0 when fencing is off.
    pub fencing_token: u64,
    /// The lock fencing_token is for: lock_key's rendered text, else the key;
    /// empty when fencing is off.
    pub lock: String,
    /// An answer after this (epoch milliseconds) is too late; 0: none.
    pub deadline_unix_ms: u64,
    /// `deadline_unix_ms` on this process's monotonic clock, fixed when the
    /// delivery arrived; `None` when there is none. A handler past it is not
    /// stopped (Rust cannot stop a thread): its late answer is ignored, logged.
    pub deadline: Option<Instant>,
    /// The W3C trace context of idemproxy's delivery span (protocol 1.1), or
    /// empty: the parent of the handler's span.
    pub traceparent: String,
    /// The W3C tracestate that goes with it, or empty.
    pub tracestate: String,
}

impl Delivery {
    /// The value of the first field called `name`, if there is one.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    /// The time left until the deadline: zero once it has passed, `None` when there is none.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }
}

impl From<proto::Delivery> for Delivery {
    fn from(d: proto::Delivery) -> Self {
        Delivery {
            stream: d.stream,
            entry_id: d.entry_id,
            key: d.key,
            fields: d.fields.into_iter().map(|f| (f.name, f.value)).collect(),
            payload: d.payload,
            attempt: d.attempt,
            fencing_token: d.fencing_token,
            lock: d.lock,
            deadline_unix_ms: d.deadline_unix_ms,
            deadline: (d.deadline_unix_ms != 0).then(|| {
                let now = now_unix_ms();
                let now_i = Instant::now();
                if d.deadline_unix_ms >= now {
                    now_i + Duration::from_millis(d.deadline_unix_ms - now)
                } else {
                    now_i.checked_sub(Duration::from_millis(now - d.deadline_unix_ms)).unwrap_or(now_i)
                }
            }),
            traceparent: d.traceparent,
            tracestate: d.tracestate,
        }
    }
}

/// Why a handler did not finish a delivery. `?` turns any `std::error::Error`
/// into `Error::Retry` with the error's text, as `anyhow` does (and, like
/// `anyhow::Error`, this type is not itself a `std::error::Error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Not now: answer RETRY; idemproxy delivers the entry again later with
    /// `attempt + 1`, and dead-letters it after `max_deliveries`.
    Retry(String),
    /// Never: answer DROP; idemproxy dead-letters the entry with this reason.
    Drop(String),
    /// Not before this wait: answer RETRY with `retry_after_ms` (protocol 1.1);
    /// idemproxy redelivers no earlier (at most an hour) instead of its backoff,
    /// and the attempt counts toward `max_deliveries`.
    RetryAfter(Duration),
}

impl Error {
    /// `Error::Retry` with `reason`'s text.
    pub fn retry(reason: impl fmt::Display) -> Self {
        Error::Retry(reason.to_string())
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Self {
        Error::Retry(e.to_string())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Retry(reason) => write!(f, "retry: {reason}"),
            Error::Drop(reason) => write!(f, "drop: {reason}"),
            Error::RetryAfter(after) => write!(f, "retry after {} ms", after.as_millis()),
        }
    }
}

/// Connects to `endpoint` and runs `handler` on `concurrency` threads until a
/// socket error; the usual way to write a worker. See [`Worker`] to stop it or
/// to set socket options first.
pub fn serve<F>(endpoint: &str, concurrency: usize, handler: F) -> Result<(), SocketError>
where
    F: Fn(&Delivery) -> Result<(), Error> + Sync,
{
    Worker::connect(endpoint)?.run(concurrency, handler)
}

/// The default wait without a connection before the first "still dialing"
/// warning; the next come every six times as long.
pub const DIAL_LOG: Duration = Duration::from_secs(5);

/// Whether the socket has a connection, and when to say it still has none.
struct DialWatch {
    endpoint: String,
    state: Mutex<DialState>,
}

struct DialState {
    pipes: HashSet<Pipe>, // the connections up
    since: Instant,       // without one since
    next: Instant,        // the next warning, while without one
    first: Duration,
}

impl DialWatch {
    fn new(endpoint: &str) -> DialWatch {
        let first = std::env::var("IDEMPROXY_DIAL_LOG_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&ms| ms > 0)
            .map_or(DIAL_LOG, Duration::from_millis);
        let now = Instant::now();
        let state = DialState { pipes: HashSet::new(), since: now, next: now + first, first };
        DialWatch { endpoint: endpoint.to_owned(), state: Mutex::new(state) }
    }

    fn pipe(&self, pipe: Pipe, event: PipeEvent) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            PipeEvent::AddPost => {
                st.pipes.insert(pipe);
            }
            PipeEvent::RemovePost => {
                if st.pipes.remove(&pipe) && st.pipes.is_empty() {
                    let now = Instant::now();
                    st.since = now;
                    st.next = now + st.first;
                }
            }
            _ => {}
        }
    }

    /// Called now and then (by the watcher thread): warns when it is time.
    fn tick(&self) {
        let now = Instant::now();
        let waited = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !st.pipes.is_empty() || now < st.next {
                return;
            }
            st.next = now + 6 * st.first;
            now - st.since
        };
        log::warn!(
            "still dialing {}: no connection to idemproxy for {} s (is idemproxy running, and is this its app.endpoint?)",
            self.endpoint,
            waited.as_secs_f64().round()
        );
    }
}

/// A REP socket dialing idemproxy, and the flag that stops [`Worker::run`].
pub struct Worker {
    socket: Socket,
    stop: Arc<AtomicBool>,
    dial: Arc<DialWatch>,
}

impl Worker {
    /// Creates the REP socket and starts dialing `endpoint` in the background.
    /// Fails only for a bad endpoint or when NNG is out of resources; an absent
    /// idemproxy is not an error (the dialer keeps trying).
    pub fn connect(endpoint: &str) -> Result<Worker, SocketError> {
        let socket = Socket::new(Protocol::Rep0)?;
        socket.set_opt::<RecvMaxSize>(DEFAULT_MAX_ENTRY_BYTES + SP_HEADER_BYTES)?;
        // NNG's REP hangs up on a request whose backtrace runs out before a word with
        // the top bit (no request id) but drops one with more hops than MaxTtl. idemproxy
        // sends exactly one word, so one hop makes every request without an id in its
        // first word dropped, as the other clients ignore it (a body under 4 bytes
        // still costs the connection: NNG's own limit).
        socket.set_opt::<MaxTtl>(1)?;
        let dial = Arc::new(DialWatch::new(endpoint));
        let watch = Arc::clone(&dial);
        socket.pipe_notify(move |pipe, event| watch.pipe(pipe, event))?;
        socket.dial_async(endpoint)?;
        Ok(Worker { socket, stop: Arc::new(AtomicBool::new(false)), dial })
    }

    /// Sets how long [`Worker::run`] goes without a connection before it warns
    /// that it is still dialing (default [`DIAL_LOG`], or `IDEMPROXY_DIAL_LOG_MS`);
    /// the next warnings come every six times as long.
    pub fn set_dial_log(&self, first: Duration) {
        let mut st = self.dial.state.lock().unwrap_or_else(|e| e.into_inner());
        st.first = first.max(Duration::from_millis(1));
        st.next = st.since + st.first;
    }

    /// Accepts Deliveries of up to `bytes`: idemproxy's `app.max_entry_bytes`, to be
    /// raised together with it (0: no limit). A bigger message drops the connection.
    pub fn set_max_entry_bytes(&self, bytes: usize) -> Result<(), SocketError> {
        let limit = if bytes == 0 { 0 } else { bytes.saturating_add(SP_HEADER_BYTES) };
        self.socket.set_opt::<RecvMaxSize>(limit)
    }

    /// The NNG socket, for its other options.
    pub fn socket(&self) -> &Socket {
        &self.socket
    }

    /// Set it to `true` (from any thread or a signal handler) and `run` returns
    /// once the handlers in progress have finished and answered.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    /// Handles deliveries on `concurrency` threads (at least one), each with its
    /// own NNG context, until the stop flag is set or a socket error occurs.
    pub fn run<F>(&self, concurrency: usize, handler: F) -> Result<(), SocketError>
    where
        F: Fn(&Delivery) -> Result<(), Error> + Sync,
    {
        let handler = &handler;
        let n = concurrency.max(1);
        // Handler threads wait in their receive with no timeout, so an idle
        // worker costs no wake-ups (256 threads polling 5 times a second was
        // 3,500 a second). One watcher looks at the stop flag and, once it is
        // set, cancels the receives until every handler thread has ended: a
        // thread between its look at the flag and its next receive is caught
        // by the next round.
        let live = &AtomicUsize::new(n);
        let receiving = &Mutex::new(Vec::with_capacity(n));
        let results: Vec<_> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(move || {
                        let res = self.handle_loop(handler, receiving);
                        if res.is_err() {
                            self.stop.store(true, Ordering::SeqCst); // take the others down too
                        }
                        live.fetch_sub(1, Ordering::SeqCst);
                        res
                    })
                })
                .collect();
            s.spawn(move || {
                while live.load(Ordering::SeqCst) > 0 {
                    if self.stop.load(Ordering::SeqCst) {
                        for aio in receiving.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                            aio.cancel();
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    } else {
                        self.dial.tick();
                        std::thread::sleep(POLL);
                    }
                }
            });
            threads.into_iter().map(|t| t.join().expect("handler thread panicked")).collect()
        });
        std::thread::sleep(LINGER);
        results.into_iter().collect()
    }

    /// One handler thread: receive on its own context, answer, repeat.
    fn handle_loop<F>(&self, handler: &F, receiving: &Mutex<Vec<Aio>>) -> Result<(), SocketError>
    where
        F: Fn(&Delivery) -> Result<(), Error> + Sync,
    {
        let ctx = Context::new(&self.socket)?;
        // The aio's callback runs on an NNG thread; it hands the result to this
        // one. `aio.wait()` then lets the callback return before anything else
        // happens: the callback holds a clone of the Aio, and if it were the last
        // one, dropping it there would free the aio inside its own callback, which
        // deadlocks NNG (nng_aio_free waits for the callback to finish).
        let (tx, rx) = mpsc::channel();
        let aio = Aio::new(move |_, res| {
            let _ = tx.send(res);
        })?;
        let wait = || {
            let res = rx.recv().map_err(|_| nng::Error::Closed);
            aio.wait();
            res
        };
        // Replies go out on an aio of their own whose callback deals with the
        // outcome itself, so this thread goes on to its next receive without
        // waiting for NNG's thread: one hand-off per delivery, not two. A reply
        // that cannot leave is lost the way a dropped connection loses it:
        // idemproxy's ack timeout redelivers the entry. A closed socket ends the
        // loop at the next receive.
        let sent = Aio::new(|_, res| {
            if let AioResult::Send(Err((_, e))) = res {
                if e != nng::Error::Closed {
                    log::error!("answer not sent, the entry comes again after its ack timeout: {e}");
                }
            }
        })?;
        sent.set_timeout(Some(SEND_TIMEOUT))?;
        receiving.lock().unwrap_or_else(|e| e.into_inner()).push(aio.clone());

        let res = (|| {
            while !self.stop.load(Ordering::SeqCst) {
                ctx.recv(&aio)?;
                let request = match wait()? {
                    AioResult::Recv(Ok(m)) => m,
                    // The watcher woke it: the stop flag is set.
                    AioResult::Recv(Err(nng::Error::Canceled)) => continue,
                    AioResult::Recv(Err(nng::Error::Closed)) => break,
                    AioResult::Recv(Err(e)) => return Err(e),
                    _ => unreachable!("only a receive was started"),
                };
                let reply = answer(request.as_slice(), handler);
                sent.wait(); // the previous reply has left (normally long ago): the aio is free
                ctx.send(&sent, reply.as_slice()).map_err(|(_, e)| e)?;
            }
            Ok(())
        })();
        sent.wait(); // the last reply's callback has returned before `sent` is dropped
        res
    }
}

/// Decodes one Delivery, runs the handler on it and returns the encoded Ack.
fn answer<F>(request: &[u8], handler: &F) -> Vec<u8>
where
    F: Fn(&Delivery) -> Result<(), Error>,
{
    let ack = match proto::Delivery::decode(request) {
        Err(e) => {
            log::error!("undecodable delivery ({} bytes), answered RETRY: {e}", request.len());
            proto::Ack {
                status: Status::Retry as i32,
                reason: format!("cannot decode Delivery: {e}"),
                ..Default::default()
            }
        }
        Ok(pb) if pb.deadline_unix_ms != 0 && now_unix_ms() > pb.deadline_unix_ms => {
            log::warn!(
                "{STALE}, answered RETRY: stream={} entry_id={} key={} attempt={}",
                pb.stream,
                pb.entry_id,
                pb.key,
                pb.attempt
            );
            proto::Ack {
                status: Status::Retry as i32,
                reason: STALE.into(),
                stream: pb.stream,
                entry_id: pb.entry_id,
                ..Default::default()
            }
        }
        Ok(pb) => {
            let d = Delivery::from(pb);
            use log::Level::Warn;
            let mut retry_after_ms = 0;
            let (status, reason, logged) = match catch_unwind(AssertUnwindSafe(|| traced(&d, handler))) {
                Ok(Ok(())) => (Status::Ack, String::new(), None),
                Ok(Err(Error::RetryAfter(after))) => {
                    retry_after_ms = after.min(MAX_RETRY_AFTER).as_millis() as u32;
                    let reason = format!("retry after {retry_after_ms} ms");
                    (
                        Status::Retry,
                        reason,
                        Some((log::Level::Info, "handler asked for a later retry, answered RETRY")),
                    )
                }
                Ok(Err(Error::Retry(reason))) => {
                    (Status::Retry, reason, Some((Warn, "handler failed, answered RETRY")))
                }
                Ok(Err(Error::Drop(reason))) => {
                    (Status::Drop, reason, Some((Warn, "handler dropped the delivery, answered DROP")))
                }
                Err(panic) => {
                    let reason = format!("handler panicked: {}", panic_text(&panic));
                    (Status::Retry, reason, Some((log::Level::Error, "handler panicked, answered RETRY")))
                }
            };
            if d.deadline.is_some_and(|t| Instant::now() > t) {
                log::warn!(
                    "handler returned after the deadline, its answer comes too late: stream={} entry_id={} key={} attempt={}",
                    d.stream,
                    d.entry_id,
                    d.key,
                    d.attempt
                );
            }
            if let Some((level, what)) = logged {
                log::log!(
                    level,
                    "{what}: stream={} entry_id={} key={} attempt={} reason={reason}",
                    d.stream,
                    d.entry_id,
                    d.key,
                    d.attempt
                );
            }
            proto::Ack {
                status: status as i32,
                reason,
                stream: d.stream,
                entry_id: d.entry_id,
                retry_after_ms,
            }
        }
    };
    ack.encode_to_vec()
}

/// Runs the handler, inside a span that is a child of the delivery's traceparent
/// when the `opentelemetry` feature is on (on the global tracer provider).
#[cfg(not(feature = "opentelemetry"))]
fn traced<F>(d: &Delivery, handler: &F) -> Result<(), Error>
where
    F: Fn(&Delivery) -> Result<(), Error>,
{
    handler(d)
}

#[cfg(feature = "opentelemetry")]
fn traced<F>(d: &Delivery, handler: &F) -> Result<(), Error>
where
    F: Fn(&Delivery) -> Result<(), Error>,
{
    use opentelemetry::trace::{SpanKind, Status as SpanStatus, TraceContextExt as _, Tracer as _};
    use opentelemetry::{Context, KeyValue, global};
    let parent = match remote_parent(&d.traceparent, &d.tracestate) {
        Some(sc) => Context::new().with_remote_span_context(sc),
        None => Context::new(),
    };
    let tracer = global::tracer("idemproxy_worker");
    let span = tracer
        .span_builder(format!("{} process", d.stream))
        .with_kind(SpanKind::Consumer)
        .with_attributes([
            KeyValue::new("messaging.system", "idemproxy"),
            KeyValue::new("messaging.destination.name", d.stream.clone()),
            KeyValue::new("messaging.message.id", d.entry_id.clone()),
            KeyValue::new("idemproxy.key", d.key.clone()),
            KeyValue::new("idemproxy.attempt", i64::from(d.attempt)),
        ])
        .start_with_context(&tracer, &parent);
    let cx = parent.with_span(span);
    let res = {
        let _current = cx.clone().attach();
        handler(d) // a panic drops the span, which ends it
    };
    if let Err(e) = &res {
        cx.span().set_status(SpanStatus::error(e.to_string()));
    }
    cx.span().end();
    res
}

/// The span context of a W3C `traceparent` ("00-<trace id>-<span id>-<flags>"),
/// None when it is absent or malformed.
#[cfg(feature = "opentelemetry")]
fn remote_parent(traceparent: &str, tracestate: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace, span, flags, ..] = parts[..] else { return None };
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || (version == "00" && parts.len() != 4) {
        return None;
    }
    if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let (trace, span) = (TraceId::from_hex(trace).ok()?, SpanId::from_hex(span).ok()?);
    if trace == TraceId::INVALID || span == SpanId::INVALID {
        return None;
    }
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()? & 1);
    let state = tracestate.parse::<TraceState>().unwrap_or_default();
    Some(SpanContext::new(trace, span, flags, true, state))
}

fn now_unix_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}
