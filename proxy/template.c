/*
 * template.c - the key template language (docs/configuration.md): compile once,
 * render once per entry.
 *
 * The language is the part of Spring's SpEL that dedup keys are written in.
 * A source that starts with '#' (but not "#{") is one expression:
 *
 *     #event.eventId
 *     #event.winner?.name ?: 'nobody'
 *
 * anything else is a template, literal text with #{...} parts whose leading
 * '#' on a variable is optional:
 *
 *     room:#{event.joinCode}:#{#event.items[0]['id']}
 *
 * Grammar, lowest precedence first (this is SpEL's, cut down):
 *
 *     expr    := sum [ '?:' expr ]                 Elvis, right-associative
 *     sum     := postfix { '+' postfix }           left-associative
 *     postfix := primary { '.' name ['()'] | '?.' name ['()']
 *                        | '[' expr ']' | '?.[' expr ']' }
 *     primary := '#' var | var (inside #{...} only) | string | number
 *              | '(' expr ')'
 *
 * The variables are #event, #fields, #stream, #id and #root (= #event); any
 * other name is a compile error. 'name()' is a Java record accessor and means
 * the same as 'name': there are no other methods. Strings are '...' or "..."
 * with the quote doubled to escape it, as in SpEL.
 *
 * Values and rendering. A property that is not there reads as null (as SpEL's
 * map['key'] does), so '?.' and '?:' work on it; reading a property of null
 * without '?.' is an error. '?.' guards one step only: as in SpEL the rest of
 * the chain is still evaluated, so #event.a?.b.c fails when a is null. Elvis
 * takes its right side when the left is null or the empty string. '+' adds two
 * integers and otherwise concatenates when either side is a string. The
 * result, and every operand of a concatenation, must be a string, a number or
 * a boolean: null, missing, objects and arrays are errors, never the text
 * "null". Numbers read from JSON render as written there (1.50 stays "1.50").
 *
 * Literal text that holds a variable (room:#event.eventId, a:#id) is a
 * compile error that shows the #{...} form meant: SpEL would keep it as text,
 * the same key for every event (issue 31). Whether a template reads the entry
 * at all is px_template_check_key's question, asked of keys only. A source
 * that is not valid UTF-8 does not compile.
 *
 * Compile errors carry a 1-based column counted in characters (UTF-8), not
 * bytes. Names are SpEL's ASCII letters, digits, '_' and '$' plus any
 * non-ASCII character; other keys are reached with ['...']. An integer that
 * json-c may have clamped is refused (see view_json). The empty string is a
 * valid result: whether an empty key is acceptable is the caller's call.
 *
 * Where SpEL answers differently (it renders null as "null", adds decimals,
 * indexes strings, ...) the difference is deliberate and listed case by case
 * in tests/unit/template_cases.json, which tests/spel/ runs through real SpEL.
 *
 * Rendering allocates nothing but the growth of the caller's buffer. An
 * expression evaluates to a "value view" (struct tval): a pointer into the
 * event's json-c objects, into the template's own literals, a small integer,
 * or - for the result of a concatenation - a range already appended to the
 * output buffer. Text is appended only once it is known to be renderable, and
 * every intermediate string is built in place in the output buffer.
 */
#include "template.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deepest nesting of parentheses, Elvis and '+' chains a template may have;
 * compile and render recurse, so this bounds their stack use. */
#define PX_TEMPLATE_MAX_DEPTH 128

/* Longest piece of a template quoted back in a render error. */
#define PX_TEMPLATE_MAX_QUOTE 80

/* ------------------------------------------------------------------------ */
/* The compiled form                                                         */
/* ------------------------------------------------------------------------ */

typedef px_tvar tvar;
#define TV_EVENT  PX_TVAR_EVENT
#define TV_FIELDS PX_TVAR_FIELDS
#define TV_STREAM PX_TVAR_STREAM
#define TV_ID     PX_TVAR_ID

typedef enum {
    N_TEXT,  /* literal text or a string literal: 'str', 'len' */
    N_INT,   /* integer literal (never negative: no unary minus): 'mag' */
    N_DEC,   /* decimal literal, rendered as written: 'str', 'len' */
    N_VAR,   /* a variable: 'var' */
    N_PROP,  /* 'a'.name, 'a'?.name, 'a'.name(): 'str' is the name */
    N_INDEX, /* 'a'['b'], 'a'?.['b'] */
    N_ELVIS, /* 'a' ?: 'b' */
    N_PLUS   /* 'a' + 'b' */
} tnode_kind;

typedef struct tnode {
    tnode_kind kind;
    tvar var;            /* N_VAR: which variable */
    bool safe;           /* N_PROP, N_INDEX: written with '?.' */
    uint64_t mag;        /* N_INT: magnitude */
    char *str;           /* owned, NUL-terminated: text, name or decimal */
    size_t len;          /* bytes in 'str' */
    struct tnode *a, *b; /* owned operands, see 'kind' */
    size_t pos;          /* where the node starts in the source (bytes) */
    size_t span;         /* how many source bytes it covers */
    int depth;           /* 1 + the deepest operand */
} tnode;

struct px_template {
    char *src;          /* owned copy of the source */
    size_t nparts;      /* parts rendered one after another */
    tnode **parts;      /* owned; N_TEXT for literal text, else #{...} */
    unsigned uses;      /* 1 << px_tvar for each variable a part reads */
    const char *member; /* (ref into 'parts') see px_template_simple_member */
    size_t member_len;
};

static void node_free(tnode *n)
{
    if (n == NULL) return;
    node_free(n->a);
    node_free(n->b);
    free(n->str);
    free(n);
}

/* ------------------------------------------------------------------------ */
/* Lexer                                                                     */
/* ------------------------------------------------------------------------ */

typedef enum {
    T_EOF,
    T_ERR,
    T_VAR,
    T_IDENT,
    T_STR,
    T_INT,
    T_DEC,
    T_DOT,
    T_SAFE,
    T_ELVIS,
    T_PLUS,
    T_LBRACK,
    T_RBRACK,
    T_LPAREN,
    T_RPAREN,
    T_RBRACE
} tok_kind;

typedef struct tok {
    tok_kind kind;
    size_t pos;  /* first byte in the source */
    size_t len;  /* bytes, quotes and '#' included */
    size_t name; /* T_VAR: where the name after '#' starts */
} tok;

typedef struct parser {
    const char *src;
    size_t n;        /* bytes in 'src' */
    size_t p;        /* lexer position */
    size_t prev_end; /* end of the last token consumed */
    tok cur;         /* the token being looked at */
    bool braces;     /* inside #{...}: bare variables, '}' ends */
    int depth;       /* parse_expr recursion */
    char *err;
    size_t errlen;
    size_t errpos; /* byte offset of the problem */
    bool failed;
} parser;

