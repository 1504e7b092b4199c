/* jinja_render.c — the tree-walking interpreter: expression evaluation (Python operator semantics,
 * Jinja undefined rules), statements (if, for with the `loop` object, set, macros and call blocks,
 * filter blocks, break/continue) and scopes (for bodies and macros get their own frame; set writes
 * the innermost one, namespace() objects carry state out). Also the jinja_run entry point. */
#include "tokenizer/jinja.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static jv eval(jinja_ctx *c, const jnode *n);
static int exec_body(jinja_ctx *c, const jnode_list *body);

void jinja_step(jinja_ctx *c, int line) {
    if (++c->steps > JINJA_MAX_STEPS)
        jinja_fail(c, line, "template takes too long (more than %llu steps)", JINJA_MAX_STEPS);
}

static void enter(jinja_ctx *c, int line) {
    if (++c->depth > JINJA_MAX_DEPTH)
        jinja_fail(c, line, "recursion too deep (limit %d)", JINJA_MAX_DEPTH);
}

static _Noreturn void fail_undefined(jinja_ctx *c, int line, jv v) {
    if (v.u.undef_name) jinja_fail(c, line, "'%s' is undefined", v.u.undef_name);
    jinja_fail(c, line, "value is undefined");
}

/* ---- scopes ------------------------------------------------------------------------------- */
static jv lookup(jinja_ctx *c, const char *name) {
    size_t len = strlen(name);
    for (jframe *f = c->frame; f; f = f->parent) {
        jv *v = jdict_find(f->vars, name, len);
        if (v) return *v;
    }
    jv *g = jdict_find(c->globals, name, len);
    if (g) return *g;
    return jv_undef(name);
}

static void assign(jinja_ctx *c, const char *name, jv v) {
    jdict_set(c, c->frame->vars, jv_str(name, strlen(name)), v);
}

static jframe *push_frame(jinja_ctx *c, jframe *parent) {
    jframe *f = jinja_alloc(c, sizeof *f);
    f->vars = jv_dict(c, JD_PLAIN).u.dict;
    f->parent = parent;
    return f;
}

/* ---- access ------------------------------------------------------------------------------- */
static jv get_item(jinja_ctx *c, int line, jv obj, jv key, const char *what) {
    switch (obj.kind) {
    case JV_UNDEF:
        fail_undefined(c, line, obj);
    case JV_DICT: {
        jv *v = jdict_find_v(obj.u.dict, key);
        return v ? *v : jv_undef(what);
    }
    case JV_LIST:
        if (key.kind == JV_INT || key.kind == JV_BOOL) {
            int64_t i = key.kind == JV_BOOL ? key.u.b : key.u.i;
            int64_t n = (int64_t)obj.u.list->n;
            if (i < 0) i += n;
            if (i < 0 || i >= n) return jv_undef(what);
            return obj.u.list->items[i];
        }
        return jv_undef(what);
    case JV_STR:
        if (key.kind == JV_INT) {
            size_t np;
            size_t *off = jutf8_offsets(c, obj.u.str.s, obj.u.str.len, &np);
            int64_t i = key.u.i;
            if (i < 0) i += (int64_t)np;
            if (i < 0 || i >= (int64_t)np) return jv_undef(what);
            return jv_str(obj.u.str.s + off[i], off[i + 1] - off[i]);
        }
        return jv_undef(what);
    default:
        return jv_undef(what);
    }
}

static jv get_attr(jinja_ctx *c, int line, jv obj, const char *name) {
    if (obj.kind == JV_UNDEF) fail_undefined(c, line, obj);
    if (obj.kind == JV_DICT) {
        jv *v = jdict_find(obj.u.dict, name, strlen(name));
        return v ? *v : jv_undef(name);
    }
    return jv_undef(name);
}

