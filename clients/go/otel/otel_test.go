package idemproxyotel

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
)

const (
	traceID = "0af7651916cd43dd8448eb211c80319c"
	spanID  = "b7ad6b7169203331"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// The handler runs in a CONSUMER span whose parent is the delivery's traceparent.
func TestSpanIsAChildOfTheDeliverysTraceparent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var inHandler trace.SpanContext
	h := Handler(func(ctx context.Context, d *idemproxy.Delivery) error {
		inHandler = trace.SpanContextFromContext(ctx)
		switch d.Key {
		case "bad":
			return errors.New("db down")
		case "poison":
			return idemproxy.Drop("cannot parse")
		}
		return nil
	}, WithTracerProvider(tp))
	tparent := "00-" + traceID + "-" + spanID + "-01"
	ctx := context.Background()
	if err := h(ctx, &idemproxy.Delivery{Stream: "orders", EntryID: "1-0", Key: "good", Attempt: 2,
		Traceparent: tparent, Tracestate: "vendor=x"}); err != nil {
		t.Fatal(err)
	}
	good := inHandler
	_ = h(ctx, &idemproxy.Delivery{Stream: "orders", Key: "bad", Traceparent: tparent})
	_ = h(ctx, &idemproxy.Delivery{Stream: "orders", Key: "poison"})
	_ = h(ctx, &idemproxy.Delivery{Stream: "orders", Key: "malformed", Traceparent: "00-" + traceID + "-" + spanID})

	spans := rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans ended, want 4", len(spans))
	}
	by := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		by[attrs(s)["idemproxy.key"].AsString()] = s
	}
	s := by["good"]
	if s.Name() != "process orders" || s.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if p := s.Parent(); p.TraceID().String() != traceID || p.SpanID().String() != spanID || !p.IsRemote() ||
		p.TraceState().Get("vendor") != "x" {
		t.Errorf("parent %v, want %s/%s remote with vendor=x", p, traceID, spanID)
	}
	if s.SpanContext().SpanID() != good.SpanID() {
		t.Errorf("the handler's ctx carries span %v, not its own %v", good.SpanID(), s.SpanContext().SpanID())
	}
	a := attrs(s)
	if a["messaging.destination.name"].AsString() != "orders" || a["messaging.message.id"].AsString() != "1-0" ||
		a["idemproxy.attempt"].AsInt64() != 2 || a["idemproxy.answer"].AsString() != "ack" {
		t.Errorf("attributes %v", a)
	}
	if b := by["bad"]; b.Parent().SpanID().String() != spanID || attrs(b)["idemproxy.answer"].AsString() != "retry" ||
		b.Status().Code != codes.Error {
		t.Errorf("bad: parent %v answer %v status %v", b.Parent().SpanID(), attrs(b)["idemproxy.answer"], b.Status())
	}
	if p := by["poison"]; p.Parent().IsValid() || attrs(p)["idemproxy.answer"].AsString() != "drop" || p.Status().Code == codes.Error {
		t.Errorf("poison: parent %v answer %v status %v (want a root, drop, no error)", p.Parent(),
			attrs(p)["idemproxy.answer"], p.Status())
	}
	if m := by["malformed"]; m.Parent().IsValid() {
		t.Errorf("a malformed traceparent became parent %v", m.Parent())
	}
}

// A panic ends the span (status Error) and goes on to Serve, which answers RETRY.
func TestPanicEndsTheSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	h := Handler(func(context.Context, *idemproxy.Delivery) error { panic("boom") },
		WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic was swallowed")
			}
		}()
		_ = h(context.Background(), &idemproxy.Delivery{Stream: "s", Key: "k"})
	}()
	if s := rec.Ended(); len(s) != 1 || s[0].Status().Code != codes.Error {
		t.Errorf("spans %v", s)
	}
}
