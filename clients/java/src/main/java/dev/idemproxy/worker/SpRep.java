package dev.idemproxy.worker;

import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ProtocolException;
import java.net.SocketAddress;
import java.net.StandardProtocolFamily;
import java.net.StandardSocketOptions;
import java.net.UnixDomainSocketAddress;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.util.Arrays;

/**
 * One connection of a nanomsg SP REP socket, over the JDK's own sockets (package-private).
 *
 * <p>The wire protocol is the one nanomsg, NNG and mangos share (the SP-over-TCP and
 * SP-over-IPC RFCs): after connecting, each side sends {@code 00 'S' 'P' 00}, its 16-bit
 * protocol id (REP 49; the peer must be REQ 48) and {@code 00 00}. Then every message is a
 * frame: a 64-bit big-endian length and the body on tcp, the same preceded by the type byte
 * {@code 0x01} on ipc. A request body starts with its backtrace, 4-byte big-endian words of
 * which the last has the top bit set (idemproxy's raw REQ sends just the request id; a
 * request whose id is not within {@link #MAX_HOPS} words is skipped, and a header whose
 * reserved bytes are not zero is refused, as nanomsg and NNG do); the
 * reply is the same backtrace followed by the answer, which routes it back to the request.
 * One thread reads; any thread may send, and replies may go out in any order (the request id
 * in the backtrace matches them up), as with NNG's REP contexts.
 */
final class SpRep implements AutoCloseable {
    static final int PROTO_REQ = 48;
    static final int PROTO_REP = 49;
    /** Backtrace words accepted in a request: NNG's default max TTL, nanomsg's too (and the other clients'). */
    static final int MAX_HOPS = 8;
    /** A peer that sends no SP header in this time is hung up on (NNG's value; see README). */
    static final long HANDSHAKE_TIMEOUT_MS = 10_000;
    private static final java.util.Timer TIMER = new java.util.Timer("idemproxy-handshake", true);

    /** A request as received: its backtrace, to echo in front of the reply, and its body. */
    record Request(byte[] backtrace, byte[] body) {}

    private final SocketChannel ch;
    private final SocketAddress address;
    private final boolean ipc;
    private final int maxBytes;
    private volatile boolean lost;
    private volatile long lastSend = Long.MIN_VALUE; // System.nanoTime() after the last reply went out

    /**
     * How long the last reply is given before the connection closes. idemproxy's nanomsg
     * 1.1.5 drops a reply it has read but not yet handed to idemproxy when the connection
     * then closes, which a close right after the reply (with deliveries still unread here,
     * a reset) makes near certain; the other clients wait the same 100 ms.
     */
    static final long LINGER_MS = 100;

    /** Opens an unconnected channel, so that {@link #close()} can abort a pending dial. */
    SpRep(String endpoint, int maxBytes) throws IOException {
        this.address = address(endpoint);
        this.ipc = address instanceof UnixDomainSocketAddress;
        this.ch = ipc ? SocketChannel.open(StandardProtocolFamily.UNIX) : SocketChannel.open();
        this.maxBytes = maxBytes;
    }

    /** "ipc:///path" or "tcp://host:port" ("tcp://[::1]:port"); anything else is refused. */
    static SocketAddress address(String endpoint) {
        if (endpoint.startsWith("ipc://") && endpoint.length() > 6)
            return UnixDomainSocketAddress.of(endpoint.substring(6));
        if (endpoint.startsWith("tcp://")) {
            String hostPort = endpoint.substring(6);
            int colon = hostPort.lastIndexOf(':');
            if (colon > 0) {
                String host = hostPort.substring(0, colon).replaceAll("^\\[(.*)]$", "$1");
                try {
                    return new InetSocketAddress(host, Integer.parseInt(hostPort.substring(colon + 1)));
                } catch (IllegalArgumentException e) {
                    // a bad port: fall through to the common message
                }
            }
        }
        throw new IllegalArgumentException("unsupported endpoint \"" + endpoint
                + "\": expected ipc:///path or tcp://host:port");
    }

