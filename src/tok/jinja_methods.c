/*
 * jinja_methods.c -- the Python methods templates call on values: str.split/strip/
 * startswith/replace/..., dict.get/items/keys/values, loop.cycle; plus UTF-8 helpers.
 *
 * Design stance: behave like CPython's str methods on code points (whitespace is what
 * str.isspace() accepts); case mapping is ASCII-only. As in jinja2's
 * ImmutableSandboxedEnvironment, methods that modify a list or dict are refused.
 *
 * Invariants: results are new references; arguments are borrowed.
 */
#include "tok/jinja.h"

#include <ctype.h>
#include <string.h>

/* ========================================================================================== */
/* UTF-8                                                                                       */
/* ========================================================================================== */

uint32_t jinja_utf8_next(const char *s, size_t len, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t left = len - *i;
    uint32_t c = p[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n <= 1 || (size_t)n > left) {
        *i += 1;
        return c;
    }
    uint32_t cp = c & (0x7f >> n);
    for (int k = 1; k < n; k++) {
        if ((p[k] & 0xc0) != 0x80) {
            *i += 1;
            return c;
        }
        cp = (cp << 6) | (p[k] & 0x3f);
    }
    *i += (size_t)n;
    return cp;
}

bool jinja_is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ========================================================================================== */
/* Argument helpers                                                                            */
/* ========================================================================================== */

const jv *jinja_arg(const jinja_args *a, int pos, const char *name) {
    if (pos >= 0 && (size_t)pos < a->n_pos) return &a->pos[pos];
    for (size_t i = 0; name && i < a->n_kw; i++)
        if (!strcmp(a->kw_names[i], name)) return &a->kw[i];
    return NULL;
}

static bool arg_is_none(const jv *v) {
    return !v || v->kind == JV_NONE;
}

static di_status want_str(const jv *v, const char *what, const char *method) {
    if (v && v->kind == JV_STR) return DI_OK;
    return di_error(DI_ERR_INVALID_ARG, "%s() argument '%s' must be str, not %s", method, what,
                    v ? jv_type_name(*v) : "nothing");
}

/* ========================================================================================== */
/* str methods                                                                                 */
/* ========================================================================================== */

/* Is code point cp in the set given by chars (NULL: whitespace)? */
static bool in_set(uint32_t cp, const jv_str *chars) {
    if (!chars) return jinja_is_space(cp);
    for (size_t i = 0; i < chars->len;)
        if (jinja_utf8_next(chars->data, chars->len, &i) == cp) return true;
    return false;
}

static di_status str_strip(const jv_str *s, const jv_str *chars, bool left, bool right, jv *out) {
    size_t b = 0, e = s->len;
    if (left) {
        while (b < e) {
            size_t i = b;
            if (!in_set(jinja_utf8_next(s->data, s->len, &i), chars)) break;
            b = i;
        }
    }
    if (right) {
        size_t keep = b;
        for (size_t i = b; i < e;) {
            uint32_t cp = jinja_utf8_next(s->data, e, &i);
            if (!in_set(cp, chars)) keep = i;
        }
        e = keep;
    }
    return jv_str_new(s->data + b, e - b, out);
}

static size_t find_bytes(const char *h, size_t n, const char *needle, size_t m, size_t from) {
    for (size_t i = from; i + m <= n; i++)
        if (!memcmp(h + i, needle, m)) return i;
    return (size_t)-1;
}

static size_t rfind_bytes(const char *h, size_t n, const char *needle, size_t m, size_t end) {
    for (size_t i = end >= m ? end - m + 1 : 0; i-- > 0;)
        if (!memcmp(h + i, needle, m)) return i;
    return (size_t)-1;
}

static di_status push_piece(jv list, const char *s, size_t n) {
    jv piece;
    di_status st = jv_str_new(s, n, &piece);
    return st == DI_OK ? jv_list_push(list, piece) : st;
}

