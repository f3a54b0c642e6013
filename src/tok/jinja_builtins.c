/*
 * jinja_builtins.c -- the filters, tests and global functions of the environment that
 * transformers builds for chat templates: jinja2's builtins (length, trim, default, join,
 * selectattr, map, ...), its tojson override, raise_exception and strftime_now.
 *
 * Design stance: each builtin is a small function with Python's semantics for the values it
 * accepts and a clear error for the ones it does not. Generators (select, map, ...) are
 * returned as lists, which differs from jinja2 only when printed directly.
 * The tables at the end are the single place that names what exists; the parser checks
 * filter and test names against them, as jinja2 does when it compiles a template.
 *
 * Invariants: results are new references; arguments are borrowed; range() is capped at
 * 100000 items like jinja2's sandbox.
 */
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#include "tok/jinja.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define JINJA_MAX_RANGE 100000

static const jv *arg(const jinja_args *a, int pos, const char *name) {
    return jinja_arg(a, pos, name);
}

static bool arg_true(const jinja_args *a, int pos, const char *name) {
    const jv *v = arg(a, pos, name);
    return v && jv_truthy(*v);
}

static di_status need_str(jv v, const char *filter) {
    return v.kind == JV_STR ? DI_OK
                            : di_error(DI_ERR_INVALID_ARG, "%s: expected a string, got %s", filter,
                                       jv_type_name(v));
}

/* Calls a str method on str(v) (jinja's soft_str). */
static di_status str_call(jinja_eval *ev, jv v, const char *method, const jinja_args *a, jv *out) {
    jv s;
    bool found;
    di_status st = jv_to_str(v, &s);
    if (st == DI_OK) st = jinja_call_method(ev, s, method, a, out, &found);
    jv_release(s);
    return st;
}

/* ========================================================================================== */
/* Filters on single values                                                                    */
/* ========================================================================================== */

static di_status f_length(jv v, jv *out) {
    int64_t n = jv_length(v);
    if (n < 0)
        return di_error(DI_ERR_INVALID_ARG, "object of type '%s' has no len()", jv_type_name(v));
    *out = jv_int(n);
    return DI_OK;
}

static di_status f_default(jv v, const jinja_args *a, jv *out) {
    const jv *def = arg(a, 0, "default_value");
    bool use = v.kind == JV_UNDEF || (arg_true(a, 1, "boolean") && !jv_truthy(v));
    if (!use)
        *out = jv_retain(v);
    else if (def)
        *out = jv_retain(*def);
    else
        return jv_str_new("", 0, out);
    return DI_OK;
}

