/*
 * cuda_v4.cu -- the DeepSeek-V4 ops on the GPU: FP4 (e2m1) GEMV with E8M0 block scales, mHC
 * mixing (Sinkhorn) and its update, sink attention over explicit key lists, the
 * compressor's softmax pooling, Lightning-indexer scores and the clamped SwiGLU.
 *
 * The math is backend.h's, the references are the CPU ops in cpu_v4_ops.c; where those sum
 * in double (norm statistics, mixing products, softmax denominators) the kernels do too,
 * so the two agree to rounding.
 *
 * Invariant (batch invariance): every output element is produced by one thread, one warp or
 * one block whose reduction order depends only on the op's shape (row width, key count,
 * head count), never on the number of tokens or on the grid; a token's results are the
 * same bits alone or in any batch (tests/ops/test_cuda_v4_ops.c checks it).
 *
 * Pointer lists: v4_attention's `keys` and v4_pool's `c` / `z` are arrays of row pointers.
 * On this backend the array itself and every pointer in it are device memory (one
 * cudaMemcpy of the host-built list per call at most, or built on the device); see
 * cuda_backend.h.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <math.h>

/* ---------------------------------------------------------------------------------------- */
/* Shared helpers                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* 2^(b - 127) as di_e8m0_to_f32 defines it: 0xff is NaN, 0 the subnormal 2^-127. */
static __device__ __forceinline__ float e8m0(uint8_t b) {
    if (b == 0xff) return __uint_as_float(0x7fc00000u);
    if (b == 0) return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)b << 23);
}

/* The e2m1 value of nibble n (0, .5, 1, 1.5, 2, 3, 4, 6 and negatives), exactly: its bits
 * placed as a float with exponent field e and mantissa bit m give the value times 2^-126
 * (subnormal for e == 0, like e2m1's own 0.5), and the multiply by 2^126 is exact. */
static __device__ __forceinline__ float e2m1(uint32_t n) {
    return __fmul_rn(__uint_as_float(((n & 8u) << 28) | ((n & 7u) << 22)), 0x1p126f);
}

/* Sum of v over the block's threads (blockDim.x == THREADS, a power of two) in a fixed
 * tree; red has THREADS doubles. Every thread gets the total. */
template <int THREADS>
static __device__ __forceinline__ double block_sum_fixed(double v, double *red) {
    const int tid = threadIdx.x;
    __syncthreads(); /* red's previous readers are done */
    red[tid] = v;
    __syncthreads();
#pragma unroll
    for (int s = THREADS / 2; s >= 1; s >>= 1) {
        if (tid < s) red[tid] = red[tid] + red[tid + s];
        __syncthreads();
    }
    return red[0];
}

static unsigned grid_1d(int64_t n, int threads) {
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b);
}

/* ---------------------------------------------------------------------------------------- */
/* FP4 GEMV: y = W x with W in e2m1, two per byte, E8M0 scales per block_cols columns       */
/* ---------------------------------------------------------------------------------------- */

#define FP4_WARPS 4
#define FP4_RB    4  /* rows per row group: each activation word loaded serves four rows */
#define FP4_SEG   32 /* columns per segment: 16 bytes */

/* Warps sharing one row group's segments: 4 for rows of at least 128 segments (4096
 * columns), else 1. A function of cols only (it fixes the summation order). */
static __host__ __device__ int fp4_ksplit(int64_t nseg) {
    return nseg >= 128 ? 4 : 1;
}

/* Loads segment s (columns [32 s, 32 s + 32)) of a row: one 16-byte load when the rows are
 * 16-byte aligned and padded, else byte by byte with zeros past the row's last byte. */
static __device__ __forceinline__ uint4 fp4_load(const uint8_t *row, int64_t s, int64_t row_bytes,
                                                 bool vec) {
    if (vec) return __ldcs(reinterpret_cast<const uint4 *>(row) + s);
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int b = 0; b < 16; b++) {
        const int64_t i = s * 16 + b;
        w[b / 4] |= (i < row_bytes ? (uint32_t)row[i] : 0u) << (8 * (b % 4));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Word k (runtime) of a vector, by selects: an indexed access would move the vector to
 * local memory. */
static __device__ __forceinline__ uint32_t word_of(const uint4 &v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* x(t)[c .. c + 8) as floats, zeros from element nvalid on (two 16-byte loads when allowed). */
static __device__ __forceinline__ void fp4_x8(const float *x, int nvalid, bool xvec,
                                              float (&f)[8]) {
    if (xvec && nvalid >= 8) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(x));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(x) + 1);
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z,
        f[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            f[e] = e < nvalid ? __ldg(x + e) : 0.0f;
    }
}

