//! With the `opentelemetry` feature, each handler runs in a span that is a child
//! of the delivery's traceparent (`cargo test --features opentelemetry`).
#![cfg(feature = "opentelemetry")]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use idemproxy_worker::nng::{Aio, AioResult, Context, Protocol, Socket};
use idemproxy_worker::proto::{self, ack::Status};
use idemproxy_worker::{Delivery, Worker};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use prost::Message as _;

/// The spans the handler's tracer provider exports, kept.
#[derive(Clone, Debug, Default)]
struct Kept(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Kept {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

fn request(sock: &Socket, body: &[u8]) -> proto::Ack {
    let ctx = Context::new(sock).unwrap();
    let (tx, rx) = mpsc::channel();
    let aio = Aio::new(move |_, res| tx.send(res).unwrap()).unwrap();
    aio.set_timeout(Some(Duration::from_secs(10))).unwrap();
    ctx.send(&aio, body).unwrap();
    assert!(matches!(rx.recv().unwrap(), AioResult::Send(Ok(()))));
    aio.wait();
    ctx.recv(&aio).unwrap();
    let res = rx.recv().unwrap();
    aio.wait();
    match res {
        AioResult::Recv(Ok(m)) => proto::Ack::decode(m.as_slice()).unwrap(),
        other => panic!("no reply: {other:?}"),
    }
}

#[test]
fn the_handlers_span_is_a_child_of_the_deliverys_traceparent() {
    let kept = Kept::default();
    opentelemetry::global::set_tracer_provider(
        SdkTracerProvider::builder().with_simple_exporter(kept.clone()).build(),
    );
    let path = std::env::temp_dir().join(format!("idemproxy-worker-{}-otel.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let ep = format!("ipc://{}", path.display());
    let req = Socket::new(Protocol::Req0).unwrap();
    req.listen(&ep).unwrap();
    let worker = Worker::connect(&ep).unwrap();
    let stop = worker.stop_flag();
    let inside = Mutex::new(Vec::new());
    thread::scope(|s| {
        let run = s.spawn(|| {
            worker.run(1, |_: &Delivery| {
                let cx = opentelemetry::Context::current();
                inside.lock().unwrap().push(cx.span().span_context().span_id().to_string());
                Ok(())
            })
        });
        let traced = proto::Delivery {
            stream: "room".into(),
            entry_id: "1-1".into(),
            key: "k".into(),
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            ..Default::default()
        };
        let ack = request(&req, &traced.encode_to_vec());
        let bad = proto::Delivery {
            key: "bad".into(),
            traceparent: "00-xyz-b7ad6b7169203331-01".into(),
            ..Default::default()
        };
        let ack2 = request(&req, &bad.encode_to_vec());
        stop.store(true, Ordering::SeqCst);
        assert_eq!((ack.status(), ack2.status()), (Status::Ack, Status::Ack));
        assert_eq!(run.join().unwrap(), Ok(()));
    });
    let spans = kept.0.lock().unwrap();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let s = &spans[0];
    assert_eq!(s.span_context.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(s.parent_span_id.to_string(), "b7ad6b7169203331");
    assert_eq!(s.name, "room process");
    assert_eq!(inside.lock().unwrap()[0], s.span_context.span_id().to_string(), "the handler ran inside it");
    assert_eq!(
        spans[1].parent_span_id,
        opentelemetry::trace::SpanId::INVALID,
        "a malformed traceparent: a new root"
    );
}
