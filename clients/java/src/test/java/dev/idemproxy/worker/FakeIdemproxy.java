package dev.idemproxy.worker;

import java.io.EOFException;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.util.Arrays;

/**
 * The idemproxy side of the wire, written from the SP RFCs independently of SpRep: it binds
 * like idemproxy's raw REQ socket, and sends requests with an explicit backtrace.
 */
final class FakeIdemproxy implements AutoCloseable {
    private final ServerSocketChannel server;
    private final boolean ipc;
    private final String endpoint;

    private FakeIdemproxy(ServerSocketChannel server, boolean ipc, String endpoint) {
        this.server = server;
        this.ipc = ipc;
        this.endpoint = endpoint;
    }

    static FakeIdemproxy ipc(Path socket) throws IOException {
        ServerSocketChannel s = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        s.bind(UnixDomainSocketAddress.of(socket));
        return new FakeIdemproxy(s, true, "ipc://" + socket);
    }

    static FakeIdemproxy tcp() throws IOException {
        ServerSocketChannel s = ServerSocketChannel.open();
        s.bind(new InetSocketAddress("127.0.0.1", 0));
        return new FakeIdemproxy(s, false, "tcp://127.0.0.1:" + ((InetSocketAddress) s.getLocalAddress()).getPort());
    }

    String endpoint() {
        return endpoint;
    }

    /** Accepts one worker connection and checks its SP header (REP, 49). */
    Peer accept() throws IOException {
        return accept(new byte[] {0x00, 0x53, 0x50, 0x00, 0x00, 0x30, 0x00, 0x00});
    }

    /** Accepts one worker connection, sending it 'header' as our SP header. */
    Peer accept(byte[] header) throws IOException {
        SocketChannel ch = server.accept();
        Peer p = new Peer(ch);
        p.write(header);
        byte[] hdr = p.read(8);
        if (!Arrays.equals(hdr, new byte[] {0x00, 0x53, 0x50, 0x00, 0x00, 0x31, 0x00, 0x00}))
            throw new IOException("not an SP REP header: " + Arrays.toString(hdr));
        return p;
    }

    @Override
    public void close() throws IOException {
        server.close();
    }

    final class Peer implements AutoCloseable {
        final SocketChannel ch;

        Peer(SocketChannel ch) {
            this.ch = ch;
        }

        /** Sends 'body' behind the backtrace 'words' (the last should have the top bit set). */
        void request(byte[] body, int... words) throws IOException {
            ByteBuffer b = ByteBuffer.allocate(9 + 4 * words.length + body.length);
            if (ipc)
                b.put((byte) 1);
            b.putLong(4L * words.length + body.length);
            for (int w : words)
                b.putInt(w);
            b.put(body);
            write(Arrays.copyOf(b.array(), b.position()));
        }

        /** Sends a frame announcing 'len' bytes, and nothing more. */
        void announce(long len) throws IOException {
            ByteBuffer b = ByteBuffer.allocate(9);
            if (ipc)
                b.put((byte) 1);
            b.putLong(len);
            write(Arrays.copyOf(b.array(), b.position()));
        }

        /** Reads one reply frame: its whole body, backtrace included. */
        byte[] reply() throws IOException {
            ByteBuffer hdr = ByteBuffer.wrap(read(ipc ? 9 : 8));
            if (ipc && hdr.get() != 1)
                throw new IOException("bad ipc frame type");
            return read((int) hdr.getLong());
        }

        /** True when the worker closed the connection: EOF, or a reset, which is
         *  how a TCP close looks when the worker closes before it has read all
         *  that was sent to it (our SP header, when it closes at once). */
        boolean closedByWorker() throws IOException {
            try {
                read(1);
                return false;
            } catch (EOFException e) {
                return true;
            } catch (java.net.SocketException e) {
                if (String.valueOf(e.getMessage()).contains("Connection reset"))
                    return true;
                throw e;
            }
        }

        void write(byte[] bytes) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(bytes);
            while (b.hasRemaining())
                ch.write(b);
        }

        byte[] read(int n) throws IOException {
            ByteBuffer b = ByteBuffer.allocate(n);
            while (b.hasRemaining()) {
                if (ch.read(b) < 0)
                    throw new EOFException();
            }
            return b.array();
        }

        @Override
        public void close() throws IOException {
            ch.close();
        }
    }
}