/* Block: FP4_WARPS warps = FP4_WARPS / ks row groups of FP4_RB consecutive rows, each row
 * group's segments dealt to ks warps; TB tokens (blockIdx.y). Slot q = kw * 32 + lane takes
 * segments q, q + 32 ks, ... in order. Per segment (one_scale: block_cols a multiple of 32)
 * the unscaled products are an in-order fmaf chain, scaled once and added; for other block
 * widths each element is scaled first. Each 4-byte word (8 columns) of the rows is decoded
 * once and used at once for every token. Lanes are added by the xor butterfly, the ks warp
 * sums as (w0 + w1) + (w2 + w3). The order depends on cols and block_cols only.
 * G: grouped mode (p.experts, matmul_experts; cuda_internal.cuh): blockIdx.z is an
 * active-expert slot, and the block walks its expert's rows TB at a time (the launch has one
 * token-group row), each group through the same body as a plain block's one group, so a
 * row's value is the plain kernel's whatever TB or the rows around it. A separate
 * instantiation, so that the plain kernel keeps its one-group body. */
template <int TB, bool G>
__global__ void __launch_bounds__(FP4_WARPS * 32)
    fp4_gemv_kernel(const di_cuda_fp4_params p, bool wvec, bool xvec) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    __shared__ float warp_sums[FP4_WARPS][TB * FP4_RB];
    const int64_t nseg = (p.cols + FP4_SEG - 1) / FP4_SEG;
    const int ks = fp4_ksplit(nseg);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kw = warp % ks, group = warp / ks;
    const int64_t r0 = ((int64_t)blockIdx.x * (FP4_WARPS / ks) + group) * FP4_RB;
    int64_t t_first = (int64_t)blockIdx.y * TB, t_end = p.n_tokens;
    /* With ks > 1 a block holds one row group, so this exit is block-uniform. */
    if (r0 >= p.rows) return;
    const uint8_t *data = p.data, *scale = p.scale;
    if constexpr (G) { /* the slot's expert and its rows (the same for the whole block) */
        if ((int)blockIdx.z >= p.g_active[0]) return;
        const int e = p.g_active[1 + blockIdx.z];
        data = static_cast<const uint8_t *>(p.experts[e].data);
        scale = p.experts[e].scale_e8m0;
        t_first = p.g_off[e];
        t_end = p.g_off[e + 1];
    }
    const int nr = (int)min((int64_t)FP4_RB, p.rows - r0);
    const bool one_scale = p.block_cols % FP4_SEG == 0;
    const uint8_t *wrow[FP4_RB];
    const uint8_t *srow[FP4_RB];
#pragma unroll
    for (int j = 0; j < FP4_RB; j++) {
        const int64_t r = r0 + min(j, nr - 1); /* rows past the end alias the last, unused */
        wrow[j] = data + r * p.row_bytes;
        srow[j] = scale + r * p.scale_cols;
    }
    /* One token group: rows t0 .. t0 + nt of x and y (nt <= TB). */
    auto tokens = [&](const int64_t t0, const int nt) {
        const float *xb = p.x + t0 * p.cols;
        float acc[TB][FP4_RB];
#pragma unroll
        for (int i = 0; i < TB; i++)
#pragma unroll
            for (int j = 0; j < FP4_RB; j++)
                acc[i][j] = 0.0f;

        for (int64_t s = kw * 32 + lane; s < nseg; s += 32 * (int64_t)ks) {
            const int64_t c0 = s * FP4_SEG;
            const int nvalid = (int)min((int64_t)FP4_SEG, p.cols - c0);
            uint4 raw[FP4_RB];
#pragma unroll
            for (int j = 0; j < FP4_RB; j++)
                raw[j] = fp4_load(wrow[j], s, p.row_bytes, wvec);
            if (one_scale) {
                const int64_t sidx = (int64_t)((uint32_t)c0 / (uint32_t)p.block_cols);
                float part[TB][FP4_RB];
#pragma unroll
                for (int i = 0; i < TB; i++)
#pragma unroll
                    for (int j = 0; j < FP4_RB; j++)
                        part[i][j] = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float w[FP4_RB][8];
#pragma unroll
                    for (int j = 0; j < FP4_RB; j++) {
                        const uint32_t u = reinterpret_cast<const uint32_t *>(&raw[j])[k];
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            w[j][e] = e2m1(u >> (4 * e));
                    }
#pragma unroll
                    for (int i = 0; i < TB; i++) {
                        if (i >= nt) break;
                        /* past nvalid x is 0 and the nibbles are finite: adds +-0 */
                        float xf[8];
                        fp4_x8(xb + i * p.cols + c0 + 8 * k, nvalid - 8 * k, xvec, xf);
#pragma unroll
                        for (int j = 0; j < FP4_RB; j++)
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                part[i][j] = fmaf(w[j][e], xf[e], part[i][j]);
                    }
                }
#pragma unroll
                for (int j = 0; j < FP4_RB; j++) {
                    const float sc = e8m0(srow[j][sidx]);
#pragma unroll
                    for (int i = 0; i < TB; i++)
                        acc[i][j] = fmaf(part[i][j], sc, acc[i][j]);
                }
            } else {
                for (int c = 0; c < nvalid; c++) {
                    const int64_t col = c0 + c;
                    float wv[FP4_RB];
#pragma unroll
                    for (int j = 0; j < FP4_RB; j++) {
                        const uint32_t u = word_of(raw[j], c >> 3);
                        wv[j] = __fmul_rn(e2m1(u >> (4 * (c & 7))),
                                          e8m0(srow[j][(uint32_t)col / (uint32_t)p.block_cols]));
                    }
#pragma unroll
                    for (int i = 0; i < TB; i++) {
                        if (i >= nt) break;
                        const float xv = __ldg(xb + i * p.cols + col);
#pragma unroll
                        for (int j = 0; j < FP4_RB; j++)
                            acc[i][j] = fmaf(wv[j], xv, acc[i][j]);
                    }
                }
            }
        }

        /* The fixed butterfly: every lane ends with its warp's total. */
