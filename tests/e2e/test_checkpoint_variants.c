/*
 * test_checkpoint_variants.c -- the same weights stored in the other layouts the loader
 * accepts give the same logits.
 *
 *   - fused experts: transformers' in-memory layout (mlp.experts.gate_up_proj [E][2I][H],
 *     mlp.experts.down_proj [E][H][I]) instead of DeepSeek's per-expert tensors. The test
 *     rewrites tests/data/v2_lite/model.safetensors that way and requires bitwise-equal
 *     logits (the kernels' results depend only on a row's values, not where it is stored).
 *   - tied embeddings: lm_head.weight removed and tie_word_embeddings = true: the model
 *     loads (lm_head = the embedding), counts vocab x hidden parameters fewer and gives
 *     finite logits.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"
#include "test.h"

#include <jansson.h>
#include <stdbool.h>
#include <unistd.h>

#define CASE_DIR DI_SOURCE_DIR "/tests/data/v2_lite"

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

/* A growable safetensors image: header object + data bytes. */
typedef struct {
    json_t *hdr;
    unsigned char *data;
    size_t len, cap;
} st_image;

static size_t append(st_image *im, const void *p, size_t n) {
    if (im->len + n > im->cap) {
        im->cap = (im->len + n) * 2;
        im->data = realloc(im->data, im->cap);
    }
    memcpy(im->data + im->len, p, n);
    im->len += n;
    return im->len - n;
}

static const unsigned char *tensor_bytes(const st_image *src, const char *name, size_t *n) {
    json_t *t = json_object_get(src->hdr, name);
    if (!t) return NULL;
    json_t *off = json_object_get(t, "data_offsets");
    size_t a = (size_t)json_integer_value(json_array_get(off, 0));
    size_t b = (size_t)json_integer_value(json_array_get(off, 1));
    *n = b - a;
    return src->data + a;
}

static bool write_image(const st_image *im, const char *path) {
    char *txt = json_dumps(im->hdr, JSON_COMPACT);
    size_t nl = strlen(txt), padded = (nl + 7) / 8 * 8;
    unsigned char *out = malloc(8 + padded + im->len);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, txt, nl);
    memset(out + 8 + nl, ' ', padded - nl);
    memcpy(out + 8 + padded, im->data, im->len);
    bool ok = spit(path, out, 8 + padded + im->len);
    free(out), free(txt);
    return ok;
}

static void add_tensor(st_image *dst, const char *name, const char *dtype, int64_t d0, int64_t d1,
                       int64_t d2, size_t begin, size_t end) {
    json_t *t = json_object();
    json_object_set_new(t, "dtype", json_string(dtype));
    json_t *shape = json_array();
    if (d0) json_array_append_new(shape, json_integer(d0));
    json_array_append_new(shape, json_integer(d1));
    json_array_append_new(shape, json_integer(d2));
    json_object_set_new(t, "shape", shape);
    json_t *off = json_array();
    json_array_append_new(off, json_integer((json_int_t)begin));
    json_array_append_new(off, json_integer((json_int_t)end));
    json_object_set_new(t, "data_offsets", off);
    json_object_set_new(dst->hdr, name, t);
}

/* Copies CASE_DIR into a temp folder, rewriting its safetensors with fused experts. */
static bool make_fused(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/di_fused_XXXXXX");
    if (!mkdtemp(dir)) return false;
    size_t len;
    char p[1024];
    unsigned char *cfg = slurp(CASE_DIR "/config.json", &len);
    snprintf(p, sizeof p, "%s/config.json", dir);
    bool ok = cfg && spit(p, cfg, len);
    free(cfg);
    json_t *c = json_load_file(CASE_DIR "/config.json", 0, NULL);
    int64_t L = json_integer_value(json_object_get(c, "num_hidden_layers"));
    int64_t E = json_integer_value(json_object_get(c, "n_routed_experts"));
    int64_t I = json_integer_value(json_object_get(c, "moe_intermediate_size"));
    int64_t H = json_integer_value(json_object_get(c, "hidden_size"));
    int64_t first = json_integer_value(json_object_get(c, "first_k_dense_replace"));
    json_decref(c);

    unsigned char *file = slurp(CASE_DIR "/model.safetensors", &len);
    if (!ok || !file) return false;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | file[i];
    st_image src = {json_loadb((const char *)file + 8, (size_t)hl, 0, NULL), file + 8 + hl,
                    len - 8 - hl, 0};
    st_image dst = {json_object(), NULL, 0, 0};
    const char *key;
    json_t *val;
    json_object_foreach(src.hdr, key, val) { /* everything but the per-expert tensors */
        if (strstr(key, ".mlp.experts.") || strcmp(key, "__metadata__") == 0) continue;
        size_t n;
        const unsigned char *b = tensor_bytes(&src, key, &n);
        size_t at = append(&dst, b, n);
        json_t *t = json_deep_copy(val);
        json_t *off = json_array();
        json_array_append_new(off, json_integer((json_int_t)at));
        json_array_append_new(off, json_integer((json_int_t)(at + n)));
        json_object_set_new(t, "data_offsets", off);
        json_object_set_new(dst.hdr, key, t);
    }
    for (int64_t il = first; il < L; il++) {
        char name[256];
        size_t begin = dst.len, n;
        for (int64_t e = 0; e < E; e++)
            for (int part = 0; part < 2; part++) {
                snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%lld.%s_proj.weight",
                         (long long)il, (long long)e, part ? "up" : "gate");
                const unsigned char *b = tensor_bytes(&src, name, &n);
                if (!b) return false;
                append(&dst, b, n);
            }
        snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.gate_up_proj", (long long)il);
        add_tensor(&dst, name, "BF16", E, 2 * I, H, begin, dst.len);
        begin = dst.len;
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%lld.down_proj.weight",
                     (long long)il, (long long)e);
            const unsigned char *b = tensor_bytes(&src, name, &n);
            if (!b) return false;
            append(&dst, b, n);
        }
        snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.down_proj", (long long)il);
        add_tensor(&dst, name, "BF16", E, H, I, begin, dst.len);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ok = write_image(&dst, p);
    json_decref(src.hdr);
    json_decref(dst.hdr);
    free(dst.data);
    free(file);
    return ok;
}

