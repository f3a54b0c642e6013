/*
 * cuda_internal.cuh -- what the CUDA backend's .cu files share: the C headers (with C
 * linkage), the kernels' parameter structs and the launchers.
 *
 * Shape of every op (the FlashMLA habit): the backend's op function (cuda_backend.cu)
 * validates nothing (backend.h: arguments are trusted), fills a plain params struct with
 * sizes, pointers, strides and the stream, and hands it to a launcher here. A launcher
 * picks the kernel variant, launches it and returns the launch status; it never
 * synchronizes.
 */
#ifndef DI_CUDA_INTERNAL_CUH
#define DI_CUDA_INTERNAL_CUH

extern "C" {
#include "backend/backend.h"
#include "core/core.h"
}
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <utility>

/* ---------------------------------------------------------------------------------------- */
/* Launches: programmatic dependent launch                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Programmatic dependent launch (Hopper and later; di_cuda_pdl, on unless DI_CUDA_PDL=0):
 * a kernel launched by di_cuda_launch may start while the previous kernel of the stream is
 * still finishing, so its launch and its blocks' start-up overlap that kernel's tail. Every
 * such kernel calls pdl_wait() before it reads anything an earlier op wrote and before it
 * writes anything (pdl_wait returns once every earlier kernel has finished and its writes
 * are visible), then pdl_trigger() to let the next kernel start. Only reads of weights
 * (never written during a step) may come before the wait: the GEMV requests its first
 * weight vectors there. Without the launch attribute both are no-ops, so a kernel behaves
 * the same either way. No block triggers before its wait (a block may exit without either),
 * so once a kernel's blocks run, every block of the kernel before it has triggered or exited,
 * and if one of them waited, every kernel before that one has finished: a grouped product
 * after another one of the same routing reads the routing before its wait
 * (di_cuda_mm_params.routing_settled). */
extern int di_cuda_pdl;

static __device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ void pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Rotates a rope pair (a, b) by (c, s) into (*oa, *ob), rounded as the reference: the rope
 * op's, the latent store's and the attention's query rotation's arithmetic. */
static __device__ __forceinline__ void di_cuda_rope_pair(float a, float b, float c, float s,
                                                         float *oa, float *ob) {
    *oa = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *ob = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

/* The last block to arrive (the threadFenceReduction pattern): every thread of the block
 * calls it after the writes the last block will read; true, in every thread, in the block
 * that arrives `expected`-th at *counter, which it resets to 0 for the next launch (the
 * counter starts at 0). The split attention's fold, the argmax slices' combine and the MoE
 * routing's grouping use it. */
static __device__ __forceinline__ bool di_cuda_last_to_arrive(int *counter, int expected) {
    __threadfence(); /* this thread's writes, before the block's arrival is counted */
    __syncthreads();
    bool last = false;
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == expected - 1;
        if (last) {
            *counter = 0;    /* for the next launch */
            __threadfence(); /* the others' writes before this block's reads */
        }
    }
    return __syncthreads_or(last); /* (no shared flag: the caller may use all 48 KiB) */
}

/* kernel<<<grid, block, smem, stream>>>(args...) in thread-block clusters of `cluster`
 * blocks (1 x 1 x 1: no clusters), with the programmatic-serialization attribute when
 * di_cuda_pdl is on. */
template <typename... KArgs, typename... Args>
static cudaError_t di_cuda_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                          size_t smem, cudaStream_t stream, dim3 cluster,
                                          Args &&...args) {
    cudaLaunchAttribute attrs[2];
    unsigned n = 0;
    if (di_cuda_pdl) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        attrs[n].id = cudaLaunchAttributeClusterDimension;
        attrs[n].val.clusterDim.x = cluster.x;
        attrs[n].val.clusterDim.y = cluster.y;
        attrs[n++].val.clusterDim.z = cluster.z;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    (void)cudaGetLastError(); /* returned here: not left behind for a later launcher to see */
    return err;
}

template <typename... KArgs, typename... Args>
static cudaError_t di_cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                  cudaStream_t stream, Args &&...args) {
    return di_cuda_launch_cluster(kernel, grid, block, smem, stream, dim3(1, 1, 1),
                                  std::forward<Args>(args)...);
}

/* ---------------------------------------------------------------------------------------- */
/* Matmul family                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* The backend's tuning knobs for products (cuda_backend.cu reads them from the environment
 * once and hands them to every launch). */
