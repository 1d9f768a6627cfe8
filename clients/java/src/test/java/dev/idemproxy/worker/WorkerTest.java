package dev.idemproxy.worker;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.idemproxy.worker.proto.Ack;
import dev.idemproxy.worker.proto.Ack.Status;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/** The worker against a fake idemproxy on a real socket pair, and the handler-to-Ack mapping. */
@Timeout(20)
class WorkerTest {
    @TempDir
    Path tmp;

    private final List<Running> running = new ArrayList<>();

    record Running(Worker worker, Thread thread) {}

    private Running serve(String endpoint, int concurrency, Handler handler) {
        return serve(endpoint, concurrency, null, handler);
    }

    private Running serve(String endpoint, int concurrency, Executor executor, Handler handler) {
        Worker w = new Worker(1024);
        Thread t = new Thread(() -> {
            try {
                w.serve(endpoint, concurrency, executor, handler);
            } catch (InterruptedException e) {
                // stopped
            }
        });
        t.start();
        Running r = new Running(w, t);
        running.add(r);
        return r;
    }

    @AfterEach
    void stopWorkers() {
        running.forEach(r -> r.worker().close());
    }

    static byte[] delivery(String key, int attempt) {
        return dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("room").setEntryId("1700000000000-" + attempt)
                .setKey(key).setPayload(ByteString.copyFromUtf8("{\"eventId\":\"" + key + "\"}"))
                .setAttempt(attempt).setFencingToken(7).setDeadlineUnixMs(4_102_444_800_000L)
                .build().toByteArray();
    }

    /** Checks that 'reply' starts with the backtrace 'words' and decodes the Ack behind it. */
    static Ack ack(byte[] reply, int... words) throws IOException {
        ByteBuffer b = ByteBuffer.wrap(reply);
        for (int w : words)
            assertEquals(w, b.getInt(), "backtrace word");
        return Ack.parseFrom(b);
    }

    static void handleByKey(Delivery d) throws Exception {
        switch (d.key()) {
            case "drop-me": throw new Drop("bad event");
            case "retry-me": throw new IOException("database unavailable");
            case "npe": throw new NullPointerException();
            case "assert": throw new AssertionError("an Error is a RETRY too");
            default: // ACK
        }
    }

