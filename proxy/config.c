/*
 * config.c - load, expand and validate the YAML configuration
 * (docs/configuration.md).
 *
 * This is the only code that touches libyaml. The text is loaded as one libyaml
 * document (a node tree that keeps the line and column of every node) and
 * walked with one key -> setter table per section, after twemproxy's
 * nc_conf.c: a setter checks the type and the value of one node and writes one
 * field of px_config or px_stream_conf. The checks that involve several keys
 * (lease_ms against redis.timeout_ms, duplicate stream blocks, redis.url
 * against redis.cluster, the endpoint against app.allow_remote) run after the
 * walk, then the IDEMPROXY_* environment overrides are applied. Nothing stops
 * at the first problem: each one is appended to px_diags as
 * "FILE:LINE:COL: message" (warnings as "FILE:LINE:COL: warning: message"),
 * and the caller gets a config only when none of them is an error.
 *
 * How values are read (docs/configuration.md, "General rules"):
 * - ${VAR} and ${VAR:-default} are expanded in every scalar value (never in
 *   keys) before it is interpreted. ${VAR:-default} takes the default when VAR
 *   is unset or empty, as the shell does; the default is literal text up to
 *   the first '}' (no nesting). An unset ${VAR} becomes "" with a warning at
 *   the scalar. "$$" is a literal "$" (as in docker compose), so "$${X}" gives
 *   the text "${X}"; a '$' followed by anything else is literal (start: "$"
 *   needs no escape). A malformed "${" (no name, no closing '}') is an error.
 * - A YAML null (an empty value, ~ or null) means the key is not set: the
 *   default applies, as if the key were omitted.
 * - Integers and booleans must be plain scalars: timeout_ms: "1000" is a
 *   string and an error. Integers are decimal; durations are integers in ms.
 *   Booleans are true / false only (YAML 1.2: True and TRUE too), not the
 *   YAML 1.1 yes / no / on / off, which read as a typo more often than not.
 * - Enum words (single, retry, info, ...) are matched exactly (lowercase).
 * - "" means "none" for group, payload_field, lock_key, dead_letter, url,
 *   password_file and username, "the default" for consumer, "disabled" for
 *   metrics.listen, and is an error for stream, key and endpoint.
 * - No redis.url and no cluster means redis://127.0.0.1:6379. A url and a
 *   non-empty cluster together are an error. unix:// urls carry no user,
 *   password or db; ?query parameters are refused. rediss:// (or, with
 *   cluster startup nodes, a redis.tls mapping) means TLS; redis.tls with a redis://
 *   or unix:// url is an error (one of them is a mistake).
 * - redis.sentinel (master_name, sentinels) stands for url and cluster and
 *   goes with neither; redis.tls then means TLS to the sentinels and master.
 * - Also refused (docs/configuration.md, at each option): timeout_ms,
 *   ack_timeout_ms, lease_ms and done_ttl_ms of 0 (a timeout or a Redis expiry
 *   of 0 cannot work), durations over 100 years, max_entry_bytes over INT_MAX,
 *   a dead_letter equal to the stream read, dedup names that can be
 *   idemproxy's own keys or names of another kind (a lock and a done mark:
 *   cfg_check_names), an ipc path longer than a unix socket's sun_path, and a
 *   second YAML document in the file.
 * - claim_idle_ms is held to 3 x timeout_ms in group mode only: without a
 *   group nothing is claimed after it.
 * - A constant lock_key is legal and gets a note ("FILE:LINE:COL: note: ...");
 *   stream blocks that share dedup names get a warning.
 * - A duplicate stream block is one with the same stream and the same group
 *   (both absent counts as the same); one stream read by two groups is fine.
 * - IDEMPROXY_* variables set to "" are ignored; IDEMPROXY_LOG_LEVEL is matched
 *   without regard to case, as environment variables are usually upper case.
 *
 * Positions: lines and columns count from 1, columns in characters as libyaml
 * counts them. An error about a value points at the value, an unknown or
 * duplicate key at the key, a problem of a whole stream block at the block. A
 * template error points at the character of the YAML source the template
 * compiler complained about (through quotes, escapes and ${} expansions).
 *
 * Never echoes the redis url or any part of it: it may hold a password.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

#include "addr.h"

#define PX_CONFIG_DEFAULT_REDIS_URL         "redis://127.0.0.1:6379"
#define PX_CONFIG_DEFAULT_REDIS_PORT        6379
#define PX_CONFIG_DEFAULT_TIMEOUT_MS        1000
#define PX_CONFIG_DEFAULT_ENDPOINT          "ipc:///tmp/idemproxy.sock"
#define PX_CONFIG_DEFAULT_MAX_INFLIGHT      256
#define PX_CONFIG_DEFAULT_MAX_ENTRY_BYTES   1048576
#define PX_CONFIG_DEFAULT_ACK_TIMEOUT_MS    30000
#define PX_CONFIG_DEFAULT_SOCKET_MODE       0660
#define PX_CONFIG_DEFAULT_METRICS_LISTEN    "127.0.0.1:9464"
#define PX_CONFIG_DEFAULT_SHUTDOWN_GRACE_MS 10000
#define PX_CONFIG_DEFAULT_START             "0"
#define PX_CONFIG_DEFAULT_KEY               "#event.eventId"
#define PX_CONFIG_DEFAULT_PREFIX            "idem:"
#define PX_CONFIG_DEFAULT_LOCK_PREFIX       "lock:"
#define PX_CONFIG_DEFAULT_DONE_PREFIX       "done:"
#define PX_CONFIG_DEFAULT_WAIT_MS           0
#define PX_CONFIG_DEFAULT_LEASE_MS          5000
#define PX_CONFIG_DEFAULT_DONE_TTL_MS       600000
#define PX_CONFIG_DEFAULT_MAX_DELIVERIES    5
#define PX_CONFIG_DEFAULT_RETRY_BACKOFF_MS  100
#define PX_CONFIG_DEFAULT_CLAIM_IDLE_MS     30000
#define PX_CONFIG_DEFAULT_BATCH_MS          2 /* streams[].batch_ms: about 2 ms more at p99 */
#define PX_CONFIG_DEFAULT_COMMIT_MS         5 /* streams[].commit_ms: after the ack, not before the delivery */

/*
 * The largest duration accepted: 100 years. Far beyond any real setting, and
 * far enough from LLONG_MAX that "now + duration" cannot overflow anywhere
 * (Redis itself refuses a PX whose deadline does not fit).
 */
#define CFG_MAX_MS 3153600000000LL

#define CFG_MAX_OPTS 27 /* keys in the largest table (a stream block) */
#define CFG_ECHO_MAX 48 /* at most this much of a bad value is quoted back */

/* How much of 's' to quote back: at most CFG_ECHO_MAX bytes, cut at a
 * character boundary so a message stays valid UTF-8 (found by fuzz_config). */
static int cfg_echo_len(const char *s)
{
    size_t n = strnlen(s, CFG_ECHO_MAX + 1);
    if (n > CFG_ECHO_MAX) {
        n = CFG_ECHO_MAX;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    return (int)n;
}

#define CFG_URL_FORMS "expected redis[s]://[user:password@]host[:port][/db] or unix:///path"

/* String setters: what an empty value means. */
#define CFG_EMPTY_NULL 1 /* "" is the same as not set (NULL) */
#define CFG_EMPTY_ERR  2 /* "" is an error */
/* Template setters: what the template is for. */
#define CFG_TPL_KEY  4 /* it decides which events are copies: it must read the entry */
#define CFG_TPL_LOCK 8 /* a lock_key: a constant one is legal, with a note */

/* The enums are written through an int pointer by cfg_set_enum. */
_Static_assert(sizeof(px_layout) == sizeof(int), "enum size");
_Static_assert(sizeof(px_on_busy) == sizeof(int), "enum size");
_Static_assert(sizeof(px_on_missing) == sizeof(int), "enum size");
_Static_assert(sizeof(px_on_conflict) == sizeof(int), "enum size");
_Static_assert(sizeof(px_log_level) == sizeof(int), "enum size");
_Static_assert(sizeof(px_log_format) == sizeof(int), "enum size");

/* The key and value nodes of one key of a mapping, once seen. */
typedef struct cfg_seen {
    yaml_node_t *key; /* (ref) NULL: the key is absent */
    yaml_node_t *val; /* (ref) */
} cfg_seen;

/* What the checks after the walk need to know about one stream block. */
typedef struct cfg_stream_aux {
    yaml_node_t *block;       /* (ref) the block's mapping */
    yaml_node_t *lease;       /* (ref) lease_ms value, NULL when defaulted */
    yaml_node_t *done_ttl;    /* (ref) done_ttl_ms value, or NULL */
    yaml_node_t *claim_idle;  /* (ref) claim_idle_ms value, or NULL */
    yaml_node_t *prefix;      /* (ref) or NULL */
    yaml_node_t *lock_prefix; /* (ref) or NULL */
    yaml_node_t *done_prefix; /* (ref) or NULL */
    yaml_node_t *dead_letter; /* (ref) or NULL */
    yaml_node_t *lock_key;    /* (ref) or NULL */
    char name[32];            /* "streams[N]", for messages */
} cfg_stream_aux;

/* One parse: the text, its document, and where the results go. */
typedef struct cfg_parser {
    const char *path; /* (ref) FILE in messages */
    const char *text; /* (ref) the YAML source */
    size_t len;
    size_t *lines; /* byte offset of the start of each line */
    size_t nlines;
    yaml_document_t doc;
    px_diags *d;  /* (ref) */
    px_config *c; /* the config being built */
    cfg_seen top_seen[CFG_MAX_OPTS];
    cfg_seen redis_seen[CFG_MAX_OPTS];
    cfg_seen app_seen[CFG_MAX_OPTS];
    bool sentinel_used;  /* redis.sentinel set to something (not {} or all empty) */
    cfg_stream_aux *aux; /* parallel to c->streams */
    char *consumer;      /* the default consumer name, made once */
} cfg_parser;

/* A scalar value, read and expanded. */
typedef struct cfg_scalar {
    char *s; /* the value after ${} expansion; owned, NUL-terminated */
    size_t len;
    size_t *map; /* s[i] came from text[map[i]]; map[len] is just past the value;
                        NULL when the source position is not known (multi-line) */
    bool quoted; /* quoted or a block scalar: never a number or a boolean */
} cfg_scalar;

typedef struct cfg_opt cfg_opt;
typedef void (*cfg_set_fn)(cfg_parser *p, const cfg_opt *o, yaml_node_t *v,
                           void *obj, const char *name);

/* One key of a section: its name, its setter and the field it sets. */
struct cfg_opt {
    const char *name;
    cfg_set_fn set;
    size_t offset;            /* the field in px_config / px_stream_conf */
    size_t offset2;           /* templates: the px_template * field */
    long long min, max;       /* integers */
    const char *const *words; /* enums: the allowed words, in enum order */
    int flags;                /* strings: CFG_EMPTY_* */
};

/* ---------------------------------------------------------------- diags */

static char *cfg_vformat(const char *fmt, va_list ap) __attribute__((format(printf, 1, 0)));

static char *cfg_vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return px_strdup("(unprintable message)");
    char *s = px_malloc((size_t)n + 1);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

/* Append 'text' (owned by 'd' from now on) to 'd'. */
static void diag_push(px_diags *d, bool warning, char *text)
{
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 8;
        d->v = px_realloc(d->v, d->cap * sizeof *d->v);
    }
    d->v[d->n].warning = warning;
    d->v[d->n].text = text;
    d->n++;
    if (!warning) d->nerrors++;
}

static void diag_addv(px_diags *d, const char *kind, const char *prefix, const char *fmt,
                      va_list ap) __attribute__((format(printf, 4, 0)));

/* "PREFIX: message", or "PREFIX: KIND: message" for a 'kind' ("warning",
 * "note") of message that does not make the config invalid. */
static void diag_addv(px_diags *d, const char *kind, const char *prefix, const char *fmt,
                      va_list ap)
{
    char *body = cfg_vformat(fmt, ap);
    px_buf b = { 0 };
    px_buf_printf(&b, "%s: %s%s%s", prefix, kind ? kind : "", kind ? ": " : "", body);
    free(body);
    diag_push(d, kind != NULL, b.data);
}

