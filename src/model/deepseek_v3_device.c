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
 *
 * One weight is added rather than copied: W_UK transposed (up_uk_t). The absorb
 * q_lat = W_UK_h^T q_nope is then a plain product per head, which the CUDA backend runs on its
 * tensor cores like W_UV, instead of a transposed one on its SIMT units (at 64 sequences 31 us
 * per layer, at a 256-token prefill 200 us, on the H200).
 */
#include "model/deepseek_v3.h"

#include <string.h>

static di_status up_mlp(ds_model *m, ds_mlp *p) {
    di_status st = di_dev_copy_weight(&m->dev, &p->gate);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->up);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->down);
    return st;
}

/* W_UK^T on the backend: head h's [R][dn] (the transpose of its [dn][R] key rows of the host
 * kv_b_proj), heads one after another, and its per-head views in L->w_ukt. BF16 only (an FP8
 * transpose would have to move its scale blocks too): other dtypes keep the transposed
 * product over the views of kv_b_proj, as do backends without prefers_untransposed_heads
 * (e.g. the CPU's separate-memory test backend, whose tokens must stay the plain runner's
 * bits). 2 nh R dn bytes per layer (2 MB for V2-Lite's 16 heads). Called before kv_b_proj
 * itself goes up. */
static di_status up_uk_t(ds_model *m, ds_layer *L) {
    const di_hparams *hp = m->hp;
    const int64_t nh = hp->num_attention_heads, dn = hp->qk_nope_head_dim, dv = hp->v_head_dim;
    const int64_t R = hp->kv_lora_rank;
    const di_weight *kv = &L->kv_b_proj;
    if (!m->be->ops->prefers_untransposed_heads || kv->dtype != DI_DTYPE_BF16 || !kv->data)
        return DI_OK;
    uint16_t *t = di_malloc((size_t)(nh * R * dn) * sizeof(uint16_t));
    L->w_ukt = di_calloc((size_t)nh, sizeof(di_weight));
    if (!t || !L->w_ukt) {
        di_free(t);
        return di_error(DI_ERR_OUT_OF_MEMORY, "W_UK^T copy: out of memory");
    }
    const uint16_t *src = kv->data;
    for (int64_t h = 0; h < nh; h++)
        for (int64_t d = 0; d < dn; d++) {
            const uint16_t *row = src + (h * (dn + dv) + d) * kv->row_stride;
            for (int64_t c = 0; c < R; c++)
                t[(h * R + c) * dn + d] = row[c];
        }
    di_weight w = {.dtype = DI_DTYPE_BF16, .rows = nh * R, .cols = dn, .row_stride = dn, .data = t};
    di_status st = di_dev_copy_weight(&m->dev, &w);
    di_free(t);
    for (int64_t h = 0; !st && h < nh; h++)
        L->w_ukt[h] = di_weight_rows(&w, h * R, R);
    return st;
}

static di_status up_layer(ds_model *m, ds_layer *L) {
    const di_hparams *hp = m->hp;
    const int64_t H = hp->hidden_size, nh = hp->num_attention_heads;
    const int64_t dn = hp->qk_nope_head_dim, dv = hp->v_head_dim;
    di_status st = di_dev_copy_vec(&m->dev, &L->attn_norm, H);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->ffn_norm, H);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->q_proj);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->q_a_proj);
    if (!st && L->q_a_norm) st = di_dev_copy_vec(&m->dev, &L->q_a_norm, hp->q_lora_rank);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->q_b_proj);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->kv_a_proj);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->kv_a_norm, hp->kv_lora_rank);
    if (!st) st = up_uk_t(m, L);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->kv_b_proj);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->o_proj);
    if (st) return st;
    /* The host arrays of per-head views are model-owned: overwrite them in place. */
    for (int64_t h = 0; h < nh; h++) {
        L->w_uk[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv), dn);
        L->w_uv[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv) + dn, dv);
    }
    if (!L->is_moe) return up_mlp(m, &L->dense);
    st = di_dev_copy_weight(&m->dev, &L->router);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->router_bias, hp->n_routed_experts);
    for (int64_t e = 0; !st && e < hp->n_routed_experts; e++)
        st = up_mlp(m, &L->experts[e]);
    if (!st && L->has_shared) st = up_mlp(m, &L->shared);
    return st;
}

di_status ds_model_upload(ds_model *m) {
    if (!m->be->ops->weight_upload) return DI_OK; /* host weights used in place */
    const di_hparams *hp = m->hp;
    const bool tied = m->lm_head.data == m->embed.data;
    di_status st = di_dev_copy_weight(&m->dev, &m->embed);
    if (!st) st = di_dev_copy_vec(&m->dev, &m->norm, hp->hidden_size);
    if (!st) {
        if (tied)
            m->lm_head = m->embed;
        else
            st = di_dev_copy_weight(&m->dev, &m->lm_head);
    }
    for (int64_t il = 0; !st && il < hp->num_hidden_layers; il++)
        st = up_layer(m, &m->layers[il]);
    return st;
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
        di_status st = di_expert_sets_make(m->be, L->xw, E, &L->x_gate, &L->x_up, &L->x_down);
        if (st) return st;
    }
    return DI_OK;
}

void ds_model_release_device(ds_model *m) {
    for (int64_t il = 0; m->layers && il < m->hp->num_hidden_layers; il++) {
        ds_layer *L = &m->layers[il];
        di_expert_sets_free(m->be, &L->x_gate, &L->x_up, &L->x_down);
        di_free(L->xw);
        L->xw = NULL;
        di_free(L->w_ukt);
        L->w_ukt = NULL;
    }
    di_dev_copies_free(&m->dev);
}
