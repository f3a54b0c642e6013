/*
 * test_v4_config.c -- DeepSeek-V4 config.json parsing (both spellings) and load-time
 * checks: the golden configs resolve to the expected layer schedules and rope parameters;
 * broken variants fail with messages that name the field (schedule length, unknown layer or
 * MLP types, V3 fields mixed in, disagreeing spellings), and a checkpoint whose tid2eid
 * names an expert outside [0, n_routed_experts) fails to load with a clear error. An MTP
 * module (upstream "mtp.0.*") is bound when present and does not change the logits.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"
#include "io/config.h"
#include "test.h"

#include <jansson.h>
#include <stdbool.h>
#include <unistd.h>

#define DATA_DIR DI_SOURCE_DIR "/tests/data"

static json_t *load_cfg(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/config.json", DATA_DIR, name);
    return json_load_file(p, 0, NULL);
}

static di_status parse_json(const json_t *cfg, di_hparams *hp) {
    char *text = json_dumps(cfg, 0);
    di_status st = di_config_parse(text, strlen(text), "config.json", hp);
    free(text);
    return st;
}

TEST(golden_configs) {
    di_hparams hp;
    json_t *c = load_cfg("v4_mix_yarn");
    CHECK_MSG(c && parse_json(c, &hp) == DI_OK, "%s", di_last_error());
    const di_v4_hparams *v = &hp.v4;
    static const int kinds[] = {DI_V4_SLIDING, DI_V4_CSA, DI_V4_HCA, DI_V4_CSA};
    static const int64_t rates[] = {0, 4, 8, 4};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(v->layer_kind[i], kinds[i]);
        CHECK_EQ_INT(v->compress_rate[i], rates[i]);
        CHECK_EQ_INT(v->hash_moe[i], i < 2);
    }
    CHECK_EQ_INT(v->rope_dim, 16);
    CHECK(!v->rope_main.yarn && v->rope_compress.yarn);
    CHECK_NEAR(v->rope_compress.factor, 8.0, 0);
    CHECK_EQ_INT(v->rope_compress.original_max_position_embeddings, 64);
    CHECK_NEAR(v->rope_main.theta, 10000.0, 0);
    CHECK_NEAR(v->rope_compress.theta, 160000.0, 0);
    CHECK_EQ_INT(v->hc_mult, 4);
    CHECK_EQ_INT(v->sliding_window, 16);
    json_decref(c);

    c = load_cfg("v4_upstream_fp8");
    CHECK_MSG(c && parse_json(c, &hp) == DI_OK, "%s", di_last_error());
    static const int ukinds[] = {DI_V4_SLIDING, DI_V4_SLIDING, DI_V4_CSA, DI_V4_HCA};
    static const int64_t urates[] = {0, 0, 4, 8};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(v->layer_kind[i], ukinds[i]);
        CHECK_EQ_INT(v->compress_rate[i], urates[i]);
        CHECK_EQ_INT(v->hash_moe[i], i < 2);
    }
    CHECK(!v->rope_main.yarn && v->rope_compress.yarn);
    CHECK_NEAR(v->rope_compress.factor, 16.0, 0);
    CHECK_NEAR(v->rope_compress.theta, 160000.0, 0);
    CHECK(hp.fp8);
    json_decref(c);
}

/* Applies `set` (field = JSON text; NULL deletes) to a golden config, expects status and
 * a needle in the message. */
