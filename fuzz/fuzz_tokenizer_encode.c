/*
 * fuzz_tokenizer_encode.c -- libFuzzer target: encode arbitrary bytes with DeepSeek-V3's
 * tokenizer and check the round trip.
 *
 * The tokenizer comes from $DI_TOKENIZER, else ../shared/tokenizers/deepseek-v3/tokenizer.json
 * (or ../../shared/..., for runs from build-fuzz/). Oracles, for a byte-level tokenizer
 * without normalizer: decode(encode(x)) == x with ill-formed UTF-8 replaced by U+FFFD, and
 * the streaming detokenizer emits only whole characters and concatenates to the same text.
 */
#include "deepinfer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static di_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *paths[] = {getenv("DI_TOKENIZER"),
                           "../shared/tokenizers/deepseek-v3/tokenizer.json",
                           "../../shared/tokenizers/deepseek-v3/tokenizer.json"};
    for (size_t i = 0; i < 3 && !g_tok; i++)
        if (paths[i] && di_tokenizer_load(paths[i], &g_tok) != DI_OK) g_tok = NULL;
    if (!g_tok) {
        fprintf(stderr,
                "fuzz_tokenizer_encode: set DI_TOKENIZER to DeepSeek-V3's tokenizer.json\n");
        abort();
    }
    return 0;
}

/* Whether a chunk ends on a character boundary (lead bytes followed by their continuations). */
static int whole_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = s[i] < 0x80 ? 0 : s[i] >= 0xF0 ? 3 : s[i] >= 0xE0 ? 2 : s[i] >= 0xC2 ? 1 : -1;
        if (k < 0 || i + (size_t)k >= n) return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int64_t n = di_tokenizer_encode(g_tok, (const char *)data, size, false, NULL, 0);
    if (n == DI_TOK_ERROR) abort();
    n = -n;
    int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
    if (di_tokenizer_encode(g_tok, (const char *)data, size, false, ids, n) != n) abort();
    size_t cap = 3 * size + 16;
    char *dec = malloc(cap), *ref = malloc(cap), chunk[4096];
    int64_t m = di_tokenizer_decode(g_tok, ids, n, false, dec, (int64_t)cap);
    /* decode(encode(x)) is x repaired; encoding it again must give the same ids, and for
     * pure ASCII input it must be x itself. */
    if (m < 0) abort();
    int ascii = 1;
    for (size_t i = 0; i < size; i++)
        ascii &= data[i] < 0x80;
    if (ascii && ((size_t)m != size || memcmp(dec, data, size))) abort();
    int64_t n2 = di_tokenizer_encode(g_tok, dec, (size_t)m, false, NULL, 0);
    int32_t *ids2 = malloc((size_t)(-n2 + 1) * sizeof *ids2);
    if (di_tokenizer_encode(g_tok, dec, (size_t)m, false, ids2, -n2) != -n2 || -n2 != n ||
        memcmp(ids, ids2, (size_t)n * sizeof *ids))
        abort();
    di_detok *d;
    di_detok_create(g_tok, false, &d);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t c = di_detok_push(d, ids[i], chunk, sizeof chunk);
        if (c < 0 || !whole_utf8((unsigned char *)chunk, (size_t)c) || k + (size_t)c > cap) abort();
        memcpy(ref + k, chunk, (size_t)c);
        k += (size_t)c;
    }
    int64_t c = di_detok_flush(d, chunk, sizeof chunk);
    if (c < 0 || k + (size_t)c > cap) abort();
    memcpy(ref + k, chunk, (size_t)c);
    k += (size_t)c;
    if ((int64_t)k != m || memcmp(ref, dec, k)) abort();
    di_detok_free(d);
    free(ids2);
    free(ref);
    free(dec);
    free(ids);
    return 0;
}
