/*
 * main.c - the command line (SPEC 3): parses options, runs one subcommand,
 * and for the daemon sets up the loop and hands over to proxy.c.
 */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"
#include "proxy.h"

static const char usage[] =
    "usage: idemproxy -c FILE             run\n"
    "       idemproxy check -c FILE       validate a config and its templates\n"
    "       idemproxy key TEMPLATE        render a key for the event JSON on stdin\n"
    "       idemproxy health [-c FILE]    GET /healthz on the metrics address\n"
    "       idemproxy --version | --help\n";

static void print_diags(const px_diags *d)
{
    for (size_t i = 0; i < d->n; i++)
        fprintf(stderr, "%s\n", d->v[i].text);
}

static px_config *load(const char *path)
{
    px_diags d = {0};
    px_config *c = px_config_load(path, &d);
    print_diags(&d);
    px_diags_deinit(&d);
    return c;
}

static int cmd_check(const char *path)
{
    px_config *c = load(path);
    if (c == NULL) return 2;
    fprintf(stderr, "%s: ok, %zu stream%s\n", path, c->nstreams, c->nstreams == 1 ? "" : "s");
    px_config_destroy(c);
    return 0;
}

static int cmd_key(const char *src)
{
    char err[256];
    int col = 0;
    px_template *t = px_template_compile(src, err, sizeof(err), &col);
    if (t == NULL) {
        fprintf(stderr, "template:%d: %s\n  %s\n  %*s^\n", col, err, src, col > 0 ? col - 1 : 0, "");
        return 2;
    }
    px_buf in = {0};
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
        px_tvars vars = { event, NULL, "", "" };
        px_buf out = {0};
        if (px_template_render(t, &vars, &out, err, sizeof(err)) != PX_OK) {
            fprintf(stderr, "key: %s\n", err);
            rc = 2;
        } else {
            printf("%s\n", out.data);
        }
        px_buf_deinit(&out);
    }
    json_object_put(event);
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
    char host[256] = "", port[16] = "";
    const char *colon = listen ? strrchr(listen, ':') : NULL;
    if (colon == NULL || (size_t)(colon - listen) >= sizeof(host) || strlen(colon + 1) >= sizeof(port)) {
        fprintf(stderr, "idemproxy health: metrics are disabled or metrics.listen is malformed\n");
        goto out;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    strcpy(port, colon + 1);
    if (host[0] == '[') { memmove(host, host + 1, strlen(host)); host[strcspn(host, "]")] = '\0'; }
    /* A wildcard listen address is reached on loopback. */
    if (host[0] == '\0' || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0) strcpy(host, "127.0.0.1");
    if (strcmp(host, "::") == 0) strcpy(host, "::1");
    struct addrinfo hints = {0}, *res = NULL;
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

/* Read the password file: its first line, without the newline. */
static char *read_password(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) return NULL;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    buf[strcspn(buf, "\r\n")] = '\0';
    return px_strdup(buf);
}

/* hiredis resolves host names with a blocking getaddrinfo on every connect:
 * resolve once here, before the loop runs, and hand it a numeric address. */
static void resolve_host(px_config *c)
{
    if (c->redis_host == NULL) return;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(c->redis_host, NULL, &hints, &res) != 0 || res == NULL) {
        px_log_warn("redis: cannot resolve %s now; hiredis will try on each connect", c->redis_host);
        return;
    }
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, ip, sizeof(ip));
    freeaddrinfo(res);
    free(c->redis_host);
    c->redis_host = px_strdup(ip);
}

static int cmd_run(const char *path)
{
    px_config *c = load(path);
    if (c == NULL) return 2;
    px_log_setup(c->log_level, c->log_format);
    char *password = c->redis_password ? px_strdup(c->redis_password) : NULL;
    if (c->password_file) {
        free(password);
        password = read_password(c->password_file);
        if (password == NULL) {
            fprintf(stderr, "%s: redis.password_file %s: %s\n", path, c->password_file,
                    strerror(errno));
            px_config_destroy(c);
            return 2;
        }
    }
    resolve_host(c);
    signal(SIGPIPE, SIG_IGN);
    srandom((unsigned)(px_now_ms() ^ (uint64_t)getpid()));

    struct ev_loop *loop = EV_DEFAULT;
    px_proxy *px = px_proxy_create(loop, c, password);
    free(password);
    if (px == NULL) {
        px_config_destroy(c);
        return 1;
    }
    px_log_info("idemproxy %s running: %zu stream%s, endpoint %s", PX_VERSION, c->nstreams,
                c->nstreams == 1 ? "" : "s", c->endpoint);
    ev_run(loop, 0);
    int rc = px->exit_code;
    px_log_info("stopped");
    px_proxy_destroy(px);
    px_config_destroy(c);
    ev_loop_destroy(loop);
    return rc;
}

int main(int argc, char **argv)
{
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
        { NULL, 0, NULL, 0 },
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "c:hV", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': config = optarg; break;
        case 'V': printf("idemproxy %s\n", PX_VERSION); return 0;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (sub == NULL) {
        if (config == NULL || optind != argc) { fputs(usage, stderr); return 2; }
        return cmd_run(config);
    }
    if (strcmp(sub, "check") == 0) {
        if (config == NULL || optind != argc) { fputs(usage, stderr); return 2; }
        return cmd_check(config);
    }
    if (strcmp(sub, "key") == 0) {
        if (optind + 1 != argc) { fputs(usage, stderr); return 2; }
        return cmd_key(argv[optind]);
    }
    if (strcmp(sub, "health") == 0) {
        if (optind != argc) { fputs(usage, stderr); return 2; }
        return cmd_health(config);
    }
    fprintf(stderr, "idemproxy: unknown command '%s'\n%s", sub, usage);
    return 2;
}
