/*
 * probe_wgmma.cu -- does a Hopper wgmma k16 step give bitwise the sums of mma.sync m16n8k16?
 * (Not a test; built for sm_90a when nvcc is found. Usage: probe_wgmma [trials], exit 0 when
 * every comparison is bitwise equal.)
 *
 * Why: the tensor-core products (src/backend/cuda/cuda_tc_*.cu) are batch-invariant because
 * every kernel adds the same (weight, activation) pairs per mma k16 step, in the same order
 * of steps, from the same accumulator. A prefill on wgmma (far more work per instruction, and
 * B read by the tensor core from shared memory) could keep those bits only if a wgmma k16
 * step rounds as an mma.sync k16 step does. Microsoft's MMA-Sim models both on Hopper as one
 * fused dot-add of the 16 products and the accumulator (NOTES.md, What remains, item 2),
 * which would also make the order of the 16 pairs inside a step irrelevant. This program
 * checks both claims on the device:
 *   1. one warpgroup's wgmma m64n8k16 (A, the weights, from registers in the m16n8k16
 *      fragment layout; B, the activations, from shared memory through a descriptor) against
 *      four warps' mma.sync m16n8k16 on the same operands, chained over several k16 steps from
 *      a random accumulator;
 *   2. the same with the 16 k-slots of every wgmma step permuted (the A registers and the B
 *      columns alike), which a fused dot-add ignores.
 * Operands: random bf16 values over a wide exponent range (so that the 25-bit truncation of
 * small terms shows), accumulators random floats.
 */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M     64 /* wgmma rows: 4 warps x 16 */
#define N     8  /* tokens */
#define K     16 /* one k16 step */
#define STEPS 4  /* chained k16 steps per trial */

/* The operands of one trial: A [STEPS][M][K], B [STEPS][K][N] (bf16 bits), C [M][N], and the
 * k-slot permutation of each step for the wgmma side (perm[s][slot] = the column it takes). */
struct trial {
    uint16_t a[STEPS][M][K], b[STEPS][K][N];
    float c[M][N];
    int perm[STEPS][K];
};

static __device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* One mma.sync m16n8k16 (bf16 -> f32): warp w takes rows 16 w .. 16 w + 15. */
static __device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1,
                                                uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* A shared-memory matrix descriptor without swizzle: start address, the byte offset between
 * core matrices adjacent along K (leading) and along M / N (stride), each >> 4. */
static __device__ __forceinline__ uint64_t smem_desc(const void *p, uint32_t lead,
                                                     uint32_t stride) {
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lead & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((stride & 0x3FFFF) >> 4) << 32;
}

/* Block of 128 threads: out_mma[M][N] by four warps' mma.sync over the steps in column order,
 * out_wgmma[M][N] by the warpgroup's wgmma with the steps' k-slots permuted. */
