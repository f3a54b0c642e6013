/*
 * dtype.c -- dtype names, sizes and scalar conversions (see dtype.h).
 */
#include "core/dtype.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    int bits;
} g_dtypes[DI_DTYPE_COUNT_] = {
    [DI_DTYPE_F32] = {"F32", 32},         [DI_DTYPE_F16] = {"F16", 16},
    [DI_DTYPE_BF16] = {"BF16", 16},       [DI_DTYPE_F8_E4M3] = {"F8_E4M3", 8},
    [DI_DTYPE_F8_E8M0] = {"F8_E8M0", 8},  [DI_DTYPE_F4_E2M1] = {"F4", 4},
    [DI_DTYPE_I64] = {"I64", 64},         [DI_DTYPE_I32] = {"I32", 32},
    [DI_DTYPE_I8] = {"I8", 8},            [DI_DTYPE_U8] = {"U8", 8},
    [DI_DTYPE_BOOL] = {"BOOL", 8},        [DI_DTYPE_F64] = {"F64", 64},
};

const char *di_dtype_name(di_dtype t) {
    return (unsigned)t < DI_DTYPE_COUNT_ ? g_dtypes[t].name : "?";
}

int di_dtype_parse(const char *s, di_dtype *out) {
    for (int i = 0; i < DI_DTYPE_COUNT_; i++) {
        if (strcmp(s, g_dtypes[i].name) == 0) {
            *out = (di_dtype)i;
            return 0;
        }
    }
    return -1;
}

int di_dtype_bits(di_dtype t) { return (unsigned)t < DI_DTYPE_COUNT_ ? g_dtypes[t].bits : 0; }

size_t di_dtype_bytes(di_dtype t, int64_t n) {
    return (size_t)(((uint64_t)n * (uint64_t)di_dtype_bits(t) + 7) / 8);
}

float di_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return di_f32_from_bits(sign | 0x7f800000u | (man << 13));
    return di_f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t di_f32_to_f16(float f) {
    uint32_t u = di_bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (a != a) return (uint16_t)(sign | 0x7e00u);
    if (a >= 65520.0f) return (uint16_t)(sign | 0x7c00u);
    if (a < 6.103515625e-05f) { /* subnormal: round to a multiple of 2^-24 */
        return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
    }
    uint32_t v = di_bits_from_f32(a);
    v += 0xfffu + ((v >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | (((v >> 23) - 112) << 10) | ((v >> 13) & 0x3ffu));
}

const float di_e4m3_table[256] = {
    0.0f, 0.001953125f, 0.00390625f, 0.005859375f, 0.0078125f, 0.009765625f, 0.01171875f, 0.013671875f,
    0.015625f, 0.017578125f, 0.01953125f, 0.021484375f, 0.0234375f, 0.025390625f, 0.02734375f, 0.029296875f,
    0.03125f, 0.03515625f, 0.0390625f, 0.04296875f, 0.046875f, 0.05078125f, 0.0546875f, 0.05859375f,
    0.0625f, 0.0703125f, 0.078125f, 0.0859375f, 0.09375f, 0.1015625f, 0.109375f, 0.1171875f,
    0.125f, 0.140625f, 0.15625f, 0.171875f, 0.1875f, 0.203125f, 0.21875f, 0.234375f,
    0.25f, 0.28125f, 0.3125f, 0.34375f, 0.375f, 0.40625f, 0.4375f, 0.46875f,
    0.5f, 0.5625f, 0.625f, 0.6875f, 0.75f, 0.8125f, 0.875f, 0.9375f,
    1.0f, 1.125f, 1.25f, 1.375f, 1.5f, 1.625f, 1.75f, 1.875f,
    2.0f, 2.25f, 2.5f, 2.75f, 3.0f, 3.25f, 3.5f, 3.75f,
    4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f, 7.0f, 7.5f,
    8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f,
    16.0f, 18.0f, 20.0f, 22.0f, 24.0f, 26.0f, 28.0f, 30.0f,
    32.0f, 36.0f, 40.0f, 44.0f, 48.0f, 52.0f, 56.0f, 60.0f,
    64.0f, 72.0f, 80.0f, 88.0f, 96.0f, 104.0f, 112.0f, 120.0f,
    128.0f, 144.0f, 160.0f, 176.0f, 192.0f, 208.0f, 224.0f, 240.0f,
    256.0f, 288.0f, 320.0f, 352.0f, 384.0f, 416.0f, 448.0f, NAN,
    -0.0f, -0.001953125f, -0.00390625f, -0.005859375f, -0.0078125f, -0.009765625f, -0.01171875f, -0.013671875f,
    -0.015625f, -0.017578125f, -0.01953125f, -0.021484375f, -0.0234375f, -0.025390625f, -0.02734375f, -0.029296875f,
    -0.03125f, -0.03515625f, -0.0390625f, -0.04296875f, -0.046875f, -0.05078125f, -0.0546875f, -0.05859375f,
    -0.0625f, -0.0703125f, -0.078125f, -0.0859375f, -0.09375f, -0.1015625f, -0.109375f, -0.1171875f,
    -0.125f, -0.140625f, -0.15625f, -0.171875f, -0.1875f, -0.203125f, -0.21875f, -0.234375f,
    -0.25f, -0.28125f, -0.3125f, -0.34375f, -0.375f, -0.40625f, -0.4375f, -0.46875f,
    -0.5f, -0.5625f, -0.625f, -0.6875f, -0.75f, -0.8125f, -0.875f, -0.9375f,
    -1.0f, -1.125f, -1.25f, -1.375f, -1.5f, -1.625f, -1.75f, -1.875f,
    -2.0f, -2.25f, -2.5f, -2.75f, -3.0f, -3.25f, -3.5f, -3.75f,
    -4.0f, -4.5f, -5.0f, -5.5f, -6.0f, -6.5f, -7.0f, -7.5f,
    -8.0f, -9.0f, -10.0f, -11.0f, -12.0f, -13.0f, -14.0f, -15.0f,
    -16.0f, -18.0f, -20.0f, -22.0f, -24.0f, -26.0f, -28.0f, -30.0f,
    -32.0f, -36.0f, -40.0f, -44.0f, -48.0f, -52.0f, -56.0f, -60.0f,
    -64.0f, -72.0f, -80.0f, -88.0f, -96.0f, -104.0f, -112.0f, -120.0f,
    -128.0f, -144.0f, -160.0f, -176.0f, -192.0f, -208.0f, -224.0f, -240.0f,
    -256.0f, -288.0f, -320.0f, -352.0f, -384.0f, -416.0f, -448.0f, NAN,
};

const float di_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
