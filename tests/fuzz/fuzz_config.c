/*
 * fuzz_config.c - libFuzzer target for the config parser (proxy/config.c,
 * docs/configuration.md): px_config_parse over the input as the YAML text of
 * "fuzz.yaml". The text is not NUL-terminated: ASan sees any read past 'len'.
 *
 * Checks beyond "no crash, no leak, no undefined behaviour":
 * - a config comes back exactly when no diagnostic is an error, and nerrors
 *   counts the errors;
 * - every diagnostic is "fuzz.yaml:LINE:COL: message" with LINE and COL >= 1
 *   and is UTF-8 (libyaml refuses input that is not, so a message that is not
 *   UTF-8 was cut in the middle of a character);
 * - a returned config is complete and valid as config.h promises: every
 *   stream block has a stream, a consumer and a compiled key whose source is
 *   the key, a compiled lock_key exactly when lock_key is set, and the limits
 *   of docs/configuration.md (lease_ms >= 2 x timeout_ms, max_inflight >= 1,
 *   no negative duration, max_deliveries >= 1) hold;
 * - an accepted config keeps the name rules, checked again here from the
 *   config alone (check_names): no dedup name can be one of idemproxy's own
 *   keys, no lock name can be a done name, no lock_key name can be either.
 *
 * The environment is fixed in LLVMFuzzerInitialize: the IDEMPROXY_* overrides
 * are unset and a few variables are set for ${VAR} expansion (seeds use them).
 */
#include <string.h>

#include "config.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsetenv("IDEMPROXY_REDIS_URL");
    unsetenv("IDEMPROXY_ENDPOINT");
    unsetenv("IDEMPROXY_LOG_LEVEL");
    unsetenv("FUZZ_UNSET");
    setenv("HOSTNAME", "pod-7", 1);
    setenv("FUZZ_STREAM", "orders", 1);
    setenv("FUZZ_EMPTY", "", 1);
    setenv("FUZZ_MS", "5000", 1);
    setenv("FUZZ_KEY", "#{event.roomId}:#{event.eventId}", 1);
    return 0;
}

static bool is_digits(const char *s, const char *end)
{
    if (s == end) return false;
    for (; s < end; s++)
        if (*s < '0' || *s > '9') return false;
    return true;
}

/* "fuzz.yaml:LINE:COL: ..." with LINE, COL >= 1. */
static bool diag_positioned(const char *t)
{
    static const char pfx[] = "fuzz.yaml:";
    if (strncmp(t, pfx, sizeof(pfx) - 1) != 0) return false;
    const char *l = t + sizeof(pfx) - 1, *c = strchr(l, ':');
    if (c == NULL || !is_digits(l, c) || atol(l) < 1) return false;
    const char *e = strchr(c + 1, ':');
    if (e == NULL || !is_digits(c + 1, e) || atol(c + 1) < 1) return false;
    return e[1] == ' ';
}

static void check_config(const px_config *c)
{
    FUZZ_CHECK(c->path && strcmp(c->path, "fuzz.yaml") == 0, "path");
    FUZZ_CHECK(c->endpoint && c->endpoint[0], "endpoint");
    FUZZ_CHECK(c->metrics_listen != NULL, "metrics.listen");
    FUZZ_CHECK((c->redis_url != NULL) != (c->ncluster > 0), "url %s, %zu cluster seeds",
               c->redis_url ? "set" : "unset", c->ncluster);
    FUZZ_CHECK(c->redis_url == NULL || c->redis_host || c->redis_unix, "url without a host");
    FUZZ_CHECK(c->timeout_ms > 0, "timeout_ms %lld", c->timeout_ms);
    FUZZ_CHECK(c->max_inflight >= 1, "max_inflight %d", c->max_inflight);
    FUZZ_CHECK(c->max_entry_bytes >= 0, "max_entry_bytes %lld", c->max_entry_bytes);
    FUZZ_CHECK(c->ack_timeout_ms > 0, "ack_timeout_ms %lld", c->ack_timeout_ms);
    FUZZ_CHECK(c->shutdown_grace_ms >= 0, "shutdown_grace_ms %lld", c->shutdown_grace_ms);
    FUZZ_CHECK(c->nstreams >= 1, "no streams");
    for (size_t i = 0; i < c->nstreams; i++) {
        const px_stream_conf *s = &c->streams[i];
        FUZZ_CHECK(s->stream && s->stream[0], "streams[%zu]: stream", i);
        FUZZ_CHECK(s->consumer && s->consumer[0], "streams[%zu]: consumer", i);
        FUZZ_CHECK(s->start && s->prefix && s->lock_prefix && s->done_prefix,
                   "streams[%zu]: a default is missing", i);
        FUZZ_CHECK(s->key && s->key_tpl, "streams[%zu]: key not compiled", i);
        FUZZ_CHECK(strcmp(px_template_source(s->key_tpl), s->key) == 0,
                   "streams[%zu]: key '%s' compiled from '%s'", i, s->key,
                   px_template_source(s->key_tpl));
        FUZZ_CHECK((s->lock_key != NULL) == (s->lock_tpl != NULL),
                   "streams[%zu]: lock_key and its template disagree", i);
        FUZZ_CHECK(s->lock_key == NULL || strcmp(px_template_source(s->lock_tpl), s->lock_key) == 0,
                   "streams[%zu]: lock_key", i);
        FUZZ_CHECK(s->lease_ms >= 2 * c->timeout_ms, "streams[%zu]: lease_ms %lld, timeout %lld",
                   i, s->lease_ms, c->timeout_ms);
        FUZZ_CHECK(s->done_ttl_ms >= s->lease_ms, "streams[%zu]: done_ttl_ms %lld < lease_ms %lld",
                   i, s->done_ttl_ms, s->lease_ms);
        FUZZ_CHECK(s->group == NULL || s->claim_idle_ms / 3 >= c->timeout_ms,
                   "streams[%zu]: claim_idle_ms %lld, timeout %lld", i, s->claim_idle_ms,
                   c->timeout_ms);
        FUZZ_CHECK(px_template_reads_entry(s->key_tpl), "streams[%zu]: a key that reads nothing",
                   i);
        FUZZ_CHECK(s->wait_ms >= 0 && s->done_ttl_ms > 0 && s->retry_backoff_ms >= 0 &&
                   s->claim_idle_ms >= 0, "streams[%zu]: a negative duration", i);
        FUZZ_CHECK(s->max_deliveries >= 1, "streams[%zu]: max_deliveries %d", i,
                   s->max_deliveries);
        FUZZ_CHECK(s->dead_letter == NULL || strcmp(s->dead_letter, s->stream) != 0,
                   "streams[%zu]: dead_letter is the stream", i);
    }
}

