/*
 * cuda_backend.h -- C-callable helpers of the CUDA backend (no CUDA types appear here, so
 * plain C code such as the model loader, the tests and the benchmarks can include it).
 *
 * The backend itself is created with di_backend_cuda_init() (backend.h) and then used
 * through the op table like any other backend. What the op table cannot express lives here:
 *   - weights: di_cuda_weight_upload() copies a host di_weight (any view, any dtype) to
 *     device memory once and returns a di_weight whose data/scale pointers are device
 *     pointers; the ops accept only such device-side weights;
 *   - activations: every float* / int32_t* an op receives is a device pointer; these helpers
 *     allocate, fill and read them;
 *   - pointer lists (DeepSeek-V4): v4_attention's `keys` and v4_pool's `c` / `z` are
 *     device arrays of device row pointers (the caller builds the list on the device or
 *     uploads a host-built one); v4_attention ignores `scratch` (its scores live in shared
 *     memory, at most DI_CUDA_V4_ATTN_MAX_KEYS = 32768 keys per query); n_keys, n_visible and
 *     sinks are device arrays too;
 *   - the streams: every op is enqueued on the backend's main stream, in call order, except
 *     those between side_begin and side_end (backend.h), which go to its second stream;
 *     di_backend_cuda_sync() waits for both and reports the first error any op hit (ops
 *     cannot return errors, so a failed launch is remembered until the next sync).
 *
 * Without a CUDA build (no nvcc at configure time) every function here exists and fails
 * with DI_ERR_UNSUPPORTED ("built without CUDA"), see cuda_stub.c.
 */
#ifndef DI_CUDA_BACKEND_H
#define DI_CUDA_BACKEND_H

#include "backend/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Copies w (host memory; a row view is fine) to the backend's device. The copy is compact
 * except that each row is padded to a multiple of 16 bytes, so the matmul kernels can use
 * 16-byte loads on every row; FP8 scales are copied for the covered block rows only and
 * row_offset is rebased accordingly; FP4 (F4_E2M1) weights bring their E8M0 scale bytes
 * ([rows][scale_cols], out->scale_e8m0) and need an even row_stride. out->data / scale /
 * scale_e8m0 are device pointers owned by the caller (free with di_cuda_weight_free).
 * Synchronous (load time only). */
di_status di_cuda_weight_upload(const di_backend *be, const di_weight *w, di_weight *out);
void di_cuda_weight_free(const di_backend *be, di_weight *w);

/* Device memory for activations and caches (cudaMalloc; NULL on failure, with
 * di_last_error set). */
void *di_cuda_malloc(const di_backend *be, size_t bytes);
void di_cuda_free(const di_backend *be, void *p);
/* Synchronous copies through the backend's stream (they wait for the ops before them). */
di_status di_cuda_upload(const di_backend *be, void *dst_dev, const void *src_host, size_t bytes);
di_status di_cuda_download(const di_backend *be, void *dst_host, const void *src_dev, size_t bytes);

/* Waits for every op enqueued so far; returns the first error an op or the device reported
 * since the last sync (and clears it). */
di_status di_backend_cuda_sync(const di_backend *be);

/* Free bytes of device memory now (cudaMemGetInfo on that device), or -1 if it cannot say
 * (no CUDA build, no such device). Makes the device current on the calling thread. */
int64_t di_cuda_device_free_bytes(int device);

/* The backend's cudaStream_t, as an opaque pointer (for interop: CUDA graphs, NCCL). */
void *di_backend_cuda_stream(const di_backend *be);

/* How the attention op schedules its KV chunks: DI_CUDA_ATTN_AUTO (or SPLIT, the same) spreads
 * a query's chunks over blocks, the last one folding them, wherever that gives the query more
 * than one block; SEQUENTIAL always walks the chunks inside one block. Both give bitwise
 * identical results (the tests check it); this is a tuning knob only. */
typedef enum { DI_CUDA_ATTN_AUTO, DI_CUDA_ATTN_SPLIT, DI_CUDA_ATTN_SEQUENTIAL } di_cuda_attn_mode;
void di_backend_cuda_set_attn_mode(const di_backend *be, di_cuda_attn_mode mode);
/* Heads per attention block: 2, 4 or 8, or 0 to choose from the shape (the default;
 * DI_CUDA_ATTN_HEADS sets it at creation). Same bits either way (tested): a tuning knob. */
void di_backend_cuda_set_attn_heads(const di_backend *be, int heads_per_block);

