/*
 * test_config.c - unit tests of config.c: values, defaults, every validation
 * error at its exact FILE:LINE:COL, ${VAR} expansion, the IDEMPROXY_*
 * overrides and redis url parsing. Links config.o, template.o and px.o only;
 * run from the repository root (tests/unit/configs/ holds the sample files).
 */
#include "config.h"
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

/* The password used in every url below: no message may ever contain it. */
#define SECRET "PW-s3cret-9"

/* A valid streams section, appended after the lines under test. */
#define S "streams: [{stream: room}]\n"

static px_diags diags;

static void dump_diags(void)
{
    for (size_t i = 0; i < diags.n; i++) fprintf(stderr, "    | %s\n", diags.v[i].text);
}

/* Parse 'yaml' as "t.yaml", checking on the way that no message leaks SECRET. */
static px_config *parse(const char *yaml)
{
    px_diags_deinit(&diags);
    px_config *c = px_config_parse("t.yaml", yaml, strlen(yaml), &diags);
    for (size_t i = 0; i < diags.n; i++)
        if (strstr(diags.v[i].text, SECRET) != NULL)
            test_cond("a message shows the password", 0);
    return c;
}

/* The first message that starts with 'prefix' and contains 'sub'. */
static const px_diag *find(const char *prefix, const char *sub)
{
    for (size_t i = 0; i < diags.n; i++)
        if (strncmp(diags.v[i].text, prefix, strlen(prefix)) == 0 &&
            strstr(diags.v[i].text, sub) != NULL)
            return &diags.v[i];
    return NULL;
}

/* 'yaml' is refused with an error at 'at' ("t.yaml:L:C: ") that contains 'sub'. */
static void expect_error(const char *what, const char *yaml, const char *at, const char *sub)
{
    px_config *c = parse(yaml);
    const px_diag *d = find(at, sub);
    bool ok = c == NULL && d != NULL && !d->warning;
    test_cond(what, ok);
    if (!ok) {
        fprintf(stderr, "    wanted %s...%s, got:\n", at, sub);
        dump_diags();
    }
    px_config_destroy(c);
}

/* 'yaml' is accepted with exactly one message, a warning or note at 'at'
 * that contains 'sub'. */
static void expect_warning(const char *what, const char *yaml, const char *at, const char *sub)
{
    px_config *c = parse(yaml);
    const px_diag *d = find(at, sub);
    bool ok = c != NULL && diags.n == 1 && d != NULL && d->warning;
    test_cond(what, ok);
    if (!ok) {
        fprintf(stderr, "    wanted only %s...%s, got:\n", at, sub);
        dump_diags();
    }
    px_config_destroy(c);
}

/* 'yaml' is accepted without any message; the caller destroys the config. */
static px_config *expect_ok(const char *what, const char *yaml)
{
    px_config *c = parse(yaml);
    test_cond(what, c != NULL && diags.n == 0);
    if (c == NULL || diags.n) dump_diags();
    return c;
}

static void clear_env(void)
{
    unsetenv("IDEMPROXY_REDIS_URL");
    unsetenv("IDEMPROXY_ENDPOINT");
    unsetenv("IDEMPROXY_LOG_LEVEL");
}

/* ------------------------------------------------------------------ */

static void test_full(void)
{
    char path[512];
    const char *slash = strrchr(__FILE__, '/');
    snprintf(path, sizeof path, "%.*sconfigs/full.yaml",
             slash ? (int)(slash - __FILE__ + 1) : 0, __FILE__);
    px_diags_deinit(&diags);
    px_config *c = px_config_load(path, &diags);
    test_cond("full.yaml loads without messages", c != NULL && diags.n == 0);
    if (c == NULL) { dump_diags(); return; }
    test_streq("path", c->path, path);
    test_streq("redis.url", c->redis_url, "redis://alice:s3cr%40t@db.example:6380/2");
    test_cond("cluster empty", c->ncluster == 0);
    test_streq("password_file", c->password_file, "/var/run/secrets/redis/password");
    test_cond("timeout_ms", c->timeout_ms == 500);
    test_streq("redis_host", c->redis_host, "db.example");
    test_cond("redis_port", c->redis_port == 6380);
    test_cond("redis_unix", c->redis_unix == NULL);
    test_streq("redis_user", c->redis_user, "alice");
    test_streq("redis_password decoded", c->redis_password, "s3cr@t");
    test_cond("redis_db", c->redis_db == 2);
    test_streq("endpoint", c->endpoint, "tcp://127.0.0.1:5555");
    test_cond("max_inflight", c->max_inflight == 64);
    test_cond("max_entry_bytes", c->max_entry_bytes == 65536);
    test_cond("ack_timeout_ms", c->ack_timeout_ms == 15000);
    test_cond("socket_mode", c->socket_mode == 0600);
    test_cond("allow_remote", c->allow_remote == false);
    test_streq("metrics.listen", c->metrics_listen, "0.0.0.0:9465");
    test_cond("log.level", c->log_level == PX_LOG_DEBUG);
    test_cond("log.format", c->log_format == PX_LOG_JSON);
    test_cond("shutdown_grace_ms", c->shutdown_grace_ms == 2500);
    test_cond("two streams", c->nstreams == 2);
    if (c->nstreams == 2) {
        px_stream_conf *s = &c->streams[0];
        test_streq("stream", s->stream, "room");
        test_streq("group", s->group, "game-server");
        test_streq("consumer", s->consumer, "pod-1");
        test_streq("start", s->start, "$");
        test_streq("payload_field", s->payload_field, "payload");
        test_streq("key", s->key, "#event.eventId");
        test_cond("key compiled", s->key_tpl != NULL);
        test_streq("key_tpl source", s->key_tpl ? px_template_source(s->key_tpl) : NULL,
                   "#event.eventId");
        test_streq("lock_key", s->lock_key, "lock:game:room:#{event.roomId}");
        test_cond("lock_key compiled", s->lock_tpl != NULL);
        test_cond("layout", s->layout == PX_LAYOUT_SPLIT);
        test_streq("prefix", s->prefix, "x:");
        test_streq("lock_prefix", s->lock_prefix, "L:");
        test_streq("done_prefix", s->done_prefix, "D:");
        test_cond("wait_ms", s->wait_ms == 250);
        test_cond("on_busy", s->on_busy == PX_BUSY_DEAD_LETTER);
        test_cond("lease_ms", s->lease_ms == 8000);
        test_cond("done_ttl_ms", s->done_ttl_ms == 120000);
        test_cond("max_deliveries", s->max_deliveries == 3);
        test_cond("retry_backoff_ms", s->retry_backoff_ms == 50);
        test_streq("dead_letter", s->dead_letter, "room-dlq");
        test_cond("on_missing_key", s->on_missing_key == PX_MISSING_SKIP);
        test_cond("fencing", s->fencing == true);
        test_cond("hash_tag", s->hash_tag == true);
        test_streq("fingerprint", s->fingerprint, "#event");
        test_cond("fingerprint compiled", s->fp_tpl != NULL);
        test_cond("on_conflict", s->on_conflict == PX_CONFLICT_SKIP);
        test_cond("claim_idle_ms", s->claim_idle_ms == 60000);
        test_cond("linger_ms", s->linger_ms == 9);
        test_cond("batch_ms", s->batch_ms == 7);
        test_cond("commit_ms", s->commit_ms == 3);
        test_cond("line of block 0", s->line == 21);
        test_streq("stream 2", c->streams[1].stream, "seat");
        test_streq("start entry id", c->streams[1].start, "1700000000000-5");
        test_cond("line of block 1", c->streams[1].line == 48);
    }
    px_config_destroy(c);

    px_diags_deinit(&diags);
    c = px_config_load("/nonexistent/idemproxy.yaml", &diags);
    test_cond("unreadable file: NULL", c == NULL);
    test_cond("unreadable file: message with the path",
              find("/nonexistent/idemproxy.yaml: ", "cannot read") != NULL);
}