static void cfg_diag_at(cfg_parser *p, bool warning, size_t line, size_t col,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A problem at 1-based 'line' and 'col' of the file. */
static void cfg_diag_at(cfg_parser *p, bool warning, size_t line, size_t col,
                        const char *fmt, ...)
{
    char prefix[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "%s:%zu:%zu", p->path, line, col);
    va_list ap;
    va_start(ap, fmt);
    diag_addv(p->d, warning ? "warning" : NULL, prefix, fmt, ap);
    va_end(ap);
}

static void cfg_error(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cfg_warning(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cfg_note(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void cfg_env_error(cfg_parser *p, const char *var, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void diag_plain(px_diags *d, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* An error at the start of node 'n'. */
static void cfg_error(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
{
    char prefix[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "%s:%zu:%zu", p->path,
             n->start_mark.line + 1, n->start_mark.column + 1);
    va_list ap;
    va_start(ap, fmt);
    diag_addv(p->d, NULL, prefix, fmt, ap);
    va_end(ap);
}

/* A warning at the start of node 'n'. */
static void cfg_warning(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
{
    char prefix[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "%s:%zu:%zu", p->path,
             n->start_mark.line + 1, n->start_mark.column + 1);
    va_list ap;
    va_start(ap, fmt);
    diag_addv(p->d, "warning", prefix, fmt, ap);
    va_end(ap);
}

/* A note at the start of node 'n': legal, but worth knowing. */
static void cfg_note(cfg_parser *p, const yaml_node_t *n, const char *fmt, ...)
{
    char prefix[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "%s:%zu:%zu", p->path,
             n->start_mark.line + 1, n->start_mark.column + 1);
    va_list ap;
    va_start(ap, fmt);
    diag_addv(p->d, "note", prefix, fmt, ap);
    va_end(ap);
}

/* An error in the value of environment variable 'var': "VAR: message". */
static void cfg_env_error(cfg_parser *p, const char *var, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_addv(p->d, NULL, var, fmt, ap);
    va_end(ap);
}

/* An error without a position: "PREFIX: message". */
static void diag_plain(px_diags *d, const char *prefix, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_addv(d, NULL, prefix, fmt, ap);
    va_end(ap);
}

void px_diags_deinit(px_diags *d)
{
    if (d == NULL) return;
    for (size_t i = 0; i < d->n; i++) free(d->v[i].text);
    free(d->v);
    d->v = NULL;
    d->n = d->cap = d->nerrors = 0;
}

/* ------------------------------------------------------------ positions */

/*
 * Record where each line of the text starts, breaking lines where libyaml
 * does: CR LF, CR, LF, NEL, LS and PS. A UTF-8 byte order mark is not part of
 * line 1's columns.
 */
static void cfg_index_lines(cfg_parser *p)
{
    const unsigned char *t = (const unsigned char *)p->text;
    size_t n = p->len, cap = 64, k = 0;
    p->lines = px_malloc(cap * sizeof *p->lines);
    p->lines[k++] = (n >= 3 && t[0] == 0xEF && t[1] == 0xBB && t[2] == 0xBF) ? 3 : 0;
    for (size_t i = 0; i < n;) {
        size_t w = 0;
        if (t[i] == '\r') w = (i + 1 < n && t[i + 1] == '\n') ? 2 : 1;
        else if (t[i] == '\n') w = 1;
        else if (t[i] == 0xC2 && i + 1 < n && t[i + 1] == 0x85) w = 2;
        else if (t[i] == 0xE2 && i + 2 < n && t[i + 1] == 0x80 &&
                 (t[i + 2] == 0xA8 || t[i + 2] == 0xA9)) w = 3;
        if (w == 0) {
            i++;
            continue;
        }
        i += w;
        if (k == cap) {
            cap *= 2;
            p->lines = px_realloc(p->lines, cap * sizeof *p->lines);
        }
        p->lines[k++] = i;
    }
    p->nlines = k;
}

static size_t cfg_utf8_width(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

/* The byte offset in the text of libyaml mark 'm' (columns are characters). */
static size_t cfg_mark_offset(const cfg_parser *p, yaml_mark_t m)
{
    if (m.line >= p->nlines) return SIZE_MAX;
    size_t off = p->lines[m.line];
    for (size_t k = 0; k < m.column && off < p->len; k++)
        off += cfg_utf8_width((unsigned char)p->text[off]);
    return off;
}

/* The 1-based line and column (in characters) of byte offset 'off'. */
static void cfg_offset_pos(const cfg_parser *p, size_t off, size_t *line, size_t *col)
{
    size_t lo = 0, hi = p->nlines;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (p->lines[mid] <= off) lo = mid;
        else hi = mid;
    }
    size_t c = 1;
    for (size_t k = p->lines[lo]; k < off && k < p->len; k++)
        if (((unsigned char)p->text[k] & 0xC0) != 0x80) c++;
    *line = lo + 1;
    *col = c;
}

static int cfg_hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/*
 * How many bytes of value the double-quoted escape at 't' (the backslash,
 * 'avail' bytes left) produces, and how many source bytes it takes ('*srclen').
 * Returns 0 for an escape it does not know (then positions are not mapped).
 */
static size_t cfg_escape_width(const char *t, size_t avail, size_t *srclen)
{
    if (avail < 2) return 0;
    size_t hex;
    switch (t[1]) {
    case 'x': hex = 2; break;
    case 'u': hex = 4; break;
    case 'U': hex = 8; break;
    case 'N':
    case '_': *srclen = 2; return 2; /* U+0085, U+00A0 */
    case 'L':
    case 'P': *srclen = 2; return 3; /* U+2028, U+2029 */
    case '0':
    case 'a':
    case 'b':
    case 't':
    case '\t':
    case 'n':
    case 'v':
    case 'f':
    case 'r':
    case 'e':
    case ' ':
    case '"':
    case '/':
    case '\\':
        *srclen = 2;
        return 1;
    default:
        return 0;
    }
    if (avail < 2 + hex) return 0;
    unsigned long cp = 0;
    for (size_t i = 0; i < hex; i++) {
        int h = cfg_hexval((unsigned char)t[2 + i]);
        if (h < 0) return 0;
        cp = cp * 16 + (unsigned long)h;
    }
    *srclen = 2 + hex;
    return cp < 0x80 ? 1 : cp < 0x800 ? 2
                       : cp < 0x10000 ? 3
                                      : 4;
}

/*
 * Map each byte of scalar 'n''s value to the byte of the text it was written
 * as. Only for scalars written on one line (plain, single- or double-quoted);
 * returns NULL for the others, or if the source does not match the value.
 * The array has length + 1 entries and is freed by the caller.
 */
static size_t *cfg_raw_map(const cfg_parser *p, const yaml_node_t *n)
{
    const char *v = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    yaml_scalar_style_t style = n->data.scalar.style;
    if (n->start_mark.line != n->end_mark.line) return NULL;
    if (style != YAML_PLAIN_SCALAR_STYLE && style != YAML_SINGLE_QUOTED_SCALAR_STYLE &&
        style != YAML_DOUBLE_QUOTED_SCALAR_STYLE) return NULL;
    size_t s = cfg_mark_offset(p, n->start_mark);
    if (s >= p->len && len > 0) return NULL;
    const char *t = p->text;
    size_t *map = px_malloc((len + 1) * sizeof *map);
    size_t i = 0;
    if (style != YAML_PLAIN_SCALAR_STYLE) s++; /* the opening quote */
    while (i < len) {
        if (s >= p->len) goto fail;
        if (style == YAML_SINGLE_QUOTED_SCALAR_STYLE && t[s] == '\'') {
            if (s + 1 >= p->len || t[s + 1] != '\'' || v[i] != '\'') goto fail;
            map[i++] = s;
            s += 2;
        } else if (style == YAML_DOUBLE_QUOTED_SCALAR_STYLE && t[s] == '\\') {
            size_t srclen = 0, w = cfg_escape_width(t + s, p->len - s, &srclen);
            if (w == 0 || i + w > len) goto fail;
            while (w--) map[i++] = s;
            s += srclen;
        } else {
            if (t[s] != v[i]) goto fail;
            map[i++] = s++;
        }
    }
    map[len] = s;
    return map;
fail:
    free(map);
    return NULL;
}

/* ------------------------------------------------------------- scalars */

static bool cfg_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    return len == 0 || (len == 1 && v[0] == '~') ||
           (len == 4 && (memcmp(v, "null", 4) == 0 || memcmp(v, "Null", 4) == 0 ||
                         memcmp(v, "NULL", 4) == 0));
}

static const char *cfg_kind(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return cfg_is_null(n) ? "null" : "a scalar";
    }
}

static bool cfg_name_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static bool cfg_name_char(char c)
{
    return cfg_name_start(c) || (c >= '0' && c <= '9');
}

/*
 * Append 'n' bytes of 's' to 'out' and their source offsets to 'map' (when
 * 'inmap' is known): inmap[at + k] for literal text ('step'), inmap[at] for
 * every byte of an expanded variable.
 */
static void cfg_emit(px_buf *out, px_buf *map, const size_t *inmap, const char *s,
                     size_t n, size_t at, bool step)
{
    px_buf_append(out, s, n);
    if (inmap == NULL) return;
    for (size_t k = 0; k < n; k++)
        px_buf_append(map, &inmap[step ? at + k : at], sizeof(size_t));
}

/*
 * Expand ${VAR}, ${VAR:-default} and $$ in 'in' ('len' bytes; source offsets
 * in 'inmap' or NULL) into 'sc'. Unset variables warn at node 'n' (HOSTNAME
 * falls back to gethostname()); a malformed
 * "${" is an error. Returns false after reporting an error.
 */
static bool cfg_expand(cfg_parser *p, const yaml_node_t *n, const char *name,
                       const char *in, size_t len, const size_t *inmap, cfg_scalar *sc)
{
    px_buf out = { 0 }, map = { 0 };
    size_t i = 0;
    while (i < len) {
        if (in[i] != '$' || i + 1 >= len || (in[i + 1] != '$' && in[i + 1] != '{')) {
            cfg_emit(&out, &map, inmap, in + i, 1, i, true);
            i++;
            continue;
        }
        if (in[i + 1] == '$') {
            cfg_emit(&out, &map, inmap, "$", 1, i, false);
            i += 2;
            continue;
        }
        size_t at = i + 2, j = at;
        if (j < len && cfg_name_start(in[j]))
            for (j++; j < len && cfg_name_char(in[j]); j++) {}
        if (j == at) {
            cfg_error(p, n, "%s: expected a variable name after '${' "
                            "(write $$ for a literal $)",
                      name);
            goto fail;
        }
        char *var = px_strndup(in + at, j - at);
        const char *def = NULL;
        size_t def_at = 0, def_len = 0;
        if (j < len && in[j] == '}') {
            j++;
        } else if (j + 1 < len && in[j] == ':' && in[j + 1] == '-') {
            size_t k = j + 2;
            while (k < len && in[k] != '}') k++;
            if (k >= len) {
                cfg_error(p, n, "%s: '${%s:-' has no closing '}'", name, var);
                free(var);
                goto fail;
            }
            def = in + j + 2;
            def_at = j + 2;
            def_len = k - def_at;
            j = k + 1;
        } else {
            cfg_error(p, n, "%s: '${%s' has no closing '}' (or ':-default}')", name, var);
            free(var);
            goto fail;
        }
        const char *val = getenv(var);
        /* bash sets HOSTNAME without exporting it: unset, it is the host's name. */
        char host[256];
        if (val == NULL && strcmp(var, "HOSTNAME") == 0 && gethostname(host, sizeof host) == 0) {
            host[sizeof host - 1] = '\0';
            val = host;
        }
        if (def != NULL && (val == NULL || *val == '\0')) {
            cfg_emit(&out, &map, inmap, def, def_len, def_at, true);
        } else {
            if (val == NULL) {
                cfg_warning(p, n, "%s: environment variable %s is not set; "
                                  "using the empty string",
                            name, var);
                val = "";
            }
            cfg_emit(&out, &map, inmap, val, strlen(val), i, false);
        }
        free(var);
        i = j;
    }
    px_buf_append(&out, "", 0); /* allocated and terminated */
    sc->s = out.data;
    sc->len = out.len;
    sc->map = NULL;
    if (inmap != NULL) {
        px_buf_append(&map, &inmap[len], sizeof(size_t));
        sc->map = (size_t *)(void *)map.data;
    }
    return true;
fail:
    px_buf_deinit(&out);
    px_buf_deinit(&map);
    return false;
}

static void cfg_scalar_free(cfg_scalar *sc)
{
    free(sc->s);
    free(sc->map);
    sc->s = NULL;
    sc->map = NULL;
}

/*
 * Read scalar node 'n' into 'sc', ${} expanded. 'expect' says what the key
 * takes ("an integer") for the message when 'n' is not a scalar. Returns false
 * after reporting an error; on true the caller frees 'sc' (cfg_scalar_free).
 */
static bool cfg_scalar_get(cfg_parser *p, const yaml_node_t *n, const char *name,
                           const char *expect, cfg_scalar *sc)
{
    memset(sc, 0, sizeof *sc);
    if (n->type != YAML_SCALAR_NODE) {
        cfg_error(p, n, "%s: expected %s, got %s", name, expect, cfg_kind(n));
        return false;
    }
    const char *raw = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length;
    if (memchr(raw, '\0', len) != NULL) {
        cfg_error(p, n, "%s: the value contains a NUL character", name);
        return false;
    }
    sc->quoted = n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    size_t *rawmap = cfg_raw_map(p, n);
    bool ok = cfg_expand(p, n, name, raw, len, rawmap, sc);
    free(rawmap);
    return ok;
}

/* ------------------------------------------------------ small validators */

/* Parse a decimal integer: 0 ok, 1 not an integer, 2 out of range. */
static int cfg_parse_ll(const char *s, long long *out)
{
    const char *d = s;
    if (*d == '-' || *d == '+') d++;
    if (*d == '\0') return 1;
    for (const char *q = d; *q; q++)
        if (*q < '0' || *q > '9') return 1;
    errno = 0;
    long long v = strtoll(s, NULL, 10);
    if (errno == ERANGE) return 2;
    *out = v;
    return 0;
}

/* 'n' bytes of 's' are a TCP port, 1..65535. */
static bool cfg_port(const char *s, size_t n, int *port)
{
    if (n == 0 || n > 5) return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535) return false;
    if (port) *port = v;
    return true;
}

/* 'n' bytes of 's' make a host name or an IPv4 address (letters, digits, . - _). */
static bool cfg_hostname(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!cfg_name_char(c) && c != '.' && c != '-') return false;
    }
    return true;
}

/* 'n' bytes of 's' could be an IPv6 address (what goes between brackets). */
static bool cfg_ipv6ish(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (cfg_hexval((unsigned char)s[i]) < 0 && s[i] != ':' && s[i] != '.') return false;
    return true;
}

/*
 * 's' is "host:port" with host a name, an IPv4 address or a bracketed IPv6
 * address. With 'host_optional', ":port" (every interface) is accepted too.
 * px_addr_split splits it as the daemon will (metrics.c, cluster.c), so a
 * host too long for the daemon's buffers is refused here, not dropped later.
 */
static bool cfg_host_port(const char *s, bool host_optional)
{
    char host[PX_ADDR_HOST_MAX];
    int port;
    if (!px_addr_split(s, host, sizeof host, &port, host_optional ? PX_ADDR_HOST_OPTIONAL : 0))
        return false;
    size_t n = strlen(host);
    return n == 0 || (s[0] == '[' ? cfg_ipv6ish(host, n) : cfg_hostname(host, n));
}

/* "localhost", 127.x.x.x or ::1, decided without resolving anything. */
static bool cfg_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(host, "localhost") == 0) return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return ((const unsigned char *)&a4)[0] == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/*
 * Check app endpoint 'ep': ipc://PATH (a path that fits a unix socket's
 * sun_path), or tcp://HOST:PORT on a loopback address unless 'allow_remote'.
 * Returns true, or false with the reason in 'why'.
 */
static bool cfg_endpoint_ok(const char *ep, bool allow_remote, char *why, size_t whylen)
{
    if (strncmp(ep, "ipc://", 6) == 0) {
        size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
        if (ep[6] == '\0') {
            snprintf(why, whylen, "ipc:// needs a path, as in ipc:///tmp/idemproxy.sock");
            return false;
        }
        if (strlen(ep + 6) > max) {
            /* nanomsg 1.1.5 asserts (aborts) on a longer path */
            snprintf(why, whylen, "the ipc path is %zu bytes long; a unix socket path holds at "
                                  "most %zu: choose a shorter one, such as "
                                  "ipc:///tmp/idemproxy.sock",
                     strlen(ep + 6), max);
            return false;
        }
        return true;
    }
    if (strncmp(ep, "tcp://", 6) != 0) {
        snprintf(why, whylen, "'%.*s' must start with ipc:// or tcp://", cfg_echo_len(ep), ep);
        return false;
    }
    /* The port follows the last ':': nn_tcp(7) takes an IPv6 address with or
     * without brackets, and "*" on a bind. The host is nanomsg's to read, so
     * only loopback is checked here. */
    char host[PX_ADDR_HOST_MAX];
    int port;
    if (!px_addr_split(ep + 6, host, sizeof host, &port, PX_ADDR_BARE_IPV6)) {
        snprintf(why, whylen, "'%.*s' needs a host and a port, as in tcp://127.0.0.1:5555",
                 cfg_echo_len(ep), ep);
        return false;
    }
    if (!allow_remote && !cfg_loopback(host)) {
        snprintf(why, whylen, "'%.*s' is not on a loopback address (127.0.0.1, localhost, "
                              "[::1]); set app.allow_remote: true to let remote workers connect",
                 cfg_echo_len(ep), ep);
        return false;
    }
    return true;
}

/* Percent-decode 'n' bytes of 's' into a new string; false on a bad or %00 escape. */
static bool cfg_percent_decode(const char *s, size_t n, char **out)
{
    char *o = px_malloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '%') {
            o[k++] = s[i++];
            continue;
        }
        if (i + 2 >= n) { /* fewer than two hex digits follow */
            free(o);
            return false;
        }
        int h1 = cfg_hexval((unsigned char)s[i + 1]), h2 = cfg_hexval((unsigned char)s[i + 2]);
        if (h1 < 0 || h2 < 0 || (h1 == 0 && h2 == 0)) {
            free(o);
            return false;
        }
        o[k++] = (char)(h1 * 16 + h2);
        i += 3;
    }
    o[k] = '\0';
    *out = o;
    return true;
}

