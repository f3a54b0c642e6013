/*
 * chat_template.c -- the public chat-template API: finds a model's Jinja chat template,
 * builds the variables transformers passes to it, and renders it with the interpreter of
 * jinja.h.
 *
 * Design stance: reproduce tokenizer.apply_chat_template(conversation, tools=...,
 * add_generation_prompt=..., tokenize=False, **extra) of transformers 5: the template sees
 * messages, tools (None when absent), documents (None), add_generation_prompt, the special
 * tokens of tokenizer_config.json as plain strings (bos_token, eos_token, ...), and extra
 * variables, which override the special tokens.
 *
 * Invariants: a di_chat_template is immutable after loading; rendering allocates its own
 * values, so several threads may render one template at once.
 */
#include "core/core.h"
#include "tok/jinja.h"

#include <jansson.h>
#include <string.h>
#include <sys/stat.h>

struct di_chat_template {
    char *text;          /* the Jinja source, owned */
    jinja_template *ast; /* owned */
    jv specials;         /* JV_DICT: bos_token etc. as strings, owned */
};

static const char *const k_special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

/* ========================================================================================== */
/* Loading                                                                                     */
/* ========================================================================================== */

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static di_status load_json(const char *path, json_t **out) {
    json_error_t err;
    *out = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!*out)
        return di_error(is_file(path) ? DI_ERR_FORMAT : DI_ERR_IO, "%s:%d:%d: %s", path, err.line,
                        err.column, err.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return di_error(DI_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    return DI_OK;
}

/* The special tokens of a tokenizer config: strings, or AddedToken dicts with "content". */
static di_status read_specials(const json_t *cfg, const char *path, jv specials) {
    di_status st = DI_OK;
    for (size_t i = 0; i < DI_ARRAY_LEN(k_special_names) && st == DI_OK; i++) {
        const json_t *v = json_object_get(cfg, k_special_names[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (!v || json_is_null(v)) continue;
        if (!json_is_string(v))
            return di_error(DI_ERR_FORMAT,
                            "%s: field \"%s\" is neither a string nor "
                            "{\"content\": string}",
                            path, k_special_names[i]);
        jv s;
        st = jv_str_new(json_string_value(v), json_string_length(v), &s);
        if (st == DI_OK) st = jv_dict_set_cstr(specials, k_special_names[i], s);
    }
    return st;
}

/* "chat_template" is a string, or a list of {"name", "template"} (then "default" is used). */
static di_status read_template_text(const json_t *cfg, const char *path, char **text) {
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_array(ct)) {
        const json_t *chosen = NULL, *item;
        size_t i;
        json_array_foreach(ct, i, item) {
            const char *name = json_string_value(json_object_get(item, "name"));
            if (!chosen || (name && !strcmp(name, "default"))) chosen = item;
        }
        ct = chosen ? json_object_get(chosen, "template") : NULL;
    }
    if (!ct) return di_error(DI_ERR_NOT_FOUND, "%s: no \"chat_template\" field", path);
    if (!json_is_string(ct))
        return di_error(DI_ERR_FORMAT, "%s: \"chat_template\" is not a string", path);
    *text = di_malloc(json_string_length(ct) + 1);
    if (!*text) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: cannot allocate", path);
    memcpy(*text, json_string_value(ct), json_string_length(ct) + 1);
    return DI_OK;
}

/* Resolves a model folder to its tokenizer_config.json (new string, di_free). */
static char *config_path(const char *path) {
    return is_dir(path) ? di_path_join(path, "tokenizer_config.json") : di_strdup(path);
}

/* Reads special tokens (and, if text != NULL, the template text) from a folder or a
 * tokenizer_config.json. A folder's chat_template.jinja, when present, wins over the
 * config's field, as in transformers. */
static di_status read_config(const char *path, jv specials, char **text) {
    char *cfg_path = config_path(path);
    if (!cfg_path) return di_error(DI_ERR_OUT_OF_MEMORY, "cannot allocate a path");
    json_t *cfg = NULL;
    di_status st = load_json(cfg_path, &cfg);
    if (st == DI_OK) st = read_specials(cfg, cfg_path, specials);
    if (st == DI_OK && text) {
        char *jinja_path = is_dir(path) ? di_path_join(path, "chat_template.jinja") : NULL;
        if (jinja_path && is_file(jinja_path))
            st = di_read_file(jinja_path, text, NULL);
        else
            st = read_template_text(cfg, cfg_path, text);
        di_free(jinja_path);
    }
    json_decref(cfg);
    di_free(cfg_path);
    return st;
}

static di_status finish(di_chat_template *t, di_chat_template **out) {
    di_status st = jinja_parse(t->text, strlen(t->text), &t->ast);
    if (st != DI_OK) {
        st = di_error_prefix(st, "chat template");
        di_chat_template_free(t);
        return st;
    }
    *out = t;
    return DI_OK;
}

static di_status new_template(di_chat_template **t) {
    *t = di_calloc(1, sizeof **t);
    if (!*t) return di_error(DI_ERR_OUT_OF_MEMORY, "chat template: cannot allocate");
    di_status st = jv_dict_new(JV_DICT_PLAIN, &(*t)->specials);
    if (st != DI_OK) {
        di_free(*t);
        *t = NULL;
    }
    return st;
}

di_status di_chat_template_load(const char *path, di_chat_template **out) {
    if (!path || !out) return di_error(DI_ERR_INVALID_ARG, "di_chat_template_load: NULL argument");
    *out = NULL;
    di_chat_template *t;
    di_status st = new_template(&t);
    if (st != DI_OK) return st;
    size_t n = strlen(path);
    bool json = is_dir(path) || (n >= 5 && !strcmp(path + n - 5, ".json"));
    st = json ? read_config(path, t->specials, &t->text) : di_read_file(path, &t->text, NULL);
    if (st != DI_OK) {
        di_chat_template_free(t);
        return st;
    }
    return finish(t, out);
}

di_status di_chat_template_from_text(const char *jinja_text, const char *special_tokens_from,
                                     di_chat_template **out) {
    if (!jinja_text || !out)
        return di_error(DI_ERR_INVALID_ARG, "di_chat_template_from_text: NULL argument");
    *out = NULL;
    di_chat_template *t;
    di_status st = new_template(&t);
    if (st != DI_OK) return st;
    t->text = di_strdup(jinja_text);
    if (!t->text) st = di_error(DI_ERR_OUT_OF_MEMORY, "chat template: cannot allocate");
    if (st == DI_OK && special_tokens_from)
        st = read_config(special_tokens_from, t->specials, NULL);
    if (st != DI_OK) {
        di_chat_template_free(t);
        return st;
    }
    return finish(t, out);
}

const char *di_chat_template_text(const di_chat_template *tmpl) {
    return tmpl ? tmpl->text : "";
}

void di_chat_template_free(di_chat_template *tmpl) {
    if (!tmpl) return;
    jinja_template_free(tmpl->ast);
    jv_release(tmpl->specials);
    di_free(tmpl->text);
    di_free(tmpl);
}

/* ========================================================================================== */
/* Rendering                                                                                   */
/* ========================================================================================== */

static di_status parse_json_arg(const char *text, const char *what, json_t **out) {
    json_error_t err;
    *out = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!*out)
        return di_error(DI_ERR_INVALID_ARG, "%s: invalid JSON at line %d, column %d: %s", what,
                        err.line, err.column, err.text);
    return DI_OK;
}

/* Sets ctx[name] from JSON (borrowed); a NULL json sets None. */
static di_status set_from_json(jv ctx, const char *name, const json_t *json) {
    jv v = jv_none();
    di_status st = json ? jv_from_json(json, &v) : DI_OK;
    return st == DI_OK ? jv_dict_set_cstr(ctx, name, v) : st;
}

/* Builds the variables of one render (see the file comment for what and in which order). */
static di_status build_context(const di_chat_template *t, const di_chat_render_params *p,
                               const json_t *messages, const json_t *tools, const json_t *extra,
                               jv *ctx) {
    di_status st = jv_dict_new(JV_DICT_PLAIN, ctx);
    const jv_dict *sp = t->specials.u.d;
    for (size_t i = 0; i < sp->n && st == DI_OK; i++)
        st = jv_dict_set(*ctx, jv_retain(sp->keys[i]), jv_retain(sp->vals[i]));
    if (st == DI_OK) st = set_from_json(*ctx, "messages", messages);
    if (st == DI_OK) st = set_from_json(*ctx, "tools", tools);
    if (st == DI_OK) st = set_from_json(*ctx, "documents", NULL);
    if (st == DI_OK)
        st = jv_dict_set_cstr(*ctx, "add_generation_prompt", jv_bool(p->add_generation_prompt));
    const char *key;
    json_t *val;
    if (extra) json_object_foreach((json_t *)extra, key, val) {
            if (st == DI_OK) st = set_from_json(*ctx, key, val);
        }
    return st;
}

/* Splits the messages argument into the message list and, for the object form, its tools. */
static di_status messages_and_tools(json_t *doc, const json_t **messages, const json_t **tools) {
    *messages = doc;
    if (json_is_object(doc)) {
        *messages = json_object_get(doc, "messages");
        const json_t *t = json_object_get(doc, "tools");
        if (t && !json_is_null(t)) *tools = t;
    }
    if (!json_is_array(*messages))
        return di_error(DI_ERR_INVALID_ARG, "messages: expected a JSON array of messages or an "
                                            "object with a \"messages\" array");
    if (*tools && !json_is_array(*tools))
        return di_error(DI_ERR_INVALID_ARG, "tools: expected a JSON array");
    return DI_OK;
}

di_status di_chat_template_render_ex(const di_chat_template *tmpl, const di_chat_render_params *p,
                                     char **out_text) {
    if (!tmpl || !p || !p->messages_json || !out_text)
        return di_error(DI_ERR_INVALID_ARG, "di_chat_template_render: NULL argument");
    *out_text = NULL;
    json_t *doc = NULL, *tools_doc = NULL, *extra = NULL;
    const json_t *messages = NULL, *tools = NULL;
    jv ctx = jv_none();
    jbuf out = {0};
    di_status st = parse_json_arg(p->messages_json, "messages", &doc);
    if (st == DI_OK && p->tools_json) st = parse_json_arg(p->tools_json, "tools", &tools_doc);
    if (st == DI_OK && p->extra_json) st = parse_json_arg(p->extra_json, "extra variables", &extra);
    if (st == DI_OK && extra && !json_is_object(extra))
        st = di_error(DI_ERR_INVALID_ARG, "extra variables: expected a JSON object");
    tools = tools_doc;
    if (st == DI_OK) st = messages_and_tools(doc, &messages, &tools);
    if (st == DI_OK) st = build_context(tmpl, p, messages, tools, extra, &ctx);
    if (st == DI_OK) st = jinja_render(tmpl->ast, ctx, &out);
    if (st == DI_OK && !out.data) st = jbuf_add(&out, "", 0);
    if (st == DI_OK) {
        *out_text = out.data;
        out = (jbuf){0};
    }
    jbuf_free(&out);
    jv_release(ctx);
    json_decref(doc);
    json_decref(tools_doc);
    json_decref(extra);
    return st;
}

di_status di_chat_template_render(const di_chat_template *tmpl, const char *messages_json,
                                  bool add_generation_prompt, const char *tools_json,
                                  char **out_text) {
    di_chat_render_params p = {.messages_json = messages_json,
                               .tools_json = tools_json,
                               .add_generation_prompt = add_generation_prompt};
    return di_chat_template_render_ex(tmpl, &p, out_text);
}
