package dev.idemproxy.worker;

import static java.lang.System.Logger.Level.DEBUG;
import static java.lang.System.Logger.Level.INFO;
import static java.lang.System.Logger.Level.WARNING;

import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.protobuf.Message;
import dev.idemproxy.worker.proto.Ack;
import java.io.IOException;
import java.net.ProtocolException;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * An idemproxy worker: a REP connection to idemproxy's endpoint, each delivery answered with
 * what a {@link Handler} makes of it.
 *
 * <pre>{@code
 * Worker worker = new Worker();
 * worker.closeOnSignals();  // SIGTERM/SIGINT: finish what is in hand, serve() returns, exit 0
 * worker.serve("ipc:///tmp/idemproxy.sock", 4, d -> {
 *     if (d.payload().length == 0)
 *         throw new Drop("empty payload");                         // DROP: dead-lettered
 *     db.apply(d.key(), d.payloadText(), d.fencingToken());        // an exception: RETRY
 * });                                                              // a normal return: ACK
 * }</pre>
 *
 * <p>idemproxy binds the endpoint with a raw REQ socket and sends one {@code Delivery} per
 * stream entry, many in flight at once, round-robin over its connected workers.
 * {@code serve(endpoint, n, handler)} keeps one connection and takes up to n requests off it
 * at a time, each handled on its own thread of a fixed pool and answered as soon as it is
 * done, in any order (what NNG's REP contexts do); the (n+1)th waits on the socket until a
 * handler is free. {@code serve(endpoint, n, executor, handler)} runs the handlers on an
 * executor of yours instead (on Java 21+, {@code Executors.newVirtualThreadPerTaskExecutor()}),
 * still at most n at a time. The connection dials until idemproxy is there and again
 * whenever it goes away (backoff 0.1 s doubling to 1 s), so a worker may start first and
 * survives idemproxy's restarts; a peer that sends no SP header within 10 s is hung up on.
 * Without a connection for 5 s (IDEMPROXY_DIAL_LOG_MS, in milliseconds) a WARNING says it is
 * still dialing and where, then one every six times as long (30 s) until connected, so a
 * wrong endpoint shows in the log.
 * When a connection is lost, the deliveries it brought that have not started are skipped
 * (their answers could not be sent; idemproxy delivers them again) and the worker dials
 * again at once. Every answer echoes the delivery's stream and entry id; a delivery that
 * does not decode (a string that is not UTF-8, a known field with the wrong wire type) is
 * answered RETRY.
 *
 * <p>{@link Delivery#deadlineUnixMs()} is the delivery's ack deadline: an answer after it is
 * ignored and the entry is delivered again. idemproxy paces deliveries per worker, so the
 * ack timer measures the handler's own work, not a queue in front of it. A delivery that
 * arrives already past its deadline is answered RETRY without calling the handler. The SP
 * protocol itself is in {@code SpRep}.
 *
 * <p>Messages go to the {@code System.Logger} "dev.idemproxy.worker" (java.util.logging
 * unless another backend is installed), never to stdout or stderr: a handler's failure is a
 * WARNING with its exception, a DROP an INFO.
 */
public final class Worker implements AutoCloseable {
    public static final String DEFAULT_ENDPOINT = "ipc:///tmp/idemproxy.sock";
    /** idemproxy's default app.max_entry_bytes: the largest Delivery it sends. */
    public static final int DEFAULT_MAX_ENTRY_BYTES = 1 << 20;
    /** Room for the SP header in front of a Delivery (8 backtrace words; idemproxy sends one). */
    static final int SP_HEADER_BYTES = 32;
    /** A delivery that arrives after its deadline is answered RETRY with this reason. */
    static final String STALE = "deadline passed before the handler ran";

    private static final System.Logger LOG = System.getLogger(Worker.class.getPackageName());
    private static final long BACKOFF_MIN_MS = 100;
    private static final long BACKOFF_MAX_MS = 1000;
    /** The first "still dialing" warning after this long without a connection; then 6 times as long. */
    static final long DIAL_LOG_MS = 5000;

    private final int maxEntryBytes;
    private final CountDownLatch closing = new CountDownLatch(1);
    private final CountDownLatch finished = new CountDownLatch(1);
    private final Set<Thread> handlerThreads = ConcurrentHashMap.newKeySet();
    private boolean serving; // guarded by this
    private int inHand;      // guarded by this: deliveries taken whose answers are not sent yet
    private SpRep current;   // guarded by this
    private String lastError; // the serving thread's last dial failure, logged once
    private long dialLogMs = dialLogFromEnv(); // see DIAL_LOG_MS; IDEMPROXY_DIAL_LOG_MS sets it

    public Worker() {
        this(DEFAULT_MAX_ENTRY_BYTES);
    }

    /**
     * Accepts Deliveries of up to {@code maxEntryBytes}: idemproxy's {@code app.max_entry_bytes},
     * to be raised together with it. A bigger message drops the connection.
     */
    public Worker(int maxEntryBytes) {
        if (maxEntryBytes < 1 || maxEntryBytes > Integer.MAX_VALUE - 8 - SP_HEADER_BYTES)
            throw new IllegalArgumentException("maxEntryBytes must be positive and below 2 GiB");
        this.maxEntryBytes = maxEntryBytes;
    }

    /**
     * Makes SIGTERM and SIGINT call {@link #close()}: the deliveries in hand are finished and
     * answered, {@code serve} returns, and a {@code main} that then returns exits 0 (a JVM
     * stopped by the default SIGTERM handling exits 143, which Kubernetes reports as an error).
     */
    @SuppressWarnings("sunapi")
    public void closeOnSignals() {
        for (String name : new String[] {"TERM", "INT"})
            sun.misc.Signal.handle(new sun.misc.Signal(name), sig -> new Thread(this::close, "idemproxy-close").start());
    }

    /**
     * Serves deliveries from {@code endpoint} ("ipc:///path" or "tcp://host:port") with up to
     * {@code concurrency} handlers at a time, until {@link #close()}. Call it once; it returns
     * when closed, after the deliveries in hand are answered.
     */
    public void serve(String endpoint, int concurrency, Handler handler) throws InterruptedException {
        serve(endpoint, concurrency, null, handler);
    }

    /**
     * As {@link #serve(String, int, Handler)}, with each handler run on {@code executor}
     * (null: a fixed pool of {@code concurrency} threads of the worker's own). On Java 21+,
     * {@code Executors.newVirtualThreadPerTaskExecutor()} runs each on a virtual thread.
     * {@code concurrency} still bounds the deliveries in hand at once. The executor stays
     * yours: {@code serve} does not shut it down. A delivery the executor rejects is answered
     * RETRY (and logged), so idemproxy delivers it again.
     */
    public void serve(String endpoint, int concurrency, Executor executor, Handler handler)
            throws InterruptedException {
        SpRep.address(endpoint); // a bad endpoint fails here
        Objects.requireNonNull(handler, "handler");
        if (concurrency < 1)
            throw new IllegalArgumentException("concurrency must be at least 1");
        synchronized (this) {
            if (serving)
                throw new IllegalStateException("serve() was already called");
            serving = true;
        }
        ExecutorService own = null;
        if (executor == null) {
            AtomicInteger n = new AtomicInteger();
            own = Executors.newFixedThreadPool(concurrency,
                    r -> new Thread(r, "idemproxy-handler-" + n.incrementAndGet()));
        }
        Semaphore free = new Semaphore(concurrency);
        try {
            long backoff = BACKOFF_MIN_MS;
            long since = System.nanoTime(), next = since + dialLogMs * 1_000_000;
            while (!closed()) {
                if (session(endpoint, handler, own != null ? own : executor, free, concurrency)) {
                    backoff = BACKOFF_MIN_MS;
                    since = System.nanoTime(); // connected, then lost: start over
                    next = since + dialLogMs * 1_000_000;
                } else if (!closed() && System.nanoTime() - next >= 0) {
                    // A wrong endpoint would otherwise dial in silence for ever.
                    long now = System.nanoTime();
                    next = now + 6 * dialLogMs * 1_000_000;
                    LOG.log(WARNING, "still dialing {0}: no connection to idemproxy for {1} s "
                            + "(is idemproxy running, and is this its app.endpoint?)", endpoint,
                            String.valueOf(Math.round((now - since) / 1e9)));
                }
                closing.await(backoff, TimeUnit.MILLISECONDS);
                backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
            }
        } catch (InterruptedException e) {
            closing.countDown();
            throw e;
        } finally {
            free.acquireUninterruptibly(concurrency); // the handlers still at work are done
            if (own != null)
                own.shutdown();
            finished.countDown();
        }
    }

    /** IDEMPROXY_DIAL_LOG_MS, or DIAL_LOG_MS when unset or not a positive number. */
    private static long dialLogFromEnv() {
        try {
            long ms = Long.parseLong(System.getenv().getOrDefault("IDEMPROXY_DIAL_LOG_MS", ""));
            return ms > 0 ? ms : DIAL_LOG_MS;
        } catch (NumberFormatException e) {
            return DIAL_LOG_MS;
        }
    }

    /** For tests: the wait before the first "still dialing" warning. */
    void dialLogMs(long ms) {
        dialLogMs = ms;
    }

    /**
     * Stops serving: no more deliveries are taken, the ones in hand are finished and
     * answered, then the connection closes. Returns when {@code serve} has (unless called
     * from a handler, or this thread is interrupted). Safe from a shutdown hook, more than once.
     */
    @Override
    public void close() {
        closing.countDown();
        if (handlerThreads.contains(Thread.currentThread())) { // it would wait for itself
            new Thread(this::close, "idemproxy-close").start();
            return;
        }
        SpRep conn;
        boolean wait;
        boolean interrupted = false;
        synchronized (this) {
            // The answers in hand go out before reading stops: shutting our input down makes
            // idemproxy's next send on this connection fail, and it drops the connection with
            // whatever answer it has not read yet.
            while (inHand > 0) {
                try {
                    wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                    break;
                }
            }
            conn = current;
            wait = serving;
        }
        if (conn != null) {
            conn.linger(); // the last answer is taken before idemproxy's sends start failing
            conn.stopReading();
        }
        if (wait && !interrupted) {
            try {
                finished.await();
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted)
            Thread.currentThread().interrupt();
    }

    /** Takes a delivery off the connection to handle, unless closing (then idemproxy delivers it again). */
    private synchronized boolean take() {
        if (closed())
            return false;
        inHand++;
        return true;
    }

    private synchronized void answered() {
        if (--inHand == 0)
            notifyAll();
    }

    private boolean closed() {
        return closing.getCount() == 0;
    }

    private synchronized boolean attach(SpRep conn) {
        current = conn;
        return !closed();
    }

    /** One connection: dial, then read requests while a handler is free. Returns whether it connected. */
    private boolean session(String endpoint, Handler handler, Executor pool, Semaphore free,
                            int concurrency) throws InterruptedException {
        boolean connected = false;
        SpRep conn = null;
        try {
            conn = new SpRep(endpoint, maxEntryBytes + SP_HEADER_BYTES);
            if (!attach(conn))
                return false;
            conn.connect();
            connected = true;
            LOG.log(DEBUG, "connected to {0}", endpoint);
            for (;;) {
                free.acquire();
                SpRep.Request req;
                try {
                    req = conn.recv();
                } catch (IOException e) {
                    free.release();
                    throw e;
                }
                if (!take()) {
                    free.release();
                    continue;
                }
                SpRep c = conn;
                try {
                    pool.execute(() -> {
                        handlerThreads.add(Thread.currentThread());
                        try {
                            if (c.lost()) // its answer could not be sent: idemproxy delivers it again
                                return;
                            c.send(req.backtrace(), answer(req.body(), handler).toByteArray());
                        } catch (IOException e) {
                            LOG.log(INFO, "an answer was lost with its connection: {0}", e.toString());
                            c.abort(); // the deliveries still buffered in it are skipped, and we redial
                        } finally {
                            handlerThreads.remove(Thread.currentThread());
                            free.release();
                            answered();
                        }
                    });
                } catch (RejectedExecutionException e) {
                    LOG.log(WARNING, "the executor rejected a delivery, answered RETRY: {0}", e.toString());
                    try {
                        c.send(req.backtrace(), Ack.newBuilder().setStatus(Ack.Status.RETRY)
                                .setReason("the worker's executor rejected it").build().toByteArray());
                    } finally {
                        free.release();
                        answered();
                    }
                }
            }
        } catch (IOException e) {
            if (!closed()) { // a lost connection or a new dial error is news, a repeated one is not
                String what = e.toString();
                boolean news = connected || !what.equals(lastError);
                lastError = connected ? null : what;
                LOG.log(e instanceof ProtocolException ? WARNING : news ? INFO : DEBUG,
                        "{0}: {1}; dialing again", endpoint, what);
            }
            return connected;
        } finally {
            if (closed()) { // answers in hand go out before the connection closes
                free.acquireUninterruptibly(concurrency);
                free.release(concurrency);
            }
            try {
                if (conn != null)
                    conn.close();
            } catch (IOException e) {
                // closing anyway
            }
        }
    }

    /** The answer to one request body: the handler's outcome as an Ack. */
    static Ack answer(byte[] body, Handler handler) {
        dev.idemproxy.worker.proto.Delivery m;
        try {
            m = dev.idemproxy.worker.proto.Delivery.parseFrom(body);
            misTyped(m);
        } catch (InvalidProtocolBufferException e) {
            LOG.log(WARNING, "a delivery that does not decode, answered RETRY: {0}", e.getMessage());
            return Ack.newBuilder().setStatus(Ack.Status.RETRY)
                    .setReason("undecodable delivery: " + e.getMessage()).build();
        }
        List<Delivery.Field> fields = new ArrayList<>(m.getFieldsCount());
        for (dev.idemproxy.worker.proto.Field f : m.getFieldsList())
            fields.add(new Delivery.Field(f.getName(), f.getValue().toByteArray()));
        Delivery d = new Delivery(m.getStream(), m.getEntryId(), m.getKey(), fields,
                m.getPayload().toByteArray(), m.getAttempt(), m.getFencingToken(), m.getLock(), m.getDeadlineUnixMs(),
                m.getTraceparent(), m.getTracestate());
        Ack.Builder ack = Ack.newBuilder()
                .setStream(m.getStream()).setEntryId(m.getEntryId());
        if (d.deadlineUnixMs() != 0 && Long.compareUnsigned(System.currentTimeMillis(), d.deadlineUnixMs()) > 0) {
            LOG.log(INFO, "{0} {1} key={2}: " + STALE + ", answered RETRY", d.stream(), d.entryId(), d.key());
            return ack.setStatus(Ack.Status.RETRY).setReason(STALE).build();
        }
        Alarm alarm = Alarm.at(d.deadlineUnixMs());
        try {
            Tracing.handle(handler, d);
            return ack.setStatus(Ack.Status.ACK).build();
        } catch (RetryAfter e) {
            LOG.log(INFO, "{0} {1} key={2} attempt={3}: the handler asked for a retry after {4} ms",
                    d.stream(), d.entryId(), d.key(), Integer.toUnsignedString(d.attempt()), e.millis());
            return ack.setStatus(Ack.Status.RETRY).setReason(Objects.toString(e.getMessage(), ""))
                    .setRetryAfterMs(e.millis()).build();
        } catch (Drop e) {
            LOG.log(INFO, "{0} {1} key={2} attempt={3}: the handler dropped it: {4}", d.stream(),
                    d.entryId(), d.key(), Integer.toUnsignedString(d.attempt()), e.reason());
            return ack.setStatus(Ack.Status.DROP).setReason(Objects.toString(e.reason(), "")).build();
        } catch (Throwable e) { // an Error too: the delivery is answered, the worker goes on
            String reason = e.getMessage() != null ? e.getMessage() : e.toString();
            LOG.log(WARNING, d.stream() + " " + d.entryId() + " key=" + d.key() + " attempt="
                    + Integer.toUnsignedString(d.attempt()) + ": the handler failed, answered RETRY", e);
            return ack.setStatus(Ack.Status.RETRY).setReason(reason).build();
        } finally {
            alarm.cancel();
        }
    }

    /** Interrupts the handler's thread at its deadline, unless cancelled first. */
    private static final class Alarm {
        private static final java.util.concurrent.ScheduledExecutorService TIMER =
                Executors.newSingleThreadScheduledExecutor(r -> {
                    Thread t = new Thread(r, "idemproxy-deadline");
                    t.setDaemon(true);
                    return t;
                });
        private static final Alarm NONE = new Alarm(null);

        private final Thread thread;
        private java.util.concurrent.ScheduledFuture<?> task; // guarded by this
        private boolean done;  // guarded by this: the handler returned, no interrupt may follow
        private boolean fired; // guarded by this

        private Alarm(Thread thread) {
            this.thread = thread;
        }

        static Alarm at(long deadlineUnixMs) {
            if (deadlineUnixMs == 0)
                return NONE;
            Alarm a = new Alarm(Thread.currentThread());
            synchronized (a) {
                a.task = TIMER.schedule(a::fire, deadlineUnixMs - System.currentTimeMillis(), TimeUnit.MILLISECONDS);
            }
            return a;
        }

        private synchronized void fire() {
            if (!done) {
                fired = true;
                LOG.log(INFO, "a handler ran past its delivery's deadline: interrupting {0}", thread.getName());
                thread.interrupt();
            }
        }

        /** Called on the handler's thread once it returned: an interrupt of ours is not left behind. */
        synchronized void cancel() {
            if (thread == null)
                return;
            done = true;
            task.cancel(false);
            if (fired)
                Thread.interrupted();
        }
    }

    /**
     * Refuses a known field that arrived with the wrong wire type: protobuf-java keeps it
     * among the unknown fields instead of failing, which would hand the handler a zero.
     */
    private static void misTyped(Message m) throws InvalidProtocolBufferException {
        for (FieldDescriptor f : m.getDescriptorForType().getFields()) {
            if (m.getUnknownFields().hasField(f.getNumber()))
                throw new InvalidProtocolBufferException("field " + f.getName() + " has the wrong wire type");
            if (f.isRepeated() && f.getJavaType() == FieldDescriptor.JavaType.MESSAGE) {
                for (int i = 0; i < m.getRepeatedFieldCount(f); i++)
                    misTyped((Message) m.getRepeatedField(f, i));
            }
        }
    }
}
