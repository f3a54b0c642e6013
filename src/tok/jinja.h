/*
 * jinja.h -- a small Jinja2 interpreter for chat templates (internal to the tokenizer module).
 *
 * Design stance:
 *   - Only the subset of Jinja that Hugging Face chat templates use: expressions, {% set %}
 *     (plain, namespace attribute, block), {% for %} with loop.*, break/continue, {% if %},
 *     {% macro %}, {% generation %}, {% raw %}, filters, tests and a few Python methods.
 *   - Semantics follow jinja2 as transformers configures it: ImmutableSandboxedEnvironment
 *     with trim_blocks and lstrip_blocks, default Undefined, Python's str()/repr() for output.
 *   - Three stages: jinja_lex.c (text -> tokens), jinja_parse.c + jinja_parse_expr.c
 *     (tokens -> AST), jinja_eval.c (AST -> text) with jinja_ops.c (operators, element
 *     access), jinja_builtins.c + jinja_seq.c (filters, tests, globals) and jinja_methods.c
 *     (Python str/dict methods). Values live in jinja_value.c, JSON in jinja_json.c.
 *
 * Invariants:
 *   - Every failure returns a di_status and sets di_last_error(); nothing aborts on input.
 *   - Hostile templates terminate: parsing depth, evaluation steps, string and list sizes,
 *     output size and macro recursion are all bounded (JINJA_MAX_*).
 *   - Values are reference counted; a jv passed to a function is borrowed unless the
 *     function's comment says it takes ownership. Lists and dicts are immutable once built,
 *     except namespaces, which {% set ns.attr %} changes in place.
 */
#ifndef DI_TOK_JINJA_H
#define DI_TOK_JINJA_H

#include "core/core.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JINJA_MAX_DEPTH      200         /* nesting of expressions and blocks */
#define JINJA_MAX_STEPS      5000000     /* evaluation steps per render */
#define JINJA_MAX_STRING     (64u << 20) /* bytes in one string value / the output */
#define JINJA_MAX_ITEMS      (1u << 22)  /* items in one list or dict */
#define JINJA_MAX_CALL_DEPTH 64          /* nested macro calls */

/* ------------------------------------------------------------------------------------------ */
/* Values                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    JV_UNDEF, /* jinja's Undefined; u.s (may be NULL) holds the message used if it is misused */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  /* list or tuple (jv_list.tuple) */
    JV_DICT,  /* dict, namespace or loop object (jv_dict.flavor) */
    JV_MACRO, /* u.node: a {% macro %} node owned by the template */
} jv_kind;

typedef struct jv_str jv_str;
typedef struct jv_list jv_list;
typedef struct jv_dict jv_dict;
struct jinja_node;

typedef struct jv {
    jv_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        jv_str *s;
        jv_list *l;
        jv_dict *d;
        const struct jinja_node *node;
    } u;
} jv;

struct jv_str {
    int32_t rc;
    size_t len;
    char data[]; /* UTF-8, NUL-terminated (may also contain NULs) */
};

struct jv_list {
    int32_t rc;
    bool tuple;
    size_t n, cap;
    jv *items; /* [n], owned */
};

typedef enum { JV_DICT_PLAIN, JV_DICT_NAMESPACE, JV_DICT_LOOP } jv_dict_flavor;

struct jv_dict {
    int32_t rc;
    jv_dict_flavor flavor;
    size_t n, cap;
    jv *keys, *vals; /* [n] each, owned; insertion order */
};

static inline jv jv_undef(void) {
    return (jv){.kind = JV_UNDEF};
}
static inline jv jv_none(void) {
    return (jv){.kind = JV_NONE};
}
static inline jv jv_bool(bool b) {
    return (jv){.kind = JV_BOOL, .u.b = b};
}
static inline jv jv_int(int64_t i) {
    return (jv){.kind = JV_INT, .u.i = i};
}
static inline jv jv_float(double f) {
    return (jv){.kind = JV_FLOAT, .u.f = f};
}

jv jv_retain(jv v);
void jv_release(jv v);

/* Constructors fail (out of memory, size limits) with a status and *out == none. */
di_status jv_str_new(const char *s, size_t len, jv *out);
di_status jv_str_cstr(const char *s, jv *out);
di_status jv_undef_msg(jv *out, const char *fmt, ...) DI_PRINTF(2, 3);
di_status jv_list_new(bool tuple, jv *out);
di_status jv_list_push(jv list, jv item); /* takes ownership of item, even on failure */
di_status jv_dict_new(jv_dict_flavor flavor, jv *out);
di_status jv_dict_set(jv dict, jv key, jv val);               /* takes ownership of key and val */
di_status jv_dict_set_cstr(jv dict, const char *key, jv val); /* takes ownership of val */
/* Borrowed value for key, or NULL. */
const jv *jv_dict_get(jv dict, jv key);
const jv *jv_dict_get_cstr(jv dict, const char *key);

