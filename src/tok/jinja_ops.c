/*
 * jinja_ops.c -- operators and element access with Python's semantics: arithmetic on ints,
 * floats, strings and lists, comparisons, "in", attribute/item lookup, slicing, iteration.
 *
 * Design stance: match what jinja2 does on top of Python. Missing attributes, keys and
 * out-of-range indexes give Undefined (jinja2's getattr/getitem), while using an Undefined
 * in arithmetic, attribute access or ordering is an error that carries its message.
 * Python ints are unbounded; ours are int64 and overflow is reported, never wrapped.
 *
 * Invariants: results are new references; sizes grow only through jv_* constructors,
 * which enforce the limits of jinja.h.
 */
#include "tok/jinja.h"

#include <math.h>
#include <string.h>

di_status jinja_undefined_error(jv v) {
    if (v.kind == JV_UNDEF && v.u.s) return di_error(DI_ERR_INVALID_ARG, "%s", v.u.s->data);
    return di_error(DI_ERR_INVALID_ARG, "undefined value");
}

static di_status type_error(const char *op, jv a, jv b) {
    if (a.kind == JV_UNDEF) return jinja_undefined_error(a);
    if (b.kind == JV_UNDEF) return jinja_undefined_error(b);
    return di_error(DI_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                    jv_type_name(a), jv_type_name(b));
}

static bool is_intlike(jv v) {
    return v.kind == JV_INT || v.kind == JV_BOOL;
}
static int64_t as_int(jv v) {
    return v.kind == JV_INT ? v.u.i : (int64_t)v.u.b;
}
static double as_float(jv v) {
    return v.kind == JV_FLOAT ? v.u.f : (double)as_int(v);
}

static di_status overflow(void) {
    return di_error(DI_ERR_RANGE, "integer overflow (values beyond 64 bits are not supported)");
}

/* ========================================================================================== */
/* Arithmetic                                                                                  */
/* ========================================================================================== */

static di_status concat(jv a, jv b, jv *out) {
    jbuf buf = {0};
    di_status st = jv_write_str(&buf, a);
    if (st == DI_OK) st = jv_write_str(&buf, b);
    if (st == DI_OK) return jbuf_to_str(&buf, out);
    jbuf_free(&buf);
    return st;
}

static di_status list_concat(jv a, jv b, jv *out) {
    di_status st = jv_list_new(a.u.l->tuple, out);
    const jv_list *parts[2] = {a.u.l, b.u.l};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < parts[k]->n && st == DI_OK; i++)
            st = jv_list_push(*out, jv_retain(parts[k]->items[i]));
    return st;
}

static di_status repeat(jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.kind == JV_STR) {
        size_t len = seq.u.s->len;
        if (len && (uint64_t)times > JINJA_MAX_STRING / len)
            return di_error(DI_ERR_RANGE, "string repetition exceeds the limit of %u bytes",
                            JINJA_MAX_STRING);
        jbuf buf = {0};
        di_status st = DI_OK;
        for (int64_t i = 0; i < times && st == DI_OK && len; i++)
            st = jbuf_add(&buf, seq.u.s->data, len);
        if (st == DI_OK) return jbuf_to_str(&buf, out);
        jbuf_free(&buf);
        return st;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > JINJA_MAX_ITEMS / n)
        return di_error(DI_ERR_RANGE, "list repetition exceeds the limit of %u items",
                        JINJA_MAX_ITEMS);
    di_status st = jv_list_new(seq.u.l->tuple, out);
    for (int64_t i = 0; i < times && st == DI_OK; i++)
        for (size_t k = 0; k < n && st == DI_OK; k++)
            st = jv_list_push(*out, jv_retain(seq.u.l->items[k]));
    return st;
}

