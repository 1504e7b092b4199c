/* jinja.h — the internal interface of kiln's Jinja2 subset interpreter (chat templates).
 *
 * Design: everything a render allocates (tokens, AST, values, output) lives in one arena with a
 * byte cap, freed at once when the render ends. Errors anywhere (syntax, type, limits, arena full)
 * format a message into the context and longjmp back to jinja_run, so no partial state leaks.
 * Pieces: jinja_value.c (arena, values, str/repr/tojson), jinja_lexer.c, jinja_parser.c,
 * jinja_filters.c (filters and tests), jinja_methods.c (str/dict/list methods, globals),
 * jinja_render.c (the tree-walking interpreter). */
#ifndef KILN_TOKENIZER_JINJA_H
#define KILN_TOKENIZER_JINJA_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits ------------------------------------------------------------------------------- */
#define JINJA_MAX_ARENA  (256u << 20) /* bytes one render may allocate */
#define JINJA_MAX_OUTPUT (16u << 20)  /* bytes of rendered text */
#define JINJA_MAX_DEPTH  200          /* parser nesting and interpreter call depth */
#define JINJA_MAX_STEPS  5000000ull   /* evaluation steps (loop iterations, expressions) */
#define JINJA_MAX_RANGE  1000000      /* elements range() may produce */

typedef struct jinja_ctx jinja_ctx;
typedef struct jnode jnode;

/* ---- values ------------------------------------------------------------------------------- */
typedef enum {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_FUNC,
} jv_kind;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

typedef struct jv {
    jv_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s; /* not NUL-terminated in general */
            size_t len;
        } str;
        jlist *list;
        jdict *dict;
        jfunc *fn;
        const char *undef_name; /* what was undefined, for error messages (may be NULL) */
    } u;
} jv;

struct jlist {
    jv *items;
    size_t n, cap;
    bool tuple;
};

typedef enum { JD_PLAIN, JD_NAMESPACE, JD_LOOP } jdict_flavor;

struct jdict {
    jv *keys, *vals; /* insertion ordered, linear lookup */
    size_t n, cap;
    jdict_flavor flavor;
};

typedef struct jargs jargs;
typedef jv (*jbuiltin_fn)(jinja_ctx *c, int line, const jargs *a);

typedef enum { JF_BUILTIN, JF_MACRO } jfunc_kind;

struct jfunc {
    jfunc_kind kind;
    const char *name;
    jbuiltin_fn builtin;
    const jnode *macro;     /* JN_MACRO / JN_CALLBLOCK node */
    const jfunc *caller;    /* the {% call %} body passed to a macro (or NULL) */
    struct jframe *closure; /* scope the macro / call body was defined in */
};

/* Evaluated call arguments. */
struct jargs {
    jv *pos;
    int npos;
    const char **kw_names;
    jv *kw;
    int nkw;
};

/* ---- AST ---------------------------------------------------------------------------------- */
typedef enum {
    /* statements */
    JN_TEXT,         /* lit */
    JN_OUTPUT,       /* {{ a }} */
    JN_IF,           /* a=cond, body, else_body (elif = nested IF) */
    JN_FOR,          /* names (targets), a=iterable, b=filter or NULL, body, else_body */
    JN_SET,          /* a=target (NAME, GETATTR or TUPLE of NAMEs), b=value */
    JN_SET_BLOCK,    /* a=target NAME, body, c=filter chain (FILTER nodes over a NULL operand) */
    JN_MACRO,        /* name, params (names + defaults in args), body */
    JN_CALLBLOCK,    /* a=call expression, params, body */
    JN_FILTER_BLOCK, /* c=filter chain, body */
    JN_BREAK,
    JN_CONTINUE,
    JN_DO, /* a */
    /* expressions */
    JN_LIT,
    JN_NAME,    /* name */
    JN_GETATTR, /* a.name */
    JN_GETITEM, /* a[b] */
    JN_SLICE,   /* a[start:stop:step] -> args.items[0..2], NULL if absent */
    JN_CALL,    /* a(args) */
    JN_FILTER,  /* a | name(args); a NULL inside filter blocks */
    JN_TEST,    /* a is [not] name(args); op = negated */
    JN_BINOP,   /* a op b: '+', '-', '*', '/', 'F' (//), '%', 'P' (**), '~' */
    JN_NEG,     /* -a */
    JN_POS,     /* +a */
    JN_NOT,
    JN_AND,
    JN_OR,
    JN_COMPARE, /* a op b: 'e' ==, 'n' !=, '<', '>', 'l' <=, 'g' >=, 'i' in, 'I' not in */
    JN_COND,    /* b if a else c (c may be NULL) */
    JN_LIST,    /* args.items */
    JN_TUPLE,   /* args.items */
    JN_DICT,    /* args.items = keys, args.kw_values = values */
} jnode_type;

