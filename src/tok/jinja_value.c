/*
 * jinja_value.c -- the value type of the Jinja interpreter: reference counting, strings,
 * lists and dicts, Python equality and ordering, and Python's str()/repr() text.
 *
 * Design stance: values mirror the Python objects jinja2 would hold, so that output is the
 * same byte for byte: bool prints as True/False, None as None, floats as Python's shortest
 * round-trip repr, lists and dicts with repr'd items.
 *
 * Invariants: every size is checked against JINJA_MAX_STRING / JINJA_MAX_ITEMS before it
 * grows, so a template cannot exhaust memory through one value.
 */
#include "tok/jinja.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================================== */
/* Reference counting                                                                          */
/* ========================================================================================== */

/* Counts change atomically so that one parsed template (whose literals are shared values)
 * can be rendered from several threads at once. */
static void rc_inc(int32_t *rc) {
    __atomic_fetch_add(rc, 1, __ATOMIC_RELAXED);
}
static bool rc_dec(int32_t *rc) {
    return __atomic_sub_fetch(rc, 1, __ATOMIC_ACQ_REL) == 0;
}

jv jv_retain(jv v) {
    switch (v.kind) {
    case JV_STR:
        rc_inc(&v.u.s->rc);
        break;
    case JV_UNDEF:
        if (v.u.s) rc_inc(&v.u.s->rc);
        break;
    case JV_LIST:
        rc_inc(&v.u.l->rc);
        break;
    case JV_DICT:
        rc_inc(&v.u.d->rc);
        break;
    default:
        break;
    }
    return v;
}

static void list_destroy(jv_list *l) {
    for (size_t i = 0; i < l->n; i++)
        jv_release(l->items[i]);
    di_free(l->items);
    di_free(l);
}

static void dict_destroy(jv_dict *d) {
    for (size_t i = 0; i < d->n; i++) {
        jv_release(d->keys[i]);
        jv_release(d->vals[i]);
    }
    di_free(d->keys);
    di_free(d->vals);
    di_free(d);
}

void jv_release(jv v) {
    switch (v.kind) {
    case JV_STR:
        if (rc_dec(&v.u.s->rc)) di_free(v.u.s);
        break;
    case JV_UNDEF:
        if (v.u.s && rc_dec(&v.u.s->rc)) di_free(v.u.s);
        break;
    case JV_LIST:
        if (rc_dec(&v.u.l->rc)) list_destroy(v.u.l);
        break;
    case JV_DICT:
        if (rc_dec(&v.u.d->rc)) dict_destroy(v.u.d);
        break;
    default:
        break;
    }
}

/* ========================================================================================== */
/* Constructors                                                                                */
/* ========================================================================================== */

di_status jv_str_new(const char *s, size_t len, jv *out) {
    *out = jv_none();
    if (len > JINJA_MAX_STRING)
        return di_error(DI_ERR_RANGE, "string of %zu bytes exceeds the limit of %u", len,
                        JINJA_MAX_STRING);
    jv_str *p = di_malloc(sizeof *p + len + 1);
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot allocate a string of %zu bytes", len);
    p->rc = 1;
    p->len = len;
    if (len) memcpy(p->data, s, len);
    p->data[len] = '\0';
    *out = (jv){.kind = JV_STR, .u.s = p};
    return DI_OK;
}

di_status jv_str_cstr(const char *s, jv *out) {
    return jv_str_new(s, strlen(s), out);
}

di_status jv_undef_msg(jv *out, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jv s;
    di_status st = jv_str_cstr(msg, &s);
    if (st != DI_OK) return st;
    *out = (jv){.kind = JV_UNDEF, .u.s = s.u.s};
    return DI_OK;
}

di_status jv_list_new(bool tuple, jv *out) {
    jv_list *l = di_calloc(1, sizeof *l);
    if (!l) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot allocate a list");
    l->rc = 1;
    l->tuple = tuple;
    *out = (jv){.kind = JV_LIST, .u.l = l};
    return DI_OK;
}

