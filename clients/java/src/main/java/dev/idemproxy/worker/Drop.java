package dev.idemproxy.worker;

/**
 * Thrown by a {@link Handler} to answer DROP: the delivery must never be retried, and
 * idemproxy dead-letters it with {@code reason} (its {@code idemproxy-reason} field).
 * An unchecked exception, so it can be thrown from anywhere the handler calls.
 */
public class Drop extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public Drop(String reason) {
        super(reason, null, false, false);
    }

    public String reason() {
        return getMessage();
    }
}