/* Copies CASE_DIR with lm_head.weight dropped and tie_word_embeddings = true. */
static bool make_tied(char *dir, size_t cap) {
    snprintf(dir, cap, "/tmp/di_tied_XXXXXX");
    if (!mkdtemp(dir)) return false;
    char p[1024];
    json_t *c = json_load_file(CASE_DIR "/config.json", 0, NULL);
    if (!c) return false;
    json_object_set_new(c, "tie_word_embeddings", json_true());
    snprintf(p, sizeof p, "%s/config.json", dir);
    bool ok = json_dump_file(c, p, JSON_INDENT(2)) == 0;
    json_decref(c);
    size_t len;
    unsigned char *file = slurp(CASE_DIR "/model.safetensors", &len);
    if (!ok || !file) return false;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | file[i];
    st_image im = {json_loadb((const char *)file + 8, (size_t)hl, 0, NULL), file + 8 + hl,
                   len - 8 - hl, 0};
    json_object_del(im.hdr, "lm_head.weight"); /* its bytes stay, unreferenced */
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ok = write_image(&im, p);
    json_decref(im.hdr);
    free(file);
    return ok;
}

static void remove_dir(const char *dir) {
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

static float *prompt_logits(const char *dir, int64_t n, int64_t *vocab) {
    di_model *m = NULL;
    if (di_model_load(dir, NULL, &m) != DI_OK) {
        printf("  %s: %s\n", dir, di_last_error());
        return NULL;
    }
    di_model_info info;
    di_model_get_info(m, &info);
    *vocab = info.vocab_size;
    di_context *c = NULL;
    di_context_params cp = di_context_default_params();
    cp.max_tokens = n;
    float *lg = NULL;
    if (di_context_create(m, &cp, &c) == DI_OK) {
        int32_t *ids = malloc((size_t)n * sizeof *ids);
        for (int64_t i = 0; i < n; i++)
            ids[i] = (int32_t)((i * 37 + 5) % info.vocab_size);
        lg = malloc((size_t)(n * info.vocab_size) * sizeof(float));
        if (di_context_eval(c, ids, n, lg, n) != DI_OK) {
            free(lg);
            lg = NULL;
        }
        free(ids);
    }
    di_context_free(c);
    di_model_free(m);
    return lg;
}

TEST(fused_experts_match_per_expert) {
    if (access(CASE_DIR "/model.safetensors", R_OK) != 0) SKIP("%s missing", CASE_DIR);
    char dir[256];
    CHECK(make_fused(dir, sizeof dir));
    int64_t v1 = 0, v2 = 0, n = 20;
    float *a = prompt_logits(CASE_DIR, n, &v1), *b = prompt_logits(dir, n, &v2);
    CHECK(a && b && v1 == v2);
    if (a && b) CHECK(memcmp(a, b, (size_t)(n * v1) * sizeof(float)) == 0);
    free(a), free(b);
    remove_dir(dir);
}

TEST(tied_embeddings) {
    if (access(CASE_DIR "/model.safetensors", R_OK) != 0) SKIP("%s missing", CASE_DIR);
    char dir[256];
    CHECK(make_tied(dir, sizeof dir));
    di_model *a = NULL, *b = NULL;
    CHECK(di_model_load(CASE_DIR, NULL, &a) == DI_OK);
    CHECK_MSG(di_model_load(dir, NULL, &b) == DI_OK, "%s", di_last_error());
    if (a && b) {
        di_model_info ia, ib;
        di_model_get_info(a, &ia);
        di_model_get_info(b, &ib);
        CHECK_EQ_INT(ib.n_params_total, ia.n_params_total - ia.vocab_size * ia.hidden_size);
        int64_t vocab = 0, n = 6;
        float *lg = prompt_logits(dir, n, &vocab);
        CHECK(lg != NULL);
        for (int64_t i = 0; lg && i < n * vocab; i++)
            CHECK(isfinite(lg[i]));
        free(lg);
    }
    di_model_free(a);
    di_model_free(b);
    remove_dir(dir);
}

int main(void) {
    RUN(fused_experts_match_per_expert);
    RUN(tied_embeddings);
    return test_summary();
}