__global__ void __launch_bounds__(128)
    probe_kernel(const trial *t, float *out_mma, float *out_wgmma) {
    __shared__ __align__(128) uint16_t bs[K * N]; /* one step's B: two 8 x 8 core matrices */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
    const int r0 = 16 * warp + g, r1 = r0 + 8; /* this lane's rows */

    /* mma.sync: the fragments straight from the trial, columns in order */
    float dm[4] = {t->c[r0][2 * tq], t->c[r0][2 * tq + 1], t->c[r1][2 * tq], t->c[r1][2 * tq + 1]};
    for (int s = 0; s < STEPS; s++) {
        const uint16_t(*a)[K] = t->a[s];
        const uint16_t(*b)[N] = t->b[s];
        mma16816(dm, pack2(a[r0][2 * tq], a[r0][2 * tq + 1]),
                 pack2(a[r1][2 * tq], a[r1][2 * tq + 1]),
                 pack2(a[r0][2 * tq + 8], a[r0][2 * tq + 9]),
                 pack2(a[r1][2 * tq + 8], a[r1][2 * tq + 9]), pack2(b[2 * tq][g], b[2 * tq + 1][g]),
                 pack2(b[2 * tq + 8][g], b[2 * tq + 9][g]));
    }
    out_mma[r0 * N + 2 * tq] = dm[0];
    out_mma[r0 * N + 2 * tq + 1] = dm[1];
    out_mma[r1 * N + 2 * tq] = dm[2];
    out_mma[r1 * N + 2 * tq + 1] = dm[3];

    /* wgmma: slot j of step s takes column perm[s][j], in A's registers and B's shared copy */
    float dw[4] = {t->c[r0][2 * tq], t->c[r0][2 * tq + 1], t->c[r1][2 * tq], t->c[r1][2 * tq + 1]};
    for (int s = 0; s < STEPS; s++) {
        const uint16_t(*a)[K] = t->a[s];
        const uint16_t(*b)[N] = t->b[s];
        const int *p = t->perm[s];
        __syncthreads(); /* the previous step's wgmma has read bs (waited below) */
        /* B, K-major without swizzle: core matrix kb (slots 8 kb .. 8 kb + 7) at 128 kb bytes,
         * token n's eight slots 16 bytes at 16 n */
        for (int i = tid; i < K * N; i += 128) {
            const int kb = i / 64, n = (i / 8) % 8, kl = i % 8;
            bs[i] = b[p[8 * kb + kl]][n];
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* stores -> wgmma reads */
        __syncthreads();
        const uint32_t a0 = pack2(a[r0][p[2 * tq]], a[r0][p[2 * tq + 1]]);
        const uint32_t a1 = pack2(a[r1][p[2 * tq]], a[r1][p[2 * tq + 1]]);
        const uint32_t a2 = pack2(a[r0][p[2 * tq + 8]], a[r0][p[2 * tq + 9]]);
        const uint32_t a3 = pack2(a[r1][p[2 * tq + 8]], a[r1][p[2 * tq + 9]]);
        const uint64_t bd = smem_desc(bs, 128, 256);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, %8, 1, 1, 1, 0;"
                     : "+f"(dw[0]), "+f"(dw[1]), "+f"(dw[2]), "+f"(dw[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(bd)
                     : "memory");
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    out_wgmma[r0 * N + 2 * tq] = dw[0];
    out_wgmma[r0 * N + 2 * tq + 1] = dw[1];
    out_wgmma[r1 * N + 2 * tq] = dw[2];
    out_wgmma[r1 * N + 2 * tq + 1] = dw[3];
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}

/* A random bf16 of exponent within +-`spread` of 1 (so that products differ in size), or 0 */
static uint16_t rnd_bf16(int spread) {
    if (rnd() % 16 == 0) return 0;
    const uint32_t sign = rnd() & 1,
                   exp = (uint32_t)(127 - spread + (int)(rnd() % (2 * spread + 1)));
    return (uint16_t)(sign << 15 | exp << 7 | (rnd() & 0x7F));
}

static float bf16_float(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* max |y - exact| / max |exact| over the outputs, exact = C + every step's A B in double: a
 * layout error shows as a large error, a rounding difference as a tiny one */
static double rel_error(const trial *t, const float *y) {
    double worst = 0.0, scale = 0.0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double e = t->c[m][n];
            for (int s = 0; s < STEPS; s++)
                for (int k = 0; k < K; k++)
                    e += (double)bf16_float(t->a[s][m][k]) * (double)bf16_float(t->b[s][k][n]);
            worst = fmax(worst, fabs(y[m * N + n] - e));
            scale = fmax(scale, fabs(e));
        }
    return scale > 0 ? worst / scale : worst;
}

static void make_trial(trial *t, bool permute) {
    for (int s = 0; s < STEPS; s++) {
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++)
                t->a[s][m][k] = rnd_bf16(12);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++)
                t->b[s][k][n] = rnd_bf16(12);
        for (int k = 0; k < K; k++)
            t->perm[s][k] = k;
        if (permute)
            for (int k = K - 1; k > 0; k--) { /* Fisher-Yates */
                const int j = (int)(rnd() % (uint32_t)(k + 1)), x = t->perm[s][k];
                t->perm[s][k] = t->perm[s][j], t->perm[s][j] = x;
            }
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            t->c[m][n] = (float)((int)(rnd() % 2001) - 1000) * 0.37f;
}

int main(int argc, char **argv) {
    const int trials = argc > 1 ? atoi(argv[1]) : 2000;
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        printf("skip: no CUDA device\n");
        return 0;
    }
    if (prop.major != 9) {
        printf("skip: %s is not sm_90 (wgmma)\n", prop.name);
        return 0;
    }
    trial *ht = (trial *)malloc(sizeof(trial)), *dt;
    float *dm, *dw, hm[M * N], hw[M * N];
    if (cudaMalloc(&dt, sizeof(trial)) != cudaSuccess ||
        cudaMalloc(&dm, sizeof hm) != cudaSuccess || cudaMalloc(&dw, sizeof hw) != cudaSuccess) {
        printf("cudaMalloc failed\n");
        return 2;
    }
    int differ[2] = {0, 0}, shown = 0;
    double err_mma = 0.0, err_wgmma = 0.0; /* worst relative errors against the exact sums */
    for (int it = 0; it < 2 * trials; it++) {
        const int permute = it & 1; /* 0: the same slot order, 1: permuted */
        make_trial(ht, permute);
        cudaMemcpy(dt, ht, sizeof(trial), cudaMemcpyHostToDevice);
        probe_kernel<<<1, 128>>>(dt, dm, dw);
        cudaError_t err = cudaDeviceSynchronize();
        if (err != cudaSuccess) {
            printf("kernel: %s\n", cudaGetErrorString(err));
            return 2;
        }
        cudaMemcpy(hm, dm, sizeof hm, cudaMemcpyDeviceToHost);
        cudaMemcpy(hw, dw, sizeof hw, cudaMemcpyDeviceToHost);
        const double em = rel_error(ht, hm), ew = rel_error(ht, hw);
        err_mma = em > err_mma ? em : err_mma;
        err_wgmma = ew > err_wgmma ? ew : err_wgmma;
        if (memcmp(hm, hw, sizeof hm) != 0) {
            differ[permute]++;
            for (int i = 0; i < M * N && shown < 5; i++)
                if (memcmp(&hm[i], &hw[i], 4) != 0) {
                    printf("trial %d (%s) [%d][%d]: mma %a wgmma %a\n", it / 2,
                           permute ? "permuted" : "in order", i / N, i % N, hm[i], hw[i]);
                    shown++;
                }
        }
    }
    printf("%s: %d trials of %d chained k16 steps, %d x %d outputs each\n", prop.name, trials,
           STEPS, M, N);
    printf("  wgmma vs mma.sync, the same slot order: %d of %d trials differ\n", differ[0], trials);
    printf("  wgmma with each step's slots permuted:  %d of %d trials differ\n", differ[1], trials);
    printf("  worst error against the exact sums: mma.sync %.3g, wgmma %.3g (large: a layout "
           "error)\n",
           err_mma, err_wgmma);
    return differ[0] || differ[1] ? 1 : 0;
}
