/*
 * jinja_json.c -- JSON in and out of the Jinja value type: jansson values become template
 * variables, and the tojson filter writes what Python's json.dumps writes.
 *
 * Design stance: the tojson filter of transformers is json.dumps(x, ensure_ascii=False,
 * indent=None, separators=None, sort_keys=False), so the defaults reproduce that call:
 * ", " and ": " separators on one line, "," and ": " with an indent, non-ASCII unescaped.
 *
 * Invariants: output goes through jbuf, which bounds its size; recursion is bounded by
 * JINJA_MAX_DEPTH.
 */
#include "tok/jinja.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================================== */
/* jansson -> value                                                                            */
/* ========================================================================================== */

static di_status from_json(const json_t *j, jv *out, int depth);

static di_status from_json_array(const json_t *j, jv *out, int depth) {
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; st == DI_OK && i < json_array_size(j); i++) {
        jv item;
        st = from_json(json_array_get(j, i), &item, depth + 1);
        if (st == DI_OK) st = jv_list_push(*out, item);
    }
    return st;
}

static di_status from_json_object(const json_t *j, jv *out, int depth) {
    di_status st = jv_dict_new(JV_DICT_PLAIN, out);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val) {
        if (st != DI_OK) break;
        jv v;
        st = from_json(val, &v, depth + 1);
        if (st == DI_OK) st = jv_dict_set_cstr(*out, key, v);
    }
    return st;
}

static di_status from_json(const json_t *j, jv *out, int depth) {
    *out = jv_none();
    if (depth > JINJA_MAX_DEPTH)
        return di_error(DI_ERR_RANGE, "JSON nested deeper than %d levels", JINJA_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        return from_json_object(j, out, depth);
    case JSON_ARRAY:
        return from_json_array(j, out, depth);
    case JSON_STRING:
        return jv_str_new(json_string_value(j), json_string_length(j), out);
    case JSON_INTEGER:
        *out = jv_int((int64_t)json_integer_value(j));
        return DI_OK;
    case JSON_REAL:
        *out = jv_float(json_real_value(j));
        return DI_OK;
    case JSON_TRUE:
        *out = jv_bool(true);
        return DI_OK;
    case JSON_FALSE:
        *out = jv_bool(false);
        return DI_OK;
    case JSON_NULL:
        return DI_OK;
    }
    return DI_OK;
}

di_status jv_from_json(const json_t *j, jv *out) {
    di_status st = from_json(j, out, 0);
    if (st != DI_OK) {
        jv_release(*out);
        *out = jv_none();
    }
    return st;
}

/* ========================================================================================== */
/* value -> JSON text                                                                          */
/* ========================================================================================== */

typedef struct json_writer {
    jbuf *b;
    const jv_json_opts *o;
    bool pretty;
    const char *item_sep, *key_sep;
} json_writer;

static di_status write_value(json_writer *w, jv v, int depth);

