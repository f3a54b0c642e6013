/*
 * tok_utf8.c -- UTF-8 decoding with replacement, and GPT-2's byte <-> code point mapping.
 *
 * Design stance: the tokenizer's public functions take bytes. Ill-formed input is repaired
 * exactly the way Python's bytes.decode("utf-8", errors="replace") and Rust's
 * String::from_utf8_lossy do it (the Unicode "maximal subpart" practice, also WHATWG's): each
 * maximal prefix of a would-be sequence that is still valid becomes one U+FFFD, and a byte
 * that cannot start a sequence becomes one U+FFFD. Running HF on the repaired text and us on
 * the raw bytes therefore gives the same ids.
 */
#include "tok/tok_internal.h"

#include <string.h>

static const uint8_t k_fffd[3] = {0xEF, 0xBF, 0xBD};

/* For a lead byte: number of continuation bytes and the allowed range of the first one.
 * Returns false for bytes that can never start a sequence. */
static bool lead_info(uint8_t b, int *need, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        *need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        *need = 2;
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        *need = 3;
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F; /* nothing above U+10FFFF */
    } else {
        return false;
    }
    return true;
}

size_t tok_utf8_lossy(const uint8_t *in, size_t n, uint8_t *out, bool final, size_t *consumed) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t b = in[i];
        if (b < 0x80) {
            out[o++] = b;
            i++;
            continue;
        }
        int need;
        uint8_t lo, hi;
        if (!lead_info(b, &need, &lo, &hi)) {
            memcpy(out + o, k_fffd, 3);
            o += 3;
            i++;
            continue;
        }
        size_t j = i + 1;
        bool bad = false;
        for (int k = 0; k < need; k++, j++) {
            if (j >= n) {
                if (!final) goto stop; /* may complete with the next bytes */
                bad = true;
                break;
            }
            uint8_t c = in[j];
            if (c < (k ? 0x80 : lo) || c > (k ? 0xBF : hi)) {
                bad = true;
                break;
            }
        }
        if (bad) {
            memcpy(out + o, k_fffd, 3);
            o += 3;
        } else {
            memcpy(out + o, in + i, j - i);
            o += j - i;
        }
        i = j;
    }
stop:
    if (consumed) *consumed = i;
    return o;
}

size_t tok_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* Fast path: eight ASCII bytes at a time. */
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        int need;
        uint8_t lo, hi;
        if (!lead_info(b, &need, &lo, &hi) || n - i <= (size_t)need) return i;
        for (int k = 1; k <= need; k++) {
            uint8_t c = s[i + k];
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
        }
        i += (size_t)need + 1;
    }
    return i;
}

size_t tok_utf8_next(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80 || n < 2) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (b < 0xF0 || n < 4) {
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

/* Unicode White_Space, which is what Rust's char::is_whitespace and regex's \s use. */
bool tok_is_unicode_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* GPT-2 keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as themselves and maps
 * the other 68 bytes, in increasing order, to U+0100 onwards. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (b - 0x7Fu);
    if (b == 0xAD) return 256u + 33u + 34u;
    return b;
}

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF))
        return (int)cp;
    if (cp >= 256 && cp < 256 + 33) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp < 256 + 67) return (int)(cp - 256 - 33 + 0x7F);
    if (cp == 256 + 67) return 0xAD;
    return -1;
}
