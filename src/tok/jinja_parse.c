/*
 * jinja_parse.c -- builds a template's AST: template lifetime, the arena, and the statement
 * grammar ({% if %}, {% for %}, {% set %}, {% macro %}, ...). Expressions are parsed by
 * jinja_parse_expr.c.
 *
 * Design stance: a body is a list of statements parsed until one of the end tags its
 * caller names ("endif", "elif", "else", ...); the caller then consumes that tag. Tags that
 * chat templates do not use (extends, include, import, call, filter blocks) are reported as
 * unsupported rather than misread.
 *
 * Invariants: all nodes live in the template's arena; on failure the template is freed as a
 * whole, so no partly built tree escapes.
 */
#include "tok/jinja_parse.h"

#include <string.h>

/* ========================================================================================== */
/* Template and arena                                                                          */
/* ========================================================================================== */

void *jp_alloc(jinja_template *t, size_t size) {
    size = (size + 15) & ~(size_t)15;
    arena_chunk *c = t->arena;
    if (!c || c->cap - c->used < size) {
        size_t cap = DI_MAX(size, (size_t)16384);
        c = di_malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = t->arena;
        c->used = 0;
        c->cap = cap;
        t->arena = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

void jinja_template_free(jinja_template *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_lits; i++)
        jv_release(t->lits[i]);
    di_free(t->lits);
    while (t->arena) {
        arena_chunk *next = t->arena->next;
        di_free(t->arena);
        t->arena = next;
    }
    jinja_tokens_free(&t->toks);
    di_free(t);
}

const jinja_node *jinja_template_root(const jinja_template *t) {
    return t->root;
}

/* ========================================================================================== */
/* Bodies                                                                                      */
/* ========================================================================================== */

static di_status parse_statement(parser *p, jinja_node **out);

static bool in_list(const char *s, const char *const *list) {
    for (; list && *list; list++)
        if (!strcmp(s, *list)) return true;
    return false;
}

/* Parses statements until "{% <one of stops>" and consumes "{%" and that name (its name is
 * returned in *stop). With stops == NULL, parses to the end of the template. */
static di_status parse_body(parser *p, const char *const *stops, jinja_node **out,
                            const char **stop) {
    di_status st = jp_enter(p);
    const jtok *first = jp_peek(p);
    ptrvec items = {0};
    while (st == DI_OK) {
        const jtok *t = jp_peek(p);
        jinja_node *n = NULL;
        if (t->kind == JT_EOF) {
            if (stops)
                st = jp_fail_at(t, "unexpected end of template, expected '{%% %s %%}'", stops[0]);
            break;
        }
        if (t->kind == JT_BLOCK_BEGIN && jp_peek_at(p, 1)->kind == JT_NAME &&
            in_list(jp_peek_at(p, 1)->text, stops)) {
            jp_advance(p);
            *stop = jp_advance(p)->text;
            break;
        }
        if (t->kind == JT_DATA) {
            n = jp_new_node(p, JN_DATA, jp_advance(p));
            jv s;
            st = n ? jv_str_new(t->text, t->len, &s)
                   : di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
            if (st == DI_OK) st = jp_add_literal(p, n, s);
        } else if (t->kind == JT_VAR_BEGIN) {
            jp_advance(p);
            n = jp_new_node(p, JN_OUTPUT, t);
            st = n ? jp_parse_tuple(p, &n->a)
                   : di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
            if (st == DI_OK) st = jp_expect_kind(p, JT_VAR_END, "'}}'");
        } else if (t->kind == JT_BLOCK_BEGIN) {
            jp_advance(p);
            st = parse_statement(p, &n);
        } else {
            st = jp_fail_at(t, "unexpected %s", jp_tok_desc(t));
        }
        if (st == DI_OK && n) st = jp_vec_push(&items, n);
    }
    p->depth--;
    jinja_node *body = st == DI_OK ? jp_new_node(p, JN_BODY, first) : NULL;
    if (!body) {
        di_free(items.items);
        return st != DI_OK ? st : di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    }
    *out = body;
    return jp_vec_finish(p, &items, (void ***)&body->args, &body->n_args);
}

static di_status end_tag(parser *p) {
    return jp_expect_kind(p, JT_BLOCK_END, "'%}'");
}

/* ========================================================================================== */
/* Statements                                                                                  */
/* ========================================================================================== */

/* "name" or "a, b" or "(a, b)": assignment targets of for / set. */
static di_status parse_targets(parser *p, jinja_node *n) {
    ptrvec names = {0};
    bool paren = jp_is_op(jp_peek(p), "(");
    if (paren) jp_advance(p);
    di_status st = DI_OK;
    do {
        const jtok *t = jp_peek(p);
        if (t->kind != JT_NAME) {
            st = jp_fail_at(t, "expected a variable name, got %s", jp_tok_desc(t));
            break;
        }
        st = jp_vec_push(&names, jp_advance(p)->text);
        if (st != DI_OK || !jp_is_op(jp_peek(p), ",")) break;
        jp_advance(p);
    } while (st == DI_OK);
    if (st == DI_OK && paren) st = jp_expect_op(p, ")");
    if (st != DI_OK) {
        di_free(names.items);
        return st;
    }
    return jp_vec_finish(p, &names, (void ***)&n->names, &n->n_names);
}

static di_status parse_if(parser *p, const jtok *at, jinja_node **out) {
    static const char *const stops[] = {"endif", "elif", "else", NULL};
    static const char *const end_only[] = {"endif", NULL};
    NEW_NODE(n, JN_IF, at);
    *out = n;
    const char *stop = NULL;
    di_status st = jp_parse_tuple(p, &n->a);
    if (st == DI_OK) st = end_tag(p);
    if (st == DI_OK) st = parse_body(p, stops, &n->b, &stop);
    if (st != DI_OK) return st;
    if (!strcmp(stop, "elif")) return parse_if(p, jp_peek(p), &n->c); /* it consumes endif */
    if (!strcmp(stop, "else")) {
        st = end_tag(p);
        if (st == DI_OK) st = parse_body(p, end_only, &n->c, &stop);
    }
    return st == DI_OK ? end_tag(p) : st;
}

static di_status parse_for(parser *p, const jtok *at, jinja_node **out) {
    static const char *const stops[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    NEW_NODE(n, JN_FOR, at);
    *out = n;
    const char *stop = NULL;
    di_status st = parse_targets(p, n);
    if (st == DI_OK && !jp_is_name(jp_peek(p), "in"))
        st = jp_fail_at(jp_peek(p), "expected 'in', got %s", jp_tok_desc(jp_peek(p)));
    if (st == DI_OK) jp_advance(p);
    if (st == DI_OK) st = jp_parse_or(p, &n->a);
    if (st == DI_OK && jp_is_name(jp_peek(p), "if")) {
        jp_advance(p);
        st = jp_parse_expr(p, &n->d);
    }
    if (st == DI_OK && jp_is_name(jp_peek(p), "recursive"))
        st = jp_fail_at(jp_peek(p), "%s", "recursive loops are not supported");
    if (st == DI_OK) st = end_tag(p);
    if (st == DI_OK) st = parse_body(p, stops, &n->b, &stop);
    if (st == DI_OK && !strcmp(stop, "else")) {
        st = end_tag(p);
        if (st == DI_OK) st = parse_body(p, end_only, &n->c, &stop);
    }
    return st == DI_OK ? end_tag(p) : st;
}

static di_status parse_set(parser *p, const jtok *at, jinja_node **out) {
    static const char *const stops[] = {"endset", NULL};
    NEW_NODE(n, JN_SET, at);
    *out = n;
    const jtok *name = jp_peek(p);
    di_status st;
    if (name->kind == JT_NAME && jp_is_op(jp_peek_at(p, 1), ".")) { /* ns.attr = value */
        jp_advance(p);
        jp_advance(p);
        const jtok *attr = jp_advance(p);
        if (attr->kind != JT_NAME)
            return jp_fail_at(attr, "expected an attribute name, got %s", jp_tok_desc(attr));
        n->name = name->text;
        jv a;
        st = jv_str_new(attr->text, attr->len, &a);
        if (st == DI_OK) st = jp_add_literal(p, n, a);
    } else {
        st = parse_targets(p, n);
    }
    if (st != DI_OK) return st;
    if (jp_is_op(jp_peek(p), "=")) {
        jp_advance(p);
        st = jp_parse_tuple(p, &n->a);
        return st == DI_OK ? end_tag(p) : st;
    }
    if (n->name || n->n_names != 1) /* block set: {% set x %}...{% endset %} */
        return jp_fail_at(jp_peek(p), "expected '=', got %s", jp_tok_desc(jp_peek(p)));
    n->kind = JN_SET_BLOCK;
    n->name = n->names[0];
    const char *stop;
    st = end_tag(p);
    if (st == DI_OK) st = parse_body(p, stops, &n->b, &stop);
    return st == DI_OK ? end_tag(p) : st;
}

/* {% macro name(a, b=default) %} ... {% endmacro %}: names are the parameters, args their
 * defaults (NULL where none). */
static di_status parse_macro(parser *p, const jtok *at, jinja_node **out) {
    static const char *const stops[] = {"endmacro", NULL};
    NEW_NODE(n, JN_MACRO, at);
    *out = n;
    const jtok *name = jp_advance(p);
    if (name->kind != JT_NAME)
        return jp_fail_at(name, "expected a macro name, got %s", jp_tok_desc(name));
    n->name = name->text;
    ptrvec names = {0}, defaults = {0};
    di_status st = jp_expect_op(p, "(");
    while (st == DI_OK && !jp_is_op(jp_peek(p), ")")) {
        if (names.n) st = jp_expect_op(p, ",");
        if (st != DI_OK || jp_is_op(jp_peek(p), ")")) break;
        const jtok *t = jp_advance(p);
        if (t->kind != JT_NAME) {
            st = jp_fail_at(t, "expected a parameter name, got %s", jp_tok_desc(t));
            break;
        }
        jinja_node *def = NULL;
        if (jp_is_op(jp_peek(p), "=")) {
            jp_advance(p);
            st = jp_parse_expr(p, &def);
        } else if (defaults.n && defaults.items[defaults.n - 1]) {
            st = jp_fail_at(t, "%s", "non-default argument follows default argument");
        }
        if (st == DI_OK) st = jp_vec_push(&names, t->text);
        if (st == DI_OK) st = jp_vec_push(&defaults, def);
    }
    if (st == DI_OK) st = jp_expect_op(p, ")");
    size_t n_defaults;
    di_status s2 = jp_vec_finish(p, &names, (void ***)&n->names, &n->n_names);
    di_status s3 = jp_vec_finish(p, &defaults, (void ***)&n->args, &n_defaults);
    if (st == DI_OK) st = s2 != DI_OK ? s2 : s3;
    n->n_args = n_defaults;
    const char *stop;
    if (st == DI_OK) st = end_tag(p);
    if (st == DI_OK) st = parse_body(p, stops, &n->b, &stop);
    return st == DI_OK ? end_tag(p) : st;
}

static di_status parse_wrapper(parser *p, const jtok *at, jinja_node_kind kind,
                               const char *const *stops, jinja_node **out) {
    NEW_NODE(n, kind, at);
    *out = n;
    const char *stop;
    di_status st = end_tag(p);
    if (st == DI_OK) st = parse_body(p, stops, &n->b, &stop);
    return st == DI_OK ? end_tag(p) : st;
}

static di_status parse_statement(parser *p, jinja_node **out) {
    static const char *const gen_stops[] = {"endgeneration", NULL};
    const jtok *t = jp_advance(p);
    if (t->kind != JT_NAME) return jp_fail_at(t, "expected a tag name, got %s", jp_tok_desc(t));
    const char *k = t->text;
    if (!strcmp(k, "if")) return parse_if(p, t, out);
    if (!strcmp(k, "for")) return parse_for(p, t, out);
    if (!strcmp(k, "set")) return parse_set(p, t, out);
    if (!strcmp(k, "macro")) return parse_macro(p, t, out);
    if (!strcmp(k, "generation")) return parse_wrapper(p, t, JN_GENERATION, gen_stops, out);
    if (!strcmp(k, "break") || !strcmp(k, "continue")) {
        NEW_NODE(n, k[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
        *out = n;
        return end_tag(p);
    }
    static const char *const unsupported[] = {"extends",    "include", "import", "from",
                                              "block",      "call",    "filter", "with",
                                              "autoescape", "do",      NULL};
    if (in_list(k, unsupported)) return jp_fail_at(t, "the '%s' tag is not supported", k);
    return jp_fail_at(t, "unknown tag '%s'", k);
}

/* ========================================================================================== */
/* Entry point                                                                                 */
/* ========================================================================================== */

/* Loops and macros are checked after parsing: break/continue only inside a for loop. */
static di_status check_loops(const jinja_node *n, int loop_depth) {
    if (!n) return DI_OK;
    if ((n->kind == JN_BREAK || n->kind == JN_CONTINUE) && loop_depth == 0)
        return di_error(DI_ERR_FORMAT, "line %d:%d: '%s' outside of a loop", n->line, n->col,
                        n->kind == JN_BREAK ? "break" : "continue");
    int inner = n->kind == JN_FOR ? loop_depth + 1 : n->kind == JN_MACRO ? 0 : loop_depth;
    if (n->kind == JN_FOR) { /* else body and the iterable are outside the loop */
        di_status st = check_loops(n->c, loop_depth);
        return st == DI_OK ? check_loops(n->b, inner) : st;
    }
    di_status st = DI_OK;
    if (n->kind == JN_BODY || n->kind == JN_IF)
        for (size_t i = 0; i < n->n_args && st == DI_OK; i++)
            st = check_loops(n->args[i], inner);
    const jinja_node *kids[] = {n->b, n->c};
    for (size_t i = 0; i < 2 && st == DI_OK; i++)
        if (kids[i] && n->kind != JN_OUTPUT && n->kind != JN_SET) st = check_loops(kids[i], inner);
    return st;
}

di_status jinja_parse(const char *src, size_t len, jinja_template **out) {
    *out = NULL;
    jinja_template *t = di_calloc(1, sizeof *t);
    if (!t) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate");
    di_status st = jinja_lex(src, len, &t->toks);
    if (st == DI_OK) {
        parser p = {.t = t, .toks = t->toks.toks, .n = t->toks.n};
        const char *stop = NULL;
        st = parse_body(&p, NULL, &t->root, &stop);
    }
    if (st == DI_OK) st = check_loops(t->root, 0);
    if (st != DI_OK) {
        jinja_template_free(t);
        return st;
    }
    *out = t;
    return DI_OK;
}