/* Python slice index normalization. */
static int64_t slice_bound(jv v, int64_t n, int64_t step, bool is_start, jinja_ctx *c, int line) {
    if (v.kind == JV_NONE || v.kind == JV_UNDEF) {
        if (step > 0) return is_start ? 0 : n;
        return is_start ? n - 1 : -1;
    }
    if (v.kind != JV_INT) jinja_fail(c, line, "slice indices must be integers or None");
    int64_t i = v.u.i;
    if (i < 0) {
        i += n;
        if (i < 0) i = step > 0 ? 0 : -1;
    } else if (i >= n)
        i = step > 0 ? n : n - 1;
    return i;
}

static jv do_slice(jinja_ctx *c, int line, jv obj, jv start, jv stop, jv stepv) {
    int64_t step = 1;
    if (stepv.kind == JV_INT)
        step = stepv.u.i;
    else if (stepv.kind != JV_NONE && stepv.kind != JV_UNDEF)
        jinja_fail(c, line, "slice indices must be integers or None");
    if (step == 0) jinja_fail(c, line, "slice step cannot be zero");
    if (obj.kind == JV_UNDEF) fail_undefined(c, line, obj);
    if (obj.kind == JV_LIST) {
        int64_t n = (int64_t)obj.u.list->n;
        int64_t a = slice_bound(start, n, step, true, c, line);
        int64_t b = slice_bound(stop, n, step, false, c, line);
        jv out = jv_list(c, 0);
        out.u.list->tuple = obj.u.list->tuple;
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            jlist_push(c, out.u.list, obj.u.list->items[i]);
        return out;
    }
    if (obj.kind == JV_STR) {
        size_t np;
        size_t *off = jutf8_offsets(c, obj.u.str.s, obj.u.str.len, &np);
        int64_t n = (int64_t)np;
        int64_t a = slice_bound(start, n, step, true, c, line);
        int64_t b = slice_bound(stop, n, step, false, c, line);
        jbuf out = {0};
        for (int64_t i = a; step > 0 ? i < b : i > b; i += step)
            jbuf_put(c, &out, obj.u.str.s + off[i], off[i + 1] - off[i]);
        return jv_str(out.s ? out.s : "", out.n);
    }
    jinja_fail(c, line, "'%s' object is not subscriptable", jv_type_name(obj));
}

/* ---- operators ---------------------------------------------------------------------------- */
static int64_t as_int(jv v) {
    return v.kind == JV_BOOL ? v.u.b : v.u.i;
}

static _Noreturn void bad_operands(jinja_ctx *c, int line, const char *op, jv a, jv b) {
    if (a.kind == JV_UNDEF) fail_undefined(c, line, a);
    if (b.kind == JV_UNDEF) fail_undefined(c, line, b);
    jinja_fail(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a),
               jv_type_name(b));
}

static jv repeat(jinja_ctx *c, int line, jv seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.kind == JV_STR) {
        if (seq.u.str.len && (uint64_t)k > JINJA_MAX_OUTPUT / seq.u.str.len)
            jinja_fail(c, line, "string repetition too large");
        size_t total = seq.u.str.len * (size_t)k;
        char *p = jinja_alloc(c, total + 1);
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * seq.u.str.len, seq.u.str.s, seq.u.str.len);
        return jv_str(p, total);
    }
    if (seq.u.list->n && (uint64_t)k > JINJA_MAX_RANGE / seq.u.list->n)
        jinja_fail(c, line, "list repetition too large");
    jv out = jv_list(c, 0);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.list->n; j++) jlist_push(c, out.u.list, seq.u.list->items[j]);
    return out;
}