#pragma unroll
        for (int i = 0; i < TB; i++)
#pragma unroll
            for (int j = 0; j < FP4_RB; j++)
#pragma unroll
                for (int off = 16; off >= 1; off >>= 1)
                    acc[i][j] += __shfl_xor_sync(0xffffffffu, acc[i][j], off);
        float *y = p.y + t0 * p.rows + r0;
        if (ks == 1) {
#pragma unroll
            for (int i = 0; i < TB; i++)
#pragma unroll
                for (int j = 0; j < FP4_RB; j++)
                    if (lane == i * FP4_RB + j && i < nt && j < nr) y[i * p.rows + j] = acc[i][j];
        } else {
            /* ks == 4: the four warp totals, added in a fixed tree. */
            if constexpr (G) __syncthreads(); /* the previous group's totals have been read */
#pragma unroll
            for (int i = 0; i < TB; i++)
#pragma unroll
                for (int j = 0; j < FP4_RB; j++)
                    if (lane == i * FP4_RB + j) warp_sums[warp][i * FP4_RB + j] = acc[i][j];
            __syncthreads();
            if (warp == 0 && lane < TB * FP4_RB) {
                const int i = lane / FP4_RB, j = lane % FP4_RB;
                const float tot = (warp_sums[0][lane] + warp_sums[1][lane]) +
                                  (warp_sums[2][lane] + warp_sums[3][lane]);
                if (i < nt && j < nr) y[i * p.rows + j] = tot;
            }
        }
    };
    if constexpr (G) { /* each group of the expert's rows in turn; none past its end */
        for (int64_t t0 = t_first; t0 < t_end; t0 += TB)
            tokens(t0, (int)min((int64_t)TB, t_end - t0));
    } else {
        tokens(t_first, (int)min((int64_t)TB, t_end - t_first));
    }
}

/* One launch of the TB variant, grouped or plain (fp4_gemv_kernel's G). */
template <int TB>
static cudaError_t launch_fp4(dim3 grid, const di_cuda_fp4_params *p, bool wvec, bool xvec) {
    const dim3 block(FP4_WARPS * 32);
    if (p->experts)
        return di_cuda_launch(fp4_gemv_kernel<TB, true>, grid, block, 0, p->stream, *p, wvec, xvec);
    return di_cuda_launch(fp4_gemv_kernel<TB, false>, grid, block, 0, p->stream, *p, wvec, xvec);
}

