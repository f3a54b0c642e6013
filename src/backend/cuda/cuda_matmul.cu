/*
 * cuda_matmul.cu -- the CUDA matmuls: y = W x (matmul, per-head products) and y = W^T x
 * (matmul_t, W_UK^T q), on F32 / F16 / BF16 / block-scaled FP8 (E4M3) weights.
 *
 * Design stance: decode is memory-bound, so the kernels are GEMVs that stream every weight
 * byte once with 16-byte loads (4 F32, 8 BF16/F16 or 16 FP8 elements per load, several
 * loads in flight per lane) and convert to float in registers; a handful of tokens (TB <= 8)
 * share each loaded weight vector, and larger batches are covered by more token groups.
 *
 * Invariant (batch invariance): the arithmetic of one output element is a fixed function of
 * the weight's shape, never of n, the token group size TB, the rows per warp or the grid:
 *   y = W x:    the row's 16-byte vectors are dealt to KS * 32 "slots" (KS warps of 32 lanes;
 *               KS = 4 for rows of >= 256 vectors, else 1: a function of cols and dtype
 *               only, the threshold fixed per process); slot q = w * 32 + l sums, with fmaf and in
 * order, the products of vectors v = q, q + 32 KS, q + 64 KS, ... (elements in order inside a
 * vector); each warp adds its 32 slot sums by the xor butterfly (offsets 16, 8, 4, 2, 1), and the
 * KS warp sums are added as (w0 + w1) + (w2 + w3). y = W^T x:  one thread per 16-byte vector of
 * output columns sums the rows in order. The token count only changes how many such sums run side
 * by side, so a row's result is the same bits alone or in any batch, and the tiling chosen for
 * large n (more token groups of TB = 8, not a tensor-core GEMM) keeps that. A tensor-core path for
 * prefill would need the same K order for every n (one kernel configuration for all batch sizes),
 * so it is left for later, behind an explicit non-invariant mode.
 *
 * FP8: the real weight is e4m3(byte) * scale(block), rounded to float once (the same value
 * the CPU kernels consume); blocks of any shape, partial blocks and row views work, with a
 * single scale lookup per 16-element vector when block_cols is a multiple of 16. By default
 * the conversion skips the conversion instructions: the byte's 7 low bits placed at float
 * bit 20 read as e4m3 * 2^-120 exactly (normal or subnormal), so one multiply by
 * scale * 2^120 gives the same once-rounded product; NaN bytes and huge scales take the
 * instruction path (DI_CUDA_FP8_CONVERT=cvt forces it; the values are the same).
 *
 * Measured on an H200 (NOTES.md): BF16 n = 1 at 83-88 % of the device copy bandwidth; FP8 is
 * still latency-bound at about 20 % (the next loads wait for the current dequantization).
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

/* ---------------------------------------------------------------------------------------- */
/* Weight element types: 16-byte raw vectors and their conversion to float                    */
/* ---------------------------------------------------------------------------------------- */

template <di_dtype DT> struct wtype;

template <> struct wtype<DI_DTYPE_F32> {
    static constexpr int ESZ = 4, V = 4;
    typedef uint32_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        return __uint_as_float(u[e]);
    }
};

template <> struct wtype<DI_DTYPE_BF16> {
    static constexpr int ESZ = 2, V = 8;
    typedef uint16_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        uint32_t w = u[e >> 1];
        return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
    }
};

template <> struct wtype<DI_DTYPE_F16> {
    static constexpr int ESZ = 2, V = 8;
    typedef uint16_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint16_t *u = reinterpret_cast<const uint16_t *>(&raw);
        return __half2float(__ushort_as_half(u[e]));
    }
};

template <> struct wtype<DI_DTYPE_F8_E4M3> {
    static constexpr int ESZ = 1, V = 16;
    typedef uint8_t elem;
    static __device__ __forceinline__ float conv(const uint4 &raw, int e) {
        const uint8_t *u = reinterpret_cast<const uint8_t *>(&raw);
        __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)u[e], __NV_E4M3);
        return __half2float(__half(h)); /* exact: every e4m3 value is a half */
    }
};