static jv arith(jinja_ctx *c, int line, int op, jv a, jv b) {
    static const char *const names[] = {['+'] = "+",  ['-'] = "-", ['*'] = "*", ['/'] = "/",
                                        ['F'] = "//", ['%'] = "%", ['P'] = "**"};
    const char *opname = names[op];
    if (op == '+' && a.kind == JV_STR && b.kind == JV_STR) {
        jbuf s = {0};
        jbuf_put(c, &s, a.u.str.s, a.u.str.len);
        jbuf_put(c, &s, b.u.str.s, b.u.str.len);
        return jv_str(s.s ? s.s : "", s.n);
    }
    if (op == '+' && a.kind == JV_LIST && b.kind == JV_LIST) {
        jv out = jv_list(c, a.u.list->n + b.u.list->n);
        for (size_t i = 0; i < a.u.list->n; i++) jlist_push(c, out.u.list, a.u.list->items[i]);
        for (size_t i = 0; i < b.u.list->n; i++) jlist_push(c, out.u.list, b.u.list->items[i]);
        return out;
    }
    if (op == '*' && (a.kind == JV_STR || a.kind == JV_LIST) &&
        (b.kind == JV_INT || b.kind == JV_BOOL))
        return repeat(c, line, a, as_int(b));
    if (op == '*' && (b.kind == JV_STR || b.kind == JV_LIST) &&
        (a.kind == JV_INT || a.kind == JV_BOOL))
        return repeat(c, line, b, as_int(a));
    if (!jv_is_num(a) || !jv_is_num(b)) bad_operands(c, line, opname, a, b);
    bool ints = a.kind != JV_FLOAT && b.kind != JV_FLOAT;
    if (ints) {
        int64_t x = as_int(a), y = as_int(b), r;
        switch (op) {
        case '+':
            if (__builtin_add_overflow(x, y, &r)) jinja_fail(c, line, "integer overflow");
            return jv_int(r);
        case '-':
            if (__builtin_sub_overflow(x, y, &r)) jinja_fail(c, line, "integer overflow");
            return jv_int(r);
        case '*':
            if (__builtin_mul_overflow(x, y, &r)) jinja_fail(c, line, "integer overflow");
            return jv_int(r);
        case '/':
            if (y == 0) jinja_fail(c, line, "division by zero");
            return jv_float((double)x / (double)y);
        case 'F':
        case '%': {
            if (y == 0) jinja_fail(c, line, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) jinja_fail(c, line, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q -= 1;
                m += y;
            }
            return jv_int(op == 'F' ? q : m);
        }
        case 'P':
            if (y >= 0) { /* exponentiation by squaring, overflow-checked */
                int64_t acc = 1, base = x;
                for (int64_t e = y; e > 0; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(acc, base, &acc))
                        jinja_fail(c, line, "integer overflow");
                    if (e > 1 && __builtin_mul_overflow(base, base, &base))
                        jinja_fail(c, line, "integer overflow");
                }
                return jv_int(acc);
            }
            return jv_float(pow((double)x, (double)y));
        }
    }
    double x = jv_num(a), y = jv_num(b);
    switch (op) {
    case '+':
        return jv_float(x + y);
    case '-':
        return jv_float(x - y);
    case '*':
        return jv_float(x * y);
    case '/':
        if (y == 0) jinja_fail(c, line, "float division by zero");
        return jv_float(x / y);
    case 'F':
        if (y == 0) jinja_fail(c, line, "float floor division by zero");
        return jv_float(floor(x / y));
    case '%': {
        if (y == 0) jinja_fail(c, line, "float modulo");
        double m = fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return jv_float(m);
    }
    case 'P':
        return jv_float(pow(x, y));
    }
    jinja_fail(c, line, "bad operator");
}

static bool contains(jinja_ctx *c, int line, jv item, jv container) {
    switch (container.kind) {
    case JV_STR:
        if (item.kind != JV_STR)
            jinja_fail(c, line, "'in <string>' requires string as left operand, not %s",
                       jv_type_name(item));
        if (item.u.str.len == 0) return true;
        return memmem(container.u.str.s, container.u.str.len, item.u.str.s, item.u.str.len) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < container.u.list->n; i++)
            if (jv_eq(item, container.u.list->items[i])) return true;
        return false;
    case JV_DICT:
        return jdict_find_v(container.u.dict, item) != NULL;
    case JV_UNDEF:
        return false;
    default:
        jinja_fail(c, line, "argument of type '%s' is not iterable", jv_type_name(container));
    }
}

