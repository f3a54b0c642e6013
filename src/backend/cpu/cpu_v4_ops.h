/*
 * cpu_v4_ops.h -- the CPU kernels of the DeepSeek-V4 ops (backend.h, "DeepSeek-V4").
 *
 * Same contract as cpu_nn.h: each op has a scalar reference (`*_ref`, single-threaded) and a
 * fast version that splits rows over the pool; every output element is computed with the
 * same arithmetic as the reference, whatever the split, so the two agree bitwise and results
 * are batch-invariant and thread-count-invariant.
 */
#ifndef DI_CPU_V4_OPS_H
#define DI_CPU_V4_OPS_H

#include "backend/backend.h"
#include "core/threadpool.h"

/* y[t][r] = sum_c x[t][c] W[r][c] for W in F4_E2M1 with E8M0 scales (w->scale_e8m0, one byte
 * per 32 columns; see weight.h). The fast version (AVX-512 / AVX2 kernels, rows over the
 * pool) reads only the stored bytes and follows its own fixed summation order
 * (cpu_v4_fp4_impl.h), so it matches the reference to rounding, not bitwise; its results
 * depend only on the shape and the SIMD level, never on n, the row split or thread count. */
void di_cpu_matmul_fp4(di_pool *pool, const di_weight *w, const float *x, int64_t n, float *y);
void di_cpu_matmul_fp4_ref(const di_weight *w, const float *x, int64_t n, float *y);

void di_cpu_v4_hc_pre(di_pool *pool, const di_v4_hc_params *p);
void di_cpu_v4_hc_pre_ref(const di_v4_hc_params *p);

void di_cpu_v4_hc_post(di_pool *pool, int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                       const float *y, const float *post, const float *mix, float *out);

void di_cpu_v4_attention(di_pool *pool, const di_v4_attn_params *p);
void di_cpu_v4_attention_ref(const di_v4_attn_params *p);

void di_cpu_v4_pool(di_pool *pool, const di_v4_pool_params *p);

void di_cpu_v4_index_scores(di_pool *pool, const di_v4_index_params *p);
void di_cpu_v4_index_scores_ref(const di_v4_index_params *p);

void di_cpu_v4_swiglu(di_pool *pool, const float *gate, const float *up, int64_t n, float limit,
                      float *out);

#endif /* DI_CPU_V4_OPS_H */