static di_status int_arith(char op, int64_t x, int64_t y, jv *out) {
    int64_t r = 0;
    switch (op) {
    case '+':
        if (__builtin_add_overflow(x, y, &r)) return overflow();
        break;
    case '-':
        if (__builtin_sub_overflow(x, y, &r)) return overflow();
        break;
    case '*':
        if (__builtin_mul_overflow(x, y, &r)) return overflow();
        break;
    case 'F':
    case '%':
        if (y == 0) return di_error(DI_ERR_INVALID_ARG, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) return overflow();
        r = op == 'F' ? x / y : x % y;
        if (op == 'F' && (x % y != 0) && ((x < 0) != (y < 0))) r--; /* floor */
        if (op == '%' && r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    case 'P':
        if (y < 0) {
            *out = jv_float(pow((double)x, (double)y));
            return DI_OK;
        }
        r = 1;
        for (int64_t i = 0; i < y; i++) {
            if (__builtin_mul_overflow(r, x, &r)) return overflow();
            if (r == 0 || r == 1) break;
            if (r == -1) {
                r = (y - i - 1) % 2 ? -r : r;
                break;
            }
        }
        break;
    }
    *out = jv_int(r);
    return DI_OK;
}

static di_status float_arith(char op, double x, double y, jv *out) {
    double r = 0;
    switch (op) {
    case '+':
        r = x + y;
        break;
    case '-':
        r = x - y;
        break;
    case '*':
        r = x * y;
        break;
    case '/':
    case 'F':
    case '%':
        if (y == 0) return di_error(DI_ERR_INVALID_ARG, "float division by zero");
        if (op == '/')
            r = x / y;
        else if (op == 'F')
            r = floor(x / y);
        else {
            r = fmod(x, y);
            if (r != 0 && ((r < 0) != (y < 0))) r += y;
        }
        break;
    case 'P':
        if (x == 0 && y < 0)
            return di_error(DI_ERR_INVALID_ARG, "0.0 cannot be raised to a negative power");
        r = pow(x, y);
        break;
    }
    *out = jv_float(r);
    return DI_OK;
}

di_status jinja_binary(char op, jv a, jv b, jv *out) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    static const char codes[] = "+-*/F%P";
    *out = jv_none();
    if (op == '~') return concat(a, b, out);
    const char *name = names[strchr(codes, op) ? strchr(codes, op) - codes : 0];
    if (jv_is_number(a) && jv_is_number(b)) {
        if (is_intlike(a) && is_intlike(b) && op != '/')
            return int_arith(op, as_int(a), as_int(b), out);
        return float_arith(op, as_float(a), as_float(b), out);
    }
    if (op == '+' && a.kind == JV_STR && b.kind == JV_STR) return concat(a, b, out);
    if (op == '+' && a.kind == JV_LIST && b.kind == JV_LIST && a.u.l->tuple == b.u.l->tuple)
        return list_concat(a, b, out);
    if (op == '*' && (a.kind == JV_STR || a.kind == JV_LIST) && is_intlike(b))
        return repeat(a, as_int(b), out);
    if (op == '*' && (b.kind == JV_STR || b.kind == JV_LIST) && is_intlike(a))
        return repeat(b, as_int(a), out);
    return type_error(name, a, b);
}

/* ========================================================================================== */
/* Comparisons and membership                                                                  */
/* ========================================================================================== */

static bool bytes_contain(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0) return true;
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, m)) return true;
    return false;
}

di_status jinja_contains(jv container, jv item, bool *out) {
    *out = false;
    switch (container.kind) {
    case JV_UNDEF:
        return DI_OK;
    case JV_STR:
        if (item.kind != JV_STR)
            return di_error(DI_ERR_INVALID_ARG,
                            "'in <string>' requires string as left operand, "
                            "not %s",
                            jv_type_name(item));
        *out =
            bytes_contain(container.u.s->data, container.u.s->len, item.u.s->data, item.u.s->len);
        return DI_OK;
    case JV_LIST:
        for (size_t i = 0; i < container.u.l->n && !*out; i++)
            *out = jv_equal(container.u.l->items[i], item);
        return DI_OK;
    case JV_DICT:
        if (item.kind == JV_LIST && !item.u.l->tuple)
            return di_error(DI_ERR_INVALID_ARG, "unhashable type: 'list'");
        *out = jv_dict_get(container, item) != NULL;
        return DI_OK;
    default:
        return di_error(DI_ERR_INVALID_ARG, "argument of type '%s' is not iterable",
                        jv_type_name(container));
    }
}