static bool compare(jinja_ctx *c, int line, int op, jv a, jv b) {
    switch (op) {
    case 'e':
        return jv_eq(a, b);
    case 'n':
        return !jv_eq(a, b);
    case 'i':
        return contains(c, line, a, b);
    case 'I':
        return !contains(c, line, a, b);
    }
    int r = jv_cmp(c, line, a, b);
    switch (op) {
    case '<':
        return r < 0;
    case '>':
        return r > 0;
    case 'l':
        return r <= 0;
    case 'g':
        return r >= 0;
    }
    return false;
}

/* ---- calls -------------------------------------------------------------------------------- */
static jargs eval_args(jinja_ctx *c, const jnode *n) {
    jargs a = {0};
    a.npos = n->args.n;
    a.nkw = n->kw_values.n;
    if (a.npos) a.pos = jinja_alloc(c, (size_t)a.npos * sizeof(jv));
    if (a.nkw) a.kw = jinja_alloc(c, (size_t)a.nkw * sizeof(jv));
    for (int i = 0; i < a.npos; i++) a.pos[i] = eval(c, n->args.items[i]);
    for (int i = 0; i < a.nkw; i++) a.kw[i] = eval(c, n->kw_values.items[i]);
    a.kw_names = n->kw_names;
    return a;
}

static jv call_macro(jinja_ctx *c, int line, const jfunc *fn, const jargs *a) {
    const jnode *m = fn->macro;
    enter(c, line);
    jframe *saved = c->frame;
    jframe *f = push_frame(c, fn->closure);
    c->frame = f;
    jv varargs = jv_list(c, 0);
    jv kwargs = jv_dict(c, JD_PLAIN);
    for (int i = 0; i < a->npos; i++) {
        if (i < m->nnames)
            assign(c, m->names[i], a->pos[i]);
        else
            jlist_push(c, varargs.u.list, a->pos[i]);
    }
    for (int i = 0; i < a->nkw; i++) {
        int k = -1;
        for (int j = 0; j < m->nnames; j++)
            if (!strcmp(m->names[j], a->kw_names[i])) k = j;
        if (k >= 0 && k < a->npos)
            jinja_fail(c, line, "macro '%s' got multiple values for argument '%s'", fn->name,
                       a->kw_names[i]);
        if (k >= 0)
            assign(c, m->names[k], a->kw[i]);
        else
            jdict_set_s(c, kwargs.u.dict, a->kw_names[i], a->kw[i]);
    }
    for (int j = a->npos; j < m->nnames; j++) {
        if (jdict_find(f->vars, m->names[j], strlen(m->names[j]))) continue;
        const jnode *def = j < m->kw_values.n ? m->kw_values.items[j] : NULL;
        assign(c, m->names[j], def ? eval(c, def) : jv_undef(m->names[j]));
    }
    assign(c, "varargs", varargs);
    assign(c, "kwargs", kwargs);
    if (fn->caller) assign(c, "caller", (jv){.kind = JV_FUNC, .u.fn = (jfunc *)fn->caller});
    jbuf *saved_out = c->out;
    jbuf out = {0};
    c->out = &out;
    exec_body(c, &m->body);
    c->out = saved_out;
    c->frame = saved;
    c->depth--;
    return jv_str(out.s ? out.s : "", out.n);
}

jv jinja_call(jinja_ctx *c, int line, jv fn, const jargs *a) {
    if (fn.kind == JV_UNDEF) fail_undefined(c, line, fn);
    if (fn.kind != JV_FUNC) jinja_fail(c, line, "'%s' object is not callable", jv_type_name(fn));
    if (fn.u.fn->kind == JF_BUILTIN) return fn.u.fn->builtin(c, line, a);
    return call_macro(c, line, fn.u.fn, a);
}

