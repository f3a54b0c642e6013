/*
 * cpu_nn.h -- the CPU backend's non-matmul ops: RMSNorm, RoPE, MLA attention, SwiGLU,
 * axpy and embedding gather (the matmuls live in cpu_ops.h).
 *
 * Each op has a scalar reference (`*_ref`: single-threaded plain loops, the definition of the
 * result) and a fast version (threads over the pool; SIMD where it matters, which is the
 * attention). tests/ops/test_cpu_ops.c compares the two on random shapes.
 *
 * Invariant of every fast op: an output element's arithmetic depends only on the op's shape
 * parameters, never on the number of rows, the thread count or how the work was split.
 */
#ifndef DI_CPU_NN_H
#define DI_CPU_NN_H

#include "backend/backend.h"
#include "core/threadpool.h"

#include <stdint.h>

void di_cpu_rmsnorm(di_pool *pool, const float *x, int64_t x_stride, const float *w, int64_t n,
                    int64_t dim, float eps, float *y, int64_t y_stride);
void di_cpu_rmsnorm_ref(const float *x, int64_t x_stride, const float *w, int64_t n, int64_t dim,
                        float eps, float *y, int64_t y_stride);

void di_cpu_rope(di_pool *pool, const di_rope_op_params *p);
void di_cpu_rope_ref(const di_rope_op_params *p);

/* scratch: [di_pool_size(pool)][scratch_stride] floats, scratch_stride >= pos0 + n_tokens. */
void di_cpu_mla_attention(di_pool *pool, const di_mla_attn_params *p, float *scratch,
                          int64_t scratch_stride);
/* The reference allocates its own score row (test use only). */
void di_cpu_mla_attention_ref(const di_mla_attn_params *p);

/* Heads in parallel, each head's products single-threaded with the fast matmul kernels
 * (same bits as di_cpu_matmul / di_cpu_matmul_t, whose results do not depend on n). */
void di_cpu_head_matmul(di_pool *pool, const di_head_matmul_params *p);
void di_cpu_head_matmul_ref(const di_head_matmul_params *p);

void di_cpu_silu_mul(di_pool *pool, const float *gate, const float *up, int64_t n, float *out);
void di_cpu_silu_mul_ref(const float *gate, const float *up, int64_t n, float *out);

void di_cpu_axpy(di_pool *pool, float a, const float *x, int64_t n, float *y);

void di_cpu_embed(di_pool *pool, const di_weight *table, const int32_t *ids, int64_t n, float *out);

/* Vector helpers with a fixed summation order for a given n (AVX2+FMA when the CPU has it,
 * else portable code). Used by the attention; exposed for tests. */
float di_cpu_vec_dot(const float *a, const float *b, int64_t n);
void di_cpu_vec_axpy(float a, const float *x, int64_t n, float *y);

/* The AVX2 versions (cpu_vec_avx2.c; x86-64 only). */
float di_cpu_vec_dot_avx2(const float *a, const float *b, int64_t n);
void di_cpu_vec_axpy_avx2(float a, const float *x, int64_t n, float *y);

#endif /* DI_CPU_NN_H */