/* Forget what was parsed from the redis url. */
static void cfg_redis_reset(px_config *c)
{
    free(c->redis_host);
    free(c->redis_unix);
    free(c->redis_user);
    px_free_secret(c->redis_password);
    c->redis_host = c->redis_unix = c->redis_user = c->redis_password = NULL;
    c->redis_port = PX_CONFIG_DEFAULT_REDIS_PORT;
    c->redis_db = 0;
    c->redis_tls.enabled = false;
}

/*
 * Parse 'url' into c->redis_host / port / unix / user / password / db:
 * redis://[user[:password]@]host[:port][/db] or unix:///path. The user info
 * ends at the last '@', so an unescaped '@' or '/' in a password still works;
 * user and password are percent-decoded. Returns true, or false with a reason
 * in 'why' that never quotes the url.
 */
static bool cfg_redis_url(px_config *c, const char *url, char *why, size_t whylen)
{
    char *user = NULL, *pass = NULL;
    cfg_redis_reset(c);
    if (strncmp(url, "unix://", 7) == 0) {
        const char *path = url + 7;
        if (path[0] != '/' || path[1] == '\0') {
            snprintf(why, whylen, "unix:// needs an absolute socket path");
            return false;
        }
        if (strpbrk(path, "?#") != NULL) {
            snprintf(why, whylen, "query parameters are not supported");
            return false;
        }
        c->redis_unix = px_strdup(path);
        return true;
    }
    bool tls = strncmp(url, "rediss://", 9) == 0;
    if (!tls && strncmp(url, "redis://", 8) != 0) {
        snprintf(why, whylen, "unknown scheme");
        return false;
    }
    const char *rest = url + (tls ? 9 : 8), *host = rest, *at = strrchr(rest, '@');
    if (at != NULL) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        const char *uend = colon ? colon : at;
        if (!cfg_percent_decode(rest, (size_t)(uend - rest), &user) ||
            (colon && !cfg_percent_decode(colon + 1, (size_t)(at - colon - 1), &pass))) {
            snprintf(why, whylen, "bad percent-encoding in the user or password");
            goto fail;
        }
        host = at + 1;
    }
    if (strpbrk(host, "?#") != NULL) {
        snprintf(why, whylen, "query parameters are not supported");
        goto fail;
    }
    const char *slash = strchr(host, '/');
    const char *aend = slash ? slash : host + strlen(host);
    const char *hs = host, *he, *ps = NULL;
    if (hs < aend && hs[0] == '[') {
        const char *close = memchr(hs, ']', (size_t)(aend - hs));
        if (close == NULL || !cfg_ipv6ish(hs + 1, (size_t)(close - hs - 1)) ||
            (close + 1 < aend && close[1] != ':')) {
            snprintf(why, whylen, "bad IPv6 host");
            goto fail;
        }
        he = close;
        hs++;
        if (close + 1 < aend) ps = close + 2;
    } else {
        const char *colon = memchr(hs, ':', (size_t)(aend - hs));
        he = colon ? colon : aend;
        if (colon) ps = colon + 1;
        if ((colon && memchr(colon + 1, ':', (size_t)(aend - colon - 1))) ||
            (he > hs && !cfg_hostname(hs, (size_t)(he - hs)))) {
            snprintf(why, whylen, "bad host (an IPv6 address goes in brackets)");
            goto fail;
        }
    }
    if (he == hs) {
        snprintf(why, whylen, "no host");
        goto fail;
    }
    int port = PX_CONFIG_DEFAULT_REDIS_PORT;
    if (ps && !cfg_port(ps, (size_t)(aend - ps), &port)) {
        snprintf(why, whylen, "bad port");
        goto fail;
    }
    long long db = 0;
    if (slash && slash[1] != '\0' &&
        (slash[1] == '-' || slash[1] == '+' || cfg_parse_ll(slash + 1, &db) != 0 || db > INT_MAX)) {
        snprintf(why, whylen, "the database must be a number");
        goto fail;
    }
    c->redis_host = px_strndup(hs, (size_t)(he - hs));
    c->redis_tls.enabled = tls;
    c->redis_port = port;
    c->redis_db = (int)db;
    if (user && *user) c->redis_user = user;
    else free(user);
    if (pass && *pass) c->redis_password = pass;
    else free(pass);
    return true;
fail:
    free(user);
    free(pass);
    return false;
}

/* "<hostname>-<pid>": the default consumer name, made once per parse. */
static const char *cfg_default_consumer(cfg_parser *p)
{
    if (p->consumer == NULL) {
        char host[256];
        if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "localhost");
        host[sizeof host - 1] = '\0';
        px_buf b = { 0 };
        px_buf_printf(&b, "%s-%ld", host, (long)getpid());
        p->consumer = b.data;
    }
    return p->consumer;
}

/* ------------------------------------------------------------- setters */

static void cfg_set_str(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                        const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "a string", &sc)) return;
    char **field = (char **)(void *)((char *)obj + o->offset);
    if (sc.len == 0 && (o->flags & CFG_EMPTY_ERR)) {
        cfg_error(p, v, "%s: must not be empty", name);
    } else {
        free(*field);
        *field = NULL;
        if (sc.len > 0 || !(o->flags & CFG_EMPTY_NULL)) {
            *field = sc.s;
            sc.s = NULL;
        }
    }
    cfg_scalar_free(&sc);
}

/* Read an integer in [o->min, o->max]; 'ms' says it is a duration. */
static bool cfg_integer(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, const char *name,
                        bool ms, long long *out)
{
    cfg_scalar sc;
    long long val = 0;
    bool ok = false;
    if (!cfg_scalar_get(p, v, name, ms ? "a duration in milliseconds" : "an integer", &sc))
        return false;
    int rc = sc.quoted ? 1 : cfg_parse_ll(sc.s, &val);
    if (sc.quoted)
        cfg_error(p, v, "%s: expected %s, got a quoted string (write numbers without quotes)",
                  name, ms ? "a duration in milliseconds" : "an integer");
    else if (rc == 1)
        cfg_error(p, v, "%s: expected %s, got '%.*s'", name,
                  ms ? "a duration (an integer, in milliseconds)" : "an integer",
                  cfg_echo_len(sc.s), sc.s);
    else if (rc == 2)
        cfg_error(p, v, "%s: %.*s is out of range", name, cfg_echo_len(sc.s), sc.s);
    else if (ms && val < 0)
        cfg_error(p, v, "%s: a duration must not be negative (got %lld)", name, val);
    else if (val < o->min)
        cfg_error(p, v, "%s: must be at least %lld (got %lld)", name, o->min, val);
    else if (val > o->max)
        cfg_error(p, v, "%s: must be at most %lld (got %lld)", name, o->max, val);
    else
        ok = true;
    cfg_scalar_free(&sc);
    if (ok) *out = val;
    return ok;
}

