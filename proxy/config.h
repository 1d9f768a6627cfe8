/*
 * config.h - the validated configuration (docs/configuration.md).
 *
 * config.c is the only code that touches libyaml. It hands back a plain struct
 * whose every field is set (defaults filled in), every template compiled, and
 * every problem reported as "FILE:LINE:COL: message". Loading is hermetic: it
 * connects to nothing, resolves no host name and reads no password_file.
 */
#ifndef PX_CONFIG_H
#define PX_CONFIG_H

#include "px.h"
#include "redis.h"
#include "template.h"

typedef enum { PX_LAYOUT_SINGLE = 0,
               PX_LAYOUT_SPLIT } px_layout;
typedef enum { PX_BUSY_RETRY = 0,
               PX_BUSY_DEAD_LETTER } px_on_busy;
typedef enum { PX_MISSING_DEAD_LETTER = 0,
               PX_MISSING_SKIP } px_on_missing;
typedef enum { PX_CONFLICT_DEAD_LETTER = 0,
               PX_CONFLICT_SKIP } px_on_conflict;
typedef enum { PX_LOG_ERROR = 0,
               PX_LOG_WARN,
               PX_LOG_INFO,
               PX_LOG_DEBUG } px_log_level;
typedef enum { PX_LOG_TEXT = 0,
               PX_LOG_JSON } px_log_format;

#define PX_LINGER_MAX_MS 100 /* streams[].linger_ms, batch_ms and commit_ms at most */

typedef struct px_stream_conf {
    char *stream;                 /* stream key; required */
    char *group;                  /* NULL: group-less XREAD */
    char *consumer;               /* default "<hostname>-<pid>" */
    char *start;                  /* "0" (default), "$" or an entry id */
    char *payload_field;          /* NULL: the entry's fields are the event */
    char *key;                    /* dedup key template source; default "#event.eventId" */
    char *lock_key;               /* NULL when not set or "" */
    px_layout layout;             /* default single */
    char *prefix;                 /* default "idem:" */
    char *lock_prefix;            /* default "lock:" */
    char *done_prefix;            /* default "done:" */
    long long wait_ms;            /* default 0 */
    px_on_busy on_busy;           /* default retry */
    long long lease_ms;           /* default 5000 */
    long long done_ttl_ms;        /* default 600000 */
    int max_deliveries;           /* default 5, >= 1 */
    long long retry_backoff_ms;   /* default 100 */
    char *dead_letter;            /* NULL: log only */
    px_on_missing on_missing_key; /* default dead_letter */
    bool fencing;                 /* default false */
    long long claim_idle_ms;      /* default 30000 */
    long long linger_ms;          /* default 0: batch_ms decides; over 0, a fixed wait instead */
    long long batch_ms;           /* default 2: the batch window's bound (px_decide_batch_wait) */
    long long commit_ms;          /* default 5: a done mark's wait for the next page's claims (px_decide_commit_wait) */
    bool hash_tag;                /* default false: true names keys prefix + "{" + key + "}" */
    px_template *key_tpl;         /* compiled 'key' */
    px_template *lock_tpl;        /* compiled 'lock_key'; NULL when none */
    char *fingerprint;            /* NULL: off (the default) */
    px_template *fp_tpl;          /* compiled 'fingerprint'; NULL when off */
    px_on_conflict on_conflict;   /* default dead_letter */
    int line;                     /* line of the block in the file, for messages */
} px_stream_conf;

/* redis.sentinel: the master named 'master_name' is asked of these Sentinels
 * (docs/configuration.md). Their own credentials; the data node's
 * (password_file, username) apply to the master. */
typedef struct px_sentinel_conf {
    char *master_name; /* NULL when redis.sentinel is not set */
    char **sentinels;  /* "host:port" */
    size_t nsentinels;
    char *username;      /* NULL: the default user */
    char *password_file; /* NULL: no AUTH to the sentinels */
} px_sentinel_conf;

typedef struct px_config {
    char *path; /* the file, as given */

    /* redis */
    char *redis_url; /* as configured (may hold a password: never log it) */
    char **cluster;  /* startup nodes "host:port"; ncluster == 0 when unused */
    size_t ncluster;
    px_sentinel_conf sentinel; /* redis.sentinel; master_name NULL when unused */
    char *password_file;       /* NULL when not set; read by the daemon and check,
                                         not here */
    char *username;            /* redis.username (ACL user); NULL when not set. Once
                                         parsed it replaces the url's user in redis_user */
    long long timeout_ms;      /* default 1000 */
    char *redis_host;          /* parsed from the url; NULL for unix sockets */
    int redis_port;            /* default 6379 */
    char *redis_unix;          /* unix socket path, or NULL */
    char *redis_user;          /* redis.username, else the url's; NULL when neither */
    char *redis_password;      /* NULL when not in the url; never logged */
    int redis_db;              /* default 0 */
    bool redis_tls_block;      /* redis.tls is set (a mapping, maybe empty) */
    px_tls_opts redis_tls;     /* enabled by rediss:// or redis.tls; verify defaults to
                                         true; its strings are owned (NULL when not set) */

    /* app */
    char *endpoint;            /* default "ipc:///tmp/idemproxy.sock" */
    int max_inflight;          /* default 256, >= 1 */
    long long max_entry_bytes; /* default 1048576 */
    long long ack_timeout_ms;  /* default 30000 */
    int socket_mode;           /* default 0660 (parsed from the octal string) */
    bool allow_remote;         /* default false */

    /* tracing (docs/configuration.md); off unless otlp_endpoint is set */
    char *otlp_endpoint;      /* http[s]://host[:port][/path]; NULL: tracing off */
    double sample_ratio;      /* default 1.0, in [0, 1] */
    char *trace_field;        /* default "traceparent" */
    char *trace_service_name; /* default "idemproxy" */

    char *metrics_listen;        /* default "127.0.0.1:9464"; "" disables */
    px_log_level log_level;      /* default info */
    px_log_format log_format;    /* default text */
    long long shutdown_grace_ms; /* default 10000 */

    px_stream_conf *streams; /* nstreams >= 1 */
    size_t nstreams;
} px_config;

/* One problem found while loading: "FILE:LINE:COL: message". */
typedef struct px_diag {
    bool warning; /* true: reported but does not make the config invalid */
    char *text;   /* owned */
} px_diag;

typedef struct px_diags {
    px_diag *v;
    size_t n, cap;
    size_t nerrors; /* diagnostics that are not warnings */
} px_diags;

/*
 * Parse 'path' (read from disk) or, with px_config_parse, the YAML 'text' named
 * 'path' in messages. Expands ${VAR} / ${VAR:-default} in scalars, applies the
 * IDEMPROXY_REDIS_URL, IDEMPROXY_ENDPOINT and IDEMPROXY_LOG_LEVEL overrides,
 * fills defaults, validates and compiles templates. Every problem is appended
 * to 'd'. Returns the config when 'd' holds no errors, else NULL.
 */
px_config *px_config_load(const char *path, px_diags *d);
px_config *px_config_parse(const char *path, const char *text, size_t len, px_diags *d);
void px_config_destroy(px_config *c);

void px_diags_deinit(px_diags *d);

/* The connection options every link of the daemon (and the operator
 * commands) takes from the config: url or cluster or sentinel, TLS,
 * credentials, db, timeout. 'password' is the one read at start (ref). */
void px_config_redis_opts(const px_config *c, const char *name, const char *password,
                          px_redis_opts *o);

#endif
