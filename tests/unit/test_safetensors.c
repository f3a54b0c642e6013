/*
 * test_safetensors.c -- the safetensors reader on hand-built files: single files, sharded
 * folders with and without an index, every dtype's size, and each way a header can lie.
 *
 * Files are written into a fresh mkdtemp folder under /tmp; each failure case checks the
 * status and that the message names the file and the tensor.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"
#include "test.h"

#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_root[64];

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Builds `u64 len | header | data`; data byte i is (uint8_t)(i * 7 + 1). */
static uint8_t *image(const char *header, size_t data_len, size_t *out_len) {
    size_t h = strlen(header);
    *out_len = 8 + h + data_len;
    uint8_t *buf = malloc(*out_len);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + h + i] = (uint8_t)(i * 7 + 1);
    return buf;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

/* Writes a safetensors file dir/name and returns its path (static buffer). */
static const char *write_st(const char *dir, const char *name, const char *header,
                            size_t data_len) {
    static char path[512];
    size_t n;
    uint8_t *buf = image(header, data_len, &n);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, buf, n);
    free(buf);
    return path;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_bytes(path, text, strlen(text));
}

/* A fresh sub-folder of the test's temp folder. */
static const char *subdir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_root, name);
    mkdir(path, 0700);
    return path;
}

#define CHECK_FAIL(expr, want, sub1, sub2)                                                         \
    do {                                                                                           \
        di_st_set *s_ = (di_st_set *)1;                                                            \
        di_status got_ = expr(&s_);                                                                \
        CHECK_MSG(got_ == (want), "status %s, want %s (%s)", di_status_str(got_),                  \
                  di_status_str(want), di_last_error());                                           \
        CHECK(s_ == NULL);                                                                         \
        CHECK_MSG(strstr(di_last_error(), sub1) != NULL, "message \"%s\" lacks \"%s\"",            \
                  di_last_error(), sub1);                                                          \
        CHECK_MSG(strstr(di_last_error(), sub2) != NULL, "message \"%s\" lacks \"%s\"",            \
                  di_last_error(), sub2);                                                          \
        if (got_ == DI_OK && s_) di_st_close(s_);                                                  \
    } while (0)

/* Parses an in-memory image named "mem.safetensors". */
static const char *g_header;
static size_t g_data_len;
static di_status parse_mem(di_st_set **out) {
    size_t n;
    uint8_t *buf = image(g_header, g_data_len, &n);
    di_status st = di_st_parse_buffer(buf, n, "mem.safetensors", out);
    if (st == DI_OK) { /* the image dies next; so must the set */
        di_st_close(*out);
        *out = NULL;
    }
    free(buf);
    return st;
}

static const char *g_path;
static di_status open_file(di_st_set **out) {
    return di_st_open_file(g_path, out);
}
static di_status open_dir(di_st_set **out) {
    return di_st_open_dir(g_path, out);
}

#define T_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"
#define T_B "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}"

/* ---------------------------------------------------------------------------------------- */
/* Good files                                                                                 */
/* ---------------------------------------------------------------------------------------- */

TEST(single_file) {
    const char *dir = subdir("single");
    /* b is listed first to check that tensors come back in offset order. */
    const char *p = write_st(dir, "model.safetensors",
                             "{\"__metadata__\":{\"format\":\"pt\"}," T_B "," T_A "}", 32);
    di_st_set *s = NULL;
    CHECK_EQ_INT(di_st_open_file(p, &s), DI_OK);
    if (!s) return;
    CHECK_EQ_INT(di_st_count(s), 2);
    const di_st_tensor *a = di_st_find(s, "a");
    CHECK(a && a->dtype == DI_DTYPE_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3);
    CHECK(a && a->nbytes == 24 && di_st_numel(a) == 6);
    CHECK(a && ((const uint8_t *)a->data)[0] == 1 && ((const uint8_t *)a->data)[1] == 8);
    const di_st_tensor *b = di_st_find(s, "b");
    CHECK(b && b->dtype == DI_DTYPE_BF16 && b->nbytes == 8);
    CHECK(b && ((const uint8_t *)b->data)[0] == (uint8_t)(24 * 7 + 1));
    CHECK(di_st_at(s, 0) == a && di_st_at(s, 1) == b && di_st_at(s, 2) == NULL);
    CHECK(di_st_find(s, "c") == NULL && di_st_find(s, "__metadata__") == NULL);
    CHECK(strstr(di_st_file_path(s, 0), "model.safetensors") != NULL);
    di_st_close(s);
}

