/*
 * cuda_sample.cu -- seeded sampling on the device (backend.h's sample_rows): for each row the
 * token the host sampler (src/sample) would choose with temperature only (no top_k, top_p,
 * min_p, logit processor or logprobs), bit for bit, and the greedy token for temperature 0.
 *
 * One block per row. The block finds the row's maximum and its first index (and whether a
 * NaN or +inf is present: di_cuda_block_row_max, as argmax_rows), then its threads compute the
 * weights' block sums (one block of DI_SAMPLE_BLOCK ids per thread at a time, in the host's lane
 * order), and thread 0 adds them in order, draws u from Philox and walks the blocks
 * (sample_full_row.h: the host's arithmetic, each operation rounded once). A row the host sampler
 * would reject (NaN, +inf, every logit -inf) gives -1, so that the caller hands that row to the
 * host sampler, which reports it.
 */
#include "backend/cuda/cuda_internal.cuh"
#include "sample/sample_full_row.h"
#include "sample/sampler.h"

#include <float.h>
#include <math.h>

#define SR_THREADS 256

int64_t di_cuda_sample_launches; /* cuda_backend.h: draws launched (for tests) */

__global__ void __launch_bounds__(SR_THREADS)
    sample_rows_kernel(const float *x, int64_t V, const di_sample_row *rows, int32_t *out) {
    pdl_wait(); /* programmatic dependent launch: cuda_internal.cuh */
    pdl_trigger();
    extern __shared__ double bsum[]; /* [ceil(V / DI_SAMPLE_BLOCK)] */
    const float *row = x + (int64_t)blockIdx.x * V;
    const int tid = threadIdx.x;
    const di_cuda_row_max m = di_cuda_block_row_max<SR_THREADS>(row, V);
    const di_sample_row r = rows[blockIdx.x];
    if (m.bad || m.first < 0 || r.temperature < DI_SAMPLING_GREEDY_EPS) { /* block-uniform */
        if (tid == 0) out[blockIdx.x] = m.bad || m.first < 0 ? -1 : (int32_t)m.first;
        return;
    }
    const float bv = m.max;

    /* The weights' block sums, then the draw (thread 0). */
    const float inv_t = __fdiv_rn(1.0f, r.temperature);
    const int64_t nb = (V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
    for (int64_t b = tid; b < nb; b += SR_THREADS) {
        const int64_t b0 = b * DI_SAMPLE_BLOCK;
        bsum[b] = ds_block_sum(row, b0, min(b0 + DI_SAMPLE_BLOCK, V), bv, inv_t, -FLT_MAX);
    }
    __syncthreads();
    if (tid != 0) return;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++)
        total = __dadd_rn(total, bsum[b]);
    const double u = ds_philox_uniform(r.seed, r.sample_index, r.position, 0);
    out[blockIdx.x] = ds_draw_full_row(row, V, bv, inv_t, -FLT_MAX, bsum, __dmul_rn(u, total));
}

cudaError_t di_cuda_launch_sample_rows(const float *x, int64_t n, int64_t V,
                                       const di_sample_row *rows, int32_t *out,
                                       cudaStream_t stream) {
    if (n <= 0 || V <= 0) return cudaSuccess;
    const size_t smem = (size_t)((V + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK) * sizeof(double);
    /* 48 KiB of shared memory without opting in, less the kernel's own ~100 bytes:
     * vocabularies up to about 1.5 M ids; larger ones give -1 (the host sampler's rows) */
    if (smem > 48 * 1024 - 256) return cudaMemsetAsync(out, 0xff, (size_t)n * sizeof *out, stream);
    di_cuda_sample_launches++;
    return di_cuda_launch(sample_rows_kernel, (unsigned)n, SR_THREADS, smem, stream, x, V, rows,
                          out);
}
