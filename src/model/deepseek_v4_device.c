/*
 * deepseek_v4_device.c -- one backend copy of a DeepSeek-V4 model's weights, made at load
 * when the model's memory backend keeps weights in its own memory (CUDA).
 *
 * Design stance (as deepseek_v3_device.c): the binder always binds host views; this pass
 * replaces, in place, every di_weight and float vector the forward's ops read with a backend
 * copy, so the forward code is the same for every backend; the router bias and tid2eid go
 * too (moe_route runs on the backend). The MTP modules (bound but not run) stay on the host. FP8
 * weights bring their block scales and FP4 experts their E8M0 bytes (weight_upload copies both).
 * The grouped output projection's views are rebuilt over the one device copy of wo_a, so the head
 * product still sees uniformly strided groups.
 */
#include "model/deepseek_v4.h"

static di_status up_mlp(v4_model *m, v4_mlp *p) {
    di_status st = di_dev_copy_weight(&m->dev, &p->w1);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->w3);
    if (!st) st = di_dev_copy_weight(&m->dev, &p->w2);
    return st;
}

static di_status up_comp(v4_model *m, v4_compressor *c) {
    di_status st = di_dev_copy_weight(&m->dev, &c->wkv);
    if (!st) st = di_dev_copy_weight(&m->dev, &c->wgate);
    if (!st) st = di_dev_copy_vec(&m->dev, &c->ape, c->m * c->cw);
    if (!st) st = di_dev_copy_vec(&m->dev, &c->norm, c->width);
    return st;
}

static di_status up_block(v4_model *m, v4_block *L) {
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    const int64_t D = hp->hidden_size, n = v->hc_mult, nm = (2 + n) * n;
    const int64_t g = v->o_groups, r = v->o_lora_rank;
    di_status st = di_dev_copy_vec(&m->dev, &L->attn_norm, D);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->ffn_norm, D);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_attn_fn, nm * n * D);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_attn_base, nm);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_attn_scale, 3);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_ffn_fn, nm * n * D);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_ffn_base, nm);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->hc_ffn_scale, 3);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->wq_a);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->q_norm, v->q_lora_rank);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->wq_b);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->wkv);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->kv_norm, v->head_dim);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->wo_a);
    if (!st) st = di_dev_copy_weight(&m->dev, &L->wo_b);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->sinks, hp->num_attention_heads);
    if (st) return st;
    for (int64_t j = 0; j < g; j++) /* the model-owned host array of views, in place */
        L->wo_a_group[j] = di_weight_rows(&L->wo_a, j * r, r);
    if (L->kind != DI_V4_SLIDING) st = up_comp(m, &L->comp);
    if (!st && L->kind == DI_V4_CSA) {
        st = up_comp(m, &L->icomp);
        if (!st) st = di_dev_copy_weight(&m->dev, &L->idx_wq_b);
        if (!st) st = di_dev_copy_weight(&m->dev, &L->idx_weights);
    }
    if (!st) st = di_dev_copy_weight(&m->dev, &L->gate);
    if (!st) st = di_dev_copy_vec(&m->dev, &L->gate_bias, hp->n_routed_experts);
    const size_t table_bytes = (size_t)(hp->vocab_size * hp->num_experts_per_tok) * sizeof(int32_t);
    if (!st && L->tid2eid) st = di_dev_copy_bytes(&m->dev, (const void **)&L->tid2eid, table_bytes);
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
    di_status st = di_dev_copy_weight(&m->dev, &m->embed);
    if (!st) {
        if (tied)
            m->head = m->embed;
        else
            st = di_dev_copy_weight(&m->dev, &m->head);
    }
    if (!st) st = di_dev_copy_vec(&m->dev, &m->norm, D);
    if (!st) st = di_dev_copy_vec(&m->dev, &m->hc_head_fn, n * n * D);
    if (!st) st = di_dev_copy_vec(&m->dev, &m->hc_head_base, n);
    if (!st) st = di_dev_copy_vec(&m->dev, &m->hc_head_scale, 1);
    if (!st) st = di_dev_copy_vec(&m->dev, &m->ones, DI_MAX(m->v->head_dim, D));
    for (int64_t il = 0; !st && il < hp->num_hidden_layers; il++)
        st = up_block(m, &m->blocks[il]);
    if (!st) st = m->be->ops->sync(m->be->ctx);
    return st;
}

di_status v4_model_expert_sets(v4_model *m) {
    const int64_t E = m->hp->n_routed_experts;
    for (int64_t il = 0; il < m->hp->num_hidden_layers; il++) {
        v4_block *L = &m->blocks[il];
        L->xw = v4_own(m, di_calloc((size_t)(3 * E), sizeof(di_weight)));
        if (!L->xw) return di_error(DI_ERR_OUT_OF_MEMORY, "expert sets: out of memory");
        for (int64_t e = 0; e < E; e++) {
            L->xw[e] = L->experts[e].w1;
            L->xw[E + e] = L->experts[e].w3;
            L->xw[2 * E + e] = L->experts[e].w2;
        }
        di_status st = di_expert_sets_make(m->be, L->xw, E, &L->x_gate, &L->x_up, &L->x_down);
        if (st) return st;
    }
    return DI_OK;
}

void v4_model_release_device(v4_model *m) {
    for (int64_t il = 0; m->blocks && il < m->hp->num_hidden_layers; il++) {
        v4_block *L = &m->blocks[il];
        di_expert_sets_free(m->be, &L->x_gate, &L->x_up, &L->x_down);
    }
    di_dev_copies_free(&m->dev);
}
