// Package idemproxyotel runs an idemproxy handler inside an OpenTelemetry
// span that continues the delivery's trace. It is a sub-package so that the
// idemproxy package itself needs no OpenTelemetry: only a worker that
// imports this one builds it.
//
//	h := idemproxyotel.Handler(handle) // spans from otel.GetTracerProvider()
//	err := idemproxy.Serve(ctx, endpoint, h)
//
// Each delivery gets a CONSUMER span "process <stream>", a child of the
// delivery's traceparent (idemproxy's delivery span; a new root when it is
// empty or malformed), with the attributes idemproxy's own spans use and
// idemproxy.answer (ack, retry, drop); a handler's error or panic sets the
// status to Error. The handler's ctx carries the span.
package idemproxyotel

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/idemproxy/idemproxy/clients/go/otel"

// Option configures Handler.
type Option func(*config)

type config struct{ tp trace.TracerProvider }

// WithTracerProvider sets where the spans go (default: otel.GetTracerProvider()
// when each delivery arrives).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// Handler wraps h: each call runs in the delivery's span.
func Handler(h idemproxy.Handler, opts ...Option) idemproxy.Handler {
	var c config
	for _, opt := range opts {
		opt(&c)
	}
	return func(ctx context.Context, d *idemproxy.Delivery) (err error) {
		tp := c.tp
		if tp == nil {
			tp = otel.GetTracerProvider()
		}
		start := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.system", "redis_streams"),
				attribute.String("messaging.operation.type", "process"),
				attribute.String("messaging.operation.name", "process"),
				attribute.String("messaging.destination.name", d.Stream),
				attribute.String("messaging.message.id", d.EntryID),
				attribute.String("idemproxy.key", d.Key),
				attribute.Int64("idemproxy.attempt", int64(d.Attempt)),
			),
		}
		carrier := propagation.MapCarrier{"traceparent": d.Traceparent, "tracestate": d.Tracestate}
		parent := propagation.TraceContext{}.Extract(ctx, carrier)
		if !trace.SpanContextFromContext(parent).IsRemote() {
			start = append(start, trace.WithNewRoot()) // not under whatever ctx carried
		}
		ctx, span := tp.Tracer(ScopeName).Start(parent, "process "+d.Stream, start...)
		defer func() {
			if r := recover(); r != nil {
				span.SetAttributes(attribute.String("idemproxy.answer", "retry"))
				span.SetStatus(codes.Error, fmt.Sprint("panic: ", r))
				span.End()
				panic(r) // idemproxy.Serve answers RETRY and logs it
			}
			answer := "ack"
			var drop *idemproxy.DropError
			switch {
			case err == nil:
			case errors.As(err, &drop):
				answer = "drop"
			default:
				answer = "retry"
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.SetAttributes(attribute.String("idemproxy.answer", answer))
			span.End()
		}()
		return h(ctx, d)
	}
}
