/*
 * jinja_parse_expr.c -- recursive-descent parser for Jinja expressions, plus the token
 * helpers the statement parser shares (jinja_parse.h).
 *
 * Design stance: the grammar and operator precedence are jinja2's (parser.py), lowest first:
 *   cond (x if c else y) < or < and < not < compare (== != < > <= >= in, not in)
 *   < + - < ~ < * / // % < ** < unary - + < primary with postfix (.a [i] (call))
 *   and filter/test chains (| f, is t) that bind to the unary expression.
 * Filter and test names are checked while parsing, as jinja2 does at compile time.
 *
 * Invariants: nesting is bounded by JINJA_MAX_DEPTH (jp_enter), so no input can exhaust
 * the stack; on failure the partly built nodes stay in the arena and die with the template.
 */
#include "tok/jinja_parse.h"

#include <stdio.h>
#include <string.h>

/* ========================================================================================== */
/* Parser state and helpers                                                                    */
/* ========================================================================================== */

const jtok *jp_peek(const parser *p) {
    return &p->toks[p->i];
}
const jtok *jp_peek_at(const parser *p, size_t k) {
    return &p->toks[DI_MIN(p->i + k, p->n - 1)];
}
const jtok *jp_advance(parser *p) {
    const jtok *t = &p->toks[p->i];
    if (p->i + 1 < p->n) p->i++;
    return t;
}
bool jp_is_op(const jtok *t, const char *op) {
    return t->kind == JT_OP && !strcmp(t->text, op);
}
bool jp_is_name(const jtok *t, const char *n) {
    return t->kind == JT_NAME && !strcmp(t->text, n);
}

di_status jp_fail_at(const jtok *t, const char *fmt, const char *arg) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, arg);
    return di_error(DI_ERR_FORMAT, "line %d:%d: %s", t->line, t->col, msg);
}

const char *jp_tok_desc(const jtok *t) {
    switch (t->kind) {
    case JT_EOF:
        return "end of template";
    case JT_DATA:
        return "template data";
    case JT_VAR_BEGIN:
        return "'{{'";
    case JT_VAR_END:
        return "'}}'";
    case JT_BLOCK_BEGIN:
        return "'{%'";
    case JT_BLOCK_END:
        return "'%}'";
    case JT_STRING:
        return "string literal";
    case JT_INT:
    case JT_FLOAT:
        return "number";
    default:
        return t->text;
    }
}

di_status jp_expect_op(parser *p, const char *op) {
    if (!jp_is_op(jp_peek(p), op)) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected '%s', got %s", op, jp_tok_desc(jp_peek(p)));
        return jp_fail_at(jp_peek(p), "%s", msg);
    }
    jp_advance(p);
    return DI_OK;
}

di_status jp_expect_kind(parser *p, jtok_kind k, const char *what) {
    if (jp_peek(p)->kind != k) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected %s, got %s", what, jp_tok_desc(jp_peek(p)));
        return jp_fail_at(jp_peek(p), "%s", msg);
    }
    jp_advance(p);
    return DI_OK;
}

di_status jp_enter(parser *p) {
    if (++p->depth > JINJA_MAX_DEPTH)
        return jp_fail_at(jp_peek(p), "template nested deeper than %s levels", "200");
    return DI_OK;
}

jinja_node *jp_new_node(parser *p, jinja_node_kind kind, const jtok *at) {
    jinja_node *n = jp_alloc(p->t, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    n->value = jv_none();
    return n;
}

di_status jp_vec_push(ptrvec *v, void *item) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        void **q = di_realloc(v->items, cap * sizeof *q);
        if (!q) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
        v->items = q;
        v->cap = cap;
    }
    v->items[v->n++] = item;
    return DI_OK;
}

/* Moves the vector's items into the arena (an array of n pointers) and frees the vector. */
di_status jp_vec_finish(parser *p, ptrvec *v, void ***out, size_t *n) {
    *out = NULL;
    *n = v->n;
    if (v->n) {
        *out = jp_alloc(p->t, v->n * sizeof(void *));
        if (*out) memcpy(*out, v->items, v->n * sizeof(void *));
    }
    di_free(v->items);
    *v = (ptrvec){0};
    return *n && !*out ? di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate") : DI_OK;
}