#define DI_CUDA_TC_TARGET         1024 /* tune.tc_target's default */
#define DI_CUDA_TC_TARGET_EXPERTS 512  /* tune.tc_target_experts's default */
#define DI_CUDA_TC_XS             32   /* tune.tc_xs's default (KiB) */

typedef struct di_cuda_tuning {
    /* FP8 conversion by bit placement (1) or by the conversion instructions (0), same values
     * either way; rows of at least ksplit_min 16-byte vectors split K over 4 warps (this one
     * changes the summation order, so it must stay fixed for a run: batch invariance needs
     * one order). */
    int fp8_bits;
    int64_t ksplit_min;
    /* FP8 software pipeline (1: the next vectors are requested before the current ones are
     * converted; 0: load, then convert). Same values either way. */
    int fp8_pipe;
    /* One-token products of rows of at most short_vec 16-byte vectors take 4 rows per warp
     * group instead of 2 (more loads in flight per lane, half the blocks). Same values. */
    int64_t short_vec;
    /* Largest token group (1, 2, 4 or 8): fewer tokens per group use fewer registers (more
     * blocks per SM) but read each weight vector more often. Same values. */
    int max_tb;
    /* BF16 weights of a suitable shape (di_cuda_tc_fits; FP8 ones too with tc_fp8) on the
     * tensor cores (cuda_tc_gemv.cu) when tc is set, the activations split into tc_terms (2,
     * the default, or 3) bf16 parts; weights of fewer than tc_min_rows rows keep the SIMT
     * GEMV. */
    int tc, tc_terms;
    int64_t tc_min_rows;
    /* The wide tensor-core product (cuda_tc_wide.cu) for plain products of at least
     * tc_wide_min_n tokens (0: never), and for grouped ones of at least tc_wide_grouped
     * tokens per active expert (0: never). Same values. */
    int64_t tc_wide_min_n, tc_wide_grouped;
    /* At most this many blocks share a grouped wide product's weight tile, each taking every
     * tc_wide_x-th of its expert's token chunks (cuda_tc_wide.cu: tw_grouped_x; 1: one block
     * walks them all). Same values. */
    int64_t tc_wide_x;
    /* The wide kernel's products as wgmma (sm_90a; DI_CUDA_TC_WGMMA, on by default where
     * the device's compute capability is 9.0 and runs the build's sm_90a code) instead of
     * mma.sync. Same values. */
    int tc_wgmma;
    /* Row tiles per warp of tc_kernel's grouped products for a few tokens per expert (1 or
     * 2): fewer, longer-lived blocks. Same values. Those products take the streaming kernel
     * by default (tc_stream), so this applies under DI_CUDA_TC_STREAM=0, to FP8 weights and
     * to activations not in 16-byte aligned rows. */
    int tc_rt;
    /* Grouped BF16 products of at least tc_runs_min_n tokens per active-expert slot (a decode
     * batch; 0: never) give a warp several of a tile's K runs -- W warps per tile, the
     * fewest (a power of two) with W times the weight's 16-row tiles (tc_ks's count) at least
     * tc_runs_target -- and fold their sums in the tree's order (cuda_tc_gemv.cu). Same
     * values: the K order stays tc_ks's. */
    int64_t tc_runs_min_n, tc_runs_target;
    /* Warps of 16 rows a tensor-core product should spread over, which chooses its K runs
     * (cuda_tc.cuh: tc_ks); expert weights tc_target_experts (DI_CUDA_TC_TARGET_EXPERTS by
     * default; 0: tc_target). A different value changes the summation order: fixed for a
     * run, like ksplit_min. */
    int64_t tc_target, tc_target_experts;
    /* The tensor-core GEMV's one-token-group variants split the token chunk's activations
     * into bf16 parts once per block, in shared memory, where the parts fit in tc_xs KiB
     * (DI_CUDA_TC_XS, DI_CUDA_TC_XS KiB by default; 0: each warp loads and splits its own).
     * Same values. */
    int tc_xs;
    /* The one-token-group products on the short-chain kernel (cuda_tc_lean.cu) instead of
     * tc_kernel: DI_CUDA_TC_LEAN=1, opt-in (measured no faster at one token). Same values. */
    int tc_lean;
    /* A decode batch's grouped BF16 products on the kernel that streams each warp's weights
     * through shared memory (cuda_tc_stream.cu; the default, DI_CUDA_TC_STREAM=0: tc_kernel).
     * Same values. */
    int tc_stream;
    /* ... an expert with more than 8 rows in one pass of 16 (R <= 2 K runs per warp) instead
     * of passes of 8: DI_CUDA_TC_STREAM16=0 turns it off. Same values. */
    int tc_stream16;
    /* ... its first weights requested before the PDL wait where the routing is settled
     * (di_cuda_mm_params.routing_settled: a MoE layer's down projection): DI_CUDA_TC_EARLY=0
     * turns it off. Same values. */
    int tc_early;
    /* ... and plain BF16 products of one token group, not GLU, whose weights take at least this
     * many bytes on it too (nothing with DI_CUDA_TC_STREAM=0): by default 256 MiB, the lm_head
     * (faster there; every plain product there made the batch-1 and 8-sequence decode steps
     * about 1 % slower: NOTES.md, twenty-fifth round); DI_CUDA_TC_STREAM_PLAIN_MIB=<n>: from n
     * MiB, DI_CUDA_TC_STREAM_PLAIN=0: none. Their first weights go before the PDL wait unless
     * DI_CUDA_TC_EARLY=0. Same values. */
    int64_t tc_stream_plain_bytes;
    /* ... every plain product of one token group, GLU too: DI_CUDA_TC_STREAM_PLAIN=1. */
    int tc_stream_plain_all;
    /* moe_combine_add_norm as one launch for calls of up to this many tokens (more: the two
     * launches). DI_CUDA_COMBINE_NORM_MAX_N, default 0 (opt-in). Same values. */
    int64_t combine_norm_max_n;
    /* Block-scaled FP8 weights on the tensor-core GEMV too (cuda_tc_gemv.cu: exact bf16
     * values, each 32-column chunk's sum times its block scale), where the scale blocks
     * hold whole chunks: DI_CUDA_TC_FP8=1. Changes the summation order (fixed for a run). */
    int tc_fp8;
} di_cuda_tuning;