cudaError_t di_cuda_launch_matmul_fp4(const di_cuda_fp4_params *p) {
    const bool grouped = p->experts != NULL;
    if (p->n_tokens <= 0 || p->rows <= 0 || p->cols <= 0 || (grouped && p->max_active <= 0))
        return cudaSuccess;
    /* Grouped: expert 0's data stands for all (expert_table checks that every expert's data
     * has its alignment). */
    const bool wvec = ((uintptr_t)p->data & 15u) == 0 && p->row_bytes % 16 == 0;
    const bool xvec = ((uintptr_t)p->x & 15u) == 0 && p->cols % 4 == 0;
    /* Tokens per weight: n, or grouped the mean rows per active-expert slot (a block walks
     * its expert's rows, so an expert with more rows than the mean takes more passes). TB
     * chooses the variant, never a value. */
    const int64_t n = grouped ? (p->n_tokens + p->max_active - 1) / p->max_active : p->n_tokens;
    const int64_t nseg = (p->cols + FP4_SEG - 1) / FP4_SEG;
    const int tb = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : 8;
    const int64_t rows_per_block = FP4_WARPS / fp4_ksplit(nseg) * FP4_RB;
    dim3 grid((unsigned)((p->rows + rows_per_block - 1) / rows_per_block),
              grouped ? 1u : (unsigned)((n + tb - 1) / tb), grouped ? (unsigned)p->max_active : 1u);
    switch (tb) {
    case 1:
        return launch_fp4<1>(grid, p, wvec, xvec);
    case 2:
        return launch_fp4<2>(grid, p, wvec, xvec);
    case 4:
        return launch_fp4<4>(grid, p, wvec, xvec);
    default:
        return launch_fp4<8>(grid, p, wvec, xvec);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* mHC: mixing weights, Sinkhorn, collapse; and the update                                   */
/* ---------------------------------------------------------------------------------------- */

#define HC_THREADS 256

static __device__ float sigmoid_d(float v) {
    return (float)(1.0 / (1.0 + exp(-(double)v)));
}

#define HC_MIX_THREADS 1024

/* The mixing rows' dot products, one block per (token t, row k) so that a token's rows load
 * the device rather than one SM: the stream norm 1 / rms(x) (a double sum, strided
 * per-thread partials added by a fixed tree), then mix[t][k] = sum_i fn[k][i] (x[i] / rms)
 * by the same partials and tree. At one token the former single block per token read all
 * (2 + n) n rows (1.6 MB for V4-Flash) alone; with 256 threads and a float per load a block
 * still took 14 us for its 128 KB, so 1024 threads load 16 bytes each where the rows allow
 * (vec: the same for every token, so the order never depends on the batch). Each of a
 * token's (2 + n) n blocks computes the token's norm itself: its 64 KB come from L2, which
 * costs less than a kernel and a round trip to hand the norm over. */
__global__ void __launch_bounds__(HC_MIX_THREADS)
    hc_mix_kernel(const di_v4_hc_params p, int64_t t0, float *mix) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    __shared__ double red[HC_MIX_THREADS];
    const int tid = threadIdx.x;
    const int64_t t = t0 + blockIdx.x, k = blockIdx.y, ND = p.n_hc * p.dim;
    const float *x = p.x + t * ND, *f = p.fn + k * ND;
    const bool vec = ND % 4 == 0 && ((uintptr_t)p.x & 15u) == 0 && ((uintptr_t)p.fn & 15u) == 0;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    const float4 *f4 = reinterpret_cast<const float4 *>(f);
    double ss = 0.0;
    if (vec) {
        for (int64_t i = tid; i < ND / 4; i += HC_MIX_THREADS) {
            const float4 v = x4[i];
            ss += (double)v.x * (double)v.x;
            ss += (double)v.y * (double)v.y;
            ss += (double)v.z * (double)v.z;
            ss += (double)v.w * (double)v.w;
        }
    } else {
        for (int64_t i = tid; i < ND; i += HC_MIX_THREADS)
            ss += (double)x[i] * (double)x[i];
    }
    ss = block_sum_fixed<HC_MIX_THREADS>(ss, red);
    const float rs = 1.0f / sqrtf((float)(ss / (double)ND) + p.eps);
    double s = 0.0;
    if (vec) {
        for (int64_t i = tid; i < ND / 4; i += HC_MIX_THREADS) {
            const float4 v = x4[i], w = f4[i];
            s += (double)w.x * (double)__fmul_rn(v.x, rs);
            s += (double)w.y * (double)__fmul_rn(v.y, rs);
            s += (double)w.z * (double)__fmul_rn(v.z, rs);
            s += (double)w.w * (double)__fmul_rn(v.w, rs);
        }
    } else {
        for (int64_t i = tid; i < ND; i += HC_MIX_THREADS)
            s += (double)f[i] * (double)__fmul_rn(x[i], rs);
    }
    s = block_sum_fixed<HC_MIX_THREADS>(s, red);
    if (tid == 0) mix[blockIdx.x * gridDim.y + k] = (float)s;
}

/* Row j's softmax of the mixing logits into row (the CPU's arithmetic and order). */
static __device__ void hc_row_softmax(const di_v4_hc_params &p, const float *mix, int64_t j,
                                      float *row) {
    const int64_t n = p.n_hc;
    float mx = -INFINITY;
    for (int64_t k = 0; k < n; k++) {
        row[k] = __fmul_rn(mix[2 * n + j * n + k], p.scale[2]) + p.base[2 * n + j * n + k];
        mx = fmaxf(mx, row[k]);
    }
    double sum = 0.0;
    for (int64_t k = 0; k < n; k++)
        sum += exp((double)(row[k] - mx));
    for (int64_t k = 0; k < n; k++)
        row[k] = (float)(exp((double)(row[k] - mx)) / sum) + p.hc_eps;
}

/* The Sinkhorn for n x n <= 32 in one warp's registers: lane l holds M[l / n][l % n]. A row's
 * or column's sum gathers its n values by shuffles and adds them in the CPU's order (the
 * CPU's arithmetic, double exp aside: see hc_pre_kernel); no shared memory and no barrier in the
 * chain (the block-barrier form, a thread per row / column on a shared copy of M, took 27.7 us per
 * launch on the H200; on warp 0 with warp barriers, 32.4; this form with the collapse spread over
 * blocks: 53.5 us for a decode step's five launches, 4 of them with the Sinkhorn). All 32 lanes
 * call it. */
static __device__ void hc_sinkhorn_warp(const di_v4_hc_params &p, const float *mix, int64_t t,
                                        int lane) {
    const int n = (int)p.n_hc, r = lane / n, c = lane % n;
    const bool own = lane < n * n;
    const unsigned all = 0xffffffffu;
    /* row r's softmax: the max (order-free), the exponentials, their sum in k order */
    const float v = own ? __fmul_rn(mix[2 * n + lane], p.scale[2]) + p.base[2 * n + lane] : 0.0f;
    float mx = -INFINITY;
    for (int k = 0; k < n; k++)
        mx = fmaxf(mx, __shfl_sync(all, v, r * n + k));
    const double e = exp((double)(v - mx));
    double sum = 0.0;
    for (int k = 0; k < n; k++)
        sum += __shfl_sync(all, e, r * n + k);
    float m = (float)(e / sum) + p.hc_eps;
    /* columns first, then (iters - 1) x (rows, columns), hc_eps in every denominator */
    for (int64_t it = 0; it < p.iters; it++) {
        if (it > 0) {
            double rs = 0.0;
            for (int k = 0; k < n; k++)
                rs += __shfl_sync(all, m, r * n + k);
            m /= (float)rs + p.hc_eps;
        }
        double cs = 0.0;
        for (int k = 0; k < n; k++)
            cs += __shfl_sync(all, m, k * n + c);
        m /= (float)cs + p.hc_eps;
    }
    if (own) p.mix[t * n * n + lane] = m;
}

/* v[0], v[stride], ..., v[(n - 1) stride] divided by their sum (a double, in order) plus eps
 * rounded to float: one Sinkhorn row (stride 1) or column (stride n), as the CPU does it. */
static __device__ void hc_normalise(float *v, int64_t n, int64_t stride, float eps) {
    double sum = 0.0;
    for (int64_t k = 0; k < n; k++)
        sum += v[k * stride];
    const float den = (float)sum + eps;
    for (int64_t k = 0; k < n; k++)
        v[k * stride] /= den;
}

/* The Sinkhorn for any n: thread j < n takes row j and column j of M in shared memory, the
 * steps apart by block barriers (the CPU's arithmetic in the CPU's order). All threads call
 * it; M is written out. */
static __device__ void hc_sinkhorn_block(const di_v4_hc_params &p, const float *mix, int64_t t,
                                         float *M) {
    const int64_t n = p.n_hc, j = threadIdx.x;
    if (j < n) hc_row_softmax(p, mix, j, M + j * n);
    __syncthreads();
    for (int64_t it = 0; it < p.iters; it++) {
        if (it > 0) {
            if (j < n) hc_normalise(M + j * n, n, 1, p.hc_eps); /* row j */
            __syncthreads();
        }
        if (j < n) hc_normalise(M + j, n, n, p.hc_eps); /* column j */
        __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < n * n; i += blockDim.x)
        p.mix[t * n * n + i] = M[i];
}

/* After hc_mix_kernel, block (token t, slice y) of HC_THREADS columns: pre (every block its
 * own copy, the same bits), the collapse h[d] = sum_i pre_i x_i[d] for its slice, one column
 * per thread with the streams' loads issued together; block y = 0 also computes post and
 * the Sinkhorn (in one warp's registers for n_hc <= 5, V4-Flash's 4, else on a shared copy
 * of M) -- the CPU's formulas in the CPU's order (CUDA's double exp may differ from the C
 * library's in the last bit, within the op tests' tolerance). One block per token that walked all
 * of D with a chain of dependent loads per column took 15 us at one token on the H200 for the
 * collapse alone; one thread on M in global memory, 230 us for the Sinkhorn. */
#define HC_COLLAPSE_UNROLL 8 /* streams whose loads are issued together */

__global__ void __launch_bounds__(HC_THREADS)
    hc_pre_kernel(const di_v4_hc_params p, int64_t t0, const float *mix_in) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ float hc_smem[]; /* [n_mix] mix, [n_hc] pre, [n_hc^2] M (block form) */
    const int tid = threadIdx.x;
    const int64_t t = t0 + blockIdx.x, n = p.n_hc, D = p.dim, ND = n * D;
    const int64_t n_mix = p.iters > 0 ? (2 + n) * n : n;
    float *mix = hc_smem, *pre = hc_smem + n_mix, *M = pre + n;
    for (int64_t i = tid; i < n_mix; i += HC_THREADS)
        mix[i] = mix_in[blockIdx.x * n_mix + i];
    __syncthreads();

    const int64_t j = tid;
    /* (__fmul_rn: the multiply rounded apart from the add, as the CPU build rounds it; nvcc
     * would fuse a * b + c into one fma) */
    if (j < n) pre[j] = sigmoid_d(__fmul_rn(mix[j], p.scale[0]) + p.base[j]) + p.hc_eps;
    if (p.iters > 0 && blockIdx.y == 0) {
        if (j < n)
            p.post[t * n + j] = 2.0f * sigmoid_d(__fmul_rn(mix[n + j], p.scale[1]) + p.base[n + j]);
        if (n * n <= 32) {
            if (tid < 32) hc_sinkhorn_warp(p, mix, t, tid);
        } else {
            hc_sinkhorn_block(p, mix, t, M); /* (uniform over the block: it holds barriers) */
        }
    }
    __syncthreads(); /* pre[] */
    const int64_t d = (int64_t)blockIdx.y * HC_THREADS + tid;
    if (d >= D) return;
    const float *x = p.x + t * ND + d;
    float xv[HC_COLLAPSE_UNROLL];
#pragma unroll
    for (int i = 0; i < HC_COLLAPSE_UNROLL; i++)
        xv[i] = i < n ? x[i * D] : 0.0f;
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < HC_COLLAPSE_UNROLL; i++)
        if (i < n) s += (double)pre[i] * (double)xv[i];
    for (int64_t i = HC_COLLAPSE_UNROLL; i < n; i++) /* more streams: in order, as the CPU */
        s += (double)pre[i] * (double)x[i * D];
    p.h[t * D + d] = (float)s;
}