di_status jp_add_literal(parser *p, jinja_node *n, jv v) {
    jinja_template *t = p->t;
    if (t->n_lits == t->cap_lits) {
        size_t cap = t->cap_lits ? t->cap_lits * 2 : 32;
        jv *q = di_realloc(t->lits, cap * sizeof *q);
        if (!q) {
            jv_release(v);
            return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
        }
        t->lits = q;
        t->cap_lits = cap;
    }
    t->lits[t->n_lits++] = v;
    n->value = v;
    return DI_OK;
}

/* ========================================================================================== */
/* Expressions                                                                                 */
/* ========================================================================================== */

static di_status parse_unary(parser *p, bool with_filter, jinja_node **out);

/* Arguments of a call, filter or test: "(a, b, name=c)"; the "(" is current. */
static di_status parse_call_args(parser *p, jinja_node *n) {
    ptrvec pos = {0}, kwn = {0}, kwv = {0};
    di_status st = jp_expect_op(p, "(");
    while (st == DI_OK && !jp_is_op(jp_peek(p), ")")) {
        if (pos.n + kwn.n > 0) st = jp_expect_op(p, ",");
        if (st != DI_OK || jp_is_op(jp_peek(p), ")")) break;
        if (jp_is_op(jp_peek(p), "*") || jp_is_op(jp_peek(p), "**")) {
            st = jp_fail_at(jp_peek(p), "%s", "*args and **kwargs are not supported");
            break;
        }
        jinja_node *arg = NULL;
        if (jp_peek(p)->kind == JT_NAME && jp_is_op(jp_peek_at(p, 1), "=")) {
            st = jp_vec_push(&kwn, jp_advance(p)->text);
            jp_advance(p);
            if (st == DI_OK) st = jp_parse_expr(p, &arg);
            if (st == DI_OK) st = jp_vec_push(&kwv, arg);
        } else if (kwn.n) {
            st = jp_fail_at(jp_peek(p), "%s", "positional argument follows keyword argument");
        } else {
            st = jp_parse_expr(p, &arg);
            if (st == DI_OK) st = jp_vec_push(&pos, arg);
        }
    }
    if (st == DI_OK) st = jp_expect_op(p, ")");
    size_t n_kwv;
    di_status s2 = jp_vec_finish(p, &pos, (void ***)&n->args, &n->n_args);
    di_status s3 = jp_vec_finish(p, &kwn, (void ***)&n->kw_names, &n->n_kw);
    di_status s4 = jp_vec_finish(p, &kwv, (void ***)&n->kw_vals, &n_kwv);
    return st != DI_OK ? st : s2 != DI_OK ? s2 : s3 != DI_OK ? s3 : s4;
}

/* "[a, b]", "(a, b)" / "(a)" and "{k: v}": the opening bracket is current. */
static di_status parse_collection(parser *p, jinja_node **out) {
    const jtok *open = jp_advance(p);
    char c = open->text[0];
    const char *close = c == '[' ? "]" : c == '(' ? ")" : "}";
    ptrvec items = {0};
    bool trailing_comma = false;
    di_status st = DI_OK;
    while (st == DI_OK && !jp_is_op(jp_peek(p), close)) {
        if (items.n) st = jp_expect_op(p, ",");
        if (st != DI_OK || jp_is_op(jp_peek(p), close)) {
            trailing_comma = true;
            break;
        }
        jinja_node *e = NULL;
        st = jp_parse_expr(p, &e);
        if (st == DI_OK) st = jp_vec_push(&items, e);
        if (st == DI_OK && c == '{') {
            st = jp_expect_op(p, ":");
            if (st == DI_OK) st = jp_parse_expr(p, &e);
            if (st == DI_OK) st = jp_vec_push(&items, e);
        }
    }
    if (st == DI_OK) st = jp_expect_op(p, close);
    if (st == DI_OK && c == '(' && items.n == 1 && !trailing_comma) { /* parenthesised */
        *out = items.items[0];
        di_free(items.items);
        return DI_OK;
    }
    jinja_node *n = jp_new_node(p, c == '[' ? JN_LIST : c == '(' ? JN_TUPLE : JN_DICT, open);
    if (!n && st == DI_OK) st = di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    if (st != DI_OK) {
        di_free(items.items);
        return st;
    }
    *out = n;
    return jp_vec_finish(p, &items, (void ***)&n->args, &n->n_args);
}

