/*
 * deepseek_v3_device.c -- one backend copy of a DeepSeek-V2/V3 model's weights, made at load
 * when the model's memory backend keeps weights in its own memory (CUDA).
 *
 * Design stance: the binder (deepseek_v3_weights.c) always binds host views; this pass then
 * replaces, in place, every di_weight and norm vector the forward pass reads with a backend
 * copy, so the forward code is the same for every backend. What the forward does not read
 * stays on the host: the MTP modules (bound but not run). The router bias goes up too:
 * routing runs on the backend (moe_route), so a MoE layer needs no host round trip. MLA's
 * per-head views of kv_b_proj are rebuilt over its one device copy, so the head products
 * still see uniformly strided heads (one launch for all heads). ds_model_expert_sets then
 * makes each MoE projection's expert table for matmul_experts.
 */
#include "model/deepseek_v3.h"

#include <string.h>

static di_status grow(void **arr, int64_t *cap, int64_t n, size_t elem) {
    if (n < *cap) return DI_OK;
    int64_t c = *cap ? 2 * *cap : 256;
    void *p = di_realloc(*arr, (size_t)c * elem);
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "weight upload: out of memory");
    *arr = p;
    *cap = c;
    return DI_OK;
}

/* Replaces *w by its backend copy; an unbound (optional, absent) weight is left alone. */
static di_status up_weight(ds_model *m, di_weight *w) {
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

static di_status up_vec(ds_model *m, const float **v, int64_t n) {
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

static di_status up_mlp(ds_model *m, ds_mlp *p) {
    di_status st = up_weight(m, &p->gate);
    if (!st) st = up_weight(m, &p->up);
    if (!st) st = up_weight(m, &p->down);
    return st;
}

static di_status up_layer(ds_model *m, ds_layer *L) {
    const di_hparams *hp = m->hp;
    const int64_t H = hp->hidden_size, nh = hp->num_attention_heads;
    const int64_t dn = hp->qk_nope_head_dim, dv = hp->v_head_dim;
    di_status st = up_vec(m, &L->attn_norm, H);
    if (!st) st = up_vec(m, &L->ffn_norm, H);
    if (!st) st = up_weight(m, &L->q_proj);
    if (!st) st = up_weight(m, &L->q_a_proj);
    if (!st && L->q_a_norm) st = up_vec(m, &L->q_a_norm, hp->q_lora_rank);
    if (!st) st = up_weight(m, &L->q_b_proj);
    if (!st) st = up_weight(m, &L->kv_a_proj);
    if (!st) st = up_vec(m, &L->kv_a_norm, hp->kv_lora_rank);
    if (!st) st = up_weight(m, &L->kv_b_proj);
    if (!st) st = up_weight(m, &L->o_proj);
    if (st) return st;
    /* The host arrays of per-head views are model-owned: overwrite them in place. */
    for (int64_t h = 0; h < nh; h++) {
        L->w_uk[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv), dn);
        L->w_uv[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv) + dn, dv);
    }
    if (!L->is_moe) return up_mlp(m, &L->dense);
    st = up_weight(m, &L->router);
    if (!st) st = up_vec(m, &L->router_bias, hp->n_routed_experts);
    for (int64_t e = 0; !st && e < hp->n_routed_experts; e++)
        st = up_mlp(m, &L->experts[e]);
    if (!st && L->has_shared) st = up_mlp(m, &L->shared);
    return st;
}

di_status ds_model_upload(ds_model *m) {
    if (!m->be->ops->weight_upload) return DI_OK; /* host weights used in place */
    const di_hparams *hp = m->hp;
    const bool tied = m->lm_head.data == m->embed.data;
    di_status st = up_weight(m, &m->embed);
    if (!st) st = up_vec(m, &m->norm, hp->hidden_size);
    if (!st) {
        if (tied)
            m->lm_head = m->embed;
        else
            st = up_weight(m, &m->lm_head);
    }
    for (int64_t il = 0; !st && il < hp->num_hidden_layers; il++)
        st = up_layer(m, &m->layers[il]);
    return st;
}

/* One expert set: the host array of the E weights of a projection and the backend's table. */
static di_status expert_set(ds_model *m, di_weight *xw, di_expert_weights *out) {
    const int64_t E = m->hp->n_routed_experts;
    void *tab = NULL;
    di_status st = m->be->ops->expert_table(m->be->ctx, xw, E, &tab);
    if (st) return di_error_prefix(st, "expert table");
    *out = (di_expert_weights){.w = xw, .n_experts = E, .table = tab};
    return DI_OK;
}

di_status ds_model_expert_sets(ds_model *m) {
    const int64_t E = m->hp->n_routed_experts;
    for (int64_t il = 0; il < m->hp->num_hidden_layers; il++) {
        ds_layer *L = &m->layers[il];
        if (!L->is_moe) continue;
        L->xw = di_calloc((size_t)(3 * E), sizeof(di_weight));
        if (!L->xw) return di_error(DI_ERR_OUT_OF_MEMORY, "expert sets: out of memory");
        for (int64_t e = 0; e < E; e++) {
            L->xw[e] = L->experts[e].gate;
            L->xw[E + e] = L->experts[e].up;
            L->xw[2 * E + e] = L->experts[e].down;
        }
        di_status st = expert_set(m, L->xw, &L->x_gate);
        if (!st) st = expert_set(m, L->xw + E, &L->x_up);
        if (!st) st = expert_set(m, L->xw + 2 * E, &L->x_down);
        if (st) return st;
    }
    return DI_OK;
}

void ds_model_release_device(ds_model *m) {
    for (int64_t il = 0; m->layers && il < m->hp->num_hidden_layers; il++) {
        ds_layer *L = &m->layers[il];
        di_expert_weights *sets[3] = {&L->x_gate, &L->x_up, &L->x_down};
        for (int k = 0; k < 3; k++)
            if (sets[k]->table) m->be->ops->buf_free(m->be->ctx, (void *)sets[k]->table);
        di_free(L->xw);
        L->xw = NULL;
        L->x_gate = L->x_up = L->x_down = (di_expert_weights){0};
    }
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