/* str.split / str.rsplit with an explicit separator. */
static di_status split_sep(const jv_str *s, const jv_str *sep, int64_t maxsplit, bool rev,
                           jv *out) {
    if (sep->len == 0) return di_error(DI_ERR_INVALID_ARG, "empty separator");
    di_status st = jv_list_new(false, out);
    if (!rev) {
        size_t start = 0, hit;
        while (st == DI_OK && maxsplit-- != 0 &&
               (hit = find_bytes(s->data, s->len, sep->data, sep->len, start)) != (size_t)-1) {
            st = push_piece(*out, s->data + start, hit - start);
            start = hit + sep->len;
        }
        return st == DI_OK ? push_piece(*out, s->data + start, s->len - start) : st;
    }
    /* rsplit: collect pieces from the right, then reverse. */
    size_t end = s->len, hit;
    while (st == DI_OK && maxsplit-- != 0 &&
           (hit = rfind_bytes(s->data, end, sep->data, sep->len, end)) != (size_t)-1) {
        st = push_piece(*out, s->data + hit + sep->len, end - hit - sep->len);
        end = hit;
    }
    if (st == DI_OK) st = push_piece(*out, s->data, end);
    jv_list *l = out->u.l;
    for (size_t i = 0; st == DI_OK && i < l->n / 2; i++) {
        jv t = l->items[i];
        l->items[i] = l->items[l->n - 1 - i];
        l->items[l->n - 1 - i] = t;
    }
    return st;
}

/* str.split() without a separator: runs of whitespace separate, empty pieces vanish. */
static di_status split_ws(const jv_str *s, int64_t maxsplit, jv *out) {
    di_status st = jv_list_new(false, out);
    size_t i = 0;
    while (st == DI_OK && i < s->len) {
        size_t j = i;
        while (i < s->len && jinja_is_space(jinja_utf8_next(s->data, s->len, &j)))
            i = j;
        if (i >= s->len) break;
        size_t start = i;
        if (maxsplit-- == 0) /* the rest, as it is */
            return push_piece(*out, s->data + start, s->len - start);
        j = i;
        while (i < s->len && !jinja_is_space(jinja_utf8_next(s->data, s->len, &j)))
            i = j;
        st = push_piece(*out, s->data + start, i - start);
    }
    return st;
}

static bool has_affix(const jv_str *s, const jv_str *a, bool prefix) {
    if (a->len > s->len) return false;
    return !memcmp(prefix ? s->data : s->data + s->len - a->len, a->data, a->len);
}

static di_status str_affix(const jv_str *s, const jv *arg, bool prefix, jv *out) {
    const char *m = prefix ? "startswith" : "endswith";
    if (arg && arg->kind == JV_LIST && arg->u.l->tuple) {
        bool any = false;
        for (size_t i = 0; i < arg->u.l->n; i++) {
            di_status st = want_str(&arg->u.l->items[i], "prefix", m);
            if (st != DI_OK) return st;
            any |= has_affix(s, arg->u.l->items[i].u.s, prefix);
        }
        *out = jv_bool(any);
        return DI_OK;
    }
    di_status st = want_str(arg, "prefix", m);
    if (st == DI_OK) *out = jv_bool(has_affix(s, arg->u.s, prefix));
    return st;
}