di_status jv_list_push(jv list, jv item) {
    jv_list *l = list.u.l;
    if (l->n == l->cap) {
        if (l->n >= JINJA_MAX_ITEMS) {
            jv_release(item);
            return di_error(DI_ERR_RANGE, "list exceeds the limit of %u items", JINJA_MAX_ITEMS);
        }
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *p = di_realloc(l->items, cap * sizeof *p);
        if (!p) {
            jv_release(item);
            return di_error(DI_ERR_OUT_OF_MEMORY, "cannot grow a list to %zu items", cap);
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = item;
    return DI_OK;
}

di_status jv_dict_new(jv_dict_flavor flavor, jv *out) {
    jv_dict *d = di_calloc(1, sizeof *d);
    if (!d) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot allocate a dict");
    d->rc = 1;
    d->flavor = flavor;
    *out = (jv){.kind = JV_DICT, .u.d = d};
    return DI_OK;
}

static di_status dict_grow(jv_dict *d) {
    if (d->n >= JINJA_MAX_ITEMS)
        return di_error(DI_ERR_RANGE, "dict exceeds the limit of %u items", JINJA_MAX_ITEMS);
    size_t cap = d->cap ? d->cap * 2 : 4;
    jv *k = di_realloc(d->keys, cap * sizeof *k);
    if (!k) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot grow a dict");
    d->keys = k;
    jv *v = di_realloc(d->vals, cap * sizeof *v);
    if (!v) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot grow a dict");
    d->vals = v;
    d->cap = cap;
    return DI_OK;
}

di_status jv_dict_set(jv dict, jv key, jv val) {
    jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (jv_equal(d->keys[i], key)) {
            jv_release(key);
            jv_release(d->vals[i]);
            d->vals[i] = val;
            return DI_OK;
        }
    }
    if (d->n == d->cap) {
        di_status st = dict_grow(d);
        if (st != DI_OK) {
            jv_release(key);
            jv_release(val);
            return st;
        }
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return DI_OK;
}

di_status jv_dict_set_cstr(jv dict, const char *key, jv val) {
    jv k;
    di_status st = jv_str_cstr(key, &k);
    if (st != DI_OK) {
        jv_release(val);
        return st;
    }
    return jv_dict_set(dict, k, val);
}

const jv *jv_dict_get(jv dict, jv key) {
    jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

const jv *jv_dict_get_cstr(jv dict, const char *key) {
    jv_dict *d = dict.u.d;
    size_t len = strlen(key);
    for (size_t i = 0; i < d->n; i++) {
        jv k = d->keys[i];
        if (k.kind == JV_STR && k.u.s->len == len && !memcmp(k.u.s->data, key, len))
            return &d->vals[i];
    }
    return NULL;
}

/* ========================================================================================== */
/* Predicates, equality, ordering                                                              */
/* ========================================================================================== */

bool jv_is_str(jv v) {
    return v.kind == JV_STR;
}

bool jv_is_number(jv v) {
    return v.kind == JV_BOOL || v.kind == JV_INT || v.kind == JV_FLOAT;
}

static double num_as_double(jv v) {
    return v.kind == JV_FLOAT ? v.u.f : v.kind == JV_INT ? (double)v.u.i : (double)v.u.b;
}

bool jv_truthy(jv v) {
    switch (v.kind) {
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.s->len != 0;
    case JV_LIST:
        return v.u.l->n != 0;
    case JV_DICT:
        return v.u.d->flavor != JV_DICT_PLAIN || v.u.d->n != 0;
    case JV_MACRO:
        return true;
    default:
        return false;
    }
}

static bool dict_equal(const jv_dict *a, const jv_dict *b) {
    if (a->n != b->n || a->flavor != b->flavor) return false;
    jv bd = {.kind = JV_DICT, .u.d = (jv_dict *)b};
    for (size_t i = 0; i < a->n; i++) {
        const jv *v = jv_dict_get(bd, a->keys[i]);
        if (!v || !jv_equal(a->vals[i], *v)) return false;
    }
    return true;
}

bool jv_equal(jv a, jv b) {
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT)
            return (a.kind == JV_INT ? a.u.i : a.u.b) == (b.kind == JV_INT ? b.u.i : b.u.b);
        return num_as_double(a) == num_as_double(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->data, b.u.s->data, a.u.s->len);
    case JV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->items[i], b.u.l->items[i])) return false;
        return true;
    case JV_DICT:
        return a.u.d == b.u.d || dict_equal(a.u.d, b.u.d);
    case JV_MACRO:
        return a.u.node == b.u.node;
    default:
        return false;
    }
}