static void test_defaults(void)
{
    char host[256], consumer[300];
    px_config *c = expect_ok("minimal config", "streams: [{stream: room}]\n");
    if (c == NULL) return;
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    snprintf(consumer, sizeof consumer, "%s-%ld", host, (long)getpid());
    test_streq("default url", c->redis_url, "redis://127.0.0.1:6379");
    test_streq("default host", c->redis_host, "127.0.0.1");
    test_cond("default port", c->redis_port == 6379);
    test_cond("default db", c->redis_db == 0);
    test_cond("no user/password/unix",
              !c->redis_user && !c->redis_password && !c->redis_unix);
    test_cond("no cluster", c->ncluster == 0 && c->password_file == NULL);
    test_cond("default timeout_ms", c->timeout_ms == 1000);
    test_streq("default endpoint", c->endpoint, "ipc:///tmp/idemproxy.sock");
    test_cond("default max_inflight", c->max_inflight == 256);
    test_cond("default max_entry_bytes", c->max_entry_bytes == 1048576);
    test_cond("default ack_timeout_ms", c->ack_timeout_ms == 30000);
    test_cond("default socket_mode", c->socket_mode == 0660);
    test_cond("default allow_remote", c->allow_remote == false);
    test_streq("default metrics.listen", c->metrics_listen, "127.0.0.1:9464");
    test_cond("default log", c->log_level == PX_LOG_INFO && c->log_format == PX_LOG_TEXT);
    test_cond("default shutdown_grace_ms", c->shutdown_grace_ms == 10000);
    test_cond("one stream", c->nstreams == 1);
    px_stream_conf *s = &c->streams[0];
    test_streq("stream", s->stream, "room");
    test_cond("no group", s->group == NULL);
    test_streq("default consumer host-pid", s->consumer, consumer);
    test_streq("default start", s->start, "0");
    test_cond("no payload_field", s->payload_field == NULL);
    test_streq("default key", s->key, "#event.eventId");
    test_cond("default key compiled", s->key_tpl != NULL);
    test_cond("no lock_key", s->lock_key == NULL && s->lock_tpl == NULL);
    test_cond("default layout", s->layout == PX_LAYOUT_SINGLE);
    test_streq("default prefix", s->prefix, "idem:");
    test_streq("default lock_prefix", s->lock_prefix, "lock:");
    test_streq("default done_prefix", s->done_prefix, "done:");
    test_cond("default wait_ms", s->wait_ms == 0);
    test_cond("default on_busy", s->on_busy == PX_BUSY_RETRY);
    test_cond("default lease_ms", s->lease_ms == 5000);
    test_cond("default done_ttl_ms", s->done_ttl_ms == 600000);
    test_cond("default max_deliveries", s->max_deliveries == 5);
    test_cond("default retry_backoff_ms", s->retry_backoff_ms == 100);
    test_cond("no dead_letter", s->dead_letter == NULL);
    test_cond("default on_missing_key", s->on_missing_key == PX_MISSING_DEAD_LETTER);
    test_cond("no fingerprint", s->fingerprint == NULL && s->fp_tpl == NULL);
    test_cond("default on_conflict", s->on_conflict == PX_CONFLICT_DEAD_LETTER);
    test_cond("default fencing", s->fencing == false);
    test_cond("default hash_tag", s->hash_tag == false);
    test_cond("default claim_idle_ms", s->claim_idle_ms == 30000);
    test_cond("default linger_ms: 0", s->linger_ms == 0);
    test_cond("default batch_ms: 2", s->batch_ms == 2);
    test_cond("default commit_ms: 5", s->commit_ms == 5);
    test_cond("line", s->line == 1);
    px_config_destroy(c);

    /* null values and "" mean "not set" where docs/configuration.md says so */
    c = expect_ok("nulls and empty strings",
                  "redis:\n"
                  "app: ~\n"
                  "metrics:\n"
                  "  listen: \"\"\n"
                  "streams:\n"
                  "  - stream: room\n"
                  "    group: ~\n"
                  "    consumer:\n"
                  "    lock_key: \"\"\n"
                  "    dead_letter: \"\"\n"
                  "    payload_field: null\n"
                  "    lease_ms: ~\n");
    if (c) {
        s = &c->streams[0];
        test_streq("listen \"\" disables", c->metrics_listen, "");
        test_cond("group ~ is none", s->group == NULL);
        test_streq("empty consumer is the default", s->consumer, consumer);
        test_cond("lock_key \"\" is none", s->lock_key == NULL && s->lock_tpl == NULL);
        test_cond("dead_letter \"\" is none", s->dead_letter == NULL);
        test_cond("payload_field null is none", s->payload_field == NULL);
        test_cond("lease_ms ~ is the default", s->lease_ms == 5000);
        test_cond("app ~ keeps defaults", c->max_inflight == 256);
    }
    px_config_destroy(c);

    c = expect_ok("plain octal mode, entry ids, TRUE",
                  "app:\n  socket_mode: 0600\n  allow_remote: TRUE\n"
                  "streams:\n  - {stream: a, start: 0, prefix: \"a:\"}\n"
                  "  - {stream: b, start: 12345, prefix: \"b:\"}\n"
                  "  - {stream: c, start: 12345-7, prefix: \"c:\"}\n"
                  "  - {stream: d, start: \"$\", prefix: \"d:\"}\n");
    if (c) {
        test_cond("mode 0600", c->socket_mode == 0600 && c->allow_remote);
        test_streq("start 0", c->streams[0].start, "0");
        test_streq("start ms", c->streams[1].start, "12345");
        test_streq("start id", c->streams[2].start, "12345-7");
        test_streq("start $", c->streams[3].start, "$");
    }
    px_config_destroy(c);

    c = expect_ok("same stream, different groups",
                  "streams:\n  - {stream: room, group: a, prefix: \"a:\"}\n"
                  "  - {stream: room, group: b, prefix: \"b:\"}\n  - {stream: room}\n");
    test_cond("three blocks", c && c->nstreams == 3);
    px_config_destroy(c);

    c = expect_ok("lease_ms == 2 x timeout_ms is enough",
                  "redis:\n  timeout_ms: 3000\nstreams:\n  - stream: room\n    lease_ms: 6000\n");
    px_config_destroy(c);

    c = expect_ok("redis cluster seeds",
                  "redis:\n  cluster: [\"10.0.0.1:7000\", \"r2:7001\", \"[::1]:7002\"]\n" S);
    if (c) {
        test_cond("3 seeds, no url", c->ncluster == 3 && c->redis_url == NULL &&
                  c->redis_host == NULL);
        test_streq("seed 0", c->cluster[0], "10.0.0.1:7000");
        test_streq("seed 2", c->cluster[2], "[::1]:7002");
    }
    px_config_destroy(c);
}