typedef struct jnode_list {
    jnode **items;
    int n;
} jnode_list;

struct jnode {
    jnode_type type;
    int line;
    int op;
    const char *name;
    jv lit;
    jnode *a, *b, *c;
    jnode_list args;      /* positional arguments / elements / keys */
    jnode_list kw_values; /* keyword argument values / dict values / param defaults */
    const char **kw_names;
    jnode_list body, else_body;
    const char **names; /* for-loop targets / macro parameter names */
    int nnames;
};

/* ---- lexer -------------------------------------------------------------------------------- */
typedef enum {
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_STRING,
    JT_INT,
    JT_FLOAT,
    JT_OP,
    JT_EOF,
} jtok_type;

typedef struct jtok {
    jtok_type type;
    int line;
    const char *s; /* text / name / decoded string / operator (NUL-terminated) */
    size_t len;
    int64_t i;
    double f;
} jtok;

/* Splits src into tokens with trim_blocks + lstrip_blocks semantics (comments dropped, raw blocks
 * turned into text). */
void jinja_lex(jinja_ctx *c, const char *src, size_t len, jtok **toks, int *ntoks);

/* Parses tokens into a statement list. */
jnode_list jinja_parse(jinja_ctx *c, const jtok *toks, int ntoks);

/* ---- context ------------------------------------------------------------------------------ */
typedef struct jarena_chunk jarena_chunk;

typedef struct jbuf {
    char *s;
    size_t n, cap;
} jbuf;

typedef struct jframe {
    jdict *vars;
    struct jframe *parent; /* enclosing scope (NULL at the template root) */
} jframe;

struct jinja_ctx {
    jmp_buf *fail;
    char err[1024];
    jarena_chunk *chunks;
    size_t arena_used;
    unsigned long long steps;
    int depth;
    jdict *globals;
    jframe *frame;
    jbuf *out;
    size_t out_total;
    const char *fixed_date; /* "YYYY-MM-DD" for strftime_now, or NULL for now */
};