TEST(every_dtype_size) {
    static const struct {
        const char *name;
        size_t bytes_for_3;
    } dt[] = {{"F64", 24}, {"F32", 12}, {"F16", 6}, {"BF16", 6}, {"F8_E4M3", 3}, {"F8_E8M0", 3},
              {"I64", 24}, {"I32", 12}, {"I8", 3},  {"U8", 3},   {"BOOL", 3},    {"F4", 2}};
    char header[4096] = "{";
    size_t off = 0;
    for (size_t i = 0; i < DI_ARRAY_LEN(dt); i++) {
        char e[160];
        snprintf(e, sizeof e,
                 "\"t_%s\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]},",
                 dt[i].name, dt[i].name, off, off + dt[i].bytes_for_3);
        strcat(header, e);
        off += dt[i].bytes_for_3;
    }
    /* A scalar (numel 1) and an empty tensor at the very end of the data. */
    char tail[200];
    snprintf(tail, sizeof tail,
             "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[%zu,%zu]},"
             "\"empty\":{\"dtype\":\"F32\",\"shape\":[4,0],\"data_offsets\":[%zu,%zu]}}",
             off, off + 4, off + 4, off + 4);
    strcat(header, tail);
    size_t n;
    uint8_t *buf = image(header, off + 4, &n);
    di_st_set *s = NULL;
    CHECK_MSG(di_st_parse_buffer(buf, n, "dtypes", &s) == DI_OK, "%s", di_last_error());
    if (s) {
        CHECK_EQ_INT(di_st_count(s), DI_ARRAY_LEN(dt) + 2);
        for (size_t i = 0; i < DI_ARRAY_LEN(dt); i++) {
            char name[32];
            snprintf(name, sizeof name, "t_%s", dt[i].name);
            const di_st_tensor *t = di_st_find(s, name);
            CHECK_MSG(t && t->nbytes == dt[i].bytes_for_3, "%s", name);
            CHECK(t && strcmp(di_dtype_name(t->dtype), dt[i].name) == 0);
        }
        const di_st_tensor *sc = di_st_find(s, "scalar");
        CHECK(sc && sc->ndim == 0 && di_st_numel(sc) == 1 && sc->nbytes == 4);
        const di_st_tensor *e = di_st_find(s, "empty");
        CHECK(e && e->nbytes == 0 && di_st_numel(e) == 0);
        di_st_close(s);
    }
    free(buf);
}

TEST(sharded_with_index) {
    const char *dir = subdir("sharded");
    write_st(dir, "model-00001-of-00002.safetensors", "{" T_A "}", 24);
    write_st(dir, "model-00002-of-00002.safetensors", "{" T_B "}", 32);
    write_text(dir, "model.safetensors.index.json",
               "{\"metadata\":{\"total_size\":56},\"weight_map\":{"
               "\"a\":\"model-00001-of-00002.safetensors\","
               "\"b\":\"model-00002-of-00002.safetensors\"}}");
    /* A stray file the index does not name must be ignored. */
    write_st(dir, "stray.safetensors", "{" T_A "}", 24);
    di_st_set *s = NULL;
    CHECK_MSG(di_st_open_dir(dir, &s) == DI_OK, "%s", di_last_error());
    if (!s) return;
    CHECK_EQ_INT(di_st_count(s), 2);
    const di_st_tensor *a = di_st_find(s, "a"), *b = di_st_find(s, "b");
    CHECK(a && b && a->file_index != b->file_index);
    CHECK(a && strstr(di_st_file_path(s, a->file_index), "00001-of-00002") != NULL);
    CHECK(b && strstr(di_st_file_path(s, b->file_index), "00002-of-00002") != NULL);
    CHECK(b && ((const uint8_t *)b->data)[0] == (uint8_t)(24 * 7 + 1));
    di_st_close(s);
}

TEST(folder_without_index) {
    const char *dir = subdir("noindex");
    write_st(dir, "b.safetensors", "{" T_B "}", 32);
    write_st(dir, "a.safetensors", "{" T_A "}", 24);
    write_text(dir, "config.json", "{}");
    di_st_set *s = NULL;
    CHECK_MSG(di_st_open_dir(dir, &s) == DI_OK, "%s", di_last_error());
    if (!s) return;
    CHECK_EQ_INT(di_st_count(s), 2);
    /* Files are taken in sorted order: a.safetensors is file 0. */
    CHECK(strstr(di_st_file_path(s, 0), "a.safetensors") != NULL);
    CHECK(di_st_find(s, "a") && di_st_find(s, "a")->file_index == 0);
    di_st_close(s);
}

