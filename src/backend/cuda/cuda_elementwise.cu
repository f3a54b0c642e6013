/*
 * cuda_elementwise.cu -- the CUDA backend's cheap ops: embedding gather, RMSNorm, RoPE,
 * SwiGLU, axpy, row gather / scatter and the MoE combine.
 *
 * Design stance: these are memory-bound and small next to the matmuls, so the kernels are
 * plain (one thread per element, one block per row for RMSNorm). Each element is computed
 * with the same float operations as the CPU reference, written with explicit round-to-
 * nearest intrinsics (__fmul_rn, __fadd_rn) so that nvcc cannot contract them into FMAs:
 * RoPE and axpy then match the CPU bitwise, SwiGLU up to expf's last bit, and RMSNorm up to
 * the summation order of its double-precision sum of squares.
 *
 * Invariant: a row's result depends only on that row (RMSNorm's reduction tree depends on
 * nothing but the block size, a constant), so every op is batch-invariant.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_fp16.h>
#include <float.h>
#include <math.h>
#include <cuda_fp8.h>

#define EW_THREADS 256

int64_t di_cuda_moe_combine_norm_launches; /* cuda_backend.h: fused launches (for tests) */

static unsigned blocks_for(int64_t n) {
    int64_t b = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned)(b < 1 ? 1 : b);
}

/* ---------------------------------------------------------------------------------------- */
/* Embedding gather                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Value of table[r][c] as the CPU's di_mm_convert_scalar computes it. */
static __device__ float weight_elem(const di_weight &w, int64_t r, int64_t c) {
    const int64_t i = r * w.row_stride + c;
    switch (w.dtype) {
    case DI_DTYPE_F32:
        return static_cast<const float *>(w.data)[i];
    case DI_DTYPE_F16:
        return __half2float(__ushort_as_half(static_cast<const uint16_t *>(w.data)[i]));
    case DI_DTYPE_BF16:
        return __uint_as_float((uint32_t) static_cast<const uint16_t *>(w.data)[i] << 16);
    case DI_DTYPE_F8_E4M3: {
        __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const uint8_t *>(w.data)[i], __NV_E4M3);
        const float *srow = w.scale + ((w.row_offset + r) / w.block_rows) * w.scale_cols;
        return __fmul_rn(__half2float(__half(h)), srow[c / w.block_cols]);
    }
    default:
        return 0.0f;
    }
}

/* Block (t, y): a range of token t's columns (tokens on x, which has no 65535 limit). */
__global__ void embed_kernel(const di_weight w, const int32_t *ids, float *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const int64_t c = (int64_t)blockIdx.y * EW_THREADS + threadIdx.x;
    if (c >= w.cols) return;
    out[t * w.cols + c] = weight_elem(w, ids[t], c);
}

cudaError_t di_cuda_launch_embed(const di_weight *table, const int32_t *ids, int64_t n, float *out,
                                 cudaStream_t stream) {
    if (n <= 0 || table->cols <= 0) return cudaSuccess;
    dim3 grid((unsigned)n, blocks_for(table->cols));
    return di_cuda_launch(embed_kernel, grid, EW_THREADS, 0, stream, *table, ids, out);
}

/* ---------------------------------------------------------------------------------------- */
/* RMSNorm                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Elements per thread kept in registers (rows up to EW_THREADS * RMS_CACHE long): the row is
 * read once, and the weights are requested before the wait for the input (PDL). */
#define RMS_CACHE 16

/* The block's total of the threads' partial sums of squares ss (xor butterfly in each warp,
 * the warps' sums in order by thread 0), as 1 / sqrt(mean + eps) in float: every thread
 * gets it. */
static __device__ float rms_scale(double ss, int64_t dim, float eps) {
    __shared__ double warp_sums[EW_THREADS / 32];
    __shared__ float r_shared;
    for (int off = 16; off >= 1; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int k = 0; k < EW_THREADS / 32; k++)
            tot += warp_sums[k];
        float var = (float)(tot / (double)dim);
        r_shared = 1.0f / sqrtf(var + eps); /* IEEE division and sqrt (no fast math) */
    }
    __syncthreads();
    return r_shared;
}

/* One block per row: a double sum of squares (strided per thread, then a fixed tree), then
 * y = w * (x * r) with r = 1 / sqrt(mean + eps) in float, as the reference. y may be x. The
 * cached and the long-row paths do the same arithmetic in the same order. */