/* Reports an error: "chat template line N: msg" (line 0 omits the line) and longjmps out. */
_Noreturn void jinja_fail(jinja_ctx *c, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void *jinja_alloc(jinja_ctx *c, size_t n); /* zeroed, never NULL (fails the render) */
void jinja_arena_free(jinja_ctx *c);
char *jinja_strndup(jinja_ctx *c, const char *s, size_t n);

/* Values. */
jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(const char *s, size_t len);    /* borrows s (must live in the arena or the AST) */
jv jv_cstr(jinja_ctx *c, const char *s); /* copies */
jv jv_strdup(jinja_ctx *c, const char *s, size_t len);
jv jv_list(jinja_ctx *c, size_t cap);
jv jv_dict(jinja_ctx *c, jdict_flavor flavor);
void jlist_push(jinja_ctx *c, jlist *l, jv v);
jv *jdict_find(const jdict *d, const char *key, size_t len);
jv *jdict_find_v(const jdict *d, jv key);
void jdict_set(jinja_ctx *c, jdict *d, jv key, jv val);
void jdict_set_s(jinja_ctx *c, jdict *d, const char *key, jv val);

/* The items a for loop or a filter walks over, as Python iterates them: a list itself, a dict's
 * keys, a string's code points, none for undefined. Anything else fails the render, naming
 * filter when it is not NULL. */
jlist *jv_iterable(jinja_ctx *c, int line, jv v, const char *filter);

bool jv_truthy(jv v);
bool jv_eq(jv a, jv b);
/* <0, 0, >0; fails the render for unorderable pairs. */
int jv_cmp(jinja_ctx *c, int line, jv a, jv b);
const char *jv_type_name(jv v);
bool jv_is_num(jv v); /* int, float or bool */
double jv_num(jv v);

/* String conversion as Python's str() (lists/dicts as repr). */
void jv_to_buf(jinja_ctx *c, jbuf *b, jv v);
jv jv_to_str(jinja_ctx *c, jv v);
void jv_repr_buf(jinja_ctx *c, jbuf *b, jv v);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) as HF's tojson. indent < 0:
 * none. item_sep/key_sep NULL: json.dumps defaults. */
void jv_tojson(jinja_ctx *c, int line, jbuf *b, jv v, int indent, const char *item_sep,
               const char *key_sep, bool sort_keys);

/* Values from parsed JSON text (NULL text -> none). Fails the render on bad JSON. */
jv jv_from_json(jinja_ctx *c, const char *json, const char *what);

void jbuf_put(jinja_ctx *c, jbuf *b, const char *s, size_t n);
void jbuf_puts(jinja_ctx *c, jbuf *b, const char *s);
void jbuf_putc(jinja_ctx *c, jbuf *b, char ch);

/* UTF-8 helpers. */
size_t jutf8_len(const char *s, size_t n); /* code points */
/* Byte offsets of every code point (n+1 entries, last = len). */
size_t *jutf8_offsets(jinja_ctx *c, const char *s, size_t len, size_t *npoints);

/* ---- filters, tests, methods, globals ----------------------------------------------------- */
jv jinja_filter(jinja_ctx *c, int line, const char *name, jv value, const jargs *a);
bool jinja_test(jinja_ctx *c, int line, const char *name, jv value, const jargs *a);
bool jinja_has_filter(const char *name);
bool jinja_has_test(const char *name);
/* obj.name(args) for str/dict/list methods; returns false if obj has no such method. */
bool jinja_method(jinja_ctx *c, int line, jv obj, const char *name, const jargs *a, jv *out);
/* String helpers (jinja_methods.c) shared with the filters. mode: 'u' upper, 'l' lower,
 * 'c' capitalize, 'T' Jinja title filter, 't' str.title(). chars none: Python whitespace.
 * count < 0: all. */
jv jinja_str_case(jinja_ctx *c, jv s, int mode);
jv jinja_str_strip(jinja_ctx *c, jv s, jv chars, bool left, bool right);
jv jinja_str_replace(jinja_ctx *c, int line, jv s, jv old, jv new_, int64_t count);
/* Installs range, namespace, dict, raise_exception, strftime_now into globals. */
void jinja_install_globals(jinja_ctx *c);

/* Argument helpers for builtins: positional index i or keyword name; missing -> def. */
jv jargs_get(const jargs *a, int i, const char *name, jv def);

/* ---- interpreter -------------------------------------------------------------------------- */
/* Calls a callable value (builtin or macro). */
jv jinja_call(jinja_ctx *c, int line, jv fn, const jargs *a);
/* Renders the template body with the current globals into c->out. */
void jinja_render_body(jinja_ctx *c, const jnode_list *body);
/* Counts one evaluation step; fails past JINJA_MAX_STEPS. */
void jinja_step(jinja_ctx *c, int line);

/* Parses and renders src with globals already set in c (c->fail must be set by the caller).
 * Returns the output (arena memory). */
const char *jinja_run(jinja_ctx *c, const char *src, size_t *out_len);

#endif
