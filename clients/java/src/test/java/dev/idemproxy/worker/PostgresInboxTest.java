package dev.idemproxy.worker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.idemproxy.worker.proto.Ack;
import dev.idemproxy.worker.proto.Ack.Status;
import dev.idemproxy.worker.postgres.Inbox;
import dev.idemproxy.worker.postgres.Inbox.Outcome;
import java.io.InputStream;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * dev.idemproxy.worker.postgres.Inbox against the real PostgreSQL of IDEMPROXY_TEST_PG
 * (tests/with-postgres), each test in a schema of its own holding the jar's
 * 001_idemproxy_inbox.sql and an effects table; the answers are what Worker sends.
 */
@Timeout(60)
class PostgresInboxTest {
    private static final String PG = System.getenv("IDEMPROXY_TEST_PG");

    private PGSimpleDataSource ds;
    private String schema;
    private final AtomicInteger ran = new AtomicInteger();

    /** The handler of the tests: counts its runs and writes the key's effect. */
    private final Inbox.TxHandler effect = (d, tx) -> {
        ran.incrementAndGet();
        try (PreparedStatement st = tx.prepareStatement("INSERT INTO effects (key, token) VALUES (?, ?)")) {
            st.setString(1, d.key());
            st.setLong(2, d.fencingToken());
            st.executeUpdate();
        }
    };

    @BeforeEach
    void schema() throws Exception {
        assumeTrue(PG != null && !PG.isEmpty(),
                "IDEMPROXY_TEST_PG is unset: no PostgreSQL to test the inbox against (tests/with-postgres sets it)");
        URI u = URI.create(PG);
        ds = new PGSimpleDataSource();
        ds.setServerNames(new String[] {u.getHost()});
        ds.setPortNumbers(new int[] {u.getPort() > 0 ? u.getPort() : 5432});
        ds.setDatabaseName(u.getPath().replaceFirst("^/", ""));
        if (u.getUserInfo() != null) {
            String[] who = u.getUserInfo().split(":", 2);
            ds.setUser(who[0]);
            if (who.length > 1)
                ds.setPassword(who[1]);
        }
        schema = "inbox_" + UUID.randomUUID().toString().replace("-", "");
        exec("CREATE SCHEMA " + schema);
        ds.setCurrentSchema(schema);
        try (InputStream in = Inbox.class.getResourceAsStream("001_idemproxy_inbox.sql")) {
            exec(new String(in.readAllBytes(), StandardCharsets.UTF_8));
        }
        exec("CREATE TABLE effects (key text PRIMARY KEY, token bigint NOT NULL)");
    }

    @AfterEach
    void drop() throws SQLException {
        if (schema != null)
            exec("DROP SCHEMA " + schema + " CASCADE");
    }