__global__ void __launch_bounds__(EW_THREADS)
    rmsnorm_kernel(const float *x, int64_t x_stride, const float *w, int64_t dim, float eps,
                   float *y, int64_t y_stride) {
    const int64_t t = blockIdx.x;
    const bool cached = dim <= (int64_t)EW_THREADS * RMS_CACHE;
    float xv[RMS_CACHE], wv[RMS_CACHE];
    if (cached) {
#pragma unroll
        for (int k = 0; k < RMS_CACHE; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
            wv[k] = i < dim ? w[i] : 0.0f;
        }
    }
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const float *xr = x + t * x_stride;
    float *yr = y + t * y_stride;
    double ss = 0.0;
    if (cached) {
#pragma unroll
        for (int k = 0; k < RMS_CACHE; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
            xv[k] = i < dim ? xr[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < RMS_CACHE; k++)
            if (threadIdx.x + (int64_t)k * EW_THREADS < dim)
                ss = fma((double)xv[k], (double)xv[k], ss);
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += EW_THREADS)
            ss = fma((double)xr[i], (double)xr[i], ss);
    }
    const float r = rms_scale(ss, dim, eps);
    if (cached) {
#pragma unroll
        for (int k = 0; k < RMS_CACHE; k++) {
            const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
            if (i < dim) yr[i] = __fmul_rn(wv[k], __fmul_rn(xv[k], r));
        }
    } else {
        for (int64_t i = threadIdx.x; i < dim; i += EW_THREADS)
            yr[i] = __fmul_rn(w[i], __fmul_rn(xr[i], r));
    }
}

cudaError_t di_cuda_launch_rmsnorm(const float *x, int64_t x_stride, const float *w, int64_t n,
                                   int64_t dim, float eps, float *y, int64_t y_stride,
                                   cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    return di_cuda_launch(rmsnorm_kernel, (unsigned)n, EW_THREADS, 0, stream, x, x_stride, w, dim,
                          eps, y, y_stride);
}

/* ---------------------------------------------------------------------------------------- */
/* RoPE                                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* Thread: pair i of head h of token t (blockIdx.x = t). */
__global__ void rope_kernel(const di_rope_op_params p) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t half = p.rope_dim / 2, t = blockIdx.x;
    const int64_t k = (int64_t)blockIdx.y * EW_THREADS + threadIdx.x;
    if (k >= half * p.n_heads) return;
    const int64_t h = k / half, i = k % half;
    float *x = p.x + t * p.tstride + h * p.hstride;
    const int64_t ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
    const float a = x[ia], b = x[ib], c = p.cos[t * half + i], s = p.sin[t * half + i];
    di_cuda_rope_pair(a, b, c, s, &x[ia], &x[ib]);
}

cudaError_t di_cuda_launch_rope(const di_rope_op_params *p, cudaStream_t stream) {
    const int64_t pairs = p->rope_dim / 2 * p->n_heads;
    if (p->n_tokens <= 0 || pairs <= 0) return cudaSuccess;
    dim3 grid((unsigned)p->n_tokens, blocks_for(pairs));
    return di_cuda_launch(rope_kernel, grid, EW_THREADS, 0, stream, *p);
}

/* Block i: the MLA latent store of new token row i (di_mla_store_params): rmsnorm_kernel's
 * arithmetic over the latent (cached path: R <= EW_THREADS * RMS_CACHE), rope_kernel's over
 * the rope key, written straight into the pool rows. */
__global__ void __launch_bounds__(EW_THREADS) mla_store_kernel(const di_mla_store_params p) {
    float wv[RMS_CACHE], xv[RMS_CACHE];
#pragma unroll
    for (int k = 0; k < RMS_CACHE; k++) {
        const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
        wv[k] = i < p.R ? p.norm_w[i] : 0.0f;
    }
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t t = p.src_rows[blockIdx.x], d = p.dst_rows[blockIdx.x];
    const float *xr = p.kva + t * (p.R + p.dr);
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < RMS_CACHE; k++) {
        const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
        xv[k] = i < p.R ? xr[i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < RMS_CACHE; k++)
        if (threadIdx.x + (int64_t)k * EW_THREADS < p.R) ss = fma((double)xv[k], (double)xv[k], ss);
    const float r = rms_scale(ss, p.R, p.eps);
    float *out = p.ckv + d * p.R;
#pragma unroll
    for (int k = 0; k < RMS_CACHE; k++) {
        const int64_t i = threadIdx.x + (int64_t)k * EW_THREADS;
        if (i < p.R) out[i] = __fmul_rn(wv[k], __fmul_rn(xv[k], r));
    }
    const int64_t half = p.dr / 2;
    for (int64_t i = threadIdx.x; i < half; i += EW_THREADS) {
        const int64_t ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
        di_cuda_rope_pair(xr[p.R + ia], xr[p.R + ib], p.cos[t * half + i], p.sin[t * half + i],
                          &p.krope[d * p.dr + ia], &p.krope[d * p.dr + ib]);
    }
}

