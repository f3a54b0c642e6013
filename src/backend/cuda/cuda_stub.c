/*
 * cuda_stub.c -- the CUDA backend's entry points in a build without CUDA (no nvcc found at
 * configure time): each one fails with DI_ERR_UNSUPPORTED, so callers and tests need no
 * #ifdef. In a CUDA build (DI_HAVE_CUDA) this file compiles to nothing and the real
 * definitions come from the .cu files beside it.
 */
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"

#ifndef DI_HAVE_CUDA

static di_status no_cuda(void) {
    return di_error(DI_ERR_UNSUPPORTED, "cuda backend: no CUDA device (built without CUDA)");
}

di_status di_backend_cuda_init(di_backend *be, int device, int64_t max_ctx) {
    (void)be, (void)device, (void)max_ctx;
    return no_cuda();
}

di_status di_cuda_weight_upload(const di_backend *be, const di_weight *w, di_weight *out) {
    (void)be, (void)w, (void)out;
    return no_cuda();
}

void di_cuda_weight_free(const di_backend *be, di_weight *w) {
    (void)be, (void)w;
}

void *di_cuda_malloc(const di_backend *be, size_t bytes) {
    (void)be, (void)bytes;
    no_cuda();
    return NULL;
}

void di_cuda_free(const di_backend *be, void *p) {
    (void)be, (void)p;
}

di_status di_cuda_upload(const di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
    return no_cuda();
}

di_status di_cuda_download(const di_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
    return no_cuda();
}

di_status di_backend_cuda_sync(const di_backend *be) {
    (void)be;
    return no_cuda();
}

void *di_backend_cuda_stream(const di_backend *be) {
    (void)be;
    return NULL;
}

int64_t di_backend_cuda_sample_launches(void) {
    return 0;
}

int64_t di_backend_cuda_sample_cluster_launches(void) {
    return 0;
}

int64_t di_backend_cuda_side_forks(void) {
    return 0;
}

int64_t di_backend_cuda_fences(void) {
    return 0;
}

int64_t di_backend_cuda_lean_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_fp8_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_head_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_runs_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_stream_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_stream16_passes(void) {
    return 0;
}

int64_t di_backend_cuda_tc_early_launches(void) {
    return 0;
}

int64_t di_backend_cuda_moe_combine_norm_launches(void) {
    return 0;
}

int64_t di_backend_cuda_tc_stream_plain_launches(void) {
    return 0;
}

int64_t di_backend_cuda_xs_launches(void) {
    return 0;
}

int64_t di_backend_cuda_wide_launches(bool grouped) {
    (void)grouped;
    return 0;
}

int64_t di_backend_cuda_wgmma_launches(void) {
    return 0;
}

int64_t di_cuda_device_free_bytes(int device) {
    (void)device;
    return -1;
}

void di_backend_cuda_set_batch_invariant(const di_backend *be, bool on) {
    (void)be, (void)on;
}

void di_backend_cuda_set_attn_mode(const di_backend *be, di_cuda_attn_mode mode) {
    (void)be, (void)mode;
}

void di_backend_cuda_set_attn_heads(const di_backend *be, int heads_per_block) {
    (void)be, (void)heads_per_block;
}

double di_cuda_measure_read_lines(const di_backend *be, int piece, size_t bytes) {
    (void)be, (void)piece, (void)bytes;
    return 0.0;
}

double di_cuda_measure_copy_bandwidth(const di_backend *be, size_t bytes) {
    (void)be, (void)bytes;
    return 0.0;
}

di_status di_cuda_list_devices(di_device_info *out, int32_t cap, int32_t *n) {
    (void)out, (void)cap;
    *n = 0;
    return no_cuda();
}

const char *di_backend_cuda_device_name(const di_backend *be) {
    (void)be;
    return "";
}

#else
typedef int di_cuda_stub_unused; /* ISO C wants at least one declaration per file */
#endif