static jv eval_call(jinja_ctx *c, const jnode *n) {
    const jnode *callee = n->a;
    if (callee->type == JN_GETATTR) {
        jv obj = eval(c, callee->a);
        if (obj.kind == JV_UNDEF) fail_undefined(c, n->line, obj);
        jv *member =
            obj.kind == JV_DICT ? jdict_find(obj.u.dict, callee->name, strlen(callee->name)) : NULL;
        jargs a = eval_args(c, n);
        if (member && member->kind == JV_FUNC) return jinja_call(c, n->line, *member, &a);
        jv out;
        if (jinja_method(c, n->line, obj, callee->name, &a, &out)) return out;
        if (member) return jinja_call(c, n->line, *member, &a);
        jinja_fail(c, n->line, "'%s' object has no attribute '%s'", jv_type_name(obj),
                   callee->name);
    }
    jv fn = eval(c, callee);
    jargs a = eval_args(c, n);
    return jinja_call(c, n->line, fn, &a);
}

/* Applies a chain of FILTER nodes whose innermost operand is NULL to input. */
static jv apply_chain(jinja_ctx *c, const jnode *f, jv input) {
    if (f->a) input = apply_chain(c, f->a, input);
    jargs a = eval_args(c, f);
    return jinja_filter(c, f->line, f->name, input, &a);
}

/* ---- expressions -------------------------------------------------------------------------- */
static jv eval(jinja_ctx *c, const jnode *n) {
    jinja_step(c, n->line);
    enter(c, n->line);
    jv r;
    switch (n->type) {
    case JN_LIT:
        r = n->lit;
        break;
    case JN_NAME:
        r = lookup(c, n->name);
        break;
    case JN_GETATTR:
        r = get_attr(c, n->line, eval(c, n->a), n->name);
        break;
    case JN_GETITEM: {
        jv obj = eval(c, n->a);
        jv key = eval(c, n->b);
        r = get_item(c, n->line, obj, key,
                     key.kind == JV_STR ? jinja_strndup(c, key.u.str.s, key.u.str.len) : "item");
        break;
    }
    case JN_SLICE: {
        jv obj = eval(c, n->a);
        jv parts[3];
        for (int i = 0; i < 3; i++)
            parts[i] = n->args.items[i] ? eval(c, n->args.items[i]) : jv_none();
        r = do_slice(c, n->line, obj, parts[0], parts[1], parts[2]);
        break;
    }
    case JN_CALL:
        r = eval_call(c, n);
        break;
    case JN_FILTER: {
        jv v = n->a ? eval(c, n->a) : jv_undef(NULL);
        jargs a = eval_args(c, n);
        r = jinja_filter(c, n->line, n->name, v, &a);
        break;
    }
    case JN_TEST: {
        jv v = eval(c, n->a);
        jargs a = eval_args(c, n);
        bool t = jinja_test(c, n->line, n->name, v, &a);
        r = jv_bool(n->op ? !t : t);
        break;
    }
    case JN_BINOP: {
        jv a = eval(c, n->a), b = eval(c, n->b);
        if (n->op == '~') {
            jbuf s = {0};
            jv_to_buf(c, &s, a);
            jv_to_buf(c, &s, b);
            r = jv_str(s.s ? s.s : "", s.n);
        } else
            r = arith(c, n->line, n->op, a, b);
        break;
    }
    case JN_NEG:
    case JN_POS: {
        jv a = eval(c, n->a);
        if (!jv_is_num(a)) {
            if (a.kind == JV_UNDEF) fail_undefined(c, n->line, a);
            jinja_fail(c, n->line, "bad operand type for unary %c: '%s'",
                       n->type == JN_NEG ? '-' : '+', jv_type_name(a));
        }
        if (n->type == JN_POS)
            r = a.kind == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.kind == JV_FLOAT)
            r = jv_float(-a.u.f);
        else {
            int64_t x = as_int(a);
            if (x == INT64_MIN) jinja_fail(c, n->line, "integer overflow");
            r = jv_int(-x);
        }
        break;
    }
    case JN_NOT:
        r = jv_bool(!jv_truthy(eval(c, n->a)));
        break;
    case JN_AND: {
        jv a = eval(c, n->a);
        r = jv_truthy(a) ? eval(c, n->b) : a;
        break;
    }
    case JN_OR: {
        jv a = eval(c, n->a);
        r = jv_truthy(a) ? a : eval(c, n->b);
        break;
    }
    case JN_COMPARE: {
        jv a = eval(c, n->a), b = eval(c, n->b);
        r = jv_bool(compare(c, n->line, n->op, a, b));
        break;
    }
    case JN_COND:
        if (jv_truthy(eval(c, n->a)))
            r = eval(c, n->b);
        else
            r = n->c ? eval(c, n->c) : jv_undef(NULL);
        break;
    case JN_LIST:
    case JN_TUPLE:
        r = jv_list(c, (size_t)n->args.n);
        r.u.list->tuple = n->type == JN_TUPLE;
        for (int i = 0; i < n->args.n; i++) jlist_push(c, r.u.list, eval(c, n->args.items[i]));
        break;
    case JN_DICT:
        r = jv_dict(c, JD_PLAIN);
        for (int i = 0; i < n->args.n; i++) {
            jv k = eval(c, n->args.items[i]);
            if (k.kind == JV_LIST && !k.u.list->tuple)
                jinja_fail(c, n->line, "unhashable type: 'list'");
            if (k.kind == JV_DICT) jinja_fail(c, n->line, "unhashable type: 'dict'");
            jdict_set(c, r.u.dict, k, eval(c, n->kw_values.items[i]));
        }
        break;
    default:
        jinja_fail(c, n->line, "internal error: statement used as expression");
    }
    c->depth--;
    return r;
}

