/*
 * jinja_parse.h -- shared internals of the Jinja parser (jinja_parse.c: templates and
 * statements; jinja_parse_expr.c: expressions and token helpers). Not used elsewhere.
 *
 * Invariants: nodes and arrays come from the template's arena (jp_alloc) and are never
 * freed one by one; literal values are registered with jp_add_literal so that
 * jinja_template_free releases them.
 */
#ifndef DI_TOK_JINJA_PARSE_H
#define DI_TOK_JINJA_PARSE_H

#include "tok/jinja.h"

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_chunk;

struct jinja_template {
    jtok_list toks;     /* token texts back the names in the AST */
    arena_chunk *arena; /* nodes and arrays */
    jv *lits;           /* literal values to release */
    size_t n_lits, cap_lits;
    jinja_node *root;
};

typedef struct parser {
    jinja_template *t;
    const jtok *toks;
    size_t i, n;
    int depth;
} parser;

/* A growable array of pointers, copied into the arena when complete. */
typedef struct ptrvec {
    void **items;
    size_t n, cap;
} ptrvec;

void *jp_alloc(jinja_template *t, size_t size); /* zeroed */

const jtok *jp_peek(const parser *p);
const jtok *jp_peek_at(const parser *p, size_t k);
const jtok *jp_advance(parser *p);
bool jp_is_op(const jtok *t, const char *op);
bool jp_is_name(const jtok *t, const char *name);
const char *jp_tok_desc(const jtok *t);
/* "line L:C: " + fmt with one string argument. */
di_status jp_fail_at(const jtok *t, const char *fmt, const char *arg);
di_status jp_expect_op(parser *p, const char *op);
di_status jp_expect_kind(parser *p, jtok_kind k, const char *what);
/* Depth guard: jp_enter increments p->depth (failing past JINJA_MAX_DEPTH); the caller
 * decrements it when done, whether or not jp_enter failed. */
di_status jp_enter(parser *p);
jinja_node *jp_new_node(parser *p, jinja_node_kind kind, const jtok *at);
di_status jp_vec_push(ptrvec *v, void *item);
di_status jp_vec_finish(parser *p, ptrvec *v, void ***out, size_t *n);
di_status jp_add_literal(parser *p, jinja_node *n, jv v); /* takes ownership of v */

di_status jp_parse_expr(parser *p, jinja_node **out);  /* conditional expression */
di_status jp_parse_or(parser *p, jinja_node **out);    /* without "x if c else y" */
di_status jp_parse_tuple(parser *p, jinja_node **out); /* a or a, b, ... */

#define NEW_NODE(var, kind, at)                                                                    \
    jinja_node *var = jp_new_node(p, kind, at);                                                    \
    if (!var) return di_error(DI_ERR_OUT_OF_MEMORY, "template: cannot allocate")

#endif /* DI_TOK_JINJA_PARSE_H */
