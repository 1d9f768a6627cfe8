/*
 * main.c - the command line (docs/operations.md, "Command line"): parses
 * options, runs one subcommand, and for the daemon sets up the loop and hands
 * over to proxy.c.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "addr.h"
#include "link.h"
#include "log.h"
#include "ops.h"
#include "proxy.h"

#ifndef PX_COMMIT
#include "git_commit.h" /* PX_COMMIT: the git commit built, "" when unknown (Makefile) */
#endif

static const char usage[] =
    "usage: idemproxy -c FILE             run\n"
    "       idemproxy check -c FILE [--files]\n"
    "                                     validate a config and its templates (FILE - : stdin);\n"
    "                                     --files also reads the password and TLS files\n"
    "       idemproxy key TEMPLATE [--stream S] [--id ID] [--fields NAME=VALUE]...\n"
    "                                     render a key for the event JSON on stdin\n"
    "       idemproxy inspect -c FILE --stream S (--key K | --entry ID) [--group G] [--json]\n"
    "                                     what Redis holds about a key or an entry\n"
    "       idemproxy redrive -c FILE --stream S [--entry ID] [--reason TEXT] [--max N] [--dry-run]\n"
    "                                     [--purge] [--group G]\n"
    "                                     move the stream's dead letters back into it; --entry ID:\n"
    "                                     only the dead letter ID or the one of entry ID; --purge:\n"
    "                                     delete them instead (--dry-run lists what would go)\n"
    "       idemproxy keys -c FILE --stream S [--count N] [--json] [--group G]\n"
    "                                     dry-run the templates over the stream's last N entries\n"
    "       idemproxy health [-c FILE]    GET /healthz on the metrics address\n"
    "       idemproxy version | --version | --help\n";

static const char help_more[] =
    "\n"
    "environment (the daemon and check):\n"
    "  IDEMPROXY_REDIS_URL    replaces redis.url from the file\n"
    "  IDEMPROXY_ENDPOINT     replaces app.endpoint\n"
    "  IDEMPROXY_LOG_LEVEL    replaces log.level (error, warn, info, debug)\n"
    "  ${VAR} and ${VAR:-default} in any scalar of the config are expanded from the\n"
    "  environment ($$ is a literal $). An empty override is ignored.\n"
    "\n"
    "exit codes:\n"
    "  0  the daemon stopped cleanly (SIGTERM, SIGINT); a command succeeded\n"
    "  1  a runtime failure: Redis unreachable or an error reply (inspect, redrive),\n"
    "     the daemon could not start (socket, metrics address); health: 1 for any failure\n"
    "  2  usage or config error (check prints FILE:LINE:COL: message)\n"
    "  3  keys: findings (render errors, conflicting copies, copies further apart than\n"
    "     done_ttl_ms)\n"
    "\n"
    "inspect, redrive and keys work with redis.url, redis.sentinel and redis.cluster.\n";

static void print_diags(const px_diags *d)
{
    for (size_t i = 0; i < d->n; i++)
        fprintf(stderr, "%s\n", d->v[i].text);
}

/* The config at 'path', or from standard input when 'path' is "-" (named
 * <stdin> in messages). */
static px_config *load(const char *path)
{
    px_diags d = { 0 };
    px_config *c;
    if (strcmp(path, "-") == 0) {
        px_buf in = { 0 };
        char chunk[8192];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0) px_buf_append(&in, chunk, n);
        c = px_config_parse("<stdin>", in.data ? in.data : "", in.len, &d);
        px_buf_deinit(&in);
    } else {
        c = px_config_load(path, &d);
    }
    print_diags(&d);
    px_diags_deinit(&d);
    return c;
}

/* redis.tls's files load (the CA, the client pair, which must match), or one
 * line says which does not and why. */
static bool tls_files_ok(const px_config *c)
{
    char err[512];
    if (px_link_tls_check(&c->redis_tls, err, sizeof(err))) return true;
    fprintf(stderr, "%s: redis.tls: %s\n", c->path, err);
    return false;
}

/* redis.sentinel.password_file reads, as redis.password_file must (its
 * first line is the sentinels' password; the daemon reads it again at every
 * connect to a sentinel). */
