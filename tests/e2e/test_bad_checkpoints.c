/*
 * test_bad_checkpoints.c -- di_model_load on broken copies of a golden checkpoint must fail
 * with a message that names the file and the tensor or field at fault.
 *
 * Each case copies tests/data/<case>/ into a fresh temporary folder, breaks one thing
 * (removes model.safetensors, removes a tensor or changes its shape by rewriting the
 * safetensors header, removes a config field, changes the architecture) and loads it.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdbool.h>
#include <unistd.h>

#define DATA_DIR DI_SOURCE_DIR "/tests/data"

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                    */
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

/* Copies every regular file of DATA_DIR/<name> into a new temporary folder (path in tmp). */
static bool copy_case(const char *name, char *tmp, size_t cap) {
    snprintf(tmp, cap, "/tmp/di_badckpt_XXXXXX");
    if (!mkdtemp(tmp)) return false;
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/%s", DATA_DIR, name);
    DIR *d = opendir(src);
    if (!d) return false;
    struct dirent *e;
    bool ok = true;
    while (ok && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(src, sizeof src, "%s/%s/%s", DATA_DIR, name, e->d_name);
        snprintf(dst, sizeof dst, "%s/%s", tmp, e->d_name);
        size_t len;
        unsigned char *b = slurp(src, &len);
        ok = b && spit(dst, b, len);
        free(b);
    }
    closedir(d);
    return ok;
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* Rewrites the header of a safetensors file through `edit` (data section unchanged). */
static bool edit_header(const char *path, void (*edit)(json_t *hdr, void *arg), void *arg) {
    size_t len;
    unsigned char *b = slurp(path, &len);
    if (!b || len < 8) return false;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | b[i];
    json_t *hdr = json_loadb((const char *)b + 8, (size_t)hl, 0, NULL);
    if (!hdr) return false;
    edit(hdr, arg);
    char *txt = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t nl = strlen(txt), padded = (nl + 7) / 8 * 8;
    size_t data_len = len - 8 - (size_t)hl, out_len = 8 + padded + data_len;
    unsigned char *out = malloc(out_len);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(out + 8, txt, nl);
    memset(out + 8 + nl, ' ', padded - nl);
    memcpy(out + 8 + padded, b + 8 + hl, data_len);
    bool ok = spit(path, out, out_len);
    free(txt), free(out), free(b);
    return ok;
}

static void del_tensor(json_t *hdr, void *arg) {
    json_object_del(hdr, (const char *)arg);
}

static void transpose_shape(json_t *hdr, void *arg) {
    json_t *shape = json_object_get(json_object_get(hdr, (const char *)arg), "shape");
    json_t *a = json_copy(json_array_get(shape, 0)), *b = json_copy(json_array_get(shape, 1));
    json_array_set_new(shape, 0, b);
    json_array_set_new(shape, 1, a);
}

static bool edit_config(const char *dir, const char *del_field, const char *arch) {
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_t *cfg = json_load_file(p, 0, NULL);
    if (!cfg) return false;
    if (del_field) json_object_del(cfg, del_field);
    if (arch) {
        json_t *a = json_array();
        json_array_append_new(a, json_string(arch));
        json_object_set_new(cfg, "architectures", a);
        json_object_set_new(cfg, "model_type", json_string("llama"));
    }
    bool ok = json_dump_file(cfg, p, JSON_INDENT(2)) == 0;
    json_decref(cfg);
    return ok;
}

/* Loads dir, expects failure with every needle in the message. */
static void expect_fail(const char *what, const char *dir, const char *n1, const char *n2) {
    di_model *m = NULL;
    di_model_params mp = di_model_default_params();
    mp.n_threads = 1;
    di_status st = di_model_load(dir, &mp, &m);
    const char *msg = di_last_error();
    CHECK_MSG(st != DI_OK && m == NULL, "%s: loaded anyway", what);
    CHECK_MSG(!n1 || strstr(msg, n1), "%s: message \"%s\" lacks \"%s\"", what, msg, n1);
    CHECK_MSG(!n2 || strstr(msg, n2), "%s: message \"%s\" lacks \"%s\"", what, msg, n2);
    printf("  %-22s -> %s\n", what, msg);
    di_model_free(m);
}

static bool have_case(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/model.safetensors", DATA_DIR, name);
    return access(p, R_OK) == 0;
}

/* The golden cases are committed: a missing one is a failure, not a skip. */
static bool require_case(const char *name) {
    bool ok = have_case(name);
    CHECK_MSG(ok, "tests/data/%s missing", name);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* Cases                                                                                      */
/* ---------------------------------------------------------------------------------------- */

TEST(intact_copy_loads) {
    if (!require_case("v2_lite")) return;
    char dir[256];
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    di_model *m = NULL;
    CHECK_MSG(di_model_load(dir, NULL, &m) == DI_OK, "%s", di_last_error());
    di_model_free(m);
    remove_dir(dir);
}

TEST(missing_safetensors) {
    if (!require_case("v2_lite")) return;
    char dir[256], p[512];
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    expect_fail("missing safetensors", dir, dir, "safetensors");
    remove_dir(dir);
}

TEST(missing_tensor) {
    if (!require_case("v2_lite")) return;
    char dir[256], p[512];
    const char *t = "model.layers.1.self_attn.kv_b_proj.weight";
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(edit_header(p, del_tensor, (void *)t));
    expect_fail("missing tensor", dir, "model.safetensors",
                "\"model.layers.1.self_attn.kv_b_proj.weight\"");
    remove_dir(dir);
}

TEST(wrong_shape) {
    if (!require_case("v2_lite")) return;
    char dir[256], p[512];
    const char *t = "model.layers.0.self_attn.kv_b_proj.weight";
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(edit_header(p, transpose_shape, (void *)t));
    expect_fail("wrong shape", dir,
                "model.safetensors: tensor \"model.layers.0.self_attn.kv_b_proj.weight\" has "
                "shape [48, 192], expected [192, 48]",
                NULL);
    remove_dir(dir);
}

TEST(missing_fp8_scale) {
    if (!require_case("v3_fp8")) return;
    char dir[256], p[512];
    const char *t = "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv";
    CHECK(copy_case("v3_fp8", dir, sizeof dir));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(edit_header(p, del_tensor, (void *)t));
    expect_fail("missing fp8 scale", dir, "model.safetensors", t);
    remove_dir(dir);
}

TEST(config_missing_field) {
    if (!require_case("v2_lite")) return;
    char dir[256];
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    CHECK(edit_config(dir, "kv_lora_rank", NULL));
    expect_fail("config missing field", dir, "config.json", "\"kv_lora_rank\"");
    remove_dir(dir);
}

TEST(unsupported_architecture) {
    if (!require_case("v2_lite")) return;
    char dir[256];
    CHECK(copy_case("v2_lite", dir, sizeof dir));
    CHECK(edit_config(dir, NULL, "LlamaForCausalLM"));
    expect_fail("unsupported arch", dir, "config.json", "LlamaForCausalLM");
    remove_dir(dir);
}

int main(void) {
    RUN(intact_copy_loads);
    RUN(missing_safetensors);
    RUN(missing_tensor);
    RUN(wrong_shape);
    RUN(missing_fp8_scale);
    RUN(config_missing_field);
    RUN(unsupported_architecture);
    return test_summary();
}