    /** Connects and exchanges the SP headers; fails if the peer is not a REQ socket. */
    void connect() throws IOException {
        if (address instanceof InetSocketAddress a && a.isUnresolved())
            throw new UnknownHostException(a.getHostString());
        ch.connect(address);
        if (!ipc)
            ch.setOption(StandardSocketOptions.TCP_NODELAY, true);
        writeAll(ByteBuffer.wrap(new byte[] {0, 'S', 'P', 0, 0, PROTO_REP, 0, 0}));
        java.util.TimerTask hangUp = new java.util.TimerTask() {
            @Override
            public void run() {
                abort();
            }
        };
        TIMER.schedule(hangUp, HANDSHAKE_TIMEOUT_MS);
        ByteBuffer peer;
        try {
            peer = readFully(8);
        } catch (IOException e) {
            throw lost ? new ProtocolException("no SP header from the peer in "
                    + HANDSHAKE_TIMEOUT_MS + " ms") : e;
        } finally {
            hangUp.cancel();
        }
        if (peer.getInt(0) != 0x00535000 || peer.getShort(4) != PROTO_REQ || peer.getShort(6) != 0)
            throw new ProtocolException("the peer is not an SP REQ socket: header "
                    + Arrays.toString(peer.array()));
    }

    /**
     * Waits for the next well-formed request; messages without a request id within
     * {@link #MAX_HOPS} backtrace words are skipped.
     */
    Request recv() throws IOException {
        for (;;) {
            ByteBuffer hdr = readFully(ipc ? 9 : 8);
            if (ipc && hdr.get(0) != 1)
                throw new ProtocolException("unexpected ipc frame type " + hdr.get(0));
            long len = hdr.getLong(ipc ? 1 : 0);
            if (len < 0 || len > maxBytes)
                throw new ProtocolException("a message of " + len + " bytes exceeds the limit of "
                        + maxBytes + " bytes");
            byte[] msg = readFully((int) len).array();
            for (int n = 4; n <= msg.length && n <= 4 * MAX_HOPS; n += 4) {
                if ((msg[n - 4] & 0x80) != 0)
                    return new Request(Arrays.copyOf(msg, n), Arrays.copyOfRange(msg, n, msg.length));
            }
        }
    }

    /** Sends 'body' as the reply to the request whose backtrace is 'backtrace'; thread-safe. */
    synchronized void send(byte[] backtrace, byte[] body) throws IOException {
        ByteBuffer hdr = ByteBuffer.allocate(ipc ? 9 : 8);
        if (ipc)
            hdr.put((byte) 1);
        hdr.putLong((long) backtrace.length + body.length).flip();
        writeAll(hdr, ByteBuffer.wrap(backtrace), ByteBuffer.wrap(body));
        lastSend = System.nanoTime();
    }

    /** Makes a recv() in progress read end-of-stream, while replies still go out; aborts a dial. */
    void stopReading() {
        try {
            if (ch.isConnected())
                ch.shutdownInput();
            else
                ch.close();
        } catch (IOException e) {
            // it is going away anyway
        }
    }

    /** Whether the connection is gone: answers to what it brought can no longer be sent. */
    boolean lost() {
        return lost || !ch.isOpen();
    }

    /** Gives the connection up at once: a recv() in progress fails, nothing more is read. */
    void abort() {
        lost = true;
        try {
            ch.close();
        } catch (IOException e) {
            // gone anyway
        }
    }

    /**
     * Waits until the last reply has had {@link #LINGER_MS} to be taken: nanomsg 1.1.5 drops a
     * reply it has read but not handed to idemproxy when the connection then fails, and a
     * close, or our input shut down (idemproxy's next send fails), makes it fail.
     */
    void linger() {
        long sent = lastSend;
        long left = sent == Long.MIN_VALUE || lost() ? 0 : sent + LINGER_MS * 1_000_000 - System.nanoTime();
        if (left > 0) {
            try {
                Thread.sleep(left / 1_000_000, (int) (left % 1_000_000));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Closes the connection, once the last reply has had {@link #LINGER_MS} to be taken. */
    @Override
    public void close() throws IOException {
        linger();
        ch.close();
    }

    private ByteBuffer readFully(int n) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(n);
        while (b.hasRemaining()) {
            if (ch.read(b) < 0) {
                lost = true;
                throw new EOFException("connection closed by idemproxy");
            }
        }
        return b.flip();
    }

    private void writeAll(ByteBuffer... bufs) throws IOException {
        long left = 0;
        for (ByteBuffer b : bufs)
            left += b.remaining();
        while (left > 0)
            left -= ch.write(bufs);
    }
}
