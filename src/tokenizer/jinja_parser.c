/* jinja_parser.c — recursive-descent parser from tokens to the AST, following Jinja2's grammar
 * and operator precedence (or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary <
 * postfix . [] () < filters | and tests `is`). Statements: if/elif/else, for (else, filter `if`),
 * set (plain, attribute, tuple, block), macro, call, filter blocks, break/continue, do,
 * generation. Nesting depth is capped so hostile input cannot overflow the stack. */
#include "tokenizer/jinja.h"

#include <string.h>

typedef struct parser {
    jinja_ctx *c;
    const jtok *t;
    int n, p;
    int depth;
} parser;

static const jtok *peek(parser *P) {
    return &P->t[P->p];
}
static const jtok *peek2(parser *P) {
    return &P->t[P->p + 1 < P->n ? P->p + 1 : P->p];
}
static const jtok *next_tok(parser *P) {
    const jtok *t = &P->t[P->p];
    if (P->p + 1 < P->n) P->p++;
    return t;
}
static bool is_op(const jtok *t, const char *op) {
    return t->type == JT_OP && !strcmp(t->s, op);
}
static bool is_name(const jtok *t, const char *nm) {
    return t->type == JT_NAME && !strcmp(t->s, nm);
}

static const char *tok_desc(const jtok *t) {
    switch (t->type) {
    case JT_TEXT:
        return "template text";
    case JT_VAR_BEGIN:
        return "'{{'";
    case JT_VAR_END:
        return "'}}'";
    case JT_BLOCK_BEGIN:
        return "'{%'";
    case JT_BLOCK_END:
        return "'%}'";
    case JT_NAME:
    case JT_OP:
        return t->s;
    case JT_STRING:
        return "string literal";
    case JT_INT:
    case JT_FLOAT:
        return "number";
    case JT_EOF:
        return "end of template";
    }
    return "?";
}

static _Noreturn void unexpected(parser *P, const char *expected) {
    const jtok *t = peek(P);
    bool quote = t->type == JT_NAME || t->type == JT_OP;
    jinja_fail(P->c, t->line, "syntax error: unexpected %s%s%s%s%s", quote ? "'" : "", tok_desc(t),
               quote ? "'" : "", expected ? ", expected " : "", expected ? expected : "");
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(peek(P), op)) {
        char want[16];
        strcpy(want, "'");
        strncat(want, op, 8);
        strcat(want, "'");
        unexpected(P, want);
    }
    next_tok(P);
}

static const char *expect_name(parser *P) {
    if (peek(P)->type != JT_NAME) unexpected(P, "a name");
    return next_tok(P)->s;
}

static void expect_block_end(parser *P) {
    if (peek(P)->type != JT_BLOCK_END) unexpected(P, "'%}'");
    next_tok(P);
}

static jnode *node(parser *P, jnode_type type, int line) {
    jnode *n = jinja_alloc(P->c, sizeof *n);
    n->type = type;
    n->line = line;
    return n;
}

/* Grows arena arrays at power-of-two sizes, so no separate capacity field is needed. */
static void *grow(jinja_ctx *c, void *arr, int n, size_t elem) {
    if (n == 0 || (n & (n - 1)) == 0) {
        int cap = n ? n * 2 : 4;
        void *p = jinja_alloc(c, (size_t)cap * elem);
        if (n) memcpy(p, arr, (size_t)n * elem);
        return p;
    }
    return arr;
}

static void list_push(parser *P, jnode_list *l, jnode *x) {
    l->items = grow(P->c, l->items, l->n, sizeof *l->items);
    l->items[l->n++] = x;
}

static void enter(parser *P) {
    if (++P->depth > JINJA_MAX_DEPTH)
        jinja_fail(P->c, peek(P)->line, "template nested too deeply (limit %d)", JINJA_MAX_DEPTH);
}

/* ---- expressions -------------------------------------------------------------------------- */
static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, bool with_filter);