static void expect(const char *name, const char *field, const char *value, di_status want,
                   const char *needle) {
    json_t *c = load_cfg(name);
    if (!c) {
        CHECK(c != NULL);
        return;
    }
    if (value)
        json_object_set_new(c, field, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(c, field);
    di_hparams hp;
    di_status st = parse_json(c, &hp);
    CHECK_MSG(st == want && strstr(di_last_error(), needle),
              "%s with %s = %s: got %d \"%s\", expected %d with \"%s\"", name, field,
              value ? value : "(deleted)", (int)st, di_last_error(), (int)want, needle);
    json_decref(c);
}

TEST(bad_configs) {
    expect("v4_mix_yarn", "layer_types",
           "[\"sliding_attention\",\"compressed_sparse_attention\",\"sliding_attention\"]",
           DI_ERR_CONFIG, "\"layer_types\" must be a list of num_hidden_layers = 4");
    expect("v4_mix_yarn", "layer_types",
           "[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention\"]",
           DI_ERR_UNSUPPORTED, "unknown layer type \"full_attention\"");
    expect("v4_mix_yarn", "mlp_layer_types", "[\"moe\",\"dense\",\"moe\",\"moe\"]",
           DI_ERR_UNSUPPORTED, "unknown MLP type \"dense\"");
    expect("v4_mix_yarn", "kv_lora_rank", "512", DI_ERR_CONFIG, "V3 and V4 fields mixed");
    expect("v4_mix_yarn", "compress_ratios", "[0, 4, 8, 0]", DI_ERR_CONFIG, "disagree at layer 3");
    expect("v4_mix_yarn", "o_groups", "3", DI_ERR_CONFIG, "\"o_groups\"");
    expect("v4_mix_yarn", "head_dim", NULL, DI_ERR_CONFIG, "\"head_dim\" missing");
    expect("v4_mix_yarn", "num_key_value_heads", "2", DI_ERR_CONFIG, "one shared K=V head");
    expect("v4_upstream_fp8", "compress_ratios", "[0, 4, 8]", DI_ERR_CONFIG,
           "\"compress_ratios\" must be a list");
    expect("v4_upstream_fp8", "first_k_dense_replace", "1", DI_ERR_CONFIG,
           "V3 and V4 fields mixed");
    expect("v4_upstream_fp8", "rope_scaling", "{\"type\":\"dynamic\",\"factor\":2}",
           DI_ERR_UNSUPPORTED, "rope type \"dynamic\"");
}

/* ---------------------------------------------------------------------------------------- */
/* tid2eid range check                                                                        */
/* ---------------------------------------------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static bool spit(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

TEST(tid2eid_range) {
    char tmp[64] = "/tmp/di_v4cfg_XXXXXX", p[1024];
    if (!mkdtemp(tmp)) SKIP("mkdtemp failed");
    size_t len, clen;
    snprintf(p, sizeof p, "%s/v4_mix_yarn/model.safetensors", DATA_DIR);
    unsigned char *b = slurp(p, &len);
    snprintf(p, sizeof p, "%s/v4_mix_yarn/config.json", DATA_DIR);
    unsigned char *cfg = slurp(p, &clen);
    CHECK(b && cfg && len > 8);
    if (!b || !cfg) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    json_t *hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    json_t *t = json_object_get(hdr, "model.layers.1.ffn.gate.tid2eid");
    CHECK(t != NULL);
    if (t) {
        /* Row 5, slot 1 -> expert 99 (of 8). */
        size_t off =
            (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
        int64_t bad = 99;
        memcpy(b + 8 + hl + off + (5 * 2 + 1) * 8, &bad, 8);
        snprintf(p, sizeof p, "%s/model.safetensors", tmp);
        CHECK(spit(p, b, len));
        snprintf(p, sizeof p, "%s/config.json", tmp);
        CHECK(spit(p, cfg, clen));
        di_model *m = NULL;
        di_model_params mp = di_model_default_params();
        mp.n_threads = 1;
        di_status st = di_model_load(tmp, &mp, &m);
        const char *msg = di_last_error();
        CHECK_MSG(st == DI_ERR_FORMAT && strstr(msg, "tid2eid") && strstr(msg, "token 5") &&
                      strstr(msg, "expert 99"),
                  "got %d: %s", (int)st, msg);
        di_model_free(m);
    }
    json_decref(hdr);
    free(b), free(cfg);
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    unlink(p);
    rmdir(tmp);
}

TEST(v4_fields_in_v3) {
    /* A V3 golden config with a V4-only field: refused, naming the field. */
    char p[1024];
    snprintf(p, sizeof p, "%s/v3_plain_rope/config.json", DATA_DIR);
    json_t *c = json_load_file(p, 0, NULL);
    if (!c) SKIP("v3_plain_rope missing");
    di_hparams hp;
    CHECK_MSG(parse_json(c, &hp) == DI_OK, "%s", di_last_error());
    json_object_set_new(c, "compress_ratios", json_loads("[0, 4]", 0, NULL));
    di_status st = parse_json(c, &hp);
    CHECK_MSG(st == DI_ERR_CONFIG && strstr(di_last_error(), "\"compress_ratios\"") &&
                  strstr(di_last_error(), "V3 and V4 fields mixed"),
              "got %d: %s", (int)st, di_last_error());
    json_decref(c);
}

/* ---------------------------------------------------------------------------------------- */
/* MTP: bound when present                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Appends a tensor to a safetensors image being built: header entry + data bytes. */
static void add_tensor(json_t *hdr, unsigned char **data, size_t *dlen, const char *name,
                       const char *dtype, json_t *shape, const void *bytes, size_t n) {
    json_t *e = json_object();
    json_object_set_new(e, "dtype", json_string(dtype));
    json_object_set_new(e, "shape", shape);
    json_t *off = json_array();
    json_array_append_new(off, json_integer((json_int_t)*dlen));
    json_array_append_new(off, json_integer((json_int_t)(*dlen + n)));
    json_object_set_new(e, "data_offsets", off);
    json_object_set_new(hdr, name, e);
    *data = realloc(*data, *dlen + n);
    memcpy(*data + *dlen, bytes, n);
    *dlen += n;
}