di_status jv_compare(jv a, jv b, int *cmp) {
    if (jv_is_number(a) && jv_is_number(b)) {
        double x = num_as_double(a), y = num_as_double(b);
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t p = a.kind == JV_INT ? a.u.i : a.u.b, q = b.kind == JV_INT ? b.u.i : b.u.b;
            *cmp = (p > q) - (p < q);
        } else {
            *cmp = (x > y) - (x < y);
        }
        return DI_OK;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        /* UTF-8 byte order is code point order, which is what Python compares. */
        size_t n = DI_MIN(a.u.s->len, b.u.s->len);
        int c = memcmp(a.u.s->data, b.u.s->data, n);
        *cmp = c ? (c > 0) - (c < 0) : (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        return DI_OK;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = DI_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->items[i], b.u.l->items[i])) continue;
            return jv_compare(a.u.l->items[i], b.u.l->items[i], cmp);
        }
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return DI_OK;
    }
    return di_error(DI_ERR_INVALID_ARG, "'<' not supported between instances of '%s' and '%s'",
                    jv_type_name(a), jv_type_name(b));
}

const char *jv_type_name(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT:
        return v.u.d->flavor == JV_DICT_NAMESPACE ? "Namespace"
               : v.u.d->flavor == JV_DICT_LOOP    ? "LoopContext"
                                                  : "dict";
    case JV_MACRO:
        return "Macro";
    }
    return "object";
}

static int64_t utf8_count(const char *s, size_t len) {
    int64_t n = 0;
    for (size_t i = 0; i < len;) {
        jinja_utf8_next(s, len, &i);
        n++;
    }
    return n;
}

int64_t jv_length(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
        return 0;
    case JV_STR:
        return utf8_count(v.u.s->data, v.u.s->len);
    case JV_LIST:
        return (int64_t)v.u.l->n;
    case JV_DICT:
        return (int64_t)v.u.d->n;
    default:
        return -1;
    }
}

/* ========================================================================================== */
/* Buffers                                                                                     */
/* ========================================================================================== */

di_status jbuf_add(jbuf *b, const char *s, size_t n) {
    if (n > JINJA_MAX_STRING || b->len + n > JINJA_MAX_STRING)
        return di_error(DI_ERR_RANGE, "text exceeds the limit of %u bytes", JINJA_MAX_STRING);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = di_realloc(b->data, cap);
        if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot grow text to %zu bytes", cap);
        b->data = p;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return DI_OK;
}

di_status jbuf_adds(jbuf *b, const char *s) {
    return jbuf_add(b, s, strlen(s));
}

di_status jbuf_addf(jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return di_error(DI_ERR_INTERNAL, "format error");
    return jbuf_add(b, tmp, DI_MIN((size_t)n, sizeof tmp - 1));
}

di_status jbuf_to_str(jbuf *b, jv *out) {
    di_status st = jv_str_new(b->data ? b->data : "", b->len, out);
    jbuf_free(b);
    return st;
}

void jbuf_free(jbuf *b) {
    di_free(b->data);
    *b = (jbuf){0};
}

/* ========================================================================================== */
/* str() and repr()                                                                            */
/* ========================================================================================== */

/* Python's float repr: the shortest digits that round-trip, in fixed notation for decimal
 * exponents -4..15 and scientific notation otherwise. */
static di_status write_float(jbuf *b, double f) {
    if (isnan(f)) return jbuf_adds(b, "nan");
    if (isinf(f)) return jbuf_adds(b, f < 0 ? "-inf" : "inf");
    char sci[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, f);
        if (strtod(sci, NULL) == f) break;
    }
    /* sci is "[-]d[.ddd]e[+-]XX": split it into sign, digits and exponent. */
    char digits[24];
    size_t nd = 0;
    const char *p = sci;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int exp = atoi(p + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    return jbuf_adds(b, out);
}

/* Characters repr() escapes although they are not ASCII: C1 controls, and the Unicode
 * separators and format characters Python does not consider printable (common ones). */