/* ---- statements --------------------------------------------------------------------------- */
static void emit_value(jinja_ctx *c, jv v) {
    size_t before = c->out->n;
    jv_to_buf(c, c->out, v);
    (void)before;
}

static void bind_targets(jinja_ctx *c, int line, const char **names, int nnames, jv item) {
    if (nnames == 1) {
        assign(c, names[0], item);
        return;
    }
    jlist *parts;
    if (item.kind == JV_LIST)
        parts = item.u.list;
    else if (item.kind == JV_STR || item.kind == JV_DICT)
        parts = jv_iterable(c, line, item, NULL);
    else
        jinja_fail(c, line, "cannot unpack non-iterable %s object", jv_type_name(item));
    if ((int)parts->n != nnames)
        jinja_fail(c, line, "cannot unpack %zu values into %d names", parts->n, nnames);
    for (int i = 0; i < nnames; i++) assign(c, names[i], parts->items[i]);
}

static jv loop_cycle(jinja_ctx *c, int line, const jargs *a);

static int exec_for(jinja_ctx *c, const jnode *n) {
    jv seq = eval(c, n->a);
    jlist *items = jv_iterable(c, n->line, seq, NULL);
    jframe *saved = c->frame;
    c->frame = push_frame(c, saved);
    jv outer_loop = lookup(c, "loop");
    if (n->b) { /* the loop filter sees the target, not `loop` */
        jlist *kept = jv_list(c, items->n).u.list;
        for (size_t i = 0; i < items->n; i++) {
            bind_targets(c, n->line, n->names, n->nnames, items->items[i]);
            if (jv_truthy(eval(c, n->b))) kept->items[kept->n++] = items->items[i];
        }
        items = kept;
    }
    int64_t len = (int64_t)items->n;
    /* One loop object per loop; its values are updated in place by slot each iteration. */
    static const char *const KEYS[] = {"index",    "index0", "revindex", "revindex0",
                                       "first",    "last",   "length",   "previtem",
                                       "nextitem", "depth",  "depth0",   "cycle"};
    enum {
        K_INDEX,
        K_INDEX0,
        K_REVINDEX,
        K_REVINDEX0,
        K_FIRST,
        K_LAST,
        K_LENGTH,
        K_PREV,
        K_NEXT,
        K_DEPTH,
        K_DEPTH0,
        K_CYCLE,
        K_COUNT
    };
    static jfunc cycle_fn = {.kind = JF_BUILTIN, .name = "cycle", .builtin = loop_cycle};
    jv loop = jv_dict(c, JD_LOOP);
    jdict *d = loop.u.dict;
    for (int k = 0; k < K_COUNT; k++) jdict_set_s(c, d, KEYS[k], jv_none());
    int64_t depth = 1;
    if (outer_loop.kind == JV_DICT) {
        jv *od = jdict_find(outer_loop.u.dict, "depth", 5);
        if (od && od->kind == JV_INT) depth = od->u.i + 1;
    }
    d->vals[K_DEPTH] = jv_int(depth);
    d->vals[K_DEPTH0] = jv_int(depth - 1);
    d->vals[K_LENGTH] = jv_int(len);
    d->vals[K_CYCLE] = (jv){.kind = JV_FUNC, .u.fn = &cycle_fn};
    assign(c, "loop", loop);
    for (int64_t i = 0; i < len; i++) {
        jinja_step(c, n->line);
        if (d->n != K_COUNT) jinja_fail(c, n->line, "the loop object cannot be modified");
        d->vals[K_INDEX] = jv_int(i + 1);
        d->vals[K_INDEX0] = jv_int(i);
        d->vals[K_REVINDEX] = jv_int(len - i);
        d->vals[K_REVINDEX0] = jv_int(len - i - 1);
        d->vals[K_FIRST] = jv_bool(i == 0);
        d->vals[K_LAST] = jv_bool(i == len - 1);
        d->vals[K_PREV] = i > 0 ? items->items[i - 1] : jv_undef("previtem");
        d->vals[K_NEXT] = i + 1 < len ? items->items[i + 1] : jv_undef("nextitem");
        bind_targets(c, n->line, n->names, n->nnames, items->items[i]);
        int flow = exec_body(c, &n->body);
        if (flow == FLOW_BREAK) break;
    }
    if (len == 0 && n->else_body.n) {
        c->frame = saved;
        return exec_body(c, &n->else_body);
    }
    c->frame = saved;
    return FLOW_NEXT;
}