static void test_errors(void)
{
    expect_error("unknown top-level key", "redsi:\n  url: redis://h\n" S,
                 "t.yaml:1:1: ", "unknown key 'redsi' (did you mean 'redis'?)");
    expect_error("unknown redis key", "redis:\n  timout_ms: 5\n" S,
                 "t.yaml:2:3: ", "redis: unknown key 'timout_ms'");
    expect_error("unknown stream key", "streams:\n  - stream: room\n    grup: g\n",
                 "t.yaml:3:5: ", "streams[0]: unknown key 'grup'");
    expect_error("duplicate key", "redis:\n  timeout_ms: 1\n  timeout_ms: 2\n" S,
                 "t.yaml:3:3: ", "duplicate key 'timeout_ms' (first at line 2)");

    expect_error("string for an integer", "redis:\n  timeout_ms: abc\n" S,
                 "t.yaml:2:15: ", "redis.timeout_ms: expected a duration");
    expect_error("duration with a unit", "streams:\n  - stream: room\n    lease_ms: 5s\n",
                 "t.yaml:3:15: ", "got '5s'");
    expect_error("mapping for a scalar", "app:\n  endpoint: {a: 1}\n" S,
                 "t.yaml:2:13: ", "app.endpoint: expected a string, got a mapping");
    expect_error("list for a mapping", "redis: [1, 2]\n" S,
                 "t.yaml:1:8: ", "redis: expected a mapping, got a list");
    expect_error("list for an integer", "app:\n  max_inflight: [1]\n" S,
                 "t.yaml:2:17: ", "expected an integer, got a list");
    expect_error("quoted integer", "app:\n  max_inflight: \"10\"\n" S,
                 "t.yaml:2:17: ", "got a quoted string");
    expect_error("integer out of range", "app:\n  max_inflight: 99999999999999999999\n" S,
                 "t.yaml:2:17: ", "out of range");
    expect_error("int over INT_MAX", "streams:\n  - stream: room\n    max_deliveries: 2147483648\n",
                 "t.yaml:3:21: ", "must be at most 2147483647");

    expect_error("negative shutdown_grace_ms", "shutdown_grace_ms: -5\n" S,
                 "t.yaml:1:20: ", "must not be negative (got -5)");
    expect_error("negative wait_ms", "streams:\n  - stream: room\n    wait_ms: -1\n",
                 "t.yaml:3:14: ", "streams[0].wait_ms: a duration must not be negative");
    expect_error("negative ack_timeout_ms", "app:\n  ack_timeout_ms: -30\n" S,
                 "t.yaml:2:19: ", "must not be negative");
    expect_error("timeout_ms 0", "redis:\n  timeout_ms: 0\n" S,
                 "t.yaml:2:15: ", "must be at least 1 (got 0)");
    expect_error("absurd duration", "streams:\n  - stream: room\n    done_ttl_ms: 9999999999999999\n",
                 "t.yaml:3:18: ", "must be at most");

    expect_error("lease_ms < 2 x timeout_ms",
                 "redis:\n  timeout_ms: 3000\nstreams:\n  - stream: room\n    lease_ms: 5999\n",
                 "t.yaml:5:15: ",
                 "streams[0].lease_ms: 5999 is less than twice redis.timeout_ms (3000)");
    expect_error("default lease_ms < 2 x timeout_ms",
                 "redis:\n  timeout_ms: 3000\n" S,
                 "t.yaml:2:15: ", "the default 5000 is less than twice redis.timeout_ms");
    expect_error("lease checked per stream",
                 "streams:\n  - {stream: a, lease_ms: 9000}\n  - {stream: b, lease_ms: 1999}\n",
                 "t.yaml:3:27: ", "streams[1].lease_ms: 1999");

    expect_error("max_inflight 0", "app:\n  max_inflight: 0\n" S,
                 "t.yaml:2:17: ", "app.max_inflight: must be at least 1 (got 0)");
    expect_error("max_inflight over the request id's slot bits", "app:\n  max_inflight: 1048577\n" S,
                 "t.yaml:2:17: ", "app.max_inflight: must be at most 1048576 (got 1048577)");
    expect_error("max_deliveries 0", "streams:\n  - stream: room\n    max_deliveries: 0\n",
                 "t.yaml:3:21: ", "must be at least 1");
    expect_error("claim_idle_ms 0", "streams:\n  - stream: room\n    group: g\n    claim_idle_ms: 0\n",
                 "t.yaml:4:20: ", "claim_idle_ms: must be at least 100 (got 0)");
    expect_error("linger_ms over 100", "streams:\n  - stream: room\n    linger_ms: 101\n",
                 "t.yaml:3:16: ", "linger_ms: must be at most 100 (got 101)");
    expect_error("batch_ms over 100", "streams:\n  - stream: room\n    batch_ms: 101\n",
                 "t.yaml:3:15: ", "batch_ms: must be at most 100 (got 101)");
    expect_error("commit_ms over 100", "streams:\n  - stream: room\n    commit_ms: 101\n",
                 "t.yaml:3:16: ", "commit_ms: must be at most 100 (got 101)");
    expect_error("max_entry_bytes 0", "app:\n  max_entry_bytes: 0\n" S,
                 "t.yaml:2:20: ", "app.max_entry_bytes: must be at least 1");

    expect_error("duplicate stream block with group",
                 "streams:\n  - stream: room\n    group: g\n  - stream: room\n    group: g\n",
                 "t.yaml:4:5: ", "streams[1]: duplicate stream block: stream 'room' with "
                 "group 'g' is already configured at line 2");
    expect_error("duplicate group-less stream block",
                 "streams:\n  - {stream: room}\n  - {stream: other}\n  - {stream: room}\n",
                 "t.yaml:4:5: ", "streams[2]: duplicate stream block: stream 'room' without "
                 "a group");
    expect_error("missing stream", "streams:\n  - group: g\n",
                 "t.yaml:2:5: ", "streams[0]: missing 'stream'");
    expect_error("empty stream", "streams:\n  - stream: \"\"\n",
                 "t.yaml:2:13: ", "streams[0].stream: must not be empty");
    expect_error("stream block not a mapping", "streams:\n  - room\n",
                 "t.yaml:2:5: ", "streams[0]: expected a stream block");
    expect_error("no streams key", "app: {}\n",
                 "t.yaml:1:1: ", "missing 'streams'");
    expect_error("empty streams list", "app: {}\nstreams: []\n",
                 "t.yaml:2:1: ", "at least one stream block is required");
    expect_error("streams is a mapping", "streams: {stream: room}\n",
                 "t.yaml:1:10: ", "expected a list of stream blocks, got a mapping");
    expect_error("empty file", "", "t.yaml:1:1: ", "empty");
    expect_error("comment-only file", "# nothing\n", "t.yaml:1:1: ", "empty");
    expect_error("root is a list", "- a\n- b\n", "t.yaml:1:1: ", "must be a mapping");
    expect_error("two documents", "streams: [{stream: a}]\n---\nx: 1\n",
                 "t.yaml:3:1: ", "only one YAML document");

    expect_error("bad layout", "streams:\n  - stream: room\n    layout: splt\n",
                 "t.yaml:3:13: ", "streams[0].layout: expected single or split, got 'splt'");
    expect_error("bad on_busy", "streams:\n  - stream: room\n    on_busy: wait\n",
                 "t.yaml:3:14: ", "expected retry or dead_letter, got 'wait'");
    expect_error("bad on_missing_key", "streams:\n  - stream: room\n    on_missing_key: drop\n",
                 "t.yaml:3:21: ", "expected dead_letter or skip, got 'drop'");
    expect_error("bad log.level", "log:\n  level: verbose\n" S,
                 "t.yaml:2:10: ", "log.level: expected error, warn, info or debug, got 'verbose'");
    expect_error("bad log.format", "log:\n  format: xml\n" S,
                 "t.yaml:2:11: ", "log.format: expected text or json, got 'xml'");
    expect_error("enum is case-sensitive", "log:\n  level: INFO\n" S,
                 "t.yaml:2:10: ", "got 'INFO'");

    expect_error("socket_mode without leading 0", "app:\n  socket_mode: \"660\"\n" S,
                 "t.yaml:2:16: ", "app.socket_mode: expected an octal mode");
    expect_error("socket_mode not octal", "app:\n  socket_mode: \"0689\"\n" S,
                 "t.yaml:2:16: ", "got '0689'");
    expect_error("socket_mode a word", "app:\n  socket_mode: rw\n" S,
                 "t.yaml:2:16: ", "expected an octal mode");

    expect_error("bad start", "streams:\n  - stream: room\n    start: abc\n",
                 "t.yaml:3:12: ", "streams[0].start: expected \"0\", \"$\" or an entry id");
    expect_error("start with a dangling -", "streams:\n  - stream: room\n    start: \"12-\"\n",
                 "t.yaml:3:12: ", "got '12-'");
    expect_error("start with three parts", "streams:\n  - stream: room\n    start: 1-2-3\n",
                 "t.yaml:3:12: ", "got '1-2-3'");
    expect_error("start >", "streams:\n  - stream: room\n    start: \">\"\n",
                 "t.yaml:3:12: ", "entry id");

    expect_error("url and cluster", "redis:\n  url: redis://h\n  cluster: [\"a:1\"]\n" S,
                 "t.yaml:2:8: ", "redis.url: redis.url and a non-empty redis.cluster");
    expect_error("bad cluster seed", "redis:\n  cluster: [\"a:1\", nohost]\n" S,
                 "t.yaml:2:20: ", "redis.cluster[1]: expected host:port, got 'nohost'");
    expect_error("cluster not a list", "redis:\n  cluster: \"a:1\"\n" S,
                 "t.yaml:2:12: ", "expected a list");

    expect_error("endpoint scheme", "app:\n  endpoint: http://x\n" S,
                 "t.yaml:2:13: ", "app.endpoint: 'http://x' must start with ipc:// or tcp://");
    expect_error("empty ipc path", "app:\n  endpoint: ipc://\n" S,
                 "t.yaml:2:13: ", "ipc:// needs a path");
    {
        /* a unix socket path holds 107 bytes (sun_path); nanomsg 1.1.5 aborts
         * on 108 to 121 and says "File name too long" from 122 (issue 37) */
        char yaml[512], path[200];
        memset(path, 'p', sizeof path);
        memcpy(path, "/tmp/", 5);
        path[108] = '\0';
        snprintf(yaml, sizeof yaml, "app:\n  endpoint: ipc://%s\n" S, path);
        expect_error("ipc path longer than sun_path", yaml, "t.yaml:2:13: ",
                     "app.endpoint: the ipc path is 108 bytes long; a unix socket path holds "
                     "at most 107");
        path[107] = '\0';
        snprintf(yaml, sizeof yaml, "app:\n  endpoint: ipc://%s\n" S, path);
        px_config_destroy(expect_ok("ipc path of 107 bytes", yaml));
        setenv("IDEMPROXY_ENDPOINT", "ipc:///tmp/ppppppppppppppppppppppppppppppppppppppppppppppppp"
                                     "ppppppppppppppppppppppppppppppppppppppppppppppppppppppppppp", 1);
        expect_error("IDEMPROXY_ENDPOINT too long", S, "IDEMPROXY_ENDPOINT: ",
                     "the ipc path is 113 bytes long");
        unsetenv("IDEMPROXY_ENDPOINT");
    }
    expect_error("tcp without port", "app:\n  endpoint: tcp://127.0.0.1\n" S,
                 "t.yaml:2:13: ", "needs a host and a port");
    expect_error("remote tcp endpoint", "app:\n  endpoint: tcp://10.0.0.1:5555\n" S,
                 "t.yaml:2:13: ", "not on a loopback address");
    expect_error("wildcard tcp endpoint", "app:\n  endpoint: tcp://*:5555\n" S,
                 "t.yaml:2:13: ", "app.allow_remote: true");
    expect_error("0.0.0.0 tcp endpoint", "app:\n  endpoint: \"tcp://0.0.0.0:5555\"\n" S,
                 "t.yaml:2:13: ", "not on a loopback address");
    expect_error("remote even if allow_remote comes first",
                 "app:\n  allow_remote: false\n  endpoint: tcp://eth0:5555\n" S,
                 "t.yaml:3:13: ", "not on a loopback address");
    const char *ok_endpoints[] = {
        "app:\n  endpoint: tcp://127.0.0.1:5555\n" S,
        "app:\n  endpoint: tcp://127.8.9.10:5555\n" S,
        "app:\n  endpoint: tcp://localhost:5555\n" S,
        "app:\n  endpoint: \"tcp://[::1]:5555\"\n" S,
        "app:\n  endpoint: tcp://*:5555\n  allow_remote: true\n" S,
        "app:\n  allow_remote: true\n  endpoint: tcp://10.0.0.1:5555\n" S,
        "app:\n  endpoint: ipc:///var/run/idem/app.sock\n" S,
    };
    for (size_t i = 0; i < sizeof ok_endpoints / sizeof *ok_endpoints; i++)
        px_config_destroy(expect_ok("accepted endpoint", ok_endpoints[i]));

    expect_error("metrics.listen without port", "metrics:\n  listen: 9464\n" S,
                 "t.yaml:2:11: ", "metrics.listen: expected host:port");
    expect_error("metrics.listen bad port", "metrics:\n  listen: \"127.0.0.1:0\"\n" S,
                 "t.yaml:2:11: ", "expected host:port");

    expect_error("yes is not a boolean", "streams:\n  - stream: room\n    fencing: yes\n",
                 "t.yaml:3:14: ", "streams[0].fencing: expected true or false, got 'yes'");
    expect_error("quoted boolean", "app:\n  allow_remote: \"true\"\n" S,
                 "t.yaml:2:17: ", "expected true or false, got a quoted string");

    expect_error("dead_letter is the stream", "streams:\n  - stream: room\n    dead_letter: room\n",
                 "t.yaml:3:18: ", "streams[0].dead_letter: must not be the stream being read");
    expect_error("split layout, same prefixes",
                 "streams:\n  - stream: room\n    layout: split\n    lock_prefix: \"x:\"\n"
                 "    done_prefix: \"x:\"\n",
                 "t.yaml:5:18: ", "lock_prefix and done_prefix must differ");
    expect_error("empty key", "streams:\n  - stream: room\n    key: \"\"\n",
                 "t.yaml:3:10: ", "streams[0].key: must not be empty");
    expect_error("non-scalar key", "? [a]\n: 1\n" S, "t.yaml:1:3: ", "expected a key, got a list");

    /* YAML syntax errors, at libyaml's problem mark */
    expect_error("syntax: bad indentation", "a: b\n c: d\n",
                 "t.yaml:2:3: ", "YAML: mapping values are not allowed");
    expect_error("syntax: unclosed flow sequence", "redis:\n  url: [unclosed\n",
                 "t.yaml:3:1: ", "YAML: did not find expected ',' or ']'");
    expect_error("syntax: tab indentation", "streams:\n\t- stream: room\n",
                 "t.yaml:2:1: ", "YAML: found character that cannot start any token");
    expect_error("syntax: undefined alias", "streams: *nope\n",
                 "t.yaml:1:10: ", "YAML: found undefined alias");
    {
        static const char bad_utf8[] = "streams: [{stream: ro\xff}]\n";
        px_diags_deinit(&diags);
        px_config *c = px_config_parse("t.yaml", bad_utf8, sizeof bad_utf8 - 1, &diags);
        test_cond("syntax: invalid UTF-8 at its byte", c == NULL &&
                  find("t.yaml:1:22: ", "YAML: invalid leading UTF-8 octet") != NULL);
        if (c || !find("t.yaml:1:22: ", "")) dump_diags();
        px_config_destroy(c);
    }
}