cudaError_t di_cuda_launch_mla_store(const di_mla_store_params *p, cudaStream_t stream) {
    if (p->n_rows <= 0) return cudaSuccess;
    if (p->R > (int64_t)EW_THREADS * RMS_CACHE) return cudaErrorNotSupported;
    return di_cuda_launch(mla_store_kernel, (unsigned)p->n_rows, EW_THREADS, 0, stream, *p);
}

/* ---------------------------------------------------------------------------------------- */
/* SwiGLU and axpy                                                                            */
/* ---------------------------------------------------------------------------------------- */

__global__ void silu_mul_kernel(const float *gate, const float *up, int64_t n, float *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), up[i]);
}

cudaError_t di_cuda_launch_silu_mul(const float *gate, const float *up, int64_t n, float *out,
                                    cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    return di_cuda_launch(silu_mul_kernel, blocks_for(n), EW_THREADS, 0, stream, gate, up, n, out);
}

__global__ void axpy_kernel(float a, const float *x, int64_t n, float *y) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

cudaError_t di_cuda_launch_axpy(float a, const float *x, int64_t n, float *y, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    return di_cuda_launch(axpy_kernel, blocks_for(n), EW_THREADS, 0, stream, a, x, n, y);
}

/* ---------------------------------------------------------------------------------------- */
/* Row gather / scatter and the MoE combine                                                   */
/* ---------------------------------------------------------------------------------------- */

/* blockIdx.x = i: copies one row, blockIdx.y strides over its columns. */
__global__ void copy_rows_kernel(float *dst, int64_t dst_stride, const int32_t *dst_rows,
                                 const float *src, int64_t src_stride, const int32_t *src_rows,
                                 int64_t cols) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t i = blockIdx.x, c = (int64_t)blockIdx.y * EW_THREADS + threadIdx.x;
    if (c >= cols) return;
    const int64_t d = dst_rows ? dst_rows[i] : i, s = src_rows ? src_rows[i] : i;
    dst[d * dst_stride + c] = src[s * src_stride + c];
}

cudaError_t di_cuda_launch_copy_rows(float *dst, int64_t dst_stride, const int32_t *dst_rows,
                                     const float *src, int64_t src_stride, const int32_t *src_rows,
                                     int64_t n, int64_t cols, cudaStream_t stream) {
    if (n <= 0 || cols <= 0) return cudaSuccess;
    dim3 grid((unsigned)n, blocks_for(cols));
    return di_cuda_launch(copy_rows_kernel, grid, EW_THREADS, 0, stream, dst, dst_stride, dst_rows,
                          src, src_stride, src_rows, cols);
}

/* blockIdx.x = t, blockIdx.y strides over the columns: out = 0, then one axpy step per slot
 * in slot order (axpy_kernel's rounding), so a token's bits depend only on its slots. With
 * resid (moe_combine_add): the sum, then + add (the shared experts, when given), then added
 * to resid instead of stored -- axpy_kernel's steps with a = 1, so the bits of moe_combine
 * and two axpy. */
__global__ void moe_combine_kernel(const float *rows, const int32_t *rows_of, const float *w,
                                   int64_t K, int64_t dim, float *out, const float *add,
                                   float *resid) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t t = blockIdx.x, c = (int64_t)blockIdx.y * EW_THREADS + threadIdx.x;
    if (c >= dim) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++)
        acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], rows[(int64_t)rows_of[t * K + k] * dim + c]));
    if (!resid) {
        out[t * dim + c] = acc;
        return;
    }
    if (add) acc = __fadd_rn(acc, __fmul_rn(1.0f, add[t * dim + c]));
    resid[t * dim + c] = __fadd_rn(resid[t * dim + c], __fmul_rn(1.0f, acc));
}

cudaError_t di_cuda_launch_moe_combine(const float *rows, const int32_t *rows_of, const float *w,
                                       int64_t n, int64_t K, int64_t dim, float *out,
                                       const float *add, float *resid, cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    dim3 grid((unsigned)n, blocks_for(dim));
    return di_cuda_launch(moe_combine_kernel, grid, EW_THREADS, 0, stream, rows, rows_of, w, K, dim,
                          out, add, resid);
}

