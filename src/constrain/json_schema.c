/*
 * json_schema.c -- JSON Schema as GBNF (gbnf_text.h): the schema front end of constrained
 * generation (vLLM's structured_outputs.json, OpenAI's response_format json_schema).
 *
 * Design stance: every schema node becomes one GBNF rule whose sentences are the JSON texts
 * the node accepts, written the way a generator should write them: objects list their
 * properties in the schema's order (required ones always, optional ones or not), then any
 * additional properties; whitespace between tokens is optional and short (llama.cpp's `ws`).
 * So the grammar accepts each valid document in one key order -- the schema's -- which is
 * what constrained decoding needs, and what the conformance test checks after putting an
 * instance's keys in that order.
 *
 * Supported: type (one or a list), enum, const, properties, required, additionalProperties
 * (false, true or a schema; absent = any), items, prefixItems (and draft-7 array "items"),
 * minItems / maxItems, minLength / maxLength, pattern (regex_gbnf.c), format date / time /
 * date-time / uuid, anyOf / oneOf (as alternatives), allOf (merged when its parts are
 * objects or share one type), $ref to "#", "#/$defs/..", "#/definitions/.." or any JSON
 * pointer inside the document, boolean schemas, nullable (OpenAPI). Keywords that only
 * narrow values (minimum, maximum, multipleOf, uniqueItems, not, if / then / else, ...) are
 * not enforced: the grammar then accepts a superset of the valid documents (generation stays
 * within the shape, the bounds are not guaranteed). Unsupported by design: remote $ref.
 */
#include "constrain/gbnf_text.h"
#include "constrain/grammar_build.h"

#include <jansson.h>
#include <string.h>

#define JS_MAX_RULES 20000 /* bounds the work on a hostile schema */
#define JS_MAX_DEPTH 64

typedef struct {
    json_t *root;
    gt_buf out;
    int n_rules;
    int depth;
    /* schema nodes already given a rule (for $ref cycles and shared definitions) */
    const json_t **done;
    int *done_id;
    int n_done, cap_done;
    di_status st;
    char path[256]; /* where the current node is, for errors */
    json_t *merged; /* allOf's merged nodes (owned: addresses are keys of done) */
} js;

static void js_fail(js *j, const char *what) {
    if (j->st != DI_OK) return;
    j->st = di_error(DI_ERR_INVALID_ARG, "json_schema: %s: %s", j->path[0] ? j->path : "/", what);
}

static const char *k_prims =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string \":\" ws value ( \",\" ws string \":\" ws value )* )? \"}\" ws\n"
    "array ::= \"[\" ws ( value ( \",\" ws value )* )? \"]\" ws\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "string ::= \"\\\"\" char* \"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]*) ws\n"
    "boolean ::= (\"true\" | \"false\") ws\n"
    "null ::= \"null\" ws\n"
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
    "[01])\n"
    "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]+)? "
    "(\"Z\" | \"z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "uuid ::= [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
    "[0-9a-fA-F]{12}\n";

static int new_rule(js *j) {
    if (++j->n_rules > JS_MAX_RULES) {
        js_fail(j, "the schema needs too many grammar rules");
        return -1;
    }
    return j->n_rules;
}

static int node_rule(js *j, const json_t *node);

/* A JSON value as the exact text a compact encoder writes, as a GBNF literal. */
static void emit_json_literal(js *j, gt_buf *o, const json_t *v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!text) {
        js_fail(j, "cannot encode an enum or const value");
        return;
    }
    gt_puts(o, "\"");
    gt_literal(o, text, strlen(text));
    gt_puts(o, "\"");
    free(text); /* jansson's */
}