static bool sentinel_password_ok(const px_config *c)
{
    char *pw;
    const char *f = c->sentinel.password_file;
    if (f == NULL) return true;
    if (px_redis_read_password(f, &pw) != 0) {
        fprintf(stderr, "%s: redis.sentinel.password_file %s: cannot read it: %s\n", c->path, f,
                strerror(errno));
        return false;
    }
    px_free_secret(pw);
    return true;
}

/* Hermetic (docs/configuration.md): no file but the config is read unless
 * 'files' (--files) asks for the password files and the TLS files, as the
 * daemon reads them. */
static int cmd_check(const char *path, bool files)
{
    px_config *c = load(path);
    if (c == NULL) return 2;
    char *password = NULL;
    bool ok = !files || (px_config_password(c, c->path, &password) && tls_files_ok(c) &&
                         sentinel_password_ok(c));
    px_free_secret(password);
    if (!ok) {
        px_config_destroy(c);
        return 2;
    }
    fprintf(stderr, "%s: ok, %zu stream%s\n", c->path, c->nstreams, c->nstreams == 1 ? "" : "s");
    px_config_destroy(c);
    return 0;
}

/* 'fields' ('nfields' of NAME=VALUE) as the #fields object, or NULL after
 * saying which one is malformed. */
static json_object *fields_object(char **fields, size_t nfields)
{
    json_object *o = json_object_new_object();
    for (size_t i = 0; i < nfields; i++) {
        const char *eq = strchr(fields[i], '=');
        if (eq == NULL || eq == fields[i]) {
            fprintf(stderr, "idemproxy key: --fields %s: expected NAME=VALUE\n", fields[i]);
            json_object_put(o);
            return NULL;
        }
        char *name = px_strndup(fields[i], (size_t)(eq - fields[i]));
        json_object_object_add(o, name, json_object_new_string(eq + 1));
        free(name);
    }
    return o;
}

/* Render TEMPLATE over the event on stdin; #stream, #id and #fields come from
 * --stream, --id and --fields (without them: "", "" and no #fields). */
static int cmd_key(const char *src, const char *stream, const char *id, char **fields,
                   size_t nfields)
{
    char err[256];
    int col = 0;
    px_template *t = px_template_compile(src, err, sizeof(err), &col);
    if (t != NULL && px_template_check_key(t, err, sizeof(err), &col) != PX_OK) {
        px_template_destroy(t); /* a key that reads nothing (docs/configuration.md), as check says */
        t = NULL;
    }
    if (t == NULL) {
        fprintf(stderr, "template:%d: %s\n  %s\n  %*s^\n", col, err, src, col > 0 ? col - 1 : 0, "");
        return 2;
    }
    json_object *fobj = NULL;
    if (nfields && (fobj = fields_object(fields, nfields)) == NULL) {
        px_template_destroy(t);
        return 2;
    }
    px_buf in = { 0 };
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0) px_buf_append(&in, chunk, n);
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    json_object *event = in.len ? json_tokener_parse_ex(tok, in.data, (int)in.len) : NULL;
    int rc = 0;
    if (event == NULL || json_tokener_get_error(tok) != json_tokener_success ||
        !json_object_is_type(event, json_type_object)) {
        fprintf(stderr, "stdin: expected one JSON object (the event)\n");
        rc = 2;
    } else {
        px_tvars vars = { event, fobj, stream ? stream : "", id ? id : "" };
        px_buf out = { 0 };
        if (px_template_render(t, &vars, &out, err, sizeof(err)) != PX_OK) {
            fprintf(stderr, "key: %s\n", err);
            rc = 2;
        } else {
            printf("%s\n", out.data);
        }
        px_buf_deinit(&out);
    }
    json_object_put(event);
    json_object_put(fobj);
    json_tokener_free(tok);
    px_buf_deinit(&in);
    px_template_destroy(t);
    return rc;
}

/* GET /healthz on the metrics address: 0 when it answers 200, else 1. Only the
 * status line is read; the server side is libmicrohttpd (metrics.c). */