/* loop.cycle(a, b, ...): the argument at loop.index0 modulo the count. */
static jv loop_cycle(jinja_ctx *c, int line, const jargs *a) {
    if (a->npos == 0) jinja_fail(c, line, "no items for cycling given");
    jv loop = lookup(c, "loop");
    jv *i0 = loop.kind == JV_DICT ? jdict_find(loop.u.dict, "index0", 6) : NULL;
    int64_t i = i0 && i0->kind == JV_INT ? i0->u.i : 0;
    return a->pos[i % a->npos];
}

static void exec_set(jinja_ctx *c, const jnode *n, jv v) {
    const jnode *t = n->a;
    if (t->type == JN_NAME) {
        assign(c, t->name, v);
    } else if (t->type == JN_GETATTR) {
        jv ns = lookup(c, t->a->name);
        if (ns.kind != JV_DICT || ns.u.dict->flavor != JD_NAMESPACE)
            jinja_fail(c, n->line, "cannot assign attribute on non-namespace object '%s'",
                       t->a->name);
        jdict_set(c, ns.u.dict, jv_str(t->name, strlen(t->name)), v);
    } else {
        const char **names = jinja_alloc(c, (size_t)t->args.n * sizeof *names);
        for (int i = 0; i < t->args.n; i++) names[i] = t->args.items[i]->name;
        bind_targets(c, n->line, names, t->args.n, v);
    }
}