/* Resolves "#", "#/a/b" (JSON pointer, ~0 ~1 and %XX escapes) inside the document. */
static const json_t *resolve_ref(js *j, const char *ref) {
    if (ref[0] != '#') {
        js_fail(j, "only references inside the schema (\"#...\") are supported");
        return NULL;
    }
    const json_t *cur = j->root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof key) {
            if (p[0] == '~' && p[1] == '0') {
                key[k++] = '~', p += 2;
            } else if (p[0] == '~' && p[1] == '1') {
                key[k++] = '/', p += 2;
            } else if (p[0] == '%' && gb_hex_digit(p[1]) >= 0 &&
                       gb_hex_digit(p[2]) >= 0) { /* a URI escape */
                key[k++] = (char)(gb_hex_digit(p[1]) * 16 + gb_hex_digit(p[2])), p += 3;
            } else {
                key[k++] = *p++;
            }
        }
        key[k] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, key);
        } else if (json_is_array(cur)) {
            char *e;
            long idx = strtol(key, &e, 10);
            cur = *e ? NULL : json_array_get(cur, (size_t)idx);
        } else {
            cur = NULL;
        }
    }
    if (!cur || *p) js_fail(j, "a $ref that points nowhere");
    return cur;
}

static long get_int(const json_t *node, const char *key, long dflt) {
    const json_t *v = json_object_get(node, key);
    if (json_is_integer(v)) return (long)json_integer_value(v);
    if (json_is_real(v)) return (long)json_real_value(v);
    return dflt;
}

/* The body of a string rule: quotes around chars with a length bound, a format or a pattern. */
static void emit_string(js *j, gt_buf *o, const json_t *node, int id) {
    const json_t *pat = json_object_get(node, "pattern");
    const char *fmt = json_string_value(json_object_get(node, "format"));
    if (json_is_string(pat)) {
        char name[32];
        snprintf(name, sizeof name, "r%d-pat", id);
        gt_printf(o, "\"\\\"\" %s \"\\\"\" ws\n", name);
        const char *re = json_string_value(pat);
        di_status st = di_regex_to_rules(o, name, re, json_string_length(pat), true);
        if (st != DI_OK && j->st == DI_OK) {
            char msg[300];
            snprintf(msg, sizeof msg, "pattern: %s", di_last_error());
            js_fail(j, msg);
        }
        return;
    }
    if (fmt && (!strcmp(fmt, "date") || !strcmp(fmt, "time") || !strcmp(fmt, "uuid"))) {
        gt_printf(o, "\"\\\"\" %s \"\\\"\" ws\n", fmt);
        return;
    }
    if (fmt && !strcmp(fmt, "date-time")) {
        gt_puts(o, "\"\\\"\" date [Tt ] time \"\\\"\" ws\n");
        return;
    }
    long lo = get_int(node, "minLength", 0), hi = get_int(node, "maxLength", -1);
    if (lo < 0) lo = 0;
    if (lo > 10000 || hi > 10000) { /* longer bounds: not enforced (a superset) */
        lo = 0, hi = -1;
    }
    if (hi >= 0 && hi < lo) {
        js_fail(j, "maxLength < minLength");
        return;
    }
    if (lo == 0 && hi < 0)
        gt_puts(o, "string\n");
    else if (hi < 0)
        gt_printf(o, "\"\\\"\" char{%ld,} \"\\\"\" ws\n", lo);
    else
        gt_printf(o, "\"\\\"\" char{%ld,%ld} \"\\\"\" ws\n", lo, hi);
}

