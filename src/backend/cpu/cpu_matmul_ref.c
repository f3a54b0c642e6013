/*
 * cpu_matmul_ref.c -- the scalar definitions of the matmul ops and of weight dequantization.
 *
 * Design stance: plain loops, no threads, no SIMD; they are the specification the fast
 * kernels are tested against. Products and sums are taken in double, where every product of
 * a float activation and a dequantized weight is exact, so the only error is the final
 * rounding to float (and the double sum's). A weight element's real value is
 *     f32/f16/bf16: the stored value;   F8_E4M3: e4m3(byte) * scale of its 2-D block
 * (see weight.h). di_cpu_weight_row_f32 rounds that product to float once, which is also
 * what the fast kernels consume.
 */
#include "backend/cpu/cpu_matmul_impl.h"
#include "backend/cpu/cpu_ops.h"

/* Value of w[r][c] in double, exactly (an e4m3 times a float scale fits a double). */
static double weight_at(const di_weight *w, int64_t r, int64_t c) {
    size_t i = (size_t)(r * w->row_stride + c);
    switch (w->dtype) {
    case DI_DTYPE_F32:
        return ((const float *)w->data)[i];
    case DI_DTYPE_F16:
        return di_f16_to_f32(((const uint16_t *)w->data)[i]);
    case DI_DTYPE_BF16:
        return di_bf16_to_f32(((const uint16_t *)w->data)[i]);
    case DI_DTYPE_F8_E4M3: {
        double s = di_mm_scale_row(w, r)[c / w->block_cols];
        return (double)di_e4m3_to_f32(((const uint8_t *)w->data)[i]) * s;
    }
    default:
        return 0.0; /* other dtypes are not matmul weights; loaders reject them */
    }
}

void di_cpu_matmul_ref(const di_weight *w, const float *x, int64_t n, float *y) {
    for (int64_t t = 0; t < n; t++) {
        for (int64_t r = 0; r < w->rows; r++) {
            double s = 0.0;
            for (int64_t c = 0; c < w->cols; c++)
                s += (double)x[t * w->cols + c] * weight_at(w, r, c);
            y[t * w->rows + r] = (float)s;
        }
    }
}

void di_cpu_matmul_t_ref(const di_weight *w, const float *x, int64_t n, float *y) {
    for (int64_t t = 0; t < n; t++) {
        for (int64_t c = 0; c < w->cols; c++) {
            double s = 0.0;
            for (int64_t r = 0; r < w->rows; r++)
                s += (double)x[t * w->rows + r] * weight_at(w, r, c);
            y[t * w->cols + c] = (float)s;
        }
    }
}

void di_mm_convert_scalar(const di_weight *w, int64_t r, int64_t c0, int64_t len, float *out) {
    size_t base = (size_t)(r * w->row_stride + c0);
    switch (w->dtype) {
    case DI_DTYPE_F32:
        for (int64_t i = 0; i < len; i++)
            out[i] = ((const float *)w->data)[base + (size_t)i];
        break;
    case DI_DTYPE_F16:
        for (int64_t i = 0; i < len; i++)
            out[i] = di_f16_to_f32(((const uint16_t *)w->data)[base + (size_t)i]);
        break;
    case DI_DTYPE_BF16:
        for (int64_t i = 0; i < len; i++)
            out[i] = di_bf16_to_f32(((const uint16_t *)w->data)[base + (size_t)i]);
        break;
    case DI_DTYPE_F8_E4M3: {
        const float *srow = di_mm_scale_row(w, r);
        const uint8_t *d = (const uint8_t *)w->data + base;
        /* One float rounding of the exact product, as in weight_at rounded to float. */
        for (int64_t i = 0; i < len; i++)
            out[i] = di_e4m3_to_f32(d[i]) * srow[(c0 + i) / w->block_cols];
        break;
    }
    default:
        for (int64_t i = 0; i < len; i++)
            out[i] = 0.0f;
        break;
    }
}

void di_cpu_weight_row_f32(const di_weight *w, int64_t r, float *out) {
    di_mm_convert_scalar(w, r, 0, w->cols, out);
}