/* One product per head h < n_heads, all heads of the same shape, head h's weight starting
 * head_elem_stride elements (and head_row_offset_stride stored rows) after head 0's:
 *   transposed == false:  y(h, t)[r] = sum_c W_h[r][c] x(h, t)[c]
 *   transposed == true:   y(h, t)[c] = sum_r W_h[r][c] x(h, t)[r]
 * x(h, t) = x + h * x_hstride + t * x_tstride (floats), likewise y. A plain matmul is one
 * head with x_tstride = cols, y_tstride = rows. Weight fields as in di_weight. */
typedef struct di_cuda_mm_params {
    di_dtype dtype;
    int64_t rows, cols, row_stride;
    const void *data;
    const float *scale;
    int64_t scale_cols, block_rows, block_cols, row_offset;
    int64_t n_heads, head_elem_stride, head_row_offset_stride;
    bool transposed;
    int64_t n_tokens;
    const float *x;
    int64_t x_hstride, x_tstride;
    float *y;
    int64_t y_hstride, y_tstride;
    di_cuda_tuning tune;
    /* Filled by the launcher (di_cuda_set_scale_step): the FP8 GEMV's units per scale block
     * -- 16-byte vectors (SIMT) or 32-column chunks (tensor cores) -- as a shift (-1: not a
     * power of two) and as a count; di_cuda_scale_col maps a unit to its scale column. */
    int64_t scale_vshift;
    uint32_t scale_vpb;
    cudaStream_t stream;
    /* Grouped mode (matmul_experts), when experts != NULL: blockIdx.z is an active-expert
     * slot z < n_heads (= the most experts that can be active); block z runs expert
     * e = active[1 + z] (exits when z >= active[0]) with weight experts[e] (the fields
     * above give the common shape) over the rows [off[e], off[e + 1]) of x and y (x_tstride
     * and y_tstride apart); n_tokens is the grouped rows in all (n K: n_tokens / n_heads,
     * the mean rows per slot, chooses the kernel variant). */
    const struct di_cuda_expert_ptrs *experts;
    const int32_t *g_off, *g_active;
    /* Grouped mode: NULL, or row g's activations are x + x_rows[g] x_tstride (the routed
     * tokens read in place, with no gather; the streaming and the wide kernels read it:
     * di_cuda_mm_reads_x_rows). */
    const int32_t *x_rows;
    /* Grouped mode: the routing (g_off, g_active, x_rows) is complete whenever a block of this
     * launch runs, not only after its PDL wait. The backend sets it for a grouped product
     * launched after another grouped product of the same routing on the same stream: the
     * first grouped product after the routing waits in every block (tc_expert, not settled)
     * before it lets a later kernel start, and that wait returned only once the routing had
     * finished. The streaming kernel then requests its first weights before its own wait
     * (tune.tc_early). */
    bool routing_settled;
    /* GLU mode (SwiGLU in the epilogue), when glu_data (plain) or glu_experts (grouped) is
     * set: a second weight of the same shape, dtype and scale layout (the up projection; the
     * fields above describe the gate), and y = silu(W x) * (W2 x), rows x n_tokens. */
    const void *glu_data;
    const float *glu_scale;
    const struct di_cuda_expert_ptrs *glu_experts;
    /* y += W x instead of y = W x (matmul_add), each element rounded as axpy(1, W x, y). */
    bool accumulate;
    /* The tensor cores (tune.tc) from n_tokens >= tc_min_n (grouped: from that many rows per
     * active-expert slot): 1 in batch-invariant mode (one path for every n), else 9 (grouped:
     * 2). */
    int64_t tc_min_n;
} di_cuda_mm_params;

