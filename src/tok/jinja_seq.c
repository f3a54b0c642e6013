/*
 * jinja_seq.c -- jinja2's filters over sequences: join, first, last, list, items, dictsort,
 * select/reject(attr), map, unique, sort, min, max, sum.
 *
 * Design stance: every filter first turns its input into a list with jinja_iterate (so
 * strings iterate by character, dicts by key, Undefined as empty), then works on that.
 * Attribute paths ("a.b.0") are looked up like jinja2's make_attrgetter. Sorting is a
 * stable merge sort whose comparisons may fail (Python's TypeError), so errors propagate
 * instead of being lost in qsort. Case-insensitive comparisons lower-case ASCII only.
 *
 * Invariants: results are new references; arguments are borrowed.
 */
#include "tok/jinja.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Looks up a dotted attribute path in v; missing parts give Undefined. */
static di_status get_path(jv v, const char *path, jv *out) {
    *out = jv_retain(v);
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++)
            digits &= isdigit((unsigned char)path[i]) != 0;
        jv key, next;
        di_status st =
            digits ? (key = jv_int(strtoll(path, NULL, 10)), DI_OK) : jv_str_new(path, n, &key);
        if (st == DI_OK) st = jinja_getitem(*out, key, &next);
        jv_release(key);
        jv_release(*out);
        *out = jv_none();
        if (st != DI_OK) return st;
        *out = next;
        path += n + (dot ? 1 : 0);
    }
    return DI_OK;
}

static const char *attr_arg(const jinja_args *a, int pos) {
    const jv *v = jinja_arg(a, pos, "attribute");
    return v && v->kind == JV_STR ? v->u.s->data : NULL;
}

/* The items of v, each replaced by its attribute when attr is given. */
static di_status items_of(jv v, const char *attr, jv *out) {
    jv all;
    di_status st = jinja_iterate(v, &all);
    if (st != DI_OK || !attr) {
        *out = all;
        return st;
    }
    st = jv_list_new(false, out);
    for (size_t i = 0; i < all.u.l->n && st == DI_OK; i++) {
        jv x;
        st = get_path(all.u.l->items[i], attr, &x);
        if (st == DI_OK) st = jv_list_push(*out, x);
    }
    jv_release(all);
    return st;
}

/* ========================================================================================== */
/* Sorting                                                                                     */
/* ========================================================================================== */

typedef struct sort_ctx {
    bool case_sensitive;
    di_status st;
} sort_ctx;

/* Comparison key: strings lower-cased unless case_sensitive. */
static di_status sort_key(jv v, bool case_sensitive, jv *out) {
    if (case_sensitive || v.kind != JV_STR) {
        *out = jv_retain(v);
        return DI_OK;
    }
    di_status st = jv_str_new(v.u.s->data, v.u.s->len, out);
    for (size_t i = 0; st == DI_OK && i < out->u.s->len; i++)
        out->u.s->data[i] = (char)tolower((unsigned char)out->u.s->data[i]);
    return st;
}

static int cmp_keys(sort_ctx *c, jv a, jv b) {
    int r = 0;
    if (c->st == DI_OK) c->st = jv_compare(a, b, &r);
    return r;
}

