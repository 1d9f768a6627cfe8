package dev.idemproxy.worker;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.idemproxy.worker.postgres.Inbox;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/** The jar's 001_idemproxy_inbox.sql is the repository's sql/postgresql file, byte for byte. */
class InboxSqlTest {
    @Test
    void theShippedSqlIsTheRepositorysCopy() throws Exception {
        Path repo = Path.of("../../sql/postgresql/001_idemproxy_inbox.sql");
        assumeTrue(Files.exists(repo), "built outside the repository: no sql/postgresql to compare with");
        try (InputStream in = Inbox.class.getResourceAsStream("001_idemproxy_inbox.sql")) {
            assertNotNull(in, "dev/idemproxy/worker/postgres/001_idemproxy_inbox.sql is not on the class path");
            assertArrayEquals(Files.readAllBytes(repo), in.readAllBytes());
        }
    }
}