static void cfg_set_ms(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                       const char *name)
{
    long long val;
    if (cfg_integer(p, o, v, name, true, &val))
        *(long long *)(void *)((char *)obj + o->offset) = val;
}

static void cfg_set_llong(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                          const char *name)
{
    long long val;
    if (cfg_integer(p, o, v, name, false, &val))
        *(long long *)(void *)((char *)obj + o->offset) = val;
}

static void cfg_set_int(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                        const char *name)
{
    long long val;
    if (cfg_integer(p, o, v, name, false, &val))
        *(int *)(void *)((char *)obj + o->offset) = (int)val;
}

static void cfg_set_bool(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                         const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "true or false", &sc)) return;
    bool *field = (bool *)(void *)((char *)obj + o->offset);
    if (sc.quoted)
        cfg_error(p, v, "%s: expected true or false, got a quoted string", name);
    else if (!strcmp(sc.s, "true") || !strcmp(sc.s, "True") || !strcmp(sc.s, "TRUE"))
        *field = true;
    else if (!strcmp(sc.s, "false") || !strcmp(sc.s, "False") || !strcmp(sc.s, "FALSE"))
        *field = false;
    else
        cfg_error(p, v, "%s: expected true or false, got '%.*s'", name, cfg_echo_len(sc.s), sc.s);
    cfg_scalar_free(&sc);
}

/* "a, b or c" for the words of an enum. */
static void cfg_words(px_buf *b, const char *const *words)
{
    for (size_t i = 0; words[i]; i++)
        px_buf_printf(b, "%s%s", i == 0 ? "" : words[i + 1] ? ", "
                                                            : " or ",
                      words[i]);
}

/* The index of 'word' in the NULL-terminated 'words', or -1. */
static int cfg_word_index(const char *const *words, const char *word)
{
    for (int i = 0; words[i]; i++)
        if (strcmp(words[i], word) == 0) return i;
    return -1;
}

static void cfg_set_enum(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                         const char *name)
{
    cfg_scalar sc;
    px_buf b = { 0 };
    cfg_words(&b, o->words);
    if (cfg_scalar_get(p, v, name, b.data, &sc)) {
        int i = cfg_word_index(o->words, sc.s);
        if (i >= 0) *(int *)(void *)((char *)obj + o->offset) = i;
        else cfg_error(p, v, "%s: expected %s, got '%.*s'", name, b.data, cfg_echo_len(sc.s), sc.s);
        cfg_scalar_free(&sc);
    }
    px_buf_deinit(&b);
}

/* socket_mode: an octal string of four digits, "0660". */
static void cfg_set_mode(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                         const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "an octal mode such as \"0660\"", &sc)) return;
    const char *s = sc.s;
    if (sc.len == 4 && s[0] == '0' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' &&
        s[2] <= '7' && s[3] >= '0' && s[3] <= '7')
        *(int *)(void *)((char *)obj + o->offset) = (int)strtol(s, NULL, 8);
    else
        cfg_error(p, v, "%s: expected an octal mode such as \"0660\", got '%.*s'", name,
                  cfg_echo_len(s), s);
    cfg_scalar_free(&sc);
}

/* 's' is "0", "$" or an entry id: digits, optionally "-" digits. */
static bool cfg_start_ok(const char *s)
{
    if (strcmp(s, "$") == 0) return true;
    const char *q = s;
    for (int part = 0; part < 2; part++) {
        const char *d = q;
        while (*q >= '0' && *q <= '9') q++;
        if (q == d || q - d > 20) return false;
        errno = 0;
        (void)strtoull(d, NULL, 10);
        if (errno == ERANGE) return false;
        if (*q == '\0') return true;
        if (*q != '-' || part == 1) return false;
        q++;
    }
    return false;
}

static void cfg_set_start(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                          const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "\"0\", \"$\" or an entry id", &sc)) return;
    char **field = (char **)(void *)((char *)obj + o->offset);
    if (cfg_start_ok(sc.s)) {
        free(*field);
        *field = sc.s;
        sc.s = NULL;
    } else {
        cfg_error(p, v, "%s: expected \"0\", \"$\" or an entry id such as 1700000000000-0, "
                        "got '%.*s'",
                  name, cfg_echo_len(sc.s), sc.s);
    }
    cfg_scalar_free(&sc);
}

/* metrics.listen: host:port, or "" to disable. */
static void cfg_set_listen(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                           const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "host:port", &sc)) return;
    char **field = (char **)(void *)((char *)obj + o->offset);
    if (sc.len == 0 || cfg_host_port(sc.s, true)) {
        free(*field);
        *field = sc.s;
        sc.s = NULL;
    } else {
        cfg_error(p, v, "%s: expected host:port such as 127.0.0.1:9464 (or \"\" to disable), "
                        "got '%.*s'",
                  name, cfg_echo_len(sc.s), sc.s);
    }
    cfg_scalar_free(&sc);
}

/* redis.cluster: a list of "host:port" startup nodes. */
static void cfg_set_cluster(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                            const char *name)
{
    px_config *c = obj;
    (void)o;
    if (v->type != YAML_SEQUENCE_NODE) {
        cfg_error(p, v, "%s: expected a list of host:port startup nodes, got %s", name, cfg_kind(v));
        return;
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    c->cluster = px_calloc(n, sizeof *c->cluster);
    c->ncluster = 0;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = yaml_document_get_node(&p->doc, v->data.sequence.items.start[i]);
        char iname[64];
        cfg_scalar sc;
        if (item == NULL) continue;
        snprintf(iname, sizeof iname, "%s[%zu]", name, i);
        if (!cfg_scalar_get(p, item, iname, "host:port", &sc)) continue;
        if (cfg_host_port(sc.s, false)) {
            c->cluster[c->ncluster++] = sc.s;
            sc.s = NULL;
        } else {
            cfg_error(p, item, "%s: expected host:port, got '%.*s'", iname, cfg_echo_len(sc.s), sc.s);
        }
        cfg_scalar_free(&sc);
    }
}

/* px_template_check_key speaks of keys; for a fingerprint that reads
 * nothing, say what it does there: every event the same fingerprint, so no
 * copy is ever a conflict. */
static void cfg_fingerprint_words(char *err, size_t size)
{
    static const char *const from[] = {
        "every event gets the same key and all but the first count as duplicates",
        "the same key for every event",
    };
    static const char *const to[] = {
        "every event gets the same fingerprint and no copy is ever a conflict",
        "the same fingerprint for every event",
    };
    for (size_t i = 0; i < 2; i++) {
        char *at = strstr(err, from[i]);
        if (at == NULL) continue;
        px_buf b = { 0 };
        px_buf_append(&b, err, (size_t)(at - err));
        px_buf_appends(&b, to[i]);
        px_buf_appends(&b, at + strlen(from[i]));
        snprintf(err, size, "%s", b.data);
        px_buf_deinit(&b);
    }
}

/* key / lock_key: the source goes to 'offset', the compiled template to
 * 'offset2'; 'flags' say what else it must pass (CFG_TPL_*). */
static void cfg_set_template(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                             const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "a template", &sc)) return;
    char **src = (char **)(void *)((char *)obj + o->offset);
    px_template **tpl = (px_template **)(void *)((char *)obj + o->offset2);
    if (sc.len == 0) {
        if (o->flags & CFG_EMPTY_NULL) {
            free(*src);
            if (*tpl) px_template_destroy(*tpl);
            *src = NULL;
            *tpl = NULL;
        } else {
            cfg_error(p, v, "%s: must not be empty", name);
        }
        cfg_scalar_free(&sc);
        return;
    }
    char err[256] = "";
    int errcol = 0;
    px_template *t = px_template_compile(sc.s, err, sizeof err, &errcol);
    if (t != NULL && (o->flags & CFG_TPL_KEY) &&
        px_template_check_key(t, err, sizeof err, &errcol) != PX_OK) {
        if (strcmp(o->name, "fingerprint") == 0) cfg_fingerprint_words(err, sizeof err);
        px_template_destroy(t);
        t = NULL;
    }
    if (t != NULL && (o->flags & CFG_TPL_LOCK) && !px_template_reads_entry(t))
        cfg_note(p, v, "%s: reads nothing from the entry, so it is one lock for every event "
                       "of the stream: one event at a time across all instances",
                 name);
    if (t == NULL) {
        /* 'errcol' counts characters of the value: find its byte, then its source */
        size_t chars = errcol > 0 ? (size_t)errcol - 1 : 0, k = 0, line, col;
        for (size_t c = 0; c < chars && k < sc.len; c++)
            k += cfg_utf8_width((unsigned char)sc.s[k]);
        if (k > sc.len) k = sc.len;
        if (sc.map != NULL) {
            cfg_offset_pos(p, sc.map[k], &line, &col);
        } else {
            /* multi-line: the scalar's position plus the column, past a quote */
            bool quote = v->data.scalar.style == YAML_SINGLE_QUOTED_SCALAR_STYLE ||
                         v->data.scalar.style == YAML_DOUBLE_QUOTED_SCALAR_STYLE;
            line = v->start_mark.line + 1;
            col = v->start_mark.column + 1 + (quote ? 1 : 0) + chars;
        }
        cfg_diag_at(p, false, line, col, "%s: %s", name, err[0] ? err : "bad template");
    } else {
        free(*src);
        if (*tpl) px_template_destroy(*tpl);
        *src = sc.s;
        *tpl = t;
        sc.s = NULL;
    }
    cfg_scalar_free(&sc);
}

/* ---------------------------------------------------------- the walker */

static size_t cfg_nopts(const cfg_opt *opts)
{
    size_t n = 0;
    while (opts[n].name) n++;
    return n;
}

/* Edit distance of two short strings, for "did you mean". */
static size_t cfg_distance(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b), row[42];
    if (alen > 40 || blen > 40) return SIZE_MAX;
    for (size_t j = 0; j <= blen; j++) row[j] = j;
    for (size_t i = 1; i <= alen; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= blen; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[blen];
}

/*
 * Walk mapping 'map' with table 'opts', calling each key's setter on 'obj'.
 * 'prefix' names the section in messages (NULL at the top level). 'seen'
 * (CFG_MAX_OPTS entries, zeroed) gets the key and value node of every key set.
 * Unknown keys, duplicate keys and non-scalar keys are errors; a null value is
 * skipped (the default stays).
 */