static di_status parse_literal(parser *p, jinja_node **out) {
    const jtok *t = jp_advance(p);
    NEW_NODE(n, JN_LITERAL, t);
    *out = n;
    if (t->kind == JT_INT) return jp_add_literal(p, n, jv_int(t->ival));
    if (t->kind == JT_FLOAT) return jp_add_literal(p, n, jv_float(t->fval));
    /* Adjacent string literals are concatenated, as in Python. */
    jbuf b = {0};
    di_status st = jbuf_add(&b, t->text, t->len);
    while (st == DI_OK && jp_peek(p)->kind == JT_STRING) {
        t = jp_advance(p);
        st = jbuf_add(&b, t->text, t->len);
    }
    jv s;
    if (st == DI_OK) st = jbuf_to_str(&b, &s);
    jbuf_free(&b);
    return st == DI_OK ? jp_add_literal(p, n, s) : st;
}

static di_status parse_primary(parser *p, jinja_node **out) {
    const jtok *t = jp_peek(p);
    if (t->kind == JT_STRING || t->kind == JT_INT || t->kind == JT_FLOAT)
        return parse_literal(p, out);
    if (t->kind == JT_OP && (jp_is_op(t, "(") || jp_is_op(t, "[") || jp_is_op(t, "{")))
        return parse_collection(p, out);
    if (t->kind != JT_NAME) return jp_fail_at(t, "unexpected %s", jp_tok_desc(t));
    jp_advance(p);
    NEW_NODE(n, JN_NAME, t);
    *out = n;
    if (!strcmp(t->text, "true") || !strcmp(t->text, "True"))
        n->kind = JN_LITERAL, n->value = jv_bool(true);
    else if (!strcmp(t->text, "false") || !strcmp(t->text, "False"))
        n->kind = JN_LITERAL, n->value = jv_bool(false);
    else if (!strcmp(t->text, "none") || !strcmp(t->text, "None"))
        n->kind = JN_LITERAL;
    else
        n->name = t->text;
    return DI_OK;
}

/* "[a]", "[a:b:c]": the "[" is current. */
static di_status parse_subscript(parser *p, jinja_node *obj, jinja_node **out) {
    const jtok *open = jp_advance(p);
    jinja_node *parts[3] = {NULL, NULL, NULL};
    int n_colons = 0;
    di_status st = DI_OK;
    while (st == DI_OK && !jp_is_op(jp_peek(p), "]")) {
        if (jp_is_op(jp_peek(p), ":")) {
            if (++n_colons > 2) return jp_fail_at(jp_peek(p), "%s", "invalid slice");
            jp_advance(p);
        } else if (parts[n_colons]) {
            return jp_fail_at(jp_peek(p), "expected ']', got %s", jp_tok_desc(jp_peek(p)));
        } else {
            st = jp_parse_expr(p, &parts[n_colons]);
        }
    }
    if (st == DI_OK) st = jp_expect_op(p, "]");
    if (st != DI_OK) return st;
    if (!n_colons && !parts[0]) return jp_fail_at(open, "%s", "empty subscript");
    NEW_NODE(n, n_colons ? JN_SLICE : JN_ITEM, open);
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    *out = n;
    return DI_OK;
}

static di_status parse_postfix(parser *p, jinja_node **node) {
    for (;;) {
        const jtok *t = jp_peek(p);
        di_status st = DI_OK;
        if (jp_is_op(t, ".")) {
            jp_advance(p);
            const jtok *name = jp_advance(p);
            if (name->kind == JT_INT) { /* x.0 is x[0] */
                NEW_NODE(n, JN_ITEM, name);
                NEW_NODE(k, JN_LITERAL, name);
                k->value = jv_int(name->ival);
                n->a = *node;
                n->b = k;
                *node = n;
                continue;
            }
            if (name->kind != JT_NAME)
                return jp_fail_at(name, "expected a name after '.', got %s", jp_tok_desc(name));
            NEW_NODE(n, JN_ATTR, name);
            n->a = *node;
            n->name = name->text;
            *node = n;
        } else if (jp_is_op(t, "[")) {
            st = parse_subscript(p, *node, node);
        } else if (jp_is_op(t, "(")) {
            NEW_NODE(n, JN_CALL, t);
            n->a = *node;
            *node = n;
            st = parse_call_args(p, n);
        } else {
            return DI_OK;
        }
        if (st != DI_OK) return st;
    }
}

