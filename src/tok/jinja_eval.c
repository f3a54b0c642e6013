/*
 * jinja_eval.c -- walks a template's AST and writes its output: statements, expressions,
 * variable scopes, for loops with the loop object, macros.
 *
 * Design stance: scoping follows jinja2. Variables live in a stack of frames (dicts):
 * frame 0 holds the render context (messages, bos_token, ...), frame 1 the template's own
 * top-level assignments, and every for-loop iteration and macro call pushes a fresh frame,
 * so a {% set %} inside a loop is gone after the iteration (hence namespace()). A macro
 * sees only its own frame and the template-level ones, not its caller's.
 *
 * Invariants: eval() returns a new reference in *out, or an error with *out == none.
 * Every node visited costs one step (JINJA_MAX_STEPS); macro calls nest at most
 * JINJA_MAX_CALL_DEPTH deep; output and values are bounded by jbuf / jv limits.
 */
#include "tok/jinja.h"

#include <string.h>

typedef struct frame {
    jv vars;         /* JV_DICT, owned (frame 0: borrowed context, retained) */
    bool macro_root; /* lookups do not go below this frame, except to frames 0 and 1 */
} frame;

struct jinja_eval {
    jbuf *out; /* where output goes now (swapped for set blocks and macro calls) */
    int64_t steps;
    int call_depth;
    bool located; /* the error message already names a line:col */
    frame *frames;
    size_t n_frames, cap_frames;
};

typedef enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;

static di_status eval(jinja_eval *ev, const jinja_node *n, jv *out);
static di_status exec(jinja_eval *ev, const jinja_node *n, flow *fl);

di_status jinja_step(jinja_eval *ev, int64_t n) {
    ev->steps += n;
    if (ev->steps > JINJA_MAX_STEPS)
        return di_error(DI_ERR_RANGE, "template evaluation exceeded %d steps (endless loop?)",
                        JINJA_MAX_STEPS);
    return DI_OK;
}

/* Prefixes the innermost failing statement's position to the error message, once. */
static di_status locate(jinja_eval *ev, const jinja_node *n, di_status st) {
    if (st == DI_OK || ev->located) return st;
    ev->located = true;
    return di_error_prefix(st, "line %d:%d", n->line, n->col);
}

/* ========================================================================================== */
/* Frames                                                                                      */
/* ========================================================================================== */

static di_status push_frame(jinja_eval *ev, bool macro_root) {
    if (ev->n_frames == ev->cap_frames) {
        size_t cap = ev->cap_frames ? ev->cap_frames * 2 : 16;
        frame *f = di_realloc(ev->frames, cap * sizeof *f);
        if (!f) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate a scope");
        ev->frames = f;
        ev->cap_frames = cap;
    }
    jv vars;
    di_status st = jv_dict_new(JV_DICT_PLAIN, &vars);
    if (st != DI_OK) return st;
    ev->frames[ev->n_frames++] = (frame){.vars = vars, .macro_root = macro_root};
    return DI_OK;
}

static void pop_frame(jinja_eval *ev) {
    jv_release(ev->frames[--ev->n_frames].vars);
}

static const jv *lookup(const jinja_eval *ev, const char *name) {
    for (size_t i = ev->n_frames; i-- > 0;) {
        const jv *v = jv_dict_get_cstr(ev->frames[i].vars, name);
        if (v) return v;
        if (ev->frames[i].macro_root && i > 2) i = 2; /* continue with frame 1 */
    }
    return NULL;
}

/* Assigns in the innermost frame; takes ownership of v. */
static di_status assign(jinja_eval *ev, const char *name, jv v) {
    return jv_dict_set_cstr(ev->frames[ev->n_frames - 1].vars, name, v);
}