bool jv_is_str(jv v);
bool jv_is_number(jv v); /* bool, int or float */
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* Python ordering of numbers, strings and lists: *cmp is <0, 0 or >0. */
di_status jv_compare(jv a, jv b, int *cmp);
/* The type name Python would print ("str", "dict", "NoneType", ...). */
const char *jv_type_name(jv v);
/* Length in Python terms (code points of a string); -1 if the value has no length. */
int64_t jv_length(jv v);

/* ------------------------------------------------------------------------------------------ */
/* Growing byte buffer with a size limit                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct jbuf {
    char *data; /* owned, NUL-terminated when len > 0 */
    size_t len, cap;
} jbuf;

di_status jbuf_add(jbuf *b, const char *s, size_t n);
di_status jbuf_adds(jbuf *b, const char *s);
di_status jbuf_addf(jbuf *b, const char *fmt, ...) DI_PRINTF(2, 3);
/* Moves the buffer into a new string value; the buffer is left empty. */
di_status jbuf_to_str(jbuf *b, jv *out);
void jbuf_free(jbuf *b);

/* Appends Python's str(v) (strings as they are) or repr(v) (strings quoted). */
di_status jv_write_str(jbuf *b, jv v);
di_status jv_write_repr(jbuf *b, jv v);
/* str(v) as a new string value. */
di_status jv_to_str(jv v, jv *out);

/* ------------------------------------------------------------------------------------------ */
/* JSON (jinja_json.c)                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct json_t json_t;

/* Converts parsed JSON to a value (objects keep their key order). */
di_status jv_from_json(const json_t *j, jv *out);

typedef struct jv_json_opts {
    int64_t indent;                 /* < 0: single line */
    const char *indent_str;         /* when not NULL, used per level instead of indent spaces */
    const char *item_sep, *key_sep; /* NULL: Python's defaults for the indent mode */
    bool sort_keys;
    bool ensure_ascii;
} jv_json_opts;

/* Appends json.dumps(v, ...) as Python writes it. */
di_status jv_write_json(jbuf *b, jv v, const jv_json_opts *opts);

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 helpers (jinja_methods.c)                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Decodes one code point at s[*i] (advancing *i); invalid bytes decode as themselves. */
uint32_t jinja_utf8_next(const char *s, size_t len, size_t *i);
/* True for the characters Python's str.isspace() accepts. */
bool jinja_is_space(uint32_t cp);

/* ------------------------------------------------------------------------------------------ */
/* Lexer (jinja_lex.c)                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    JT_EOF,
    JT_DATA,        /* template text, already whitespace-controlled */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING, /* value unescaped */
    JT_INT,
    JT_FLOAT,
    JT_OP, /* text holds the operator */
} jtok_kind;

typedef struct jtok {
    jtok_kind kind;
    int line, col;
    char *text; /* owned by the token list: name, operator, string value or data */
    size_t len;
    int64_t ival;
    double fval;
} jtok;

typedef struct jtok_list {
    jtok *toks;
    size_t n, cap;
} jtok_list;

/* Tokenizes a whole template with trim_blocks and lstrip_blocks on. */
di_status jinja_lex(const char *src, size_t len, jtok_list *out);
void jinja_tokens_free(jtok_list *t);

/* ------------------------------------------------------------------------------------------ */
/* AST (jinja_parse.c)                                                                          */
/* ------------------------------------------------------------------------------------------ */

typedef enum {
    /* expressions */
    JN_LITERAL, /* value */
    JN_NAME,    /* name */
    JN_ATTR,    /* a.name */
    JN_ITEM,    /* a[b] */
    JN_SLICE,   /* a[b:c:d], any of b, c, d may be NULL */
    JN_CALL,    /* a(args, kwargs) */
    JN_FILTER,  /* a | name(args, kwargs); a is NULL inside {% filter %} */
    JN_TEST,    /* a is [not] name(args); op = 1 when negated */
    JN_UNARY,   /* op a: '-', '+', 'n' (not) */
    JN_BINARY,  /* a op b: + - * / F(//) % P(**) ~ a(and) o(or) */
    JN_COMPARE, /* a op b: = (==) ! (!=) < > l(<=) g(>=) i(in) I(not in) */
    JN_COND,    /* b if a else c */
    JN_LIST,    /* [args] */
    JN_TUPLE,   /* (args) */
    JN_DICT,    /* {args[0]: args[1], ...} */
    /* statements */
    JN_BODY,      /* args: statements */
    JN_DATA,      /* value: text */
    JN_OUTPUT,    /* {{ a }} */
    JN_IF,        /* if a: b else c (c is an IF for elif, a BODY, or NULL) */
    JN_FOR,       /* for names in a [if d]: b else c */
    JN_SET,       /* set names = a, or set name.attr = a (attr in value) */
    JN_SET_BLOCK, /* set name: body b */
    JN_BREAK,
    JN_CONTINUE,
    JN_MACRO,      /* macro name(names = args defaults): body b */
    JN_GENERATION, /* {% generation %} body b */
} jinja_node_kind;