/* One prefix is the beginning of the other: some name can start with both. */
static bool overlap(const char *a, size_t al, const char *b, size_t bl)
{
    return memcmp(a, b, al < bl ? al : bl) == 0;
}

/*
 * The name rules (docs/configuration.md, issue 37), checked again from the
 * outside on what was accepted: each block's names start with its prefix(es),
 * "{" with hash_tag, and the key's literal beginning. No such start may be able
 * to begin idemproxy's own keys ("idemproxy:"); a lock name (or a single
 * layout's key, which is both) must not be able to equal a done name, in any
 * two blocks; a lock_key's literal beginning must overlap neither.
 */
static void check_names(const px_config *c)
{
    static const char own[] = "idemproxy:";
    size_t n = 0;
    struct { char *start; size_t len; int kind; size_t block; } *f = calloc(2 * c->nstreams + 1, sizeof(*f));
    px_buf kp = { 0 }, lp = { 0 };
    for (size_t i = 0; i < c->nstreams; i++) {
        const px_stream_conf *sc = &c->streams[i];
        px_template_literal_prefix(sc->key_tpl, &kp);
        const char *pre[2] = { sc->prefix, NULL };
        int kinds[2] = { 0, 0 };
        if (sc->layout == PX_LAYOUT_SPLIT) {
            pre[0] = sc->lock_prefix, kinds[0] = 1;
            pre[1] = sc->done_prefix, kinds[1] = 2;
        }
        for (int k = 0; k < 2 && pre[k]; k++) {
            size_t len = strlen(pre[k]) + (sc->hash_tag ? 1 : 0) + kp.len;
            char *st = malloc(len + 1);
            snprintf(st, len + 1, "%s%s%.*s", pre[k], sc->hash_tag ? "{" : "", (int)kp.len,
                     kp.data ? kp.data : "");
            f[n].start = st, f[n].len = len, f[n].kind = kinds[k], f[n].block = i;
            FUZZ_CHECK(!overlap(st, len, own, sizeof(own) - 1),
                       "streams[%zu]: names starting '%s' can be idemproxy's own", i, st);
            n++;
        }
    }
    for (size_t a = 0; a < n; a++)
        for (size_t b = 0; b < a; b++)
            if (f[a].kind != f[b].kind)
                FUZZ_CHECK(!overlap(f[a].start, f[a].len, f[b].start, f[b].len),
                           "streams[%zu] '%s' and streams[%zu] '%s': a lock can be a done mark",
                           f[a].block, f[a].start, f[b].block, f[b].start);
    for (size_t i = 0; i < c->nstreams; i++) {
        const px_stream_conf *sc = &c->streams[i];
        if (sc->lock_tpl == NULL) continue;
        px_template_literal_prefix(sc->lock_tpl, &lp);
        const char *l = lp.data ? lp.data : "";
        FUZZ_CHECK(!overlap(l, lp.len, own, sizeof(own) - 1),
                   "streams[%zu].lock_key '%s' can be idemproxy's own", i, l);
        for (size_t a = 0; a < n; a++)
            FUZZ_CHECK(!overlap(l, lp.len, f[a].start, f[a].len),
                       "streams[%zu].lock_key '%s' can be streams[%zu]'s '%s'", i, l, f[a].block,
                       f[a].start);
    }
    for (size_t a = 0; a < n; a++) free(f[a].start);
    free(f);
    px_buf_deinit(&kp);
    px_buf_deinit(&lp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    px_diags d;
    memset(&d, 0, sizeof(d));
    px_config *c = px_config_parse("fuzz.yaml", (const char *)data, size, &d);

    size_t errors = 0;
    for (size_t i = 0; i < d.n; i++) {
        const char *t = d.v[i].text;
        FUZZ_CHECK(t != NULL, "diagnostic %zu has no text", i);
        if (!d.v[i].warning) errors++;
        FUZZ_CHECK(diag_positioned(t), "not FILE:LINE:COL: '%s'", t);
        /* Known (echo-utf8): a quoted value is cut at 48 bytes, maybe inside a character. */
        FUZZ_CHECK(px_utf8_valid(t, strlen(t)) || fuzz_known("echo-utf8"), "not UTF-8: '%s'", t);
    }
    FUZZ_CHECK(errors == d.nerrors, "%zu errors, nerrors %zu", errors, d.nerrors);
    FUZZ_CHECK((c != NULL) == (d.nerrors == 0), "config %s with %zu errors",
               c ? "returned" : "refused", d.nerrors);
    if (c) {
        check_config(c);
        check_names(c);
    }

    px_config_destroy(c);
    px_diags_deinit(&d);
    return 0;
}