di_status jinja_compare(char op, jv a, jv b, bool *out) {
    di_status st = DI_OK;
    int c = 0;
    switch (op) {
    case '=':
        *out = jv_equal(a, b);
        return DI_OK;
    case '!':
        *out = !jv_equal(a, b);
        return DI_OK;
    case 'i':
        return jinja_contains(b, a, out);
    case 'I':
        st = jinja_contains(b, a, out);
        *out = !*out;
        return st;
    default:
        break;
    }
    if (a.kind == JV_UNDEF) return jinja_undefined_error(a);
    if (b.kind == JV_UNDEF) return jinja_undefined_error(b);
    st = jv_compare(a, b, &c);
    if (st != DI_OK) return st;
    *out = op == '<' ? c < 0 : op == '>' ? c > 0 : op == 'l' ? c <= 0 : c >= 0;
    return DI_OK;
}

/* ========================================================================================== */
/* Element access                                                                              */
/* ========================================================================================== */

static di_status missing(jv obj, jv key, jv *out) {
    jbuf b = {0};
    di_status st =
        key.kind == JV_STR ? jbuf_add(&b, key.u.s->data, key.u.s->len) : jv_write_repr(&b, key);
    if (st == DI_OK)
        st = jv_undef_msg(out, "'%s object' has no attribute '%.150s'", jv_type_name(obj),
                          b.data ? b.data : "");
    jbuf_free(&b);
    return st;
}

di_status jinja_getattr(jv obj, const char *name, jv *out) {
    if (obj.kind == JV_UNDEF) return jinja_undefined_error(obj);
    jv key;
    di_status st = jv_str_cstr(name, &key);
    if (st != DI_OK) return st;
    const jv *v = obj.kind == JV_DICT ? jv_dict_get(obj, key) : NULL;
    if (v)
        *out = jv_retain(*v);
    else
        st = missing(obj, key, out);
    jv_release(key);
    return st;
}

/* Byte offset of each code point of s, plus one final entry at s->len. */
static size_t *char_offsets(const jv_str *s, size_t *n_chars) {
    size_t *off = di_malloc((s->len + 1) * sizeof *off);
    if (!off) return NULL;
    size_t n = 0;
    for (size_t i = 0; i < s->len;) {
        off[n++] = i;
        jinja_utf8_next(s->data, s->len, &i);
    }
    off[n] = s->len;
    *n_chars = n;
    return off;
}

static di_status index_seq(jv obj, int64_t idx, jv *out) {
    if (obj.kind == JV_LIST) {
        int64_t n = (int64_t)obj.u.l->n;
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) return jv_undef_msg(out, "list index out of range");
        *out = jv_retain(obj.u.l->items[idx]);
        return DI_OK;
    }
    size_t n = 0, *off = char_offsets(obj.u.s, &n);
    if (!off) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot index a string");
    if (idx < 0) idx += (int64_t)n;
    di_status st = idx < 0 || idx >= (int64_t)n
                       ? jv_undef_msg(out, "string index out of range")
                       : jv_str_new(obj.u.s->data + off[idx], off[idx + 1] - off[idx], out);
    di_free(off);
    return st;
}

di_status jinja_getitem(jv obj, jv key, jv *out) {
    if (obj.kind == JV_UNDEF) return jinja_undefined_error(obj);
    if (obj.kind == JV_DICT) {
        const jv *v = jv_dict_get(obj, key);
        if (v) {
            *out = jv_retain(*v);
            return DI_OK;
        }
        return missing(obj, key, out);
    }
    if ((obj.kind == JV_LIST || obj.kind == JV_STR) && is_intlike(key))
        return index_seq(obj, as_int(key), out);
    return missing(obj, key, out);
}

