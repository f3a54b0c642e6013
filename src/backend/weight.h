/*
 * weight.h -- a 2-D weight matrix as the kernels consume it: stored dtype, no conversion.
 *
 * A di_weight is a view [rows][cols], row-major, rows = output features, cols = input
 * features (the nn.Linear layout), over memory the model owns (usually the checkpoint's
 * mapping). Block-scaled FP8 (DeepSeek-V3's published format) carries `scale`, the
 * `weight_scale_inv` tensor converted to float: the real value of element (r, c) is
 *     e4m3(data[r][c]) * scale[(row_offset + r) / block_rows][c / block_cols]
 * row_offset lets a view start at any row of the stored tensor (MLA splits kv_b_proj per
 * head) while still finding the right scale block.
 * FP4 e2m1 (DeepSeek-V4's routed experts) is packed two per byte, low nibble = even column,
 * and carries `scale_e8m0` instead: the stored E8M0 bytes, one per block_cols (32) columns,
 * read as they are (the kernels decode 2^(e - 127) in registers); the real value is
 *     e2m1(nibble(r, c)) * e8m0(scale_e8m0[r * scale_cols + c / block_cols])
 */
#ifndef DI_WEIGHT_H
#define DI_WEIGHT_H

#include "core/dtype.h"

#include <stdint.h>

typedef struct di_weight {
    di_dtype dtype;     /* F32, F16, BF16, F8_E4M3 or F4_E2M1 */
    int64_t rows, cols; /* logical shape [rows][cols] */
    int64_t row_stride; /* elements between consecutive rows (== cols unless a view) */
    const void *data;   /* element (r, c) at data + (r * row_stride + c) * elem_size */
    /* F8_E4M3 only (NULL otherwise): [ceil(total_rows / block_rows)][scale_cols] floats */
    const float *scale;
    int64_t scale_cols; /* ceil(stored cols / block_cols) */
    int64_t block_rows, block_cols;
    int64_t row_offset; /* first stored row of this view, for scale lookup */
    /* F4_E2M1 only (NULL otherwise): [rows][scale_cols] E8M0 bytes, as stored */
    const uint8_t *scale_e8m0;
} di_weight;

/* A view of rows [r0, r0 + n) of w. */
static inline di_weight di_weight_rows(const di_weight *w, int64_t r0, int64_t n) {
    di_weight v = *w;
    size_t esz = di_dtype_bytes(w->dtype, 1);
    v.data = (const char *)w->data + (size_t)(r0 * w->row_stride) * esz;
    v.rows = n;
    v.row_offset = w->row_offset + r0;
    return v;
}

#endif /* DI_WEIGHT_H */