/* Objects: properties in schema order (required or optional), then additional ones. */
static void emit_object(js *j, gt_buf *o, const json_t *node, int id) {
    const json_t *props = json_object_get(node, "properties");
    const json_t *req = json_object_get(node, "required");
    const json_t *addl = json_object_get(node, "additionalProperties");
    size_t n = json_is_object(props) ? json_object_size(props) : 0;
    if (n == 0 && !addl && !json_object_get(node, "patternProperties")) { /* any object */
        gt_puts(o, "object\n");
        return;
    }
    if (n > 2000) return js_fail(j, "more than 2000 properties");
    const char **names = di_calloc(n ? n : 1, sizeof *names);
    const json_t **subs = di_calloc(n ? n : 1, sizeof *subs);
    int *rules = di_calloc(n ? n : 1, sizeof *rules);
    bool *required = di_calloc(n ? n : 1, sizeof *required);
    if (!names || !subs || !rules || !required) {
        di_free(names), di_free(subs), di_free(rules), di_free(required);
        return js_fail(j, "out of memory");
    }
    size_t k = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)props, key, val) {
        names[k] = key, subs[k] = val;
        for (size_t r = 0; json_is_array(req) && r < json_array_size(req); r++)
            if (json_is_string(json_array_get(req, r)) &&
                !strcmp(json_string_value(json_array_get(req, r)), key))
                required[k] = true;
        if (json_is_false(val)) { /* this key may not appear */
            if (required[k]) {
                di_free(names), di_free(subs), di_free(rules), di_free(required);
                return js_fail(j, "a required property whose schema is false");
            }
            continue;
        }
        k++;
    }
    n = k;
    /* additional properties: none (false), any value (absent / true) or a schema */
    int addl_rule = -2; /* -2: none, -1: any value, else a rule */
    if (!addl || json_is_true(addl))
        addl_rule = -1;
    else if (json_is_object(addl))
        addl_rule = 0; /* set below, after this rule's text */
    /* r<id> ::= "{" ws r<id>-p0 "}" ws ; p_i_f (first) / p_i_n (after another) */
    gt_printf(o, "\"{\" ws r%d-p0f \"}\" ws\n", id);
    size_t pl = strlen(j->path);
    for (size_t i = 0; i < n && j->st == DI_OK; i++) {
        snprintf(j->path + pl, sizeof j->path - pl, "/properties/%s", names[i]);
        rules[i] = node_rule(j, subs[i]);
    }
    j->path[pl] = '\0';
    if (addl_rule == 0 && j->st == DI_OK) {
        snprintf(j->path + pl, sizeof j->path - pl, "/additionalProperties");
        addl_rule = node_rule(j, addl);
        j->path[pl] = '\0';
    }
    /* the other keys: one alternative per patternProperties entry (a key matching the
     * regex, its schema's value), then any key with the additional value (unless false) */
    const json_t *pp = json_object_get(node, "patternProperties");
    bool extra = addl_rule != -2;
    if (json_is_object(pp) && json_object_size(pp) > 0 && j->st == DI_OK) {
        gt_printf(o, "r%d-x ::= ", id);
        size_t q = 0;
        const char *pat;
        json_t *sub;
        gt_buf keys = {0};
        json_object_foreach((json_t *)pp, pat, sub) {
            snprintf(j->path + pl, sizeof j->path - pl, "/patternProperties/%s", pat);
            int sr = node_rule(j, sub);
            char kname[40];
            snprintf(kname, sizeof kname, "r%d-k%zu", id, q);
            di_status rs = di_regex_to_rules(&keys, kname, pat, strlen(pat), true);
            if (rs != DI_OK) {
                char msg[300];
                snprintf(msg, sizeof msg, "pattern: %s", di_last_error());
                js_fail(j, msg);
            }
            gt_printf(o, "%s\"\\\"\" %s \"\\\"\" ws \":\" ws r%d", q ? " | " : "", kname, sr);
            q++;
        }
        j->path[pl] = '\0';
        if (extra) {
            if (addl_rule == -1)
                gt_puts(o, " | string \":\" ws value");
            else
                gt_printf(o, " | string \":\" ws r%d", addl_rule);
        }
        gt_puts(o, "\n");
        if (keys.s) gt_putn(o, keys.s, keys.n);
        gt_free(&keys);
        extra = true;
    } else if (extra) {
        if (addl_rule == -1)
            gt_printf(o, "r%d-x ::= string \":\" ws value\n", id);
        else
            gt_printf(o, "r%d-x ::= string \":\" ws r%d\n", id, addl_rule);
    }
    if (j->st != DI_OK) goto done;
    for (size_t i = 0; i <= n; i++)
        for (int f = 0; f < 2; f++) { /* f = 1: nothing written yet (no comma) */
            gt_printf(o, "r%d-p%zu%c ::= ", id, i, f ? 'f' : 'n');
            const char *sep = f ? "" : "\",\" ws ";
            if (i == n) {
                if (!extra)
                    gt_puts(o, "\"\"\n");
                else if (f)
                    gt_printf(o, "( r%d-x ( \",\" ws r%d-x )* )?\n", id, id);
                else
                    gt_printf(o, "( \",\" ws r%d-x )*\n", id);
                continue;
            }
            json_t *kstr = json_string(names[i]); /* the key as a JSON encoder writes it */
            char *kjson = kstr ? json_dumps(kstr, JSON_ENCODE_ANY) : NULL;
            json_decref(kstr);
            gt_printf(o, "%s\"", sep);
            if (kjson) gt_literal(o, kjson, strlen(kjson));
            gt_printf(o, "\" ws \":\" ws r%d r%d-p%zun", rules[i], id, i + 1);
            if (!required[i]) gt_printf(o, " | r%d-p%zu%c", id, i + 1, f ? 'f' : 'n');
            gt_puts(o, "\n");
            free(kjson);
        }