/* Block t: moe_combine_kernel's sums of token t's row (each thread the columns rmsnorm_kernel's
 * cached path gives it: EPT of them) added to resid, then rmsnorm_kernel's arithmetic over
 * that row into y: the end of a MoE layer and the next norm in one launch, with the bits of
 * the two. The slots' rows (at most COMBINE_NORM_MAX_K) are read all at once -- every load
 * before the first add and store (restrict: nothing read here is written here but resid) --
 * then added in slot order. Opt-in (DI_CUDA_COMBINE_NORM_MAX_N): on the H200 at one token
 * this takes about 9 us a call against 3.7 and 3.1 for the combine and the norm (one SM
 * pulls the token's 64 KB of slot rows from L2), and saved 13 us a 27-layer decode step (one
 * launch fewer on each MoE layer's critical path); a version that read and added slot by
 * slot took 15 us a call, one in which the combine's blocks stayed and the last of a row's
 * blocks normed it lost 64 us a step (NOTES.md, twenty-fifth round). */
#define COMBINE_NORM_MAX_K 8
template <int EPT>
__global__ void __launch_bounds__(EW_THREADS)
    moe_combine_norm_kernel(const float *__restrict__ rows, const int32_t *__restrict__ rows_of,
                            const float *__restrict__ w, int K, int dim,
                            const float *__restrict__ add, float *__restrict__ resid,
                            const float *__restrict__ norm_w, float eps, float *__restrict__ y) {
    float wv[EPT], xv[EPT];
#pragma unroll
    for (int k = 0; k < EPT; k++) { /* the norm's weights before the wait */
        const int i = (int)threadIdx.x + k * EW_THREADS;
        wv[k] = i < dim ? norm_w[i] : 0.0f;
    }
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t t = blockIdx.x;
    const float *src[COMBINE_NORM_MAX_K];
    float ws[COMBINE_NORM_MAX_K];
#pragma unroll
    for (int j = 0; j < COMBINE_NORM_MAX_K; j++) {
        const bool on = j < K;
        src[j] = rows + (on ? (int64_t)rows_of[t * K + j] * dim : 0);
        ws[j] = on ? w[t * K + j] : 0.0f;
    }
    float v[COMBINE_NORM_MAX_K][EPT], r0[EPT], a0[EPT];
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int c = (int)threadIdx.x + k * EW_THREADS;
        const bool in = c < dim;
#pragma unroll
        for (int j = 0; j < COMBINE_NORM_MAX_K; j++)
            v[j][k] = in && j < K ? src[j][c] : 0.0f;
        r0[k] = in ? resid[t * dim + c] : 0.0f;
        a0[k] = in && add ? add[t * dim + c] : 0.0f;
    }
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int c = (int)threadIdx.x + k * EW_THREADS;
        float acc = 0.0f; /* moe_combine_kernel's steps */
#pragma unroll
        for (int j = 0; j < COMBINE_NORM_MAX_K; j++)
            if (j < K) acc = __fadd_rn(acc, __fmul_rn(ws[j], v[j][k]));
        if (add) acc = __fadd_rn(acc, __fmul_rn(1.0f, a0[k]));
        xv[k] = __fadd_rn(r0[k], __fmul_rn(1.0f, acc));
        if (c < dim) {
            resid[t * dim + c] = xv[k];
            ss = fma((double)xv[k], (double)xv[k], ss); /* rmsnorm_kernel's order */
        }
    }
    const float r = rms_scale(ss, dim, eps);
#pragma unroll
    for (int k = 0; k < EPT; k++) {
        const int i = (int)threadIdx.x + k * EW_THREADS;
        if (i < dim) y[t * dim + i] = __fmul_rn(wv[k], __fmul_rn(xv[k], r));
    }
}

