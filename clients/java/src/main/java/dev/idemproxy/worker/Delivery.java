package dev.idemproxy.worker;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.temporal.ChronoUnit;
import java.util.List;
import java.util.Optional;

/**
 * One event handed over by idemproxy ({@code idemproxy.v1.Delivery}).
 *
 * @param stream         the stream key
 * @param entryId        the Redis entry id, "1700000000000-0"
 * @param key            the rendered dedup key (without prefix)
 * @param fields         the entry's fields in stream order, except the payload field
 * @param payload        the payload field's value, or empty
 * @param attempt        1 on the first delivery (an unsigned 32-bit number on the wire)
 * @param fencingToken   strictly increasing per lock, 0 when fencing is off; an unsigned
 *                       64-bit number: compare with {@link Long#compareUnsigned}
 * @param lock           the lock fencing_token is for: lock_key's rendered text, else the
 *                       key; empty when fencing is off (the fence row's name in
 *                       docs/database.md)
 * @param deadlineUnixMs an answer after this (epoch milliseconds) is too late; 0: none
 * @param traceparent    the W3C trace context of idemproxy's delivery span (protocol 1.1),
 *                       or empty: the parent of the handler's span
 * @param tracestate     the W3C tracestate that goes with it, or empty
 */
public record Delivery(String stream, String entryId, String key, List<Field> fields,
                       byte[] payload, int attempt, long fencingToken, String lock, long deadlineUnixMs,
                       String traceparent, String tracestate) {

    /** One stream field: a name and its binary value. */
    public record Field(String name, byte[] value) {
        /** The value decoded as UTF-8. */
        public String text() {
            return new String(value, StandardCharsets.UTF_8);
        }
    }

    public Delivery {
        fields = List.copyOf(fields);
    }

    /**
     * The time left until {@link #deadlineUnixMs()}, zero once it has passed (a very long
     * duration when there is no deadline). At the deadline the handler's thread is interrupted.
     */
    public Duration remaining() {
        if (deadlineUnixMs == 0)
            return ChronoUnit.FOREVER.getDuration();
        return Duration.ofMillis(Math.max(0, deadlineUnixMs - System.currentTimeMillis()));
    }

    /** The payload decoded as UTF-8 (usually JSON). */
    public String payloadText() {
        return new String(payload, StandardCharsets.UTF_8);
    }

    /** The value of the first field called {@code name}, if there is one. */
    public Optional<byte[]> field(String name) {
        return fields.stream().filter(f -> f.name().equals(name)).map(Field::value).findFirst();
    }

    @Override
    public String toString() {
        return "Delivery[stream=" + stream + ", entryId=" + entryId + ", key=" + key
                + ", fields=" + fields.size() + ", payload=" + payload.length + " bytes, attempt="
                + Integer.toUnsignedString(attempt) + ", fencingToken="
                + Long.toUnsignedString(fencingToken) + ", lock=" + lock + ", deadlineUnixMs=" + deadlineUnixMs + ", traceparent=" + traceparent + "]";
    }
}