/* Fuzz regression: a header with no tensors is valid and gives an empty set. */
TEST(empty_header) {
    static const char *headers[] = {"{}", "{\"__metadata__\":{}}"};
    for (size_t i = 0; i < DI_ARRAY_LEN(headers); i++) {
        size_t n;
        uint8_t *buf = image(headers[i], 0, &n);
        di_st_set *s = NULL;
        CHECK_EQ_INT(di_st_parse_buffer(buf, n, "empty", &s), DI_OK);
        CHECK(di_st_count(s) == 0 && di_st_find(s, "a") == NULL && di_st_at(s, 0) == NULL);
        di_st_close(s);
        free(buf);
    }
}

TEST(many_tensors_hash) {
    /* Enough names to force probing chains in the table. */
    char *header = malloc(200000);
    strcpy(header, "{");
    for (int i = 0; i < 2000; i++) {
        char e[128];
        snprintf(e, sizeof e,
                 "%s\"layers.%d.w\":{\"dtype\":\"U8\",\"shape\":[1],"
                 "\"data_offsets\":[%d,%d]}",
                 i ? "," : "", i, i, i + 1);
        strcat(header, e);
    }
    strcat(header, "}");
    size_t n;
    uint8_t *buf = image(header, 2000, &n);
    di_st_set *s = NULL;
    CHECK_EQ_INT(di_st_parse_buffer(buf, n, "many", &s), DI_OK);
    if (s) {
        int found = 0;
        for (int i = 0; i < 2000; i++) {
            char name[32];
            snprintf(name, sizeof name, "layers.%d.w", i);
            const di_st_tensor *t = di_st_find(s, name);
            found += t && ((const uint8_t *)t->data)[0] == (uint8_t)(i * 7 + 1);
        }
        CHECK_EQ_INT(found, 2000);
        di_st_close(s);
    }
    free(buf);
    free(header);
}

/* ---------------------------------------------------------------------------------------- */
/* Bad headers (in memory)                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void mem_case(const char *header, size_t data_len, di_status want, const char *sub) {
    g_header = header;
    g_data_len = data_len;
    CHECK_FAIL(parse_mem, want, "mem.safetensors", sub);
}

TEST(bad_json) {
    mem_case("{\"a\":", 0, DI_ERR_FORMAT, "not valid JSON");
    mem_case("[1,2]", 0, DI_ERR_FORMAT, "not a JSON object");
    mem_case("{\"a\":1,\"a\":2}", 0, DI_ERR_FORMAT, "not valid JSON");
    mem_case("{\"a\":[]}", 0, DI_ERR_FORMAT, "\"a\"");
}

TEST(bad_dtype) {
    mem_case("{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             DI_ERR_UNSUPPORTED, "tensor \"w\": unsupported dtype \"F8_E5M2\"");
    mem_case("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
             DI_ERR_UNSUPPORTED, "\"Q4_K\"");
    mem_case("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, DI_ERR_FORMAT,
             "tensor \"w\"");
}

TEST(bad_shape) {
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24,
             DI_ERR_FORMAT, "tensor \"w\": data range [0, 20) holds 20 bytes");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, DI_ERR_FORMAT,
             "tensor \"w\": shape[0]");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, DI_ERR_FORMAT,
             "tensor \"w\"");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
             DI_ERR_UNSUPPORTED, "tensor \"w\"");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
             "\"data_offsets\":[0,4]}}",
             4, DI_ERR_FORMAT, "tensor \"w\": shape overflows");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, DI_ERR_FORMAT,
             "tensor \"w\"");
}

TEST(bad_offsets) {
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8, DI_ERR_FORMAT,
             "tensor \"w\": data range [4, 12) outside the data section (8 bytes)");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DI_ERR_FORMAT,
             "tensor \"w\"");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, DI_ERR_FORMAT,
             "tensor \"w\"");
    mem_case("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, DI_ERR_FORMAT,
             "tensor \"w\"");
}

TEST(overlapping) {
    mem_case("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
             12, DI_ERR_FORMAT, "tensor \"y\" overlaps tensor \"x\"");
    /* Same range twice. */
    mem_case("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
             8, DI_ERR_FORMAT, "overlaps tensor");
}