static void cfg_walk(cfg_parser *p, yaml_node_t *map, const cfg_opt *opts, void *obj,
                     const char *prefix, cfg_seen *seen)
{
    size_t nopts = cfg_nopts(opts);
    if (map->type != YAML_MAPPING_NODE) {
        cfg_error(p, map, "%s: expected a mapping, got %s", prefix ? prefix : "the config",
                  cfg_kind(map));
        return;
    }
    for (yaml_node_pair_t *pair = map->data.mapping.pairs.start;
         pair < map->data.mapping.pairs.top; pair++) {
        yaml_node_t *k = yaml_document_get_node(&p->doc, pair->key);
        yaml_node_t *v = yaml_document_get_node(&p->doc, pair->value);
        if (k == NULL || v == NULL) continue;
        if (k->type != YAML_SCALAR_NODE) {
            cfg_error(p, k, "%s%sexpected a key, got %s", prefix ? prefix : "",
                      prefix ? ": " : "", cfg_kind(k));
            continue;
        }
        const char *key = (const char *)k->data.scalar.value;
        size_t klen = k->data.scalar.length, i;
        for (i = 0; i < nopts; i++)
            if (strlen(opts[i].name) == klen && memcmp(opts[i].name, key, klen) == 0) break;
        if (i == nopts) {
            const char *near = NULL;
            size_t best = 3;
            for (size_t j = 0; j < nopts; j++) {
                size_t dist = cfg_distance(key, klen, opts[j].name);
                if (dist < best) {
                    best = dist;
                    near = opts[j].name;
                }
            }
            cfg_error(p, k, "%s%sunknown key '%.*s'%s%s%s", prefix ? prefix : "",
                      prefix ? ": " : "", cfg_echo_len(key), key,
                      near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
            continue;
        }
        if (seen[i].key != NULL) {
            cfg_error(p, k, "%s%sduplicate key '%s' (first at line %zu)", prefix ? prefix : "",
                      prefix ? ": " : "", opts[i].name, seen[i].key->start_mark.line + 1);
            continue;
        }
        seen[i].key = k;
        seen[i].val = v;
        if (cfg_is_null(v)) continue;
        char name[96];
        if (prefix) snprintf(name, sizeof name, "%s.%s", prefix, opts[i].name);
        else snprintf(name, sizeof name, "%s", opts[i].name);
        opts[i].set(p, &opts[i], v, obj, name);
    }
}

/* The value node of key 'name' in a walked mapping, NULL when absent or null. */
static yaml_node_t *cfg_seen_val(const cfg_opt *opts, const cfg_seen *seen, const char *name)
{
    for (size_t i = 0; opts[i].name; i++)
        if (strcmp(opts[i].name, name) == 0)
            return seen[i].val && !cfg_is_null(seen[i].val) ? seen[i].val : NULL;
    return NULL;
}

/* ------------------------------------------------------------ the tables */

static const char *const cfg_layouts[] = { "single", "split", NULL };
static const char *const cfg_busy[] = { "retry", "dead_letter", NULL };
static const char *const cfg_missing[] = { "dead_letter", "skip", NULL };
static const char *const cfg_conflict[] = { "dead_letter", "skip", NULL };
static const char *const cfg_levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const cfg_formats[] = { "text", "json", NULL };

#define CFG_STR(type, f, fl) \
    { \
        .name = #f, .set = cfg_set_str, .offset = offsetof(type, f), \
        .flags = (fl) \
    }
#define CFG_MS(type, f, lo) \
    { \
        .name = #f, .set = cfg_set_ms, .offset = offsetof(type, f), \
        .min = (lo), .max = CFG_MAX_MS \
    }
#define CFG_INT(type, f, lo) \
    { \
        .name = #f, .set = cfg_set_int, .offset = offsetof(type, f), \
        .min = (lo), .max = INT_MAX \
    }
#define CFG_ENUM(n, type, f, w) \
    { \
        .name = n, .set = cfg_set_enum, .offset = offsetof(type, f), \
        .words = (w) \
    }
#define CFG_BOOL(type, f) \
    { \
        .name = #f, .set = cfg_set_bool, .offset = offsetof(type, f) \
    }

static const cfg_opt cfg_tls_opts[] = {
    CFG_STR(px_tls_opts, ca_file, CFG_EMPTY_NULL),
    CFG_STR(px_tls_opts, cert_file, CFG_EMPTY_NULL),
    CFG_STR(px_tls_opts, key_file, CFG_EMPTY_NULL),
    CFG_STR(px_tls_opts, server_name, CFG_EMPTY_NULL),
    CFG_BOOL(px_tls_opts, verify),
    { .name = NULL }
};

static void cfg_set_tls(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                        const char *name)
{
    (void)o;
    px_config *c = obj;
    cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
    c->redis_tls_block = true;
    cfg_walk(p, v, cfg_tls_opts, &c->redis_tls, name, seen);
}

/* redis.sentinel.sentinels: a list of "host:port" (as redis.cluster's startup nodes). */
static void cfg_set_sentinels(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                              const char *name)
{
    px_sentinel_conf *sn = obj;
    (void)o;
    if (v->type != YAML_SEQUENCE_NODE) {
        cfg_error(p, v, "%s: expected a list of host:port, got %s", name, cfg_kind(v));
        return;
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    sn->sentinels = px_calloc(n ? n : 1, sizeof *sn->sentinels);
    sn->nsentinels = 0;
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = yaml_document_get_node(&p->doc, v->data.sequence.items.start[i]);
        char iname[64];
        cfg_scalar sc;
        if (item == NULL) continue;
        snprintf(iname, sizeof iname, "%s[%zu]", name, i);
        if (!cfg_scalar_get(p, item, iname, "host:port", &sc)) continue;
        if (cfg_host_port(sc.s, false)) {
            sn->sentinels[sn->nsentinels++] = sc.s;
            sc.s = NULL;
        } else {
            cfg_error(p, item, "%s: expected host:port, got '%.*s'", iname, cfg_echo_len(sc.s), sc.s);
        }
        cfg_scalar_free(&sc);
    }
}

static const cfg_opt cfg_sentinel_opts[] = {
    CFG_STR(px_sentinel_conf, master_name, CFG_EMPTY_NULL),
    { .name = "sentinels", .set = cfg_set_sentinels },
    CFG_STR(px_sentinel_conf, username, CFG_EMPTY_NULL),
    CFG_STR(px_sentinel_conf, password_file, CFG_EMPTY_NULL),
    { .name = NULL }
};

/* redis.sentinel: the block, then what it must hold (master_name, a sentinel). */
static void cfg_set_sentinel(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                             const char *name)
{
    (void)o;
    px_config *c = obj;
    cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
    if (v->type != YAML_MAPPING_NODE) {
        cfg_error(p, v, "%s: expected a mapping (master_name, sentinels, username, "
                        "password_file), got %s",
                  name, cfg_kind(v));
        return;
    }
    cfg_walk(p, v, cfg_sentinel_opts, &c->sentinel, name, seen);
    yaml_node_t *list = cfg_seen_val(cfg_sentinel_opts, seen, "sentinels");
    bool no_list = list == NULL || (list->type == YAML_SEQUENCE_NODE &&
                                    list->data.sequence.items.top == list->data.sequence.items.start);
    /* {} or every value empty is no sentinel, as cluster: [] is no cluster
     * (docs/configuration.md, redis.sentinel). */
    p->sentinel_used = c->sentinel.master_name || !no_list || c->sentinel.username ||
                       c->sentinel.password_file;
    if (!p->sentinel_used) return;
    if (c->sentinel.username && !c->sentinel.password_file)
        cfg_error(p, v, "%s.username: set without %s.password_file (a user needs a password, as "
                        "redis.username does)",
                  name, name);
    if (c->sentinel.master_name == NULL)
        cfg_error(p, v, "%s.master_name: required (the name the sentinels know the master by, "
                        "as in SENTINEL get-master-addr-by-name)",
                  name);
    if (no_list)
        cfg_error(p, list ? list : v, "%s.sentinels: at least one sentinel host:port is required",
                  name);
}

static const cfg_opt cfg_redis_opts[] = {
    { .name = "url", .set = cfg_set_str, .offset = offsetof(px_config, redis_url), .flags = CFG_EMPTY_NULL },
    { .name = "cluster", .set = cfg_set_cluster },
    { .name = "sentinel", .set = cfg_set_sentinel },
    CFG_STR(px_config, password_file, CFG_EMPTY_NULL),
    CFG_STR(px_config, username, CFG_EMPTY_NULL),
    CFG_MS(px_config, timeout_ms, 1),
    { .name = "tls", .set = cfg_set_tls },
    { .name = NULL }
};

static const cfg_opt cfg_app_opts[] = {
    CFG_STR(px_config, endpoint, CFG_EMPTY_ERR),
    { .name = "max_inflight", .set = cfg_set_int, .offset = offsetof(px_config, max_inflight), .min = 1, .max = 1 << 20 }, /* a request id's slot bits (deliver.c) */
    { .name = "max_entry_bytes", .set = cfg_set_llong, .offset = offsetof(px_config, max_entry_bytes), .min = 1, .max = INT_MAX },
    CFG_MS(px_config, ack_timeout_ms, 1),
    { .name = "socket_mode", .set = cfg_set_mode, .offset = offsetof(px_config, socket_mode) },
    CFG_BOOL(px_config, allow_remote),
    { .name = NULL }
};

static const cfg_opt cfg_metrics_opts[] = {
    { .name = "listen", .set = cfg_set_listen, .offset = offsetof(px_config, metrics_listen) },
    { .name = NULL }
};

/* tracing.otlp_endpoint: an http:// or https:// URL with a host, or "" (off). */
static void cfg_set_otlp(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                         const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "a URL", &sc)) return;
    char **field = (char **)(void *)((char *)obj + o->offset);
    const char *host = !strncmp(sc.s, "http://", 7) ? sc.s + 7 : !strncmp(sc.s, "https://", 8) ? sc.s + 8
                                                                                               : NULL;
    if (sc.len == 0) {
        free(*field);
        *field = NULL;
    } else if (host == NULL || *host == '\0' || *host == '/' || strpbrk(sc.s, " \t\r\n")) {
        cfg_error(p, v, "%s: expected an http:// or https:// URL such as http://otel-collector:4318, "
                        "got '%.*s'",
                  name, cfg_echo_len(sc.s), sc.s);
    } else {
        free(*field);
        *field = sc.s;
        sc.s = NULL;
    }
    cfg_scalar_free(&sc);
}

/* tracing.sample_ratio: a number from 0 to 1. */
static void cfg_set_ratio(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                          const char *name)
{
    cfg_scalar sc;
    if (!cfg_scalar_get(p, v, name, "a number from 0 to 1", &sc)) return;
    char *end = NULL;
    double val = sc.quoted || sc.len == 0 ? -1 : strtod(sc.s, &end);
    if (sc.quoted || sc.len == 0 || *end != '\0' || !(val >= 0 && val <= 1))
        cfg_error(p, v, "%s: expected a number from 0 to 1, got '%.*s'", name, cfg_echo_len(sc.s), sc.s);
    else
        *(double *)(void *)((char *)obj + o->offset) = val;
    cfg_scalar_free(&sc);
}

static const cfg_opt cfg_tracing_opts[] = {
    { .name = "otlp_endpoint", .set = cfg_set_otlp, .offset = offsetof(px_config, otlp_endpoint) },
    { .name = "sample_ratio", .set = cfg_set_ratio, .offset = offsetof(px_config, sample_ratio) },
    { .name = "trace_field", .set = cfg_set_str, .offset = offsetof(px_config, trace_field), .flags = CFG_EMPTY_ERR },
    { .name = "service_name", .set = cfg_set_str, .offset = offsetof(px_config, trace_service_name), .flags = CFG_EMPTY_ERR },
    { .name = NULL }
};

static const cfg_opt cfg_log_opts[] = {
    CFG_ENUM("level", px_config, log_level, cfg_levels),
    CFG_ENUM("format", px_config, log_format, cfg_formats),
    { .name = NULL }
};

static const cfg_opt cfg_stream_opts[] = {
    CFG_STR(px_stream_conf, stream, CFG_EMPTY_ERR),
    CFG_STR(px_stream_conf, group, CFG_EMPTY_NULL),
    CFG_STR(px_stream_conf, consumer, CFG_EMPTY_NULL),
    { .name = "start", .set = cfg_set_start, .offset = offsetof(px_stream_conf, start) },
    CFG_STR(px_stream_conf, payload_field, CFG_EMPTY_NULL),
    { .name = "key", .set = cfg_set_template, .offset = offsetof(px_stream_conf, key), .offset2 = offsetof(px_stream_conf, key_tpl), .flags = CFG_TPL_KEY },
    { .name = "lock_key", .set = cfg_set_template, .offset = offsetof(px_stream_conf, lock_key), .offset2 = offsetof(px_stream_conf, lock_tpl), .flags = CFG_EMPTY_NULL | CFG_TPL_LOCK },
    CFG_ENUM("layout", px_stream_conf, layout, cfg_layouts),
    CFG_STR(px_stream_conf, prefix, 0),
    CFG_STR(px_stream_conf, lock_prefix, 0),
    CFG_STR(px_stream_conf, done_prefix, 0),
    CFG_MS(px_stream_conf, wait_ms, 0),
    CFG_ENUM("on_busy", px_stream_conf, on_busy, cfg_busy),
    CFG_MS(px_stream_conf, lease_ms, 1),
    CFG_MS(px_stream_conf, done_ttl_ms, 1),
    CFG_INT(px_stream_conf, max_deliveries, 1),
    CFG_MS(px_stream_conf, retry_backoff_ms, 0),
    CFG_STR(px_stream_conf, dead_letter, CFG_EMPTY_NULL),
    CFG_ENUM("on_missing_key", px_stream_conf, on_missing_key, cfg_missing),
    CFG_BOOL(px_stream_conf, fencing),
    CFG_MS(px_stream_conf, claim_idle_ms, 100), /* kept fresh every third of it (reader.c) */
    /* a batching wait, not a delay: bounded well under any lease */
    { .name = "linger_ms", .set = cfg_set_ms, .offset = offsetof(px_stream_conf, linger_ms), .min = 0, .max = PX_LINGER_MAX_MS },
    { .name = "batch_ms", .set = cfg_set_ms, .offset = offsetof(px_stream_conf, batch_ms), .min = 0, .max = PX_LINGER_MAX_MS },
    { .name = "commit_ms", .set = cfg_set_ms, .offset = offsetof(px_stream_conf, commit_ms), .min = 0, .max = PX_LINGER_MAX_MS },
    CFG_BOOL(px_stream_conf, hash_tag),
    /* a fingerprint decides which copies conflict: it must read the entry too */
    { .name = "fingerprint", .set = cfg_set_template, .offset = offsetof(px_stream_conf, fingerprint), .offset2 = offsetof(px_stream_conf, fp_tpl), .flags = CFG_EMPTY_NULL | CFG_TPL_KEY },
    CFG_ENUM("on_conflict", px_stream_conf, on_conflict, cfg_conflict),
    { .name = NULL }
};