static di_status str_replace(const jv_str *s, const jv *a0, const jv *a1, const jv *a2, jv *out) {
    di_status st = want_str(a0, "old", "replace");
    if (st == DI_OK) st = want_str(a1, "new", "replace");
    if (st != DI_OK) return st;
    int64_t count = a2 && a2->kind == JV_INT ? a2->u.i : -1;
    const jv_str *old = a0->u.s, *new_ = a1->u.s;
    jbuf b = {0};
    size_t i = 0;
    while (st == DI_OK && i <= s->len) {
        size_t hit = count == 0      ? (size_t)-1
                     : old->len == 0 ? i
                                     : find_bytes(s->data, s->len, old->data, old->len, i);
        if (hit == (size_t)-1) {
            st = jbuf_add(&b, s->data + i, s->len - i);
            break;
        }
        st = jbuf_add(&b, s->data + i, hit - i);
        if (st == DI_OK) st = jbuf_add(&b, new_->data, new_->len);
        count--;
        if (old->len == 0) { /* "" matches between every character */
            if (hit >= s->len) break;
            size_t next = hit;
            jinja_utf8_next(s->data, s->len, &next);
            if (st == DI_OK) st = jbuf_add(&b, s->data + hit, next - hit);
            i = next;
            if (i == s->len && st == DI_OK && count != 0) st = jbuf_add(&b, new_->data, new_->len);
            if (i == s->len) break;
        } else {
            i = hit + old->len;
        }
    }
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status str_case(const jv_str *s, char mode, jv *out) {
    di_status st = jv_str_new(s->data, s->len, out);
    if (st != DI_OK) return st;
    char *d = out->u.s->data;
    bool word_start = true;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)d[i];
        bool upper = mode == 'U' || (mode == 'T' && word_start) || (mode == 'C' && i == 0);
        if (c < 0x80) d[i] = (char)(upper ? toupper(c) : tolower(c));
        word_start = !isalpha(c);
    }
    return DI_OK;
}

static di_status str_join(const jv_str *sep, const jv *items, jv *out) {
    jv list;
    di_status st = items ? jinja_iterate(*items, &list)
                         : di_error(DI_ERR_INVALID_ARG, "join() takes exactly one argument");
    if (st != DI_OK) return st;
    jbuf b = {0};
    for (size_t i = 0; i < list.u.l->n && st == DI_OK; i++) {
        jv it = list.u.l->items[i];
        if (it.kind != JV_STR)
            st = di_error(DI_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found",
                          i, jv_type_name(it));
        if (st == DI_OK && i) st = jbuf_add(&b, sep->data, sep->len);
        if (st == DI_OK) st = jbuf_add(&b, it.u.s->data, it.u.s->len);
    }
    jv_release(list);
    if (st == DI_OK) return jbuf_to_str(&b, out);
    jbuf_free(&b);
    return st;
}

static di_status str_find(const jv_str *s, const jv *sub, bool rev, bool count, jv *out) {
    di_status st = want_str(sub, "sub", count ? "count" : rev ? "rfind" : "find");
    if (st != DI_OK) return st;
    const jv_str *n = sub->u.s;
    if (count) {
        int64_t c = 0;
        if (!n->len) c = jv_length((jv){.kind = JV_STR, .u.s = (jv_str *)s}) + 1;
        for (size_t i = 0, h;
             n->len && (h = find_bytes(s->data, s->len, n->data, n->len, i)) != (size_t)-1;
             i = h + n->len)
            c++;
        *out = jv_int(c);
        return DI_OK;
    }
    size_t h = rev ? rfind_bytes(s->data, s->len, n->data, n->len, s->len)
                   : find_bytes(s->data, s->len, n->data, n->len, 0);
    if (h == (size_t)-1) {
        *out = jv_int(-1);
        return DI_OK;
    }
    jv prefix; /* index in code points */
    st = jv_str_new(s->data, h, &prefix);
    if (st == DI_OK) *out = jv_int(jv_length(prefix));
    jv_release(prefix);
    return st;
}

static di_status str_method(jv obj, const char *name, const jinja_args *a, jv *out, bool *found) {
    const jv_str *s = obj.u.s;
    const jv *a0 = jinja_arg(a, 0, NULL), *a1 = jinja_arg(a, 1, NULL);
    *found = true;
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        if (!arg_is_none(a0) && a0->kind != JV_STR) return want_str(a0, "chars", name);
        return str_strip(s, arg_is_none(a0) ? NULL : a0->u.s, name[0] != 'r', name[0] != 'l', out);
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const jv *sep = jinja_arg(a, 0, "sep"), *ms = jinja_arg(a, 1, "maxsplit");
        int64_t maxsplit = ms && ms->kind == JV_INT ? ms->u.i : -1;
        if (arg_is_none(sep)) return split_ws(s, maxsplit, out); /* rsplit() alike enough */
        di_status st = want_str(sep, "sep", name);
        return st == DI_OK ? split_sep(s, sep->u.s, maxsplit, name[0] == 'r', out) : st;
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith"))
        return str_affix(s, a0, name[0] == 's', out);
    if (!strcmp(name, "replace")) return str_replace(s, a0, a1, jinja_arg(a, 2, "count"), out);
    if (!strcmp(name, "lower")) return str_case(s, 'L', out);
    if (!strcmp(name, "upper")) return str_case(s, 'U', out);
    if (!strcmp(name, "title")) return str_case(s, 'T', out);
    if (!strcmp(name, "capitalize")) return str_case(s, 'C', out);
    if (!strcmp(name, "join")) return str_join(s, a0, out);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count"))
        return str_find(s, a0, name[0] == 'r', name[0] == 'c', out);
    *found = false;
    return DI_OK;
}

