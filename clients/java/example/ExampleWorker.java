/*
 * ExampleWorker - an idemproxy worker built on dev.idemproxy.worker.Worker.
 *
 * It connects to idemproxy (which may start later: the worker keeps dialing), answers
 * every delivery and prints one line per delivery on stdout, "<key> attempt=<n>",
 * flushed. Everything else goes to stderr. SIGTERM or SIGINT: the deliveries in hand
 * are finished and answered, then it exits 0.
 *
 * The environment turns it into a test double (the same contract as
 * clients/c/example_worker.c; tests/integration/test_clients.py relies on it):
 *   IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
 *   WORKER_CONCURRENCY   handle up to n deliveries at the same time (1)
 *   WORKER_DELAY_MS      work this long before answering each delivery
 *   WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
 *   WORKER_RETRY_AFTER_MS  those RETRYs ask for a redelivery after this many ms
 *   WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
 *   WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
 *   WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised
 *   WORKER_VERBOSE=1     describe each delivery on stderr
 *   WORKER_SLOW_KEYS     k6: work WORKER_SLOW_MS (1000) on these before answering
 *   WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but stop when the worker
 *                        interrupts the handler's thread at the deadline (answered RETRY)
 *   WORKER_REPORT        a file: one JSON object per answered delivery is appended
 *                        (key, stream, entry_id, attempt, fencing_token, deadline_unix_ms,
 *                        payload, fields, traceparent, tracestate, span_trace_id,
 *                        span_parent_id, status, start_ms, end_ms, remaining_ms: d.remaining()
 *                        at the start, -1 without a deadline; stopped: "signal" when the
 *                        interrupt at the deadline ended the work)
 * With WORKER_REPORT and OpenTelemetry's SDK on the classpath (`make example` puts the test
 * scope there), it registers a tracer provider (no exporter), so each handler runs in the
 * client's real span; the report gives that span's trace id and parent span id.
 * (WORKER_NOACK_KEYS, "never answer", has no equivalent: every handler outcome is an answer.)
 */
import dev.idemproxy.worker.Delivery;
import dev.idemproxy.worker.Drop;
import dev.idemproxy.worker.RetryAfter;
import dev.idemproxy.worker.Worker;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Set;
import java.util.stream.Collectors;

public final class ExampleWorker {
    private static final Set<String> RETRY_KEYS = keys("WORKER_RETRY_KEYS");
    private static final Set<String> DROP_KEYS = keys("WORKER_DROP_KEYS");
    private static final Set<String> SLOW_KEYS = keys("WORKER_SLOW_KEYS");
    private static final Set<String> CRASH_KEYS = keys("WORKER_CRASH_KEYS");
    private static final Set<String> DEADLINE_KEYS = keys("WORKER_DEADLINE_KEYS");
    private static final long RETRY_TIMES = env("WORKER_RETRY_TIMES", 1);
    private static final long RETRY_AFTER_MS = env("WORKER_RETRY_AFTER_MS", 0);
    private static final long DELAY_MS = env("WORKER_DELAY_MS", 0);
    private static final long SLOW_MS = env("WORKER_SLOW_MS", 1000);
    private static final boolean VERBOSE = env("WORKER_VERBOSE", 0) != 0;
    private static final String REPORT = System.getenv("WORKER_REPORT");

    public static void main(String[] args) throws InterruptedException {
        String endpoint = System.getenv().getOrDefault("IDEMPROXY_ENDPOINT", Worker.DEFAULT_ENDPOINT);
        if (args.length == 2 && args[0].equals("--endpoint")) {
            endpoint = args[1];
        } else if (args.length != 0) {
            System.err.println("usage: ExampleWorker [--endpoint URL]   (default " + Worker.DEFAULT_ENDPOINT + ")");
            System.exit(args[0].equals("--help") ? 0 : 2);
        }
        long maxBytes = env("WORKER_MAX_BYTES", 0); // 0: the default, -1: no limit
        Worker worker = new Worker(maxBytes == 0 ? Worker.DEFAULT_MAX_ENTRY_BYTES
                : (int) Math.min(maxBytes < 0 ? Integer.MAX_VALUE : maxBytes, Integer.MAX_VALUE - 64));
        worker.closeOnSignals(); // SIGTERM: the deliveries in hand are answered, then exit 0
        if (REPORT != null && !REPORT.isEmpty())
            Otel.register();
        int concurrency = (int) Math.max(1, env("WORKER_CONCURRENCY", 1));
        System.err.println("ExampleWorker: waiting for deliveries on " + endpoint
                + " (concurrency " + concurrency + ")");
        worker.serve(endpoint, concurrency, ExampleWorker::handle);
    }

