//! The library against a real peer: a REQ socket listening on an ipc endpoint,
//! as idemproxy does, sends Deliveries and reads the Acks.
use std::sync::atomic::Ordering;
use std::sync::{Mutex, Once, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use idemproxy_worker::nng::options::Options as _;
use idemproxy_worker::nng::{Aio, AioResult, Context, Message, PipeEvent, Protocol, RawSocket, Socket};
use idemproxy_worker::proto::{self, ack::Status};
use idemproxy_worker::{Delivery, Error, Worker};
use prost::Message as _;

/// A logger that keeps every record the library logs (the tests of this file share it).
struct Recorder(Mutex<Vec<(log::Level, String)>>);

static RECORDS: Recorder = Recorder(Mutex::new(Vec::new()));

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        if r.target().starts_with("idemproxy_worker") {
            self.0.lock().unwrap().push((r.level(), r.args().to_string()));
        }
    }
    fn flush(&self) {}
}

/// The records about the delivery with this key, once the logger is installed.
fn logged(key: &str) -> Vec<(log::Level, String)> {
    let needle = format!(" key={key} ");
    RECORDS.0.lock().unwrap().iter().filter(|(_, m)| m.contains(&needle)).cloned().collect()
}

fn record_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&RECORDS).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn endpoint(name: &str) -> String {
    let path = std::env::temp_dir().join(format!("idemproxy-worker-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    format!("ipc://{}", path.display())
}

/// Sends one request on its own REQ context and waits for the reply.
fn request(sock: &Socket, body: &[u8]) -> proto::Ack {
    let ctx = Context::new(sock).unwrap();
    let (tx, rx) = mpsc::channel();
    let aio = Aio::new(move |_, res| tx.send(res).unwrap()).unwrap();
    aio.set_timeout(Some(Duration::from_secs(10))).unwrap();
    ctx.send(&aio, body).unwrap();
    assert!(matches!(rx.recv().unwrap(), AioResult::Send(Ok(()))));
    aio.wait(); // the callback has returned: never free an aio inside its own callback
    ctx.recv(&aio).unwrap();
    let res = rx.recv().unwrap();
    aio.wait();
    match res {
        AioResult::Recv(Ok(m)) => proto::Ack::decode(m.as_slice()).unwrap(),
        other => panic!("no reply: {other:?}"),
    }
}

fn delivery(key: &str) -> Vec<u8> {
    proto::Delivery {
        stream: "room".into(),
        entry_id: format!("1700000000000-{}", key.len()),
        key: key.into(),
        fields: vec![
            proto::Field { name: "source".into(), value: b"test".to_vec() },
            proto::Field { name: "trace".into(), value: vec![0, 255] },
        ],
        payload: br#"{"eventId":"x"}"#.to_vec(),
        attempt: 2,
        fencing_token: 1 << 40,
        lock: "room-7".into(),
        deadline_unix_ms: 4_102_444_800_000,
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn handler_results_map_to_ack_retry_drop() {
    record_logs();
    let ep = endpoint("map");
    // The worker starts first: its dialer keeps trying until the REQ side listens.
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    let seen = Mutex::new(Vec::new());
    thread::scope(|s| {
        let run = s.spawn(|| {
            worker.run(2, |d: &Delivery| -> Result<(), Error> {
                seen.lock().unwrap().push(d.clone());
                match d.key.as_str() {
                    "ok" => Ok(()),
                    "io-error" => Err(std::io::Error::other("disk full"))?,
                    "drop" => Err(Error::Drop("bad input".into())),
                    _ => panic!("no handler for {}", d.key),
                }
            })
        });
        thread::sleep(Duration::from_millis(300));
        let req = Socket::new(Protocol::Req0).unwrap();
        req.listen(&ep).unwrap();

        let ack = request(&req, &delivery("ok"));
        assert_eq!((ack.status(), ack.reason.as_str()), (Status::Ack, ""));
        assert_eq!((ack.stream.as_str(), ack.entry_id.as_str()), ("room", "1700000000000-2"));

        let ack = request(&req, &delivery("io-error"));
        assert_eq!((ack.status(), ack.reason.as_str()), (Status::Retry, "disk full"));
        assert_eq!(ack.entry_id, "1700000000000-8");

        let ack = request(&req, &delivery("drop"));
        assert_eq!((ack.status(), ack.reason.as_str()), (Status::Drop, "bad input"));

        let ack = request(&req, &delivery("other"));
        assert_eq!(ack.status(), Status::Retry);
        assert_eq!(ack.reason, "handler panicked: no handler for other");

        stop.store(true, Ordering::SeqCst);
        assert_eq!(run.join().unwrap(), Ok(()));
    });
    // Each failure went to the log facade, once, as what it was; an ACK is not logged.
    assert_eq!(logged("ok"), vec![]);
    let one = |key: &str| match logged(key).as_slice() {
        [(level, msg)] => (*level, msg.clone()),
        other => panic!("{key}: logged {other:?}, want one record"),
    };
    let (level, msg) = one("io-error");
    assert!(
        level == log::Level::Warn && msg.contains("answered RETRY") && msg.ends_with("reason=disk full"),
        "{msg}"
    );
    assert!(msg.contains("stream=room entry_id=1700000000000-8 key=io-error attempt=2"), "{msg}");
    let (level, msg) = one("drop");
    assert!(
        level == log::Level::Warn && msg.contains("answered DROP") && msg.ends_with("reason=bad input"),
        "{msg}"
    );
    let (level, msg) = one("other");
    assert!(
        level == log::Level::Error && msg.contains("panicked") && msg.contains("no handler for other"),
        "{msg}"
    );

    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 4);
    let d = &seen[0];
    assert_eq!((d.stream.as_str(), d.entry_id.as_str(), d.key.as_str()), ("room", "1700000000000-2", "ok"));
    assert_eq!(d.fields, vec![("source".into(), b"test".to_vec()), ("trace".into(), vec![0, 255])]);
    assert_eq!(d.field("trace"), Some(&[0u8, 255][..]));
    assert_eq!(d.payload, br#"{"eventId":"x"}"#);
    assert_eq!((d.attempt, d.fencing_token, d.deadline_unix_ms), (2, 1 << 40, 4_102_444_800_000));
    assert_eq!(d.lock, "room-7");
}

#[test]
fn undecodable_request_is_retried_without_the_handler() {
    let ep = endpoint("garbage");
    let req = Socket::new(Protocol::Req0).unwrap();
    req.listen(&ep).unwrap();
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    thread::scope(|s| {
        let run = s.spawn(|| worker.run(1, |d: &Delivery| panic!("handler called with {d:?}")));
        let ack = request(&req, &[0x0a, 0x05, b'x']); // field 1 claims 5 bytes, has 1
        assert_eq!(ack.status(), Status::Retry);
        assert!(ack.reason.starts_with("cannot decode Delivery"), "{}", ack.reason);
        assert_eq!((ack.stream.as_str(), ack.entry_id.as_str()), ("", ""));
        stop.store(true, Ordering::SeqCst);
        assert_eq!(run.join().unwrap(), Ok(()));
    });
}

#[test]
fn handlers_run_concurrently_on_contexts() {
    let ep = endpoint("concurrent");
    let req = Socket::new(Protocol::Req0).unwrap();
    req.listen(&ep).unwrap();
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    let spans = Mutex::new(Vec::new());
    thread::scope(|s| {
        let run = s.spawn(|| {
            worker.run(2, |_: &Delivery| {
                let start = Instant::now();
                thread::sleep(Duration::from_millis(500));
                spans.lock().unwrap().push((start, Instant::now()));
                Ok(())
            })
        });
        let t0 = Instant::now();
        let a = s.spawn(|| request(&req, &delivery("slow-1")));
        let b = s.spawn(|| request(&req, &delivery("slow-2")));
        assert_eq!(a.join().unwrap().status(), Status::Ack);
        assert_eq!(b.join().unwrap().status(), Status::Ack);
        assert!(t0.elapsed() < Duration::from_millis(950), "took {:?}", t0.elapsed());
        stop.store(true, Ordering::SeqCst);
        assert_eq!(run.join().unwrap(), Ok(()));
    });
    let spans = spans.into_inner().unwrap();
    let ((s1, e1), (s2, e2)) = (spans[0], spans[1]);
    assert!(s1 < e2 && s2 < e1, "the two handlers did not overlap");
}

#[test]
fn says_it_is_still_dialing_and_where_until_connected() {
    record_logs();
    let ep = endpoint("typo");
    let want = format!("still dialing {ep}: no connection to idemproxy for ");
    let dialing = || -> usize {
        RECORDS
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, m)| *l == log::Level::Warn && m.starts_with(&want))
            .count()
    };
    let worker = Worker::connect(&ep).unwrap();
    worker.set_dial_log(Duration::from_millis(300));
    let stop = worker.stop_flag();
    thread::scope(|s| {
        let run = s.spawn(|| worker.run(1, |_: &Delivery| Ok(())));
        let deadline = Instant::now() + Duration::from_secs(10);
        while dialing() < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50)); // the first, and one 6 x 300 ms later
        }
        let got = dialing();
        if got < 2 {
            stop.store(true, Ordering::SeqCst); // fail, not hang: the scope joins run
        }
        assert!(got >= 2, "{:?}", RECORDS.0.lock().unwrap());
        let req = Socket::new(Protocol::Req0).unwrap();
        req.listen(&ep).unwrap();
        assert_eq!(request(&req, &delivery("k")).status(), Status::Ack);
        let n = dialing();
        thread::sleep(Duration::from_millis(2500)); // connected: quiet
        assert_eq!(dialing(), n);
        stop.store(true, Ordering::SeqCst);
        assert_eq!(run.join().unwrap(), Ok(()));
    });
}