/* Binds targets (one name, or several unpacked from a list/tuple); takes ownership of v. */
static di_status assign_targets(jinja_eval *ev, const char *const *names, size_t n, jv v) {
    if (n == 1) return assign(ev, names[0], v);
    di_status st = DI_OK;
    if (v.kind != JV_LIST || v.u.l->n != n)
        st = di_error(DI_ERR_INVALID_ARG, "cannot unpack %s into %zu variables",
                      v.kind == JV_LIST ? "a sequence of another length" : jv_type_name(v), n);
    for (size_t i = 0; i < n && st == DI_OK; i++)
        st = assign(ev, names[i], jv_retain(v.u.l->items[i]));
    jv_release(v);
    return st;
}

/* ========================================================================================== */
/* Expressions                                                                                 */
/* ========================================================================================== */

typedef struct evargs {
    jinja_args a;
    jv storage[16];
    const char *names[16];
} evargs;

static void args_free(evargs *x) {
    for (size_t i = 0; i < x->a.n_pos + x->a.n_kw; i++)
        jv_release(x->storage[i]);
}

/* Evaluates the positional and keyword arguments of a call, filter or test node. */
static di_status eval_args(jinja_eval *ev, const jinja_node *n, evargs *x) {
    *x = (evargs){0};
    if (n->n_args + n->n_kw > DI_ARRAY_LEN(x->storage))
        return di_error(DI_ERR_UNSUPPORTED, "line %d:%d: more than 16 arguments", n->line, n->col);
    di_status st = DI_OK;
    for (size_t i = 0; i < n->n_args && st == DI_OK; i++, x->a.n_pos++)
        st = eval(ev, n->args[i], &x->storage[i]);
    x->a.pos = x->storage;
    x->a.kw = x->storage + x->a.n_pos;
    x->a.kw_names = x->names;
    for (size_t i = 0; i < n->n_kw && st == DI_OK; i++, x->a.n_kw++) {
        x->names[i] = n->kw_names[i];
        st = eval(ev, n->kw_vals[i], &x->a.kw[i]);
    }
    if (st != DI_OK) args_free(x);
    return st;
}

static di_status call_macro(jinja_eval *ev, const jinja_node *m, const jinja_args *a, jv *out) {
    if (ev->call_depth >= JINJA_MAX_CALL_DEPTH)
        return di_error(DI_ERR_RANGE, "macro calls nested deeper than %d", JINJA_MAX_CALL_DEPTH);
    if (a->n_pos > m->n_names)
        return di_error(DI_ERR_INVALID_ARG, "macro '%s' takes %zu arguments, %zu given", m->name,
                        m->n_names, a->n_pos);
    di_status st = push_frame(ev, true);
    for (size_t i = 0; i < m->n_names && st == DI_OK; i++) {
        const jv *v = i < a->n_pos ? &a->pos[i] : jinja_arg(a, -1, m->names[i]);
        jv val = jv_undef();
        if (v)
            val = jv_retain(*v);
        else if (m->args[i])
            st = eval(ev, m->args[i], &val);
        else
            st = jv_undef_msg(&val, "'%s' is undefined", m->names[i]);
        if (st == DI_OK) st = assign(ev, m->names[i], val);
    }
    for (size_t i = 0; i < a->n_kw && st == DI_OK; i++) {
        bool known = false;
        for (size_t k = 0; k < m->n_names; k++)
            known |= !strcmp(m->names[k], a->kw_names[i]);
        if (!known)
            st = di_error(DI_ERR_INVALID_ARG, "macro '%s' has no argument '%s'", m->name,
                          a->kw_names[i]);
    }
    jbuf buf = {0}, *saved = ev->out;
    ev->out = &buf;
    ev->call_depth++;
    flow fl = FLOW_NORMAL;
    if (st == DI_OK) st = exec(ev, m->b, &fl);
    ev->call_depth--;
    ev->out = saved;
    pop_frame(ev);
    if (st == DI_OK) return jbuf_to_str(&buf, out);
    jbuf_free(&buf);
    return st;
}