/* Loads the 16-byte vector at element c0 of a row: one load when the row is 16-byte
 * aligned and padded (vec), else element by element (zeros past nvalid). Weights are read
 * once per token group, so the load is marked streaming. */
template <di_dtype DT>
static __device__ __forceinline__ uint4 load_raw(const char *row, int64_t c0, int nvalid,
                                                 bool vec) {
    typedef wtype<DT> T;
    if (vec) return __ldcs(reinterpret_cast<const uint4 *>(row + c0 * T::ESZ));
    /* Packed with compile-time positions only, so the vector stays in registers. */
    const typename T::elem *src = reinterpret_cast<const typename T::elem *>(row) + c0;
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int e = 0; e < T::V; e++) {
        const uint32_t val = e < nvalid ? (uint32_t)src[e] : 0u;
        w[e * T::ESZ / 4] |= val << (8 * ((e * T::ESZ) % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Float values of the vector at element c0 (FP8: times its block scale, one rounding). */
template <di_dtype DT>
static __device__ __forceinline__ void
dequant(const uint4 &raw, int64_t c0, int nvalid, const float *srow, int64_t block_cols,
        bool one_scale, bool bits, float (&f)[wtype<DT>::V]) {
    typedef wtype<DT> T;
    if (DT == DI_DTYPE_F8_E4M3 && one_scale && bits) {
        const float s = srow[c0 / block_cols];
        const uint32_t *u = reinterpret_cast<const uint32_t *>(&raw);
        /* A byte 0x7f / 0xff (NaN) shows as 0x80 after adding 1 to its low 7 bits. */
        uint32_t nan_bytes = 0;
#pragma unroll
        for (int k = 0; k < 4; k++)
            nan_bytes |= ((u[k] & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
        if (nan_bytes == 0 && fabsf(s) < 0x1p7f) {
            const float s120 = s * 0x1p120f; /* exact */
#pragma unroll
            for (int e = 0; e < T::V; e++) {
                const uint32_t b = (u[e >> 2] >> (8 * (e & 3))) & 0xffu;
                f[e] = __fmul_rn(__uint_as_float(((b & 0x80u) << 24) | ((b & 0x7fu) << 20)), s120);
            }
            if (nvalid < T::V) {
#pragma unroll
                for (int e = 0; e < T::V; e++)
                    if (e >= nvalid) f[e] = 0.0f;
            }
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < T::V; e++)
        f[e] = T::conv(raw, e);
    if (nvalid < T::V) { /* a row's last vector: whatever lies past `cols` must not count */
#pragma unroll
        for (int e = 0; e < T::V; e++)
            if (e >= nvalid) f[e] = 0.0f;
    }
    if (DT == DI_DTYPE_F8_E4M3) {
        if (one_scale) {
            float s = srow[c0 / block_cols];
#pragma unroll
            for (int e = 0; e < T::V; e++)
                f[e] = __fmul_rn(f[e], s);
        } else {
#pragma unroll
            for (int e = 0; e < T::V; e++)
                f[e] = e < nvalid ? __fmul_rn(f[e], srow[(c0 + e) / block_cols]) : 0.0f;
        }
    }
}

/* x(t)[c0 .. c0 + V) as floats, zeros past nvalid; 16-byte loads when allowed. */
template <int V>
static __device__ __forceinline__ void load_x(const float *x, int64_t c0, int nvalid, bool xvec,
                                              float (&f)[V]) {
    if (xvec && nvalid == V) {
#pragma unroll
        for (int k = 0; k < V / 4; k++) {
            float4 q = __ldg(reinterpret_cast<const float4 *>(x + c0) + k);
            f[4 * k] = q.x, f[4 * k + 1] = q.y, f[4 * k + 2] = q.z, f[4 * k + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < V; e++)
            f[e] = e < nvalid ? __ldg(x + c0 + e) : 0.0f;
    }
}

static __device__ __forceinline__ const float *scale_row(const di_cuda_mm_params &p,
                                                         int64_t stored_row) {
    return p.scale ? p.scale + (stored_row / p.block_rows) * p.scale_cols : nullptr;
}

/* ---------------------------------------------------------------------------------------- */
/* y = W x                                                                                    */
/* ---------------------------------------------------------------------------------------- */

#define MM_WARPS 4 /* warps per block */

/* Warps sharing one row's K range: 4 for rows of at least ksplit_min vectors (default 256),
 * else 1. A function of the shape only (it fixes the summation order). */
static __host__ __device__ int mm_ksplit(int64_t nvec, int64_t ksplit_min) {
    return nvec >= ksplit_min ? 4 : 1;
}

/* Block: MM_WARPS warps = MM_WARPS / ks row groups of RB consecutive rows, each row group's
 * K range split over ks warps; all warps take the TB tokens of blockIdx.y; blockIdx.z is the
 * head. U 16-byte vectors per row are loaded before any is used. */
template <di_dtype DT, int TB, int RB, int U>
__global__ void __launch_bounds__(MM_WARPS * 32)
    gemv_kernel(const di_cuda_mm_params p, bool wvec, bool xvec) {
    typedef wtype<DT> T;
    constexpr int V = T::V;
    __shared__ float warp_sums[MM_WARPS][TB * RB];
    const int64_t nvec = (p.cols + V - 1) / V;
    const int ks = mm_ksplit(nvec, p.ksplit_min);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kw = warp % ks, group = warp / ks;
    const int64_t r0 = ((int64_t)blockIdx.x * (MM_WARPS / ks) + group) * RB;
    const int64_t t0 = (int64_t)blockIdx.y * TB, h = blockIdx.z;
    /* With ks > 1 a block holds one row group, so this exit is block-uniform. */
    if (r0 >= p.rows) return;
    const int nr = (int)min((int64_t)RB, p.rows - r0);
    const int nt = (int)min((int64_t)TB, p.n_tokens - t0);

    const char *w0 = static_cast<const char *>(p.data) + h * p.head_elem_stride * T::ESZ;
    const int64_t roff = p.row_offset + h * p.head_row_offset_stride;
    const char *wrow[RB];
    const float *srow[RB];
#pragma unroll
    for (int j = 0; j < RB; j++) {
        int64_t r = r0 + min(j, nr - 1); /* rows past the end alias the last one, unused */
        wrow[j] = w0 + r * p.row_stride * T::ESZ;
        srow[j] = DT == DI_DTYPE_F8_E4M3 ? scale_row(p, roff + r) : nullptr;
    }
    const bool one_scale = DT == DI_DTYPE_F8_E4M3 && p.block_cols % V == 0;
    const float *xb = p.x + h * p.x_hstride + t0 * p.x_tstride;

    float acc[TB][RB];
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int j = 0; j < RB; j++)
            acc[i][j] = 0.0f;

    const int64_t step = 32 * (int64_t)ks; /* vectors between a slot's consecutive vectors */
    for (int64_t vb = kw * 32 + lane; vb < nvec; vb += step * U) {
        uint4 raw[U][RB];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t v = vb + step * u;
            const int nvalid = (int)min((int64_t)V, p.cols - v * V);
#pragma unroll
            for (int j = 0; j < RB; j++)
                raw[u][j] =
                    v < nvec ? load_raw<DT>(wrow[j], v * V, nvalid, wvec) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t v = vb + step * u;
            if (v >= nvec) break;
            const int64_t c0 = v * V;
            const int nvalid = (int)min((int64_t)V, p.cols - c0);
            float wf[RB][V];
#pragma unroll
            for (int j = 0; j < RB; j++)
                dequant<DT>(raw[u][j], c0, nvalid, srow[j], p.block_cols, one_scale, p.fp8_bits,
                            wf[j]);
#pragma unroll
            for (int i = 0; i < TB; i++) {
                if (i >= nt) break;
                float xf[V];
                load_x<V>(xb + i * p.x_tstride, c0, nvalid, xvec, xf);
                /* Elements past nvalid are zero in both, and only the last vector of a row
                 * has them: adding 0 * 0 there changes no bit of a finite sum. */
#pragma unroll
                for (int j = 0; j < RB; j++)
#pragma unroll
                    for (int e = 0; e < V; e++)
                        acc[i][j] = fmaf(wf[j][e], xf[e], acc[i][j]);
            }
        }
    }

    /* The fixed butterfly: every lane ends with its warp's total. */
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int j = 0; j < RB; j++)
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], off);
    float *y = p.y + h * p.y_hstride + t0 * p.y_tstride + r0;
    if (ks == 1) {
#pragma unroll
        for (int i = 0; i < TB; i++)
#pragma unroll
            for (int j = 0; j < RB; j++)
                if (lane == i * RB + j && i < nt && j < nr) y[i * p.y_tstride + j] = acc[i][j];
        return;
    }
    /* ks == 4: the four warp totals, added in a fixed tree. */
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int j = 0; j < RB; j++)
            if (lane == i * RB + j) warp_sums[warp][i * RB + j] = acc[i][j];
    __syncthreads();
    if (warp == 0 && lane < TB * RB) {
        const int i = lane / RB, j = lane % RB;
        const float tot =
            (warp_sums[0][lane] + warp_sums[1][lane]) + (warp_sums[2][lane] + warp_sums[3][lane]);
        if (i < nt && j < nr) y[i * p.y_tstride + j] = tot;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* y = W^T x                                                                                  */
/* ---------------------------------------------------------------------------------------- */

#define MMT_THREADS 128
#define MMT_UNROLL  4

/* Thread: one 16-byte vector of output columns for the TB tokens of blockIdx.y, summing the
 * weight rows in order. */
template <di_dtype DT, int TB>
__global__ void __launch_bounds__(MMT_THREADS) gemv_t_kernel(const di_cuda_mm_params p, bool wvec) {
    typedef wtype<DT> T;
    constexpr int V = T::V;
    const int64_t v = (int64_t)blockIdx.x * MMT_THREADS + threadIdx.x;
    const int64_t t0 = (int64_t)blockIdx.y * TB, h = blockIdx.z;
    const int64_t nvec = (p.cols + V - 1) / V;
    if (v >= nvec) return;
    const int64_t c0 = v * V;
    const int nvalid = (int)min((int64_t)V, p.cols - c0);
    const int nt = (int)min((int64_t)TB, p.n_tokens - t0);
    const char *w0 = static_cast<const char *>(p.data) + h * p.head_elem_stride * T::ESZ;
    const int64_t roff = p.row_offset + h * p.head_row_offset_stride;
    const bool one_scale = DT == DI_DTYPE_F8_E4M3 && p.block_cols % V == 0;
    const float *xb = p.x + h * p.x_hstride + t0 * p.x_tstride;

    float acc[TB][V];
#pragma unroll
    for (int i = 0; i < TB; i++)
#pragma unroll
        for (int e = 0; e < V; e++)
            acc[i][e] = 0.0f;

    for (int64_t rb = 0; rb < p.rows; rb += MMT_UNROLL) {
        uint4 raw[MMT_UNROLL];
#pragma unroll
        for (int u = 0; u < MMT_UNROLL; u++)
            raw[u] = rb + u < p.rows
                         ? load_raw<DT>(w0 + (rb + u) * p.row_stride * T::ESZ, c0, nvalid, wvec)
                         : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < MMT_UNROLL; u++) {
            const int64_t r = rb + u;
            if (r >= p.rows) break;
            float wf[V];
            dequant<DT>(raw[u], c0, nvalid,
                        DT == DI_DTYPE_F8_E4M3 ? scale_row(p, roff + r) : nullptr, p.block_cols,
                        one_scale, p.fp8_bits, wf);
#pragma unroll
            for (int i = 0; i < TB; i++) {
                if (i >= nt) break;
                const float xv = __ldg(xb + i * p.x_tstride + r);
#pragma unroll
                for (int e = 0; e < V; e++)
                    acc[i][e] = fmaf(wf[e], xv, acc[i][e]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < TB; i++) {
        if (i >= nt) break;
        float *y = p.y + h * p.y_hstride + (t0 + i) * p.y_tstride + c0;
#pragma unroll
        for (int e = 0; e < V; e++)
            if (e < nvalid) y[e] = acc[i][e];
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Launchers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static bool aligned16(const void *ptr) {
    return ((uintptr_t)ptr & 15u) == 0;
}

template <di_dtype DT> static cudaError_t launch_dtype(const di_cuda_mm_params *p) {
    typedef wtype<DT> T;
    /* 16-byte weight loads need every row (of every head) to start on a 16-byte boundary;
     * reading a whole vector past `cols` then stays inside the row's stride. */
    const bool wvec = aligned16(p->data) && (p->row_stride * T::ESZ) % 16 == 0 &&
                      (p->head_elem_stride * T::ESZ) % 16 == 0 && p->row_stride >= p->cols;
    if (p->transposed) {
        const int64_t nvec = (p->cols + T::V - 1) / T::V;
        const int tb = p->n_tokens == 1 ? 1 : 4;
        dim3 grid((unsigned)((nvec + MMT_THREADS - 1) / MMT_THREADS),
                  (unsigned)((p->n_tokens + tb - 1) / tb), (unsigned)p->n_heads);
        if (tb == 1)
            gemv_t_kernel<DT, 1><<<grid, MMT_THREADS, 0, p->stream>>>(*p, wvec);
        else
            gemv_t_kernel<DT, 4><<<grid, MMT_THREADS, 0, p->stream>>>(*p, wvec);
        return cudaGetLastError();
    }
    const bool xvec = aligned16(p->x) && p->x_tstride % 4 == 0 && p->x_hstride % 4 == 0;
    const int64_t n = p->n_tokens, nvec = (p->cols + T::V - 1) / T::V;
    const int tb = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8;
    /* One token: 2 rows x 4 vectors in flight per lane. More tokens: 4 rows per warp, so
     * that each activation vector loaded serves more weights. */
    const int rb = tb == 1 ? 2 : 4;
    const int64_t rows_per_block = MM_WARPS / mm_ksplit(nvec, p->ksplit_min) * rb;
    dim3 grid((unsigned)((p->rows + rows_per_block - 1) / rows_per_block),
              (unsigned)((n + tb - 1) / tb), (unsigned)p->n_heads);
    const dim3 block(MM_WARPS * 32);
    switch (tb) {
    case 1:
        gemv_kernel<DT, 1, 2, 4><<<grid, block, 0, p->stream>>>(*p, wvec, xvec);
        break;
    case 2:
        gemv_kernel<DT, 2, 4, 2><<<grid, block, 0, p->stream>>>(*p, wvec, xvec);
        break;
    case 4:
        gemv_kernel<DT, 4, 4, 2><<<grid, block, 0, p->stream>>>(*p, wvec, xvec);
        break;
    default:
        gemv_kernel<DT, 8, 4, 2><<<grid, block, 0, p->stream>>>(*p, wvec, xvec);
        break;
    }
    return cudaGetLastError();
}

cudaError_t di_cuda_launch_matmul(const di_cuda_mm_params *p) {
    if (p->n_tokens <= 0 || p->n_heads <= 0 || p->rows <= 0 || p->cols <= 0) return cudaSuccess;
    switch (p->dtype) {
    case DI_DTYPE_F32:
        return launch_dtype<DI_DTYPE_F32>(p);
    case DI_DTYPE_F16:
        return launch_dtype<DI_DTYPE_F16>(p);
    case DI_DTYPE_BF16:
        return launch_dtype<DI_DTYPE_BF16>(p);
    case DI_DTYPE_F8_E4M3:
        return launch_dtype<DI_DTYPE_F8_E4M3>(p);
    default:
        return cudaErrorInvalidValue;
    }
}
