/*
 * cuda_mma.cu -- y = W x on the tensor cores for batched decode (opt-in: DI_CUDA_MMA=1).
 *
 * The default GEMV (cuda_matmul.cu) is exact against the CPU (fp32 FMA chains) and
 * batch-invariant, but at 8..64 rows per weight it is bound by fp32 FMA and L1 traffic. This
 * path rounds the activations to bf16 and multiplies BF16 weights with mma (wmma 16x16x16,
 * fp32 accumulation, K walked in order): numerics differ from the CPU (activations in bf16,
 * as transformers runs the model), and since the backend takes it only from
 * DI_CUDA_MMA_MIN_N rows up (default 8), a row's bits depend on the batch it is in -- the
 * option is neither exact nor batch-invariant, which is why it is off by default.
 *
 * Shape: a warp computes 16 weight rows x up to 64 tokens (4 accumulator tiles), each A
 * fragment (16 rows x 16 columns of W) loaded once for those tokens; blocks of 4 warps;
 * grid y = token chunks of 64 (grouped mode: one, the block walks its expert's chunks);
 * grid z = an active-expert slot in grouped mode (as the GEMV's). Only BF16 weights with
 * rows and cols multiples of 16 (every V2-Lite / V3 projection); others take the GEMV.
 */
#include "backend/cuda/cuda_internal.cuh"

#include <cuda_bf16.h>
#include <mma.h>

using namespace nvcuda;

#define MMA_WARPS 4
#define MMA_NT    4 /* 16-token tiles per warp */

/* xb[t][c] = bf16(x[t][c]) for t < n (or < *n_dev, the grouped row count in device memory),
 * 0 up to npad rows. */
__global__ void mma_to_bf16_kernel(const float *x, int64_t x_tstride, int64_t n,
                                   const int32_t *n_dev, int64_t npad, int64_t cols,
                                   __nv_bfloat16 *xb) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= npad * cols) return;
    if (n_dev) n = min(n, (int64_t)*n_dev);
    const int64_t t = i / cols, c = i % cols;
    xb[i] = t < n ? __float2bfloat16_rn(x[t * x_tstride + c]) : __float2bfloat16_rn(0.0f);
}

__global__ void __launch_bounds__(MMA_WARPS * 32)
    mma_kernel(const di_cuda_mm_params p, const __nv_bfloat16 *xb) {
    __shared__ float stage[MMA_WARPS][16 * 16];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * MMA_WARPS + warp) * 16;
    const void *wdata = p.data;
    int64_t t0 = (int64_t)blockIdx.y * 16 * MMA_NT, t_end = p.n_tokens;
    int64_t t_step = (int64_t)16 * MMA_NT * gridDim.y;
    if (p.experts) {
        if (blockIdx.z >= (unsigned)p.g_active[0]) return;
        const int e = p.g_active[1 + blockIdx.z];
        wdata = p.experts[e].data;
        t0 += p.g_off[e];
        t_end = p.g_off[e + 1];
        t_step = 16 * MMA_NT;
    }
    if (r0 >= p.rows) return; /* per warp: no block-wide barrier below */
    const __nv_bfloat16 *W = static_cast<const __nv_bfloat16 *>(wdata) + r0 * p.row_stride;
    const int64_t K = p.cols;
    for (; t0 < t_end; t0 += t_step) {
        const int ntile = (int)min((int64_t)MMA_NT, (t_end - t0 + 15) / 16);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MMA_NT];
#pragma unroll
        for (int j = 0; j < MMA_NT; j++)
            wmma::fill_fragment(acc[j], 0.0f);
        for (int64_t k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::load_matrix_sync(a, W + k, (unsigned)p.row_stride);
#pragma unroll
            for (int j = 0; j < MMA_NT; j++) {
                if (j >= ntile) break;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(b, xb + (t0 + 16 * j) * K + k, (unsigned)K);
                wmma::mma_sync(acc[j], a, b, acc[j]);
            }
        }
        for (int j = 0; j < ntile; j++) {
            /* (row r, token t) at stage[t * 16 + r]; rows of tokens past t_end are dropped */
            wmma::store_matrix_sync(stage[warp], acc[j], 16, wmma::mem_col_major);
            __syncwarp();
            for (int i = lane; i < 256; i += 32) {
                const int64_t tok = t0 + 16 * j + i / 16;
                if (tok < t_end) p.y[tok * p.y_tstride + r0 + i % 16] = stage[warp][i];
            }
            __syncwarp();
        }
    }
}

bool di_cuda_mma_fits(const di_cuda_mm_params *p) {
    return p->dtype == DI_DTYPE_BF16 && !p->transposed && (p->n_heads == 1 || p->experts) &&
           p->rows % 16 == 0 && p->cols % 16 == 0 && p->row_stride % 8 == 0 &&
           ((uintptr_t)p->data & 15u) == 0;
}

cudaError_t di_cuda_launch_matmul_mma(const di_cuda_mm_params *p, void *scratch,
                                      int64_t scratch_elems, int64_t x_rows,
                                      const int32_t *x_rows_dev) {
    /* x rows to convert: all rows the kernel may read (grouped: every grouped row), plus a
     * 64-row zero tail so that a tile past the end reads defined values. */
    const int64_t npad = x_rows + 16 * MMA_NT;
    if (npad * p->cols > scratch_elems) return cudaErrorMemoryAllocation;
    __nv_bfloat16 *xb = static_cast<__nv_bfloat16 *>(scratch);
    const int64_t total = npad * p->cols;
    mma_to_bf16_kernel<<<(unsigned)((total + 255) / 256), 256, 0, p->stream>>>(
        p->x, p->x_tstride, x_rows, x_rows_dev, npad, p->cols, xb);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t rows_per_block = 16 * MMA_WARPS;
    dim3 grid((unsigned)((p->rows + rows_per_block - 1) / rows_per_block),
              p->experts ? 1u : (unsigned)((p->n_tokens + 16 * MMA_NT - 1) / (16 * MMA_NT)),
              p->experts ? (unsigned)p->n_heads : 1u);
    mma_kernel<<<grid, MMA_WARPS * 32, 0, p->stream>>>(*p, xb);
    return cudaGetLastError();
}