static di_status eval_call(jinja_eval *ev, const jinja_node *n, jv *out) {
    evargs x;
    di_status st = eval_args(ev, n, &x);
    if (st != DI_OK) return st;
    const jinja_node *callee = n->a;
    bool found = false;
    if (callee->kind == JN_NAME) {
        const jv *v = lookup(ev, callee->name);
        if (v && v->kind == JV_MACRO) {
            st = call_macro(ev, v->u.node, &x.a, out);
            found = true;
        } else if (!v) {
            st = jinja_call_global(ev, callee->name, &x.a, out, &found);
        }
        if (st == DI_OK && !found)
            st = v ? di_error(DI_ERR_INVALID_ARG, "'%s' object is not callable", jv_type_name(*v))
                   : di_error(DI_ERR_INVALID_ARG, "'%s' is undefined", callee->name);
    } else if (callee->kind == JN_ATTR) {
        jv obj;
        st = eval(ev, callee->a, &obj);
        if (st == DI_OK && obj.kind == JV_UNDEF) st = jinja_undefined_error(obj);
        if (st == DI_OK) st = jinja_call_method(ev, obj, callee->name, &x.a, out, &found);
        if (st == DI_OK && !found)
            st = di_error(DI_ERR_INVALID_ARG, "'%s' object has no callable attribute '%s'",
                          jv_type_name(obj), callee->name);
        jv_release(obj);
    } else {
        st = di_error(DI_ERR_INVALID_ARG, "this expression is not callable");
    }
    args_free(&x);
    return st;
}

static di_status eval_filter(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv v;
    di_status st = eval(ev, n->a, &v);
    if (st != DI_OK) return st;
    evargs x;
    st = eval_args(ev, n, &x);
    if (st == DI_OK) {
        st = jinja_apply_filter(ev, n->name, v, &x.a, out);
        args_free(&x);
    }
    jv_release(v);
    return st;
}

static di_status eval_test(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv v;
    di_status st = eval(ev, n->a, &v);
    if (st != DI_OK) return st;
    evargs x;
    bool r = false;
    st = eval_args(ev, n, &x);
    if (st == DI_OK) {
        st = jinja_apply_test(ev, n->name, v, &x.a, &r);
        args_free(&x);
    }
    jv_release(v);
    *out = jv_bool(n->op ? !r : r);
    return st;
}

static di_status eval_unary(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv v;
    di_status st = eval(ev, n->a, &v);
    if (st != DI_OK) return st;
    if (n->op == 'n') {
        *out = jv_bool(!jv_truthy(v));
    } else if (jv_is_number(v)) {
        if (n->op == '+')
            *out = v.kind == JV_BOOL ? jv_int(v.u.b) : v;
        else if (v.kind == JV_FLOAT)
            *out = jv_float(-v.u.f);
        else if (v.kind == JV_INT && v.u.i == INT64_MIN)
            st = di_error(DI_ERR_RANGE, "integer overflow");
        else
            *out = jv_int(v.kind == JV_INT ? -v.u.i : -(int64_t)v.u.b);
    } else {
        st = v.kind == JV_UNDEF
                 ? jinja_undefined_error(v)
                 : di_error(DI_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", n->op,
                            jv_type_name(v));
    }
    jv_release(v);
    return st;
}

static di_status eval_binary(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv a, b;
    di_status st = eval(ev, n->a, &a);
    if (st != DI_OK) return st;
    if (n->op == 'a' || n->op == 'o') { /* Python returns the deciding operand */
        if (jv_truthy(a) == (n->op == 'o')) {
            *out = a;
            return DI_OK;
        }
        jv_release(a);
        return eval(ev, n->b, out);
    }
    st = eval(ev, n->b, &b);
    if (st == DI_OK) {
        if (n->kind == JN_COMPARE) {
            bool r = false;
            st = jinja_compare(n->op, a, b, &r);
            *out = jv_bool(r);
        } else {
            st = jinja_binary(n->op, a, b, out);
        }
        jv_release(b);
    }
    jv_release(a);
    return st;
}