_Static_assert(sizeof cfg_stream_opts / sizeof *cfg_stream_opts <= CFG_MAX_OPTS + 1,
               "CFG_MAX_OPTS is too small for a stream block");

/* ------------------------------------------------------------ sections */

static void cfg_set_redis(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                          const char *name)
{
    (void)o;
    cfg_walk(p, v, cfg_redis_opts, obj, name, p->redis_seen);
}

static void cfg_set_app(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                        const char *name)
{
    (void)o;
    cfg_walk(p, v, cfg_app_opts, obj, name, p->app_seen);
}

static void cfg_set_metrics(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                            const char *name)
{
    cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
    (void)o;
    cfg_walk(p, v, cfg_metrics_opts, obj, name, seen);
}

static void cfg_set_tracing(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                            const char *name)
{
    cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
    (void)o;
    cfg_walk(p, v, cfg_tracing_opts, obj, name, seen);
}

static void cfg_set_log(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                        const char *name)
{
    cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
    (void)o;
    cfg_walk(p, v, cfg_log_opts, obj, name, seen);
}

/* Fill the defaults of a stream block, including the compiled default key. */
static void cfg_stream_defaults(cfg_parser *p, px_stream_conf *s, const yaml_node_t *block,
                                const char *name)
{
    char err[256] = "";
    int errcol = 0;
    memset(s, 0, sizeof *s);
    s->start = px_strdup(PX_CONFIG_DEFAULT_START);
    s->key = px_strdup(PX_CONFIG_DEFAULT_KEY);
    s->layout = PX_LAYOUT_SINGLE;
    s->prefix = px_strdup(PX_CONFIG_DEFAULT_PREFIX);
    s->lock_prefix = px_strdup(PX_CONFIG_DEFAULT_LOCK_PREFIX);
    s->done_prefix = px_strdup(PX_CONFIG_DEFAULT_DONE_PREFIX);
    s->wait_ms = PX_CONFIG_DEFAULT_WAIT_MS;
    s->on_busy = PX_BUSY_RETRY;
    s->lease_ms = PX_CONFIG_DEFAULT_LEASE_MS;
    s->done_ttl_ms = PX_CONFIG_DEFAULT_DONE_TTL_MS;
    s->max_deliveries = PX_CONFIG_DEFAULT_MAX_DELIVERIES;
    s->retry_backoff_ms = PX_CONFIG_DEFAULT_RETRY_BACKOFF_MS;
    s->on_missing_key = PX_MISSING_DEAD_LETTER;
    s->fencing = false;
    s->hash_tag = false;
    s->claim_idle_ms = PX_CONFIG_DEFAULT_CLAIM_IDLE_MS;
    s->batch_ms = PX_CONFIG_DEFAULT_BATCH_MS;
    s->commit_ms = PX_CONFIG_DEFAULT_COMMIT_MS;
    s->line = (int)block->start_mark.line + 1;
    s->key_tpl = px_template_compile(s->key, err, sizeof err, &errcol);
    if (s->key_tpl == NULL)
        cfg_error(p, block, "%s: the default key %s does not compile: %s", name,
                  PX_CONFIG_DEFAULT_KEY, err);
}

/* streams: a list of stream blocks. */
static void cfg_set_streams(cfg_parser *p, const cfg_opt *o, yaml_node_t *v, void *obj,
                            const char *name)
{
    px_config *c = obj;
    (void)o;
    if (v->type != YAML_SEQUENCE_NODE) {
        cfg_error(p, v, "%s: expected a list of stream blocks, got %s", name, cfg_kind(v));
        return;
    }
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    c->streams = px_calloc(n, sizeof *c->streams);
    p->aux = px_calloc(n, sizeof *p->aux);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *b = yaml_document_get_node(&p->doc, v->data.sequence.items.start[i]);
        cfg_stream_aux *aux = &p->aux[c->nstreams];
        if (b == NULL) continue;
        snprintf(aux->name, sizeof aux->name, "%s[%zu]", name, i);
        if (b->type != YAML_MAPPING_NODE) {
            cfg_error(p, b, "%s: expected a stream block (a mapping with at least 'stream'), "
                            "got %s",
                      aux->name, cfg_kind(b));
            continue;
        }
        px_stream_conf *s = &c->streams[c->nstreams++];
        cfg_seen seen[CFG_MAX_OPTS] = { { 0 } };
        cfg_stream_defaults(p, s, b, aux->name);
        cfg_walk(p, b, cfg_stream_opts, s, aux->name, seen);
        if (s->stream == NULL && cfg_seen_val(cfg_stream_opts, seen, "stream") == NULL)
            cfg_error(p, b, "%s: missing 'stream' (the key of the stream to read)", aux->name);
        if (s->consumer == NULL) s->consumer = px_strdup(cfg_default_consumer(p));
        aux->block = b;
        aux->lease = cfg_seen_val(cfg_stream_opts, seen, "lease_ms");
        aux->done_ttl = cfg_seen_val(cfg_stream_opts, seen, "done_ttl_ms");
        aux->claim_idle = cfg_seen_val(cfg_stream_opts, seen, "claim_idle_ms");
        aux->prefix = cfg_seen_val(cfg_stream_opts, seen, "prefix");
        aux->lock_prefix = cfg_seen_val(cfg_stream_opts, seen, "lock_prefix");
        aux->done_prefix = cfg_seen_val(cfg_stream_opts, seen, "done_prefix");
        aux->dead_letter = cfg_seen_val(cfg_stream_opts, seen, "dead_letter");
        aux->lock_key = cfg_seen_val(cfg_stream_opts, seen, "lock_key");
    }
}

static const cfg_opt cfg_top_opts[] = {
    { .name = "redis", .set = cfg_set_redis },
    { .name = "app", .set = cfg_set_app },
    { .name = "tracing", .set = cfg_set_tracing },
    { .name = "metrics", .set = cfg_set_metrics },
    { .name = "log", .set = cfg_set_log },
    CFG_MS(px_config, shutdown_grace_ms, 0),
    { .name = "streams", .set = cfg_set_streams },
    { .name = NULL }
};

/* ------------------------------------------------- checks after the walk */

/* redis.url against redis.cluster and redis.sentinel, then the url itself. */
static void cfg_check_redis(cfg_parser *p)
{
    px_config *c = p->c;
    yaml_node_t *url = cfg_seen_val(cfg_redis_opts, p->redis_seen, "url");
    char why[128];
    yaml_node_t *sentinel = p->sentinel_used ? cfg_seen_val(cfg_redis_opts, p->redis_seen,
                                                            "sentinel")
                                             : NULL;
    if (sentinel != NULL && (c->redis_url != NULL || c->ncluster > 0)) {
        /* one way to find the data node: a url, cluster startup nodes or sentinels */
        cfg_error(p, sentinel, "redis.sentinel: cannot be used together with redis.%s; use "
                               "url for one server, cluster for Redis Cluster or sentinel for a master the "
                               "sentinels follow",
                  c->redis_url ? "url" : "cluster");
    } else if (sentinel != NULL) {
        return;
    } else if (c->redis_url != NULL && c->ncluster > 0) {
        cfg_error(p, url, "redis.url: redis.url and a non-empty redis.cluster are both set; "
                          "use url for one server or cluster for Redis Cluster startup nodes");
    } else if (c->redis_url != NULL) {
        if (!cfg_redis_url(c, c->redis_url, why, sizeof why))
            cfg_error(p, url, "redis.url: invalid Redis url (%s); " CFG_URL_FORMS, why);
    } else if (c->ncluster == 0) {
        c->redis_url = px_strdup(PX_CONFIG_DEFAULT_REDIS_URL);
        (void)cfg_redis_url(c, c->redis_url, why, sizeof why);
    }
}

/* TLS: rediss://, or cluster startup nodes with redis.tls; a client certificate
 * comes with its key. The files themselves are read by check and at every
 * connect, not here. Runs after the url may have been replaced (env). */
static void cfg_check_tls(cfg_parser *p)
{
    px_config *c = p->c;
    yaml_node_t *tls = cfg_seen_val(cfg_redis_opts, p->redis_seen, "tls");
    if ((c->ncluster > 0 || c->sentinel.master_name) && c->redis_tls_block)
        c->redis_tls.enabled = true;
    if (!c->redis_tls_block) return;
    if (c->redis_unix)
        cfg_error(p, tls, "redis.tls: set, but redis.url is a unix socket (TLS is for TCP)");
    else if (!c->redis_tls.enabled && c->redis_host)
        cfg_error(p, tls, "redis.tls: set, but redis.url is redis:// (plain text): use "
                          "rediss:// for TLS, or remove redis.tls");
    if ((c->redis_tls.cert_file == NULL) != (c->redis_tls.key_file == NULL))
        cfg_error(p, tls, "redis.tls: cert_file and key_file go together (the client "
                          "certificate and its private key)");
}

static void cfg_check_app(cfg_parser *p)
{
    yaml_node_t *ep = cfg_seen_val(cfg_app_opts, p->app_seen, "endpoint");
    char why[256];
    if (ep != NULL && p->c->endpoint != NULL &&
        !cfg_endpoint_ok(p->c->endpoint, p->c->allow_remote, why, sizeof why))
        cfg_error(p, ep, "app.endpoint: %s", why);
}

/*
 * Names (issue 15, 12, 37). The dedup names of a stream are prefix + key
 * (single layout: one state key), lock_prefix + key and done_prefix + key
 * (split: a lock and a done mark), with "{" + key + "}" under hash_tag; all
 * the names of one such family start with the name prefix, the "{" and the key
 * template's literal prefix (template.h): its start D. Two families can share
 * a name exactly when one start begins the other (the rest of both is event
 * text, anything): cfg_prefix_overlap.
 * - idemproxy's own keys (PX_FENCE_KEY, idemproxy:dlw:...) start with
 *   CFG_OWN_PREFIX: no family may overlap it (prefix: "" would put a key
 *   rendered "idemproxy:fence" on the fencing counter).
 * - Families of different kinds must not overlap, in one stream or two: a
 *   lock read as a done mark acks an event nobody handled (split
 *   lock_prefix: "d" with the key "one:x" is done: + "x").
 * - Families of one kind in two blocks may overlap on purpose (done keys are
 *   global, as the write-ups' are): a warning names the blocks, since then an
 *   event of one stream is a duplicate of an event of the other with its key.
 * - A lock_key renders to the Redis key as it stands, so it must never be able
 *   to name a dedup key (`lock:` + the eventId "game:room:42" would otherwise
 *   be room 42's lock): its literal prefix P must not overlap any family, nor
 *   idemproxy's own keys. An empty P (an expression such as #event.roomId)
 *   overlaps everything. lock_keys of different streams may be equal (one
 *   room lock).
 */
#define CFG_OWN_PREFIX "idemproxy:"

static bool cfg_prefix_overlap(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    return memcmp(a, b, n) == 0;
}