static jv capture(jinja_ctx *c, const jnode_list *body) {
    jbuf *saved = c->out;
    jbuf out = {0};
    c->out = &out;
    exec_body(c, body);
    c->out = saved;
    return jv_str(out.s ? out.s : "", out.n);
}

static int exec_stmt(jinja_ctx *c, const jnode *n) {
    jinja_step(c, n->line);
    switch (n->type) {
    case JN_TEXT:
        jbuf_put(c, c->out, n->lit.u.str.s, n->lit.u.str.len);
        break;
    case JN_OUTPUT:
        emit_value(c, eval(c, n->a));
        break;
    case JN_IF:
        return exec_body(c, jv_truthy(eval(c, n->a)) ? &n->body : &n->else_body);
    case JN_FOR: {
        enter(c, n->line);
        int flow = exec_for(c, n);
        c->depth--;
        return flow == FLOW_NEXT ? FLOW_NEXT : flow;
    }
    case JN_SET:
        exec_set(c, n, eval(c, n->b));
        break;
    case JN_SET_BLOCK: {
        jv v = capture(c, &n->body);
        if (n->c) v = apply_chain(c, n->c, v);
        exec_set(c, n, v);
        break;
    }
    case JN_MACRO: {
        jfunc *fn = jinja_alloc(c, sizeof *fn);
        fn->kind = JF_MACRO;
        fn->name = n->name;
        fn->macro = n;
        fn->closure = c->frame;
        assign(c, n->name, (jv){.kind = JV_FUNC, .u.fn = fn});
        break;
    }
    case JN_CALLBLOCK: {
        jfunc *caller = jinja_alloc(c, sizeof *caller);
        caller->kind = JF_MACRO;
        caller->name = "caller";
        caller->macro = n;
        caller->closure = c->frame;
        jv fn = eval(c, n->a->a);
        if (fn.kind != JV_FUNC || fn.u.fn->kind != JF_MACRO)
            jinja_fail(c, n->line, "call block needs a macro");
        jfunc *with = jinja_alloc(c, sizeof *with);
        *with = *fn.u.fn;
        with->caller = caller;
        jargs a = eval_args(c, n->a);
        emit_value(c, call_macro(c, n->line, with, &a));
        break;
    }
    case JN_FILTER_BLOCK:
        emit_value(c, apply_chain(c, n->c, capture(c, &n->body)));
        break;
    case JN_BREAK:
        return FLOW_BREAK;
    case JN_CONTINUE:
        return FLOW_CONTINUE;
    case JN_DO:
        eval(c, n->a);
        break;
    default:
        jinja_fail(c, n->line, "internal error: expression used as statement");
    }
    return FLOW_NEXT;
}

static int exec_body(jinja_ctx *c, const jnode_list *body) {
    for (int i = 0; i < body->n; i++) {
        int flow = exec_stmt(c, body->items[i]);
        if (flow != FLOW_NEXT) return flow;
    }
    return FLOW_NEXT;
}

void jinja_render_body(jinja_ctx *c, const jnode_list *body) {
    int flow = exec_body(c, body);
    if (flow != FLOW_NEXT) jinja_fail(c, 0, "'break' or 'continue' outside of a loop");
}

const char *jinja_run(jinja_ctx *c, const char *src, size_t *out_len) {
    jtok *toks;
    int ntoks;
    jinja_lex(c, src, strlen(src), &toks, &ntoks);
    jnode_list body = jinja_parse(c, toks, ntoks);
    jbuf out = {0};
    c->out = &out;
    c->frame = push_frame(c, NULL);
    jinja_render_body(c, &body);
    *out_len = out.n;
    return out.s ? out.s : "";
}