static di_status parse_filter(parser *p, jinja_node **node) {
    const jtok *t = jp_advance(p); /* the name after "|" */
    if (t->kind != JT_NAME) return jp_fail_at(t, "expected a filter name, got %s", jp_tok_desc(t));
    if (!jinja_filter_exists(t->text)) return jp_fail_at(t, "no filter named '%s'", t->text);
    NEW_NODE(n, JN_FILTER, t);
    n->a = *node;
    n->name = t->text;
    *node = n;
    return jp_is_op(jp_peek(p), "(") ? parse_call_args(p, n) : DI_OK;
}

static bool starts_test_arg(const jtok *t) {
    if (t->kind == JT_NAME)
        return strcmp(t->text, "else") && strcmp(t->text, "or") && strcmp(t->text, "and") &&
               strcmp(t->text, "is");
    return t->kind == JT_STRING || t->kind == JT_INT || t->kind == JT_FLOAT || jp_is_op(t, "[") ||
           jp_is_op(t, "{");
}

static di_status parse_test(parser *p, jinja_node **node) {
    bool negated = jp_is_name(jp_peek(p), "not");
    if (negated) jp_advance(p);
    const jtok *t = jp_advance(p);
    if (t->kind != JT_NAME) return jp_fail_at(t, "expected a test name, got %s", jp_tok_desc(t));
    if (!jinja_test_exists(t->text)) return jp_fail_at(t, "no test named '%s'", t->text);
    NEW_NODE(n, JN_TEST, t);
    n->a = *node;
    n->name = t->text;
    n->op = negated;
    *node = n;
    if (jp_is_op(jp_peek(p), "(")) return parse_call_args(p, n);
    if (!starts_test_arg(jp_peek(p))) return DI_OK;
    jinja_node *arg = NULL;
    di_status st = parse_primary(p, &arg);
    if (st == DI_OK) st = parse_postfix(p, &arg);
    if (st != DI_OK) return st;
    n->args = jp_alloc(p->t, sizeof *n->args);
    if (!n->args) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    n->args[0] = arg;
    n->n_args = 1;
    return DI_OK;
}

static di_status parse_unary(parser *p, bool with_filter, jinja_node **out) {
    di_status st = jp_enter(p);
    const jtok *t = jp_peek(p);
    if (st == DI_OK && (jp_is_op(t, "-") || jp_is_op(t, "+"))) {
        jp_advance(p);
        NEW_NODE(n, JN_UNARY, t);
        n->op = t->text[0];
        st = parse_unary(p, false, &n->a);
        *out = n;
    } else if (st == DI_OK) {
        st = parse_primary(p, out);
    }
    if (st == DI_OK) st = parse_postfix(p, out);
    while (st == DI_OK && with_filter) {
        if (jp_is_op(jp_peek(p), "|")) {
            jp_advance(p);
            st = parse_filter(p, out);
        } else if (jp_is_name(jp_peek(p), "is")) {
            jp_advance(p);
            st = parse_test(p, out);
        } else if (jp_is_op(jp_peek(p), "(")) {
            NEW_NODE(n, JN_CALL, jp_peek(p));
            n->a = *out;
            *out = n;
            st = parse_call_args(p, n);
        } else {
            break;
        }
    }
    p->depth--;
    return st;
}

/* One binary precedence level: operand (op operand)*, left associative. */
typedef di_status (*operand_fn)(parser *p, jinja_node **out);

static di_status parse_binary_level(parser *p, jinja_node **out, operand_fn operand,
                                    const char *const *ops, const char *codes) {
    di_status st = operand(p, out);
    while (st == DI_OK) {
        const jtok *t = jp_peek(p);
        int k = -1;
        for (int i = 0; ops[i]; i++)
            if ((t->kind == JT_OP || t->kind == JT_NAME) && !strcmp(t->text, ops[i])) k = i;
        if (k < 0) break;
        jp_advance(p);
        NEW_NODE(n, JN_BINARY, t);
        n->op = codes[k];
        n->a = *out;
        *out = n;
        st = operand(p, &n->b);
    }
    return st;
}

static di_status parse_unary_f(parser *p, jinja_node **out) {
    return parse_unary(p, true, out);
}