/* ========================================================================================== */
/* dict methods, loop.cycle, dispatch                                                          */
/* ========================================================================================== */

static di_status dict_method(jv obj, const char *name, const jinja_args *a, jv *out, bool *found) {
    const jv_dict *d = obj.u.d;
    *found = true;
    if (!strcmp(name, "get")) {
        const jv *k = jinja_arg(a, 0, NULL), *def = jinja_arg(a, 1, NULL);
        if (!k) return di_error(DI_ERR_INVALID_ARG, "get expected at least 1 argument, got 0");
        const jv *v = jv_dict_get(obj, *k);
        *out = v ? jv_retain(*v) : def ? jv_retain(*def) : jv_none();
        return DI_OK;
    }
    bool items = !strcmp(name, "items"), keys = !strcmp(name, "keys"),
         vals = !strcmp(name, "values");
    if (!items && !keys && !vals) {
        *found = false;
        return DI_OK;
    }
    di_status st = jv_list_new(false, out);
    for (size_t i = 0; i < d->n && st == DI_OK; i++) {
        if (!items) {
            st = jv_list_push(*out, jv_retain(keys ? d->keys[i] : d->vals[i]));
            continue;
        }
        jv pair;
        st = jv_list_new(true, &pair);
        if (st == DI_OK) st = jv_list_push(pair, jv_retain(d->keys[i]));
        if (st == DI_OK) st = jv_list_push(pair, jv_retain(d->vals[i]));
        if (st == DI_OK)
            st = jv_list_push(*out, pair);
        else
            jv_release(pair);
    }
    return st;
}

di_status jinja_call_method(jinja_eval *ev, jv obj, const char *name, const jinja_args *a, jv *out,
                            bool *found) {
    static const char *const unsafe[] = {"append",  "extend", "insert", "pop",
                                         "remove",  "clear",  "update", "setdefault",
                                         "popitem", "sort",   "reverse"};
    DI_UNUSED(ev);
    *out = jv_none();
    *found = false;
    if (obj.kind == JV_STR) return str_method(obj, name, a, out, found);
    if (obj.kind == JV_DICT && obj.u.d->flavor == JV_DICT_LOOP && !strcmp(name, "cycle")) {
        const jv *idx = jv_dict_get_cstr(obj, "index0");
        *found = true;
        if (a->n_pos == 0) return di_error(DI_ERR_INVALID_ARG, "no items for cycling given");
        *out = jv_retain(a->pos[(size_t)idx->u.i % a->n_pos]);
        return DI_OK;
    }
    if (obj.kind == JV_DICT && obj.u.d->flavor == JV_DICT_PLAIN) {
        di_status st = dict_method(obj, name, a, out, found);
        if (st != DI_OK || *found) return st;
    }
    if (obj.kind == JV_LIST || obj.kind == JV_DICT)
        for (size_t i = 0; i < DI_ARRAY_LEN(unsafe); i++)
            if (!strcmp(name, unsafe[i]))
                return di_error(DI_ERR_INVALID_ARG,
                                "access to attribute '%s' of '%s' object is "
                                "unsafe",
                                name, jv_type_name(obj));
    return DI_OK;
}
