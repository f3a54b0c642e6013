/*
 * cuda_probe.cu -- a read-bandwidth probe for the benchmarks (bench_cuda_matmul `lines`):
 * how fast the device streams weight rows when each load instruction of a warp covers
 * `piece` bytes of each of 2048 / piece rows.
 *
 * Why: the tensor-core kernels load a chunk of 32 BF16 columns -- 64 bytes -- of 8 rows per
 * warp instruction. On the H200 that pattern read the V2-Lite experts' 738 MB of rows at 3.16
 * TB/s, whole 128-byte lines at 4.6 (NOTES.md, seventeenth round), which is why the streaming
 * expert kernel copies two chunks of a row at a time. The probe keeps that measurement
 * reproducible: warps of 8 per block, each reading a tile of 32 rows x 512 bytes of 4 KiB rows
 * (a V2-Lite expert row) in steps of all 32 rows x `piece` bytes, 16 bytes per lane, two
 * steps in flight; nothing but the loads and an XOR to keep them.
 */
#include "backend/cuda/cuda_internal.cuh"

#define PROBE_ROW_U4  256 /* 4 KiB rows */
#define PROBE_TILE_U4 32  /* a warp's 512 bytes of each of its 32 rows */
#define PROBE_TILES_K (PROBE_ROW_U4 / PROBE_TILE_U4)

template <int PIECE>
__global__ void __launch_bounds__(256) probe_kernel(const uint4 *__restrict__ w, uint32_t *out) {
    constexpr int LPR = PIECE / 16, RPI = 32 / LPR, NI = 32 / RPI; /* lanes per row, rows */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t tile = (int64_t)blockIdx.x * 8 + warp;
    const int64_t rt = tile / PROBE_TILES_K, kt = tile % PROBE_TILES_K;
    const uint4 *base = w + rt * 32 * PROBE_ROW_U4 + kt * PROBE_TILE_U4;
    uint32_t acc = 0;
#pragma unroll 2
    for (int off = 0; off < PROBE_TILE_U4; off += LPR) { /* a step: every row, PIECE bytes */
        uint4 v[NI];
#pragma unroll
        for (int i = 0; i < NI; i++)
            v[i] = __ldcs(base + (int64_t)(i * RPI + lane / LPR) * PROBE_ROW_U4 + off + lane % LPR);
#pragma unroll
        for (int i = 0; i < NI; i++)
            acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
    }
    if (acc == 0x12345678u) out[0] = acc; /* never, in practice: keeps the loads */
}

/* One probe launch over the buffer (di_cuda_time_runs). */
struct probe_runs {
    void (*kernel)(const uint4 *, uint32_t *);
    unsigned blocks;
    const uint4 *w;
    uint32_t *out;
};

static void probe_run(void *ctx, cudaStream_t s, int i) {
    (void)i;
    const probe_runs *r = (const probe_runs *)ctx;
    r->kernel<<<r->blocks, 256, 0, s>>>(r->w, r->out);
}

extern "C" double di_cuda_measure_read_lines(const di_backend *be, int piece, size_t bytes) {
    (void)be; /* the probe runs on the current device's default stream */
    void (*k)(const uint4 *, uint32_t *) = piece == 64    ? probe_kernel<64>
                                           : piece == 128 ? probe_kernel<128>
                                           : piece == 256 ? probe_kernel<256>
                                           : piece == 512 ? probe_kernel<512>
                                                          : nullptr;
    const int64_t rows = (int64_t)(bytes / (PROBE_ROW_U4 * 16)) / 32 * 32;
    if (!k || rows <= 0) return 0.0;
    const unsigned blocks = (unsigned)(rows / 32 * PROBE_TILES_K / 8);
    const size_t used = (size_t)rows * PROBE_ROW_U4 * 16;
    uint4 *w = NULL;
    uint32_t *out = NULL;
    double bw = 0.0;
    if (cudaMalloc((void **)&w, used) == cudaSuccess &&
        cudaMalloc((void **)&out, 4) == cudaSuccess && cudaMemset(w, 1, used) == cudaSuccess) {
        const int reps = 10;
        probe_runs r = {k, blocks, w, out};
        const float ms = di_cuda_time_runs(0, reps, probe_run, &r);
        if (ms > 0.0f) bw = (double)used * reps / (ms * 1e-3);
    }
    cudaFree(w);
    cudaFree(out);
    cudaGetLastError();
    return bw;
}
