/*
 * fuzz_tokenizer_json.c -- libFuzzer target: the tokenizer.json reader on arbitrary bytes.
 *
 * Whatever the input, loading must either fail with a status and a message or give a
 * tokenizer that encodes and decodes without crashing; decode(encode(text)) of plain ASCII
 * must not read out of bounds either. Seeds: fuzz/corpus/tokenizer_json/.
 */
#include "deepinfer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_tokenizer *t = NULL;
    if (di_tokenizer_load_json((const char *)data, size, &t) != DI_OK) return 0;
    static const char *texts[] = {"Hello, world! 123", " <s>x</s> \xff\xfe", "", "a  b\n\n\tc"};
    int32_t ids[512];
    char out[4096];
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int64_t n = di_tokenizer_encode(t, texts[i], strlen(texts[i]), true, ids, 512);
        if (n > 0) di_tokenizer_decode(t, ids, n, i & 1, out, sizeof out);
    }
    int32_t probe[] = {0, 1, 2, 3, -1, 1 << 30, di_tokenizer_vocab_size(t) - 1};
    di_tokenizer_decode(t, probe, 7, false, out, sizeof out);
    for (int i = 0; i < 7; i++)
        di_tokenizer_id_to_token(t, probe[i]);
    di_tokenizer_free(t);
    return 0;
}