static int cmd_health(const char *path)
{
    const char *listen = "127.0.0.1:9464";
    px_config *c = NULL;
    if (path) {
        c = load(path);
        if (c == NULL) return 1;
        listen = c->metrics_listen;
    }
    int rc = 1;
    char host[PX_ADDR_HOST_MAX], port[8];
    int portno;
    if (!px_addr_split(listen, host, sizeof(host), &portno, PX_ADDR_HOST_OPTIONAL)) {
        fprintf(stderr, "idemproxy health: metrics are disabled or metrics.listen is malformed\n");
        goto out;
    }
    snprintf(port, sizeof(port), "%d", portno);
    /* A wildcard listen address is reached on loopback. */
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0) strcpy(host, "127.0.0.1");
    if (strcmp(host, "::") == 0) strcpy(host, "::1");
    struct addrinfo hints = { 0 }, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, port, &hints, &res) != 0) {
        fprintf(stderr, "idemproxy health: cannot resolve %s\n", listen);
        goto out;
    }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    char resp[64] = "";
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        static const char req[] = "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n";
        if (write(fd, req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
            ssize_t n = read(fd, resp, sizeof(resp) - 1);
            resp[n > 0 ? n : 0] = '\0';
        }
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    if (strncmp(resp, "HTTP/1.1 200", 12) == 0 || strncmp(resp, "HTTP/1.0 200", 12) == 0) {
        printf("healthy\n");
        rc = 0;
    } else {
        fprintf(stderr, "idemproxy health: %s: %s\n", listen, resp[0] ? "not healthy" : "no answer");
    }
out:
    px_config_destroy(c);
    return rc;
}

/* One line when a password file can be read by more than the daemon needs:
 * by others, or by its group while the daemon owns it (the group bit is
 * needed when the file is someone else's: Kubernetes mounts a Secret as
 * root, group fsGroup, and defaultMode 0440 lets the pod's user read it). */
static void password_file_mode_warn(const char *option, const char *file)
{
    struct stat sb;
    if (file == NULL || stat(file, &sb) != 0) return;
    bool others = sb.st_mode & S_IROTH;
    bool group = (sb.st_mode & S_IRGRP) && sb.st_uid == geteuid();
    if (others || group)
        px_log_warn("%s %s is readable by %s (mode %04o): make it 0400, or 0440 with a group "
                    "only idemproxy is in (Kubernetes: defaultMode and fsGroup)",
                    option, file, others ? "every user" : "its group",
                    (unsigned)(sb.st_mode & 07777));
}