static di_status f_tojson(jv v, const jinja_args *a, jv *out) {
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    const jv *ea = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent");
    const jv *sep = arg(a, 2, "separators"), *sk = arg(a, 3, "sort_keys");
    jv_json_opts o = {
        .indent = -1, .ensure_ascii = ea && jv_truthy(*ea), .sort_keys = sk && jv_truthy(*sk)};
    if (ind && ind->kind == JV_INT)
        o.indent = ind->u.i < 0 ? 0 : DI_MIN(ind->u.i, 1000);
    else if (ind && ind->kind == JV_STR)
        o.indent_str = ind->u.s->data;
    else if (ind && ind->kind != JV_NONE)
        return di_error(DI_ERR_INVALID_ARG, "tojson: indent must be an int or a string");
    if (sep && sep->kind == JV_LIST && sep->u.l->n == 2 && sep->u.l->items[0].kind == JV_STR &&
        sep->u.l->items[1].kind == JV_STR) {
        o.item_sep = sep->u.l->items[0].u.s->data;
        o.key_sep = sep->u.l->items[1].u.s->data;
    } else if (sep && sep->kind != JV_NONE) {
        return di_error(DI_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
    }
    jbuf b = {0};
    di_status st = jv_write_json(&b, v, &o);
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status f_int(jv v, const jinja_args *a, jv *out) {
    const jv *def = arg(a, 0, "default");
    if (v.kind == JV_INT || v.kind == JV_BOOL) {
        *out = jv_int(v.kind == JV_INT ? v.u.i : v.u.b);
        return DI_OK;
    }
    if (v.kind == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) {
        *out = jv_int((int64_t)v.u.f);
        return DI_OK;
    }
    if (v.kind == JV_STR) {
        char *end;
        double d = strtod(v.u.s->data, &end);
        while (*end && isspace((unsigned char)*end))
            end++;
        if (end != v.u.s->data && !*end && isfinite(d) && fabs(d) < 9.2e18) {
            *out = jv_int((int64_t)d);
            return DI_OK;
        }
    }
    *out = def ? jv_retain(*def) : jv_int(0);
    return DI_OK;
}

static di_status f_float(jv v, const jinja_args *a, jv *out) {
    const jv *def = arg(a, 0, "default");
    if (jv_is_number(v)) {
        *out = jv_float(v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : v.u.b);
        return DI_OK;
    }
    if (v.kind == JV_STR) {
        char *end;
        double d = strtod(v.u.s->data, &end);
        while (*end && isspace((unsigned char)*end))
            end++;
        if (end != v.u.s->data && !*end) {
            *out = jv_float(d);
            return DI_OK;
        }
    }
    *out = def ? jv_retain(*def) : jv_float(0.0);
    return DI_OK;
}

static di_status f_abs(jv v, jv *out) {
    if (v.kind == JV_FLOAT)
        *out = jv_float(fabs(v.u.f));
    else if (v.kind == JV_INT && v.u.i != INT64_MIN)
        *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    else if (v.kind == JV_BOOL)
        *out = jv_int(v.u.b);
    else
        return di_error(DI_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", jv_type_name(v));
    return DI_OK;
}

static di_status f_round(jv v, const jinja_args *a, jv *out) {
    const jv *p = arg(a, 0, "precision"), *m = arg(a, 1, "method");
    if (!jv_is_number(v))
        return di_error(DI_ERR_INVALID_ARG, "round: expected a number, got %s", jv_type_name(v));
    double x = v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : v.u.b;
    double scale = pow(10.0, p && p->kind == JV_INT ? (double)p->u.i : 0.0);
    const char *method = m && m->kind == JV_STR ? m->u.s->data : "common";
    double y = x * scale;
    if (!strcmp(method, "ceil"))
        y = ceil(y);
    else if (!strcmp(method, "floor"))
        y = floor(y);
    else if (!strcmp(method, "common"))
        y = nearbyint(y); /* Python's round: half to even */
    else
        return di_error(DI_ERR_INVALID_ARG, "round: method must be common, ceil or floor");
    *out = jv_float(y / scale);
    return DI_OK;
}

static di_status f_reverse(jv v, jv *out) {
    jv items;
    di_status st = jinja_iterate(v, &items);
    if (st != DI_OK) return st;
    jbuf b = {0};
    if (v.kind != JV_STR) st = jv_list_new(false, out);
    for (size_t i = items.u.l->n; i-- > 0 && st == DI_OK;) {
        if (v.kind == JV_STR)
            st = jbuf_add(&b, items.u.l->items[i].u.s->data, items.u.l->items[i].u.s->len);
        else
            st = jv_list_push(*out, jv_retain(items.u.l->items[i]));
    }
    jv_release(items);
    if (st == DI_OK && v.kind == JV_STR) st = jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status f_indent(jv v, const jinja_args *a, jv *out) {
    const jv *w = arg(a, 0, "width");
    bool first = arg_true(a, 1, "first"), blank = arg_true(a, 2, "blank");
    jbuf ind = {0}, b = {0};
    jv s;
    di_status st = jv_to_str(v, &s);
    if (st != DI_OK) return st;
    if (w && w->kind == JV_STR) st = jbuf_add(&ind, w->u.s->data, w->u.s->len);
    for (int64_t i = 0; st == DI_OK && !(w && w->kind == JV_STR) &&
                        i < (w && w->kind == JV_INT ? DI_MIN(w->u.i, 1000) : 4);
         i++)
        st = jbuf_adds(&ind, " ");
    const char *p = s.u.s->data, *end = p + s.u.s->len, *in = ind.data ? ind.data : "";
    for (size_t line = 0; st == DI_OK && p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (line) st = jbuf_adds(&b, "\n");
        if (st == DI_OK && ((line == 0 && first) || (line > 0 && (n > 0 || blank))))
            st = jbuf_adds(&b, in);
        if (st == DI_OK) st = jbuf_add(&b, p, n);
        p += n + (nl ? 1 : 0);
    }
    if (st == DI_OK && s.u.s->len == 0 && first) st = jbuf_adds(&b, in);
    jv_release(s);
    jbuf_free(&ind);
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status f_escape(jv v, jv *out) {
    jv s;
    di_status st = jv_to_str(v, &s);
    if (st != DI_OK) return st;
    jbuf b = {0};
    for (size_t i = 0; st == DI_OK && i < s.u.s->len; i++) {
        char c = s.u.s->data[i];
        const char *rep = c == '&'    ? "&amp;"
                          : c == '<'  ? "&lt;"
                          : c == '>'  ? "&gt;"
                          : c == '"'  ? "&#34;"
                          : c == '\'' ? "&#39;"
                                      : NULL;
        st = rep ? jbuf_adds(&b, rep) : jbuf_add(&b, &c, 1);
    }
    jv_release(s);
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

/* ========================================================================================== */
/* Dispatch                                                                                    */
/* ========================================================================================== */

static const char *const k_filters[] = {
    "length", "count", "string", "trim", "lower", "upper", "capitalize", "title", "replace",
    "default", "d", "tojson", "int", "float", "abs", "round", "reverse", "indent", "safe", "escape",
    "e", "attr",
    /* jinja_seq.c */
    "join", "first", "last", "list", "items", "dictsort", "select", "reject", "selectattr",
    "rejectattr", "map", "unique", "sort", "min", "max", "sum", NULL};

bool jinja_filter_exists(const char *name) {
    for (size_t i = 0; k_filters[i]; i++)
        if (!strcmp(k_filters[i], name)) return true;
    return false;
}

di_status jinja_apply_filter(jinja_eval *ev, const char *name, jv v, const jinja_args *a, jv *out) {
    *out = jv_none();
    di_status st = jinja_step(ev, 1);
    bool found = false;
    if (st != DI_OK) return st;
    st = jinja_seq_filter(ev, name, v, a, out, &found);
    if (st != DI_OK || found) return st;
    if (!strcmp(name, "default") || !strcmp(name, "d")) return f_default(v, a, out);
    /* Undefined acts as "" or an empty sequence, except where Python would fail on it. */
    if (v.kind == JV_UNDEF &&
        (!strcmp(name, "tojson") || !strcmp(name, "abs") || !strcmp(name, "round") ||
         !strcmp(name, "reverse") || !strcmp(name, "attr")))
        return jinja_undefined_error(v);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return f_length(v, out);
    if (!strcmp(name, "string") || !strcmp(name, "safe")) return jv_to_str(v, out);
    if (!strcmp(name, "trim")) {
        jinja_args sa = {.pos = (jv *)arg(a, 0, "chars"), .n_pos = arg(a, 0, "chars") ? 1 : 0};
        return str_call(ev, v, "strip", &sa, out);
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper") || !strcmp(name, "capitalize") ||
        !strcmp(name, "title"))
        return str_call(ev, v, name, a, out);
    if (!strcmp(name, "replace")) return str_call(ev, v, "replace", a, out);
    if (!strcmp(name, "tojson")) return f_tojson(v, a, out);
    if (!strcmp(name, "int")) return f_int(v, a, out);
    if (!strcmp(name, "float")) return f_float(v, a, out);
    if (!strcmp(name, "abs")) return f_abs(v, out);
    if (!strcmp(name, "round")) return f_round(v, a, out);
    if (!strcmp(name, "reverse")) return f_reverse(v, out);
    if (!strcmp(name, "indent")) return f_indent(v, a, out);
    if (!strcmp(name, "escape") || !strcmp(name, "e")) return f_escape(v, out);
    if (!strcmp(name, "attr")) {
        const jv *n = arg(a, 0, "name");
        st = n ? need_str(*n, "attr") : di_error(DI_ERR_INVALID_ARG, "attr: name missing");
        return st == DI_OK ? jinja_getattr(v, n->u.s->data, out) : st;
    }
    return di_error(DI_ERR_INTERNAL, "filter '%s' has no implementation", name);
}

/* ========================================================================================== */
/* Tests                                                                                       */
/* ========================================================================================== */

static const char *const k_tests[] = {
    "defined",     "undefined", "none",    "boolean", "true",     "false",       "integer",
    "float",       "number",    "string",  "mapping", "iterable", "sequence",    "callable",
    "sameas",      "escaped",   "in",      "lower",   "upper",    "odd",         "even",
    "divisibleby", "eq",        "equalto", "==",      "ne",       "!=",          "lt",
    "lessthan",    "<",         "le",      "<=",      "gt",       "greaterthan", ">",
    "ge",          ">=",        "filter",  "test",    NULL};

bool jinja_test_exists(const char *name) {
    for (size_t i = 0; k_tests[i]; i++)
        if (!strcmp(k_tests[i], name)) return true;
    return false;
}

static di_status t_compare(const char *name, jv v, const jv *other, bool *out) {
    static const char *const names[] = {
        "eq", "equalto", "==", "ne",          "!=", "lt", "lessthan", "<",
        "le", "<=",      "gt", "greaterthan", ">",  "ge", ">="};
    static const char codes[] = "===!!<<<ll>>>gg";
    for (size_t i = 0; i < DI_ARRAY_LEN(names); i++)
        if (!strcmp(name, names[i])) {
            if (!other) return di_error(DI_ERR_INVALID_ARG, "test '%s' needs an argument", name);
            return jinja_compare(codes[i], v, *other, out);
        }
    return di_error(DI_ERR_INTERNAL, "test '%s' has no implementation", name);
}

static di_status t_number(const char *name, jv v, const jv *other, bool *out) {
    if (!strcmp(name, "divisibleby")) {
        if (!other || !jv_is_number(*other) || !jv_is_number(v))
            return di_error(DI_ERR_INVALID_ARG, "divisibleby needs two numbers");
        jv r;
        di_status st = jinja_binary('%', v, *other, &r);
        if (st == DI_OK) *out = !jv_truthy(r);
        return st;
    }
    if (v.kind != JV_INT && v.kind != JV_BOOL)
        return di_error(DI_ERR_INVALID_ARG, "test '%s' needs an integer, got %s", name,
                        jv_type_name(v));
    int64_t i = v.kind == JV_INT ? v.u.i : v.u.b;
    *out = (i % 2 != 0) == !strcmp(name, "odd");
    return DI_OK;
}

static bool ascii_case(jv v, bool upper) {
    if (v.kind != JV_STR) return false;
    bool cased = false;
    for (size_t i = 0; i < v.u.s->len; i++) {
        unsigned char c = (unsigned char)v.u.s->data[i];
        if (upper ? islower(c) : isupper(c)) return false;
        cased |= upper ? isupper(c) : islower(c);
    }
    return cased;
}

di_status jinja_apply_test(jinja_eval *ev, const char *name, jv v, const jinja_args *a, bool *out) {
    const jv *other = arg(a, 0, NULL);
    jv_kind k = v.kind;
    *out = false;
    if (!strcmp(name, "defined"))
        *out = k != JV_UNDEF;
    else if (!strcmp(name, "undefined"))
        *out = k == JV_UNDEF;
    else if (!strcmp(name, "none"))
        *out = k == JV_NONE;
    else if (!strcmp(name, "boolean"))
        *out = k == JV_BOOL;
    else if (!strcmp(name, "true"))
        *out = k == JV_BOOL && v.u.b;
    else if (!strcmp(name, "false"))
        *out = k == JV_BOOL && !v.u.b;
    else if (!strcmp(name, "integer"))
        *out = k == JV_INT;
    else if (!strcmp(name, "float"))
        *out = k == JV_FLOAT;
    else if (!strcmp(name, "number"))
        *out = jv_is_number(v);
    else if (!strcmp(name, "string"))
        *out = k == JV_STR;
    else if (!strcmp(name, "mapping"))
        *out = k == JV_DICT && v.u.d->flavor == JV_DICT_PLAIN;
    else if (!strcmp(name, "iterable"))
        *out = k == JV_STR || k == JV_LIST || k == JV_DICT || k == JV_UNDEF;
    else if (!strcmp(name, "sequence"))
        *out = k == JV_STR || k == JV_LIST || k == JV_UNDEF ||
               (k == JV_DICT && v.u.d->flavor == JV_DICT_PLAIN);
    else if (!strcmp(name, "callable"))
        *out = k == JV_MACRO || k == JV_UNDEF; /* Undefined has __call__ */
    else if (!strcmp(name, "escaped"))
        *out = false;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper"))
        *out = ascii_case(v, name[0] == 'u');
    else if (!strcmp(name, "filter"))
        *out = k == JV_STR && jinja_filter_exists(v.u.s->data);
    else if (!strcmp(name, "test"))
        *out = k == JV_STR && jinja_test_exists(v.u.s->data);
    else if (!strcmp(name, "sameas"))
        *out = other && other->kind == k &&
               (k == JV_STR || k == JV_LIST || k == JV_DICT ? v.u.s == other->u.s
                                                            : jv_equal(v, *other));
    else if (!strcmp(name, "in")) {
        if (!other) return di_error(DI_ERR_INVALID_ARG, "test 'in' needs an argument");
        return jinja_contains(*other, v, out);
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby"))
        return t_number(name, v, other, out);
    else
        return t_compare(name, v, other, out);
    DI_UNUSED(ev);
    return DI_OK;
}

/* ========================================================================================== */
/* Globals                                                                                     */
/* ========================================================================================== */

static di_status g_range(const jinja_args *a, jv *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw)
        return di_error(DI_ERR_INVALID_ARG, "range expected 1 to 3 integer arguments");
    for (size_t i = 0; i < a->n_pos; i++) {
        if (a->pos[i].kind != JV_INT && a->pos[i].kind != JV_BOOL)
            return di_error(DI_ERR_INVALID_ARG, "'%s' object cannot be interpreted as an integer",
                            jv_type_name(a->pos[i]));
        v[a->n_pos == 1 ? 1 : i] = a->pos[i].kind == JV_INT ? a->pos[i].u.i : a->pos[i].u.b;
    }
    if (v[2] == 0) return di_error(DI_ERR_INVALID_ARG, "range() arg 3 must not be zero");
    double n = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
    if (n > JINJA_MAX_RANGE)
        return di_error(DI_ERR_RANGE,
                        "Range too big. The sandbox blocks ranges larger than "
                        "MAX_RANGE (%d).",
                        JINJA_MAX_RANGE);
    di_status st = jv_list_new(false, out);
    for (int64_t i = v[0]; st == DI_OK && (v[2] > 0 ? i < v[1] : i > v[1]); i += v[2])
        st = jv_list_push(*out, jv_int(i));
    return st;
}

/* namespace(...) and dict(...): an optional mapping plus keyword arguments. */
static di_status g_dict(const jinja_args *a, jv_dict_flavor flavor, jv *out) {
    di_status st = jv_dict_new(flavor, out);
    if (a->n_pos > 1) return di_error(DI_ERR_INVALID_ARG, "expected at most 1 positional argument");
    if (a->n_pos == 1) {
        jv src = a->pos[0];
        if (src.kind != JV_DICT)
            return di_error(DI_ERR_INVALID_ARG, "cannot convert %s to a dict", jv_type_name(src));
        for (size_t i = 0; i < src.u.d->n && st == DI_OK; i++)
            st = jv_dict_set(*out, jv_retain(src.u.d->keys[i]), jv_retain(src.u.d->vals[i]));
    }
    for (size_t i = 0; i < a->n_kw && st == DI_OK; i++)
        st = jv_dict_set_cstr(*out, a->kw_names[i], jv_retain(a->kw[i]));
    return st;
}

static di_status g_strftime_now(const jinja_args *a, jv *out) {
    const jv *f = arg(a, 0, "format");
    if (!f || f->kind != JV_STR)
        return di_error(DI_ERR_INVALID_ARG, "strftime_now(format) needs a string");
    time_t now = time(NULL);
    struct tm tm;
    char buf[512];
    localtime_r(&now, &tm);
    size_t n = strftime(buf, sizeof buf, f->u.s->data, &tm);
    return jv_str_new(buf, n, out);
}

di_status jinja_call_global(jinja_eval *ev, const char *name, const jinja_args *a, jv *out,
                            bool *found) {
    DI_UNUSED(ev);
    *out = jv_none();
    *found = true;
    if (!strcmp(name, "range")) return g_range(a, out);
    if (!strcmp(name, "namespace")) return g_dict(a, JV_DICT_NAMESPACE, out);
    if (!strcmp(name, "dict")) return g_dict(a, JV_DICT_PLAIN, out);
    if (!strcmp(name, "strftime_now")) return g_strftime_now(a, out);
    if (!strcmp(name, "raise_exception")) {
        const jv *m = arg(a, 0, "message");
        jbuf b = {0};
        if (m) jv_write_str(&b, *m);
        di_status st = di_error(DI_ERR_INVALID_ARG, "%s", b.data ? b.data : "");
        jbuf_free(&b);
        return st;
    }
    *found = false;
    return DI_OK;
}
