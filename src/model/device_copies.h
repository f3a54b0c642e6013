/*
 * device_copies.h -- the backend copies of a model's weights (CUDA), made once at load and
 * freed with the model. Both architectures' upload passes (deepseek_v3_device.c,
 * deepseek_v4_device.c) replace host views in place through these two calls, so the forward
 * code is the same for every backend; the list remembers what to release.
 */
#ifndef DI_DEVICE_COPIES_H
#define DI_DEVICE_COPIES_H

#include "backend/backend.h"

typedef struct di_dev_copies {
    const di_backend *be; /* borrowed: the model's memory backend */
    di_weight *w;         /* weight copies (weight_free) */
    int64_t n_w, cap_w;
    void **buf; /* vector copies (buf_free) */
    int64_t n_buf, cap_buf;
} di_dev_copies;

/* Replaces *w by its backend copy (weight_upload); an unbound (absent) weight is left alone. */
di_status di_dev_copy_weight(di_dev_copies *dc, di_weight *w);
/* Replaces the n floats at *v by a backend copy (the host array stays where it was owned);
 * NULL is left alone. */
di_status di_dev_copy_vec(di_dev_copies *dc, const float **v, int64_t n);
/* The same for `bytes` bytes of any type (e.g. an int32 table). */
di_status di_dev_copy_bytes(di_dev_copies *dc, const void **p, size_t bytes);
/* A MoE layer's expert sets for the backend's matmul_experts: xw holds [3][E] weights (gate,
 * up, down; filled by the caller, after the upload), and each set is a view of its E with
 * the backend's table of them (expert_table). sets_free frees the tables and empties them. */
di_status di_expert_sets_make(const di_backend *be, di_weight *xw, int64_t E,
                              di_expert_weights *gate, di_expert_weights *up,
                              di_expert_weights *down);
void di_expert_sets_free(const di_backend *be, di_expert_weights *gate, di_expert_weights *up,
                         di_expert_weights *down);
/* Frees every copy and empties the list (the backend stays set). */
void di_dev_copies_free(di_dev_copies *dc);

#endif /* DI_DEVICE_COPIES_H */
