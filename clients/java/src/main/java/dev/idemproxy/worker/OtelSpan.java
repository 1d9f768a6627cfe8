package dev.idemproxy.worker;

import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.api.trace.SpanKind;
import io.opentelemetry.api.trace.StatusCode;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.Scope;
import io.opentelemetry.context.propagation.TextMapGetter;
import java.util.List;

/** The handler's span (only loaded when the OpenTelemetry API is on the classpath; see {@link Tracing}). */
final class OtelSpan {
    private static final TextMapGetter<Delivery> W3C = new TextMapGetter<>() {
        @Override
        public Iterable<String> keys(Delivery d) {
            return List.of("traceparent", "tracestate");
        }

        @Override
        public String get(Delivery d, String key) {
            String v = d == null ? null : key.equals("traceparent") ? d.traceparent()
                    : key.equals("tracestate") ? d.tracestate() : null;
            return v == null || v.isEmpty() ? null : v;
        }
    };

    private OtelSpan() {
    }

    static void handle(Handler handler, Delivery d) throws Exception {
        Context parent = W3CTraceContextPropagator.getInstance().extract(Context.root(), d, W3C);
        Span span = GlobalOpenTelemetry.getTracer("dev.idemproxy.worker")
                .spanBuilder(d.stream() + " process").setParent(parent).setSpanKind(SpanKind.CONSUMER)
                .setAttribute("messaging.system", "idemproxy")
                .setAttribute("messaging.destination.name", d.stream())
                .setAttribute("messaging.message.id", d.entryId())
                .setAttribute("idemproxy.key", d.key())
                .setAttribute("idemproxy.attempt", Integer.toUnsignedLong(d.attempt()))
                .startSpan();
        try (Scope scope = span.makeCurrent()) {
            handler.handle(d);
        } catch (Exception | Error e) {
            span.recordException(e);
            span.setStatus(StatusCode.ERROR, String.valueOf(e.getMessage()));
            throw e;
        } finally {
            span.end();
        }
    }
}
