/*
 * test_tokenizer.c -- the tokenizer against Hugging Face `tokenizers` goldens.
 *
 * Data (written by tools/make_tok_goldens.py, read here without Python):
 *   tests/data/tokenizer/deepseek_v3.jsonl       ~2.5k cases for DeepSeek-V3's tokenizer.json
 *   tests/data/tokenizer/variants/<name>.json(l) small tokenizers with other pipelines
 *   $DI_SHARED_DIR/conformance/tokenizer-vectors/deepseek-v3.lenml-generated.{inp,out}
 * DeepSeek-V3's tokenizer.json itself comes from $DI_SHARED_DIR; tests that need it SKIP
 * when it is absent.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"
#include "test.h"

#include <jansson.h>
#include <pthread.h>

#define DS_DIR  DI_SHARED_DIR "/tokenizers/deepseek-v3"
#define DS_JSON DS_DIR "/tokenizer.json"
#define DATA    DI_SOURCE_DIR "/tests/data/tokenizer"

static const char k_bos[] = "<｜begin▁of▁sentence｜>";

static bool file_exists(const char *p) {
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}

/* Whether s is valid UTF-8 that ends on a character boundary (independent of the library). */
static bool utf8_complete(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = s[i] < 0x80 ? 0 : s[i] >= 0xF0 ? 3 : s[i] >= 0xE0 ? 2 : s[i] >= 0xC2 ? 1 : -1;
        if (k < 0 || i + (size_t)k >= n) return false;
        for (int j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += (size_t)k + 1;
    }
    return true;
}

static size_t ids_of(json_t *a, int32_t *out, size_t cap) {
    size_t n = json_array_size(a);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return n;
}

/* Input bytes of a case: "hex" when present (invalid UTF-8), else "text". */
static size_t case_input(json_t *row, char *buf, size_t cap, const char **in) {
    const char *hex = json_string_value(json_object_get(row, "hex"));
    if (!hex) {
        *in = json_string_value(json_object_get(row, "text"));
        return json_string_length(json_object_get(row, "text"));
    }
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n && i < cap; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        buf[i] = (char)v;
    }
    *in = buf;
    return n;
}

static bool ids_equal(const di_tokenizer *t, const char *in, size_t n, bool special,
                      const int32_t *want, size_t n_want) {
    static int32_t got[1 << 16];
    int64_t m = di_tokenizer_encode(t, in, n, special, got, 1 << 16);
    if (m != (int64_t)n_want) return false;
    return !memcmp(got, want, n_want * sizeof *want);
}

static bool decode_equal(const di_tokenizer *t, const int32_t *ids, size_t n, bool skip,
                         const char *want, size_t want_len) {
    static char out[1 << 18];
    int64_t m = di_tokenizer_decode(t, ids, (int64_t)n, skip, out, sizeof out);
    return m == (int64_t)want_len && !memcmp(out, want, want_len);
}

/* Streams ids through a detokenizer: every chunk whole UTF-8, all chunks == want. */
static bool stream_equal(const di_tokenizer *t, const int32_t *ids, size_t n, const char *want,
                         size_t want_len) {
    di_detok *d;
    if (di_detok_create(t, false, &d) != DI_OK) return false;
    static char acc[1 << 18];
    char chunk[1024];
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        int64_t m = di_detok_push(d, ids[i], chunk, sizeof chunk);
        ok = m >= 0 && utf8_complete((unsigned char *)chunk, (size_t)m) &&
             k + (size_t)m < sizeof acc;
        if (ok) memcpy(acc + k, chunk, (size_t)m), k += (size_t)m;
    }
    int64_t m = di_detok_flush(d, chunk, sizeof chunk);
    if (ok && m >= 0) memcpy(acc + k, chunk, (size_t)m), k += (size_t)m;
    di_detok_free(d);
    return ok && k == want_len && !memcmp(acc, want, k);
}

