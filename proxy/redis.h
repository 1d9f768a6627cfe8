/*
 * redis.h - Redis on the libev loop: one server, or a Redis Cluster. The
 * connection itself (link.h) adds what hiredis 0.14 lacks: TLS, the name
 * resolved again at every connect, a deadline on every command (when it
 * passes, the connection is dropped and every pending callback runs with
 * reply == NULL), reconnection with backoff, AUTH/SELECT on connect, and
 * scripts sent as EVALSHA that fall back to EVAL after NOSCRIPT.
 *
 * Callers route through px_redis_argv with the key the command is about. With
 * cluster startup nodes in the options ('seeds'), a px_redis is a Redis Cluster client
 * (cluster.c) behind the same calls: each command goes to the master that owns
 * its key's slot. With a master_name, it is one link to the master the
 * sentinels name (sentinel.c), followed across failovers.
 */
#ifndef PX_REDIS_H
#define PX_REDIS_H

#include <ev.h>
#include <hiredis/hiredis.h>

#include "px.h"

typedef struct px_redis px_redis;

/* 'reply' is NULL when the link went down before the reply came; it is valid
 * only for the duration of the callback. */
typedef void px_redis_cb(px_redis *r, redisReply *reply, void *priv);

/* TLS to the server (redis.tls, a rediss:// url). Files are read again at
 * every connect, so rotated certificates are picked up. */
typedef struct px_tls_opts {
    bool enabled;
    const char *ca_file;     /* (ref) NULL: the system's CAs */
    const char *cert_file;   /* (ref) client certificate (mutual TLS), with key_file */
    const char *key_file;    /* (ref) */
    const char *server_name; /* (ref) the name verified and sent (SNI); NULL: the host */
    bool verify;             /* peer verification (default on) */
} px_tls_opts;

typedef struct px_redis_opts {
    const char *name; /* (ref) for logs: "commands", "reader room" */
    const char *host; /* (ref) a name (resolved again at every connect) or a
                                  numeric address; NULL with 'unix_path' */
    int port;
    const char *unix_path;     /* (ref) */
    const char *user;          /* (ref) may be NULL */
    const char *password;      /* (ref) may be NULL: no AUTH; never logged */
    const char *password_file; /* (ref) may be NULL: read again at every connect, so a
                                  rotated Secret is picked up; its first line replaces
                                  'password' (a file that cannot be read, or is empty
                                  while a user is set, keeps the last one) */
    int db;
    long long timeout_ms;     /* deadline of every command */
    const char *const *seeds; /* (ref) Redis Cluster startup nodes "host:port"; host/port unused */
    size_t nseeds;
    bool cluster_node;      /* a cluster's link to one node: errors are the router's to report */
    size_t max_array_bytes; /* strings of a reply's array past this many bytes are
                                    elided (reply.h): max_entry_bytes; 0 keeps all */
    size_t max_elements;    /* a reply's array of more elements is a protocol error
                                    (reply.h): 2 x max_entry_bytes; 0: PX_REPLY_MIN_ELEMENTS */
    const px_tls_opts *tls; /* (ref) NULL, or not enabled: plain TCP */
    /* Redis Sentinel (sentinel.h): with master_name set, the master is asked of
     * these sentinels at every connect; host/port unused. */
    const char *master_name;      /* (ref) NULL: no sentinels */
    const char *const *sentinels; /* (ref) "host:port" */
    size_t nsentinels;
    const char *sentinel_user;          /* (ref) the sentinels' own credentials; may be NULL */
    const char *sentinel_password_file; /* (ref) may be NULL: no AUTH to the sentinels */
    bool sentinel_peer;                 /* a link to a sentinel: AUTH and PING only (no SELECT,
                                  HELLO version check or SCRIPT LOAD: not a data node) */
    bool check_role;                    /* a master found by the sentinels: ROLE must say master at
                                  connect, and a READONLY reply drops the link */
} px_redis_opts;

/* Called when the link becomes usable (after AUTH/SELECT) and when it is lost. */
typedef void px_redis_state_cb(px_redis *r, bool up, void *udata);

typedef struct px_script {
    const char *body; /* Lua source */
    char sha[41];     /* filled by px_script_init */
} px_script;