/* Python's slice.indices(): clamps start/stop for the given length and step. */
static di_status slice_bounds(int64_t len, const jv *start, const jv *stop, const jv *step,
                              int64_t *b, int64_t *e, int64_t *s) {
    const jv *parts[3] = {start, stop, step};
    for (int k = 0; k < 3; k++)
        if (parts[k] && parts[k]->kind != JV_NONE && !is_intlike(*parts[k]))
            return di_error(DI_ERR_INVALID_ARG, "slice indices must be integers or None");
    *s = step && step->kind != JV_NONE ? as_int(*step) : 1;
    if (*s == 0) return di_error(DI_ERR_INVALID_ARG, "slice step cannot be zero");
    int64_t lo = *s < 0 ? -1 : 0, hi = *s < 0 ? len - 1 : len;
    const jv *ends[2] = {start, stop};
    int64_t *res[2] = {b, e};
    for (int k = 0; k < 2; k++) {
        if (!ends[k] || ends[k]->kind == JV_NONE) {
            *res[k] = (k == 0) == (*s > 0) ? lo : hi;
            continue;
        }
        int64_t v = as_int(*ends[k]);
        if (v < 0)
            v = v + len < lo ? lo : v + len;
        else if (v > hi)
            v = hi;
        *res[k] = v;
    }
    return DI_OK;
}

di_status jinja_slice(jv obj, const jv *start, const jv *stop, const jv *step, jv *out) {
    *out = jv_none();
    if (obj.kind == JV_UNDEF) return jinja_undefined_error(obj);
    if (obj.kind != JV_LIST && obj.kind != JV_STR)
        return di_error(DI_ERR_INVALID_ARG, "'%s' object is not subscriptable", jv_type_name(obj));
    size_t n_chars = 0, *off = NULL;
    if (obj.kind == JV_STR && !(off = char_offsets(obj.u.s, &n_chars)))
        return di_error(DI_ERR_OUT_OF_MEMORY, "cannot slice a string");
    int64_t len = obj.kind == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)n_chars, b, e, s;
    di_status st = slice_bounds(len, start, stop, step, &b, &e, &s);
    jbuf buf = {0};
    if (st == DI_OK && obj.kind == JV_LIST) st = jv_list_new(obj.u.l->tuple, out);
    for (int64_t i = b; st == DI_OK && (s > 0 ? i < e : i > e); i += s) {
        if (obj.kind == JV_LIST)
            st = jv_list_push(*out, jv_retain(obj.u.l->items[i]));
        else
            st = jbuf_add(&buf, obj.u.s->data + off[i], off[i + 1] - off[i]);
    }
    if (st == DI_OK && obj.kind == JV_STR) st = jbuf_to_str(&buf, out);
    jbuf_free(&buf);
    di_free(off);
    return st;
}

di_status jinja_iterate(jv v, jv *out) {
    di_status st;
    *out = jv_none();
    switch (v.kind) {
    case JV_LIST:
        *out = jv_retain(v);
        return DI_OK;
    case JV_UNDEF:
        return jv_list_new(false, out);
    case JV_DICT:
        st = jv_list_new(false, out);
        for (size_t i = 0; i < v.u.d->n && st == DI_OK; i++)
            st = jv_list_push(*out, jv_retain(v.u.d->keys[i]));
        return st;
    case JV_STR:
        st = jv_list_new(false, out);
        for (size_t i = 0; i < v.u.s->len && st == DI_OK;) {
            size_t start = i;
            jinja_utf8_next(v.u.s->data, v.u.s->len, &i);
            jv ch;
            st = jv_str_new(v.u.s->data + start, i - start, &ch);
            if (st == DI_OK) st = jv_list_push(*out, ch);
        }
        return st;
    default:
        return di_error(DI_ERR_INVALID_ARG, "'%s' object is not iterable", jv_type_name(v));
    }
}
