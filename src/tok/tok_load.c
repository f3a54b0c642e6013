/*
 * tok_load.c -- reading tokenizer.json (and a model folder's tokenizer_config.json) into a
 * di_tokenizer: the top-level sections, the post-processor, the decoder, BOS / EOS.
 *
 * Design stance: accept exactly what we can reproduce and refuse the rest by name. Every
 * error names the section ("normalizer type \"NFKC\" is not supported", "model.merges[7]:
 * ..."); the caller prefixes the file name. Order matters: the pre-tokenizer is read before
 * the model because ByteLevel decides how vocab keys are stored.
 */
#define _POSIX_C_SOURCE 200809L
#include "tok/tok_internal.h"

#include <string.h>
#include <sys/stat.h>

static di_status check_normalizer(json_t *n) {
    if (!n || json_is_null(n)) return DI_OK;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers");
        for (size_t i = 0; i < json_array_size(list); i++) {
            di_status st = check_normalizer(json_array_get(list, i));
            if (st != DI_OK) return st;
        }
        return DI_OK;
    }
    return di_error(DI_ERR_UNSUPPORTED, "normalizer type \"%s\" is not supported",
                    type ? type : "?");
}

static di_status check_model_type(json_t *model) {
    if (!json_is_object(model)) return di_error(DI_ERR_FORMAT, "\"model\" missing");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE"))
        return di_error(DI_ERR_UNSUPPORTED, "model type \"%s\" is not supported (only BPE)", type);
    if (!type && !json_object_get(model, "merges"))
        return di_error(DI_ERR_UNSUPPORTED, "model without \"type\" and \"merges\" is not BPE");
    return DI_OK;
}

static di_status load_decoder(di_tokenizer *t, json_t *d) {
    t->decoder = TOK_DECODER_NONE;
    if (!d || json_is_null(d)) return DI_OK;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "ByteLevel")) {
        t->decoder = TOK_DECODER_BYTELEVEL;
        return DI_OK;
    }
    return di_error(DI_ERR_UNSUPPORTED, "decoder type \"%s\" is not supported", type ? type : "?");
}

/* Largest id in the vocab and the added tokens, + 1. */
static di_status count_ids(json_t *model, json_t *added, int32_t *out) {
    int64_t max = -1;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(model, "vocab"), k, v) {
        if (json_is_integer(v) && json_integer_value(v) > max) max = json_integer_value(v);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (json_is_integer(id) && json_integer_value(id) > max) max = json_integer_value(id);
    }
    if (max >= INT32_MAX - 1 || max >= 1 << 22)
        return di_error(DI_ERR_RANGE, "token id %lld is too large", (long long)max);
    *out = (int32_t)(max + 1);
    return DI_OK;
}

static di_status alloc_ids(di_tokenizer *t, int32_t n) {
    t->n_ids = n;
    size_t m = (size_t)n + 1;
    t->tok_str = di_malloc(m * sizeof *t->tok_str);
    t->tok_dec = di_malloc(m * sizeof *t->tok_dec);
    t->tok_flags = di_calloc(m, 1);
    t->added_lstrip = di_calloc(m, 1);
    t->added_rstrip = di_calloc(m, 1);
    t->added_single = di_calloc(m, 1);
    if (!t->tok_str || !t->tok_dec || !t->tok_flags || !t->added_lstrip || !t->added_rstrip ||
        !t->added_single)
        return di_error(DI_ERR_OUT_OF_MEMORY, "tokenizer: per-id tables");
    for (size_t i = 0; i < m; i++)
        t->tok_str[i] = t->tok_dec[i] = (tok_span){0, TOK_NO_STR};
    for (int i = 0; i < 256; i++)
        t->byte_id[i] = -1;
    return DI_OK;
}

static int32_t find_any(const di_tokenizer *t, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = di_tokenizer_token_to_id(t, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

/* Without tokenizer_config.json: BOS is what the post-processor prepends, else a well-known
 * name; EOS a well-known name. */
static void guess_bos_eos(di_tokenizer *t) {
    static const char *const bos[] = {"<｜begin▁of▁sentence｜>", "<|begin_of_text|>", "<s>",
                                      "<|endoftext|>"};
    static const char *const eos[] = {"<｜end▁of▁sentence｜>", "<|end_of_text|>", "</s>",
                                      "<|endoftext|>"};
    t->bos_id = t->n_pre > 0 ? t->pre_ids[0] : find_any(t, bos, DI_ARRAY_LEN(bos));
    t->eos_id = find_any(t, eos, DI_ARRAY_LEN(eos));
}

di_status tok_load_json(di_tokenizer *t, const char *text, size_t len, const char *what) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return di_error(DI_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", what, jerr.line,
                        jerr.column, jerr.text);
    json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    int32_t n = 0;
    di_status st = json_is_object(root) ? DI_OK : di_error(DI_ERR_FORMAT, "not a JSON object");
    if (st == DI_OK) st = check_model_type(model);
    if (st == DI_OK) st = check_normalizer(json_object_get(root, "normalizer"));
    if (st == DI_OK) st = tok_pretok_load(t, json_object_get(root, "pre_tokenizer"));
    if (st == DI_OK) st = count_ids(model, added, &n);
    if (st == DI_OK) st = alloc_ids(t, n);
    if (st == DI_OK) st = tok_load_bpe(t, model);
    if (st == DI_OK) st = tok_load_added(t, added);
    if (st == DI_OK) st = load_decoder(t, json_object_get(root, "decoder"));
    if (st == DI_OK) st = tok_post_from_json(t, json_object_get(root, "post_processor"));
    if (st == DI_OK) st = tok_finish_ids(t);
    if (st == DI_OK) guess_bos_eos(t);
    json_decref(root);
    if (st != DI_OK) return di_error_prefix(st, "%s", what);
    return DI_OK;
}
