/*
 * deepseek_v4_device.c -- one backend copy of a DeepSeek-V4 model's weights, made at load
 * when the model's memory backend keeps weights in its own memory (CUDA).
 *
 * Design stance (as deepseek_v3_device.c): the binder always binds host views; this pass
 * replaces, in place, every di_weight and float vector the forward's ops read with a backend
 * copy, so the forward code is the same for every backend. What only the host reads stays on
 * the host: the router bias and tid2eid (routing runs on the host), and the MTP modules (bound
 * but not run). FP8 weights bring their block scales and FP4 experts their E8M0 bytes
 * (weight_upload copies both). The grouped output projection's views are rebuilt over the
 * one device copy of wo_a, so the head product still sees uniformly strided groups.
 */
#include "model/deepseek_v4.h"

static di_status grow(void **arr, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return DI_OK;
    int64_t c = *cap ? 2 * *cap : 256;
    void *p = di_realloc(*arr, (size_t)c * elem);
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "weight upload: out of memory");
    *arr = p;
    *cap = c;
    return DI_OK;
}

/* Replaces *w by its backend copy; an unbound (absent) weight is left alone. */
static di_status up_weight(v4_model *m, di_weight *w) {
    if (!w->data || w->rows <= 0) return DI_OK;
    di_status st = grow((void **)&m->dev_w, &m->cap_dev_w, m->n_dev_w, sizeof(di_weight));
    if (st) return st;
    di_weight d;
    st = m->be->ops->weight_upload(m->be->ctx, w, &d);
    if (st) return st;
    m->dev_w[m->n_dev_w++] = d;
    *w = d;
    return DI_OK;
}

/* Replaces the n floats at *v by a backend copy (the host array stays model-owned). */
static di_status up_vec(v4_model *m, const float **v, int64_t n) {
    if (!*v) return DI_OK;
    di_status st = grow((void **)&m->dev_buf, &m->cap_dev_buf, m->n_dev_buf, sizeof(void *));
    if (st) return st;
    const size_t bytes = (size_t)n * sizeof(float);
    float *d = m->be->ops->buf_alloc(m->be->ctx, bytes);
    if (!d) return di_error_prefix(DI_ERR_OUT_OF_MEMORY, "weight upload");
    m->dev_buf[m->n_dev_buf++] = d;
    st = m->be->ops->upload(m->be->ctx, d, *v, bytes);
    if (st) return st;
    *v = d;
    return DI_OK;
}

static di_status up_mlp(v4_model *m, v4_mlp *p) {
    di_status st = up_weight(m, &p->w1);
    if (!st) st = up_weight(m, &p->w3);
    if (!st) st = up_weight(m, &p->w2);
    return st;
}

static di_status up_comp(v4_model *m, v4_compressor *c) {
    di_status st = up_weight(m, &c->wkv);
    if (!st) st = up_weight(m, &c->wgate);
    if (!st) st = up_vec(m, &c->ape, c->m * c->cw);
    if (!st) st = up_vec(m, &c->norm, c->width);
    return st;
}

static di_status up_block(v4_model *m, v4_block *L) {
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    const int64_t D = hp->hidden_size, n = v->hc_mult, nm = (2 + n) * n;
    const int64_t g = v->o_groups, r = v->o_lora_rank;
    di_status st = up_vec(m, &L->attn_norm, D);
    if (!st) st = up_vec(m, &L->ffn_norm, D);
    if (!st) st = up_vec(m, &L->hc_attn_fn, nm * n * D);
    if (!st) st = up_vec(m, &L->hc_attn_base, nm);
    if (!st) st = up_vec(m, &L->hc_attn_scale, 3);
    if (!st) st = up_vec(m, &L->hc_ffn_fn, nm * n * D);
    if (!st) st = up_vec(m, &L->hc_ffn_base, nm);
    if (!st) st = up_vec(m, &L->hc_ffn_scale, 3);
    if (!st) st = up_weight(m, &L->wq_a);
    if (!st) st = up_vec(m, &L->q_norm, v->q_lora_rank);
    if (!st) st = up_weight(m, &L->wq_b);
    if (!st) st = up_weight(m, &L->wkv);
    if (!st) st = up_vec(m, &L->kv_norm, v->head_dim);
    if (!st) st = up_weight(m, &L->wo_a);
    if (!st) st = up_weight(m, &L->wo_b);
    if (!st) st = up_vec(m, &L->sinks, hp->num_attention_heads);
    if (st) return st;
    for (int64_t j = 0; j < g; j++) /* the model-owned host array of views, in place */
        L->wo_a_group[j] = di_weight_rows(&L->wo_a, j * r, r);
    if (L->kind != DI_V4_SLIDING) st = up_comp(m, &L->comp);
    if (!st && L->kind == DI_V4_CSA) {
        st = up_comp(m, &L->icomp);
        if (!st) st = up_weight(m, &L->idx_wq_b);
        if (!st) st = up_weight(m, &L->idx_weights);
    }
    if (!st) st = up_weight(m, &L->gate);
    for (int64_t e = 0; !st && e < hp->n_routed_experts; e++)
        st = up_mlp(m, &L->experts[e]);
    if (!st) st = up_mlp(m, &L->shared);
    return st;
}

di_status v4_model_upload(v4_model *m) {
    if (!m->be->ops->weight_upload) return DI_OK; /* host weights used in place */
    const di_hparams *hp = m->hp;
    const int64_t D = hp->hidden_size, n = m->v->hc_mult;
    const bool tied = m->head.data == m->embed.data;
    di_status st = up_weight(m, &m->embed);
    if (!st) {
        if (tied)
            m->head = m->embed;
        else
            st = up_weight(m, &m->head);
    }
    if (!st) st = up_vec(m, &m->norm, D);
    if (!st) st = up_vec(m, &m->hc_head_fn, n * n * D);
    if (!st) st = up_vec(m, &m->hc_head_base, n);
    if (!st) st = up_vec(m, &m->hc_head_scale, 1);
    if (!st) st = up_vec(m, &m->ones, DI_MAX(m->v->head_dim, D));
    for (int64_t il = 0; !st && il < hp->num_hidden_layers; il++)
        st = up_block(m, &m->blocks[il]);
    if (!st) st = m->be->ops->sync(m->be->ctx);
    return st;
}

void v4_model_release_device(v4_model *m) {
    for (int64_t i = 0; i < m->n_dev_w; i++)
        m->be->ops->weight_free(m->be->ctx, &m->dev_w[i]);
    for (int64_t i = 0; i < m->n_dev_buf; i++)
        m->be->ops->buf_free(m->be->ctx, m->dev_buf[i]);
    di_free(m->dev_w);
    di_free(m->dev_buf);
    m->dev_w = NULL;
    m->dev_buf = NULL;
    m->n_dev_w = m->n_dev_buf = m->cap_dev_w = m->cap_dev_buf = 0;
}