static di_status write_string(json_writer *w, const char *s, size_t len) {
    jbuf *b = w->b;
    di_status st = jbuf_adds(b, "\"");
    for (size_t i = 0; i < len && st == DI_OK;) {
        size_t start = i;
        uint32_t cp = jinja_utf8_next(s, len, &i);
        switch (cp) {
        case '"':
            st = jbuf_adds(b, "\\\"");
            break;
        case '\\':
            st = jbuf_adds(b, "\\\\");
            break;
        case '\n':
            st = jbuf_adds(b, "\\n");
            break;
        case '\r':
            st = jbuf_adds(b, "\\r");
            break;
        case '\t':
            st = jbuf_adds(b, "\\t");
            break;
        case '\b':
            st = jbuf_adds(b, "\\b");
            break;
        case '\f':
            st = jbuf_adds(b, "\\f");
            break;
        default:
            if (cp < 0x20 || (w->o->ensure_ascii && cp > 0x7e)) {
                if (cp >= 0x10000) {
                    uint32_t c = cp - 0x10000;
                    st = jbuf_addf(b, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
                } else {
                    st = jbuf_addf(b, "\\u%04x", cp);
                }
            } else {
                st = jbuf_add(b, s + start, i - start);
            }
        }
    }
    return st == DI_OK ? jbuf_adds(b, "\"") : st;
}

static di_status write_newline(json_writer *w, int depth) {
    if (!w->pretty) return DI_OK;
    di_status st = jbuf_adds(w->b, "\n");
    for (int i = 0; i < depth && st == DI_OK; i++) {
        if (w->o->indent_str)
            st = jbuf_adds(w->b, w->o->indent_str);
        else
            for (int64_t k = 0; k < w->o->indent && st == DI_OK; k++)
                st = jbuf_adds(w->b, " ");
    }
    return st;
}

static di_status write_list(json_writer *w, const jv_list *l, int depth) {
    if (l->n == 0) return jbuf_adds(w->b, "[]");
    di_status st = jbuf_adds(w->b, "[");
    for (size_t i = 0; i < l->n && st == DI_OK; i++) {
        if (i) st = jbuf_adds(w->b, w->item_sep);
        if (st == DI_OK) st = write_newline(w, depth + 1);
        if (st == DI_OK) st = write_value(w, l->items[i], depth + 1);
    }
    if (st == DI_OK) st = write_newline(w, depth);
    return st == DI_OK ? jbuf_adds(w->b, "]") : st;
}

/* json.dumps turns non-string keys into strings the JSON way (true, null, 1.5). */
static di_status write_key(json_writer *w, jv k) {
    jbuf kb = {0};
    di_status st;
    switch (k.kind) {
    case JV_STR:
        return write_string(w, k.u.s->data, k.u.s->len);
    case JV_BOOL:
        st = jbuf_adds(&kb, k.u.b ? "true" : "false");
        break;
    case JV_NONE:
        st = jbuf_adds(&kb, "null");
        break;
    case JV_INT:
    case JV_FLOAT:
        st = jv_write_str(&kb, k);
        break;
    default:
        return di_error(DI_ERR_INVALID_ARG, "keys must be str, int, float, bool or None, not %s",
                        jv_type_name(k));
    }
    if (st == DI_OK) st = write_string(w, kb.data ? kb.data : "", kb.len);
    jbuf_free(&kb);
    return st;
}

static int compare_keys(const void *pa, const void *pb) {
    const jv *a = *(const jv *const *)pa, *b = *(const jv *const *)pb;
    int c = 0;
    if (jv_compare(*a, *b, &c) != DI_OK) return 0;
    return c;
}

static di_status write_dict(json_writer *w, const jv_dict *d, int depth) {
    if (d->flavor != JV_DICT_PLAIN)
        return di_error(DI_ERR_INVALID_ARG, "Object of type %s is not JSON serializable",
                        d->flavor == JV_DICT_NAMESPACE ? "Namespace" : "LoopContext");
    if (d->n == 0) return jbuf_adds(w->b, "{}");
    /* Order of output: insertion order, or sorted keys (an index array sorted by key). */
    const jv **order = di_malloc(d->n * sizeof *order);
    if (!order) return di_error(DI_ERR_OUT_OF_MEMORY, "tojson: cannot allocate");
    for (size_t i = 0; i < d->n; i++)
        order[i] = &d->keys[i];
    if (w->o->sort_keys) qsort(order, d->n, sizeof *order, compare_keys);
    di_status st = jbuf_adds(w->b, "{");
    for (size_t i = 0; i < d->n && st == DI_OK; i++) {
        size_t idx = (size_t)(order[i] - d->keys);
        if (i) st = jbuf_adds(w->b, w->item_sep);
        if (st == DI_OK) st = write_newline(w, depth + 1);
        if (st == DI_OK) st = write_key(w, d->keys[idx]);
        if (st == DI_OK) st = jbuf_adds(w->b, w->key_sep);
        if (st == DI_OK) st = write_value(w, d->vals[idx], depth + 1);
    }
    di_free(order);
    if (st == DI_OK) st = write_newline(w, depth);
    return st == DI_OK ? jbuf_adds(w->b, "}") : st;
}

static di_status write_value(json_writer *w, jv v, int depth) {
    if (depth > JINJA_MAX_DEPTH)
        return di_error(DI_ERR_RANGE, "tojson: nested deeper than %d levels", JINJA_MAX_DEPTH);
    switch (v.kind) {
    case JV_NONE:
        return jbuf_adds(w->b, "null");
    case JV_BOOL:
        return jbuf_adds(w->b, v.u.b ? "true" : "false");
    case JV_INT:
        return jv_write_str(w->b, v);
    case JV_FLOAT:
        if (isnan(v.u.f)) return jbuf_adds(w->b, "NaN");
        if (isinf(v.u.f)) return jbuf_adds(w->b, v.u.f < 0 ? "-Infinity" : "Infinity");
        return jv_write_str(w->b, v);
    case JV_STR:
        return write_string(w, v.u.s->data, v.u.s->len);
    case JV_LIST:
        return write_list(w, v.u.l, depth);
    case JV_DICT:
        return write_dict(w, v.u.d, depth);
    default:
        return di_error(DI_ERR_INVALID_ARG, "Object of type %s is not JSON serializable",
                        jv_type_name(v));
    }
}

di_status jv_write_json(jbuf *b, jv v, const jv_json_opts *opts) {
    json_writer w = {.b = b, .o = opts};
    w.pretty = opts->indent >= 0 || opts->indent_str != NULL;
    w.item_sep = opts->item_sep ? opts->item_sep : w.pretty ? "," : ", ";
    w.key_sep = opts->key_sep ? opts->key_sep : ": ";
    return write_value(&w, v, 0);
}