TEST(deepseek_goldens) {
    if (!file_exists(DS_JSON)) SKIP("%s absent", DS_JSON);
    di_tokenizer *t, *tf;
    CHECK_EQ_INT(di_tokenizer_load(DS_JSON, &t), DI_OK);
    CHECK_EQ_INT(di_tokenizer_load(DS_DIR, &tf), DI_OK); /* folder: adds BOS */
    FILE *f = fopen(DATA "/deepseek_v3.jsonl", "rb");
    CHECK(f != NULL);
    if (!f || !t || !tf) return;
    static int32_t ids[1 << 16], ids_bos[1 << 16];
    static char raw[1 << 16], want[1 << 18];
    char *line = NULL;
    size_t lcap = 0, n_cases = 0, n_bad = 0;
    while (getline(&line, &lcap, f) > 0) {
        json_t *row = json_loads(line, JSON_ALLOW_NUL, NULL);
        const char *in, *text = json_string_value(json_object_get(row, "text"));
        size_t tlen = json_string_length(json_object_get(row, "text"));
        size_t n_in = case_input(row, raw, sizeof raw, &in);
        size_t n = ids_of(json_object_get(row, "ids"), ids, 1 << 16), nb;
        json_t *jb = json_object_get(row, "ids_bos");
        if (jb) {
            nb = ids_of(jb, ids_bos, 1 << 16);
        } else {
            ids_bos[0] = 0;
            memcpy(ids_bos + 1, ids, n * sizeof *ids);
            nb = n + 1;
        }
        json_t *jd = json_object_get(row, "dec"), *js = json_object_get(row, "dec_skip");
        size_t wl = jd ? json_string_length(jd) : strlen(k_bos) + tlen;
        if (jd)
            memcpy(want, json_string_value(jd), wl);
        else
            memcpy(want, k_bos, strlen(k_bos)), memcpy(want + strlen(k_bos), text, tlen);
        bool ok = ids_equal(t, in, n_in, false, ids, n) && ids_equal(t, in, n_in, true, ids, n) &&
                  ids_equal(tf, in, n_in, true, ids_bos, nb) &&
                  decode_equal(t, ids_bos, nb, false, want, wl) &&
                  stream_equal(t, ids_bos, nb, want, wl) &&
                  decode_equal(t, ids_bos, nb, true, js ? json_string_value(js) : text,
                               js ? json_string_length(js) : tlen);
        if (!ok && n_bad++ < 5) printf("  mismatch in case %zu: %.60s\n", n_cases, text);
        n_cases++;
        json_decref(row);
    }
    free(line);
    fclose(f);
    printf("  %zu deepseek cases, %zu mismatched\n", n_cases, n_bad);
    CHECK(n_cases > 2000);
    CHECK_EQ_INT(n_bad, 0);
    di_tokenizer_free(t);
    di_tokenizer_free(tf);
}

TEST(conformance_vectors) {
    const char *inp =
        DI_SHARED_DIR "/conformance/tokenizer-vectors/deepseek-v3.lenml-generated.inp";
    const char *outp =
        DI_SHARED_DIR "/conformance/tokenizer-vectors/deepseek-v3.lenml-generated.out";
    if (!file_exists(DS_JSON) || !file_exists(inp)) SKIP("conformance vectors absent");
    di_tokenizer *t;
    CHECK_EQ_INT(di_tokenizer_load(DS_JSON, &t), DI_OK);
    size_t li, lo;
    char *in = slurp(inp, &li), *out = slurp(outp, &lo);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = in, *q = out;
    int n_cases = 0, n_bad = 0;
    for (char *e; (e = strstr(p, sep)); p = e + strlen(sep)) {
        char *nl = strchr(q, '\n');
        if (!nl) break;
        *nl = 0;
        int32_t want[4096];
        size_t n = 0;
        for (char *s = q, *end; n < 4096; s = end) {
            long v = strtol(s, &end, 10);
            if (end == s) break;
            want[n++] = (int32_t)v;
        }
        if (!ids_equal(t, p, (size_t)(e - p), false, want, n)) n_bad++;
        n_cases++;
        q = nl + 1;
    }
    printf("  %d conformance cases, %d mismatched\n", n_cases, n_bad);
    CHECK_EQ_INT(n_cases, 50);
    CHECK_EQ_INT(n_bad, 0);
    free(in);
    free(out);
    di_tokenizer_free(t);
}