/* One family of dedup names of a stream block. */
typedef struct cfg_names {
    size_t stream;    /* its block in c->streams */
    int kind;         /* 0 single-layout keys, 1 split locks, 2 split done marks */
    const char *opt;  /* the option that names them: "prefix", ... */
    const char *what; /* "dedup keys (prefix", ... */
    yaml_node_t *at;  /* (ref) that option's value, else the block */
    px_buf start;     /* D: what every name of the family starts with */
} cfg_names;

/* The families of every stream block into 'f' (at most 2 per block); returns
 * how many. */
static size_t cfg_names_of(cfg_parser *p, cfg_names *f)
{
    static const char *const opts[] = { "prefix", "lock_prefix", "done_prefix" };
    static const char *const whats[] = { "dedup keys (prefix", "dedup locks (lock_prefix",
                                         "done marks (done_prefix" };
    px_config *c = p->c;
    px_buf kp = { 0 };
    size_t n = 0;
    for (size_t i = 0; i < c->nstreams; i++) {
        px_stream_conf *s = &c->streams[i];
        cfg_stream_aux *a = &p->aux[i];
        const char *names[2];
        yaml_node_t *ats[2];
        int kinds[2], nn = 0;
        if (s->layout == PX_LAYOUT_SINGLE) {
            names[nn] = s->prefix, ats[nn] = a->prefix, kinds[nn++] = 0;
        } else {
            names[nn] = s->lock_prefix, ats[nn] = a->lock_prefix, kinds[nn++] = 1;
            names[nn] = s->done_prefix, ats[nn] = a->done_prefix, kinds[nn++] = 2;
        }
        if (s->key_tpl) px_template_literal_prefix(s->key_tpl, &kp);
        else px_buf_reset(&kp);
        for (int k = 0; k < nn; k++) {
            if (names[k] == NULL) continue;
            cfg_names *x = &f[n++];
            memset(x, 0, sizeof *x);
            x->stream = i;
            x->kind = kinds[k];
            x->opt = opts[kinds[k]];
            x->what = whats[kinds[k]];
            x->at = ats[k] ? ats[k] : a->block;
            px_buf_reserve(&x->start, 0);
            px_buf_printf(&x->start, "%s%s%s", names[k], s->hash_tag ? "{" : "",
                          kp.data ? kp.data : "");
        }
    }
    px_buf_deinit(&kp);
    return n;
}

/* "its own dedup keys (prefix + key)" or "streams[1]'s done marks (done_prefix
 * + '{' + key + '}')": family 'f' as seen from block 'self' ('own': "its own"
 * or "its"). */
static void cfg_names_who(cfg_parser *p, const cfg_names *f, size_t self, const char *own,
                          char *buf, size_t len)
{
    bool tag = p->c->streams[f->stream].hash_tag;
    snprintf(buf, len, "%s%s %s + %skey%s)", f->stream == self ? own : p->aux[f->stream].name,
             f->stream == self ? "" : "'s", f->what, tag ? "'{' + " : "", tag ? " + '}'" : "");
}

/* "streams[1] (orders, group b)", for the warning about shared names. */
static void cfg_block_label(cfg_parser *p, size_t i, char *buf, size_t len)
{
    px_stream_conf *s = &p->c->streams[i];
    snprintf(buf, len, "%s (%.*s%s%.*s)", p->aux[i].name, cfg_echo_len(s->stream ? s->stream : ""),
             s->stream ? s->stream : "", s->group ? ", group " : "",
             cfg_echo_len(s->group ? s->group : ""), s->group ? s->group : "");
}

/* The families against idemproxy's own keys and each other. */
static void cfg_check_families(cfg_parser *p, cfg_names *f, size_t n)
{
    char who[128], mine[128], la[160], lb[160];
    bool *warned = px_calloc(p->c->nstreams + 1, sizeof *warned);
    for (size_t i = 0; i < n; i++) {
        cfg_names *x = &f[i];
        const char *name = p->aux[x->stream].name;
        if (cfg_prefix_overlap(x->start.data, x->start.len, CFG_OWN_PREFIX,
                               sizeof CFG_OWN_PREFIX - 1)) {
            cfg_names_who(p, x, x->stream, "its", mine, sizeof mine);
            cfg_error(p, x->at, "%s.%s: %s start with '%.*s' and can equal idemproxy's own "
                                "keys, which start with '" CFG_OWN_PREFIX "' (its fencing counter, "
                                "its dead-letter marks); choose a prefix that neither begins with "
                                "'" CFG_OWN_PREFIX "' nor is the beginning of it",
                      name, x->opt, mine, cfg_echo_len(x->start.data), x->start.data);
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            cfg_names *y = &f[j];
            if (!cfg_prefix_overlap(x->start.data, x->start.len, y->start.data, y->start.len))
                continue;
            if (y->stream == x->stream && x->start.len == y->start.len)
                continue; /* equal prefixes: cfg_check_streams says so */
            if (x->kind != y->kind) {
                /* in one block, said at the option that is set */
                bool swap = y->stream == x->stream && x->at == p->aux[x->stream].block &&
                            y->at != x->at;
                const cfg_names *u = swap ? y : x, *w = swap ? x : y;
                cfg_names_who(p, u, u->stream, "its", mine, sizeof mine);
                cfg_names_who(p, w, u->stream, "its own", who, sizeof who);
                cfg_error(p, u->at, "%s.%s: %s start with '%.*s' and %s start with '%.*s', so "
                                    "one name can be both (a lock would be taken for a done mark)",
                          name, u->opt, mine, cfg_echo_len(u->start.data), u->start.data, who,
                          cfg_echo_len(w->start.data), w->start.data);
                break;
            }
            if (y->stream == x->stream || warned[x->stream]) continue;
            /* once per block, naming the first block it shares names with */
            warned[x->stream] = true;
            const px_buf *both = y->start.len < x->start.len ? &y->start : &x->start;
            const char *sname = p->c->streams[x->stream].stream;
            cfg_block_label(p, x->stream, la, sizeof la);
            cfg_block_label(p, y->stream, lb, sizeof lb);
            cfg_warning(p, x->at, "%s shares dedup names with %s: both start with '%.*s', so "
                                  "an event of one is a duplicate of an event of the other with "
                                  "the same key; give each block a prefix of its own (such as "
                                  "\"idem:%.*s:\") unless done marks are meant to be shared",
                        la, lb, cfg_echo_len(both->data), both->data,
                        cfg_echo_len(sname ? sname : ""), sname ? sname : "");
        }
    }
    free(warned);
}

static void cfg_check_names(cfg_parser *p)
{
    px_config *c = p->c;
    cfg_names *f = px_calloc(2 * c->nstreams + 1, sizeof *f);
    size_t nf = cfg_names_of(p, f);
    px_buf lp = { 0 };
    char who[128];
    cfg_check_families(p, f, nf);
    for (size_t i = 0; i < c->nstreams; i++) {
        px_stream_conf *s = &c->streams[i];
        cfg_stream_aux *a = &p->aux[i];
        if (s->lock_tpl == NULL || a->lock_key == NULL) continue;
        px_template_literal_prefix(s->lock_tpl, &lp);
        bool refused = false;
        for (size_t j = 0; j < nf && !refused; j++) {
            const cfg_names *d = &f[j];
            if (!cfg_prefix_overlap(lp.data, lp.len, d->start.data, d->start.len)) continue;
            refused = true;
            cfg_names_who(p, d, i, "its own", who, sizeof who);
            if (lp.len == 0)
                cfg_error(p, a->lock_key, "%s.lock_key: it starts with no literal text, so "
                                          "a name it renders can equal one of %s, which start with '%.*s'; "
                                          "begin it with text that neither begins with a dedup name's "
                                          "prefix nor is the beginning of one (such as room-lock:#{...})",
                          a->name, who, cfg_echo_len(d->start.data), d->start.data);
            else
                cfg_error(p, a->lock_key, "%s.lock_key: its names start with '%.*s' and "
                                          "%s start with '%.*s', so one name can be both; a lock_key's "
                                          "literal prefix must neither begin with a dedup name's prefix nor "
                                          "be the beginning of one",
                          a->name, cfg_echo_len(lp.data), lp.data, who,
                          cfg_echo_len(d->start.data), d->start.data);
        }
        if (!refused && cfg_prefix_overlap(lp.data, lp.len, CFG_OWN_PREFIX,
                                           sizeof CFG_OWN_PREFIX - 1))
            cfg_error(p, a->lock_key, "%s.lock_key: its names start with '%.*s' and can equal "
                                      "idemproxy's own keys, which start with '" CFG_OWN_PREFIX "'",
                      a->name, cfg_echo_len(lp.data), lp.data);
    }
    for (size_t j = 0; j < nf; j++) px_buf_deinit(&f[j].start);
    free(f);
    px_buf_deinit(&lp);
}

/* Every stream block against redis.timeout_ms, itself and the blocks before it. */
static void cfg_check_streams(cfg_parser *p, yaml_node_t *root)
{
    px_config *c = p->c;
    yaml_node_t *timeout = cfg_seen_val(cfg_redis_opts, p->redis_seen, "timeout_ms");
    cfg_seen *streams = NULL;
    for (size_t i = 0; cfg_top_opts[i].name; i++)
        if (strcmp(cfg_top_opts[i].name, "streams") == 0) streams = &p->top_seen[i];
    if (c->nstreams == 0) {
        if (streams->key == NULL)
            cfg_error(p, root, "missing 'streams': at least one stream block is required");
        else if (cfg_is_null(streams->val) || (streams->val->type == YAML_SEQUENCE_NODE &&
                                               streams->val->data.sequence.items.top == streams->val->data.sequence.items.start))
            cfg_error(p, streams->key, "streams: at least one stream block is required");
        return;
    }
    for (size_t i = 0; i < c->nstreams; i++) {
        px_stream_conf *s = &c->streams[i];
        cfg_stream_aux *a = &p->aux[i];
        /* lease < 2 * timeout, written so that it cannot overflow */
        if (c->timeout_ms > s->lease_ms / 2) {
            yaml_node_t *at = a->lease ? a->lease : timeout ? timeout
                                                            : a->block;
            cfg_error(p, at, "%s.lease_ms: %s%lld is less than twice redis.timeout_ms (%lld): "
                             "a lease must outlive two Redis round trips",
                      a->name,
                      a->lease ? "" : "the default ", s->lease_ms, c->timeout_ms);
        }
        /* group mode: entries are kept fresh every third of claim_idle_ms, and
         * one refresh may take a whole timeout (issue 30) */
        if (s->group && c->timeout_ms > s->claim_idle_ms / 3) {
            yaml_node_t *at = a->claim_idle ? a->claim_idle : timeout ? timeout
                                                                      : a->block;
            cfg_error(p, at, "%s.claim_idle_ms: %s%lld is less than three times "
                             "redis.timeout_ms (%lld): entries still being worked on would be "
                             "taken over by another consumer",
                      a->name, a->claim_idle ? "" : "the default ", s->claim_idle_ms,
                      c->timeout_ms);
        }
        if (s->done_ttl_ms < s->lease_ms) {
            yaml_node_t *at = a->done_ttl ? a->done_ttl : a->lease ? a->lease
                                                                   : a->block;
            cfg_error(p, at, "%s.done_ttl_ms: %s%lld is less than lease_ms (%lld): a done mark "
                             "must outlive the lease of the copies it stops",
                      a->name, a->done_ttl ? "" : "the default ", s->done_ttl_ms, s->lease_ms);
        }
        if (s->layout == PX_LAYOUT_SPLIT && s->lock_prefix && s->done_prefix &&
            strcmp(s->lock_prefix, s->done_prefix) == 0) {
            yaml_node_t *at = a->done_prefix ? a->done_prefix : a->lock_prefix ? a->lock_prefix
                                                                               : a->block;
            cfg_error(p, at, "%s: lock_prefix and done_prefix must differ in the split layout "
                             "(the lock and the done mark would be one key)",
                      a->name);
        }
        if (s->stream && s->dead_letter && strcmp(s->stream, s->dead_letter) == 0)
            cfg_error(p, a->dead_letter, "%s.dead_letter: must not be the stream being read",
                      a->name);
        if (s->stream == NULL) continue;
        for (size_t j = 0; j < i; j++) {
            px_stream_conf *t = &c->streams[j];
            if (t->stream == NULL || strcmp(t->stream, s->stream) != 0) continue;
            if ((t->group == NULL) != (s->group == NULL)) continue;
            if (t->group && strcmp(t->group, s->group) != 0) continue;
            if (s->group)
                cfg_error(p, a->block, "%s: duplicate stream block: stream '%s' with group "
                                       "'%s' is already configured at line %d",
                          a->name, s->stream,
                          s->group, t->line);
            else
                cfg_error(p, a->block, "%s: duplicate stream block: stream '%s' without a "
                                       "group is already configured at line %d",
                          a->name, s->stream,
                          t->line);
            break;
        }
    }
}

