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

static di_status up_mlp(ds_model *m, ds_mlp *p) {
    di_status st = di_dev_copy_weight(&m->dev, &p->gate);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->up);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->down);
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
    }
    di_dev_copies_free(&m->dev);
}