/* (args) after the '(' has been seen: positional and keyword arguments into n. */
static void parse_call_args(parser *P, jnode *n) {
    expect_op(P, "(");
    int nkw = 0;
    while (!is_op(peek(P), ")")) {
        if (n->args.n + nkw > 0) {
            expect_op(P, ",");
            if (is_op(peek(P), ")")) break;
        }
        if (is_op(peek(P), "*") || is_op(peek(P), "**"))
            jinja_fail(P->c, peek(P)->line, "*args and **kwargs in calls are not supported");
        if (peek(P)->type == JT_NAME && is_op(peek2(P), "=")) {
            const char *k = next_tok(P)->s;
            next_tok(P);
            n->kw_names = grow(P->c, n->kw_names, nkw, sizeof *n->kw_names);
            n->kw_names[nkw++] = k;
            list_push(P, &n->kw_values, parse_expr(P));
        } else {
            if (nkw)
                jinja_fail(P->c, peek(P)->line, "positional argument follows keyword argument");
            list_push(P, &n->args, parse_expr(P));
        }
    }
    next_tok(P);
}

static jnode *parse_primary(parser *P) {
    const jtok *t = peek(P);
    int line = t->line;
    enter(P);
    jnode *n;
    if (t->type == JT_NAME) {
        next_tok(P);
        n = node(P, JN_LIT, line);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True"))
            n->lit = jv_bool(true);
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False"))
            n->lit = jv_bool(false);
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None"))
            n->lit = jv_none();
        else {
            n->type = JN_NAME;
            n->name = t->s;
        }
    } else if (t->type == JT_STRING) {
        /* Adjacent string literals concatenate. */
        jbuf b = {0};
        while (peek(P)->type == JT_STRING) {
            const jtok *s = next_tok(P);
            jbuf_put(P->c, &b, s->s, s->len);
        }
        n = node(P, JN_LIT, line);
        n->lit = jv_str(b.s, b.n);
    } else if (t->type == JT_INT) {
        next_tok(P);
        n = node(P, JN_LIT, line);
        n->lit = jv_int(t->i);
    } else if (t->type == JT_FLOAT) {
        next_tok(P);
        n = node(P, JN_LIT, line);
        n->lit = jv_float(t->f);
    } else if (is_op(t, "(")) {
        next_tok(P);
        if (is_op(peek(P), ")")) {
            next_tok(P);
            n = node(P, JN_TUPLE, line);
        } else {
            n = parse_expr(P);
            if (is_op(peek(P), ",")) {
                jnode *tup = node(P, JN_TUPLE, line);
                list_push(P, &tup->args, n);
                while (is_op(peek(P), ",")) {
                    next_tok(P);
                    if (is_op(peek(P), ")")) break;
                    list_push(P, &tup->args, parse_expr(P));
                }
                n = tup;
            }
            expect_op(P, ")");
        }
    } else if (is_op(t, "[")) {
        next_tok(P);
        n = node(P, JN_LIST, line);
        while (!is_op(peek(P), "]")) {
            if (n->args.n) {
                expect_op(P, ",");
                if (is_op(peek(P), "]")) break;
            }
            list_push(P, &n->args, parse_expr(P));
        }
        next_tok(P);
    } else if (is_op(t, "{")) {
        next_tok(P);
        n = node(P, JN_DICT, line);
        while (!is_op(peek(P), "}")) {
            if (n->args.n) {
                expect_op(P, ",");
                if (is_op(peek(P), "}")) break;
            }
            list_push(P, &n->args, parse_expr(P));
            expect_op(P, ":");
            list_push(P, &n->kw_values, parse_expr(P));
        }
        next_tok(P);
    } else {
        unexpected(P, "an expression");
    }
    P->depth--;
    return n;
}

static jnode *parse_subscript(parser *P, jnode *obj, int line) {
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    while (true) {
        if (!is_op(peek(P), ":") && !is_op(peek(P), "]")) parts[k] = parse_expr(P);
        if (is_op(peek(P), ":") && k < 2) {
            next_tok(P);
            slice = true;
            k++;
            continue;
        }
        break;
    }
    expect_op(P, "]");
    if (!slice) {
        if (!parts[0]) unexpected(P, "a subscript");
        jnode *n = node(P, JN_GETITEM, line);
        n->a = obj;
        n->b = parts[0];
        return n;
    }
    jnode *n = node(P, JN_SLICE, line);
    n->a = obj;
    for (int i = 0; i < 3; i++) list_push(P, &n->args, parts[i]);
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    while (true) {
        const jtok *t = peek(P);
        if (is_op(t, ".")) {
            next_tok(P);
            const jtok *a = peek(P);
            if (a->type == JT_NAME) {
                next_tok(P);
                jnode *g = node(P, JN_GETATTR, t->line);
                g->a = n;
                g->name = a->s;
                n = g;
            } else if (a->type == JT_INT) {
                next_tok(P);
                jnode *g = node(P, JN_GETITEM, t->line);
                g->a = n;
                g->b = node(P, JN_LIT, t->line);
                g->b->lit = jv_int(a->i);
                n = g;
            } else
                unexpected(P, "an attribute name");
        } else if (is_op(t, "[")) {
            next_tok(P);
            n = parse_subscript(P, n, t->line);
        } else if (is_op(t, "(")) {
            jnode *call = node(P, JN_CALL, t->line);
            call->a = n;
            parse_call_args(P, call);
            n = call;
        } else
            break;
    }
    return n;
}

