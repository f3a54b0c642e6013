/*
 * dtype.h -- element types of stored weights and their scalar conversions to float.
 *
 * These scalar conversions are the reference every SIMD kernel is tested against.
 * F8_E4M3 is the "fn" variant used by DeepSeek-V3 (no infinities; 0x7f/0xff are NaN,
 * max finite 448). F4_E2M1 and E8M0 are the FP4 expert weights and their power-of-two
 * scales used by DeepSeek-V4.
 */
#ifndef DI_DTYPE_H
#define DI_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DI_DTYPE_F32,
    DI_DTYPE_F16,
    DI_DTYPE_BF16,
    DI_DTYPE_F8_E4M3,
    DI_DTYPE_F8_E8M0, /* power-of-two scale: 2^(x - 127) */
    DI_DTYPE_F4_E2M1, /* two values per byte, low nibble first */
    DI_DTYPE_I64,
    DI_DTYPE_I32,
    DI_DTYPE_I8,
    DI_DTYPE_U8,
    DI_DTYPE_BOOL,
    DI_DTYPE_F64,
    DI_DTYPE_COUNT_
} di_dtype;

/* Name as safetensors spells it ("BF16", "F8_E4M3", ...). */
const char *di_dtype_name(di_dtype t);
/* Parses a safetensors dtype string; returns 0 on success, -1 if unknown. */
int di_dtype_parse(const char *s, di_dtype *out);
/* Bits per element (4 for F4_E2M1). */
int di_dtype_bits(di_dtype t);
/* Bytes for n elements (rounded up for sub-byte types). */
size_t di_dtype_bytes(di_dtype t, int64_t n);

static inline float di_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t di_bits_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float di_bf16_to_f32(uint16_t h) { return di_f32_from_bits((uint32_t)h << 16); }

/* Round-to-nearest-even, NaN preserved (as torch does). */
static inline uint16_t di_f32_to_bf16(float f) {
    uint32_t u = di_bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float di_f16_to_f32(uint16_t h);
uint16_t di_f32_to_f16(float f);

/* Table of the 256 F8_E4M3 (fn) values; di_e4m3_table[b] is the float for byte b. */
extern const float di_e4m3_table[256];
static inline float di_e4m3_to_f32(uint8_t b) { return di_e4m3_table[b]; }

/* E2M1 values for nibbles 0..15: 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives. */
extern const float di_e2m1_table[16];

static inline float di_e8m0_to_f32(uint8_t b) {
    if (b == 0xff) return di_f32_from_bits(0x7fc00000u);
    if (b == 0) return di_f32_from_bits(0x00400000u); /* 2^-127, a subnormal */
    return di_f32_from_bits((uint32_t)b << 23);
}

#endif /* DI_DTYPE_H */
