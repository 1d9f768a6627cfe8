package dev.idemproxy.worker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.idemproxy.worker.proto.Ack.Status;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.trace.Span;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.testing.exporter.InMemorySpanExporter;
import io.opentelemetry.sdk.trace.SdkTracerProvider;
import io.opentelemetry.sdk.trace.data.SpanData;
import io.opentelemetry.sdk.trace.export.SimpleSpanProcessor;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** With the OpenTelemetry API present, the handler runs in a child span of the delivery's traceparent. */
class TracingTest {
    @AfterEach
    void reset() {
        GlobalOpenTelemetry.resetForTest();
    }

    @Test
    void theHandlersSpanIsAChildOfTheDeliverysTraceparent() {
        InMemorySpanExporter exporter = InMemorySpanExporter.create();
        OpenTelemetrySdk sdk = OpenTelemetrySdk.builder().setTracerProvider(SdkTracerProvider.builder()
                .addSpanProcessor(SimpleSpanProcessor.create(exporter)).build()).build();
        GlobalOpenTelemetry.resetForTest();
        GlobalOpenTelemetry.set(sdk);
        byte[] body = dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("room").setEntryId("1-2")
                .setKey("k").setTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .build().toByteArray();
        AtomicReference<String> current = new AtomicReference<>();
        assertEquals(Status.ACK, Worker.answer(body, d -> current.set(Span.current().getSpanContext().getSpanId()))
                .getStatus());
        List<SpanData> spans = exporter.getFinishedSpanItems();
        assertEquals(1, spans.size());
        SpanData s = spans.get(0);
        assertEquals("0af7651916cd43dd8448eb211c80319c", s.getTraceId());
        assertEquals("b7ad6b7169203331", s.getParentSpanId());
        assertEquals(s.getSpanId(), current.get(), "the handler runs inside the span");
        assertEquals("1-2", s.getAttributes().get(io.opentelemetry.api.common.AttributeKey.stringKey("messaging.message.id")));

        // without a traceparent: a new root
        exporter.reset();
        Worker.answer(dev.idemproxy.worker.proto.Delivery.newBuilder().setKey("r").build().toByteArray(), d -> { });
        assertTrue(!exporter.getFinishedSpanItems().get(0).getParentSpanContext().isValid());
    }
}