/*
 * IDEMPROXY_REDIS_URL, IDEMPROXY_ENDPOINT and IDEMPROXY_LOG_LEVEL replace the
 * file's values; an empty variable counts as unset. Problems are reported as
 * "VAR: message".
 */
static void cfg_apply_env(cfg_parser *p)
{
    px_config *c = p->c;
    const char *url = getenv("IDEMPROXY_REDIS_URL");
    const char *ep = getenv("IDEMPROXY_ENDPOINT");
    const char *level = getenv("IDEMPROXY_LOG_LEVEL");
    char why[256];
    if (url && *url) {
        free(c->redis_url);
        c->redis_url = px_strdup(url);
        if (c->ncluster > 0)
            cfg_env_error(p, "IDEMPROXY_REDIS_URL", "cannot be used with redis.cluster "
                                                    "(the file lists cluster startup nodes)");
        else if (c->sentinel.master_name)
            cfg_env_error(p, "IDEMPROXY_REDIS_URL", "cannot be used with redis.sentinel "
                                                    "(the file names sentinels)");
        else if (!cfg_redis_url(c, url, why, sizeof why))
            cfg_env_error(p, "IDEMPROXY_REDIS_URL", "invalid Redis url (%s); " CFG_URL_FORMS,
                          why);
    }
    if (ep && *ep) {
        free(c->endpoint);
        c->endpoint = px_strdup(ep);
        if (!cfg_endpoint_ok(ep, c->allow_remote, why, sizeof why))
            cfg_env_error(p, "IDEMPROXY_ENDPOINT", "%s", why);
    }
    if (level && *level) {
        int i = -1;
        for (int k = 0; cfg_levels[k]; k++)
            if (strcasecmp(cfg_levels[k], level) == 0) i = k;
        if (i >= 0) c->log_level = (px_log_level)i;
        else cfg_env_error(p, "IDEMPROXY_LOG_LEVEL", "expected error, warn, info or debug, "
                                                     "got '%.*s'",
                           cfg_echo_len(level), level);
    }
}

/*
 * redis.username replaces the url's user; a user needs a password somewhere
 * (redis.password_file or the url): without one idemproxy sends no AUTH, and
 * a user that would silently go unused is a config error. That the password
 * file is not empty is checked where it is read (check, the daemon).
 */
static void cfg_check_auth(cfg_parser *p)
{
    px_config *c = p->c;
    if (c->username) {
        free(c->redis_user);
        c->redis_user = px_strdup(c->username);
    }
    if (c->redis_user == NULL || c->password_file || c->redis_password) return;
    yaml_node_t *user = cfg_seen_val(cfg_redis_opts, p->redis_seen, "username");
    yaml_node_t *url = cfg_seen_val(cfg_redis_opts, p->redis_seen, "url");
    const char *env = getenv("IDEMPROXY_REDIS_URL");
    if (user)
        cfg_error(p, user, "redis.username: a user needs a password: set redis.password_file "
                           "(idemproxy sends AUTH only with a password)");
    else if (env && *env)
        cfg_env_error(p, "IDEMPROXY_REDIS_URL", "the url has a user but no password: add the "
                                                "password or set redis.password_file (idemproxy sends AUTH only with a "
                                                "password)");
    else if (url)
        cfg_error(p, url, "redis.url: the url has a user but no password: add the password or "
                          "set redis.password_file (idemproxy sends AUTH only with a password)");
}

/* ------------------------------------------------------------- loading */

/* Report libyaml's error from 'yp' with its position. */
static void cfg_yaml_error(cfg_parser *p, const yaml_parser_t *yp)
{
    size_t line = yp->problem_mark.line + 1, col = yp->problem_mark.column + 1;
    const char *problem = yp->problem ? yp->problem : "cannot parse";
    if (yp->error == YAML_MEMORY_ERROR) {
        diag_plain(p->d, p->path, "out of memory while parsing");
        return;
    }
    if (yp->error == YAML_READER_ERROR) {
        cfg_offset_pos(p, yp->problem_offset, &line, &col);
        cfg_diag_at(p, false, line, col, "YAML: %s", problem);
        return;
    }
    if (yp->context)
        cfg_diag_at(p, false, line, col, "YAML: %s (%s at line %zu, column %zu)", problem,
                    yp->context, yp->context_mark.line + 1, yp->context_mark.column + 1);
    else
        cfg_diag_at(p, false, line, col, "YAML: %s", problem);
}

static void cfg_defaults(px_config *c, const char *path)
{
    c->path = px_strdup(path);
    c->timeout_ms = PX_CONFIG_DEFAULT_TIMEOUT_MS;
    c->redis_port = PX_CONFIG_DEFAULT_REDIS_PORT;
    c->redis_db = 0;
    c->redis_tls.verify = true;
    c->endpoint = px_strdup(PX_CONFIG_DEFAULT_ENDPOINT);
    c->max_inflight = PX_CONFIG_DEFAULT_MAX_INFLIGHT;
    c->max_entry_bytes = PX_CONFIG_DEFAULT_MAX_ENTRY_BYTES;
    c->ack_timeout_ms = PX_CONFIG_DEFAULT_ACK_TIMEOUT_MS;
    c->socket_mode = PX_CONFIG_DEFAULT_SOCKET_MODE;
    c->allow_remote = false;
    c->sample_ratio = 1.0;
    c->trace_field = px_strdup("traceparent");
    c->trace_service_name = px_strdup("idemproxy");
    c->metrics_listen = px_strdup(PX_CONFIG_DEFAULT_METRICS_LISTEN);
    c->log_level = PX_LOG_INFO;
    c->log_format = PX_LOG_TEXT;
    c->shutdown_grace_ms = PX_CONFIG_DEFAULT_SHUTDOWN_GRACE_MS;
}

/* Load the one document of the text into p->doc; false after reporting why. */
static bool cfg_load_document(cfg_parser *p)
{
    yaml_parser_t yp;
    yaml_document_t extra;
    bool ok = false;
    if (!yaml_parser_initialize(&yp)) {
        diag_plain(p->d, p->path, "cannot initialise the YAML parser");
        return false;
    }
    yaml_parser_set_input_string(&yp, (const unsigned char *)p->text, p->len);
    if (!yaml_parser_load(&yp, &p->doc)) {
        cfg_yaml_error(p, &yp);
        yaml_parser_delete(&yp);
        return false;
    }
    ok = true;
    if (yaml_document_get_root_node(&p->doc) != NULL) {
        /* a second document is a mistake (a stray "---"), not something to ignore */
        if (!yaml_parser_load(&yp, &extra)) {
            cfg_yaml_error(p, &yp);
            ok = false;
        } else {
            yaml_node_t *root2 = yaml_document_get_root_node(&extra);
            if (root2 != NULL) {
                cfg_error(p, root2, "only one YAML document is allowed");
                ok = false;
            }
            yaml_document_delete(&extra);
        }
    }
    yaml_parser_delete(&yp);
    if (!ok) yaml_document_delete(&p->doc);
    return ok;
}

px_config *px_config_parse(const char *path, const char *text, size_t len, px_diags *d)
{
    cfg_parser p;
    size_t errors_before = d->nerrors;
    memset(&p, 0, sizeof p);
    p.path = path ? path : "<config>";
    p.text = text ? text : "";
    p.len = text ? len : 0;
    p.d = d;
    cfg_index_lines(&p);

    if (!cfg_load_document(&p)) {
        free(p.lines);
        return NULL;
    }
    p.c = px_calloc(1, sizeof *p.c);
    cfg_defaults(p.c, p.path);

    yaml_node_t *root = yaml_document_get_root_node(&p.doc);
    if (root == NULL) {
        cfg_diag_at(&p, false, 1, 1, "the config is empty: at least one stream block "
                                     "is required");
    } else if (root->type != YAML_MAPPING_NODE) {
        cfg_error(&p, root, "the config must be a mapping (redis:, app:, streams: ...), "
                            "got %s",
                  cfg_kind(root));
    } else {
        cfg_walk(&p, root, cfg_top_opts, p.c, NULL, p.top_seen);
        cfg_check_redis(&p);
        cfg_check_app(&p);
        cfg_check_streams(&p, root);
        cfg_check_names(&p);
    }
    cfg_apply_env(&p);
    if (root && root->type == YAML_MAPPING_NODE) {
        cfg_check_auth(&p);
        cfg_check_tls(&p);
    }

    px_config *c = p.c;
    if (d->nerrors > errors_before) {
        px_config_destroy(c);
        c = NULL;
    }
    yaml_document_delete(&p.doc);
    free(p.lines);
    free(p.aux);
    free(p.consumer);
    return c;
}

px_config *px_config_load(const char *path, px_diags *d)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        diag_plain(d, path, "cannot read the config: %s", strerror(errno));
        return NULL;
    }
    px_buf b = { 0 };
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) px_buf_append(&b, chunk, n);
    if (ferror(f)) {
        int e = errno;
        fclose(f);
        px_buf_deinit(&b);
        diag_plain(d, path, "cannot read the config: %s", strerror(e ? e : EIO));
        return NULL;
    }
    fclose(f);
    px_config *c = px_config_parse(path, b.data ? b.data : "", b.len, d);
    px_buf_deinit(&b);
    return c;
}

void px_config_destroy(px_config *c)
{
    if (c == NULL) return;
    free(c->path);
    free(c->redis_url);
    for (size_t i = 0; i < c->ncluster; i++) free(c->cluster[i]);
    free(c->cluster);
    free(c->password_file);
    for (size_t i = 0; i < c->sentinel.nsentinels; i++) free(c->sentinel.sentinels[i]);
    free(c->sentinel.sentinels);
    free(c->sentinel.master_name);
    free(c->sentinel.username);
    free(c->sentinel.password_file);
    free(c->username);
    free((char *)c->redis_tls.ca_file);
    free((char *)c->redis_tls.cert_file);
    free((char *)c->redis_tls.key_file);
    free((char *)c->redis_tls.server_name);
    cfg_redis_reset(c);
    free(c->endpoint);
    free(c->otlp_endpoint);
    free(c->trace_field);
    free(c->trace_service_name);
    free(c->metrics_listen);
    for (size_t i = 0; i < c->nstreams; i++) {
        px_stream_conf *s = &c->streams[i];
        free(s->stream);
        free(s->group);
        free(s->consumer);
        free(s->start);
        free(s->payload_field);
        free(s->key);
        free(s->lock_key);
        free(s->fingerprint);
        free(s->prefix);
        free(s->lock_prefix);
        free(s->done_prefix);
        free(s->dead_letter);
        if (s->key_tpl) px_template_destroy(s->key_tpl);
        if (s->lock_tpl) px_template_destroy(s->lock_tpl);
        if (s->fp_tpl) px_template_destroy(s->fp_tpl);
    }
    free(c->streams);
    free(c);
}

void px_config_redis_opts(const px_config *c, const char *name, const char *password,
                          px_redis_opts *o)
{
    *o = (px_redis_opts){
        .name = name,
        .host = c->redis_host,
        .port = c->redis_port,
        .unix_path = c->redis_unix,
        .user = c->redis_user,
        .password = password,
        .password_file = c->password_file,
        .db = c->redis_db,
        .timeout_ms = c->timeout_ms,
        .seeds = (const char *const *)c->cluster,
        .nseeds = c->ncluster,
        .max_array_bytes = (size_t)c->max_entry_bytes,  /* entries past it are elided */
        .max_elements = 2 * (size_t)c->max_entry_bytes, /* reply.h says why */
        .tls = &c->redis_tls,
        .master_name = c->sentinel.master_name,
        .sentinels = (const char *const *)c->sentinel.sentinels,
        .nsentinels = c->sentinel.nsentinels,
        .sentinel_user = c->sentinel.username,
        .sentinel_password_file = c->sentinel.password_file,
    };
}