/* Stable merge sort of idx[0..n) by keys[idx[i]]. */
static void merge_sort(sort_ctx *c, const jv *keys, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, keys, idx, tmp, h);
    merge_sort(c, keys, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = cmp_keys(c, keys[idx[j]], keys[idx[i]]) < 0 ? idx[j++] : idx[i++];
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* Sorts items by key_of(item) (its attribute path, or the item itself); *out is a list. */
static di_status sorted(jv items, const char *attr, bool case_sensitive, bool reverse, jv *out) {
    size_t n = items.u.l->n;
    *out = jv_none();
    jv *keys = di_calloc(n + 1, sizeof *keys);
    size_t *idx = di_calloc(2 * n + 1, sizeof *idx);
    di_status st = keys && idx ? DI_OK : di_error(DI_ERR_OUT_OF_MEMORY, "sort: cannot allocate");
    for (size_t i = 0; i < n && st == DI_OK; i++) {
        jv k = jv_none();
        idx[i] = i;
        st = attr ? get_path(items.u.l->items[i], attr, &k)
                  : (k = jv_retain(items.u.l->items[i]), DI_OK);
        if (st == DI_OK) st = sort_key(k, case_sensitive, &keys[i]);
        jv_release(k);
    }
    sort_ctx c = {.case_sensitive = case_sensitive, .st = st};
    if (st == DI_OK) merge_sort(&c, keys, idx, idx + n, n);
    st = c.st;
    if (st == DI_OK) st = jv_list_new(false, out);
    for (size_t i = 0; i < n && st == DI_OK; i++)
        st = jv_list_push(*out, jv_retain(items.u.l->items[idx[reverse ? n - 1 - i : i]]));
    for (size_t i = 0; keys && i < n; i++)
        jv_release(keys[i]);
    di_free(keys);
    di_free(idx);
    if (st != DI_OK) {
        jv_release(*out);
        *out = jv_none();
    }
    return st;
}

/* ========================================================================================== */
/* Filters                                                                                     */
/* ========================================================================================== */

static di_status f_join(jv items, const jinja_args *a, jv *out) {
    const jv *sep = jinja_arg(a, 0, "d");
    jbuf b = {0};
    di_status st = DI_OK;
    for (size_t i = 0; i < items.u.l->n && st == DI_OK; i++) {
        if (i && sep) st = jv_write_str(&b, *sep);
        if (st == DI_OK) st = jv_write_str(&b, items.u.l->items[i]);
    }
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status f_items(jv v, jv *out) {
    if (v.kind == JV_UNDEF) return jv_list_new(false, out);
    if (v.kind != JV_DICT || v.u.d->flavor != JV_DICT_PLAIN)
        return di_error(DI_ERR_INVALID_ARG, "Can only get item pairs from a mapping.");
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; i < v.u.d->n && st == DI_OK; i++) {
        jv pair;
        st = jv_list_new(true, &pair);
        if (st == DI_OK) st = jv_list_push(pair, jv_retain(v.u.d->keys[i]));
        if (st == DI_OK) st = jv_list_push(pair, jv_retain(v.u.d->vals[i]));
        if (st == DI_OK)
            st = jv_list_push(*out, pair);
        else
            jv_release(pair);
    }
    return st;
}

/* select/reject (attr == false) and selectattr/rejectattr (attr == true). */
static di_status f_select(jinja_eval *ev, jv items, const jinja_args *a, bool attr, bool keep,
                          jv *out) {
    const jv *path = attr ? jinja_arg(a, 0, NULL) : NULL;
    if (attr && (!path || path->kind != JV_STR))
        return di_error(DI_ERR_INVALID_ARG, "selectattr/rejectattr need an attribute name");
    size_t t = attr ? 1 : 0;
    const jv *test = jinja_arg(a, (int)t, NULL);
    if (test && (test->kind != JV_STR || !jinja_test_exists(test->u.s->data)))
        return di_error(DI_ERR_INVALID_ARG, "no test named %s",
                        test->kind == JV_STR ? test->u.s->data : "(not a string)");
    jinja_args targs = {.pos = a->pos + DI_MIN(t + 1, a->n_pos),
                        .n_pos = a->n_pos > t + 1 ? a->n_pos - t - 1 : 0};
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; i < items.u.l->n && st == DI_OK; i++) {
        jv x = jv_none();
        bool r = false;
        st = attr ? get_path(items.u.l->items[i], path->u.s->data, &x)
                  : (x = jv_retain(items.u.l->items[i]), DI_OK);
        if (st == DI_OK && test)
            st = jinja_apply_test(ev, test->u.s->data, x, &targs, &r);
        else if (st == DI_OK)
            r = jv_truthy(x);
        jv_release(x);
        if (st == DI_OK && r == keep) st = jv_list_push(*out, jv_retain(items.u.l->items[i]));
    }
    return st;
}

static di_status f_map(jinja_eval *ev, jv items, const jinja_args *a, jv *out) {
    const char *attr = attr_arg(a, -1);
    const jv *def = jinja_arg(a, -1, "default"), *filter = jinja_arg(a, 0, NULL);
    if (!attr && (!filter || filter->kind != JV_STR || !jinja_filter_exists(filter->u.s->data)))
        return di_error(DI_ERR_INVALID_ARG, "map needs attribute= or the name of a filter");
    jinja_args fargs = {.pos = a->pos + DI_MIN((size_t)1, a->n_pos),
                        .n_pos = a->n_pos ? a->n_pos - 1 : 0};
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; i < items.u.l->n && st == DI_OK; i++) {
        jv x = jv_none();
        if (attr) {
            st = get_path(items.u.l->items[i], attr, &x);
            if (st == DI_OK && x.kind == JV_UNDEF && def) {
                jv_release(x);
                x = jv_retain(*def);
            }
        } else {
            st = jinja_apply_filter(ev, filter->u.s->data, items.u.l->items[i], &fargs, &x);
        }
        if (st == DI_OK)
            st = jv_list_push(*out, x);
        else
            jv_release(x);
    }
    return st;
}