static void parse_error(parser *ps, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record the first compile error; later ones are consequences of it. */
static void parse_error(parser *ps, size_t pos, const char *fmt, ...)
{
    if (ps->failed) return;
    ps->failed = true;
    ps->errpos = pos;
    if (ps->err && ps->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err, ps->errlen, fmt, ap);
        va_end(ap);
        px_utf8_cut_end(ps->err); /* a cut message ends between characters */
    }
}

/* Names are ASCII letters, digits, '_' and '$' as in SpEL, and any non-ASCII
 * (UTF-8) character, so that #event.größe works as it does in SpEL. */
static bool is_ident_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' ||
           (unsigned char)c >= 0x80;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_ident_char(char c)
{
    return is_ident_start(c) || is_digit(c);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Move 'ps' to the next token and return its kind. Whitespace between tokens
 * is skipped, as SpEL does, also between '#' and the variable name. */
static tok_kind next(parser *ps)
{
    const char *s = ps->src;
    size_t n = ps->n, p = ps->p;

    if (ps->cur.kind != T_ERR) ps->prev_end = ps->cur.pos + ps->cur.len;
    while (p < n && is_space(s[p])) p++;
    tok t = { T_EOF, p, 0, 0 };
    if (p >= n) goto done;

    char c = s[p];
    if (c == '#') {
        size_t q = p + 1;
        while (q < n && is_space(s[q])) q++;
        if (q >= n || !is_ident_start(s[q])) {
            parse_error(ps, p, "expected a variable name after '#'");
            t.kind = T_ERR;
            goto done;
        }
        t.kind = T_VAR;
        t.name = q;
        while (q < n && is_ident_char(s[q])) q++;
        t.len = q - p;
    } else if (is_ident_start(c)) {
        size_t q = p;
        while (q < n && is_ident_char(s[q])) q++;
        t.kind = T_IDENT;
        t.len = q - p;
    } else if (is_digit(c)) {
        size_t q = p;
        while (q < n && is_digit(s[q])) q++;
        t.kind = T_INT;
        if (q + 1 < n && s[q] == '.' && is_digit(s[q + 1])) {
            t.kind = T_DEC;
            q++;
            while (q < n && is_digit(s[q])) q++;
        }
        if (q < n && (s[q] == 'e' || s[q] == 'E')) {
            size_t e = q + 1;
            if (e < n && (s[e] == '+' || s[e] == '-')) e++;
            if (e < n && is_digit(s[e])) {
                t.kind = T_DEC;
                q = e;
                while (q < n && is_digit(s[q])) q++;
            }
        }
        t.len = q - p;
    } else if (c == '\'' || c == '"') {
        size_t q = p + 1;
        for (;;) {
            if (q >= n) {
                parse_error(ps, p, "unterminated string literal");
                t.kind = T_ERR;
                goto done;
            }
            if (s[q] == c) {
                if (q + 1 < n && s[q + 1] == c) {
                    q += 2;
                    continue;
                }
                break;
            }
            q++;
        }
        t.kind = T_STR;
        t.len = q + 1 - p;
    } else if (c == '?' && p + 1 < n && s[p + 1] == '.') {
        t.kind = T_SAFE;
        t.len = 2;
    } else if (c == '?' && p + 1 < n && s[p + 1] == ':') {
        t.kind = T_ELVIS;
        t.len = 2;
    } else if (c == '.') {
        t.kind = T_DOT;
        t.len = 1;
    } else if (c == '+') {
        t.kind = T_PLUS;
        t.len = 1;
    } else if (c == '[') {
        t.kind = T_LBRACK;
        t.len = 1;
    } else if (c == ']') {
        t.kind = T_RBRACK;
        t.len = 1;
    } else if (c == '(') {
        t.kind = T_LPAREN;
        t.len = 1;
    } else if (c == ')') {
        t.kind = T_RPAREN;
        t.len = 1;
    } else if (c == '}') {
        t.kind = T_RBRACE;
        t.len = 1;
    } else {
        if (c == '?')
            parse_error(ps, p, "'?' must be followed by '.' or ':' "
                               "(there is no a ? b : c; use ?: for a fallback)");
        else if (strchr("-*/%^<>=!&|,:{@", c))
            parse_error(ps, p, "'%c' is not part of the key template language "
                               "(it has . ?. [] ?: + only)",
                        c);
        else if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7f)
            parse_error(ps, p, "unexpected character '%c'", c);
        else
            parse_error(ps, p, "unexpected character 0x%02x", (unsigned char)c);
        t.kind = T_ERR;
    }

done:
    ps->cur = t;
    ps->p = t.pos + t.len;
    return t.kind;
}

/* How many of the 'n' bytes at 's' fit in 'max' without cutting a UTF-8
 * character in two, so that messages stay valid UTF-8. */
static size_t utf8_cut(const char *s, size_t n, size_t max)
{
    if (n <= max) return n;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
    return max;
}

/* A token as people see it, for "unexpected ..." messages. */
static void tok_describe(const parser *ps, const tok *t, char *buf, size_t len)
{
    switch (t->kind) {
    case T_EOF: snprintf(buf, len, "end of template"); break;
    case T_STR: snprintf(buf, len, "string literal"); break;
    default:
        snprintf(buf, len, "'%.*s'", (int)utf8_cut(ps->src + t->pos, t->len, 40),
                 ps->src + t->pos);
    }
}

static void unexpected(parser *ps, const char *wanted)
{
    char what[64];
    tok_describe(ps, &ps->cur, what, sizeof(what));
    if (wanted)
        parse_error(ps, ps->cur.pos, "expected %s, found %s", wanted, what);
    else
        parse_error(ps, ps->cur.pos, "unexpected %s", what);
}

/* ------------------------------------------------------------------------ */
/* Parser                                                                    */
/* ------------------------------------------------------------------------ */

static tnode *parse_expr(parser *ps);

/* A new node of 'kind' over operands 'a' and 'b' (either may be NULL), which
 * started at source byte 'pos' and ends where the last token consumed ends.
 * Returns NULL (freeing the operands) when the tree gets too deep. */
static tnode *mknode(parser *ps, tnode_kind kind, size_t pos, tnode *a, tnode *b)
{
    int depth = 1;
    if (a && a->depth >= depth) depth = a->depth + 1;
    if (b && b->depth >= depth) depth = b->depth + 1;
    if (depth > PX_TEMPLATE_MAX_DEPTH) {
        parse_error(ps, pos, "expression nested too deeply (more than %d levels)",
                    PX_TEMPLATE_MAX_DEPTH);
        node_free(a);
        node_free(b);
        return NULL;
    }
    tnode *n = px_calloc(1, sizeof(*n));
    n->kind = kind;
    n->a = a;
    n->b = b;
    n->pos = pos;
    n->span = ps->prev_end > pos ? ps->prev_end - pos : 0;
    n->depth = depth;
    return n;
}