done:
    di_free(names), di_free(subs), di_free(rules), di_free(required);
}

static void emit_array(js *j, gt_buf *o, const json_t *node, int id) {
    const json_t *prefix = json_object_get(node, "prefixItems");
    const json_t *items = json_object_get(node, "items");
    if (json_is_array(items)) { /* draft 7: items as a list is prefixItems */
        prefix = items;
        items = json_object_get(node, "additionalItems");
    }
    long lo = get_int(node, "minItems", 0), hi = get_int(node, "maxItems", -1);
    if (lo < 0) lo = 0;
    if (lo > 1000 || hi > 1000) lo = lo > 1000 ? 0 : lo, hi = -1; /* not enforced past 1000 */
    if (hi >= 0 && hi < lo) return js_fail(j, "maxItems < minItems");
    size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
    if (np > 1000) return js_fail(j, "more than 1000 prefixItems");
    int item_rule = -1; /* any value */
    bool items_false = json_is_false(items);
    size_t pl = strlen(j->path);
    if (items && json_is_object(items)) {
        snprintf(j->path + pl, sizeof j->path - pl, "/items");
        item_rule = node_rule(j, items);
        j->path[pl] = '\0';
    }
    int *pr = di_calloc(np ? np : 1, sizeof *pr);
    if (!pr) return js_fail(j, "out of memory");
    for (size_t i = 0; i < np && j->st == DI_OK; i++) {
        snprintf(j->path + pl, sizeof j->path - pl, "/prefixItems/%zu", i);
        pr[i] = node_rule(j, json_array_get(prefix, i));
        j->path[pl] = '\0';
    }
    if (j->st != DI_OK) {
        di_free(pr);
        return;
    }
    char item[32];
    if (item_rule < 0)
        snprintf(item, sizeof item, "value");
    else
        snprintf(item, sizeof item, "r%d", item_rule);
    if (np == 0) {
        if (items_false) {
            gt_puts(o, "\"[\" ws \"]\" ws\n");
        } else if (lo == 0) {
            if (hi == 0)
                gt_puts(o, "\"[\" ws \"]\" ws\n");
            else if (hi < 0)
                gt_printf(o, "\"[\" ws ( %s ( \",\" ws %s )* )? \"]\" ws\n", item, item);
            else
                gt_printf(o, "\"[\" ws ( %s ( \",\" ws %s ){0,%ld} )? \"]\" ws\n", item, item,
                          hi - 1);
        } else if (hi < 0) {
            gt_printf(o, "\"[\" ws %s ( \",\" ws %s ){%ld,} \"]\" ws\n", item, item, lo - 1);
        } else {
            gt_printf(o, "\"[\" ws %s ( \",\" ws %s ){%ld,%ld} \"]\" ws\n", item, item, lo - 1,
                      hi - 1);
        }
        di_free(pr);
        return;
    }
    /* prefix items: position i typed by pr[i]; later ones by items (unless false); items at
     * positions >= minItems optional. a<i> = the rest from position i. */
    gt_printf(o, "\"[\" ws r%d-a0 \"]\" ws\n", id);
    for (size_t i = 0; i < np; i++) {
        gt_printf(o, "r%d-a%zu ::= %sr%d r%d-a%zu", id, i, i ? "\",\" ws " : "", pr[i], id, i + 1);
        if ((long)i >= lo) gt_puts(o, " | \"\"");
        gt_puts(o, "\n");
    }
    if (items_false || (hi >= 0 && (long)np >= hi))
        gt_printf(o, "r%d-a%zu ::= \"\"\n", id, np);
    else
        gt_printf(o, "r%d-a%zu ::= ( \",\" ws %s )*\n", id, np, item);
    di_free(pr);
}