typedef struct jinja_node {
    jinja_node_kind kind;
    int line, col;
    char op;
    const char *name; /* NAME, ATTR, FILTER, TEST, SET, SET_BLOCK, MACRO */
    jv value;         /* LITERAL, DATA; SET: attribute name for ns.attr */
    struct jinja_node *a, *b, *c, *d;
    struct jinja_node **args; /* call/filter/test arguments, items, statements */
    size_t n_args;
    const char **kw_names; /* CALL/FILTER/TEST keyword argument names */
    struct jinja_node **kw_vals;
    size_t n_kw;
    const char **names; /* FOR/SET targets, MACRO parameters */
    size_t n_names;
} jinja_node;

typedef struct jinja_template jinja_template;

/* Parses template text. On a syntax error the message has the form "line L:C: ...". */
di_status jinja_parse(const char *src, size_t len, jinja_template **out);
void jinja_template_free(jinja_template *t);
const jinja_node *jinja_template_root(const jinja_template *t);

/* ------------------------------------------------------------------------------------------ */
/* Operators and element access (jinja_ops.c)                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The error for using an Undefined value where a real one is needed. */
di_status jinja_undefined_error(jv v);
/* a op b for + - * / F(//) % P(**) ~ with Python semantics (int overflow is an error). */
di_status jinja_binary(char op, jv a, jv b, jv *out);
/* a op b for = ! < > l(<=) g(>=) i(in) I(not in). */
di_status jinja_compare(char op, jv a, jv b, bool *out);
/* item in container, as Python's "in" (substring for strings, key for dicts). */
di_status jinja_contains(jv container, jv item, bool *out);
/* obj.name and obj[key]; missing elements give Undefined, as in jinja2. */
di_status jinja_getattr(jv obj, const char *name, jv *out);
di_status jinja_getitem(jv obj, jv key, jv *out);
/* obj[start:stop:step] for strings, lists and tuples; NULL bounds are omitted ones. */
di_status jinja_slice(jv obj, const jv *start, const jv *stop, const jv *step, jv *out);
/* The items a for loop visits: list items, dict keys, string characters; Undefined gives
 * nothing. *out is a new list. */
di_status jinja_iterate(jv v, jv *out);

/* ------------------------------------------------------------------------------------------ */
/* Evaluation (jinja_eval.c, jinja_builtins.c)                                                  */
/* ------------------------------------------------------------------------------------------ */

/* Renders with the variables of ctx (a JV_DICT, borrowed), appending the text to *out. */
di_status jinja_render(const jinja_template *t, jv ctx, jbuf *out);

typedef struct jinja_eval jinja_eval;

/* Argument list of a filter, test, method or global call, already evaluated. */
typedef struct jinja_args {
    jv *pos;
    size_t n_pos;
    const char **kw_names;
    jv *kw;
    size_t n_kw;
} jinja_args;

/* Returns the argument named name, or at position pos (-1: keyword only), or NULL. */
const jv *jinja_arg(const jinja_args *a, int pos, const char *name);

bool jinja_filter_exists(const char *name);
bool jinja_test_exists(const char *name);
di_status jinja_apply_filter(jinja_eval *ev, const char *name, jv v, const jinja_args *a, jv *out);
di_status jinja_apply_test(jinja_eval *ev, const char *name, jv v, const jinja_args *a, bool *out);
/* obj.name(args): Python methods of str and dict. *found is false when there is none. */
di_status jinja_call_method(jinja_eval *ev, jv obj, const char *name, const jinja_args *a, jv *out,
                            bool *found);
/* name(args) for the environment's globals: range, namespace, dict, raise_exception,
 * strftime_now. *found is false when there is none. */
di_status jinja_call_global(jinja_eval *ev, const char *name, const jinja_args *a, jv *out,
                            bool *found);
/* The sequence filters of jinja_seq.c; *found is false for other names. */
di_status jinja_seq_filter(jinja_eval *ev, const char *name, jv v, const jinja_args *a, jv *out,
                           bool *found);
/* Counts work against JINJA_MAX_STEPS. */
di_status jinja_step(jinja_eval *ev, int64_t n);

#endif /* DI_TOK_JINJA_H */