/* p->scale_vshift / scale_vpb for `per_block` units (vectors or chunks) per scale block. */
static inline void di_cuda_set_scale_step(di_cuda_mm_params *p, int64_t per_block) {
    p->scale_vpb = (uint32_t)per_block;
    p->scale_vshift = -1;
    if ((per_block & (per_block - 1)) == 0)
        for (p->scale_vshift = 0; ((int64_t)1 << p->scale_vshift) < per_block; p->scale_vshift++) {
        }
}

/* The scale column of unit u (di_cuda_set_scale_step): a shift when the units per block are a
 * power of two (128-column blocks: 8 FP8 vectors, 4 chunks), else a 32-bit division -- never
 * the 64-bit division, a long subroutine on the GPU. */
static __device__ __forceinline__ int64_t di_cuda_scale_col(const di_cuda_mm_params &p, int64_t u) {
    if (p.scale_vshift >= 0) return u >> p.scale_vshift;
    return (int64_t)((uint32_t)u / p.scale_vpb);
}

/* One expert's device weight pointers (a table of them per projection: expert_table). */
typedef struct di_cuda_expert_ptrs {
    const void *data;
    const float *scale;        /* F8_E4M3's block scales, else NULL */
    const uint8_t *scale_e8m0; /* F4_E2M1's E8M0 bytes (weight.h), else NULL */
} di_cuda_expert_ptrs;

/* Tokens per weight, which chooses a product's kernel and variant: n, or for grouped experts
 * the mean rows per active-expert slot (a block walks its expert's rows, so an expert with
 * more rows than the mean takes more passes). */
static inline int64_t di_cuda_rows_per_weight(const di_cuda_mm_params *p) {
    return p->experts ? (p->n_tokens + p->n_heads - 1) / DI_MAX(p->n_heads, 1) : p->n_tokens;
}

/* Is p one product per head (head_matmul over several heads), rather than one weight's or a
 * grouped one (whose n_heads counts active-expert slots)? */
static inline bool di_cuda_per_head(const di_cuda_mm_params *p) {
    return p->n_heads > 1 && !p->experts;
}

cudaError_t di_cuda_launch_matmul(const di_cuda_mm_params *p);
/* Will di_cuda_launch_matmul run p on a kernel that reads p->x_rows (a grouped BF16 product
 * of up to 8 rows per slot on the streaming kernel, or one the wide kernel takes)? Else the
 * caller gathers the rows and clears x_rows (di_cuda_launch_matmul refuses it). */
bool di_cuda_mm_reads_x_rows(const di_cuda_mm_params *p);

/* The batch-invariant tensor-core product (cuda_tc_gemv.cu): does the weight suit it (BF16 with
 * 16-byte aligned data, or with tune.tc_fp8 block-scaled FP8 with 8-byte aligned data and
 * scale blocks of whole 32-column chunks; W x, one head, one per head or grouped, K and the
 * row stride multiples of 8)? */
bool di_cuda_tc_fits(const di_cuda_mm_params *p);
cudaError_t di_cuda_launch_matmul_tc(const di_cuda_mm_params *p);

/* The wide tensor-core product (cuda_tc_wide.cu), which di_cuda_launch_matmul_tc picks for
 * plain products of n >= p->tune.tc_wide_min_n tokens: the same bits as the GEMV. */
bool di_cuda_tc_wide_fits(const di_cuda_mm_params *p);
/* Once per backend: the kernels' shared memory; *usable: whether the device can run their
 * clusters (if not, the backend leaves the wide product off); *wgmma: whether the code the
 * device runs has wgmma (sm_90a code on a Hopper; not PTX compiled for another device). */