cudaError_t di_cuda_launch_v4_hc_pre(const di_v4_hc_params *p, float *scratch,
                                     int64_t scratch_floats, cudaStream_t stream) {
    if (p->n_tokens <= 0) return cudaSuccess;
    const int64_t n = p->n_hc, n_mix = p->iters > 0 ? (2 + n) * n : n;
    const size_t smem = (size_t)(n_mix + n + (p->iters > 0 ? n * n : 0)) * sizeof(float);
    const int64_t piece = scratch_floats / n_mix; /* tokens whose mix rows fit the scratch */
    const int64_t slices = (p->dim + HC_THREADS - 1) / HC_THREADS;
    if (p->dim <= 0) return cudaSuccess;
    /* pre[] and post[] take a thread per stream */
    if (piece < 1 || slices > 65535 || n > HC_THREADS) return cudaErrorInvalidValue;
    for (int64_t t0 = 0; t0 < p->n_tokens; t0 += piece) {
        const int64_t nt = p->n_tokens - t0 < piece ? p->n_tokens - t0 : piece;
        cudaError_t err = di_cuda_launch(hc_mix_kernel, dim3((unsigned)nt, (unsigned)n_mix),
                                         dim3(HC_MIX_THREADS), 0, stream, *p, t0, scratch);
        if (err == cudaSuccess)
            err = di_cuda_launch(hc_pre_kernel, dim3((unsigned)nt, (unsigned)slices),
                                 dim3(HC_THREADS), smem, stream, *p, t0, (const float *)scratch);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

/* out[t][k][d] = post[t][k] y[t][d] + sum_i M[t][i][k] x[t][i][d], one thread per element. */
__global__ void hc_post_kernel(int64_t n_tokens, int64_t n, int64_t D, const float *x,
                               const float *y, const float *post, const float *mix, float *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_tokens * n * D) return;
    const int64_t d = e % D, k = (e / D) % n, t = e / (n * D);
    const float *xt = x + t * n * D, *M = mix + t * n * n;
    double s = (double)post[t * n + k] * (double)y[t * D + d];
    for (int64_t i = 0; i < n; i++)
        s += (double)M[i * n + k] * (double)xt[i * D + d];
    out[e] = (float)s;
}

cudaError_t di_cuda_launch_v4_hc_post(int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                                      const float *y, const float *post, const float *mix,
                                      float *out, cudaStream_t stream) {
    const int64_t total = n_tokens * n_hc * dim;
    if (total <= 0) return cudaSuccess;
    return di_cuda_launch(hc_post_kernel, dim3(grid_1d(total, 256)), dim3(256), 0, stream, n_tokens,
                          n_hc, dim, x, y, post, mix, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Sink attention over explicit key lists                                                     */
/* ---------------------------------------------------------------------------------------- */

#define V4A_THREADS 512
#define V4A_WARPS   (V4A_THREADS / 32)

/* One block per (token, head), 16 warps (4 took 56 us per V4-Flash layer at one token and 160
 * keys on the H200: each warp's 40 dot products and each thread's 4 output chains in a row).
 * Scores: warp w takes keys w, w + 16, ..., lanes split the dot
 * product (element i on lane i % 32, in order) and the xor butterfly adds them. The max is
 * exact in any order; the denominator is a double sum in a fixed tree; each output element
 * is one thread's in-order fmaf chain over the keys. */
__global__ void __launch_bounds__(V4A_THREADS) v4_attn_kernel(const di_v4_attn_params p) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ float v4a_s[]; /* [max_keys] scores, then weights */
    __shared__ double red[V4A_THREADS];
    __shared__ float redf[V4A_THREADS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads, d = p.dim;
    const int64_t nk = p.n_keys[t];
    const float *const *keys = p.keys + t * p.max_keys;
    const float *q = p.q + t * p.q_tstride + h * d;
    float *o = p.out + t * p.out_tstride + h * d;
    const float sink = p.sinks[h];

    for (int64_t k = warp; k < nk; k += V4A_WARPS) {
        const float *kr = keys[k];
        float dot = 0.0f;
        for (int64_t i = lane; i < d; i += 32)
            dot = fmaf(q[i], kr[i], dot);
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (lane == 0) v4a_s[k] = __fmul_rn(dot, p.scale);
    }
    __syncthreads();
    float mx = sink;
    for (int64_t k = tid; k < nk; k += V4A_THREADS)
        mx = fmaxf(mx, v4a_s[k]);
    redf[tid] = mx;
    __syncthreads();
    for (int s = V4A_THREADS / 2; s >= 1; s >>= 1) {
        if (tid < s) redf[tid] = fmaxf(redf[tid], redf[tid + s]);
        __syncthreads();
    }
    mx = redf[0];
    double part = 0.0;
    for (int64_t k = tid; k < nk; k += V4A_THREADS) {
        const float e = (float)exp((double)(v4a_s[k] - mx));
        v4a_s[k] = e;
        part += (double)e;
    }
    const double den = exp((double)(sink - mx)) + block_sum_fixed<V4A_THREADS>(part, red);
    for (int64_t k = tid; k < nk; k += V4A_THREADS)
        v4a_s[k] = (float)((double)v4a_s[k] / den);
    __syncthreads();
    for (int64_t i = tid; i < d; i += V4A_THREADS) {
        float acc = 0.0f;
        for (int64_t k = 0; k < nk; k++)
            acc = fmaf(v4a_s[k], keys[k][i], acc);
        o[i] = acc;
    }
}

cudaError_t di_cuda_launch_v4_attention(const di_v4_attn_params *p, cudaStream_t stream) {
    if (p->n_tokens <= 0 || p->n_heads <= 0 || p->dim <= 0) return cudaSuccess;
    const size_t smem = (size_t)(p->max_keys > 0 ? p->max_keys : 1) * sizeof(float);
    if (smem > DI_CUDA_V4_ATTN_MAX_KEYS * sizeof(float)) return cudaErrorNotSupported;
    return di_cuda_launch(v4_attn_kernel, dim3((unsigned)(p->n_tokens * p->n_heads)),
                          dim3(V4A_THREADS), smem, stream, *p);
}

/* ---------------------------------------------------------------------------------------- */
/* Compressor pooling, indexer scores, SwiGLU                                                 */
/* ---------------------------------------------------------------------------------------- */

/* One thread per channel: max, then double sums over the slots in order (the CPU's). */
__global__ void v4_pool_kernel(const di_v4_pool_params p) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= p.width) return;
    float mx = -INFINITY;
    for (int64_t i = 0; i < p.n_slots; i++)
        mx = fmaxf(mx, p.z[i][c]);
    double den = 0.0, num = 0.0;
    for (int64_t i = 0; i < p.n_slots; i++) {
        const double w = exp((double)(p.z[i][c] - mx));
        den += w;
        num += w * (double)p.c[i][c];
    }
    p.out[c] = (float)(num / den);
}

cudaError_t di_cuda_launch_v4_pool(const di_v4_pool_params *p, cudaStream_t stream) {
    if (p->width <= 0) return cudaSuccess;
    return di_cuda_launch(v4_pool_kernel, dim3(grid_1d(p->width, 256)), dim3(256), 0, stream, *p);
}

#define IDX_THREADS 128
#define IDX_WARPS   (IDX_THREADS / 32)

/* Block (t, y): token t's queries and head weights in shared memory; warp w of block y
 * takes entries (y * IDX_WARPS + w) + k * gridDim.y * IDX_WARPS. An entry is one warp's:
 * per head (in order) a lane-split dot product and the xor butterfly, then the ReLU'd,
 * weighted term added in double. The grid only decides which warp computes an entry. */
__global__ void __launch_bounds__(IDX_THREADS) v4_index_kernel(const di_v4_index_params p) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ float idx_s[]; /* [n_heads][dim] q, [n_heads] weights */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t t = blockIdx.x, nh = p.n_heads, d = p.dim;
    float *q = idx_s, *wt = idx_s + nh * d;
    for (int64_t i = tid; i < nh * d; i += IDX_THREADS)
        q[i] = p.q[t * nh * d + i];
    for (int64_t i = tid; i < nh; i += IDX_THREADS)
        wt[i] = p.weights[t * nh + i];
    __syncthreads();
    const int64_t nv = p.n_visible[t];
    for (int64_t w = (int64_t)blockIdx.y * IDX_WARPS + warp; w < nv;
         w += (int64_t)gridDim.y * IDX_WARPS) {
        const float *k = p.keys + w * d;
        double s = 0.0;
        for (int64_t h = 0; h < nh; h++) {
            float dot = 0.0f;
            for (int64_t i = lane; i < d; i += 32)
                dot = fmaf(q[h * d + i], k[i], dot);
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1)
                dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (dot > 0) s += (double)wt[h] * (double)dot; /* ReLU per head */
        }
        if (lane == 0) p.out[t * p.out_stride + w] = (float)(s * (double)p.scale);
    }
}