    private void exec(String sql) throws SQLException {
        try (Connection c = ds.getConnection(); Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    /** The rows of a query, each row's columns joined by "|". */
    private List<String> rows(String sql) throws SQLException {
        try (Connection c = ds.getConnection(); Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            List<String> out = new java.util.ArrayList<>();
            int n = rs.getMetaData().getColumnCount();
            while (rs.next()) {
                StringBuilder row = new StringBuilder(rs.getString(1));
                for (int i = 2; i <= n; i++)
                    row.append('|').append(rs.getString(i));
                out.add(row.toString());
            }
            return out;
        }
    }

    private static dev.idemproxy.worker.proto.Delivery delivery(String key, String lock, long token) {
        return dev.idemproxy.worker.proto.Delivery.newBuilder().setStream("orders").setEntryId("1-" + token)
                .setKey(key).setAttempt(1).setFencingToken(token).setLock(lock).build();
    }

    /** Worker's answer to the delivery through Inbox.handler(h). */
    private Ack answer(String key, String lock, long token, Inbox.TxHandler h) {
        return Worker.answer(delivery(key, lock, token).toByteArray(), new Inbox(ds).handler(h));
    }

    @Test
    void aNewKeyRunsTheHandlerAndCommitsItsWriteWithTheInboxRow() throws Exception {
        Ack a = answer("k1", "k1", 100, effect);
        assertEquals(Status.ACK, a.getStatus(), a.getReason());
        assertEquals(1, ran.get());
        assertEquals(List.of("k1|100"), rows("SELECT key, token FROM effects"));
        assertEquals(List.of("k1|orders|1-100|100"), rows("SELECT key, stream, entry_id, token FROM idemproxy_inbox"));
        assertEquals(List.of("k1|100"), rows("SELECT lock, token FROM idemproxy_fence"));
    }

    @Test
    void aKeyAlreadyInTheInboxIsAnsweredAckWithoutRunningTheHandler() throws Exception {
        assertEquals(Status.ACK, answer("k1", "k1", 100, effect).getStatus());
        // Redis forgot the done mark: the key comes again, under a newer token
        Ack a = answer("k1", "k1", 200, (d, tx) -> {
            effect.handle(d, tx);
            throw new AssertionError("the handler ran for a done key");
        });
        assertEquals(Status.ACK, a.getStatus(), a.getReason());
        assertEquals(1, ran.get());
        assertEquals(List.of("k1|100"), rows("SELECT key, token FROM effects"));
        assertEquals(List.of("k1|100"), rows("SELECT key, token FROM idemproxy_inbox"));
        assertEquals(List.of("k1|100"), rows("SELECT lock, token FROM idemproxy_fence"));
    }

    @Test
    void aStaleTokenIsRolledBackAndAnsweredRetry() throws Exception {
        // the holder that took over (token 200, another key on the same lock_key) wrote first
        assertEquals(Status.ACK, answer("seat-2", "room:1", 200, effect).getStatus());
        Ack a = answer("seat-1", "room:1", 100, effect);
        assertEquals(Status.RETRY, a.getStatus());
        assertEquals("stale fencing token", a.getReason());
        assertEquals(1, ran.get()); // refused before the handler: nothing of it ran
        assertEquals(List.of("seat-2|200"), rows("SELECT key, token FROM effects"));
        assertEquals(List.of("seat-2"), rows("SELECT key FROM idemproxy_inbox"));
        assertEquals(List.of("room:1|200"), rows("SELECT lock, token FROM idemproxy_fence"));
        // the same holder (the same token) writes again: accepted
        assertEquals(Status.ACK, answer("seat-3", "room:1", 200, effect).getStatus());
        assertEquals(List.of("seat-2|200", "seat-3|200"), rows("SELECT key, token FROM effects ORDER BY key"));
        assertEquals(List.of("room:1|200"), rows("SELECT lock, token FROM idemproxy_fence"));
    }

    @Test
    void aFailingHandlerRollsEverythingBackAndIsAnsweredRetry() throws Exception {
        Ack a = answer("k1", "k1", 100, (d, tx) -> {
            effect.handle(d, tx);
            throw new IllegalStateException("payment service down");
        });
        assertEquals(Status.RETRY, a.getStatus());
        assertEquals("payment service down", a.getReason());
        assertEquals(1, ran.get());
        assertEquals(List.of(), rows("SELECT key FROM effects"));
        assertEquals(List.of(), rows("SELECT key FROM idemproxy_inbox"));
        assertEquals(List.of(), rows("SELECT lock FROM idemproxy_fence"));
        // the redelivery runs it
        assertEquals(Status.ACK, answer("k1", "k1", 101, effect).getStatus());
        assertEquals(List.of("k1|101"), rows("SELECT key, token FROM effects"));
    }

    @Test
    void aHandlerThatDropsRollsBackAndIsAnsweredDrop() throws Exception {
        Ack a = answer("k1", "k1", 100, (d, tx) -> {
            effect.handle(d, tx);
            throw new Drop("no such order");
        });
        assertEquals(Status.DROP, a.getStatus());
        assertEquals("no such order", a.getReason());
        assertEquals(List.of(), rows("SELECT key FROM effects"));
        assertEquals(List.of(), rows("SELECT key FROM idemproxy_inbox"));
    }

    @Test
    void aFailingCommitIsAnsweredRetry() throws Exception {
        exec("CREATE TABLE checked (id int, CONSTRAINT once UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)");
        Ack a = answer("k1", "k1", 100, (d, tx) -> {
            effect.handle(d, tx);
            try (Statement st = tx.createStatement()) {
                st.executeUpdate("INSERT INTO checked VALUES (1), (1)"); // refused at COMMIT
            }
        });
        assertEquals(Status.RETRY, a.getStatus());
        assertEquals(List.of(), rows("SELECT key FROM effects"));
        assertEquals(List.of(), rows("SELECT key FROM idemproxy_inbox"));
    }

    @Test
    void tokenZeroUsesTheInboxAloneAndLeavesTheFenceUntouched() throws Exception {
        assertEquals(Status.ACK, answer("k1", "", 0, effect).getStatus());
        assertEquals(Status.ACK, answer("k1", "", 0, effect).getStatus());
        assertEquals(1, ran.get());
        assertEquals(List.of("k1|0"), rows("SELECT key, token FROM effects"));
        assertEquals(List.of("k1|0"), rows("SELECT key, token FROM idemproxy_inbox"));
        assertEquals(List.of(), rows("SELECT lock FROM idemproxy_fence"));
    }

    @Test
    void twoConcurrentHoldersOfOneKeyRunTheHandlerOnce() throws Exception {
        CountDownLatch inFirst = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        Inbox.TxHandler slow = (d, tx) -> {
            effect.handle(d, tx);
            inFirst.countDown();
            if (!release.await(50, TimeUnit.SECONDS))
                throw new IllegalStateException("never released");
        };
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            Future<Ack> first = pool.submit(() -> answer("k1", "k1", 100, slow));
            assertEquals(true, inFirst.await(30, TimeUnit.SECONDS), "the first holder's handler never ran");
            Future<Ack> second = pool.submit(() -> answer("k1", "k1", 101, slow));
            // the second holder's inbox INSERT waits for the first's row lock
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
            while (rows("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO idemproxy_inbox%'").isEmpty()) {
                assertEquals(true, System.nanoTime() < until, "the second holder never waited on the inbox row");
                Thread.sleep(20);
            }
            release.countDown();
            Ack a1 = first.get(30, TimeUnit.SECONDS);
            Ack a2 = second.get(30, TimeUnit.SECONDS);
            assertEquals(List.of(Status.ACK, Status.ACK), List.of(a1.getStatus(), a2.getStatus()), a1.getReason() + a2.getReason());
        } finally {
            release.countDown();
            pool.shutdownNow();
        }
        assertEquals(1, ran.get());
        assertEquals(List.of("k1|100"), rows("SELECT key, token FROM effects"));
        assertEquals(List.of("k1|100"), rows("SELECT key, token FROM idemproxy_inbox"));
    }

    @Test
    void claimRunsTheStepsOnTheCallersTransaction() throws Exception {
        try (Connection tx = ds.getConnection()) {
            tx.setAutoCommit(false);
            assertEquals(Outcome.RUN, Inbox.claim(tx, d("k1", "room:1", 200)));
            tx.commit();
            assertEquals(Outcome.DONE, Inbox.claim(tx, d("k1", "room:1", 300)));
            tx.rollback();
            assertEquals(Outcome.STALE, Inbox.claim(tx, d("k2", "room:1", 100)));
            tx.rollback();
            assertEquals(Outcome.RUN, Inbox.claim(tx, d("k3", "room:1", 200)));
            tx.commit();
            // a token without a lock (a daemon older than Delivery.lock) fences the key
            assertEquals(Outcome.RUN, Inbox.claim(tx, d("k4", "", 50)));
            tx.commit();
        }
        assertEquals(List.of("k1|200", "k3|200", "k4|50"), rows("SELECT key, token FROM idemproxy_inbox ORDER BY key"));
        assertEquals(List.of("k4|50", "room:1|200"), rows("SELECT lock, token FROM idemproxy_fence ORDER BY lock"));
    }

    private static Delivery d(String key, String lock, long token) {
        return new Delivery("orders", "1-1", key, List.of(), new byte[0], 1, token, lock, 0, "", "");
    }
}