static di_status f_unique(jv items, const jinja_args *a, jv *out) {
    bool cs = jinja_arg(a, 0, "case_sensitive") && jv_truthy(*jinja_arg(a, 0, "case_sensitive"));
    const char *attr = attr_arg(a, 1);
    jv seen;
    di_status st = jv_list_new(false, &seen);
    if (st == DI_OK) st = jv_list_new(false, out);
    for (size_t i = 0; i < items.u.l->n && st == DI_OK; i++) {
        jv x = jv_none(), k = jv_none();
        bool dup = false;
        st = attr ? get_path(items.u.l->items[i], attr, &x)
                  : (x = jv_retain(items.u.l->items[i]), DI_OK);
        if (st == DI_OK) st = sort_key(x, cs, &k);
        if (st == DI_OK) st = jinja_contains(seen, k, &dup);
        if (st == DI_OK && !dup) {
            st = jv_list_push(seen, jv_retain(k));
            if (st == DI_OK) st = jv_list_push(*out, jv_retain(items.u.l->items[i]));
        }
        jv_release(x);
        jv_release(k);
    }
    jv_release(seen);
    return st;
}

static di_status f_minmax(jv items, const jinja_args *a, bool max, jv *out) {
    bool cs = jinja_arg(a, 0, "case_sensitive") && jv_truthy(*jinja_arg(a, 0, "case_sensitive"));
    if (items.u.l->n == 0) return jv_undef_msg(out, "No aggregated item, sequence was empty.");
    jv s;
    di_status st = sorted(items, attr_arg(a, 1), cs, false, &s);
    if (st == DI_OK) *out = jv_retain(s.u.l->items[max ? s.u.l->n - 1 : 0]);
    jv_release(s);
    return st;
}

static di_status f_sum(jv items, const jinja_args *a, jv *out) {
    const jv *start = jinja_arg(a, 1, "start");
    jv acc = start ? jv_retain(*start) : jv_int(0), vals;
    di_status st = items_of(items, attr_arg(a, 0), &vals);
    for (size_t i = 0; st == DI_OK && i < vals.u.l->n; i++) {
        jv next;
        st = jinja_binary('+', acc, vals.u.l->items[i], &next);
        jv_release(acc);
        acc = st == DI_OK ? next : jv_none();
    }
    jv_release(vals);
    *out = acc;
    return st;
}

static di_status f_dictsort(jv v, const jinja_args *a, jv *out) {
    bool cs = jinja_arg(a, 0, "case_sensitive") && jv_truthy(*jinja_arg(a, 0, "case_sensitive"));
    const jv *by = jinja_arg(a, 1, "by");
    bool rev = jinja_arg(a, 2, "reverse") && jv_truthy(*jinja_arg(a, 2, "reverse"));
    bool by_value = by && by->kind == JV_STR && !strcmp(by->u.s->data, "value");
    jv pairs;
    di_status st = f_items(v, &pairs);
    if (st != DI_OK) return st;
    st = sorted(pairs, by_value ? "1" : "0", cs, rev, out);
    jv_release(pairs);
    return st;
}

di_status jinja_seq_filter(jinja_eval *ev, const char *name, jv v, const jinja_args *a, jv *out,
                           bool *found) {
    static const char *const names[] = {"join",   "first",      "last",       "list", "select",
                                        "reject", "selectattr", "rejectattr", "map",  "unique",
                                        "sort",   "min",        "max",        "sum",  NULL};
    *found = true;
    if (!strcmp(name, "items")) return f_items(v, out);
    if (!strcmp(name, "dictsort")) return f_dictsort(v, a, out);
    size_t k = 0;
    while (names[k] && strcmp(names[k], name))
        k++;
    if (!names[k]) {
        *found = false;
        return DI_OK;
    }
    jv items;
    di_status st = items_of(v, !strcmp(name, "join") ? attr_arg(a, 1) : NULL, &items);
    if (st != DI_OK) return st;
    size_t n = items.u.l->n;
    switch (k) {
    case 0:
        st = f_join(items, a, out);
        break;
    case 1:
    case 2:
        if (n)
            *out = jv_retain(items.u.l->items[k == 1 ? 0 : n - 1]);
        else
            st = jv_undef_msg(out, "No %s item, sequence was empty.", k == 1 ? "first" : "last");
        break;
    case 3:
        *out = jv_retain(items);
        break;
    case 4:
    case 5:
        st = f_select(ev, items, a, false, k == 4, out);
        break;
    case 6:
    case 7:
        st = f_select(ev, items, a, true, k == 6, out);
        break;
    case 8:
        st = f_map(ev, items, a, out);
        break;
    case 9:
        st = f_unique(items, a, out);
        break;
    case 10: {
        const jv *rev = jinja_arg(a, 0, "reverse"), *cs = jinja_arg(a, 1, "case_sensitive");
        st = sorted(items, attr_arg(a, 2), cs && jv_truthy(*cs), rev && jv_truthy(*rev), out);
        break;
    }
    case 11:
    case 12:
        st = f_minmax(items, a, k == 12, out);
        break;
    default:
        st = f_sum(items, a, out);
        break;
    }
    jv_release(items);
    return st;
}