    /** The handler: returns to ACK, throws Drop to DROP, throws anything else to RETRY. */
    static void handle(Delivery d) throws InterruptedException {
        if (VERBOSE)
            System.err.println(d + " payload=" + d.payloadText());
        if (CRASH_KEYS.contains(d.key())) {
            System.err.println("ExampleWorker: crashing on " + d.key() + " as asked");
            Runtime.getRuntime().halt(3);
        }
        long start = System.currentTimeMillis();
        long remaining = d.deadlineUnixMs() == 0 ? -1 : d.remaining().toMillis();
        try {
            Thread.sleep(DELAY_MS + (SLOW_KEYS.contains(d.key()) || DEADLINE_KEYS.contains(d.key()) ? SLOW_MS : 0));
        } catch (InterruptedException e) { // the delivery's deadline: answered RETRY
            report(d, "retry", start, System.currentTimeMillis(), remaining, "signal");
            System.out.println(d.key() + " attempt=" + Integer.toUnsignedString(d.attempt()));
            System.out.flush();
            throw e;
        }
        String status = DROP_KEYS.contains(d.key()) ? "drop"
                : RETRY_KEYS.contains(d.key()) && Integer.toUnsignedLong(d.attempt()) <= RETRY_TIMES ? "retry"
                : "ack";
        report(d, status, start, System.currentTimeMillis(), remaining, "");
        System.out.println(d.key() + " attempt=" + Integer.toUnsignedString(d.attempt()));
        System.out.flush();
        if (status.equals("drop"))
            throw new Drop("dropped by worker");
        if (status.equals("retry") && RETRY_AFTER_MS > 0)
            throw new RetryAfter(java.time.Duration.ofMillis(RETRY_AFTER_MS), "retry requested by worker");
        if (status.equals("retry"))
            throw new IllegalStateException("retry requested by worker");
    }

    /** Appends one JSON line about 'd' to WORKER_REPORT, one whole line per write. */
    private static synchronized void report(Delivery d, String status, long start, long end,
                                            long remaining, String stopped) {
        if (REPORT == null || REPORT.isEmpty())
            return;
        String fields = d.fields().stream().map(f -> json(f.name()) + ":" + json(f.text()))
                .collect(Collectors.joining(",", "{", "}"));
        String line = "{\"key\":" + json(d.key()) + ",\"stream\":" + json(d.stream())
                + ",\"entry_id\":" + json(d.entryId()) + ",\"attempt\":" + Integer.toUnsignedString(d.attempt())
                + ",\"fencing_token\":" + Long.toUnsignedString(d.fencingToken())
                + ",\"deadline_unix_ms\":" + Long.toUnsignedString(d.deadlineUnixMs())
                + ",\"payload\":" + json(d.payloadText()) + ",\"fields\":" + fields
                + ",\"traceparent\":" + json(d.traceparent()) + ",\"tracestate\":" + json(d.tracestate())
                + Otel.spanIds()
                + ",\"status\":\"" + status + "\",\"start_ms\":" + start + ",\"end_ms\":" + end
                + ",\"remaining_ms\":" + remaining + ",\"stopped\":" + json(stopped) + "}\n";
        try {
            Files.write(Path.of(REPORT), line.getBytes(StandardCharsets.UTF_8),
                    StandardOpenOption.CREATE, StandardOpenOption.APPEND);
        } catch (IOException e) {
            System.err.println("ExampleWorker: " + REPORT + ": " + e);
        }
    }

    /** OpenTelemetry's SDK, when it is on the classpath: only this class names it. */
    private static final class Otel {
        private static boolean on;

        static void register() {
            try {
                io.opentelemetry.sdk.OpenTelemetrySdk.builder()
                        .setTracerProvider(io.opentelemetry.sdk.trace.SdkTracerProvider.builder().build())
                        .buildAndRegisterGlobal();
                on = true;
            } catch (NoClassDefFoundError e) {
                System.err.println("ExampleWorker: no OpenTelemetry SDK: handlers run without spans");
            }
        }

        /** ",span_trace_id:..,span_parent_id:.." of the handler's span, "" without one. */
        static String spanIds() {
            String trace = "", parent = "";
            if (on && io.opentelemetry.api.trace.Span.current()
                    instanceof io.opentelemetry.sdk.trace.ReadableSpan span) {
                trace = span.getSpanContext().getTraceId();
                if (span.getParentSpanContext().isValid())
                    parent = span.getParentSpanContext().getSpanId();
            }
            return ",\"span_trace_id\":" + json(trace) + ",\"span_parent_id\":" + json(parent);
        }
    }

    private static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\')
                b.append('\\').append(c);
            else if (c < 0x20)
                b.append(String.format("\\u%04x", (int) c));
            else
                b.append(c);
        }
        return b.append('"').toString();
    }

    private static Set<String> keys(String name) {
        String v = System.getenv(name);
        return v == null ? Set.of() : Arrays.stream(v.split(",")).filter(k -> !k.isEmpty()).collect(Collectors.toSet());
    }

    private static long env(String name, long dflt) {
        String v = System.getenv(name);
        try {
            return v == null || v.isEmpty() ? dflt : Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            return dflt;
        }
    }
}
