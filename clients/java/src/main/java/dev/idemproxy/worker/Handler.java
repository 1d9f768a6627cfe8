package dev.idemproxy.worker;

/**
 * Handles one delivery. How it ends is the answer idemproxy gets:
 * <ul>
 *   <li>a normal return: ACK (done; the key is marked done and the entry acked);</li>
 *   <li>{@code throw new Drop(reason)}: DROP (never: the entry is dead-lettered with the reason);</li>
 *   <li>{@code throw new RetryAfter(Duration.ofSeconds(30))}: RETRY, redelivered no earlier
 *       than that (at most an hour; it counts toward {@code max_deliveries});</li>
 *   <li>any other exception (or error): RETRY, with its message as the reason (delivered
 *       again later with attempt + 1, dead-lettered after {@code max_deliveries}).</li>
 * </ul>
 * With a concurrency above 1, {@code handle} runs on several threads at once. A handler
 * still running at the delivery's deadline has its thread interrupted (blocking calls throw
 * {@code InterruptedException}; a loop should check {@code Thread.interrupted()}): its
 * answer would come too late, and idemproxy delivers the entry again.
 */
@FunctionalInterface
public interface Handler {
    void handle(Delivery delivery) throws Exception;
}