/* Every problem of one file, each at its place; nothing stops at the first. */
static void test_many_errors(void)
{
    px_config *c = parse(
        "redis:\n"                                  /* 1 */
        "  timeout_ms: 3000\n"                      /* 2 */
        "  colour: blue\n"                          /* 3 */
        "app:\n"                                    /* 4 */
        "  max_inflight: 0\n"                       /* 5 */
        "  endpoint: tcp://192.168.1.5:7000\n"      /* 6 */
        "log:\n"                                    /* 7 */
        "  level: loud\n"                           /* 8 */
        "streams:\n"                                /* 9 */
        "  - stream: room\n"                        /* 10 */
        "    lease_ms: 1000\n"                      /* 11 */
        "    layout: doubled\n"                     /* 12 */
        "  - group: nobody\n"                       /* 13 */
        "  - stream: room\n"                        /* 14 */
        "    lease_ms: 6000\n"                      /* 15 */
        "    max_deliveries: -2\n");                /* 16 */
    test_cond("many errors: NULL", c == NULL);
    test_cond("many errors: 3:3 unknown key", find("t.yaml:3:3: ", "unknown key 'colour'") != NULL);
    test_cond("many errors: 5:17 max_inflight", find("t.yaml:5:17: ", "max_inflight") != NULL);
    test_cond("many errors: 6:13 endpoint", find("t.yaml:6:13: ", "loopback") != NULL);
    test_cond("many errors: 8:10 level", find("t.yaml:8:10: ", "'loud'") != NULL);
    test_cond("many errors: 11:15 lease", find("t.yaml:11:15: ", "lease_ms: 1000") != NULL);
    test_cond("many errors: 12:13 layout", find("t.yaml:12:13: ", "'doubled'") != NULL);
    test_cond("many errors: 13:5 missing stream", find("t.yaml:13:5: ", "missing 'stream'") != NULL);
    test_cond("many errors: 14:5 duplicate", find("t.yaml:14:5: ", "duplicate stream block") != NULL);
    test_cond("many errors: 16:21 max_deliveries",
              find("t.yaml:16:21: ", "max_deliveries: must be at least 1") != NULL);
    /* streams[1] has no stream but still the default lease_ms, too short for 3000 */
    test_cond("many errors: 2:15 default lease of streams[1]",
              find("t.yaml:2:15: ", "streams[1].lease_ms: the default 5000") != NULL);
    /* and two warnings: streams[1] and [2] share streams[0]'s dedup names */
    test_cond("many errors: exactly 10 errors", diags.n == 12 && diags.nerrors == 10);
    if (diags.n != 12) dump_diags();

    /* px_diags accumulates: a second parse into the same diags adds to it */
    px_config *c2 = px_config_parse("u.yaml", "streams: [{stream: x}]\n", 23, &diags);
    test_cond("a clean parse after errors in the same diags succeeds",
              c2 != NULL && diags.nerrors == 10);
    px_config_destroy(c2);
}

/*
 * A template error is reported where it is in the YAML: the scalar's column,
 * plus one for an opening quote, plus the template's own column, through
 * escapes and ${} expansions. Every expected column is a literal counted by
 * hand; the template's own columns are pinned too, so a change in the
 * template compiler shows here as such instead of moving the expectations.
 */
static int template_errcol(const char *value)
{
    char err[256];
    int errcol = 0;
    px_template *t = px_template_compile(value, err, sizeof err, &errcol);
    if (t) px_template_destroy(t);
    test_cond("the test template does not compile", t == NULL && errcol >= 1);
    return errcol;
}

static void expect_template_at(const char *what, const char *yaml, int line, int col,
                               const char *name)
{
    char at[64];
    snprintf(at, sizeof at, "t.yaml:%d:%d: ", line, col);
    expect_error(what, yaml, at, name);
}

static void test_template_columns(void)
{
    /* The columns are counted by hand: the template's own column (pinned
     * first, so a change there shows as such) placed in the YAML source. */
    test_cond("template column: room:#{event.id", template_errcol("room:#{event.id") == 6);
    test_cond("template column: it's:#{event.id", template_errcol("it's:#{event.id") == 6);
    test_cond("template column: \\t:#{event.id", template_errcol("\t:#{event.id") == 3);
    test_cond("template column: ab:#{event.id", template_errcol("ab:#{event.id") == 4);
    test_cond("template column: UTF-8", template_errcol("\xc3\xa9:#{event.id") == 3);
    test_cond("template column: #event.a +", template_errcol("#event.a +") == 11);
    test_cond("template column: #{}", template_errcol("#{}") == 1);
    /* plain scalar at column 10: "room:" then the '#' at 15 */
    expect_template_at("template error, plain",
                       "streams:\n  - stream: room\n    key: room:#{event.id\n",
                       3, 15, "streams[0].key: ");
    /* double-quoted: one more for the quote */
    expect_template_at("template error, double-quoted",
                       "streams:\n  - stream: room\n    key: \"room:#{event.id\"\n",
                       3, 16, "streams[0].key: ");
    /* single-quoted with '' before the error: the source is one longer */
    expect_template_at("template error, single-quoted with ''",
                       "streams:\n  - stream: room\n    key: 'it''s:#{event.id'\n",
                       3, 17, "streams[0].key: ");
    /* a \t escape is two characters of source for one of value */
    expect_template_at("template error, double-quoted with an escape",
                       "streams:\n  - stream: room\n    key: \"\\t:#{event.id\"\n",
                       3, 14, "streams[0].key: ");
    /* after ${PX_T_PFX} ("ab"): 11 characters of source became 2 of value */
    setenv("PX_T_PFX", "ab", 1);
    expect_template_at("template error after an expansion",
                       "streams:\n  - stream: room\n    key: \"${PX_T_PFX}:#{event.id\"\n",
                       3, 23, "streams[0].key: ");
    unsetenv("PX_T_PFX");
    /* a multi-byte character before the error: columns count characters */
    expect_template_at("template error after UTF-8",
                       "streams:\n  - stream: room\n    key: \"\xc3\xa9:#{event.id\"\n",
                       3, 13, "streams[0].key: ");
    /* lock_key, an expression with an error at its end (the closing quote) */
    expect_template_at("lock_key error",
                       "streams:\n  - stream: room\n    lock_key: \"#event.a +\"\n",
                       3, 26, "streams[0].lock_key: ");
    /* in a flow mapping, second block */
    expect_template_at("template error in a flow block",
                       "streams:\n  - {stream: a}\n  - {stream: b, key: \"#{}\"}\n",
                       3, 23, "streams[1].key: ");
}

static void test_expansion(void)
{
    setenv("PX_T_STREAM", "orders", 1);
    setenv("PX_T_EMPTY", "", 1);
    setenv("PX_T_GRACE", "77", 1);
    unsetenv("PX_T_UNSET");
    unsetenv("PX_T_MISSING");
    px_config *c = parse(
        "shutdown_grace_ms: ${PX_T_GRACE}\n"
        "app:\n"
        "  max_inflight: ${PX_T_UNSET:-12}\n"
        "streams:\n"
        "  - stream: ${PX_T_STREAM}\n"
        "    group: ${PX_T_UNSET:-workers}\n"
        "    consumer: \"c-${PX_T_EMPTY:-x}-${PX_T_EMPTY}\"\n"
        "    prefix: \"$${KEEP}:$$:\"\n"
        "    start: $\n"
        "    lock_prefix: \"a$b$\"\n"
        "    dead_letter: ${PX_T_MISSING}\n");
    test_cond("expansion: accepted with a warning", c != NULL && diags.nerrors == 0);
    if (c) {
        px_stream_conf *s = &c->streams[0];
        test_cond("${VAR} in an integer", c->shutdown_grace_ms == 77);
        test_cond("${VAR:-default} in an integer", c->max_inflight == 12);
        test_streq("${VAR}", s->stream, "orders");
        test_streq("${VAR:-default} when unset", s->group, "workers");
        test_streq("${VAR:-default} when empty; ${VAR} empty", s->consumer, "c-x-");
        test_streq("$$ is a literal $", s->prefix, "${KEEP}:$:");
        test_streq("lone $", s->start, "$");
        test_streq("$ not followed by { or $", s->lock_prefix, "a$b$");
        test_cond("unset var is empty (dead_letter none)", s->dead_letter == NULL);
    }
    const px_diag *w = find("t.yaml:11:18: ", "PX_T_MISSING");
    test_cond("unset var: one warning at the scalar", diags.n == 1 && w && w->warning);
    test_cond("warning text", w && strstr(w->text, "warning: streams[0].dead_letter: "
                                          "environment variable PX_T_MISSING is not set"));
    px_config_destroy(c);

    setenv("HOSTNAME", "pod-7", 1);
    c = parse("streams:\n  - stream: room\n    consumer: ${HOSTNAME}\n");
    test_streq("consumer: ${HOSTNAME}", c ? c->streams[0].consumer : NULL, "pod-7");
    px_config_destroy(c);
    /* issue 33: a script's shell does not export HOSTNAME; it is the host's name, no warning */
    char host[256] = "";
    gethostname(host, sizeof host);
    unsetenv("HOSTNAME");
    c = parse("streams:\n  - stream: room\n    consumer: ${HOSTNAME}\n"
              "  - stream: leave\n    consumer: ${HOSTNAME:-other}-b\n");
    test_streq("unset ${HOSTNAME} is gethostname()", c ? c->streams[0].consumer : NULL, host);
    test_cond("unset ${HOSTNAME}: no warning", c && !find("t.yaml", "HOSTNAME"));
    char b[300];
    snprintf(b, sizeof b, "%s-b", host);
    test_streq("unset ${HOSTNAME:-default} is gethostname()", c ? c->streams[1].consumer : NULL, b);
    px_config_destroy(c);

    expect_error("${} without a name", "streams:\n  - stream: \"${}\"\n",
                 "t.yaml:2:13: ", "expected a variable name after '${'");
    expect_error("${ not closed", "streams:\n  - stream: \"x${PX_T_STREAM\"\n",
                 "t.yaml:2:13: ", "'${PX_T_STREAM' has no closing '}'");
    expect_error("${VAR:- not closed", "streams:\n  - stream: \"${PX_T_STREAM:-a\"\n",
                 "t.yaml:2:13: ", "has no closing '}'");
    /* an expanded value is checked as if it had been written */
    setenv("PX_T_BAD", "-5", 1);
    expect_error("expanded value validated", "shutdown_grace_ms: ${PX_T_BAD}\n" S,
                 "t.yaml:1:20: ", "must not be negative");
    unsetenv("PX_T_BAD");
    /* keys are not expanded */
    expect_error("keys are not expanded", "${PX_T_STREAM}: 1\n" S,
                 "t.yaml:1:1: ", "unknown key '${PX_T_STREAM}'");
    unsetenv("PX_T_STREAM");
    unsetenv("PX_T_EMPTY");
    unsetenv("PX_T_GRACE");
}