static int cmd_run(const char *path)
{
    /* A SIGTERM or SIGINT that comes before the loop watches for them (a pod
     * stopped as it starts) waits, blocked, and is the drain once it does:
     * exit 0, not killed by the signal (143 to Kubernetes). */
    sigset_t stops, before;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    sigprocmask(SIG_BLOCK, &stops, &before);
    px_config *c = load(path);
    if (c == NULL) return 2;
    px_log_setup(c->log_level, c->log_format);
    char *password;
    if (!px_config_password(c, c->path, &password)) {
        px_config_destroy(c);
        return 2;
    }
    password_file_mode_warn("redis.password_file", c->password_file);
    password_file_mode_warn("redis.sentinel.password_file", c->sentinel.password_file);
    if (!tls_files_ok(c)) {
        px_free_secret(password);
        px_config_destroy(c);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    srandom((unsigned)(px_now_ms() ^ (uint64_t)getpid()));

    struct ev_loop *loop = EV_DEFAULT;
    px_proxy *px = px_proxy_create(loop, c, password);
    sigprocmask(SIG_SETMASK, &before, NULL); /* the watchers take what came meanwhile */
    px_free_secret(password);
    if (px == NULL) {
        px_config_destroy(c);
        return 1;
    }
    px_log_info("idemproxy %s running: %zu stream%s, endpoint %s", PX_VERSION, c->nstreams,
                c->nstreams == 1 ? "" : "s", c->endpoint);
    ev_run(loop, 0); /* returns once drained after SIGTERM/SIGINT: a clean stop */
    px_log_info("stopped");
    px_proxy_destroy(px);
    px_config_destroy(c);
    ev_loop_destroy(loop);
    return 0;
}

static void print_version(void)
{
    if (PX_COMMIT[0]) printf("idemproxy %s (commit %s)\n", PX_VERSION, PX_COMMIT);
    else printf("idemproxy %s\n", PX_VERSION);
}

/* Options, and the subcommands each belongs to (bit per command). */
enum { SUB_RUN = 1,
       SUB_CHECK = 2,
       SUB_KEY = 4,
       SUB_HEALTH = 8,
       SUB_INSPECT = 16,
       SUB_REDRIVE = 32,
       SUB_VERSION = 64,
       SUB_KEYS = 128 };

static int bad_usage(const char *msg, const char *arg)
{
    if (msg) fprintf(stderr, "idemproxy: %s%s\n", msg, arg ? arg : "");
    fputs(usage, stderr);
    return 2;
}

int main(int argc, char **argv)
{
    /* No core dump and no ptrace or /proc/PID/mem by other processes of the
     * same user: the process holds the Redis password (SECURITY.md). */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    const char *config = NULL;
    const char *sub = NULL;
    if (argc > 1 && argv[1][0] != '-') {
        sub = argv[1];
        argv++;
        argc--;
    }
    static const struct option opts[] = {
        { "config", required_argument, NULL, 'c' },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { "stream", required_argument, NULL, 's' },
        { "group", required_argument, NULL, 'g' },
        { "id", required_argument, NULL, 'i' },
        { "fields", required_argument, NULL, 'f' },
        { "key", required_argument, NULL, 'k' },
        { "entry", required_argument, NULL, 'e' },
        { "json", no_argument, NULL, 'j' },
        { "reason", required_argument, NULL, 'r' },
        { "max", required_argument, NULL, 'm' },
        { "dry-run", no_argument, NULL, 'n' },
        { "purge", no_argument, NULL, 'P' },
        { "count", required_argument, NULL, 'C' },
        { "files", no_argument, NULL, 'F' },
        { NULL, 0, NULL, 0 },
    };
    static const struct {
        int ch;
        const char *name;
        int subs;
    } allowed[] = {
        { 'c', "-c/--config", SUB_RUN | SUB_CHECK | SUB_HEALTH | SUB_INSPECT | SUB_REDRIVE | SUB_KEYS },
        { 's', "--stream", SUB_KEY | SUB_INSPECT | SUB_REDRIVE | SUB_KEYS },
        { 'g', "--group", SUB_INSPECT | SUB_REDRIVE | SUB_KEYS },
        { 'i', "--id", SUB_KEY },
        { 'f', "--fields", SUB_KEY },
        { 'k', "--key", SUB_INSPECT },
        { 'e', "--entry", SUB_INSPECT | SUB_REDRIVE },
        { 'j', "--json", SUB_INSPECT | SUB_KEYS },
        { 'C', "--count", SUB_KEYS },
        { 'r', "--reason", SUB_REDRIVE },
        { 'm', "--max", SUB_REDRIVE },
        { 'n', "--dry-run", SUB_REDRIVE },
        { 'P', "--purge", SUB_REDRIVE },
        { 'F', "--files", SUB_CHECK },
    };
    int subbit = 0;
    if (sub == NULL) subbit = SUB_RUN;
    else if (strcmp(sub, "check") == 0) subbit = SUB_CHECK;
    else if (strcmp(sub, "key") == 0) subbit = SUB_KEY;
    else if (strcmp(sub, "health") == 0) subbit = SUB_HEALTH;
    else if (strcmp(sub, "inspect") == 0) subbit = SUB_INSPECT;
    else if (strcmp(sub, "redrive") == 0) subbit = SUB_REDRIVE;
    else if (strcmp(sub, "keys") == 0) subbit = SUB_KEYS;
    else if (strcmp(sub, "version") == 0) subbit = SUB_VERSION;
    else {
        /* "idemproxy c.yaml": a file where a command was expected */
        bool file = access(sub, F_OK) == 0;
        fprintf(stderr, "idemproxy: unknown command '%s'%s%s%s\n%s", sub,
                file ? " (to run with it as the config file: idemproxy -c " : "", file ? sub : "",
                file ? ")" : "", usage);
        return 2;
    }
    px_ops_args a = { .max = -1 };
    const char *id = NULL;
    char **fields = px_calloc((size_t)argc + 1, sizeof(char *));
    size_t nfields = 0;
    int ch, rc = 2;
    bool files = false;
    while ((ch = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        if (ch == 'V') {
            print_version();
            rc = 0;
            goto out;
        }
        if (ch == 'h') {
            fputs(usage, stdout);
            fputs(help_more, stdout);
            rc = 0;
            goto out;
        }
        if (ch == '?' || ch == ':') {
            fputs(usage, stderr);
            goto out;
        }
        for (size_t i = 0; i < sizeof(allowed) / sizeof(*allowed); i++)
            if (allowed[i].ch == ch && !(allowed[i].subs & subbit)) {
                fprintf(stderr, "idemproxy: %s is not an option of %s\n%s", allowed[i].name,
                        sub ? sub : "the daemon", usage);
                goto out;
            }
        switch (ch) {
        case 'c': config = optarg; break;
        case 's': a.stream = optarg; break;
        case 'g': a.group = optarg; break;
        case 'i': id = optarg; break;
        case 'f': fields[nfields++] = optarg; break;
        case 'k': a.key = optarg; break;
        case 'e': a.entry = optarg; break;
        case 'j': a.json = true; break;
        case 'r': a.reason = optarg; break;
        case 'n': a.dry_run = true; break;
        case 'P': a.purge = true; break;
        case 'F': files = true; break;
        case 'm': {
            char *end;
            errno = 0;
            a.max = strtoll(optarg, &end, 10);
            if (errno || end == optarg || *end || a.max < 0) {
                rc = bad_usage("--max expects a count (0 or more), not ", optarg);
                goto out;
            }
            break;
        }
        case 'C': { /* keys --count: kept in a.max */
            char *end;
            errno = 0;
            a.max = strtoll(optarg, &end, 10);
            if (errno || end == optarg || *end || a.max < 1) {
                rc = bad_usage("--count expects a number of entries (1 or more), not ", optarg);
                goto out;
            }
            break;
        }
        }
    }
    /* "idemproxy check c.yaml": the file is there, only -c is missing. */
    if ((subbit & allowed[0].subs) && config == NULL && optind < argc) {
        fprintf(stderr, "idemproxy: -c is missing before '%s' (a config file is given as -c FILE)\n%s",
                argv[optind], usage);
        goto out;
    }
    if (subbit == SUB_CHECK && config == NULL) {
        rc = bad_usage("check needs -c FILE", NULL);
        goto out;
    }
    switch (subbit) {
    case SUB_RUN:
        if (config == NULL || optind != argc) {
            fputs(usage, stderr);
            break;
        }
        rc = cmd_run(config);
        break;
    case SUB_CHECK:
        if (config == NULL || optind != argc) {
            fputs(usage, stderr);
            break;
        }
        rc = cmd_check(config, files);
        break;
    case SUB_KEY:
        if (optind + 1 != argc) {
            fputs(usage, stderr);
            break;
        }
        rc = cmd_key(argv[optind], a.stream, id, fields, nfields);
        break;
    case SUB_HEALTH:
        if (optind != argc) {
            fputs(usage, stderr);
            break;
        }
        rc = cmd_health(config);
        break;
    case SUB_VERSION:
        if (optind != argc) {
            fputs(usage, stderr);
            break;
        }
        print_version();
        rc = 0;
        break;
    case SUB_INSPECT:
    case SUB_REDRIVE:
    case SUB_KEYS: {
        if (optind != argc) {
            rc = bad_usage("unexpected argument ", argv[optind]);
            break;
        }
        if (config == NULL || a.stream == NULL) {
            rc = bad_usage("-c FILE and --stream S are required", NULL);
            break;
        }
        if (subbit == SUB_INSPECT && (a.key == NULL) == (a.entry == NULL)) {
            rc = bad_usage("inspect takes one of --key K or --entry ID", NULL);
            break;
        }
        px_config *c = load(config);
        if (c == NULL) break;
        rc = subbit == SUB_INSPECT ? px_cmd_inspect(c, &a)
             : subbit == SUB_KEYS  ? px_cmd_keys(c, &a)
                                   : px_cmd_redrive(c, &a);
        px_config_destroy(c);
        break;
    }
    }
out:
    free(fields);
    return rc;
}
