/*
 * device_copies.c -- see device_copies.h.
 */
#include "model/device_copies.h"

static di_status grow(void **arr, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return DI_OK;
    int64_t c = *cap ? 2 * *cap : 256;
    void *p = di_realloc(*arr, (size_t)c * elem);
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "weight upload: out of memory");
    *arr = p;
    *cap = c;
    return DI_OK;
}

di_status di_dev_copy_weight(di_dev_copies *dc, di_weight *w) {
    if (!w->data || w->rows <= 0) return DI_OK;
    di_status st = grow((void **)&dc->w, &dc->cap_w, dc->n_w, sizeof(di_weight));
    if (st) return st;
    di_weight d;
    st = dc->be->ops->weight_upload(dc->be->ctx, w, &d);
    if (st) return st;
    dc->w[dc->n_w++] = d;
    *w = d;
    return DI_OK;
}

di_status di_dev_copy_bytes(di_dev_copies *dc, const void **p, size_t bytes) {
    if (!*p) return DI_OK;
    di_status st = grow((void **)&dc->buf, &dc->cap_buf, dc->n_buf, sizeof(void *));
    if (st) return st;
    void *d = dc->be->ops->buf_alloc(dc->be->ctx, bytes);
    if (!d) return di_error_prefix(DI_ERR_OUT_OF_MEMORY, "weight upload");
    dc->buf[dc->n_buf++] = d;
    st = dc->be->ops->upload(dc->be->ctx, d, *p, bytes);
    if (st) return st;
    *p = d;
    return DI_OK;
}

di_status di_dev_copy_vec(di_dev_copies *dc, const float **v, int64_t n) {
    return di_dev_copy_bytes(dc, (const void **)v, (size_t)n * sizeof(float));
}

di_status di_expert_sets_make(const di_backend *be, di_weight *xw, int64_t E,
                              di_expert_weights *gate, di_expert_weights *up,
                              di_expert_weights *down) {
    di_expert_weights *sets[3] = {gate, up, down};
    for (int k = 0; k < 3; k++) {
        void *tab = NULL;
        di_status st = be->ops->expert_table(be->ctx, xw + k * E, E, &tab);
        if (st) return di_error_prefix(st, "expert table");
        *sets[k] = (di_expert_weights){.w = xw + k * E, .n_experts = E, .table = tab};
    }
    return DI_OK;
}

void di_expert_sets_free(const di_backend *be, di_expert_weights *gate, di_expert_weights *up,
                         di_expert_weights *down) {
    di_expert_weights *sets[3] = {gate, up, down};
    for (int k = 0; k < 3; k++) {
        if (sets[k]->table) be->ops->buf_free(be->ctx, (void *)sets[k]->table);
        *sets[k] = (di_expert_weights){0};
    }
}

void di_dev_copies_free(di_dev_copies *dc) {
    for (int64_t i = 0; i < dc->n_w; i++)
        dc->be->ops->weight_free(dc->be->ctx, &dc->w[i]);
    for (int64_t i = 0; i < dc->n_buf; i++)
        dc->be->ops->buf_free(dc->be->ctx, dc->buf[i]);
    di_free(dc->w);
    di_free(dc->buf);
    dc->w = NULL;
    dc->buf = NULL;
    dc->n_w = dc->n_buf = dc->cap_w = dc->cap_buf = 0;
}