#[test]
fn trace_context_deadline_and_retry_after() {
    let ep = endpoint("traced");
    let req = Socket::new(Protocol::Req0).unwrap();
    req.listen(&ep).unwrap();
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    let seen = Mutex::new(Vec::new());
    thread::scope(|s| {
        let run = s.spawn(|| {
            worker.run(1, |d: &Delivery| {
                seen.lock().unwrap().push(d.clone());
                match d.key.as_str() {
                    "later" => Err(Error::RetryAfter(Duration::from_secs(30))),
                    "much-later" => Err(Error::RetryAfter(Duration::from_secs(3 * 86400))),
                    _ => Ok(()),
                }
            })
        });
        let in_a_minute =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
                + 60_000;
        let traced = proto::Delivery {
            stream: "room".into(),
            entry_id: "1-1".into(),
            key: "later".into(),
            deadline_unix_ms: in_a_minute,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: "v=1".into(),
            ..Default::default()
        };
        let t0 = Instant::now();
        let ack = request(&req, &traced.encode_to_vec());
        assert_eq!((ack.status(), ack.retry_after_ms), (Status::Retry, 30_000));
        assert_eq!(ack.entry_id, "1-1");
        let ack = request(&req, &delivery("much-later"));
        assert_eq!((ack.status(), ack.retry_after_ms), (Status::Retry, 3_600_000), "capped at an hour");
        let ack = request(&req, &delivery("ok"));
        assert_eq!((ack.status(), ack.retry_after_ms), (Status::Ack, 0));
        stop.store(true, Ordering::SeqCst);
        assert_eq!(run.join().unwrap(), Ok(()));

        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].traceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        assert_eq!(seen[0].tracestate, "v=1");
        let left = seen[0].deadline.expect("a deadline") - t0;
        assert!(left > Duration::from_secs(50) && left <= Duration::from_secs(61), "{left:?}");
        assert_eq!((seen[2].traceparent.as_str(), seen[2].tracestate.as_str()), ("", ""));
    });
    let none = Delivery::default();
    assert_eq!(none.deadline, None);
}