/* One type's body for node (its other keywords apply to that type). */
static void emit_type(js *j, gt_buf *o, const json_t *node, const char *type, int id) {
    if (!strcmp(type, "object"))
        emit_object(j, o, node, id);
    else if (!strcmp(type, "array"))
        emit_array(j, o, node, id);
    else if (!strcmp(type, "string"))
        emit_string(j, o, node, id);
    else if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") ||
             !strcmp(type, "null"))
        gt_printf(o, "%s\n", type);
    else
        js_fail(j, "an unknown type");
}

/* allOf of objects (or of one type): the parts' keywords merged into one node. */
/* Adds src's keywords to dst (a node of its own): properties and required are united (dst's
 * first), other keywords dst lacks are copied. */
static void merge_into(json_t *dst, const json_t *src) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)src, k, v) {
        json_t *have = json_object_get(dst, k);
        if (!strcmp(k, "properties") && json_is_object(have) && json_is_object(v)) {
            json_t *c = json_deep_copy(v);
            json_object_update_missing(have, c);
            json_decref(c);
        } else if (!strcmp(k, "required") && json_is_array(have) && json_is_array(v))
            json_array_extend(have, v);
        else if (!have)
            json_object_set_new(dst, k, json_deep_copy(v));
    }
}

static json_t *merge_all_of(js *j, const json_t *node) {
    json_t *m = json_deep_copy(node);
    json_object_del(m, "allOf");
    const json_t *all = json_object_get(node, "allOf");
    size_t i;
    json_t *part;
    json_array_foreach((json_t *)all, i, part) {
        const json_t *p = part;
        const json_t *ref = json_object_get(p, "$ref");
        if (json_is_string(ref)) p = resolve_ref(j, json_string_value(ref));
        if (!p || j->st != DI_OK) break;
        if (json_is_true(p)) continue;
        if (!json_is_object(p)) {
            js_fail(j, "allOf with a false schema");
            break;
        }
        merge_into(m, p);
    }
    return m;
}

/* anyOf / oneOf beside other keywords ({"properties": ..., "anyOf": [{"required": ...}]}):
 * each alternative merged with the rest of the node, as one anyOf. */
static json_t *distribute_any(js *j, const json_t *node, const char *any_key) {
    json_t *base = json_deep_copy(node);
    json_object_del(base, any_key);
    json_t *alts = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(node, any_key), i, a) {
        const json_t *p = a;
        const json_t *ref = json_object_get(p, "$ref");
        if (json_is_string(ref)) p = resolve_ref(j, json_string_value(ref));
        if (!p || j->st != DI_OK) break;
        if (json_is_false(p)) continue;
        json_t *m = json_deep_copy(base);
        if (json_is_object(p)) merge_into(m, p);
        json_array_append_new(alts, m);
    }
    json_decref(base);
    json_t *out = json_object();
    json_object_set_new(out, "anyOf", alts);
    return out;
}

/* Whether node has keywords besides anyOf / oneOf that constrain the value. */
static bool has_siblings(const json_t *node) {
    static const char *k_shape[] = {
        "type",   "properties",  "required",          "additionalProperties",
        "items",  "prefixItems", "patternProperties", "enum",
        "const",  "pattern",     "minLength",         "maxLength",
        "format", "minItems",    "maxItems"};
    for (size_t i = 0; i < sizeof k_shape / sizeof *k_shape; i++)
        if (json_object_get(node, k_shape[i])) return true;
    return false;
}