static jnode *parse_filter(parser *P, jnode *operand) {
    const jtok *t = peek(P);
    jnode *f = node(P, JN_FILTER, t->line);
    f->a = operand;
    f->name = expect_name(P);
    while (is_op(peek(P), ".")) { /* dotted filter names: join them */
        next_tok(P);
        const char *rest = expect_name(P);
        size_t l1 = strlen(f->name), l2 = strlen(rest);
        char *nm = jinja_alloc(P->c, l1 + l2 + 2);
        memcpy(nm, f->name, l1);
        nm[l1] = '.';
        memcpy(nm + l1 + 1, rest, l2);
        f->name = nm;
    }
    if (!jinja_has_filter(f->name)) jinja_fail(P->c, t->line, "unknown filter '%s'", f->name);
    if (is_op(peek(P), "(")) parse_call_args(P, f);
    return f;
}

static jnode *parse_filter_expr(parser *P, jnode *n) {
    while (true) {
        const jtok *t = peek(P);
        if (is_op(t, "|")) {
            next_tok(P);
            n = parse_filter(P, n);
        } else if (is_name(t, "is")) {
            next_tok(P);
            jnode *test = node(P, JN_TEST, t->line);
            test->a = n;
            if (is_name(peek(P), "not")) {
                next_tok(P);
                test->op = 1;
            }
            const jtok *nt = peek(P);
            test->name = expect_name(P);
            if (!jinja_has_test(test->name))
                jinja_fail(P->c, nt->line, "unknown test '%s'", test->name);
            const jtok *a = peek(P);
            if (is_op(a, "(")) {
                parse_call_args(P, test);
            } else if ((a->type == JT_NAME || a->type == JT_STRING || a->type == JT_INT ||
                        a->type == JT_FLOAT || is_op(a, "[") || is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") &&
                       !is_name(a, "if") && !is_name(a, "is") && !is_name(a, "in") &&
                       !is_name(a, "not")) {
                jnode *arg = parse_postfix(P, parse_primary(P));
                list_push(P, &test->args, arg);
            }
            n = test;
        } else
            break;
    }
    return n;
}

static jnode *parse_unary(parser *P, bool with_filter) {
    const jtok *t = peek(P);
    enter(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        next_tok(P);
        n = node(P, is_op(t, "-") ? JN_NEG : JN_POS, t->line);
        n->a = parse_unary(P, false);
    } else {
        n = parse_primary(P);
    }
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binop(parser *P, int op, int line, jnode *a, jnode *b) {
    jnode *n = node(P, JN_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *n = parse_unary(P, true);
    while (is_op(peek(P), "**")) {
        int line = next_tok(P)->line;
        n = binop(P, 'P', line, n, parse_unary(P, true));
    }
    return n;
}

static jnode *parse_math2(parser *P) {
    jnode *n = parse_pow(P);
    while (true) {
        const jtok *t = peek(P);
        int op = is_op(t, "*")    ? '*'
                 : is_op(t, "/")  ? '/'
                 : is_op(t, "//") ? 'F'
                 : is_op(t, "%")  ? '%'
                                  : 0;
        if (!op) break;
        next_tok(P);
        n = binop(P, op, t->line, n, parse_pow(P));
    }
    return n;
}

static jnode *parse_concat(parser *P) {
    jnode *n = parse_math2(P);
    while (is_op(peek(P), "~")) {
        int line = next_tok(P)->line;
        n = binop(P, '~', line, n, parse_math2(P));
    }
    return n;
}

static jnode *parse_math1(parser *P) {
    jnode *n = parse_concat(P);
    while (is_op(peek(P), "+") || is_op(peek(P), "-")) {
        const jtok *t = next_tok(P);
        n = binop(P, t->s[0], t->line, n, parse_concat(P));
    }
    return n;
}

static jnode *parse_compare(parser *P) {
    jnode *left = parse_math1(P);
    jnode *result = NULL;
    while (true) {
        const jtok *t = peek(P);
        int op = 0;
        if (is_op(t, "=="))
            op = 'e';
        else if (is_op(t, "!="))
            op = 'n';
        else if (is_op(t, "<"))
            op = '<';
        else if (is_op(t, ">"))
            op = '>';
        else if (is_op(t, "<="))
            op = 'l';
        else if (is_op(t, ">="))
            op = 'g';
        else if (is_name(t, "in"))
            op = 'i';
        else if (is_name(t, "not") && is_name(peek2(P), "in")) {
            next_tok(P);
            op = 'I';
        }
        if (!op) break;
        next_tok(P);
        jnode *right = parse_math1(P);
        jnode *cmp = node(P, JN_COMPARE, t->line);
        cmp->op = op;
        cmp->a = left;
        cmp->b = right;
        if (result) { /* chained: a < b < c == (a < b) and (b < c) */
            jnode *and = node(P, JN_AND, t->line);
            and->a = result;
            and->b = cmp;
            result = and;
        } else
            result = cmp;
        left = right;
    }
    return result ? result : left;
}

static jnode *parse_not(parser *P) {
    if (is_name(peek(P), "not")) {
        const jtok *t = next_tok(P);
        enter(P);
        jnode *n = node(P, JN_NOT, t->line);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *n = parse_not(P);
    while (is_name(peek(P), "and")) {
        const jtok *t = next_tok(P);
        jnode *x = node(P, JN_AND, t->line);
        x->a = n;
        x->b = parse_not(P);
        n = x;
    }
    return n;
}

static jnode *parse_or(parser *P) {
    jnode *n = parse_and(P);
    while (is_name(peek(P), "or")) {
        const jtok *t = next_tok(P);
        jnode *x = node(P, JN_OR, t->line);
        x->a = n;
        x->b = parse_and(P);
        n = x;
    }
    return n;
}

static jnode *parse_expr(parser *P) {
    enter(P);
    jnode *n = parse_or(P);
    while (is_name(peek(P), "if")) {
        const jtok *t = next_tok(P);
        jnode *c = node(P, JN_COND, t->line);
        c->b = n;
        c->a = parse_or(P);
        if (is_name(peek(P), "else")) {
            next_tok(P);
            c->c = parse_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* expr or a bare tuple `a, b` (set values, for iterables, output). */
static jnode *parse_tuple(parser *P, bool with_cond) {
    int line = peek(P)->line;
    jnode *first = with_cond ? parse_expr(P) : parse_or(P);
    if (!is_op(peek(P), ",")) return first;
    jnode *tup = node(P, JN_TUPLE, line);
    list_push(P, &tup->args, first);
    while (is_op(peek(P), ",")) {
        next_tok(P);
        const jtok *t = peek(P);
        if (t->type == JT_BLOCK_END || t->type == JT_VAR_END || is_op(t, ")") || is_op(t, "=") ||
            is_name(t, "if"))
            break;
        list_push(P, &tup->args, with_cond ? parse_expr(P) : parse_or(P));
    }
    return tup;
}

/* ---- statements --------------------------------------------------------------------------- */
static jnode_list parse_body(parser *P, const char *const *ends, const char *block, int open_line,
                             const char **which);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};

static jnode *parse_if(parser *P, int line) {
    jnode *n = node(P, JN_IF, line);
    n->a = parse_expr(P);
    expect_block_end(P);
    const char *which;
    n->body = parse_body(P, END_IF, "if", line, &which);
    if (!strcmp(which, "elif")) {
        int l2 = next_tok(P)->line;
        list_push(P, &n->else_body, parse_if(P, l2));
        return n; /* the nested if consumed endif */
    }
    next_tok(P);
    if (!strcmp(which, "else")) {
        expect_block_end(P);
        n->else_body = parse_body(P, END_ENDIF, "if", line, &which);
        next_tok(P);
    }
    expect_block_end(P);
    return n;
}

static void push_name(parser *P, jnode *n, const char *nm) {
    n->names = grow(P->c, n->names, n->nnames, sizeof *n->names);
    n->names[n->nnames++] = nm;
}

static jnode *parse_for(parser *P, int line) {
    jnode *n = node(P, JN_FOR, line);
    bool paren = is_op(peek(P), "(");
    if (paren) next_tok(P);
    push_name(P, n, expect_name(P));
    while (is_op(peek(P), ",")) {
        next_tok(P);
        push_name(P, n, expect_name(P));
    }
    if (paren) expect_op(P, ")");
    if (!is_name(peek(P), "in")) unexpected(P, "'in'");
    next_tok(P);
    n->a = parse_tuple(P, false);
    if (is_name(peek(P), "if")) {
        next_tok(P);
        n->b = parse_expr(P);
    }
    if (is_name(peek(P), "recursive"))
        jinja_fail(P->c, peek(P)->line, "recursive for loops are not supported");
    expect_block_end(P);
    const char *which;
    n->body = parse_body(P, END_FOR, "for", line, &which);
    next_tok(P);
    if (!strcmp(which, "else")) {
        expect_block_end(P);
        n->else_body = parse_body(P, END_ENDFOR, "for", line, &which);
        next_tok(P);
    }
    expect_block_end(P);
    return n;
}

/* `| f(args) | g` chains for filter blocks and block sets: FILTER nodes with a NULL innermost
 * operand. */
static jnode *parse_filter_chain(parser *P) {
    jnode *n = parse_filter(P, NULL);
    while (is_op(peek(P), "|")) {
        next_tok(P);
        n = parse_filter(P, n);
    }
    return n;
}

static jnode *parse_set(parser *P, int line) {
    jnode *n = node(P, JN_SET, line);
    const jtok *t = peek(P);
    const char *nm = expect_name(P);
    jnode *target = node(P, JN_NAME, t->line);
    target->name = nm;
    if (is_op(peek(P), ".")) {
        next_tok(P);
        jnode *g = node(P, JN_GETATTR, t->line);
        g->a = target;
        g->name = expect_name(P);
        target = g;
    } else if (is_op(peek(P), ",")) {
        jnode *tup = node(P, JN_TUPLE, t->line);
        list_push(P, &tup->args, target);
        while (is_op(peek(P), ",")) {
            next_tok(P);
            jnode *x = node(P, JN_NAME, peek(P)->line);
            x->name = expect_name(P);
            list_push(P, &tup->args, x);
        }
        target = tup;
    }
    n->a = target;
    if (is_op(peek(P), "=")) {
        next_tok(P);
        n->b = parse_tuple(P, true);
        expect_block_end(P);
        return n;
    }
    if (target->type != JN_NAME) unexpected(P, "'='");
    n->type = JN_SET_BLOCK;
    if (is_op(peek(P), "|")) {
        next_tok(P);
        n->c = parse_filter_chain(P);
    }
    expect_block_end(P);
    static const char *const END_SET[] = {"endset", NULL};
    const char *which;
    n->body = parse_body(P, END_SET, "set", line, &which);
    next_tok(P);
    expect_block_end(P);
    return n;
}

/* (a, b=default, ...) for macro and call-block signatures. */
static void parse_params(parser *P, jnode *n) {
    expect_op(P, "(");
    while (!is_op(peek(P), ")")) {
        if (n->nnames) expect_op(P, ",");
        push_name(P, n, expect_name(P));
        jnode *def = NULL;
        if (is_op(peek(P), "=")) {
            next_tok(P);
            def = parse_expr(P);
        }
        list_push(P, &n->kw_values, def);
    }
    next_tok(P);
}

static jnode *parse_macro(parser *P, int line) {
    jnode *n = node(P, JN_MACRO, line);
    n->name = expect_name(P);
    parse_params(P, n);
    expect_block_end(P);
    static const char *const END_MACRO[] = {"endmacro", NULL};
    const char *which;
    n->body = parse_body(P, END_MACRO, "macro", line, &which);
    next_tok(P);
    if (peek(P)->type == JT_NAME) next_tok(P); /* {% endmacro name %} */
    expect_block_end(P);
    return n;
}

static jnode *parse_call_block(parser *P, int line) {
    jnode *n = node(P, JN_CALLBLOCK, line);
    if (is_op(peek(P), "(")) parse_params(P, n);
    n->a = parse_expr(P);
    if (n->a->type != JN_CALL) jinja_fail(P->c, line, "call block expects a macro call");
    expect_block_end(P);
    static const char *const END_CALL[] = {"endcall", NULL};
    const char *which;
    n->body = parse_body(P, END_CALL, "call", line, &which);
    next_tok(P);
    expect_block_end(P);
    return n;
}

static jnode *parse_statement(parser *P) {
    const jtok *t = peek(P);
    int line = t->line;
    if (t->type != JT_NAME) unexpected(P, "a statement name");
    const char *kw = next_tok(P)->s;
    enter(P);
    jnode *n;
    if (!strcmp(kw, "if"))
        n = parse_if(P, line);
    else if (!strcmp(kw, "for"))
        n = parse_for(P, line);
    else if (!strcmp(kw, "set"))
        n = parse_set(P, line);
    else if (!strcmp(kw, "macro"))
        n = parse_macro(P, line);
    else if (!strcmp(kw, "call"))
        n = parse_call_block(P, line);
    else if (!strcmp(kw, "filter")) {
        n = node(P, JN_FILTER_BLOCK, line);
        n->c = parse_filter_chain(P);
        expect_block_end(P);
        static const char *const END_FILTER[] = {"endfilter", NULL};
        const char *which;
        n->body = parse_body(P, END_FILTER, "filter", line, &which);
        next_tok(P);
        expect_block_end(P);
    } else if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = node(P, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        expect_block_end(P);
    } else if (!strcmp(kw, "do")) {
        n = node(P, JN_DO, line);
        n->a = parse_tuple(P, true);
        expect_block_end(P);
    } else if (!strcmp(kw, "generation")) {
        /* transformers' AssistantTracker: renders its body unchanged. */
        expect_block_end(P);
        n = node(P, JN_IF, line);
        n->a = node(P, JN_LIT, line);
        n->a->lit = jv_bool(true);
        static const char *const END_GEN[] = {"endgeneration", NULL};
        const char *which;
        n->body = parse_body(P, END_GEN, "generation", line, &which);
        next_tok(P);
        expect_block_end(P);
    } else {
        jinja_fail(P->c, line, "unknown tag '%s'", kw);
    }
    P->depth--;
    return n;
}

static bool in_list(const char *s, const char *const *list) {
    for (int i = 0; list && list[i]; i++)
        if (!strcmp(s, list[i])) return true;
    return false;
}

/* Parses statements until a block tag whose keyword is in ends (left as the current token, just
 * after its '{%'). ends NULL: until the end of the template. */
static jnode_list parse_body(parser *P, const char *const *ends, const char *block, int open_line,
                             const char **which) {
    jnode_list body = {0};
    while (true) {
        const jtok *t = peek(P);
        if (t->type == JT_EOF) {
            if (ends) {
                int k = 0;
                while (ends[k + 1]) k++; /* the closing keyword is listed last */
                jinja_fail(P->c, t->line,
                           "unexpected end of template: '%s' block opened on line %d is not closed "
                           "(expected '%s')",
                           block, open_line, ends[k]);
            }
            return body;
        }
        if (t->type == JT_TEXT) {
            next_tok(P);
            jnode *n = node(P, JN_TEXT, t->line);
            n->lit = jv_str(t->s, t->len);
            list_push(P, &body, n);
        } else if (t->type == JT_VAR_BEGIN) {
            next_tok(P);
            jnode *n = node(P, JN_OUTPUT, t->line);
            n->a = parse_tuple(P, true);
            if (peek(P)->type != JT_VAR_END) unexpected(P, "'}}'");
            next_tok(P);
            list_push(P, &body, n);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next_tok(P);
            const jtok *kw = peek(P);
            if (kw->type == JT_NAME && in_list(kw->s, ends)) {
                *which = kw->s;
                return body;
            }
            if (kw->type == JT_NAME &&
                (!strncmp(kw->s, "end", 3) || !strcmp(kw->s, "else") || !strcmp(kw->s, "elif")))
                jinja_fail(P->c, kw->line, "unexpected '%s'%s%s%s", kw->s, block ? " inside '" : "",
                           block ? block : "", block ? "' block" : "");
            list_push(P, &body, parse_statement(P));
        } else {
            unexpected(P, NULL);
        }
    }
}

jnode_list jinja_parse(jinja_ctx *c, const jtok *toks, int ntoks) {
    parser P = {.c = c, .t = toks, .n = ntoks};
    const char *which = NULL;
    return parse_body(&P, NULL, NULL, 0, &which);
}