static bool var_lookup(const char *name, size_t len, tvar *v)
{
    static const struct {
        const char *name;
        tvar var;
    } vars[] = {
        { "event", TV_EVENT },
        { "root", TV_EVENT },
        { "fields", TV_FIELDS },
        { "stream", TV_STREAM },
        { "id", TV_ID },
    };
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        if (strlen(vars[i].name) == len && memcmp(vars[i].name, name, len) == 0) {
            *v = vars[i].var;
            return true;
        }
    }
    return false;
}

/* The text of the string literal token 'ps->cur', quotes removed and doubled
 * quotes undone, as a new NUL-terminated string; its length in '*len'. */
static char *unquote(const parser *ps, size_t *len)
{
    const char *s = ps->src + ps->cur.pos;
    char q = s[0];
    size_t n = ps->cur.len - 2, j = 0;
    char *out = px_malloc(n + 1);
    for (size_t i = 1; i <= n; i++) {
        out[j++] = s[i];
        if (s[i] == q) i++; /* the second of a doubled quote */
    }
    out[j] = '\0';
    *len = j;
    return out;
}

/* primary := '#' var | var | string | number | '(' expr ')' */
static tnode *parse_primary(parser *ps)
{
    tok t = ps->cur;
    const char *s = ps->src;
    tnode *n;

    switch (t.kind) {
    case T_VAR:
    case T_IDENT: {
        size_t name = t.kind == T_VAR ? t.name : t.pos;
        size_t len = t.pos + t.len - name;
        tvar var;
        if (!var_lookup(s + name, len, &var)) {
            if (t.kind == T_VAR)
                parse_error(ps, t.pos, "unknown variable '#%.*s' (the variables are "
                                       "#event, #fields, #stream, #id and #root)",
                            (int)len, s + name);
            else if (ps->braces)
                parse_error(ps, t.pos, "unknown name '%.*s' (the variables are event, "
                                       "fields, stream, id and root; a property of the event is "
                                       "event.%.*s)",
                            (int)len, s + name, (int)len, s + name);
            else
                parse_error(ps, t.pos, "unexpected name '%.*s' (variables start "
                                       "with '#')",
                            (int)len, s + name);
            return NULL;
        }
        if (t.kind == T_IDENT && !ps->braces) {
            parse_error(ps, t.pos, "write '#%.*s': only inside #{...} may a variable "
                                   "drop its '#'",
                        (int)len, s + name);
            return NULL;
        }
        next(ps);
        if (ps->cur.kind == T_LPAREN) {
            parse_error(ps, ps->cur.pos, "'%.*s' is a variable, not a function",
                        (int)len, s + name);
            return NULL;
        }
        n = mknode(ps, N_VAR, t.pos, NULL, NULL);
        n->var = var;
        return n;
    }
    case T_STR: {
        size_t len;
        char *str = unquote(ps, &len);
        next(ps);
        n = mknode(ps, N_TEXT, t.pos, NULL, NULL);
        n->str = str;
        n->len = len;
        return n;
    }
    case T_INT: {
        uint64_t v = 0;
        for (size_t i = t.pos; i < t.pos + t.len; i++) {
            unsigned d = (unsigned)(s[i] - '0');
            if (v > (UINT64_MAX - d) / 10 || v * 10 + d > (uint64_t)INT64_MAX) {
                parse_error(ps, t.pos, "integer literal out of range");
                return NULL;
            }
            v = v * 10 + d;
        }
        next(ps);
        n = mknode(ps, N_INT, t.pos, NULL, NULL);
        n->mag = v;
        return n;
    }
    case T_DEC:
        next(ps);
        n = mknode(ps, N_DEC, t.pos, NULL, NULL);
        n->str = px_strndup(s + t.pos, t.len);
        n->len = t.len;
        return n;
    case T_LPAREN:
        next(ps);
        n = parse_expr(ps);
        if (n == NULL) return NULL;
        if (ps->cur.kind != T_RPAREN) {
            unexpected(ps, "')'");
            node_free(n);
            return NULL;
        }
        next(ps);
        return n;
    case T_ERR:
        return NULL;
    default:
        unexpected(ps, "a variable, a string or a number");
        return NULL;
    }
}

/* The '[' expr ']' of an index, 'ps->cur' being the '['; 'target' is what is
 * indexed (consumed, also on failure). A lone bare name such as [id] is
 * refused: SpEL reads it as the key 'id', '#{...}' would read the variable. */
static tnode *parse_index(parser *ps, tnode *target, bool safe, size_t start)
{
    next(ps);
    if (ps->cur.kind == T_IDENT) {
        size_t q = ps->cur.pos + ps->cur.len;
        while (q < ps->n && is_space(ps->src[q])) q++;
        if (q < ps->n && ps->src[q] == ']') {
            int len = (int)ps->cur.len;
            const char *name = ps->src + ps->cur.pos;
            parse_error(ps, ps->cur.pos, "write ['%.*s'] for a key or [#%.*s] for "
                                         "the variable",
                        len, name, len, name);
            node_free(target);
            return NULL;
        }
    }
    tnode *idx = parse_expr(ps);
    if (idx == NULL) {
        node_free(target);
        return NULL;
    }
    if (ps->cur.kind != T_RBRACK) {
        unexpected(ps, "']'");
        node_free(target);
        node_free(idx);
        return NULL;
    }
    next(ps);
    tnode *n = mknode(ps, N_INDEX, start, target, idx);
    if (n) n->safe = safe;
    return n;
}

/* postfix := primary { '.' name ['()'] | '?.' name ['()'] | '[' expr ']' | '?.[' expr ']' } */
static tnode *parse_postfix(parser *ps)
{
    size_t start = ps->cur.pos;
    tnode *n = parse_primary(ps);

    while (n) {
        tok_kind k = ps->cur.kind;
        if (k == T_LBRACK) {
            n = parse_index(ps, n, false, start);
        } else if (k == T_DOT || k == T_SAFE) {
            bool safe = k == T_SAFE;
            next(ps);
            if (safe && ps->cur.kind == T_LBRACK) {
                n = parse_index(ps, n, true, start);
                continue;
            }
            if (ps->cur.kind != T_IDENT) {
                unexpected(ps, "a property name");
                node_free(n);
                return NULL;
            }
            tok name = ps->cur;
            next(ps);
            if (ps->cur.kind == T_LPAREN) { /* a record accessor, name() */
                next(ps);
                if (ps->cur.kind != T_RPAREN) {
                    if (ps->cur.kind == T_EOF || ps->cur.kind == T_RBRACE)
                        unexpected(ps, "')'");
                    else
                        parse_error(ps, ps->cur.pos, "'%.*s()' is a record accessor "
                                                     "and takes no arguments",
                                    (int)name.len,
                                    ps->src + name.pos);
                    node_free(n);
                    return NULL;
                }
                next(ps);
            }
            n = mknode(ps, N_PROP, start, n, NULL);
            if (n) {
                n->safe = safe;
                n->str = px_strndup(ps->src + name.pos, name.len);
                n->len = name.len;
            }
        } else {
            break;
        }
    }
    return n;
}