/* The body of node's rule (and its helper rules) into o; children through node_rule. */
static void emit_node(js *j, gt_buf *o, const json_t *node, int id) {
    if (json_is_true(node) || (json_is_object(node) && json_object_size(node) == 0)) {
        gt_puts(o, "value\n");
        return;
    }
    if (json_is_false(node)) return js_fail(j, "a false schema (no value is valid)");
    if (!json_is_object(node)) return js_fail(j, "a schema must be an object or a boolean");
    const json_t *ref = json_object_get(node, "$ref");
    const json_t *cnst = json_object_get(node, "const");
    const json_t *en = json_object_get(node, "enum");
    const json_t *any = json_object_get(node, "anyOf");
    const char *any_key = "anyOf";
    if (!any) any = json_object_get(node, "oneOf"), any_key = "oneOf";
    const json_t *all = json_object_get(node, "allOf");
    const json_t *type = json_object_get(node, "type");
    bool nullable = json_is_true(json_object_get(node, "nullable"));
    size_t pl = strlen(j->path);
    if (json_is_string(ref)) {
        const json_t *t = resolve_ref(j, json_string_value(ref));
        if (t) gt_printf(o, "r%d\n", node_rule(j, t));
    } else if (cnst) {
        emit_json_literal(j, o, cnst);
        gt_puts(o, " ws\n");
    } else if (json_is_array(en)) {
        if (json_array_size(en) == 0) return js_fail(j, "an empty enum");
        gt_puts(o, "(");
        for (size_t i = 0; i < json_array_size(en); i++) {
            if (i) gt_puts(o, " | ");
            emit_json_literal(j, o, json_array_get(en, i));
        }
        gt_puts(o, ") ws\n");
    } else if (json_is_array(any) && has_siblings(node)) {
        json_t *d = distribute_any(j, node, any_key);
        if (j->st != DI_OK || json_array_append_new(j->merged, d) != 0) return;
        gt_printf(o, "r%d\n", node_rule(j, d));
    } else if (json_is_array(any)) {
        size_t n = json_array_size(any);
        if (n == 0) return js_fail(j, "an empty anyOf / oneOf");
        size_t used = 0;
        for (size_t i = 0; i < n && j->st == DI_OK; i++) {
            const json_t *alt = json_array_get(any, i);
            if (json_is_false(alt)) continue; /* matches nothing: not an alternative */
            snprintf(j->path + pl, sizeof j->path - pl, "/%s/%zu", any_key, i);
            gt_printf(o, "%sr%d", used++ ? " | " : "", node_rule(j, alt));
        }
        j->path[pl] = '\0';
        if (used == 0 && !nullable) return js_fail(j, "every anyOf / oneOf alternative is false");
        if (used == 0) gt_puts(o, "null\n"), nullable = false;
        if (nullable) gt_puts(o, " | null");
        gt_puts(o, "\n");
    } else if (json_is_array(all)) {
        json_t *m = merge_all_of(j, node);
        if (!m || j->st != DI_OK) {
            json_decref(m);
            return;
        }
        /* the merged node must outlive the conversion (node_rule keys on addresses) */
        if (json_array_append_new(j->merged, m) != 0) return js_fail(j, "out of memory");
        gt_printf(o, "r%d\n", node_rule(j, m));
    } else {
        /* types: one, a list, or implied by the keywords present */
        const char *types[8];
        int nt = 0;
        if (json_is_string(type)) {
            types[nt++] = json_string_value(type);
        } else if (json_is_array(type)) {
            for (size_t i = 0; i < json_array_size(type) && nt < 7; i++)
                if (json_is_string(json_array_get(type, i)))
                    types[nt++] = json_string_value(json_array_get(type, i));
        } else if (json_object_get(node, "properties") ||
                   json_object_get(node, "additionalProperties") ||
                   json_object_get(node, "required")) {
            types[nt++] = "object";
        } else if (json_object_get(node, "items") || json_object_get(node, "prefixItems")) {
            types[nt++] = "array";
        } else if (json_object_get(node, "pattern") || json_object_get(node, "minLength") ||
                   json_object_get(node, "maxLength") || json_object_get(node, "format")) {
            types[nt++] = "string";
        }
        /* Without "type" the keywords constrain only values of their own type (JSON Schema's
         * rule): the implied type's shape, or any value of another type. */
        const bool implied = !type && nt == 1;
        if (nullable) types[nt++] = "null";
        if (nt == 0) {
            gt_puts(o, "value\n");
        } else if (implied) {
            int sub = new_rule(j);
            if (sub < 0) return;
            gt_buf tb = {0};
            emit_type(j, &tb, node, types[0], sub);
            gt_printf(&j->out, "r%d ::= ", sub);
            if (tb.s) gt_putn(&j->out, tb.s, tb.n);
            gt_free(&tb);
            static const char *kinds[] = {"object", "array", "string", "number", "boolean", "null"};
            gt_printf(o, "r%d", sub);
            for (int k = 0; k < 6; k++)
                if (strcmp(kinds[k], types[0]) != 0) gt_printf(o, " | %s", kinds[k]);
            gt_puts(o, "\n");
        } else if (nt == 1) {
            emit_type(j, o, node, types[0], id);
        } else { /* one rule per type, each with a fresh id for its helpers */
            for (int k = 0; k < nt && j->st == DI_OK; k++) {
                int sub = new_rule(j);
                if (sub < 0) return;
                gt_buf tb = {0};
                emit_type(j, &tb, node, types[k], sub);
                gt_printf(&j->out, "r%d ::= ", sub);
                if (tb.s) gt_putn(&j->out, tb.s, tb.n);
                gt_free(&tb);
                gt_printf(o, "%sr%d", k ? " | " : "", sub);
            }
            gt_puts(o, "\n");
        }
    }
}