static void run_variant(const char *name) {
    char path[512];
    snprintf(path, sizeof path, DATA "/variants/%s.json", name);
    di_tokenizer *t;
    di_status st = di_tokenizer_load(path, &t);
    CHECK_MSG(st == DI_OK, "%s: %s", name, di_last_error());
    if (st != DI_OK) return;
    snprintf(path, sizeof path, DATA "/variants/%s.jsonl", name);
    FILE *f = fopen(path, "rb");
    char *line = NULL;
    size_t lcap = 0;
    int n_cases = 0, n_bad = 0;
    static int32_t ids[1 << 16], ids_sp[1 << 16];
    while (f && getline(&line, &lcap, f) > 0) {
        json_t *row = json_loads(line, JSON_ALLOW_NUL, NULL);
        json_t *jt = json_object_get(row, "text"), *jd = json_object_get(row, "dec");
        size_t n = ids_of(json_object_get(row, "ids"), ids, 1 << 16);
        size_t ns = ids_of(json_object_get(row, "ids_special"), ids_sp, 1 << 16);
        const char *text = json_string_value(jt);
        bool ok = ids_equal(t, text, json_string_length(jt), false, ids, n) &&
                  ids_equal(t, text, json_string_length(jt), true, ids_sp, ns) &&
                  decode_equal(t, ids_sp, ns, false, json_string_value(jd), json_string_length(jd));
        if (!ok && n_bad++ < 3) printf("  %s mismatch: %.60s\n", name, text);
        n_cases++;
        json_decref(row);
    }
    free(line);
    if (f) fclose(f);
    CHECK_MSG(n_cases > 200 && n_bad == 0, "%s: %d of %d mismatched", name, n_bad, n_cases);
    di_tokenizer_free(t);
}

TEST(variants) {
    const char *names[] = {"gpt2_template_added",       "bytelevel_prefix_space",
                           "digits_split_behaviors",    "split_removed_invert",
                           "split_contiguous_isolated", "ignore_merges_pairs"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        run_variant(names[i]);
}

/* ---- malformed tokenizer.json: each a clear error ------------------------------------------ */

static void expect_error(const char *json, di_status want, const char *needle) {
    di_tokenizer *t = NULL;
    di_status st = di_tokenizer_load_json(json, strlen(json), &t);
    CHECK_MSG(st == want, "status %d, want %d (%s)", st, want, di_last_error());
    CHECK_MSG(strstr(di_last_error(), needle) != NULL, "\"%s\" lacks \"%s\"", di_last_error(),
              needle);
    CHECK(t == NULL);
}

#define MINI_PRE "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, "
#define MINI_MODEL(extra)                                                                          \
    "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}" extra "}"

TEST(malformed) {
    expect_error("{\"model\": ", DI_ERR_FORMAT, "invalid JSON");
    expect_error("[1, 2]", DI_ERR_FORMAT, "not a JSON object");
    expect_error("{" MINI_PRE MINI_MODEL(", \"merges\": [\"a c\"]") "}", DI_ERR_FORMAT,
                 "token \"c\" is not in the vocab");
    expect_error("{" MINI_PRE MINI_MODEL(", \"merges\": [\"b a\"]") "}", DI_ERR_FORMAT,
                 "merged token \"ba\"");
    expect_error("{" MINI_PRE MINI_MODEL(", \"merges\": [\"ab\"]") "}", DI_ERR_FORMAT,
                 "expected \"a b\"");
    expect_error("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
                 "\"behavior\": \"Isolated\"}, " MINI_MODEL(", \"merges\": []") "}",
                 DI_ERR_FORMAT, "bad regex");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", DI_ERR_UNSUPPORTED,
                 "\"Unigram\"");
    expect_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", DI_ERR_UNSUPPORTED,
                 "\"WordPiece\"");
    expect_error("{\"model\": {\"type\": \"WordLevel\", \"vocab\": {}}}", DI_ERR_UNSUPPORTED,
                 "\"WordLevel\"");
    expect_error("{\"normalizer\": {\"type\": \"NFKC\"}, " MINI_MODEL(", \"merges\": []") "}",
                 DI_ERR_UNSUPPORTED, "normalizer type \"NFKC\"");
    expect_error("{" MINI_MODEL(", \"merges\": [], \"byte_fallback\": true") "}",
                 DI_ERR_UNSUPPORTED, "byte_fallback");
    expect_error("{" MINI_MODEL(", \"merges\": []") ", \"decoder\": {\"type\": \"Metaspace\"}}",
                 DI_ERR_UNSUPPORTED, "decoder type \"Metaspace\"");
    di_tokenizer *t = NULL;
    CHECK_EQ_INT(di_tokenizer_load("/nonexistent/tokenizer.json", &t), DI_ERR_IO);
}

/* ---- API details ------------------------------------------------------------------------- */