/* sum := postfix { '+' postfix } */
static tnode *parse_sum(parser *ps)
{
    size_t start = ps->cur.pos;
    tnode *n = parse_postfix(ps);
    while (n && ps->cur.kind == T_PLUS) {
        next(ps);
        tnode *r = parse_postfix(ps);
        if (r == NULL) {
            node_free(n);
            return NULL;
        }
        n = mknode(ps, N_PLUS, start, n, r);
    }
    return n;
}

/* expr := sum [ '?:' expr ] */
static tnode *parse_expr(parser *ps)
{
    size_t start = ps->cur.pos;
    if (++ps->depth > PX_TEMPLATE_MAX_DEPTH) {
        parse_error(ps, start, "expression nested too deeply (more than %d levels)",
                    PX_TEMPLATE_MAX_DEPTH);
        return NULL;
    }
    tnode *n = parse_sum(ps);
    if (n && ps->cur.kind == T_ELVIS) {
        next(ps);
        tnode *r = parse_expr(ps);
        if (r == NULL) {
            node_free(n);
            n = NULL;
        } else n = mknode(ps, N_ELVIS, start, n, r);
    }
    ps->depth--;
    return n;
}

/* ------------------------------------------------------------------------ */
/* Compile                                                                   */
/* ------------------------------------------------------------------------ */

static void add_part(px_template *t, tnode *n)
{
    t->parts = px_realloc(t->parts, (t->nparts + 1) * sizeof(*t->parts));
    t->parts[t->nparts++] = n;
}

static void add_text(px_template *t, const char *s, size_t len, size_t pos)
{
    tnode *n = px_calloc(1, sizeof(*n));
    n->kind = N_TEXT;
    n->str = px_strndup(s, len);
    n->len = len;
    n->pos = pos;
    n->span = len;
    n->depth = 1;
    add_part(t, n);
}

/* 1-based column of byte 'off' in 's', counting UTF-8 characters, not bytes. */
static int column_of(const char *s, size_t off)
{
    int col = 1;
    for (size_t i = 0; i < off; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) col++;
    return col;
}

/* Parse the #{...} part whose '#' is at 'open'. Returns PX_OK with the part
 * added to 't' and '*end' just past its '}', or PX_ERR. */
static int compile_part(parser *ps, px_template *t, size_t open, size_t *end)
{
    ps->p = open + 2;
    ps->cur.kind = T_EOF;
    ps->braces = true;
    next(ps);
    if (ps->cur.kind == T_RBRACE) {
        parse_error(ps, open, "empty #{}");
        return PX_ERR;
    }
    if (ps->cur.kind == T_EOF) {
        parse_error(ps, open, "'#{' is never closed with '}'");
        return PX_ERR;
    }
    tnode *n = parse_expr(ps);
    if (n == NULL) return PX_ERR;
    if (ps->cur.kind != T_RBRACE) {
        if (ps->cur.kind == T_EOF)
            parse_error(ps, open, "'#{' is never closed with '}'");
        else
            unexpected(ps, "'}'");
        node_free(n);
        return PX_ERR;
    }
    add_part(t, n);
    *end = ps->cur.pos + 1;
    return PX_OK;
}

/* The variable a '#' at byte 'p' of the literal text names, if any: "#event"
 * and the others followed by no name character. Its length (with the '#') in
 * '*len'. */
static bool literal_var(const char *s, size_t n, size_t p, size_t *len)
{
    static const char *const names[] = { "event", "root", "fields", "stream", "id" };
    if (s[p] != '#') return false;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t k = strlen(names[i]);
        if (p + 1 + k <= n && memcmp(s + p + 1, names[i], k) == 0 &&
            (p + 1 + k == n || !is_ident_char(s[p + 1 + k]))) {
            *len = 1 + k;
            return true;
        }
    }
    return false;
}

/* Where the property path that starts at byte 'p' ends: names after '.' or
 * '?.', '()' and balanced [...] (within the first 'n' bytes). */
static size_t path_end(const char *s, size_t n, size_t p)
{
    for (;;) {
        size_t q = p;
        if (q < n && s[q] == '?' && q + 1 < n && s[q + 1] == '.') q++;
        if (q < n && s[q] == '.' && q + 1 < n && is_ident_start(s[q + 1])) {
            q++;
            while (q < n && is_ident_char(s[q])) q++;
            if (q + 1 < n && s[q] == '(' && s[q + 1] == ')') q += 2;
        } else if (q < n && s[q] == '[') {
            int depth = 0;
            for (; q < n; q++) {
                if (s[q] == '[') depth++;
                if (s[q] == ']' && --depth == 0) break;
            }
            if (q >= n) return p;
            q++;
        } else {
            return p;
        }
        p = q;
    }
}

/* Longest suggestion quoted back in a message. */
#define PX_TEMPLATE_MAX_SUGGEST 120

/* "did you mean "<src with its bytes [from, to) written as #{...}>"?" into
 * 'b': the literal 'src[from..to)' (a variable, with or without its '#')
 * moved into a #{...} part, shortened at a character boundary. */
static void suggest_part(px_buf *b, const char *src, size_t from, size_t to,
                         const char *insert)
{
    px_buf s = { 0 };
    size_t skip = src[from] == '#' ? 1 : 0;
    px_buf_append(&s, src, from);
    px_buf_appends(&s, "#{");
    px_buf_appends(&s, insert);
    px_buf_append(&s, src + from + skip, to - from - skip);
    px_buf_appends(&s, "}");
    px_buf_appends(&s, src + to);
    size_t cut = utf8_cut(s.data, s.len, PX_TEMPLATE_MAX_SUGGEST);
    px_buf_printf(b, "did you mean \"%.*s%s\"?", (int)cut, s.data, cut < s.len ? "..." : "");
    px_buf_deinit(&s);
}

/* Literal text 'src[from..to)' of a template must not hold a variable such as
 * "room:#event.eventId": it would be text, the same for every event, where a
 * #{...} part was meant (issue 31). Refused with the #{...} form. */
static void check_literal(parser *ps, size_t from, size_t to)
{
    const char *s = ps->src;
    size_t len;
    for (size_t i = from; i < to; i++) {
        if (!literal_var(s, to, i, &len)) continue;
        size_t end = path_end(s, to, i + len);
        px_buf b = { 0 };
        suggest_part(&b, s, i, end, "");
        parse_error(ps, i, "%.*s%s after literal text is text, not a variable: %s",
                    (int)utf8_cut(s + i, end - i, 40), s + i, end - i > 40 ? "..." : "",
                    b.data);
        px_buf_deinit(&b);
        return;
    }
}

/* The first byte of 's' ('n' bytes) that is not part of a valid UTF-8
 * character, or 'n'. */
static size_t utf8_bad(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t w = c < 0x80 ? 1 : c >= 0xF0 ? 4
                              : c >= 0xE0   ? 3
                                            : 2;
        if (i + w > n || !px_utf8_valid(s + i, w)) return i;
        i += w;
    }
    return n;
}