static void test_env_overrides(void)
{
    const char *file = "redis:\n  url: redis://filehost:6390/1\n" S;
    clear_env();

    setenv("IDEMPROXY_REDIS_URL", "redis://envuser:" SECRET "@envhost:7001/4", 1);
    px_config *c = expect_ok("IDEMPROXY_REDIS_URL", file);
    if (c) {
        test_streq("env url replaces", c->redis_url, "redis://envuser:" SECRET "@envhost:7001/4");
        test_streq("env url host", c->redis_host, "envhost");
        test_cond("env url port/db", c->redis_port == 7001 && c->redis_db == 4);
        test_streq("env url user", c->redis_user, "envuser");
        test_streq("env url password", c->redis_password, SECRET);
    }
    px_config_destroy(c);

    setenv("IDEMPROXY_REDIS_URL", "unix:///run/env.sock", 1);
    c = expect_ok("IDEMPROXY_REDIS_URL unix", file);
    test_cond("env unix url clears the host",
              c && c->redis_host == NULL && c->redis_unix && !strcmp(c->redis_unix, "/run/env.sock"));
    px_config_destroy(c);

    setenv("IDEMPROXY_REDIS_URL", "bogus://u:" SECRET "@h", 1);
    expect_error("bad IDEMPROXY_REDIS_URL", file, "IDEMPROXY_REDIS_URL: ", "invalid Redis url");
    setenv("IDEMPROXY_REDIS_URL", "redis://u:" SECRET "@h:0", 1);
    expect_error("bad port in IDEMPROXY_REDIS_URL", file, "IDEMPROXY_REDIS_URL: ", "bad port");
    setenv("IDEMPROXY_REDIS_URL", "redis://h", 1);
    expect_error("IDEMPROXY_REDIS_URL with a cluster", "redis:\n  cluster: [\"a:1\"]\n" S,
                 "IDEMPROXY_REDIS_URL: ", "cannot be used with redis.cluster");
    setenv("IDEMPROXY_REDIS_URL", "", 1);
    c = expect_ok("empty IDEMPROXY_REDIS_URL is ignored", file);
    test_streq("file url kept", c ? c->redis_host : NULL, "filehost");
    px_config_destroy(c);
    clear_env();

    setenv("IDEMPROXY_ENDPOINT", "ipc:///tmp/env.sock", 1);
    c = expect_ok("IDEMPROXY_ENDPOINT", "app:\n  endpoint: ipc:///tmp/file.sock\n" S);
    test_streq("env endpoint", c ? c->endpoint : NULL, "ipc:///tmp/env.sock");
    px_config_destroy(c);
    setenv("IDEMPROXY_ENDPOINT", "tcp://10.1.2.3:5555", 1);
    expect_error("remote IDEMPROXY_ENDPOINT", S, "IDEMPROXY_ENDPOINT: ", "not on a loopback");
    c = expect_ok("remote IDEMPROXY_ENDPOINT with allow_remote",
                  "app:\n  allow_remote: true\n" S);
    test_streq("env endpoint remote", c ? c->endpoint : NULL, "tcp://10.1.2.3:5555");
    px_config_destroy(c);
    setenv("IDEMPROXY_ENDPOINT", "udp://x", 1);
    expect_error("bad IDEMPROXY_ENDPOINT", S, "IDEMPROXY_ENDPOINT: ", "must start with ipc://");
    clear_env();

    setenv("IDEMPROXY_LOG_LEVEL", "debug", 1);
    c = expect_ok("IDEMPROXY_LOG_LEVEL", "log:\n  level: error\n" S);
    test_cond("env log level", c && c->log_level == PX_LOG_DEBUG);
    px_config_destroy(c);
    setenv("IDEMPROXY_LOG_LEVEL", "WARN", 1);
    c = expect_ok("IDEMPROXY_LOG_LEVEL upper case", S);
    test_cond("env log level WARN", c && c->log_level == PX_LOG_WARN);
    px_config_destroy(c);
    setenv("IDEMPROXY_LOG_LEVEL", "loud", 1);
    expect_error("bad IDEMPROXY_LOG_LEVEL", S, "IDEMPROXY_LOG_LEVEL: ",
                 "expected error, warn, info or debug, got 'loud'");
    clear_env();
}

/* Parse a config whose redis.url is 'url'; the caller destroys it. */
static px_config *with_url(const char *url)
{
    char yaml[512];
    snprintf(yaml, sizeof yaml, "redis:\n  url: \"%s\"\n" S, url);
    return parse(yaml);
}

static void expect_url(const char *url, const char *host, int port, const char *user,
                       const char *password, int db, const char *unix_path)
{
    px_config *c = with_url(url);
    char what[256];
    snprintf(what, sizeof what, "url %s", url);
    bool ok = c != NULL &&
              ((host == NULL) == (c->redis_host == NULL)) &&
              (!host || strcmp(host, c->redis_host) == 0) &&
              c->redis_port == port && c->redis_db == db &&
              ((user == NULL) == (c->redis_user == NULL)) &&
              (!user || strcmp(user, c->redis_user) == 0) &&
              ((password == NULL) == (c->redis_password == NULL)) &&
              (!password || strcmp(password, c->redis_password) == 0) &&
              ((unix_path == NULL) == (c->redis_unix == NULL)) &&
              (!unix_path || strcmp(unix_path, c->redis_unix) == 0);
    test_cond(what, ok);
    if (!ok) dump_diags();
    px_config_destroy(c);
}

static void test_username(void)
{
    clear_env();
    px_config *c = expect_ok("username", "redis:\n  username: app\n  password_file: /pw\n" S);
    test_streq("username is the user", c ? c->redis_user : NULL, "app");
    px_config_destroy(c);
    c = expect_ok("username replaces the url's user",
                  "redis:\n  url: redis://bob:pw@h\n  username: app\n" S);
    test_streq("url user replaced", c ? c->redis_user : NULL, "app");
    test_streq("url password kept", c ? c->redis_password : NULL, "pw");
    px_config_destroy(c);
    setenv("IDEMPROXY_REDIS_URL", "redis://envuser:" SECRET "@envhost", 1);
    c = expect_ok("username replaces IDEMPROXY_REDIS_URL's user", "redis:\n  username: app\n" S);
    test_streq("env url user replaced", c ? c->redis_user : NULL, "app");
    px_config_destroy(c);
    setenv("IDEMPROXY_REDIS_URL", "redis://envuser@envhost", 1);
    expect_error("IDEMPROXY_REDIS_URL user without password", "redis:\n  url: redis://h\n" S,
                 "IDEMPROXY_REDIS_URL: ", "the url has a user but no password");
    clear_env();
    expect_error("username without password", "redis:\n  username: app\n" S, "t.yaml:2:13: ",
                 "redis.username: a user needs a password");
    c = expect_ok("empty username is none", "redis:\n  username: \"\"\n" S);
    test_cond("no user", c && c->redis_user == NULL && c->username == NULL);
    px_config_destroy(c);
}