TEST(api_basics) {
    if (!file_exists(DS_JSON)) SKIP("%s absent", DS_JSON);
    di_tokenizer *t;
    CHECK_EQ_INT(di_tokenizer_load(DS_JSON, &t), DI_OK);
    CHECK_EQ_INT(di_tokenizer_vocab_size(t), 128815);
    CHECK_EQ_INT(di_tokenizer_bos_id(t), 0);
    CHECK_EQ_INT(di_tokenizer_eos_id(t), 1);
    CHECK_EQ_INT(di_tokenizer_token_to_id(t, "<｜User｜>", strlen("<｜User｜>")), 128803);
    CHECK(!strcmp(di_tokenizer_id_to_token(t, 2058), "Ġworld"));
    CHECK(di_tokenizer_is_special(t, 0) && !di_tokenizer_is_special(t, 2058));
    int32_t ids[8];
    CHECK_EQ_INT(di_tokenizer_encode(t, "Hello, world!", 13, false, ids, 2), -4);
    CHECK_EQ_INT(di_tokenizer_encode(t, "Hello, world!", 13, false, ids, 8), 4);
    CHECK_EQ_INT(ids[2], 2058);
    CHECK_EQ_INT(di_tokenizer_encode(t, "", 0, false, NULL, 0), 0);
    char out[8];
    CHECK_EQ_INT(di_tokenizer_decode(t, ids, 4, false, out, 4), -13);
    /* A streaming push that does not fit consumes nothing. */
    di_detok *d;
    CHECK_EQ_INT(di_detok_create(t, true, &d), DI_OK);
    CHECK_EQ_INT(di_detok_push(d, 19923, out, 2), -5);
    CHECK_EQ_INT(di_detok_push(d, 19923, out, 8), 5);
    CHECK_EQ_INT(di_detok_push(d, 0, out, 8), 0); /* special, skipped */
    CHECK_EQ_INT(di_detok_flush(d, out, 8), 0);
    di_detok_free(d);
    di_tokenizer_free(t);
}

/* Every byte-level token alone and every pair of them: streaming never splits a character. */
TEST(stream_partial_utf8) {
    if (!file_exists(DS_JSON)) SKIP("%s absent", DS_JSON);
    di_tokenizer *t;
    CHECK_EQ_INT(di_tokenizer_load(DS_JSON, &t), DI_OK);
    int32_t seq[4096];
    size_t n = 0;
    for (int32_t id = 3; id < 128000 && n < 4096; id += 31)
        seq[n++] = id; /* mixed pieces */
    for (int32_t b = 0; b < 256 && n < 4096; b++) {
        char c = (char)b;
        int32_t one;
        if (di_tokenizer_encode(t, &c, 1, false, &one, 1) == 1) seq[n++] = one; /* maybe FFFD */
    }
    static char want[1 << 18];
    int64_t wl = di_tokenizer_decode(t, seq, (int64_t)n, false, want, sizeof want);
    CHECK(wl > 0 && stream_equal(t, seq, n, want, (size_t)wl));
    di_tokenizer_free(t);
}

/* ---- concurrency ------------------------------------------------------------------------- */

typedef struct {
    const di_tokenizer *t;
    const char *text;
    size_t len;
    int64_t n;
    int32_t *ids;
    bool same;
} enc_job;

static void *enc_thread(void *arg) {
    enc_job *j = arg;
    int32_t *mine = malloc((size_t)j->n * sizeof *mine);
    j->same = true;
    for (int r = 0; r < 20; r++) {
        int64_t n = di_tokenizer_encode(j->t, j->text, j->len, false, mine, j->n);
        if (n != j->n || memcmp(mine, j->ids, (size_t)n * sizeof *mine)) j->same = false;
    }
    free(mine);
    return NULL;
}

TEST(concurrent_encode) {
    if (!file_exists(DS_JSON)) SKIP("%s absent", DS_JSON);
    di_tokenizer *t;
    CHECK_EQ_INT(di_tokenizer_load(DS_JSON, &t), DI_OK);
    size_t len;
    char *text = slurp(DATA "/deepseek_v3.jsonl", &len);
    len = len > 200000 ? 200000 : len;
    int64_t n = -di_tokenizer_encode(t, text, len, false, NULL, 0);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    CHECK_EQ_INT(di_tokenizer_encode(t, text, len, false, ids, n), n);
    enc_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (enc_job){t, text, len, n, ids, false};
        pthread_create(&th[i], NULL, enc_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].same);
    }
    free(ids);
    free(text);
    di_tokenizer_free(t);
}

int main(void) {
    RUN(malformed);
    RUN(api_basics);
    RUN(deepseek_goldens);
    RUN(conformance_vectors);
    RUN(variants);
    RUN(stream_partial_utf8);
    RUN(concurrent_encode);
    return test_summary();
}