TEST(mtp_bound_when_present) {
    /* The upstream case plus an MTP module "mtp.0.*": its block copied from layer 3's
     * attention / MoE tensors, e_proj / h_proj synthesised (bf16), norms and head mixing
     * copied from the model's. Loads, counts MTP parameters, and leaves the logits alone. */
    char tmp[64] = "/tmp/di_v4mtp_XXXXXX", p[1024];
    if (!mkdtemp(tmp)) SKIP("mkdtemp failed");
    size_t len, clen;
    snprintf(p, sizeof p, "%s/v4_upstream_fp8/model.safetensors", DATA_DIR);
    unsigned char *b = slurp(p, &len);
    snprintf(p, sizeof p, "%s/v4_upstream_fp8/config.json", DATA_DIR);
    unsigned char *cfg = slurp(p, &clen);
    if (!b || !cfg) SKIP("v4_upstream_fp8 missing");
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    json_t *hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    size_t dlen = len - 8 - (size_t)hl;
    unsigned char *data = malloc(dlen);
    memcpy(data, b + 8 + hl, dlen);
    json_t *add = json_object();
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        const char *src = NULL;
        char name[256];
        if (strncmp(key, "layers.3.", 9) == 0 && !strstr(key, "compressor"))
            src = key + 9, snprintf(name, sizeof name, "mtp.0.%s", src);
        else if (strcmp(key, "norm.weight") == 0 || strncmp(key, "hc_head_", 8) == 0)
            src = key, snprintf(name, sizeof name, "mtp.0.%s", key);
        if (!src) continue;
        json_t *off = json_object_get(val, "data_offsets");
        size_t o0 = (size_t)json_integer_value(json_array_get(off, 0));
        size_t o1 = (size_t)json_integer_value(json_array_get(off, 1));
        add_tensor(add, &data, &dlen, name, json_string_value(json_object_get(val, "dtype")),
                   json_deep_copy(json_object_get(val, "shape")), b + 8 + hl + o0, o1 - o0);
        if (strcmp(key, "norm.weight") == 0) {
            add_tensor(add, &data, &dlen, "mtp.0.enorm.weight", "BF16",
                       json_deep_copy(json_object_get(val, "shape")), b + 8 + hl + o0, o1 - o0);
            add_tensor(add, &data, &dlen, "mtp.0.hnorm.weight", "BF16",
                       json_deep_copy(json_object_get(val, "shape")), b + 8 + hl + o0, o1 - o0);
        }
    }
    json_object_update(hdr, add);
    json_decref(add);
    uint16_t *eye = calloc(160 * 160, 2);
    for (int i = 0; i < 160; i++)
        eye[i * 160 + i] = 0x3f80; /* bf16 1.0 */
    add_tensor(hdr, &data, &dlen, "mtp.0.e_proj.weight", "BF16", json_pack("[ii]", 160, 160), eye,
               160 * 160 * 2);
    add_tensor(hdr, &data, &dlen, "mtp.0.h_proj.weight", "BF16", json_pack("[ii]", 160, 160), eye,
               160 * 160 * 2);
    free(eye);
    char *txt = json_dumps(hdr, JSON_COMPACT);
    size_t nl = strlen(txt), padded = (nl + 7) / 8 * 8;
    unsigned char *out = malloc(8 + padded + dlen);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, txt, nl);
    memset(out + 8 + nl, ' ', padded - nl);
    memcpy(out + 8 + padded, data, dlen);
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    CHECK(spit(p, out, 8 + padded + dlen));
    snprintf(p, sizeof p, "%s/config.json", tmp);
    CHECK(spit(p, cfg, clen));

    di_model_params mp = di_model_default_params();
    mp.n_threads = 1;
    di_model *m = NULL, *m0 = NULL;
    di_status st = di_model_load(tmp, &mp, &m);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    snprintf(p, sizeof p, "%s/v4_upstream_fp8", DATA_DIR);
    CHECK(di_model_load(p, &mp, &m0) == DI_OK);
    if (m && m0) {
        di_model_info a, b0;
        di_model_get_info(m, &a);
        di_model_get_info(m0, &b0);
        CHECK(a.n_params_mtp > 0 && b0.n_params_mtp == 0);
        CHECK_EQ_INT(a.n_params_total, b0.n_params_total);
        int32_t ids[5] = {3, 17, 99, 5, 250};
        float la[5 * 320], lb[5 * 320];
        di_context *ca = NULL, *cb = NULL;
        CHECK(di_context_create(m, NULL, &ca) == DI_OK &&
              di_context_create(m0, NULL, &cb) == DI_OK);
        if (ca && cb) {
            CHECK(di_context_eval(ca, ids, 5, la, 5) == DI_OK);
            CHECK(di_context_eval(cb, ids, 5, lb, 5) == DI_OK);
            CHECK(memcmp(la, lb, sizeof la) == 0);
        }
        di_context_free(ca);
        di_context_free(cb);
        printf("  mtp.0 bound: %lld MTP parameters\n", (long long)a.n_params_mtp);
    }
    di_model_free(m);
    di_model_free(m0);
    json_decref(hdr);
    free(txt), free(out), free(data), free(b), free(cfg);
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    unlink(p);
    rmdir(tmp);
}

int main(void) {
    RUN(golden_configs);
    RUN(bad_configs);
    RUN(tid2eid_range);
    RUN(v4_fields_in_v3);
    RUN(mtp_bound_when_present);
    return test_summary();
}