    @Test
    void answersAckRetryAndDropOverIpc() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 1, WorkerTest::handleByKey);
            try (FakeIdemproxy.Peer p = px.accept()) {
                String[] keys = {"ok", "retry-me", "drop-me", "npe", "assert"};
                Status[] want = {Status.ACK, Status.RETRY, Status.DROP, Status.RETRY, Status.RETRY};
                String[] reasons = {"", "database unavailable", "bad event", "java.lang.NullPointerException",
                                    "an Error is a RETRY too"};
                for (int i = 0; i < keys.length; i++) {
                    int id = 0x80000001 + i;
                    p.request(delivery(keys[i], i + 1), id);
                    Ack a = ack(p.reply(), id);
                    assertEquals(want[i], a.getStatus(), keys[i]);
                    assertEquals(reasons[i], a.getReason(), keys[i]);
                    assertEquals("room", a.getStream());
                    assertEquals("1700000000000-" + (i + 1), a.getEntryId());
                }
            }
        }
    }

    @Test
    void runsHandlersOnTheExecutorGivenAndLeavesItToItsOwner() throws Exception {
        ExecutorService mine = Executors.newCachedThreadPool(r -> new Thread(r, "mine"));
        AtomicReference<String> where = new AtomicReference<>();
        AtomicReference<Worker> self = new AtomicReference<>();
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            Running r = serve(px.endpoint(), 2, mine, d -> {
                where.set(Thread.currentThread().getName());
                if (d.key().equals("close-me"))
                    self.get().close(); // from a thread of the caller's executor: must not wait for itself
            });
            self.set(r.worker());
            try (FakeIdemproxy.Peer p = px.accept()) {
                p.request(delivery("k", 1), 0x80000001);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000001).getStatus());
                assertEquals("mine", where.get());
                p.request(delivery("close-me", 1), 0x80000002);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000002).getStatus());
                r.thread().join(5000);
                assertFalse(r.thread().isAlive(), "serve() returned");
            }
        }
        assertFalse(mine.isShutdown(), "the executor is still its owner's");
        mine.shutdown();
    }

    @Test
    void aDeliveryTheExecutorRejectsIsAnsweredRetry() throws Exception {
        Executor full = task -> {
            throw new RejectedExecutionException("queue full");
        };
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 1, full, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                for (int id = 0x80000001; id <= 0x80000002; id++) { // and the worker goes on
                    p.request(delivery("k", 1), id);
                    Ack a = ack(p.reply(), id);
                    assertEquals(Status.RETRY, a.getStatus());
                    assertEquals("the worker's executor rejected it", a.getReason());
                }
            }
        }
    }

    @Test
    void aHandlersFailureGoesToTheSystemLogger() {
        List<LogRecord> records = new ArrayList<>();
        java.util.logging.Handler collect = new java.util.logging.Handler() {
            @Override public void publish(LogRecord r) { records.add(r); }
            @Override public void flush() { }
            @Override public void close() { }
        };
        Logger log = Logger.getLogger("dev.idemproxy.worker");
        log.addHandler(collect);
        try {
            Ack a = Worker.answer(delivery("retry-me", 3), WorkerTest::handleByKey);
            assertEquals(Status.RETRY, a.getStatus());
        } finally {
            log.removeHandler(collect);
        }
        assertEquals(1, records.size());
        LogRecord r = records.get(0);
        assertEquals(Level.WARNING, r.getLevel());
        assertEquals("room 1700000000000-3 key=retry-me attempt=3: the handler failed, answered RETRY",
                r.getMessage());
        assertTrue(r.getThrown() instanceof IOException && r.getThrown().getMessage().equals("database unavailable"));
    }

    @Test
    void decodesEveryDeliveryField() {
        byte[] body = dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("s").setEntryId("1-2").setKey("k")
                .addFields(dev.idemproxy.worker.proto.Field.newBuilder().setName("a").setValue(ByteString.copyFromUtf8("1")))
                .addFields(dev.idemproxy.worker.proto.Field.newBuilder().setName("bin").setValue(ByteString.copyFrom(new byte[] {0, -1})))
                .addFields(dev.idemproxy.worker.proto.Field.newBuilder().setName("a").setValue(ByteString.copyFromUtf8("2")))
                .setPayload(ByteString.copyFromUtf8("héllo")).setAttempt(-1).setFencingToken(-1L).setLock("room:7")
                .setDeadlineUnixMs(4_102_444_800_123L).build().toByteArray();
        AtomicReference<Delivery> got = new AtomicReference<>();
        assertEquals(Status.ACK, Worker.answer(body, got::set).getStatus());
        Delivery d = got.get();
        assertEquals(List.of("s", "1-2", "k"), List.of(d.stream(), d.entryId(), d.key()));
        assertEquals(List.of("a", "bin", "a"), d.fields().stream().map(Delivery.Field::name).toList());
        assertArrayEquals(new byte[] {0, -1}, d.fields().get(1).value());
        assertEquals("1", new String(d.field("a").orElseThrow(), StandardCharsets.UTF_8));
        assertTrue(d.field("missing").isEmpty());
        assertEquals("héllo", d.payloadText());
        assertEquals(4294967295L, Integer.toUnsignedLong(d.attempt()));         // uint32 max
        assertEquals("18446744073709551615", Long.toUnsignedString(d.fencingToken())); // uint64 max
        assertEquals("room:7", d.lock());
        assertEquals(4_102_444_800_123L, d.deadlineUnixMs());
    }

    @Test
    void exposesTheTraceContextAndTheTimeRemaining() {
        byte[] body = dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("s").setEntryId("1-2").setKey("k")
                .setTraceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").setTracestate("v=1")
                .setDeadlineUnixMs(System.currentTimeMillis() + 60_000).build().toByteArray();
        AtomicReference<Delivery> got = new AtomicReference<>();
        AtomicReference<java.time.Duration> left = new AtomicReference<>();
        assertEquals(Status.ACK, Worker.answer(body, d -> { got.set(d); left.set(d.remaining()); }).getStatus());
        assertEquals("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", got.get().traceparent());
        assertEquals("v=1", got.get().tracestate());
        assertTrue(left.get().toMillis() > 50_000 && left.get().toMillis() <= 60_000, left.get().toString());
        Worker.answer(delivery("k", 1), got::set);
        assertEquals("", got.get().traceparent());
        assertEquals("", got.get().tracestate());
    }

    @Test
    void retryAfterIsSentAsRetryAfterMs() {
        Ack a = Worker.answer(delivery("k", 1), d -> { throw new RetryAfter(java.time.Duration.ofSeconds(30)); });
        assertEquals(Status.RETRY, a.getStatus());
        assertEquals(30_000, a.getRetryAfterMs());
        assertEquals("1700000000000-1", a.getEntryId());
        a = Worker.answer(delivery("k", 1), d -> { throw new RetryAfter(java.time.Duration.ofDays(3)); });
        assertEquals(3_600_000, a.getRetryAfterMs(), "capped at idemproxy's hour");
        a = Worker.answer(delivery("k", 1), d -> { throw new IOException("plain"); });
        assertEquals(0, a.getRetryAfterMs(), "a plain RETRY takes the backoff");
    }

    @Test
    void aHandlerPastItsDeadlineIsInterrupted() throws Exception {
        byte[] body = dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("s").setEntryId("1-2").setKey("k")
                .setDeadlineUnixMs(System.currentTimeMillis() + 300).build().toByteArray();
        AtomicReference<Throwable> seen = new AtomicReference<>();
        long t0 = System.nanoTime();
        Ack a = Worker.answer(body, d -> {
            try {
                Thread.sleep(10_000);
            } catch (InterruptedException e) {
                seen.set(e);
                throw e;
            }
        });
        assertTrue(seen.get() instanceof InterruptedException, "interrupted at the deadline");
        assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(5), "long before its sleep ended");
        assertEquals(Status.RETRY, a.getStatus());
        assertFalse(Thread.currentThread().isInterrupted(), "no interrupt left behind for the next delivery");
        // a handler done in time leaves no interrupt behind either
        body = dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("s").setEntryId("1-3").setKey("k")
                .setDeadlineUnixMs(System.currentTimeMillis() + 200).build().toByteArray();
        assertEquals(Status.ACK, Worker.answer(body, d -> { }).getStatus());
        Thread.sleep(400);
        assertFalse(Thread.currentThread().isInterrupted());
    }

    @Test
    void anUndecodableDeliveryIsRetried() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                p.request(new byte[] {(byte) 0xff, (byte) 0xff, 0x01}, 0x80000042);
                Ack a = ack(p.reply(), 0x80000042);
                assertEquals(Status.RETRY, a.getStatus());
                assertTrue(a.getReason().startsWith("undecodable delivery"), a.getReason());
                assertEquals("", a.getEntryId());
                // the connection still works
                p.request(delivery("ok", 1), 0x80000043);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000043).getStatus());
            }
        }
    }

    @Test
    void echoesAMultiWordBacktraceAndSkipsRequestsWithoutId() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.tcp()) {
            serve(px.endpoint(), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                p.request(new byte[0], 0x00000001, 0x00000002);       // no word with the top bit: ignored
                p.request(delivery("ok", 1), 0x00000005, 0x80000009); // a hop, then the request id
                Ack a = ack(p.reply(), 0x00000005, 0x80000009);
                assertEquals(Status.ACK, a.getStatus());
                assertEquals("1700000000000-1", a.getEntryId());
            }
        }
    }

    @Test
    void aBacktraceLongerThanEightHopsIsIgnored() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.tcp()) {
            serve(px.endpoint(), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                // 8 hops and then the request id: past the SP limit of 8 words, as nanomsg and NNG drop it
                p.request(delivery("too-far", 1), 1, 2, 3, 4, 5, 6, 7, 8, 0x80000009);
                p.request(delivery("ok", 1), 0x8000000a);
                Ack a = ack(p.reply(), 0x8000000a);
                assertEquals(Status.ACK, a.getStatus());
            }
        }
    }

    @Test
    void aPeerHeaderWithNonZeroReservedBytesIsHungUpOn() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept(new byte[] {0x00, 0x53, 0x50, 0x00, 0x00, 0x30, 0x00, 0x01})) {
                assertTrue(p.closedByWorker());
            }
        }
    }

    /** Reads 'n' replies, in whatever order they come, by request id. */
    static Map<Integer, Ack> replies(FakeIdemproxy.Peer p, int n) throws IOException {
        Map<Integer, Ack> got = new HashMap<>();
        for (int i = 0; i < n; i++) {
            ByteBuffer b = ByteBuffer.wrap(p.reply());
            int id = b.getInt();
            got.put(id, Ack.parseFrom(b));
        }
        return got;
    }

    @Test
    void concurrentHandlersOverlapOnOneConnection() throws Exception {
        ConcurrentHashMap<String, long[]> spans = new ConcurrentHashMap<>();
        AtomicInteger inHandler = new AtomicInteger(), most = new AtomicInteger();
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 2, d -> {
                most.accumulateAndGet(inHandler.incrementAndGet(), Math::max);
                long start = System.nanoTime();
                Thread.sleep(300);
                spans.put(d.key(), new long[] {start, System.nanoTime()});
                inHandler.decrementAndGet();
            });
            try (FakeIdemproxy.Peer p = px.accept()) {
                for (int i = 1; i <= 3; i++)
                    p.request(delivery("slow-" + i, 1), 0x80000000 | i);
                Map<Integer, Ack> got = replies(p, 3);
                for (int i = 1; i <= 3; i++)
                    assertEquals(Status.ACK, got.get(0x80000000 | i).getStatus());
            }
        }
        long[] x = spans.get("slow-1"), y = spans.get("slow-2"), z = spans.get("slow-3");
        assertTrue(x[0] < y[1] && y[0] < x[1], "the first two handlers ran at the same time");
        assertTrue(z[0] >= Math.min(x[1], y[1]), "the third waited for a free handler");
        assertEquals(2, most.get(), "at most 'concurrency' handlers at a time");
    }

    @Test
    void saysItIsStillDialingAndWhereUntilConnected() throws Exception {
        List<LogRecord> records = java.util.Collections.synchronizedList(new ArrayList<>());
        java.util.logging.Handler collect = new java.util.logging.Handler() {
            @Override public void publish(LogRecord r) { records.add(r); }
            @Override public void flush() { }
            @Override public void close() { }
        };
        Logger log = Logger.getLogger("dev.idemproxy.worker");
        log.addHandler(collect);
        Path sock = tmp.resolve("typo.sock");
        String want = "still dialing ipc://" + sock + ": no connection to idemproxy for ";
        java.util.function.Supplier<List<String>> dialing = () -> {
            synchronized (records) {
                return records.stream().filter(r -> r.getLevel() == Level.WARNING)
                        .map(r -> java.text.MessageFormat.format(r.getMessage(), r.getParameters()))
                        .filter(m -> m.startsWith(want)).toList();
            }
        };
        try {
            Worker w = new Worker(1024);
            w.dialLogMs(300);
            Thread t = new Thread(() -> {
                try {
                    w.serve("ipc://" + sock, 1, null, d -> { });
                } catch (InterruptedException e) {
                    // stopped
                }
            });
            t.start();
            running.add(new Running(w, t));
            long deadline = System.nanoTime() + 10_000_000_000L;
            while (dialing.get().size() < 2 && System.nanoTime() < deadline) // the first, one 6 x 300 ms later
                Thread.sleep(50);
            assertTrue(dialing.get().size() >= 2, records.toString());
            try (FakeIdemproxy px = FakeIdemproxy.ipc(sock); FakeIdemproxy.Peer p = px.accept()) {
                p.request(delivery("k", 1), 0x80000001);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000001).getStatus());
                int n = dialing.get().size();
                Thread.sleep(2500); // connected: quiet
                assertEquals(n, dialing.get().size());
            }
        } finally {
            log.removeHandler(collect);
        }
    }

    @Test
    void dialsUntilIdemproxyBindsAndAgainAfterItRestarts() throws Exception {
        Path sock = tmp.resolve("later.sock");
        serve("ipc://" + sock, 1, d -> { });
        Thread.sleep(400); // the worker is dialing a socket that does not exist yet
        for (int round = 0; round < 2; round++) {
            try (FakeIdemproxy px = FakeIdemproxy.ipc(sock); FakeIdemproxy.Peer p = px.accept()) {
                p.request(delivery("k" + round, 1), 0x80000001);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000001).getStatus());
            }
            java.nio.file.Files.delete(sock); // idemproxy goes away
        }
    }

    @Test
    void closeFinishesTheDeliveryInHand() throws Exception {
        CountDownLatch started = new CountDownLatch(1);
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            Running r = serve(px.endpoint(), 2, d -> {
                started.countDown();
                Thread.sleep(300);
            });
            try (FakeIdemproxy.Peer p = px.accept()) {
                p.request(delivery("in-hand", 1), 0x80000007);
                assertTrue(started.await(5, TimeUnit.SECONDS));
                long t0 = System.nanoTime();
                r.worker().close(); // waits for the handler, whose answer still goes out
                assertTrue(System.nanoTime() - t0 > TimeUnit.MILLISECONDS.toNanos(100), "close() waited");
                assertEquals(Status.ACK, ack(p.reply(), 0x80000007).getStatus());
                assertTrue(p.closedByWorker(), "then the connection is closed");
                r.thread().join(5000);
                assertFalse(r.thread().isAlive(), "serve() returned");
            }
        }
    }

    @Test
    void aMessageOverTheLimitDropsTheConnection() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.ipc(tmp.resolve("px.sock"))) {
            serve(px.endpoint(), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                p.announce(1 << 20); // the worker's limit is 1024 + backtrace
                assertTrue(p.closedByWorker());
            }
            try (FakeIdemproxy.Peer p = px.accept()) { // it dials again
                p.request(delivery("ok", 1), 0x80000001);
                assertEquals(Status.ACK, ack(p.reply(), 0x80000001).getStatus());
            }
        }
    }

    @Test
    void closeStopsAnIdleWorkerAndOneStillDialing() throws Exception {
        try (FakeIdemproxy px = FakeIdemproxy.tcp()) {
            Running idle = serve(px.endpoint(), 1, d -> { });
            Running dialing = serve("ipc://" + tmp.resolve("nobody.sock"), 1, d -> { });
            try (FakeIdemproxy.Peer p = px.accept()) {
                idle.worker().close();
                assertTrue(p.closedByWorker());
            }
            dialing.worker().close();
            for (Running r : List.of(idle, dialing)) {
                r.thread().join(5000);
                assertFalse(r.thread().isAlive(), "serve() returned");
            }
        }
    }

    @Test
    void refusesEndpointsItCannotDial() {
        Worker w = new Worker();
        for (String ep : Arrays.asList("inproc://x", "tcp://localhost", "tcp://host:port", "ipc://", "/tmp/x.sock"))
            assertThrows(IllegalArgumentException.class, () -> w.serve(ep, 1, d -> { }), ep);
        assertThrows(IllegalArgumentException.class, () -> w.serve("ipc:///tmp/x.sock", 0, d -> { }));
    }
}