/* The rule number of a schema node; its rule text goes to j->out once, when complete (a
 * node met again -- a $ref cycle, a shared definition -- gets its number at once). */
static int node_rule(js *j, const json_t *node) {
    if (j->st != DI_OK) return 0;
    for (int i = 0; i < j->n_done; i++)
        if (j->done[i] == node) return j->done_id[i];
    if (j->depth >= JS_MAX_DEPTH) {
        js_fail(j, "the schema nests too deeply");
        return 0;
    }
    int id = new_rule(j);
    if (id < 0) return 0;
    if (j->n_done == j->cap_done) {
        int cap = j->cap_done ? 2 * j->cap_done : 64;
        const json_t **d = di_realloc(j->done, (size_t)cap * sizeof *d);
        if (d) j->done = d;
        int *di = d ? di_realloc(j->done_id, (size_t)cap * sizeof *di) : NULL;
        if (!d || !di) {
            js_fail(j, "out of memory");
            return 0;
        }
        j->done_id = di, j->cap_done = cap;
    }
    j->done[j->n_done] = node, j->done_id[j->n_done++] = id;
    j->depth++;
    gt_buf o = {0};
    emit_node(j, &o, node, id);
    j->depth--;
    gt_printf(&j->out, "r%d ::= ", id);
    if (o.s) gt_putn(&j->out, o.s, o.n);
    if (o.oom) j->out.oom = true;
    gt_free(&o);
    return id;
}

di_status di_json_schema_to_gbnf(const char *schema, size_t len, char **out) {
    *out = NULL;
    json_error_t err;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &err);
    if (!root)
        return di_error(DI_ERR_INVALID_ARG, "json_schema: not JSON: line %d: %s", err.line,
                        err.text);
    if (!json_is_object(root) && !json_is_boolean(root)) {
        json_decref(root);
        return di_error(DI_ERR_INVALID_ARG,
                        "json_schema: the schema must be an object or a boolean");
    }
    js j = {.root = root, .merged = json_array()};
    gt_puts(&j.out, "root ::= ws r1\n");
    node_rule(&j, root);
    gt_puts(&j.out, k_prims);
    di_status st = j.st;
    if (st == DI_OK && j.out.oom) st = di_error(DI_ERR_OUT_OF_MEMORY, "json_schema: out of memory");
    di_free(j.done), di_free(j.done_id);
    json_decref(j.merged);
    json_decref(root);
    if (st != DI_OK) {
        gt_free(&j.out);
        return st;
    }
    *out = j.out.s;
    return DI_OK;
}