cudaError_t di_cuda_tc_wide_setup(bool *usable, bool *wgmma);
/* Once per backend: the GEMV's shared-memory limit for its staged activations. */
cudaError_t di_cuda_tc_gemv_setup(void);
/* The one-token-group GEMV with a short chain per chunk (cuda_tc_lean.cu; p->tune.tc_lean):
 * the same sums as the GEMV's one-token-group variants, for up to 8 tokens per weight whose
 * activations lie in 16-byte aligned rows. */
cudaError_t di_cuda_launch_matmul_tc_lean(const di_cuda_mm_params *p, int ks);
/* A decode batch's grouped BF16 products with each warp's weights streamed through shared
 * memory (cuda_tc_stream.cu; p->tune.tc_stream, the default): the same sums as the GEMV's
 * grouped variants with r K runs per warp (1, 2, 4 or 8), for up to 8 rows per active expert
 * whose activations lie in 16-byte aligned rows and whose weight's bytes take 32-bit offsets
 * (the GEMV's grouped launcher decides); its
 * setup raises the kernels' shared-memory limit, once per backend. */
cudaError_t di_cuda_launch_matmul_tc_stream(const di_cuda_mm_params *p, int ks, int r);
cudaError_t di_cuda_tc_stream_setup(void);
extern int64_t di_cuda_tc_stream_launches;       /* di_backend_cuda_tc_stream_launches */
int64_t di_cuda_tc_stream16_passes(void);        /* di_backend_cuda_tc_stream16_passes */
extern int64_t di_cuda_tc_early_launches;        /* di_backend_cuda_tc_early_launches */
extern int64_t di_cuda_tc_stream_plain_launches; /* di_backend_cuda_tc_stream_plain_launches */
extern int64_t di_cuda_wide_launches[2];         /* di_backend_cuda_wide_launches: plain, grouped */
extern int64_t di_cuda_wgmma_launches;           /* di_backend_cuda_wgmma_launches */
extern int64_t di_cuda_lean_launches;            /* di_backend_cuda_lean_launches */
extern int64_t di_cuda_xs_launches;              /* di_backend_cuda_xs_launches */
extern int64_t di_cuda_tc_fp8_launches;          /* di_backend_cuda_tc_fp8_launches */
extern int64_t di_cuda_tc_head_launches;         /* di_backend_cuda_tc_head_launches */
extern int64_t di_cuda_tc_runs_launches;         /* di_backend_cuda_tc_runs_launches */
cudaError_t di_cuda_launch_matmul_tc_wide(const di_cuda_mm_params *p);

/* For the bandwidth measurements: run(ctx, s, i) enqueues run i on stream s; three warm-up
 * runs (i = 0, 1, 2), then runs i = 0 .. reps - 1 between two events. Returns their
 * milliseconds, or 0 on failure (the error cleared). */
float di_cuda_time_runs(cudaStream_t s, int reps, void (*run)(void *ctx, cudaStream_t s, int i),
                        void *ctx);

