package dev.idemproxy.worker;

/**
 * Runs a handler inside an OpenTelemetry span that is a child of the delivery's
 * traceparent, when the OpenTelemetry API (io.opentelemetry:opentelemetry-api, an optional
 * dependency) is on the classpath; otherwise just runs it. Only {@link OtelSpan} names
 * OpenTelemetry's classes, and it is loaded only when they are there.
 */
final class Tracing {
    static final boolean PRESENT = present();

    private Tracing() {
    }

    private static boolean present() {
        try {
            Class.forName("io.opentelemetry.api.GlobalOpenTelemetry", false, Tracing.class.getClassLoader());
            return true;
        } catch (ClassNotFoundException | LinkageError e) {
            return false;
        }
    }

    static void handle(Handler handler, Delivery d) throws Exception {
        if (PRESENT)
            OtelSpan.handle(handler, d);
        else
            handler.handle(d);
    }
}