/* Registers 's' (its sha cleared): every link loads it at each connect
 * (SCRIPT LOAD), and px_redis_script sends it as EVALSHA. At most 8. */
void px_script_init(px_script *s);
/* The scripts registered, in order, NULL-terminated (for link.c). */
px_script **px_scripts(void);

px_redis *px_redis_create(struct ev_loop *loop, const px_redis_opts *opts,
                          px_redis_state_cb *state_cb, void *udata);
void px_redis_destroy(px_redis *r);

/* A single server: connected and authenticated. A cluster: every slot has a
 * master and every master's link is up. */
bool px_redis_is_up(const px_redis *r);

/* True when the server that holds 'key' ('len' bytes) is reachable: on a
 * single server px_redis_is_up; on a cluster, the master that owns the key's
 * slot has a live link, whatever the other masters do (one failing over stops
 * only what lives on it). A NULL key: any master. */
bool px_redis_key_up(const px_redis *r, const char *key, size_t len);

/* True for a Redis Cluster client. */
bool px_redis_clustered(const px_redis *r);

/* True when keys 'a' and 'b' are served by one connection in order: always on
 * a single server, on a cluster only when they share a hash slot. Commands on
 * different slots may run in any order relative to each other. */
bool px_redis_same_slot(const px_redis *r, const char *a, const char *b);

/* Commands sent and not yet answered. */
size_t px_redis_pending(const px_redis *r);

/*
 * Send one command. 'key' names the key the command routes by (may be NULL).
 * 'extra_ms' is added to the deadline (a blocking read's BLOCK time).
 * Returns PX_OK, or PX_ERR when the link is down (then 'cb' is never called);
 * on a cluster that is not wholly up, when the key's node is not reachable.
 */
int px_redis_argv(px_redis *r, const char *key, long long extra_ms, px_redis_cb *cb,
                  void *priv, int argc, const char **argv, const size_t *lens);

/* px_redis_argv for NUL-terminated arguments (at most 16), routed by 'key' as
 * px_redis_argv is: the key whose slot holds the data (the stream of an XACK
 * or an XINFO GROUPS), never an argument's position. */
int px_redis_strv(px_redis *r, const char *key, px_redis_cb *cb, void *priv, int argc,
                  const char **argv);

/* Run script 's' with 'nkeys' keys followed by args; argv excludes EVALSHA/sha/numkeys.
 * Routed by KEYS[1], argv[0] (any master when 'nkeys' is 0): a script declares
 * its keys, and every one of them must share KEYS[1]'s slot on a cluster.
 * At most 5 keys and args together (PX_ERR otherwise). */
int px_redis_script(px_redis *r, px_script *s, px_redis_cb *cb, void *priv, int nkeys,
                    int argc, const char **argv, const size_t *lens);

/* What `HELLO 2`, sent at every connect of every link, says about the server
 * (docs/operations.md): Redis 7.0 or newer, or any Valkey, is needed (SET NX
 * GET). An error "unknown command" is a server older than 6.0. Another error
 * (an ACL without HELLO) or a reply without a version cannot tell. 'ver' gets
 * the version text. Pure, for tests. */
typedef enum { PX_SERVER_OK,
               PX_SERVER_OLD,
               PX_SERVER_UNKNOWN } px_server_check;
px_server_check px_redis_server_check(const redisReply *hello, char *ver, size_t versize);

/* The first line of the password file at 'path', without its line end, in
 * *out: NULL when the file is empty or holds only a line end (no password:
 * no AUTH). -1 (errno set) when it cannot be read. */
int px_redis_read_password(const char *path, char **out);

/* True while a command was refused for a missing ACL permission (NOPERM) and
 * has not succeeded since: the daemon is not ready (docs/operations.md,
 * /readyz). A NOPERM drops the link it came on, as an outage would: the
 * commands on it are retried once it is back, with backoff; one line says what
 * was refused. */
bool px_redis_refused(void);

/* Count of commands that failed (error replies, timeouts, lost links). */
extern unsigned long long px_redis_errors;

/* Redis Cluster redirects followed: [0] MOVED, [1] ASK. */
extern unsigned long long px_redis_redirects[2];

#endif