/* silu(g) * u, rounded as silu_mul_kernel rounds it (the fused and the separate SwiGLU agree). */
static __device__ __forceinline__ float silu_times(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* An output element: v, or with accumulate y + v rounded as axpy(1, v, y) rounds it. */
static __device__ __forceinline__ void store_y(float *y, float v, bool accumulate) {
    *y = accumulate ? __fadd_rn(*y, v) : v;
}

/* ---------------------------------------------------------------------------------------- */
/* Element-wise and row-wise ops                                                              */
/* ---------------------------------------------------------------------------------------- */

cudaError_t di_cuda_launch_embed(const di_weight *table, const int32_t *ids, int64_t n, float *out,
                                 cudaStream_t stream);
cudaError_t di_cuda_launch_rmsnorm(const float *x, int64_t x_stride, const float *w, int64_t n,
                                   int64_t dim, float eps, float *y, int64_t y_stride,
                                   cudaStream_t stream);
cudaError_t di_cuda_launch_rope(const di_rope_op_params *p, cudaStream_t stream);
cudaError_t di_cuda_launch_silu_mul(const float *gate, const float *up, int64_t n, float *out,
                                    cudaStream_t stream);
cudaError_t di_cuda_launch_axpy(float a, const float *x, int64_t n, float *y, cudaStream_t stream);
cudaError_t di_cuda_launch_copy_rows(float *dst, int64_t dst_stride, const int32_t *dst_rows,
                                     const float *src, int64_t src_stride, const int32_t *src_rows,
                                     int64_t n, int64_t cols, cudaStream_t stream);
/* The MLA latent store (backend.h's mla_store); latents of at most 4096 values. */
cudaError_t di_cuda_launch_mla_store(const di_mla_store_params *p, cudaStream_t stream);
/* moe_combine into out; or with resid set, moe_combine_add: resid += the sum (+ add). */
cudaError_t di_cuda_launch_moe_combine(const float *rows, const int32_t *rows_of, const float *w,
                                       int64_t n, int64_t K, int64_t dim, float *out,
                                       const float *add, float *resid, cudaStream_t stream);
/* moe_combine_add, then the RMSNorm of each resid row (weight norm_w) into y (rows of dim
 * floats): one block per token where n <= max_fused_n, K <= 8 and dim <= 4096, else the two
 * launches; the same bits either way. */
cudaError_t di_cuda_launch_moe_combine_norm(const float *rows, const int32_t *rows_of,
                                            const float *w, int64_t n, int64_t K, int64_t dim,
                                            const float *add, float *resid, const float *norm_w,
                                            float eps, float *y, int64_t max_fused_n,
                                            cudaStream_t stream);
extern int64_t di_cuda_moe_combine_norm_launches; /* fused launches (for tests) */
/* A row's maximum and its first index, as the host sampler's scan finds them, by a block of
 * THREADS threads (every thread gets the result): thread i scans columns i, i + THREADS, ...
 * (16 bytes at a time where the row allows), keeping the largest value and its lowest index;
 * then warps, then the block keep the larger value, the lower index on ties. first is -1 for
 * a row of -inf only; bad is set by a NaN or +inf anywhere. Shared by argmax_rows and
 * sample_rows. */
struct di_cuda_row_max {
    float max;
    int64_t first;
    bool bad;
};

/* Is (v, i) ahead of (bv, bi): larger, or equal with a lower index (bi < 0: none yet). */
static __device__ __forceinline__ bool row_max_ahead(float v, int64_t i, float bv, int64_t bi) {
    return bi < 0 || v > bv || (v == bv && i < bi);
}

template <int THREADS>
static __device__ __forceinline__ di_cuda_row_max di_cuda_block_row_max(const float *row,
                                                                        int64_t V) {
    __shared__ float sv[THREADS / 32];
    __shared__ int64_t si[THREADS / 32];
    __shared__ int sbad;
    float bv = -INFINITY;
    int64_t bi = -1;
    bool bad = false;
    if (threadIdx.x == 0) sbad = 0;
    auto see = [&](float v, int64_t i) {
        bad |= !(v <= FLT_MAX) && v != -INFINITY; /* NaN or +inf */
        if (v != -INFINITY && row_max_ahead(v, i, bv, bi)) bv = v, bi = i;
    };
    int64_t tail = 0;
    if (((uintptr_t)row & 15u) == 0) { /* 16-byte loads, several in flight per thread */
        const float4 *r4 = reinterpret_cast<const float4 *>(row);
        const int64_t n4 = V / 4;
#pragma unroll 4
        for (int64_t i = threadIdx.x; i < n4; i += THREADS) {
            const float4 q = r4[i];
            see(q.x, 4 * i), see(q.y, 4 * i + 1), see(q.z, 4 * i + 2), see(q.w, 4 * i + 3);
        }
        tail = 4 * n4;
    }
#pragma unroll 4
    for (int64_t i = tail + threadIdx.x; i < V; i += THREADS)
        see(row[i], i);
    for (int off = 16; off >= 1; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi >= 0 && row_max_ahead(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    __syncthreads(); /* sbad = 0 is seen before any thread sets it */
    if (bad) sbad = 1;
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
    __syncthreads();
    di_cuda_row_max r = {sv[0], si[0], sbad != 0};
    for (int w = 1; w < THREADS / 32; w++)
        if (si[w] >= 0 && row_max_ahead(sv[w], si[w], r.max, r.first))
            r.max = sv[w], r.first = si[w];
    return r;
}

/* Greedy decoding (backend.h's argmax_rows): out[t] = first index of row t's maximum, or -1
 * for a row with a NaN, +inf or only -inf. Calls of rows of at least DI_CUDA_AM_MIN_V ids
 * take S = min(DI_CUDA_AM_SLICES, DI_CUDA_AM_PARTS / rows) blocks per row where S >= 2, given
 * `part` (DI_CUDA_AM_PARTS slices) and `counters` (DI_CUDA_AM_ROWS ints, zero, left zero);
 * else one block per row. */
#define DI_CUDA_AM_PARTS  512
#define DI_CUDA_AM_SLICES 32
#define DI_CUDA_AM_ROWS   (DI_CUDA_AM_PARTS / 2) /* the most rows with S >= 2: its counters */
#define DI_CUDA_AM_MIN_V  8192
struct di_cuda_am_part {
    float max;
    int64_t first;
    bool bad;
};
cudaError_t di_cuda_launch_argmax(const float *x, int64_t n, int64_t V, int32_t *out,
                                  di_cuda_am_part *part, int *counters, cudaStream_t stream);
/* Seeded sampling: temperature, min_p, top_k, top_p (backend.h's sample_rows; cuda_sample.cu),
 * and the count of its launches (di_backend_cuda_sample_launches; _cluster_launches those
 * drawn by thread-block clusters). `clusters`: the device runs the draw's clusters
 * (di_cuda_sample_setup, once per backend), taken for calls of a few rows (8 blocks a row)
 * and of up to pair_rows rows (2 blocks a row). */
extern int64_t di_cuda_sample_launches, di_cuda_sample_cluster_launches;
bool di_cuda_sample_setup(void);
cudaError_t di_cuda_launch_sample_rows(const float *x, int64_t n, int64_t V,
                                       const di_sample_row *rows, int32_t *out, bool clusters,
                                       int64_t pair_rows, cudaStream_t stream);

/* A step queued behind the running one (cuda_async.cu; backend.h's upload_async ..
 * resolve_ids): pinned staging for each direction, fences, downloads handed over at the
 * fence. *staged false: the transfer was not enqueued (larger than the staging, or too many
 * downloads waiting) and the caller copies synchronously. A fence keeps ops_error (the first
 * error of the ops before it), which its wait returns. di_cuda_async_synced: after a full
 * stream sync, hands every staged download over and returns the first error of a fence
 * nobody waited for. */
struct di_cuda_async;
cudaError_t di_cuda_async_create(di_cuda_async **out);
void di_cuda_async_free(di_cuda_async *a);
cudaError_t di_cuda_async_upload(di_cuda_async *a, cudaStream_t stream, void *dst, const void *src,
                                 size_t bytes, bool *staged);
cudaError_t di_cuda_async_download(di_cuda_async *a, cudaStream_t stream, void *dst,
                                   const void *src, size_t bytes, bool *staged);
int64_t di_cuda_async_fence(di_cuda_async *a, cudaStream_t stream, cudaError_t ops_error);
cudaError_t di_cuda_async_wait(di_cuda_async *a, int64_t ticket);
cudaError_t di_cuda_async_synced(di_cuda_async *a);
cudaError_t di_cuda_launch_resolve_ids(int32_t *ids, int64_t n, const int32_t *prev,
                                       cudaStream_t stream);

/* MoE routing (cuda_moe.cu): selection by di_router_select's rules and the grouping by
 * expert, as backend.h's moe_route describes. At most DI_CUDA_ROUTE_MAX_E experts and
 * DI_CUDA_ROUTE_MAX_ENTRIES (token, slot) entries per call (cudaErrorNotSupported past
 * them; backend.h's DI_BACKEND_ROUTE_ENTRIES, which bounds the V2/V3 runner's device chunks):
 * the grouping block keeps the ids in 32 KiB of shared memory. `arrivals`: one int of device
 * memory, zero between launches (the selection blocks' arrival counter). */
#define DI_CUDA_ROUTE_MAX_E       1024
#define DI_CUDA_ROUTE_MAX_ENTRIES DI_BACKEND_ROUTE_ENTRIES
cudaError_t di_cuda_launch_moe_route(const di_moe_route_params *p, int *arrivals,
                                     cudaStream_t stream);

/* ---------------------------------------------------------------------------------------- */
/* MLA attention                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Keys per chunk: the unit of the split along the KV axis. A fixed constant, so a query's
 * arithmetic depends only on its own key count (batch invariance). */
#define DI_CUDA_ATTN_CHUNK 256
/* Largest latent width and rope width the attention kernel handles. */
#define DI_CUDA_ATTN_MAX_R  512
#define DI_CUDA_ATTN_MAX_DR 128

typedef struct di_cuda_attn_launch {
    di_mla_attn_params p; /* device pointers */
    float *partial;       /* split scratch, [capacity] floats (may be NULL) */
    int64_t partial_floats;
    int *counters;       /* split: arrival counters, [n_counters] ints, zero between launches */
    int64_t n_counters;  /* (a split needs one per (query, head group) block) */
    int heads_per_block; /* 2, 4 or 8; 0: chosen from the shape (a tuning knob, same bits) */
    int split; /* 1: chunks spread over blocks where a query gets more than one, folded by the
                * last; 0: chunks walked in-block */
    int64_t max_keys; /* decode batches (q_pos): an upper bound on every query's key count */
    int n_sms;        /* the device's multiprocessors (how many split blocks pay) */
    cudaStream_t stream;
} di_cuda_attn_launch;

/* Floats of split scratch the call needs. */
int64_t di_cuda_attn_partial_floats(const di_mla_attn_params *p, int64_t max_keys);
/* Raises the kernels' shared-memory limit; once per device, before the first launch. */
cudaError_t di_cuda_attn_setup(void);
cudaError_t di_cuda_launch_mla_attention(const di_cuda_attn_launch *a);

/* ---------------------------------------------------------------------------------------- */
/* DeepSeek-V4 ops (cuda_v4.cu)                                                               */
/* ---------------------------------------------------------------------------------------- */

/* y[t][r] = sum_c x[t][c] W[r][c] for W in F4_E2M1 (two per byte, low nibble = even column)
 * with E8M0 scale bytes scale[r * scale_cols + c / block_cols]. x: [n_tokens][cols],
 * y: [n_tokens][rows]. */
typedef struct di_cuda_fp4_params {
    int64_t rows, cols;
    int64_t row_bytes; /* bytes between consecutive rows */
    const uint8_t *data;
    const uint8_t *scale;
    int64_t scale_cols, block_cols;
    int64_t n_tokens;
    const float *x;
    float *y;
    cudaStream_t stream;
    /* Grouped mode (matmul_experts), when experts != NULL, as di_cuda_mm_params' grouped mode:
     * blockIdx.z is an active-expert slot z < max_active; block z runs expert
     * e = active[1 + z] (exits when z >= active[0]) with data / scale from experts[e] (data /
     * scale_e8m0; the fields above give the common shape, and data is expert 0's, for the
     * launcher's alignment test) over the rows [off[e], off[e + 1]) of x and y; n_tokens is
     * the grouped rows in all (n_tokens / max_active, the mean rows per slot, chooses TB). */
    const struct di_cuda_expert_ptrs *experts;
    const int32_t *g_off, *g_active;
    int64_t max_active;
} di_cuda_fp4_params;

/* Largest key list of v4_attention (its scores live in shared memory) and the shared memory
 * the indexer may use for one token's queries ([n_heads][dim] + [n_heads] floats). */
#define DI_CUDA_V4_ATTN_MAX_KEYS 32768
#define DI_CUDA_V4_SMEM_MAX      (160 * 1024)

/* Raises the V4 kernels' shared-memory limits; once per device, before the first launch. */
cudaError_t di_cuda_v4_setup(void);
cudaError_t di_cuda_launch_matmul_fp4(const di_cuda_fp4_params *p);
/* scratch: backend memory for the mixing rows of the tokens of one launch pair
 * ((2 + n_hc) n_hc floats per token; fewer tokens per pair when it is small). The backend's
 * holds DI_CUDA_HC_MIX_FLOATS (2730 tokens of V4-Flash's 4 streams; 15 at 64 streams). */
#define DI_CUDA_HC_MIX_FLOATS 65536
cudaError_t di_cuda_launch_v4_hc_pre(const di_v4_hc_params *p, float *scratch,
                                     int64_t scratch_floats, cudaStream_t stream);
cudaError_t di_cuda_launch_v4_hc_post(int64_t n_tokens, int64_t n_hc, int64_t dim, const float *x,
                                      const float *y, const float *post, const float *mix,
                                      float *out, cudaStream_t stream);
/* keys: a device array of device row pointers (see cuda_backend.h). Fails with
 * cudaErrorNotSupported past DI_CUDA_V4_ATTN_MAX_KEYS keys. */
cudaError_t di_cuda_launch_v4_attention(const di_v4_attn_params *p, cudaStream_t stream);
cudaError_t di_cuda_launch_v4_pool(const di_v4_pool_params *p, cudaStream_t stream);
cudaError_t di_cuda_launch_v4_index_scores(const di_v4_index_params *p, int n_sms,
                                           cudaStream_t stream);
cudaError_t di_cuda_launch_v4_swiglu(const float *gate, const float *up, int64_t n, float limit,
                                     float *out, cudaStream_t stream);

#endif /* DI_CUDA_INTERNAL_CUH */