#[test]
fn a_request_without_a_request_id_is_ignored_not_hung_up_on() {
    let ep = endpoint("noid");
    let raw = RawSocket::new(Protocol::Req0).unwrap();
    let events = std::sync::Arc::new(Mutex::new(Vec::new()));
    let ev = std::sync::Arc::clone(&events);
    raw.socket.pipe_notify(move |_, e| ev.lock().unwrap().push(e)).unwrap();
    raw.socket.listen(&ep).unwrap();
    raw.socket.set_opt::<idemproxy_worker::nng::options::RecvTimeout>(Some(Duration::from_secs(10))).unwrap();
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    thread::scope(|s| {
        let run = s.spawn(|| worker.run(1, |_: &Delivery| Ok(())));
        let t0 = Instant::now();
        while !events.lock().unwrap().contains(&PipeEvent::AddPost) {
            assert!(t0.elapsed() < Duration::from_secs(10), "the worker never connected");
            thread::sleep(Duration::from_millis(10));
        }
        // No word with the top bit set: no request id, nothing to answer.
        raw.socket.send(Message::from(&[0u8, 0, 0, 5, 0, 0, 0, 6][..])).unwrap();
        let mut m = Message::from(&delivery("after")[..]);
        m.as_mut_header().push_back(&[0x80, 0, 0, 1]);
        raw.socket.send(m).unwrap();
        let reply = raw.socket.recv();
        thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::SeqCst); // before any assert: a failed one must not hang the scope
        let reply = reply.expect("no reply to the request after the one without an id");
        assert_eq!(reply.as_header().as_slice(), &[0x80, 0, 0, 1]);
        assert_eq!(proto::Ack::decode(reply.as_slice()).unwrap().status(), Status::Ack);
        let events = events.lock().unwrap().clone();
        assert!(!events.contains(&PipeEvent::RemovePost), "the worker hung up: {events:?}");
        assert_eq!(run.join().unwrap(), Ok(()));
    });
}
