package dev.idemproxy.worker.postgres;

import dev.idemproxy.worker.Delivery;
import dev.idemproxy.worker.Handler;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Objects;
import javax.sql.DataSource;

/**
 * The inbox and the fence of docs/database.md, on plain JDBC: a delivery's effect is
 * written once, and never by a holder whose fencing token has been overtaken. The tables
 * come from {@code dev/idemproxy/worker/postgres/001_idemproxy_inbox.sql} in this jar
 * (apply it once per database). Nothing here needs a driver at compile time: the
 * application brings its PostgreSQL JDBC driver (or pool) and hands over a
 * {@link DataSource}.
 *
 * <pre>{@code
 * Inbox inbox = new Inbox(dataSource);
 * worker.serve(endpoint, 8, inbox.handler((d, tx) -> {
 *     try (PreparedStatement st = tx.prepareStatement("UPDATE seats SET holder = ? WHERE id = ?")) {
 *         ...                 // the writes go in the helper's transaction
 *     }
 * }));
 * }</pre>
 *
 * <p>Each delivery gets a connection of its own and one transaction: the inbox row, the
 * fence (only with a fencing token), then the handler. A key already in the inbox is
 * answered ACK without running the handler; a stale fencing token throws
 * {@link StaleFencingToken} (RETRY, reason {@value #STALE}); a handler's exception rolls
 * everything back and is answered as without the helper ({@code Drop}: DROP, anything
 * else: RETRY), as is a failing commit (RETRY).
 */
public final class Inbox {
    /** The RETRY reason of a delivery whose fencing token was refused. */
    public static final String STALE = "stale fencing token";
    /** Step 1: the key's row; no row inserted means its effect is already committed. */
    public static final String INBOX_SQL = "INSERT INTO idemproxy_inbox (key, stream, entry_id, token) "
            + "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO NOTHING";
    /** Step 2, with a fencing token: no row inserted or updated means a higher token wrote. */
    public static final String FENCE_SQL = "INSERT INTO idemproxy_fence (lock, token) VALUES (?, ?) "
            + "ON CONFLICT (lock) DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token";

    /** What {@link #claim} found: go on and run the handler, or roll back. */
    public enum Outcome {
        /** inbox row written (and the fence passed): run the handler, then commit */
        RUN,
        /** the key's effect is already committed: roll back, answer ACK */
        DONE,
        /** a higher fencing token for the lock has written: roll back, answer RETRY */
        STALE
    }

    /** A handler whose writes go in the helper's transaction {@code tx} (never commit it). */
    @FunctionalInterface
    public interface TxHandler {
        void handle(Delivery delivery, Connection tx) throws Exception;
    }

    /** Where the connections come from: {@code dataSource::getConnection}, a pool, ... */
    @FunctionalInterface
    public interface Connections {
        Connection open() throws SQLException;
    }

    /** Thrown for a stale fencing token: the worker answers RETRY with reason {@value #STALE}. */
    public static final class StaleFencingToken extends RuntimeException {
        private static final long serialVersionUID = 1L;

        public StaleFencingToken() {
            super(STALE, null, false, false);
        }
    }

    private final Connections connections;

    public Inbox(DataSource dataSource) {
        this(Objects.requireNonNull(dataSource, "dataSource")::getConnection);
    }

    public Inbox(Connections connections) {
        this.connections = Objects.requireNonNull(connections, "connections");
    }

    /** A {@link Handler} for {@code Worker.serve} that runs {@code handler} through {@link #run}. */
    public Handler handler(TxHandler handler) {
        Objects.requireNonNull(handler, "handler");
        return d -> run(d, handler);
    }

    /**
     * Runs {@code handler} in a new transaction behind the inbox and the fence, and commits.
     * Returns normally (ACK) when committed or when the key was already done; throws
     * {@link StaleFencingToken}, the handler's exception, or the commit's.
     */
    public void run(Delivery d, TxHandler handler) throws Exception {
        Outcome o;
        try (Connection tx = connections.open()) {
            boolean autoCommit = tx.getAutoCommit();
            tx.setAutoCommit(false);
            try {
                o = claim(tx, d);
                if (o == Outcome.RUN) {
                    handler.handle(d, tx);
                    tx.commit();
                } else {
                    tx.rollback();
                }
            } catch (Throwable e) {
                try {
                    tx.rollback();
                } catch (SQLException r) {
                    e.addSuppressed(r);
                }
                throw e;
            }
            tx.setAutoCommit(autoCommit); // back as it came, for a pool
        }
        if (o == Outcome.STALE)
            throw new StaleFencingToken();
    }

    /**
     * The inbox and fence statements on a transaction the caller owns (auto-commit off): on
     * {@link Outcome#RUN} do the work and commit, otherwise roll back ({@code DONE}: answer
     * ACK, {@code STALE}: answer RETRY). A fencing token of 0 (fencing off) skips the fence.
     * An empty {@link Delivery#lock()} with a token (a daemon older than the lock field)
     * fences the key.
     */
    public static Outcome claim(Connection tx, Delivery d) throws SQLException {
        try (PreparedStatement st = tx.prepareStatement(INBOX_SQL)) {
            st.setString(1, d.key());
            st.setString(2, d.stream());
            st.setString(3, d.entryId());
            st.setLong(4, d.fencingToken());
            if (st.executeUpdate() == 0)
                return Outcome.DONE;
        }
        if (d.fencingToken() == 0)
            return Outcome.RUN;
        try (PreparedStatement st = tx.prepareStatement(FENCE_SQL)) {
            st.setString(1, d.lock().isEmpty() ? d.key() : d.lock());
            st.setLong(2, d.fencingToken());
            return st.executeUpdate() == 0 ? Outcome.STALE : Outcome.RUN;
        }
    }
}