static bool repr_escapes(uint32_t cp) {
    return (cp >= 0x80 && cp <= 0xa0) || cp == 0xad || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
           (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff ||
           (cp >= 0xd800 && cp <= 0xdfff);
}

static di_status write_str_repr(jbuf *b, const jv_str *s) {
    bool has_sq = memchr(s->data, '\'', s->len) != NULL;
    bool has_dq = memchr(s->data, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    di_status st = jbuf_add(b, &q, 1);
    for (size_t i = 0; i < s->len && st == DI_OK;) {
        size_t start = i;
        uint32_t cp = jinja_utf8_next(s->data, s->len, &i);
        if (cp == (uint32_t)q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            st = jbuf_add(b, e, 2);
        } else if (cp == '\n') {
            st = jbuf_adds(b, "\\n");
        } else if (cp == '\r') {
            st = jbuf_adds(b, "\\r");
        } else if (cp == '\t') {
            st = jbuf_adds(b, "\\t");
        } else if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0xff && repr_escapes(cp))) {
            st = jbuf_addf(b, "\\x%02x", cp);
        } else if (repr_escapes(cp)) {
            st = jbuf_addf(b, "\\u%04x", cp);
        } else {
            st = jbuf_add(b, s->data + start, i - start);
        }
    }
    return st == DI_OK ? jbuf_add(b, &q, 1) : st;
}

static di_status write_seq(jbuf *b, const jv_list *l) {
    di_status st = jbuf_adds(b, l->tuple ? "(" : "[");
    for (size_t i = 0; i < l->n && st == DI_OK; i++) {
        if (i) st = jbuf_adds(b, ", ");
        if (st == DI_OK) st = jv_write_repr(b, l->items[i]);
    }
    if (st == DI_OK && l->tuple && l->n == 1) st = jbuf_adds(b, ",");
    return st == DI_OK ? jbuf_adds(b, l->tuple ? ")" : "]") : st;
}

static di_status write_dict(jbuf *b, const jv_dict *d) {
    di_status st = DI_OK;
    if (d->flavor == JV_DICT_LOOP) return jbuf_adds(b, "<LoopContext>");
    if (d->flavor == JV_DICT_NAMESPACE) st = jbuf_adds(b, "<Namespace ");
    if (st == DI_OK) st = jbuf_adds(b, "{");
    for (size_t i = 0; i < d->n && st == DI_OK; i++) {
        if (i) st = jbuf_adds(b, ", ");
        if (st == DI_OK) st = jv_write_repr(b, d->keys[i]);
        if (st == DI_OK) st = jbuf_adds(b, ": ");
        if (st == DI_OK) st = jv_write_repr(b, d->vals[i]);
    }
    if (st == DI_OK) st = jbuf_adds(b, "}");
    if (st == DI_OK && d->flavor == JV_DICT_NAMESPACE) st = jbuf_adds(b, ">");
    return st;
}

static di_status write_common(jbuf *b, jv v, bool repr) {
    switch (v.kind) {
    case JV_UNDEF:
        return DI_OK;
    case JV_NONE:
        return jbuf_adds(b, "None");
    case JV_BOOL:
        return jbuf_adds(b, v.u.b ? "True" : "False");
    case JV_INT:
        return jbuf_addf(b, "%lld", (long long)v.u.i);
    case JV_FLOAT:
        return write_float(b, v.u.f);
    case JV_STR:
        return repr ? write_str_repr(b, v.u.s) : jbuf_add(b, v.u.s->data, v.u.s->len);
    case JV_LIST:
        return write_seq(b, v.u.l);
    case JV_DICT:
        return write_dict(b, v.u.d);
    case JV_MACRO:
        return jbuf_adds(b, "<Macro>");
    }
    return DI_OK;
}

di_status jv_write_str(jbuf *b, jv v) {
    return write_common(b, v, false);
}
di_status jv_write_repr(jbuf *b, jv v) {
    return write_common(b, v, true);
}

di_status jv_to_str(jv v, jv *out) {
    if (v.kind == JV_STR) {
        *out = jv_retain(v);
        return DI_OK;
    }
    jbuf b = {0};
    di_status st = jv_write_str(&b, v);
    if (st != DI_OK) {
        jbuf_free(&b);
        return st;
    }
    return jbuf_to_str(&b, out);
}