static di_status eval_collection(jinja_eval *ev, const jinja_node *n, jv *out) {
    di_status st = n->kind == JN_DICT ? jv_dict_new(JV_DICT_PLAIN, out)
                                      : jv_list_new(n->kind == JN_TUPLE, out);
    for (size_t i = 0; i < n->n_args && st == DI_OK; i++) {
        jv v;
        st = eval(ev, n->args[i], &v);
        if (st != DI_OK) break;
        if (n->kind != JN_DICT) {
            st = jv_list_push(*out, v);
            continue;
        }
        jv val;
        st = eval(ev, n->args[++i], &val);
        if (st == DI_OK && (v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF)) {
            jv_release(val);
            st = di_error(DI_ERR_INVALID_ARG, "unhashable type: '%s'", jv_type_name(v));
        }
        if (st == DI_OK)
            st = jv_dict_set(*out, v, val);
        else
            jv_release(v);
    }
    return st;
}

static di_status eval_subscript(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv obj, parts[3] = {jv_none(), jv_none(), jv_none()};
    const jinja_node *exprs[3] = {n->b, n->c, n->d};
    di_status st = eval(ev, n->a, &obj);
    if (st != DI_OK) return st;
    for (int k = 0; k < 3 && st == DI_OK; k++)
        if (exprs[k]) st = eval(ev, exprs[k], &parts[k]);
    if (st == DI_OK && n->kind == JN_ITEM) st = jinja_getitem(obj, parts[0], out);
    if (st == DI_OK && n->kind == JN_SLICE)
        st = jinja_slice(obj, n->b ? &parts[0] : NULL, n->c ? &parts[1] : NULL,
                         n->d ? &parts[2] : NULL, out);
    for (int k = 0; k < 3; k++)
        jv_release(parts[k]);
    jv_release(obj);
    return st;
}

static di_status eval_inner(jinja_eval *ev, const jinja_node *n, jv *out) {
    jv obj;
    di_status st;
    switch (n->kind) {
    case JN_LITERAL:
        *out = jv_retain(n->value);
        return DI_OK;
    case JN_NAME: {
        const jv *v = lookup(ev, n->name);
        if (v) {
            *out = jv_retain(*v);
            return DI_OK;
        }
        return jv_undef_msg(out, "'%.100s' is undefined", n->name);
    }
    case JN_ATTR:
        st = eval(ev, n->a, &obj);
        if (st != DI_OK) return st;
        st = jinja_getattr(obj, n->name, out);
        jv_release(obj);
        return st;
    case JN_ITEM:
    case JN_SLICE:
        return eval_subscript(ev, n, out);
    case JN_CALL:
        return eval_call(ev, n, out);
    case JN_FILTER:
        return eval_filter(ev, n, out);
    case JN_TEST:
        return eval_test(ev, n, out);
    case JN_UNARY:
        return eval_unary(ev, n, out);
    case JN_BINARY:
    case JN_COMPARE:
        return eval_binary(ev, n, out);
    case JN_COND:
        st = eval(ev, n->a, &obj);
        if (st != DI_OK) return st;
        bool yes = jv_truthy(obj);
        jv_release(obj);
        if (yes) return eval(ev, n->b, out);
        if (n->c) return eval(ev, n->c, out);
        return jv_undef_msg(out, "the inline if-expression evaluated to false and no else "
                                 "section was defined");
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT:
        return eval_collection(ev, n, out);
    default:
        return di_error(DI_ERR_INTERNAL, "statement node where an expression was expected");
    }
}

static di_status eval(jinja_eval *ev, const jinja_node *n, jv *out) {
    *out = jv_none();
    di_status st = jinja_step(ev, 1);
    if (st == DI_OK) st = eval_inner(ev, n, out);
    if (st != DI_OK) {
        jv_release(*out);
        *out = jv_none();
    }
    return st;
}

