package dev.idemproxy.worker;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.idemproxy.worker.proto.Ack;
import java.io.File;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

/**
 * Interoperability with nanomsg itself (the library idemproxy is built on): nanocat, from
 * Debian's nanomsg-utils, binds a cooked NN_REQ socket, sends one Delivery and prints the
 * reply's body, which must be the Ack. `make test` installs nanomsg-utils when missing.
 */
@Timeout(30)
class NanocatInteropTest {
    @TempDir
    Path tmp;

    private final Worker worker = new Worker();

    @AfterEach
    void stop() {
        worker.close();
    }

    private Ack exchange(String endpoint, String key) throws Exception {
        String nanocat = null;
        for (String dir : System.getenv().getOrDefault("PATH", "").split(File.pathSeparator)) {
            if (Files.isExecutable(Path.of(dir, "nanocat")))
                nanocat = Path.of(dir, "nanocat").toString();
        }
        assumeTrue(nanocat != null, "nanocat (Debian's nanomsg-utils) is not installed");
        Path request = Files.write(tmp.resolve("delivery.bin"), WorkerTest.delivery(key, 3));
        Thread t = new Thread(() -> {
            try {
                worker.serve(endpoint, 1, WorkerTest::handleByKey);
            } catch (InterruptedException e) {
                // stopped
            }
        });
        t.start(); // the worker dials first; nanocat binds after
        Thread.sleep(200);
        Process p = new ProcessBuilder(nanocat, "--req", "--bind", endpoint, "--file", request.toString(),
                "--raw", "--recv-timeout", "10").redirectError(ProcessBuilder.Redirect.INHERIT).start();
        byte[] out = p.getInputStream().readAllBytes();
        p.waitFor(10, TimeUnit.SECONDS);
        return Ack.parseFrom(out);
    }

    @Test
    void answersNanomsgOverIpc() throws Exception {
        Ack a = exchange("ipc://" + tmp.resolve("nanocat.sock"), "ok");
        assertEquals(Ack.Status.ACK, a.getStatus());
        assertEquals("room", a.getStream());
        assertEquals("1700000000000-3", a.getEntryId());
    }

    @Test
    void answersNanomsgOverTcp() throws Exception {
        int port;
        try (ServerSocket s = new ServerSocket(0)) {
            port = s.getLocalPort();
        }
        Ack a = exchange("tcp://127.0.0.1:" + port, "drop-me");
        assertEquals(Ack.Status.DROP, a.getStatus());
        assertEquals("bad event", a.getReason());
        assertEquals("1700000000000-3", a.getEntryId());
    }
}
