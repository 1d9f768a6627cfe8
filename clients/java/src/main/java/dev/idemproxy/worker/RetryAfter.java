package dev.idemproxy.worker;

import java.time.Duration;
import java.util.Objects;

/**
 * Thrown by a {@link Handler} to answer RETRY no earlier than {@code after}: idemproxy
 * redelivers the entry after that wait (at most an hour) instead of its backoff, and the
 * attempt counts toward {@code max_deliveries} as any RETRY. Sent as {@code Ack.retry_after_ms}.
 */
public class RetryAfter extends RuntimeException {
    private static final long serialVersionUID = 1L;
    /** idemproxy caps the wait at an hour; a longer one is sent as an hour. */
    static final long MAX_MS = 3_600_000;

    private final Duration after;

    public RetryAfter(Duration after) {
        this(after, "retry after " + after);
    }

    public RetryAfter(Duration after, String reason) {
        super(reason, null, false, false);
        this.after = Objects.requireNonNull(after, "after");
    }

    public Duration after() {
        return after;
    }

    /** The wait in whole milliseconds, 0 to {@link #MAX_MS}. */
    int millis() {
        if (after.isNegative())
            return 0;
        return (int) Math.min(after.compareTo(Duration.ofMillis(MAX_MS)) > 0 ? MAX_MS : after.toMillis(), MAX_MS);
    }
}