/* ========================================================================================== */
/* Statements                                                                                  */
/* ========================================================================================== */

static di_status write_value(jinja_eval *ev, const jinja_node *expr) {
    jv v;
    di_status st = eval(ev, expr, &v);
    if (st == DI_OK) st = jv_write_str(ev->out, v);
    jv_release(v);
    return st;
}

static di_status exec_if(jinja_eval *ev, const jinja_node *n, flow *fl) {
    jv c;
    di_status st = eval(ev, n->a, &c);
    if (st != DI_OK) return st;
    bool yes = jv_truthy(c);
    jv_release(c);
    if (yes) return exec(ev, n->b, fl);
    return n->c ? exec(ev, n->c, fl) : DI_OK;
}

/* The loop object of iteration i over items (jinja2's LoopContext, without cycle/changed,
 * which are methods handled by jinja_call_method). */
static di_status make_loop(const jv_list *items, size_t i, jv *out) {
    int64_t n = (int64_t)items->n, k = (int64_t)i;
    di_status st = jv_dict_new(JV_DICT_LOOP, out);
    struct {
        const char *name;
        jv v;
    } fields[] = {
        {"index", jv_int(k + 1)},    {"index0", jv_int(k)},
        {"revindex", jv_int(n - k)}, {"revindex0", jv_int(n - k - 1)},
        {"first", jv_bool(k == 0)},  {"last", jv_bool(k == n - 1)},
        {"length", jv_int(n)},       {"depth", jv_int(1)},
        {"depth0", jv_int(0)},
    };
    for (size_t f = 0; f < DI_ARRAY_LEN(fields) && st == DI_OK; f++)
        st = jv_dict_set_cstr(*out, fields[f].name, fields[f].v);
    jv prev = i > 0 ? jv_retain(items->items[i - 1]) : jv_undef();
    jv next = i + 1 < items->n ? jv_retain(items->items[i + 1]) : jv_undef();
    if (st == DI_OK)
        st = jv_dict_set_cstr(*out, "previtem", prev);
    else
        jv_release(prev);
    if (st == DI_OK)
        st = jv_dict_set_cstr(*out, "nextitem", next);
    else
        jv_release(next);
    return st;
}

/* Applies the loop's "if" filter: the items for which it holds, with targets bound. */
static di_status filter_items(jinja_eval *ev, const jinja_node *n, jv all, jv *out) {
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; i < all.u.l->n && st == DI_OK; i++) {
        jv item = all.u.l->items[i], c = jv_none();
        st = push_frame(ev, false);
        if (st != DI_OK) break;
        st = assign_targets(ev, n->names, n->n_names, jv_retain(item));
        if (st == DI_OK) st = eval(ev, n->d, &c);
        pop_frame(ev);
        if (st == DI_OK && jv_truthy(c)) st = jv_list_push(*out, jv_retain(item));
        jv_release(c);
    }
    return st;
}

static di_status run_iteration(jinja_eval *ev, const jinja_node *n, jv items, size_t i, flow *fl) {
    jv loop;
    di_status st = push_frame(ev, false);
    if (st != DI_OK) return st;
    st = assign_targets(ev, n->names, n->n_names, jv_retain(items.u.l->items[i]));
    if (st == DI_OK) st = make_loop(items.u.l, i, &loop);
    if (st == DI_OK) st = assign(ev, "loop", loop);
    if (st == DI_OK) st = exec(ev, n->b, fl);
    pop_frame(ev);
    return st;
}