cudaError_t di_cuda_launch_moe_combine_norm(const float *rows, const int32_t *rows_of,
                                            const float *w, int64_t n, int64_t K, int64_t dim,
                                            const float *add, float *resid, const float *norm_w,
                                            float eps, float *y, int64_t max_fused_n,
                                            cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    if (n > max_fused_n || K > COMBINE_NORM_MAX_K || dim > (int64_t)EW_THREADS * RMS_CACHE) {
        cudaError_t err = /* two launches */
            di_cuda_launch_moe_combine(rows, rows_of, w, n, K, dim, NULL, add, resid, stream);
        if (err != cudaSuccess) return err;
        return di_cuda_launch_rmsnorm(resid, dim, norm_w, n, dim, eps, y, dim, stream);
    }
    di_cuda_moe_combine_norm_launches++;
    const int ept = (int)((dim + EW_THREADS - 1) / EW_THREADS);
    const int k = (int)K, d = (int)dim;
    if (ept <= 4)
        return di_cuda_launch(moe_combine_norm_kernel<4>, (unsigned)n, EW_THREADS, 0, stream, rows,
                              rows_of, w, k, d, add, resid, norm_w, eps, y);
    if (ept <= 8)
        return di_cuda_launch(moe_combine_norm_kernel<8>, (unsigned)n, EW_THREADS, 0, stream, rows,
                              rows_of, w, k, d, add, resid, norm_w, eps, y);
    return di_cuda_launch(moe_combine_norm_kernel<RMS_CACHE>, (unsigned)n, EW_THREADS, 0, stream,
                          rows, rows_of, w, k, d, add, resid, norm_w, eps, y);
}

/* Greedy decoding on the device (backend.h's argmax_rows): one block per row, the first index
 * of its maximum (di_cuda_block_row_max), -1 for a NaN or +inf anywhere or a row of -inf
 * only. */
#define AM_THREADS 1024

__global__ void __launch_bounds__(AM_THREADS)
    argmax_kernel(const float *x, int64_t V, int32_t *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const di_cuda_row_max r = di_cuda_block_row_max<AM_THREADS>(x + (int64_t)blockIdx.x * V, V);
    if (threadIdx.x == 0) out[blockIdx.x] = r.bad || r.first < 0 ? -1 : (int32_t)r.first;
}

/* A few rows (a decode step of a few sequences): one block per row left most of the device
 * idle while it read the row (102,400 logits in 18 us on the H200: NOTES.md, fifteenth round;
 * at 64 rows, 18.7 us: a block reads about 22 GB/s). Here S blocks per row (gridDim.x:
 * DI_CUDA_AM_SLICES for up to 16 rows, fewer for more, at most DI_CUDA_AM_PARTS in all) each take a
 * slice, leave their (max, first index, bad) in `part`, and the last to arrive
 * (di_cuda_last_to_arrive) combines them. The maximum with the lowest index and "any NaN or +inf"
 * do not depend on the order in which the slices are combined: the same token as argmax_kernel. */
#define AM_SLICE_THREADS 256

__global__ void __launch_bounds__(AM_SLICE_THREADS)
    argmax_slices_kernel(const float *x, int64_t V, int32_t *out, di_cuda_am_part *part,
                         int *counters) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t row = blockIdx.y, S = gridDim.x;
    /* slice s: ids [lo, hi), multiples of 4 (whole float4 loads for an aligned row) */
    const int64_t q = (V + 3) / 4, lo = min(4 * (q * blockIdx.x / S), V),
                  hi = min(4 * (q * (blockIdx.x + 1) / S), V);
    di_cuda_row_max r = di_cuda_block_row_max<AM_SLICE_THREADS>(x + row * V + lo, hi - lo);
    if (threadIdx.x == 0)
        part[row * S + blockIdx.x] = {r.max, r.first < 0 ? -1 : lo + r.first, r.bad};
    if (!di_cuda_last_to_arrive(&counters[row], (int)S) || threadIdx.x != 0) return;
    const volatile di_cuda_am_part *pr = part + row * S;
    float bv = -INFINITY;
    int64_t bi = -1;
    bool bad = false;
    for (int64_t s = 0; s < S; s++) {
        const float v = pr[s].max;
        const int64_t i = pr[s].first;
        bad |= pr[s].bad;
        if (i >= 0 && row_max_ahead(v, i, bv, bi)) bv = v, bi = i;
    }
    out[row] = bad || bi < 0 ? -1 : (int32_t)bi;
}

cudaError_t di_cuda_launch_argmax(const float *x, int64_t n, int64_t V, int32_t *out,
                                  di_cuda_am_part *part, int *counters, cudaStream_t stream) {
    if (n <= 0 || V <= 0) return cudaSuccess;
    const int64_t S = DI_MIN(DI_CUDA_AM_SLICES, DI_CUDA_AM_PARTS / n);
    if (part && counters && S >= 2 && V >= DI_CUDA_AM_MIN_V) /* (so n <= DI_CUDA_AM_ROWS) */
        return di_cuda_launch(argmax_slices_kernel, dim3((unsigned)S, (unsigned)n),
                              AM_SLICE_THREADS, 0, stream, x, V, out, part, counters);
    return di_cuda_launch(argmax_kernel, (unsigned)n, AM_THREADS, 0, stream, x, V, out);
}
