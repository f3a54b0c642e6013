/*
 * fuzz_safetensors.c -- libFuzzer target: the input is a whole safetensors file image.
 *
 * di_st_parse_buffer must either reject the image with a status or return a set whose
 * every view lies inside the image; the loop below touches each view's first and last byte
 * so that AddressSanitizer catches a view that escapes.
 */
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, sized exactly, so reads past the end are caught. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    di_st_set *set = NULL;
    if (di_st_parse_buffer(buf, size, "fuzz.safetensors", &set) == DI_OK) {
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < di_st_count(set); i++) {
            const di_st_tensor *t = di_st_at(set, i);
            if (di_st_find(set, t->name) != t) abort();
            if (t->nbytes)
                sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        }
        (void)sink;
        di_st_close(set);
    }
    free(buf);
    return 0;
}