/* The variables 'n' reads, as 1 << px_tvar each. */
static unsigned vars_used(const tnode *n)
{
    if (n == NULL) return 0;
    if (n->kind == N_VAR) return 1u << n->var;
    return vars_used(n->a) | vars_used(n->b);
}

px_template *px_template_compile(const char *src, char *err, size_t errlen, int *errcol)
{
    px_template *t = px_calloc(1, sizeof(*t));
    parser ps;
    memset(&ps, 0, sizeof(ps));
    t->src = px_strdup(src);
    ps.src = t->src;
    ps.n = strlen(src);
    ps.err = err;
    ps.errlen = errlen;
    ps.cur.kind = T_EOF;
    if (err && errlen) err[0] = '\0';

    size_t bad = utf8_bad(src, ps.n);
    if (bad < ps.n)
        parse_error(&ps, bad, "the template is not valid UTF-8 (byte 0x%02x)",
                    (unsigned char)src[bad]);
    else if (ps.n > 0 && src[0] == '#' && !(ps.n > 1 && src[1] == '{')) {
        /* An expression. */
        next(&ps);
        tnode *n = parse_expr(&ps);
        if (n && ps.cur.kind != T_EOF) {
            unexpected(&ps, NULL);
            node_free(n);
            n = NULL;
        }
        if (n) add_part(t, n);
    } else {
        /* A template: literal text with #{...} parts. */
        size_t i = 0, lit = 0;
        while (i < ps.n && !ps.failed) {
            if (src[i] == '#' && i + 1 < ps.n && src[i + 1] == '{') {
                check_literal(&ps, lit, i);
                if (ps.failed) break;
                if (i > lit) add_text(t, src + lit, i - lit, lit);
                if (compile_part(&ps, t, i, &i) != PX_OK) break;
                lit = i;
            } else {
                i++;
            }
        }
        if (!ps.failed) check_literal(&ps, lit, i);
        if (!ps.failed && i > lit) add_text(t, src + lit, i - lit, lit);
    }

    if (ps.failed) {
        if (errcol) *errcol = column_of(src, ps.errpos);
        px_template_destroy(t);
        return NULL;
    }
    for (size_t i = 0; i < t->nparts; i++) t->uses |= vars_used(t->parts[i]);
    /* One part that is a property of #event: #event.NAME, #root.NAME(),
     * #{event.NAME}, #event?.NAME. It renders as that member of the event
     * object, read by json-c; '?.' changes nothing as the event is never null
     * where the caller looks at this (a payload is an object or bad input). */
    if (t->nparts == 1 && t->parts[0]->kind == N_PROP && t->parts[0]->a->kind == N_VAR &&
        t->parts[0]->a->var == TV_EVENT) {
        t->member = t->parts[0]->str;
        t->member_len = t->parts[0]->len;
    }
    return t;
}

const char *px_template_source(const px_template *t)
{
    return t->src;
}

bool px_template_uses(const px_template *t, px_tvar v)
{
    return t->uses & (1u << v);
}

const char *px_template_simple_member(const px_template *t, size_t *len)
{
    if (t->member) *len = t->member_len;
    return t->member;
}

/*
 * The literal prefix (config.c's name-collision check): what every rendering
 * of a node is sure to start with. 'complete' when the node's whole text is
 * known (a literal), 'str' when its value is sure to be a string (then '+'
 * after it concatenates). Variables, properties and indexes are unknown.
 */
typedef struct lit_info {
    bool complete, str;
} lit_info;

static lit_info lit_prefix(const tnode *n, px_buf *out)
{
    lit_info r = { false, false };
    size_t len0 = out->len;
    switch (n->kind) {
    case N_TEXT:
        px_buf_append(out, n->str, n->len);
        r.complete = r.str = true;
        return r;
    case N_INT:
        px_buf_printf(out, "%" PRIu64, n->mag);
        r.complete = true;
        return r;
    case N_DEC:
        px_buf_append(out, n->str, n->len);
        r.complete = true;
        return r;
    case N_PLUS: {
        lit_info a = lit_prefix(n->a, out);
        if (!a.str) { /* a number or unknown: '+' may add */
            out->len = len0;
            out->data[len0] = '\0';
            return r;
        }
        r.str = true; /* a string on the left: a concatenation */
        if (!a.complete) return r;
        lit_info b = lit_prefix(n->b, out);
        r.complete = b.complete;
        return r;
    }
    case N_ELVIS: {
        /* the left side unless it is null or "", else the right side */
        px_buf pb = { 0 };
        lit_info a = lit_prefix(n->a, out);
        if (a.complete && (!a.str || out->len > len0)) return a; /* never null or "" */
        if (a.complete && a.str) return lit_prefix(n->b, out);
        px_buf_reserve(&pb, 0);
        lit_info b = lit_prefix(n->b, &pb);
        size_t k = 0;
        while (len0 + k < out->len && k < pb.len && out->data[len0 + k] == pb.data[k]) k++;
        out->len = len0 + k;
        out->data[out->len] = '\0';
        r.str = a.str && b.str;
        px_buf_deinit(&pb);
        return r;
    }
    default:
        return r;
    }
}

void px_template_literal_prefix(const px_template *t, px_buf *out)
{
    px_buf_reserve(out, 0);
    px_buf_reset(out);
    for (size_t i = 0; i < t->nparts; i++)
        if (!lit_prefix(t->parts[i], out).complete) break;
}

/* Whether 'n', a node that reads nothing of the entry, is never null or "":
 * then an Elvis never evaluates its right side. */
static bool never_empty(const tnode *n)
{
    px_buf b = { 0 };
    px_buf_reserve(&b, 0);
    lit_info r = lit_prefix(n, &b);
    bool sure = r.complete && (!r.str || b.len > 0);
    px_buf_deinit(&b);
    return sure;
}

/* Whether evaluating 'n' can read the entry: #event, #root, #fields or #id
 * on a path that evaluation can take. */
static bool reads_entry(const tnode *n)
{
    if (n == NULL) return false;
    switch (n->kind) {
    case N_VAR: return n->var != TV_STREAM;
    case N_ELVIS:
        if (reads_entry(n->a)) return true;
        return !never_empty(n->a) && reads_entry(n->b);
    default: return reads_entry(n->a) || reads_entry(n->b);
    }
}

bool px_template_reads_entry(const px_template *t)
{
    for (size_t i = 0; i < t->nparts; i++)
        if (reads_entry(t->parts[i])) return true;
    return false;
}