/* Batch invariance (on by default): BF16 products take one path, the tensor cores, for
 * every batch size, so a token's results never depend on the batch. Off (the engine's
 * batch_invariant = false): the SIMT GEMV up to 8 tokens, where it streams the weights
 * faster, and the tensor cores above. No-op on other backends. */
void di_backend_cuda_set_batch_invariant(const di_backend *be, bool on);

/* How many sample_rows draws this process has launched (0 without CUDA): lets a test see
 * that the device path ran. */
int64_t di_backend_cuda_sample_launches(void);
/* ... and how many of them drew their rows with thread-block clusters (calls of a few rows). */
int64_t di_backend_cuda_sample_cluster_launches(void);

/* How many times this process's CUDA backends forked ops onto their second stream
 * (side_begin in backend.h; 0 without CUDA or with DI_CUDA_STREAMS=1): lets a test see that
 * the two-stream path ran. */
int64_t di_backend_cuda_side_forks(void);

/* How many fences this process's CUDA backends have made (backend.h's fence: each a step the
 * engine's device loop enqueued behind another; 0 without CUDA): lets a test see that the
 * loop deferred steps. */
int64_t di_backend_cuda_fences(void);

/* How many products this process has launched on the opt-in one-token-group variants:
 * the swapped-operand GEMV (DI_CUDA_TC_LEAN=1) and the GEMV with its activations split once
 * per block (DI_CUDA_TC_XS); 0 without CUDA. Lets a test see that they ran. */
int64_t di_backend_cuda_lean_launches(void);
int64_t di_backend_cuda_xs_launches(void);
/* ... and FP8 products on the tensor cores (DI_CUDA_TC_FP8=1). */
int64_t di_backend_cuda_tc_fp8_launches(void);
/* ... and products per head (head_matmul) on the tensor cores, all heads in one launch. */
int64_t di_backend_cuda_tc_head_launches(void);
/* ... and grouped products whose warps took several K runs each (DI_CUDA_TC_RUNS_*), on
 * either grouped kernel. */
int64_t di_backend_cuda_tc_runs_launches(void);
/* ... and grouped products on the streaming kernel (the default; DI_CUDA_TC_STREAM=0 off). */
int64_t di_backend_cuda_tc_stream_launches(void);
/* The passes of 16 rows that the streaming kernel's blocks have made (counted on the
 * device; DI_CUDA_TC_STREAM16=0 off), as far as the device has run: a test syncs first. */
int64_t di_backend_cuda_tc_stream16_passes(void);
/* ... and launches of that kernel that requested weights before their PDL wait (a grouped
 * product after another one of the same routing; DI_CUDA_TC_EARLY=0 off). */
int64_t di_backend_cuda_tc_early_launches(void);
/* ... and plain products on that kernel (the lm_head; DI_CUDA_TC_STREAM_PLAIN=1: all). */
int64_t di_backend_cuda_tc_stream_plain_launches(void);

/* How many moe_combine_add_norm calls ran as one kernel (DI_CUDA_COMBINE_NORM_MAX_N). */
int64_t di_backend_cuda_moe_combine_norm_launches(void);

/* How many wide tensor-core products of many tokens this process has launched, grouped
 * (expert) ones or plain ones (0 without CUDA): lets a test see that they ran. */
int64_t di_backend_cuda_wide_launches(bool grouped);
/* ... of them on wgmma (DI_CUDA_TC_WGMMA; an sm_90 device). */
int64_t di_backend_cuda_wgmma_launches(void);

/* Device-to-device copy bandwidth in bytes/s (bytes read + bytes written per second) over a
 * buffer of `bytes`: the roofline the benchmarks compare with. Returns 0 on failure. */
double di_cuda_measure_copy_bandwidth(const di_backend *be, size_t bytes);

/* Read bandwidth in bytes/s of streaming about `bytes` of 4 KiB rows with each warp load
 * instruction covering `piece` (64, 128, 256 or 512) bytes of 2048 / piece rows
 * (cuda_probe.cu); 0 on failure or another piece. */
double di_cuda_measure_read_lines(const di_backend *be, int piece, size_t bytes);

/* di_cuda_devices (deepinfer.h): the devices present, or DI_ERR_UNSUPPORTED. */
di_status di_cuda_list_devices(di_device_info *out, int32_t cap, int32_t *n);

/* Device name, or "" when unknown. */
const char *di_backend_cuda_device_name(const di_backend *be);

#ifdef __cplusplus
}
#endif

#endif /* DI_CUDA_BACKEND_H */