static void test_urls(void)
{
    expect_url("redis://localhost", "localhost", 6379, NULL, NULL, 0, NULL);
    expect_url("redis://10.0.0.2:6380/5", "10.0.0.2", 6380, NULL, NULL, 5, NULL);
    expect_url("redis://h/", "h", 6379, NULL, NULL, 0, NULL);
    expect_url("redis://alice:p%40ss%2Fw%3A@h:1/0", "h", 1, "alice", "p@ss/w:", 0, NULL);
    expect_url("redis://:" SECRET "@h", "h", 6379, NULL, SECRET, 0, NULL);
    /* a user without a password would go unused: idemproxy sends AUTH only with one */
    expect_error("url user without password", "redis:\n  url: redis://bob@h\n" S, "t.yaml:2:8: ",
                 "redis.url: the url has a user but no password");
    {
        px_config *c = expect_ok("url user with password_file",
                                 "redis:\n  url: redis://bob@h\n  password_file: /pw\n" S);
        test_streq("url user kept", c ? c->redis_user : NULL, "bob");
        px_config_destroy(c);
    }
    expect_url("redis://u:p@ss@h:7", "h", 7, "u", "p@ss", 0, NULL);
    expect_url("redis://%61dmin:x@h", "h", 6379, "admin", "x", 0, NULL);
    expect_url("redis://[::1]:7000/2", "::1", 7000, NULL, NULL, 2, NULL);
    expect_url("redis://redis-0.redis.ns.svc.cluster.local:6379",
               "redis-0.redis.ns.svc.cluster.local", 6379, NULL, NULL, 0, NULL);
    expect_url("unix:///var/run/redis/redis.sock", NULL, 6379, NULL, NULL, 0,
               "/var/run/redis/redis.sock");

    /* TLS: rediss://, or cluster seeds with redis.tls; verification on unless turned off */
    {
        px_config *c = expect_ok("rediss url", "redis:\n  url: rediss://cache.example:6380\n" S);
        test_cond("rediss: TLS on, verified", c && c->redis_tls.enabled && c->redis_tls.verify &&
                  c->redis_tls.ca_file == NULL && c->redis_port == 6380);
        px_config_destroy(c);
        c = expect_ok("rediss with redis.tls", "redis:\n  url: rediss://h\n  tls:\n    ca_file: /ca.crt\n"
                      "    cert_file: /c.crt\n    key_file: /c.key\n    server_name: redis.internal\n"
                      "    verify: false\n" S);
        test_cond("redis.tls read", c && c->redis_tls.enabled && !c->redis_tls.verify &&
                  strcmp(c->redis_tls.ca_file, "/ca.crt") == 0 &&
                  strcmp(c->redis_tls.cert_file, "/c.crt") == 0 &&
                  strcmp(c->redis_tls.key_file, "/c.key") == 0 &&
                  strcmp(c->redis_tls.server_name, "redis.internal") == 0);
        px_config_destroy(c);
        c = expect_ok("cluster with redis.tls", "redis:\n  cluster: [\"a:7000\"]\n  tls: {}\n" S);
        test_cond("cluster: TLS on with redis.tls", c && c->redis_tls.enabled && c->redis_tls.verify);
        px_config_destroy(c);
        c = expect_ok("plain url", "redis:\n  url: redis://h\n" S);
        test_cond("redis://: no TLS", c && !c->redis_tls.enabled);
        px_config_destroy(c);
    }
    expect_error("redis.tls with redis://", "redis:\n  url: redis://h\n  tls:\n    ca_file: /ca\n" S,
                 "t.yaml:4:5: ", "redis.tls: set, but redis.url is redis:// (plain text)");
    expect_error("redis.tls cert without key", "redis:\n  url: rediss://h\n  tls:\n    cert_file: /c\n" S,
                 "t.yaml:4:5: ", "redis.tls: cert_file and key_file go together");
    expect_error("redis.tls unknown key", "redis:\n  url: rediss://h\n  tls:\n    ca: /c\n" S,
                 "t.yaml:4:5: ", "redis.tls: unknown key 'ca'");

    static const char *const bad[][2] = {
        { "http://u:" SECRET "@h", "unknown scheme" },
        { "rediss://u:" SECRET "@h:0", "bad port" },
        { "redis://u:" SECRET "@h:99999", "bad port" },
        { "redis://u:" SECRET "@h:0", "bad port" },
        { "redis://u:" SECRET "@h:", "bad port" },
        { "redis://u:" SECRET "@", "no host" },
        { "redis://", "no host" },
        { "redis://u:" SECRET "@h/x", "the database must be a number" },
        { "redis://u:" SECRET "@h/-1", "the database must be a number" },
        { "redis://u:" SECRET "@h?db=2", "query parameters are not supported" },
        { "redis://u:" SECRET "%zz@h", "bad percent-encoding" },
        { "redis://u:" SECRET "%4@h", "bad percent-encoding" },
        { "redis://::1:6379", "bad host" },
        { "redis://h o:1", "bad host" },
        { "unix://relative/path", "unix:// needs an absolute socket path" },
        { "unix:///", "unix:// needs an absolute socket path" },
        { SECRET, "unknown scheme" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char what[256], yaml[512];
        snprintf(what, sizeof what, "bad url: %s", bad[i][1]);
        snprintf(yaml, sizeof yaml, "redis:\n  url: \"%s\"\n" S, bad[i][0]);
        expect_error(what, yaml, "t.yaml:2:8: ", bad[i][1]);
        for (size_t k = 0; k < diags.n; k++)
            test_cond("no message contains the password", strstr(diags.v[k].text, SECRET) == NULL);
    }
}

/*
 * Names (issue 15, 12): a lock_key that can render a dedup name of any stream
 * (its own included) is refused, at the lock_key's value. Messages and
 * columns are written out: the value starts at column 15 of "    lock_key: ".
 */
static void test_names(void)
{
    /* README's old example: lock: + the eventId "game:room:42" is room 42's lock */
    expect_error("lock_key under another stream's lock_prefix",
                 "streams:\n"
                 "  - stream: room\n"
                 "    layout: split\n"
                 "  - stream: room:leave\n"
                 "    lock_key: \"lock:game:room:#{event.roomId}\"\n",
                 "t.yaml:5:15: ",
                 "streams[1].lock_key: its names start with 'lock:game:room:' and streams[0]'s "
                 "dedup locks (lock_prefix + key) start with 'lock:', so one name can be both; "
                 "a lock_key's literal prefix must neither begin with a dedup name's prefix nor "
                 "be the beginning of one");
    expect_error("lock_key under its own prefix (single)",
                 "streams:\n  - stream: room\n    lock_key: idem:room:#{event.roomId}\n",
                 "t.yaml:3:15: ",
                 "streams[0].lock_key: its names start with 'idem:room:' and its own dedup keys "
                 "(prefix + key) start with 'idem:', so one name can be both");
    expect_error("lock_key that is the beginning of a prefix",
                 "streams:\n  - stream: room\n    lock_key: \"id#{event.roomId}\"\n",
                 "t.yaml:3:15: ",
                 "streams[0].lock_key: its names start with 'id' and its own dedup keys "
                 "(prefix + key) start with 'idem:', so one name can be both");
    expect_error("lock_key under a done_prefix",
                 "streams:\n  - stream: room\n    layout: split\n    lock_prefix: \"L:\"\n"
                 "    lock_key: \"done:x:#{event.roomId}\"\n",
                 "t.yaml:5:15: ",
                 "streams[0].lock_key: its names start with 'done:x:' and its own done marks "
                 "(done_prefix + key) start with 'done:', so one name can be both");
    expect_error("an expression lock_key has no literal prefix",
                 "streams:\n  - stream: room\n    lock_key: \"#event.roomId\"\n",
                 "t.yaml:3:15: ",
                 "streams[0].lock_key: it starts with no literal text, so a name it renders "
                 "can equal one of its own dedup keys (prefix + key), which start with 'idem:'; "
                 "begin it with text that neither begins with a dedup name's prefix nor is the "
                 "beginning of one (such as room-lock:#{...})");
    expect_error("a template that starts with #{} has no literal prefix",
                 "streams:\n  - stream: room\n    lock_key: \"#{event.a ?: 'r:'}:x\"\n",
                 "t.yaml:3:15: ", "streams[0].lock_key: it starts with no literal text");
    expect_error("constant #{} parts count as literal text",
                 "streams:\n  - stream: room\n    layout: split\n"
                 "    lock_key: \"#{'lo' + 'ck:'}#{1}#{event.r}\"\n",
                 "t.yaml:4:15: ",
                 "streams[0].lock_key: its names start with 'lock:1' and its own dedup locks "
                 "(lock_prefix + key) start with 'lock:'");
    expect_error("an empty prefix is the beginning of every lock_key",
                 "streams:\n  - stream: room\n    prefix: \"\"\n  - stream: seat\n"
                 "    lock_key: \"seat:#{event.s}\"\n",
                 "t.yaml:5:15: ",
                 "streams[1].lock_key: its names start with 'seat:' and streams[0]'s dedup keys "
                 "(prefix + key) start with '', so one name can be both");
    expect_error("hash_tag: the brace is part of the dedup names",
                 "streams:\n  - stream: room\n    hash_tag: true\n"
                 "    lock_key: \"idem:{#{event.r}}\"\n",
                 "t.yaml:4:15: ",
                 "streams[0].lock_key: its names start with 'idem:{' and its own dedup keys "
                 "(prefix + '{' + key + '}') start with 'idem:{'");
    expect_error("idemproxy's own keys",
                 "streams:\n  - stream: room\n    lock_key: \"idemproxy:f#{event.r}\"\n",
                 "t.yaml:3:15: ",
                 "streams[0].lock_key: its names start with 'idemproxy:f' and can equal "
                 "idemproxy's own keys, which start with 'idemproxy:'");
    expect_error("every colliding lock_key is reported",
                 "streams:\n  - stream: a\n    lock_key: \"idem:#{event.r}\"\n"
                 "  - stream: b\n    lock_key: \"#event.r\"\n",
                 "t.yaml:5:15: ", "streams[1].lock_key: it starts with no literal text");

    px_config *c;
    /* the key template's literal text is part of the dedup names */
    c = expect_ok("lock: lock_key beside lock:evt: dedup locks",
                  "streams:\n  - stream: room\n    layout: split\n    key: \"evt:#{event.id}\"\n"
                  "    lock_key: \"lock:room:#{event.roomId}\"\n");
    px_config_destroy(c);
    c = expect_ok("hash_tag: idem:room: cannot be idem:{...}",
                  "streams:\n  - stream: room\n    hash_tag: true\n"
                  "    lock_key: \"idem:room:#{event.roomId}\"\n");
    px_config_destroy(c);
    /* shared on purpose: dedup names of two streams (done keys are global) and
     * one lock_key of two streams (one room, one lock) */
    expect_warning("shared dedup prefix (a warning) and shared lock_key",
                   "streams:\n  - stream: room\n    lock_key: \"game:room:#{event.roomId}\"\n"
                   "  - stream: room:leave\n    lock_key: \"game:room:#{event.roomId}\"\n"
                   "  - stream: seat\n    layout: split\n"
                   "    lock_key: \"room-lock:#{event.roomId}\"\n",
                   "t.yaml:4:5: ", "streams[1] (room:leave) shares dedup names with streams[0] (room)");
    c = expect_ok("case matters: L: is not lock:",
                  "streams:\n  - stream: room\n    layout: split\n    lock_prefix: \"L:\"\n"
                  "    done_prefix: \"D:\"\n    lock_key: \"lock:#{event.roomId}\"\n");
    px_config_destroy(c);
}

/* Keys that read nothing (issue 31, docs/configuration.md): a constant key
 * makes every event a copy of the first; literal text that looks like a
 * variable is a typo for #{...}. Both refused at the template, with the #{...}
 * form meant. */
static void test_key_reads(void)
{
    expect_error("key: a variable after literal text",
                 "streams:\n  - stream: room\n    key: \"room:#event.eventId\"\n",
                 "t.yaml:3:16: ",
                 "streams[0].key: #event.eventId after literal text is text, not a variable: "
                 "did you mean \"room:#{event.eventId}\"?");
    expect_error("key: a bare property name",
                 "streams:\n  - stream: room\n    key: eventId\n",
                 "t.yaml:3:10: ",
                 "streams[0].key: reads nothing from the entry: 'eventId' is literal text, the "
                 "same key for every event: did you mean \"#{event.eventId}\"?");
    expect_error("key: a bare property path",
                 "streams:\n  - stream: room\n    key: \"event.eventId\"\n",
                 "t.yaml:3:11: ", "did you mean \"#{event.eventId}\"?");
    expect_error("key: #fields[...] after text",
                 "streams:\n  - stream: room\n    key: \"k-#fields['id']\"\n",
                 "t.yaml:3:13: ", "did you mean \"k-#{fields['id']}\"?");
    expect_error("key: #id after text, after a part",
                 "streams:\n  - stream: room\n    key: \"#{event.a}/#id\"\n",
                 "t.yaml:3:22: ", "did you mean \"#{event.a}/#{id}\"?");
    expect_error("key: a constant",
                 "streams:\n  - stream: room\n    key: \"#{'all'}:#{1}\"\n",
                 "t.yaml:3:11: ", "streams[0].key: reads nothing from the entry");
    expect_error("key: #stream alone is constant per stream",
                 "streams:\n  - stream: room\n    key: \"#stream\"\n",
                 "t.yaml:3:11: ", "#stream is the same for every entry");
    expect_error("key: the right side of ?: never reached",
                 "streams:\n  - stream: room\n    key: \"#{'x' ?: event.a}\"\n",
                 "t.yaml:3:11: ", "reads nothing from the entry");
    expect_error("fingerprint: a constant",
                 "streams:\n  - stream: room\n    fingerprint: \"v1\"\n",
                 "t.yaml:3:19: ",
                 "streams[0].fingerprint: reads nothing from the entry: 'v1' is literal text, the "
                 "same fingerprint for every event");
    expect_error("fingerprint: a constant expression",
                 "streams:\n  - stream: room\n    fingerprint: \"#{'v'}\"\n", "t.yaml:3:19: ",
                 "every event gets the same fingerprint and no copy is ever a conflict");
    expect_error("fingerprint: a variable after literal text",
                 "streams:\n  - stream: room\n    fingerprint: \"v:#event.amount\"\n",
                 "t.yaml:3:21: ", "did you mean \"v:#{event.amount}\"?");
    expect_error("on_conflict: unknown",
                 "streams:\n  - stream: room\n    on_conflict: retry\n", "t.yaml:3:18: ",
                 "on_conflict");
    {
        px_config *c = expect_ok("fingerprint: the whole event, skip",
                                 "streams:\n  - stream: room\n    fingerprint: \"#event\"\n"
                                 "    on_conflict: skip\n");
        if (c) {
            test_cond("fingerprint #event compiled", c->streams[0].fp_tpl != NULL);
            test_cond("on_conflict skip", c->streams[0].on_conflict == PX_CONFLICT_SKIP);
            px_config_destroy(c);
        }
        c = expect_ok("fingerprint: \"\" is none",
                      "streams:\n  - stream: room\n    fingerprint: \"\"\n");
        if (c) {
            test_cond("fingerprint \"\" is none", c->streams[0].fp_tpl == NULL);
            px_config_destroy(c);
        }
    }
    expect_error("lock_key: a variable after literal text too",
                 "streams:\n  - stream: room\n    lock_key: \"room-lock:#event.roomId\"\n",
                 "t.yaml:3:26: ", "did you mean \"room-lock:#{event.roomId}\"?");
    /* a template source must be UTF-8 (issue 37); a ${VAR} can bring any byte */
    setenv("PX_T_BYTES", "r\xff", 1);
    expect_error("key: not valid UTF-8 through ${VAR}",
                 "streams:\n  - stream: room\n    key: \"#{event.a}:${PX_T_BYTES}\"\n",
                 "t.yaml:3:", "streams[0].key: the template is not valid UTF-8 (byte 0xff)");
    unsetenv("PX_T_BYTES");

    px_config *c;
    c = expect_ok("key: #id reads the entry", "streams:\n  - stream: room\n    key: \"#id\"\n");
    px_config_destroy(c);
    c = expect_ok("key: #stream with the event",
                  "streams:\n  - stream: room\n    key: \"#{stream}:#{event.a ?: 'x'}\"\n");
    px_config_destroy(c);
    /* seed 003's `running`: one event at a time across replicas */
    expect_warning("lock_key: a constant is legal, with a note",
                   "streams:\n  - stream: room\n    lock_key: running\n",
                   "t.yaml:3:15: ",
                   "note: streams[0].lock_key: reads nothing from the entry, so it is one lock "
                   "for every event of the stream");
}

/* docs/configuration.md's timings: a refresh every third of claim_idle_ms must
 * fit three command timeouts (issue 30), and a done mark must outlive the
 * lease. */
static void test_timings(void)
{
    expect_error("claim_idle_ms < 3 x timeout_ms",
                 "streams:\n  - stream: room\n    group: g\n    claim_idle_ms: 2999\n",
                 "t.yaml:4:20: ",
                 "streams[0].claim_idle_ms: 2999 is less than three times redis.timeout_ms "
                 "(1000)");
    expect_error("the default claim_idle_ms < 3 x timeout_ms",
                 "redis:\n  timeout_ms: 10001\nstreams:\n  - stream: room\n    group: g\n"
                 "    lease_ms: 60000\n",
                 "t.yaml:2:15: ", "streams[0].claim_idle_ms: the default 30000 is less than "
                                  "three times redis.timeout_ms (10001)");
    expect_error("done_ttl_ms < lease_ms",
                 "streams:\n  - stream: room\n    done_ttl_ms: 4999\n",
                 "t.yaml:3:18: ",
                 "streams[0].done_ttl_ms: 4999 is less than lease_ms (5000)");
    expect_error("the default done_ttl_ms < lease_ms",
                 "streams:\n  - stream: room\n    lease_ms: 600001\n",
                 "t.yaml:3:15: ", "streams[0].done_ttl_ms: the default 600000 is less than "
                                  "lease_ms (600001)");
    px_config *c;
    c = expect_ok("claim_idle_ms == 3 x timeout_ms, done_ttl_ms == lease_ms",
                  "redis:\n  timeout_ms: 500\nstreams:\n  - stream: room\n    group: g\n"
                  "    claim_idle_ms: 1500\n    lease_ms: 2000\n    done_ttl_ms: 2000\n");
    px_config_destroy(c);
    /* without a group nothing is claimed after claim_idle_ms: not checked */
    c = expect_ok("group-less: claim_idle_ms unused",
                  "streams:\n  - stream: room\n    claim_idle_ms: 300\n");
    px_config_destroy(c);
}

/* Dedup names against idemproxy's own keys and each other (issue 37). */
static void test_dedup_names(void)
{
    expect_error("prefix \"\" can name idemproxy's own keys",
                 "streams:\n  - stream: room\n    prefix: \"\"\n",
                 "t.yaml:3:13: ",
                 "streams[0].prefix: its dedup keys (prefix + key) start with '' and can equal "
                 "idemproxy's own keys, which start with 'idemproxy:'");
    expect_error("prefix under idemproxy:",
                 "streams:\n  - stream: room\n    prefix: \"idemproxy:d:\"\n",
                 "t.yaml:3:13: ", "start with 'idemproxy:d:' and can equal idemproxy's own keys");
    expect_error("prefix that begins idemproxy:",
                 "streams:\n  - stream: room\n    prefix: idem\n",
                 "t.yaml:3:13: ", "start with 'idem' and can equal idemproxy's own keys");
    expect_error("split: lock_prefix under idemproxy:",
                 "streams:\n  - stream: room\n    layout: split\n    lock_prefix: \"idemproxy:\"\n",
                 "t.yaml:4:18: ", "streams[0].lock_prefix: its dedup locks (lock_prefix + key) "
                                  "start with 'idemproxy:'");
    expect_error("split: done_prefix empty",
                 "streams:\n  - stream: room\n    layout: split\n    done_prefix: \"\"\n",
                 "t.yaml:4:18: ", "streams[0].done_prefix: its done marks (done_prefix + key) "
                                  "start with ''");
    expect_error("split: a lock_prefix that begins the done_prefix",
                 "streams:\n  - stream: room\n    layout: split\n    lock_prefix: d\n",
                 "t.yaml:4:18: ",
                 "streams[0].lock_prefix: its dedup locks (lock_prefix + key) start with 'd' and "
                 "its own done marks (done_prefix + key) start with 'done:', so one name can be "
                 "both");
    expect_error("split: a done_prefix under the lock_prefix",
                 "streams:\n  - stream: room\n    layout: split\n    done_prefix: \"lock:d:\"\n",
                 "t.yaml:4:18: ", "streams[0].done_prefix: its done marks (done_prefix + key) "
                                  "start with 'lock:d:' and its own dedup locks");
    expect_error("another stream's done marks under this one's locks",
                 "streams:\n  - stream: a\n    layout: split\n"
                 "  - stream: b\n    layout: split\n    lock_prefix: \"done:\"\n"
                 "    done_prefix: \"fin:\"\n",
                 "t.yaml:6:18: ",
                 "streams[1].lock_prefix: its dedup locks (lock_prefix + key) start with 'done:' "
                 "and streams[0]'s done marks (done_prefix + key) start with 'done:'");
    expect_error("a single-layout key under another stream's done marks",
                 "streams:\n  - stream: a\n    layout: split\n"
                 "  - stream: b\n    prefix: \"done:b:\"\n",
                 "t.yaml:5:13: ", "streams[1].prefix: its dedup keys (prefix + key) start with "
                                  "'done:b:' and streams[0]'s done marks");

    /* one namespace for two streams: allowed (the seeds' done keys are
     * global), but said */
    expect_warning("two streams share the default prefix",
                   "streams:\n  - stream: orders\n  - stream: payments\n",
                   "t.yaml:3:5: ",
                   "warning: streams[1] (payments) shares dedup names with streams[0] (orders): "
                   "both start with 'idem:'");
    expect_warning("two split streams share locks and done marks: one warning",
                   "streams:\n  - stream: a\n    layout: split\n"
                   "  - stream: b\n    layout: split\n",
                   "t.yaml:4:5: ", "streams[1] (b) shares dedup names with streams[0] (a)");
    px_config *c;
    c = expect_ok("hash_tag: an empty prefix names {key}, never idemproxy's keys",
                  "streams:\n  - stream: room\n    prefix: \"\"\n    hash_tag: true\n");
    px_config_destroy(c);
    c = expect_ok("a prefix per stream", "streams:\n  - stream: orders\n    prefix: \"idem:o:\"\n"
                                         "  - stream: payments\n    prefix: \"idem:p:\"\n");
    px_config_destroy(c);
    c = expect_ok("keys that start apart", "streams:\n  - stream: orders\n    key: \"o:#{event.id}\"\n"
                                           "  - stream: payments\n    key: \"p:#{event.id}\"\n");
    px_config_destroy(c);
    expect_warning("two groups of one stream share dedup names too",
                   "streams:\n  - {stream: orders, group: a}\n  - {stream: orders, group: b}\n",
                   "t.yaml:3:5: ",
                   "streams[1] (orders, group b) shares dedup names with streams[0] (orders, "
                   "group a)");
}

/* A host the daemon cannot hold (PX_ADDR_HOST_MAX: a DNS name is at most 253
 * characters) is refused by check. It used to pass: then metrics.listen failed
 * at start and a cluster seed was silently left out (cluster.c's node_get). */
/* redis.sentinel (docs/configuration.md): the block, and what check refuses
 * with the field named. */
static void test_sentinel(void)
{
    px_config *c = expect_ok("sentinel block",
                             "redis:\n  sentinel:\n    master_name: mymaster\n"
                             "    sentinels: [\"10.0.0.1:26379\", \"s2:26379\", \"[::1]:26380\"]\n"
                             "    username: sn\n    password_file: /run/sn\n  tls: {}\n" S);
    if (c) {
        test_streq("master_name", c->sentinel.master_name, "mymaster");
        test_cond("3 sentinels, no url, no cluster", c->sentinel.nsentinels == 3 &&
                  c->redis_url == NULL && c->ncluster == 0);
        test_streq("sentinel 2", c->sentinel.sentinels[2], "[::1]:26380");
        test_streq("sentinel user", c->sentinel.username, "sn");
        test_streq("sentinel password_file", c->sentinel.password_file, "/run/sn");
        test_cond("redis.tls turns TLS on with sentinels", c->redis_tls.enabled);
    }
    px_config_destroy(c);
    c = expect_ok("an empty sentinel block is none (as cluster: [])",
                  "redis:\n  url: redis://h\n  sentinel: {master_name: \"\", sentinels: []}\n" S);
    test_cond("empty block: the url", c && c->sentinel.master_name == NULL &&
              c->redis_host && strcmp(c->redis_host, "h") == 0);
    px_config_destroy(c);

    expect_error("sentinel without master_name", "redis:\n  sentinel: {sentinels: [\"a:1\"]}\n" S,
                 "t.yaml:2:13: ", "redis.sentinel.master_name: required");
    expect_error("sentinel without sentinels", "redis:\n  sentinel: {master_name: m}\n" S,
                 "t.yaml:2:13: ", "redis.sentinel.sentinels: at least one sentinel");
    expect_error("sentinel with an empty list", "redis:\n  sentinel: {master_name: m, sentinels: []}\n" S,
                 "t.yaml:2:41: ", "redis.sentinel.sentinels: at least one sentinel");
    expect_error("a bad sentinel address", "redis:\n  sentinel: {master_name: m, sentinels: [\"a:1\", b]}\n" S,
                 "t.yaml:2:49: ", "redis.sentinel.sentinels[1]: expected host:port, got 'b'");
    expect_error("a sentinel port out of range", "redis:\n  sentinel: {master_name: m, sentinels: [\"a:65536\"]}\n" S,
                 "t.yaml:2:42: ", "redis.sentinel.sentinels[0]: expected host:port, got 'a:65536'");
    expect_error("sentinel and url", "redis:\n  url: redis://h\n  sentinel: {master_name: m, sentinels: [\"a:1\"]}\n" S,
                 "t.yaml:3:13: ", "redis.sentinel: cannot be used together with redis.url");
    expect_error("sentinel and cluster", "redis:\n  cluster: [\"a:1\"]\n  sentinel: {master_name: m, sentinels: [\"a:1\"]}\n" S,
                 "t.yaml:3:13: ", "redis.sentinel: cannot be used together with redis.cluster");
    expect_error("sentinel user without a password", "redis:\n  sentinel: {master_name: m, sentinels: [\"a:1\"], username: u}\n" S,
                 "t.yaml:2:13: ", "redis.sentinel.username: set without redis.sentinel.password_file");
    expect_error("sentinel not a mapping", "redis:\n  sentinel: [\"a:1\"]\n" S,
                 "t.yaml:2:13: ", "redis.sentinel: expected a mapping");
    expect_error("an unknown key in the block", "redis:\n  sentinel: {master_name: m, sentinels: [\"a:1\"], port: 1}\n" S,
                 "t.yaml:2:", "unknown key 'port'");
}

static void test_long_hosts(void)
{
    char host[300], yaml[700];
    for (int len = 253; len <= 256; len += 3) {
        memset(host, 'h', (size_t)len);
        host[len] = '\0';
        bool fits = len < 256;
        snprintf(yaml, sizeof yaml, "metrics:\n  listen: \"%s:9464\"\n" S, host);
        if (fits) px_config_destroy(expect_ok("metrics.listen, a 253-character host", yaml));
        else expect_error("metrics.listen, a 256-character host", yaml, "t.yaml:2:11: ",
                          "metrics.listen: expected host:port");
        snprintf(yaml, sizeof yaml, "redis:\n  cluster: [\"a:1\", \"%s:7000\"]\n" S, host);
        if (fits) px_config_destroy(expect_ok("cluster seed, a 253-character host", yaml));
        else expect_error("cluster seed, a 256-character host", yaml, "t.yaml:2:20: ",
                          "redis.cluster[1]: expected host:port");
        snprintf(yaml, sizeof yaml, "app:\n  allow_remote: true\n  endpoint: tcp://%s:5555\n" S, host);
        if (fits) px_config_destroy(expect_ok("endpoint, a 253-character host", yaml));
        else expect_error("endpoint, a 256-character host", yaml, "t.yaml:3:13: ",
                          "needs a host and a port");
    }
    /* The endpoint's port follows the last ':', as it always did. */
    px_config_destroy(expect_ok("endpoint, a bare IPv6 host", "app:\n  endpoint: tcp://::1:5555\n" S));
    expect_error("endpoint, a stray bracket", "app:\n  allow_remote: true\n  endpoint: \"tcp://[::1]x:5555\"\n" S,
                 "t.yaml:3:13: ", "needs a host and a port");
}

/* tracing: defaults (off), values, and what check refuses
 * (docs/configuration.md). */
static void test_tracing(void)
{
    px_config *c = expect_ok("tracing defaults", S);
    if (c) {
        test_cond("tracing off by default", c->otlp_endpoint == NULL);
        test_cond("default sample_ratio", c->sample_ratio == 1.0);
        test_streq("default trace_field", c->trace_field, "traceparent");
        test_streq("default service_name", c->trace_service_name, "idemproxy");
    }
    px_config_destroy(c);
    c = expect_ok("tracing set", "tracing:\n  otlp_endpoint: http://otel:4318\n  sample_ratio: 0.25\n"
                                 "  trace_field: tp\n  service_name: px\n" S);
    if (c) {
        test_streq("otlp_endpoint", c->otlp_endpoint, "http://otel:4318");
        test_cond("sample_ratio", c->sample_ratio == 0.25);
        test_streq("trace_field", c->trace_field, "tp");
        test_streq("service_name", c->trace_service_name, "px");
    }
    px_config_destroy(c);
    c = expect_ok("otlp_endpoint \"\" is off", "tracing:\n  otlp_endpoint: \"\"\n  sample_ratio: 0\n" S);
    if (c) test_cond("off", c->otlp_endpoint == NULL && c->sample_ratio == 0);
    px_config_destroy(c);
    px_config_destroy(expect_ok("https endpoint", "tracing: {otlp_endpoint: \"https://c.example/otlp\"}\n" S));
    expect_error("otlp_endpoint not http", "tracing:\n  otlp_endpoint: grpc://otel:4317\n" S,
                 "t.yaml:2:18: ", "tracing.otlp_endpoint: expected an http:// or https:// URL");
    expect_error("otlp_endpoint without host", "tracing:\n  otlp_endpoint: http://\n" S,
                 "t.yaml:2:18: ", "expected an http:// or https:// URL");
    expect_error("sample_ratio over 1", "tracing:\n  sample_ratio: 1.5\n" S, "t.yaml:2:17: ",
                 "tracing.sample_ratio: expected a number from 0 to 1, got '1.5'");
    expect_error("sample_ratio negative", "tracing:\n  sample_ratio: -0.1\n" S, "t.yaml:2:17: ",
                 "expected a number from 0 to 1");
    expect_error("sample_ratio not a number", "tracing:\n  sample_ratio: half\n" S, "t.yaml:2:17: ",
                 "expected a number from 0 to 1");
    expect_error("trace_field empty", "tracing:\n  trace_field: \"\"\n" S, "t.yaml:2:16: ",
                 "must not be empty");
    expect_error("tracing unknown key", "tracing:\n  endpoint: x\n" S, "t.yaml:2:3: ", "endpoint");
}

int main(void)
{
    clear_env();
    test_full();
    test_defaults();
    test_errors();
    test_many_errors();
    test_template_columns();
    test_names();
    test_key_reads();
    test_timings();
    test_dedup_names();
    test_expansion();
    test_env_overrides();
    test_urls();
    test_username();
    test_long_hosts();
    test_sentinel();
    test_tracing();
    px_diags_deinit(&diags);
    return test_report();
}