static di_status exec_for(jinja_eval *ev, const jinja_node *n) {
    jv src, all, items = jv_none();
    di_status st = eval(ev, n->a, &src);
    if (st != DI_OK) return st;
    st = jinja_iterate(src, &all);
    jv_release(src);
    if (st != DI_OK) return st;
    if (n->d) {
        st = filter_items(ev, n, all, &items);
        jv_release(all);
    } else {
        items = all;
    }
    for (size_t i = 0; st == DI_OK && i < items.u.l->n; i++) {
        flow fl = FLOW_NORMAL;
        st = jinja_step(ev, 1);
        if (st == DI_OK) st = run_iteration(ev, n, items, i, &fl);
        if (fl == FLOW_BREAK) break;
    }
    if (st == DI_OK && items.u.l->n == 0 && n->c) {
        flow fl = FLOW_NORMAL; /* break/continue in the else block belong to an outer loop */
        st = exec(ev, n->c, &fl);
    }
    jv_release(items);
    return st;
}

static di_status exec_set(jinja_eval *ev, const jinja_node *n) {
    jv v;
    di_status st = eval(ev, n->a, &v);
    if (st != DI_OK) return st;
    if (!n->name) return assign_targets(ev, n->names, n->n_names, v);
    const jv *ns = lookup(ev, n->name); /* {% set ns.attr = v %} */
    if (!ns || ns->kind != JV_DICT || ns->u.d->flavor != JV_DICT_NAMESPACE) {
        jv_release(v);
        return di_error(DI_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object");
    }
    return jv_dict_set(*ns, jv_retain(n->value), v);
}

static di_status exec_set_block(jinja_eval *ev, const jinja_node *n) {
    jbuf buf = {0}, *saved = ev->out;
    ev->out = &buf;
    flow fl = FLOW_NORMAL;
    di_status st = exec(ev, n->b, &fl);
    ev->out = saved;
    jv s;
    if (st == DI_OK) st = jbuf_to_str(&buf, &s);
    jbuf_free(&buf);
    return st == DI_OK ? assign(ev, n->name, s) : st;
}

static di_status exec_body(jinja_eval *ev, const jinja_node *n, flow *fl) {
    di_status st = DI_OK;
    for (size_t i = 0; i < n->n_args && st == DI_OK && *fl == FLOW_NORMAL; i++)
        st = exec(ev, n->args[i], fl);
    return st;
}

static di_status exec(jinja_eval *ev, const jinja_node *n, flow *fl) {
    di_status st = jinja_step(ev, 1);
    if (st != DI_OK) return st;
    switch (n->kind) {
    case JN_BODY:
        return exec_body(ev, n, fl);
    case JN_DATA:
        return jbuf_add(ev->out, n->value.u.s->data, n->value.u.s->len);
    case JN_OUTPUT:
        return locate(ev, n, write_value(ev, n->a));
    case JN_IF:
        return locate(ev, n, exec_if(ev, n, fl));
    case JN_FOR:
        return locate(ev, n, exec_for(ev, n));
    case JN_SET:
        return locate(ev, n, exec_set(ev, n));
    case JN_SET_BLOCK:
        return locate(ev, n, exec_set_block(ev, n));
    case JN_MACRO:
        return assign(ev, n->name, (jv){.kind = JV_MACRO, .u.node = n});
    case JN_GENERATION:
        return exec(ev, n->b, fl);
    case JN_BREAK:
        *fl = FLOW_BREAK;
        return DI_OK;
    case JN_CONTINUE:
        *fl = FLOW_CONTINUE;
        return DI_OK;
    default:
        return di_error(DI_ERR_INTERNAL, "expression node where a statement was expected");
    }
}

di_status jinja_render(const jinja_template *t, jv ctx, jbuf *out) {
    jinja_eval ev = {.out = out};
    di_status st = push_frame(&ev, false);
    if (st != DI_OK) return st;
    jv_release(ev.frames[0].vars); /* frame 0 is the caller's context */
    ev.frames[0].vars = jv_retain(ctx);
    st = push_frame(&ev, false);
    flow fl = FLOW_NORMAL;
    if (st == DI_OK) st = exec(&ev, jinja_template_root(t), &fl);
    while (ev.n_frames)
        pop_frame(&ev);
    di_free(ev.frames);
    return st;
}