static di_status parse_pow(parser *p, jinja_node **out) {
    static const char *const ops[] = {"**", NULL};
    return parse_binary_level(p, out, parse_unary_f, ops, "P");
}
static di_status parse_math2(parser *p, jinja_node **out) {
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    return parse_binary_level(p, out, parse_pow, ops, "*/F%");
}
static di_status parse_concat(parser *p, jinja_node **out) {
    static const char *const ops[] = {"~", NULL};
    return parse_binary_level(p, out, parse_math2, ops, "~");
}
static di_status parse_math1(parser *p, jinja_node **out) {
    static const char *const ops[] = {"+", "-", NULL};
    return parse_binary_level(p, out, parse_concat, ops, "+-");
}

static di_status parse_compare(parser *p, jinja_node **out) {
    static const char *const ops[] = {"==", "!=", "<", ">", "<=", ">=", "in", NULL};
    static const char codes[] = "=!<>lgi";
    di_status st = parse_math1(p, out);
    jinja_node *prev_right = NULL; /* chains: a < b < c is (a < b) and (b < c) */
    while (st == DI_OK) {
        const jtok *t = jp_peek(p);
        char code = 0;
        for (int i = 0; ops[i]; i++)
            if ((t->kind == JT_OP || t->kind == JT_NAME) && !strcmp(t->text, ops[i]))
                code = codes[i];
        if (!code && jp_is_name(t, "not") && jp_is_name(jp_peek_at(p, 1), "in")) {
            jp_advance(p);
            code = 'I';
        }
        if (!code) break;
        jp_advance(p);
        NEW_NODE(n, JN_COMPARE, t);
        n->op = code;
        n->a = prev_right ? prev_right : *out;
        st = parse_math1(p, &n->b);
        prev_right = n->b;
        if (n->a == *out) {
            *out = n;
        } else {
            NEW_NODE(both, JN_BINARY, t);
            both->op = 'a';
            both->a = *out;
            both->b = n;
            *out = both;
        }
    }
    return st;
}

static di_status parse_not(parser *p, jinja_node **out) {
    if (!jp_is_name(jp_peek(p), "not")) return parse_compare(p, out);
    di_status st = jp_enter(p);
    const jtok *t = jp_advance(p);
    NEW_NODE(n, JN_UNARY, t);
    n->op = 'n';
    *out = n;
    if (st == DI_OK) st = parse_not(p, &n->a);
    p->depth--;
    return st;
}

static di_status parse_and(parser *p, jinja_node **out) {
    static const char *const ops[] = {"and", NULL};
    return parse_binary_level(p, out, parse_not, ops, "a");
}
di_status jp_parse_or(parser *p, jinja_node **out) {
    static const char *const ops[] = {"or", NULL};
    return parse_binary_level(p, out, parse_and, ops, "o");
}

di_status jp_parse_expr(parser *p, jinja_node **out) {
    di_status st = jp_enter(p);
    if (st == DI_OK) st = jp_parse_or(p, out);
    while (st == DI_OK && jp_is_name(jp_peek(p), "if")) {
        NEW_NODE(n, JN_COND, jp_advance(p));
        n->b = *out;
        *out = n;
        st = jp_parse_or(p, &n->a);
        if (st == DI_OK && jp_is_name(jp_peek(p), "else")) {
            jp_advance(p);
            st = jp_parse_expr(p, &n->c);
        }
    }
    p->depth--;
    return st;
}

/* An expression, or several separated by commas (a tuple without parentheses). */
di_status jp_parse_tuple(parser *p, jinja_node **out) {
    const jtok *start = jp_peek(p);
    di_status st = jp_parse_expr(p, out);
    if (st != DI_OK || !jp_is_op(jp_peek(p), ",")) return st;
    ptrvec items = {0};
    st = jp_vec_push(&items, *out);
    while (st == DI_OK && jp_is_op(jp_peek(p), ",")) {
        jp_advance(p);
        if (jp_peek(p)->kind == JT_VAR_END || jp_peek(p)->kind == JT_BLOCK_END) break;
        jinja_node *e = NULL;
        st = jp_parse_expr(p, &e);
        if (st == DI_OK) st = jp_vec_push(&items, e);
    }
    jinja_node *n = st == DI_OK ? jp_new_node(p, JN_TUPLE, start) : NULL;
    if (!n) {
        di_free(items.items);
        return st != DI_OK ? st : di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    }
    *out = n;
    return jp_vec_finish(p, &items, (void ***)&n->args, &n->n_args);
}