TEST(bad_header_length) {
    /* Shorter than the length field itself. */
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    di_st_set *s = NULL;
    CHECK_EQ_INT(di_st_parse_buffer(tiny, sizeof tiny, "tiny.safetensors", &s), DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "tiny.safetensors: file too short") != NULL);
    /* Header length past the end of the file, and over the 100 MB limit. */
    uint8_t buf[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    CHECK_EQ_INT(di_st_parse_buffer(buf, 10, "eof.safetensors", &s), DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "eof.safetensors: header length 100 runs past the end") != NULL);
    uint8_t huge[10] = {0, 0, 0, 0, 1, 0, 0, 0, '{', '}'};
    CHECK_EQ_INT(di_st_parse_buffer(huge, 10, "huge.safetensors", &s), DI_ERR_FORMAT);
    CHECK(strstr(di_last_error(), "huge.safetensors: header length") != NULL);
    CHECK(s == NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* Bad files and folders                                                                      */
/* ---------------------------------------------------------------------------------------- */

TEST(truncated_file) {
    const char *dir = subdir("truncated");
    /* Header promises 32 bytes of data; only 20 are there. */
    g_path = write_st(dir, "cut.safetensors", "{" T_A "," T_B "}", 20);
    CHECK_FAIL(open_file, DI_ERR_FORMAT, "cut.safetensors: tensor \"", "outside the data");
    char path[512];
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    write_bytes(path, "\x10\0\0", 3);
    g_path = path;
    CHECK_FAIL(open_file, DI_ERR_FORMAT, "short.safetensors", "too short");
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    CHECK_FAIL(open_file, DI_ERR_IO, "absent.safetensors", "cannot open");
}

TEST(missing_shard) {
    const char *dir = subdir("missing_shard");
    write_st(dir, "s1.safetensors", "{" T_A "}", 24);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    g_path = dir;
    CHECK_FAIL(open_dir, DI_ERR_IO, "s2.safetensors", "cannot open");
}

TEST(tensor_missing_from_shard) {
    const char *dir = subdir("missing_tensor");
    write_st(dir, "s1.safetensors", "{" T_A "}", 24);
    write_st(dir, "s2.safetensors", "{" T_B "}", 32);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\","
               "\"c\":\"s2.safetensors\"}}");
    g_path = dir;
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "s2.safetensors: tensor \"c\"", "is missing");
    /* The index names the wrong shard for a tensor that exists. */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s2.safetensors\",\"b\":\"s1.safetensors\"}}");
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "tensor \"a\" is in", "s1.safetensors");
}

TEST(bad_index) {
    const char *dir = subdir("bad_index");
    write_st(dir, "s1.safetensors", "{" T_A "}", 24);
    g_path = dir;
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}");
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "model.safetensors.index.json", "bad shard name");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":[1]}");
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "model.safetensors.index.json", "weight_map");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\":");
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "model.safetensors.index.json", "not valid JSON");
}

TEST(duplicate_across_shards) {
    const char *dir = subdir("dup_index");
    write_st(dir, "s1.safetensors", "{" T_A "}", 24);
    write_st(dir, "s2.safetensors", "{" T_A "," T_B "}", 32);
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s2.safetensors\"}}");
    g_path = dir;
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "tensor \"a\" is also in", "s1.safetensors");
    const char *dir2 = subdir("dup_noindex");
    write_st(dir2, "s1.safetensors", "{" T_A "}", 24);
    write_st(dir2, "s2.safetensors", "{" T_A "}", 24);
    g_path = dir2;
    CHECK_FAIL(open_dir, DI_ERR_FORMAT, "s2.safetensors: tensor \"a\" is also in",
               "s1.safetensors");
}

TEST(empty_folder) {
    g_path = subdir("empty");
    CHECK_FAIL(open_dir, DI_ERR_NOT_FOUND, "empty", "no *.safetensors");
}

/* ---------------------------------------------------------------------------------------- */

static void remove_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
}

int main(void) {
    strcpy(g_root, "/tmp/di-test-st-XXXXXX");
    if (!mkdtemp(g_root)) {
        printf("mkdtemp failed\n");
        return 1;
    }
    RUN(single_file);
    RUN(every_dtype_size);
    RUN(sharded_with_index);
    RUN(folder_without_index);
    RUN(empty_header);
    RUN(many_tensors_hash);
    RUN(bad_json);
    RUN(bad_dtype);
    RUN(bad_shape);
    RUN(bad_offsets);
    RUN(overlapping);
    RUN(bad_header_length);
    RUN(truncated_file);
    RUN(missing_shard);
    RUN(tensor_missing_from_shard);
    RUN(bad_index);
    RUN(duplicate_across_shards);
    RUN(empty_folder);
    remove_tree(g_root);
    return test_summary();
}