cudaError_t di_cuda_launch_v4_index_scores(const di_v4_index_params *p, int n_sms,
                                           cudaStream_t stream) {
    if (p->n_tokens <= 0) return cudaSuccess;
    const size_t smem = (size_t)(p->n_heads * p->dim + p->n_heads) * sizeof(float);
    if (smem > DI_CUDA_V4_SMEM_MAX) return cudaErrorNotSupported;
    /* The entry counts live on the device: enough blocks per token to fill the machine,
     * each walking its share of the entries. */
    int64_t gy = 4 * (int64_t)n_sms / p->n_tokens;
    gy = gy < 1 ? 1 : gy > 65535 ? 65535 : gy;
    dim3 grid((unsigned)p->n_tokens, (unsigned)gy);
    return di_cuda_launch(v4_index_kernel, grid, dim3(IDX_THREADS), smem, stream, *p);
}

/* out = silu(min(g, L)) * clamp(u, -L, L), the silu in double as on the CPU. */
__global__ void v4_swiglu_kernel(const float *gate, const float *up, int64_t n, float limit,
                                 float *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gate[i], u = up[i];
    if (limit > 0) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    out[i] = __fmul_rn((float)((double)g / (1.0 + exp(-(double)g))), u);
}

cudaError_t di_cuda_launch_v4_swiglu(const float *gate, const float *up, int64_t n, float limit,
                                     float *out, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    return di_cuda_launch(v4_swiglu_kernel, dim3(grid_1d(n, 256)), dim3(256), 0, stream, gate, up,
                          n, limit, out);
}

cudaError_t di_cuda_v4_setup(void) {
    cudaError_t err =
        cudaFuncSetAttribute(v4_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)(DI_CUDA_V4_ATTN_MAX_KEYS * sizeof(float)));
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(v4_index_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)DI_CUDA_V4_SMEM_MAX);
    return err;
}