int px_template_check_key(const px_template *t, char *err, size_t errlen, int *errcol)
{
    if (px_template_reads_entry(t)) return PX_OK;
    if (errcol) *errcol = 1;
    if (err == NULL || errlen == 0) return PX_ERR;
    const char *s = t->src;
    size_t n = strlen(s), name = 0;
    while (name < n && is_ident_char(s[name])) name++;
    px_buf b = { 0 };
    px_buf_reserve(&b, 0);
    if (n > 0 && is_ident_start(s[0]) && path_end(s, n, name) == n) {
        /* event.eventId, eventId: a property path written as literal text */
        tvar v;
        bool var = name < n && var_lookup(s, name, &v);
        suggest_part(&b, s, 0, n, var ? "" : "event.");
        snprintf(err, errlen, "reads nothing from the entry: '%.*s%s' is literal text, the "
                              "same key for every event: %s",
                 (int)utf8_cut(s, n, 40), s, n > 40 ? "..." : "", b.data);
    } else {
        snprintf(err, errlen, "reads nothing from the entry (no #event, #fields or #id%s), so "
                              "every event gets the same key and all but the first count as "
                              "duplicates",
                 px_template_uses(t, TV_STREAM) ? "; #stream is the same for every entry" : "");
    }
    px_buf_deinit(&b);
    return PX_ERR;
}

