/*
 * ops.h - the operator commands (issue 17): `inspect` shows what Redis holds
 * about a key or an entry, `redrive` moves a stream's dead letters back into
 * it (or, --purge, deletes them). They talk to Redis (one server, a Sentinel
 * master or a Redis Cluster) one command at a time through px_redis and name
 * every key with the daemon's own functions (px_event_set_key, px_dl_mark_name,
 * PX_FENCE_KEY), so they look where the daemon writes.
 *
 * Exit codes: 0 done, 1 Redis unreachable or an error reply, 2 usage or config.
 */
#ifndef PX_OPS_H
#define PX_OPS_H

#include "config.h"

typedef struct px_ops_args {
    const char *stream; /* --stream: required */
    const char *group;  /* --group: picks one of several blocks of the stream */
    const char *key;    /* inspect --key */
    const char *entry;  /* inspect --entry; redrive --entry: a dead letter's id or its entry's */
    const char *reason; /* redrive --reason: a substring of idemproxy-reason */
    long long max;      /* redrive --max; -1: no limit */
    bool json;          /* inspect --json */
    bool dry_run;       /* redrive --dry-run */
    bool purge;         /* redrive --purge: delete the dead letters, redrive none */
} px_ops_args;

int px_cmd_inspect(px_config *c, const px_ops_args *a);
int px_cmd_redrive(px_config *c, const px_ops_args *a);
/* keys: a dry run of the stream's templates over its last --count entries
 * (a->max; -1: 10,000). Exit 0 nothing found, 3 findings (render errors,
 * conflicts, copies further apart than done_ttl_ms), 1, 2. */
int px_cmd_keys(px_config *c, const px_ops_args *a);

/* The password idemproxy sends with AUTH, in *out: redis.password_file's
 * first line, else the url's password; NULL when there is none (an empty
 * file: no AUTH). false after printing to stderr, prefixed by 'who', why the
 * config cannot be used: the file cannot be read, or a user is set and there
 * is no password for it. */
bool px_config_password(const px_config *c, const char *who, char **out);

#endif
