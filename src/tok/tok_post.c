/*
 * tok_post.c -- what add_special adds around the encoded text, from the post_processor of
 * tokenizer.json and from a model folder's tokenizer_config.json.
 *
 * Design stance: a single sequence only ever gets fixed ids before and after it, so the
 * post-processor reduces to two id lists (pre_ids, post_ids). TemplateProcessing's "single"
 * template, Roberta/Bert (cls ... sep), ByteLevel (adds nothing) and Sequence of these are
 * read into them. tokenizer_config.json's add_bos_token / add_eos_token replace them the way
 * transformers 4.x's LlamaTokenizerFast.update_post_processor does (the class DeepSeek's
 * checkpoints name).
 */
#include "tok/tok_internal.h"

#include <string.h>

static di_status push_id(int32_t **v, int32_t *n, int32_t id) {
    int32_t *p = di_realloc(*v, (size_t)(*n + 1) * sizeof(int32_t));
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: post-processor");
    p[(*n)++] = id;
    *v = p;
    return DI_OK;
}

static di_status template_special(di_tokenizer *t, json_t *specials, const char *name,
                                  bool before) {
    json_t *ids = json_object_get(json_object_get(specials, name), "ids");
    if (!json_is_array(ids))
        return di_error(DI_ERR_FORMAT, "post_processor: special token \"%s\" not defined", name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_int_t id = json_integer_value(json_array_get(ids, i));
        if (id < 0 || id >= t->n_ids)
            return di_error(DI_ERR_FORMAT, "post_processor: id %lld out of range", (long long)id);
        di_status st = before ? push_id(&t->pre_ids, &t->n_pre, (int32_t)id)
                              : push_id(&t->post_ids, &t->n_post, (int32_t)id);
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

static di_status load_template(di_tokenizer *t, json_t *pp) {
    json_t *single = json_object_get(pp, "single"),
           *specials = json_object_get(pp, "special_tokens");
    bool before = true;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i), *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            before = false;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name) return di_error(DI_ERR_FORMAT, "post_processor: bad template item %zu", i);
        di_status st = template_special(t, specials, name, before);
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

/* Roberta / Bert: "cls": ["<s>", 0], "sep": ["</s>", 2]. */
static di_status load_cls_sep(di_tokenizer *t, json_t *pp) {
    json_t *cls = json_array_get(json_object_get(pp, "cls"), 1);
    json_t *sep = json_array_get(json_object_get(pp, "sep"), 1);
    if (!json_is_integer(cls) || !json_is_integer(sep))
        return di_error(DI_ERR_FORMAT, "post_processor: \"cls\" / \"sep\" missing");
    di_status st = push_id(&t->pre_ids, &t->n_pre, (int32_t)json_integer_value(cls));
    if (st == DI_OK) st = push_id(&t->post_ids, &t->n_post, (int32_t)json_integer_value(sep));
    return st;
}

di_status tok_post_from_json(di_tokenizer *t, json_t *pp) {
    if (!pp || json_is_null(pp)) return DI_OK;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type) return di_error(DI_ERR_FORMAT, "post_processor: missing \"type\"");
    if (!strcmp(type, "ByteLevel")) return DI_OK; /* only changes offsets */
    if (!strcmp(type, "TemplateProcessing")) return load_template(t, pp);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing"))
        return load_cls_sep(t, pp);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        for (size_t i = 0; i < json_array_size(list); i++) {
            di_status st = tok_post_from_json(t, json_array_get(list, i));
            if (st != DI_OK) return st;
        }
        return DI_OK;
    }
    return di_error(DI_ERR_UNSUPPORTED, "post_processor type \"%s\" is not supported", type);
}

/* bos_token / eos_token are a string or {"content": ...}; returns the id or -1. */
static int32_t config_token(const di_tokenizer *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return di_tokenizer_token_to_id(t, json_string_value(v), json_string_length(v));
}

di_status tok_apply_config(di_tokenizer *t, const char *path) {
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (!cfg)
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, jerr.line,
                        jerr.text);
    int32_t bos = config_token(t, cfg, "bos_token"), eos = config_token(t, cfg, "eos_token");
    if (bos >= 0) t->bos_id = bos;
    if (eos >= 0) t->eos_id = eos;
    /* LlamaTokenizerFast defaults to add_bos_token = true, add_eos_token = false and always
     * rebuilds its post-processor from them; other classes only when the keys are given. */
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    bool llama = cls && (!strncmp(cls, "LlamaTokenizer", 14) || !strncmp(cls, "CodeLlama", 9));
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    bool add_bos = json_is_boolean(ab) ? json_is_true(ab) : llama;
    bool add_eos = json_is_boolean(ae) && json_is_true(ae);
    di_status st = DI_OK;
    if (llama || json_is_boolean(ab) || json_is_boolean(ae)) {
        t->n_pre = t->n_post = 0;
        if (add_bos && t->bos_id >= 0) st = push_id(&t->pre_ids, &t->n_pre, t->bos_id);
        if (st == DI_OK && add_eos && t->eos_id >= 0)
            st = push_id(&t->post_ids, &t->n_post, t->eos_id);
    }
    json_decref(cfg);
    return st;
}