void px_template_destroy(px_template *t)
{
    if (t == NULL) return;
    for (size_t i = 0; i < t->nparts; i++) node_free(t->parts[i]);
    free(t->parts);
    free(t->src);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* Render                                                                    */
/* ------------------------------------------------------------------------ */

typedef enum {
    V_NULL, /* null, or missing when 'missing' */
    V_OBJ,  /* a JSON object: 'obj' */
    V_ARR,  /* a JSON array: 'obj' */
    V_STR,  /* a string that is not in the output: 's', 'n' */
    V_INT,  /* an integer: 'neg', 'mag' */
    V_DEC,  /* a decimal: its text 's', 'n', or NULL and the double in 'obj' */
    V_BOOL, /* 'b' */
    V_OUT   /* a string already appended to the output, from 'off' to its end */
} tval_kind;

/* A value view: what an expression evaluates to, without copying anything. */
typedef struct tval {
    tval_kind kind;
    bool missing;            /* V_NULL: there was no such property */
    bool b;                  /* V_BOOL */
    bool neg;                /* V_INT: negative */
    uint64_t mag;            /* V_INT: magnitude */
    const char *s;           /* (ref) V_STR, V_DEC text */
    size_t n;                /* bytes at 's' */
    struct json_object *obj; /* (ref) V_OBJ, V_ARR, V_DEC */
    size_t off;              /* V_OUT: where it starts in the output */
} tval;

/* Where a render is going: the template for messages, the variables, the
 * output and the caller's error buffer. */
typedef struct rctx {
    const px_template *t;
    const px_tvars *vars;
    px_buf *out;
    char *err;
    size_t errlen;
} rctx;

/* Room for a 64-bit integer with its sign, or a double as "%.17g". */
#define PX_TNUM_MAX 32

static int render_error(rctx *c, const tnode *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Write "<the source of 'n'>: <message>" into the caller's error buffer and
 * return PX_ERR. */
static int render_error(rctx *c, const tnode *n, const char *fmt, ...)
{
    if (c->err == NULL || c->errlen == 0) return PX_ERR;
    size_t span = utf8_cut(c->t->src + n->pos, n->span, PX_TEMPLATE_MAX_QUOTE);
    int k = snprintf(c->err, c->errlen, "%.*s%s: ", (int)span, c->t->src + n->pos,
                     span < n->span ? "..." : "");
    if (k >= 0 && (size_t)k < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    px_utf8_cut_end(c->err); /* a cut message ends between characters */
    return PX_ERR;
}

static const char *kind_name(const tval *v)
{
    switch (v->kind) {
    case V_NULL: return v->missing ? "missing" : "null";
    case V_OBJ: return "an object";
    case V_ARR: return "an array";
    case V_INT:
    case V_DEC: return "a number";
    case V_BOOL: return "a boolean";
    default: return "a string";
    }
}

/* What to suggest when 'v' cannot be used: a fallback, if it is null. */
static const char *fallback_hint(const tval *v)
{
    return v->kind == V_NULL ? " (give a fallback with ?:)" : "";
}

static void out_truncate(px_buf *out, size_t len)
{
    out->len = len;
    out->data[len] = '\0';
}

/*
 * Make 'v' a view of the JSON value 'o' (NULL reads as null). Integers are
 * checked here: json-c silently clamps integers outside int64/uint64 to
 * INT64_MIN, INT64_MAX or UINT64_MAX, so exactly those three values are
 * refused as "integer out of range" - otherwise two different huge ids would
 * collapse into one key. (json-c 0.16 clamps only to INT64_MIN and
 * UINT64_MAX; older ones clamp positive values to INT64_MAX, and since the
 * clamp cannot be told from the real value all three are refused.)
 */
static int view_json(rctx *c, const tnode *n, struct json_object *o, tval *v)
{
    memset(v, 0, sizeof(*v));
    switch (json_object_get_type(o)) {
    case json_type_null:
        v->kind = V_NULL;
        return PX_OK;
    case json_type_object:
        v->kind = V_OBJ;
        v->obj = o;
        return PX_OK;
    case json_type_array:
        v->kind = V_ARR;
        v->obj = o;
        return PX_OK;
    case json_type_string:
        v->kind = V_STR;
        v->s = json_object_get_string(o);
        v->n = (size_t)json_object_get_string_len(o);
        return PX_OK;
    case json_type_boolean:
        v->kind = V_BOOL;
        v->b = json_object_get_boolean(o);
        return PX_OK;
    case json_type_double:
        /* A parsed double keeps the text it was written as in its userdata
         * (json_object_new_double_s); reading it there allocates nothing,
         * unlike json_object_get_string. A double built in code has none and
         * is formatted at render time. */
        v->kind = V_DEC;
        v->obj = o;
        v->s = json_object_get_userdata(o);
        v->n = v->s ? strlen(v->s) : 0;
        return PX_OK;
    case json_type_int: {
        int64_t i = json_object_get_int64(o);
        v->kind = V_INT;
        if (i == INT64_MIN)
            return render_error(c, n, "integer out of range");
        if (i == INT64_MAX) {
            uint64_t u = json_object_get_uint64(o);
            if (u == UINT64_MAX || u == (uint64_t)INT64_MAX)
                return render_error(c, n, "integer out of range");
            v->mag = u;
        } else if (i < 0) {
            v->neg = true;
            v->mag = (uint64_t) - (i + 1) + 1;
        } else {
            v->mag = (uint64_t)i;
        }
        return PX_OK;
    }
    }
    return render_error(c, n, "unsupported JSON value");
}

/* Point '*p', '*len' at the text of the scalar 'v' (V_STR, V_INT, V_DEC or
 * V_BOOL); numbers are formatted into 'scratch'. */
static void scalar_text(const tval *v, char scratch[PX_TNUM_MAX], const char **p, size_t *len)
{
    int k;
    switch (v->kind) {
    case V_INT:
        k = snprintf(scratch, PX_TNUM_MAX, "%s%" PRIu64, v->neg ? "-" : "", v->mag);
        *p = scratch;
        *len = (size_t)k;
        return;
    case V_DEC:
        if (v->s) {
            *p = v->s;
            *len = v->n;
            return;
        }
        k = snprintf(scratch, PX_TNUM_MAX, "%.17g", json_object_get_double(v->obj));
        *p = scratch;
        *len = (size_t)k;
        return;
    case V_BOOL:
        *p = v->b ? "true" : "false";
        *len = v->b ? 4 : 5;
        return;
    default:
        *p = v->s;
        *len = v->n;
        return;
    }
}

static bool is_renderable(const tval *v)
{
    return v->kind != V_NULL && v->kind != V_OBJ && v->kind != V_ARR;
}

/* Append the text of 'v' to the output, unless it is there already. */
static void append_value(rctx *c, const tval *v)
{
    char scratch[PX_TNUM_MAX];
    const char *p;
    size_t len;
    if (v->kind == V_OUT) return;
    scalar_text(v, scratch, &p, &len);
    px_buf_append(c->out, p, len);
}

/* Add integers 'l' and 'r' into 'res' (both V_INT). The sum must fit in
 * int64, or in uint64 when positive; SpEL would wrap around silently. */
static int add_ints(rctx *c, const tnode *n, const tval *l, const tval *r, tval *res)
{
    memset(res, 0, sizeof(*res));
    res->kind = V_INT;
    if (l->neg == r->neg) {
        if (l->mag > UINT64_MAX - r->mag)
            return render_error(c, n, "integer overflow");
        res->neg = l->neg;
        res->mag = l->mag + r->mag;
        if (res->neg && res->mag > (uint64_t)INT64_MAX + 1)
            return render_error(c, n, "integer overflow");
    } else if (l->mag >= r->mag) {
        res->neg = l->neg;
        res->mag = l->mag - r->mag;
    } else {
        res->neg = r->neg;
        res->mag = r->mag - l->mag;
    }
    if (res->mag == 0) res->neg = false;
    return PX_OK;
}

static int eval(rctx *c, const tnode *n, tval *v);

/* 'a' + 'b': integer addition when both are integers, else concatenation
 * when either is a string. Concatenation happens in place: the result is a
 * V_OUT range starting where the output ended when '+' began. */
static int eval_plus(rctx *c, const tnode *n, tval *v)
{
    px_buf *out = c->out;
    size_t off = out->len;
    tval l, r;

    if (eval(c, n->a, &l) != PX_OK) return PX_ERR;
    if (eval(c, n->b, &r) != PX_OK) return PX_ERR;

    const tval *bad = !is_renderable(&l) ? &l : !is_renderable(&r) ? &r
                                                                   : NULL;
    if (bad)
        return render_error(c, bad == &l ? n->a : n->b, "is %s, which '+' cannot use%s",
                            kind_name(bad), fallback_hint(bad));

    bool lnum = l.kind == V_INT || l.kind == V_DEC;
    bool rnum = r.kind == V_INT || r.kind == V_DEC;
    bool lstr = l.kind == V_STR || l.kind == V_OUT;
    bool rstr = r.kind == V_STR || r.kind == V_OUT;

    if (lnum && rnum) {
        if (l.kind == V_DEC || r.kind == V_DEC)
            return render_error(c, n, "cannot add decimal numbers (write '' + a + b "
                                      "to join them as text)");
        return add_ints(c, n, &l, &r, v);
    }
    if (!lstr && !rstr)
        return render_error(c, n, "cannot add %s and %s", kind_name(&l), kind_name(&r));

    if (l.kind != V_OUT && r.kind == V_OUT) {
        /* The right side is already in the output: slide it over to make
         * room for the left side in front of it. */
        char scratch[PX_TNUM_MAX];
        const char *p;
        size_t len;
        scalar_text(&l, scratch, &p, &len);
        px_buf_reserve(out, len);
        memmove(out->data + off + len, out->data + off, out->len - off + 1);
        memcpy(out->data + off, p, len);
        out->len += len;
    } else {
        append_value(c, &l);
        append_value(c, &r);
    }
    memset(v, 0, sizeof(*v));
    v->kind = V_OUT;
    v->off = off;
    return PX_OK;
}

/* 'a'['b'] and 'a'?.['b']: an integer indexes an array, a string an object. */
static int eval_index(rctx *c, const tnode *n, tval *v)
{
    px_buf *out = c->out;
    size_t off = out->len;
    tval target, idx;

    if (eval(c, n->a, &target) != PX_OK) return PX_ERR;
    if (target.kind == V_NULL) {
        if (n->safe) {
            memset(v, 0, sizeof(*v));
            return PX_OK;
        }
        return render_error(c, n, "cannot index %s (use ?.[ to allow it)",
                            kind_name(&target));
    }
    if (eval(c, n->b, &idx) != PX_OK) return PX_ERR;

    if (target.kind == V_ARR && idx.kind == V_INT) {
        size_t len = json_object_array_length(target.obj);
        if (idx.neg || idx.mag >= len)
            return render_error(c, n, "index %s%" PRIu64 " is out of range (the array "
                                      "has %zu elements)",
                                idx.neg ? "-" : "", idx.mag, len);
        return view_json(c, n, json_object_array_get_idx(target.obj, (size_t)idx.mag), v);
    }
    if (target.kind == V_OBJ && (idx.kind == V_STR || idx.kind == V_OUT)) {
        const char *key = idx.kind == V_OUT ? out->data + idx.off : idx.s;
        size_t keylen = idx.kind == V_OUT ? out->len - idx.off : idx.n;
        struct json_object *o = NULL;
        bool found = strlen(key) == keylen &&
                     json_object_object_get_ex(target.obj, key, &o);
        if (idx.kind == V_OUT) out_truncate(out, off);
        if (!found) {
            memset(v, 0, sizeof(*v));
            v->missing = true;
            return PX_OK;
        }
        return view_json(c, n, o, v);
    }
    if (target.kind == V_OBJ && idx.kind == V_INT) {
        /* As in SpEL, map[0] looks for the key 0, which a JSON object (all
         * string keys) never has. */
        memset(v, 0, sizeof(*v));
        v->missing = true;
        return PX_OK;
    }
    if (idx.kind == V_OUT) out_truncate(out, off);
    if (target.kind == V_ARR || target.kind == V_OBJ)
        return render_error(c, n->b, "is %s, which cannot index %s", kind_name(&idx),
                            kind_name(&target));
    return render_error(c, n, "cannot index %s", kind_name(&target));
}

/*
 * Evaluate 'n' into the view 'v'. The output buffer ends where it was unless
 * 'v' is V_OUT, whose text is then everything appended since. Returns PX_OK,
 * or PX_ERR with the message written.
 */
static int eval(rctx *c, const tnode *n, tval *v)
{
    const px_tvars *vars = c->vars;

    switch (n->kind) {
    case N_TEXT:
        memset(v, 0, sizeof(*v));
        v->kind = V_STR;
        v->s = n->str;
        v->n = n->len;
        return PX_OK;
    case N_INT:
        memset(v, 0, sizeof(*v));
        v->kind = V_INT;
        v->mag = n->mag;
        return PX_OK;
    case N_DEC:
        memset(v, 0, sizeof(*v));
        v->kind = V_DEC;
        v->s = n->str;
        v->n = n->len;
        return PX_OK;
    case N_VAR:
        switch (n->var) {
        case TV_EVENT: return view_json(c, n, vars->event, v);
        case TV_FIELDS: return view_json(c, n, vars->fields, v);
        case TV_STREAM:
        case TV_ID: {
            const char *s = n->var == TV_STREAM ? vars->stream : vars->id;
            memset(v, 0, sizeof(*v));
            if (s) {
                v->kind = V_STR;
                v->s = s;
                v->n = strlen(s);
            }
            return PX_OK;
        }
        }
        break;
    case N_PROP: {
        tval target;
        if (eval(c, n->a, &target) != PX_OK) return PX_ERR;
        if (target.kind == V_OBJ) {
            struct json_object *o;
            if (json_object_object_get_ex(target.obj, n->str, &o))
                return view_json(c, n, o, v);
            memset(v, 0, sizeof(*v));
            v->missing = true;
            return PX_OK;
        }
        if (target.kind == V_NULL) {
            if (n->safe) {
                memset(v, 0, sizeof(*v));
                return PX_OK;
            }
            return render_error(c, n, "cannot read '%s' of %s (use ?. to allow it)",
                                n->str, kind_name(&target));
        }
        if (target.kind == V_OUT) out_truncate(c->out, target.off);
        return render_error(c, n, "cannot read '%s' of %s", n->str, kind_name(&target));
    }
    case N_INDEX:
        return eval_index(c, n, v);
    case N_ELVIS: {
        size_t off = c->out->len;
        if (eval(c, n->a, v) != PX_OK) return PX_ERR;
        bool empty = v->kind == V_NULL || (v->kind == V_STR && v->n == 0) ||
                     (v->kind == V_OUT && c->out->len == v->off);
        if (!empty) return PX_OK;
        out_truncate(c->out, off);
        return eval(c, n->b, v);
    }
    case N_PLUS:
        return eval_plus(c, n, v);
    }
    return render_error(c, n, "internal error: unknown node");
}

/* --- canonical JSON (fingerprints) -------------------------------------------
 * One text per JSON value, whatever the way it was written: object members
 * sorted by their names' bytes, no spaces, numbers as written in the source
 * (json-c keeps a double's text; an integer has one form), strings with '"'
 * and '\' escaped by a backslash, the controls U+0000-U+001F and DEL as
 * \u00xx, and every other character as its UTF-8 bytes (json-c decoded any
 * \u escape of the source). */

static void put_string(px_buf *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    px_buf_append(out, "\"", 1);
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch != '"' && ch != '\\' && ch >= 0x20 && ch != 0x7f) continue;
        px_buf_append(out, s + from, i - from);
        if (ch == '"' || ch == '\\') {
            char esc[2] = { '\\', (char)ch };
            px_buf_append(out, esc, 2);
        } else {
            char esc[6] = { '\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15] };
            px_buf_append(out, esc, 6);
        }
        from = i + 1;
    }
    px_buf_append(out, s + from, n - from);
    px_buf_append(out, "\"", 1);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Append the canonical JSON of 'o' ('n': the node, for messages). */
static int put_canon(rctx *c, const tnode *n, struct json_object *o)
{
    tval v;
    char scratch[PX_TNUM_MAX];
    const char *p;
    size_t len;
    if (view_json(c, n, o, &v) != PX_OK) return PX_ERR;
    switch (v.kind) {
    case V_NULL:
        px_buf_append(c->out, "null", 4);
        return PX_OK;
    case V_STR:
        put_string(c->out, v.s, v.n);
        return PX_OK;
    case V_ARR: {
        size_t k = json_object_array_length(o);
        px_buf_append(c->out, "[", 1);
        for (size_t i = 0; i < k; i++) {
            if (i) px_buf_append(c->out, ",", 1);
            if (put_canon(c, n, json_object_array_get_idx(o, i)) != PX_OK) return PX_ERR;
        }
        px_buf_append(c->out, "]", 1);
        return PX_OK;
    }
    case V_OBJ: {
        /* The names sorted: on the stack for a small object. */
        const char *small[32], **names = small;
        size_t k = (size_t)json_object_object_length(o), i = 0;
        if (k > sizeof(small) / sizeof(small[0])) names = px_malloc(k * sizeof(*names));
        json_object_object_foreach(o, name, val)
        {
            (void)val;
            if (i < k) names[i++] = name;
        }
        qsort(names, i, sizeof(*names), cmp_names);
        int rc = PX_OK;
        px_buf_append(c->out, "{", 1);
        for (size_t j = 0; j < i && rc == PX_OK; j++) {
            if (j) px_buf_append(c->out, ",", 1);
            put_string(c->out, names[j], strlen(names[j]));
            px_buf_append(c->out, ":", 1);
            rc = put_canon(c, n, json_object_object_get(o, names[j]));
        }
        px_buf_append(c->out, "}", 1);
        if (names != small) free(names);
        return rc;
    }
    default:
        scalar_text(&v, scratch, &p, &len);
        px_buf_append(c->out, p, len);
        return PX_OK;
    }
}

static int render(const px_template *t, const px_tvars *vars, px_buf *out, char *err,
                  size_t errlen, bool structured)
{
    rctx c = { t, vars, out, err, errlen };
    px_buf_reserve(out, 0); /* so that even an empty key is a string */
    px_buf_reset(out);
    if (err && errlen) err[0] = '\0';

    for (size_t i = 0; i < t->nparts; i++) {
        const tnode *n = t->parts[i];
        tval v;
        if (n->kind == N_TEXT) {
            px_buf_append(out, n->str, n->len);
            continue;
        }
        if (eval(&c, n, &v) != PX_OK) goto fail;
        if (structured && (v.kind == V_OBJ || v.kind == V_ARR)) {
            if (put_canon(&c, n, v.obj) != PX_OK) goto fail;
            continue;
        }
        if (!is_renderable(&v)) {
            render_error(&c, n, "is %s, which cannot be part of a key%s",
                         kind_name(&v), fallback_hint(&v));
            goto fail;
        }
        append_value(&c, &v);
    }
    return PX_OK;

fail:
    px_buf_reset(out);
    return PX_ERR;
}

int px_template_render(const px_template *t, const px_tvars *vars, px_buf *out,
                       char *err, size_t errlen)
{
    return render(t, vars, out, err, errlen, false);
}

int px_template_render_value(const px_template *t, const px_tvars *vars, px_buf *out,
                             char *err, size_t errlen)
{
    return render(t, vars, out, err, errlen, true);
}
