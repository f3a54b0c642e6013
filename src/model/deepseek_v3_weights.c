/*
 * deepseek_v3_weights.c -- binds a DeepSeek-V2/V3 checkpoint's tensors (transformers'
 * names) into a ds_model, checking every shape.
 *
 * Design stance:
 *   - Matrices stay in the mapping, in their stored dtype (F32 / F16 / BF16 / F8_E4M3);
 *     only small vectors (norms, router bias, FP8 block scales) are converted to float
 *     copies that the model owns.
 *   - Every expected tensor is looked up by name and its shape checked; a failure names the
 *     tensor and the file: `model.safetensors: tensor "x" has shape [4, 8], expected [8, 8]`.
 *   - Routed experts are accepted in both layouts: DeepSeek's published per-expert tensors
 *     (mlp.experts.E.{gate,up,down}_proj.weight, which is also what transformers 5.17's
 *     save_pretrained writes) and transformers' fused 3-D parameters
 *     (mlp.experts.gate_up_proj [E][2I][H], mlp.experts.down_proj [E][H][I]) as row views.
 *   - MTP layers (index >= num_hidden_layers) are bound and counted but not used.
 */
#include "model/deepseek_v3.h"

#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Binder: lookup, shape checks, ownership, statistics                                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct binder {
    const di_st_set *st;
    const di_hparams *hp;
    const char *dir;
    ds_model *m;
    int64_t *params; /* counter that receives the element counts (main model or MTP) */
    int64_t routed;  /* elements bound while `in_routed` (routed experts of this layer) */
    bool in_routed;
    int32_t n_files;
} binder;

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const char *file_of(const binder *b, const di_st_tensor *t) {
    return di_st_file_name(b->st, t);
}

static void *own(ds_model *m, void *p) {
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        int64_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **n = di_realloc(m->owned, (size_t)cap * sizeof *n);
        if (!n) {
            di_free(p);
            return NULL;
        }
        m->owned = n;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

static void note_tensor(binder *b, const di_st_tensor *t, bool is_param) {
    b->m->weight_bytes += (int64_t)t->nbytes;
    if (is_param) {
        *b->params += di_st_numel(t);
        if (b->in_routed) b->routed += di_st_numel(t);
    }
    char name[16];
    snprintf(name, sizeof name, "%s", di_dtype_name(t->dtype));
    for (char *c = name; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    char *d = b->m->dtypes;
    const char *p = d;
    size_t len = strlen(name);
    while ((p = strstr(p, name)) != NULL) { /* already listed? (whole "+"-separated item) */
        if ((p == d || p[-1] == '+') && (p[len] == '\0' || p[len] == '+')) return;
        p += len;
    }
    size_t used = strlen(d);
    if (used + len + 2 <= sizeof b->m->dtypes)
        snprintf(d + used, sizeof b->m->dtypes - used, "%s%s", used ? "+" : "", name);
}

static di_status find(const binder *b, const char *name, bool optional, const di_st_tensor **out) {
    *out = di_st_find(b->st, name);
    if (*out || optional) return DI_OK;
    if (b->n_files == 1)
        return di_error(DI_ERR_NOT_FOUND, "%s: tensor \"%s\" missing",
                        base_name(di_st_file_path(b->st, 0)), name);
    return di_error(DI_ERR_NOT_FOUND, "%s: tensor \"%s\" missing from every shard", b->dir, name);
}

static di_status check_shape(const binder *b, const di_st_tensor *t, int32_t ndim,
                             const int64_t *dims) {
    return di_st_check_shape(b->st, t, ndim, dims);
}

/* Converts a float-like tensor of n elements to a new float array owned by the model. */
static di_status to_float(binder *b, const di_st_tensor *t, int64_t n, const float **out) {
    float *f = own(b->m, di_malloc((size_t)DI_MAX(n, 1) * sizeof(float)));
    if (!f) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    di_status st = di_st_to_float(b->st, t, n, f);
    if (st == DI_OK) *out = f;
    return st;
}

/* A vector [n] (norm weight, router bias) as a float copy. optional: *out = NULL if absent. */
static di_status bind_vec(binder *b, const char *name, int64_t n, bool optional,
                          const float **out) {
    const di_st_tensor *t;
    *out = NULL;
    di_status st = find(b, name, optional, &t);
    if (st || !t) return st;
    if ((st = check_shape(b, t, 1, &n))) return st;
    note_tensor(b, t, true);
    return to_float(b, t, n, out);
}

/* A matrix stored as [lead][rows][cols] (lead = 0: plain 2-D [rows][cols]) bound as one 2-D
 * weight [lead * rows][cols]. F8_E4M3 needs "<name>_scale_inv". */
static di_status bind_mat3(binder *b, const char *name, int64_t lead, int64_t rows, int64_t cols,
                           bool optional, di_weight *w) {
    const di_st_tensor *t;
    memset(w, 0, sizeof *w);
    di_status st = find(b, name, optional, &t);
    if (st || !t) return st;
    int64_t dims[3] = {lead, rows, cols};
    st = lead ? check_shape(b, t, 3, dims) : check_shape(b, t, 2, dims + 1);
    if (st) return st;
    int64_t all_rows = lead ? lead * rows : rows;
    if (t->dtype != DI_DTYPE_F32 && t->dtype != DI_DTYPE_BF16 && t->dtype != DI_DTYPE_F16 &&
        t->dtype != DI_DTYPE_F8_E4M3)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: tensor \"%s\" has dtype %s (supported: F32, "
                        "BF16, F16, F8_E4M3)",
                        file_of(b, t), name, di_dtype_name(t->dtype));
    note_tensor(b, t, true);
    *w = (di_weight){
        .dtype = t->dtype, .rows = all_rows, .cols = cols, .row_stride = cols, .data = t->data};
    if (t->dtype != DI_DTYPE_F8_E4M3) return DI_OK;

    /* Block-scaled FP8: value = e4m3 * scale_inv[r / b0][c / b1]. */
    if (!b->hp->fp8)
        return di_error(DI_ERR_CONFIG,
                        "%s: tensor \"%s\" is F8_E4M3 but config.json has no fp8 "
                        "quantization_config",
                        file_of(b, t), name);
    int64_t b0 = b->hp->fp8_block[0] > 0 ? b->hp->fp8_block[0] : 128;
    int64_t b1 = b->hp->fp8_block[1] > 0 ? b->hp->fp8_block[1] : 128;
    if (lead && rows % b0 != 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: tensor \"%s\": fused FP8 experts need rows (%lld) "
                        "divisible by the block (%lld)",
                        file_of(b, t), name, (long long)rows, (long long)b0);
    char sname[512];
    snprintf(sname, sizeof sname, "%s_scale_inv", name);
    const di_st_tensor *s;
    if ((st = find(b, sname, false, &s))) return st;
    int64_t sdims[3] = {lead, (rows + b0 - 1) / b0, (cols + b1 - 1) / b1};
    st = lead ? check_shape(b, s, 3, sdims) : check_shape(b, s, 2, sdims + 1);
    if (st) return st;
    note_tensor(b, s, false);
    int64_t n_scale = (lead ? lead : 1) * sdims[1] * sdims[2];
    if ((st = to_float(b, s, n_scale, &w->scale))) return st;
    w->scale_cols = sdims[2];
    w->block_rows = b0;
    w->block_cols = b1;
    return DI_OK;
}

static di_status bind_mat(binder *b, const char *name, int64_t rows, int64_t cols, bool optional,
                          di_weight *w) {
    return bind_mat3(b, name, 0, rows, cols, optional, w);
}

/* ---------------------------------------------------------------------------------------- */
/* Layers                                                                                     */
/* ---------------------------------------------------------------------------------------- */

#define LNAME(buf, il, suffix)                                                                     \
    snprintf(buf, sizeof buf, "model.layers.%lld.%s", (long long)(il), suffix)

static di_status bind_mlp(binder *b, const char *prefix, int64_t inter, ds_mlp *mlp) {
    const di_hparams *hp = b->hp;
    char n[512];
    di_status st;
    snprintf(n, sizeof n, "%s.gate_proj.weight", prefix);
    if ((st = bind_mat(b, n, inter, hp->hidden_size, false, &mlp->gate))) return st;
    snprintf(n, sizeof n, "%s.up_proj.weight", prefix);
    if ((st = bind_mat(b, n, inter, hp->hidden_size, false, &mlp->up))) return st;
    snprintf(n, sizeof n, "%s.down_proj.weight", prefix);
    return bind_mat(b, n, hp->hidden_size, inter, false, &mlp->down);
}

static di_status bind_attention(binder *b, int64_t il, ds_layer *L) {
    const di_hparams *hp = b->hp;
    const int64_t H = hp->hidden_size, nh = hp->num_attention_heads;
    const int64_t dn = hp->qk_nope_head_dim, dr = hp->qk_rope_head_dim, dv = hp->v_head_dim;
    const int64_t R = hp->kv_lora_rank, qk = dn + dr;
    char n[512];
    di_status st = DI_OK;
    if (hp->q_lora_rank > 0) {
        LNAME(n, il, "self_attn.q_a_proj.weight");
        if (!st) st = bind_mat(b, n, hp->q_lora_rank, H, false, &L->q_a_proj);
        LNAME(n, il, "self_attn.q_a_layernorm.weight");
        if (!st) st = bind_vec(b, n, hp->q_lora_rank, false, &L->q_a_norm);
        LNAME(n, il, "self_attn.q_b_proj.weight");
        if (!st) st = bind_mat(b, n, nh * qk, hp->q_lora_rank, false, &L->q_b_proj);
    } else {
        LNAME(n, il, "self_attn.q_proj.weight");
        if (!st) st = bind_mat(b, n, nh * qk, H, false, &L->q_proj);
    }
    LNAME(n, il, "self_attn.kv_a_proj_with_mqa.weight");
    if (!st) st = bind_mat(b, n, R + dr, H, false, &L->kv_a_proj);
    LNAME(n, il, "self_attn.kv_a_layernorm.weight");
    if (!st) st = bind_vec(b, n, R, false, &L->kv_a_norm);
    LNAME(n, il, "self_attn.kv_b_proj.weight");
    if (!st) st = bind_mat(b, n, nh * (dn + dv), R, false, &L->kv_b_proj);
    LNAME(n, il, "self_attn.o_proj.weight");
    if (!st) st = bind_mat(b, n, H, nh * dv, false, &L->o_proj);
    LNAME(n, il, "input_layernorm.weight");
    if (!st) st = bind_vec(b, n, H, false, &L->attn_norm);
    LNAME(n, il, "post_attention_layernorm.weight");
    if (!st) st = bind_vec(b, n, H, false, &L->ffn_norm);
    if (st) return st;

    /* Per-head views of kv_b_proj: head h owns rows [h*(dn+dv), h*(dn+dv) + dn) for keys and
     * the next dv rows for values. */
    L->w_uk = own(b->m, di_calloc((size_t)nh, sizeof(di_weight)));
    L->w_uv = own(b->m, di_calloc((size_t)nh, sizeof(di_weight)));
    if (!L->w_uk || !L->w_uv) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t h = 0; h < nh; h++) {
        L->w_uk[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv), dn);
        L->w_uv[h] = di_weight_rows(&L->kv_b_proj, h * (dn + dv) + dn, dv);
    }
    return DI_OK;
}

static di_status bind_moe(binder *b, int64_t il, ds_layer *L) {
    const di_hparams *hp = b->hp;
    const int64_t H = hp->hidden_size, E = hp->n_routed_experts, I = hp->moe_intermediate_size;
    char n[512], prefix[256];
    di_status st;
    LNAME(n, il, "mlp.gate.weight");
    if ((st = bind_mat(b, n, E, H, false, &L->router))) return st;
    LNAME(n, il, "mlp.gate.e_score_correction_bias");
    bool need_bias = hp->topk_method == DI_TOPK_NOAUX_TC;
    if ((st = bind_vec(b, n, E, !need_bias, &L->router_bias))) return st;

    L->experts = own(b->m, di_calloc((size_t)E, sizeof(ds_mlp)));
    if (!L->experts) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    b->in_routed = true;
    LNAME(n, il, "mlp.experts.gate_up_proj");
    if (di_st_find(b->st, n)) { /* transformers' fused layout */
        di_weight gu, down;
        if ((st = bind_mat3(b, n, E, 2 * I, H, false, &gu))) return st;
        LNAME(n, il, "mlp.experts.down_proj");
        if ((st = bind_mat3(b, n, E, H, I, false, &down))) return st;
        for (int64_t e = 0; e < E; e++) {
            L->experts[e].gate = di_weight_rows(&gu, e * 2 * I, I);
            L->experts[e].up = di_weight_rows(&gu, e * 2 * I + I, I);
            L->experts[e].down = di_weight_rows(&down, e * H, H);
        }
    } else { /* DeepSeek's per-expert tensors */
        for (int64_t e = 0; e < E; e++) {
            snprintf(prefix, sizeof prefix, "model.layers.%lld.mlp.experts.%lld", (long long)il,
                     (long long)e);
            if ((st = bind_mlp(b, prefix, I, &L->experts[e]))) return st;
        }
    }
    b->in_routed = false;

    L->has_shared = hp->n_shared_experts > 0;
    if (!L->has_shared) return DI_OK;
    LNAME(prefix, il, "mlp.shared_experts");
    return bind_mlp(b, prefix, I * hp->n_shared_experts, &L->shared);
}

static di_status bind_layer(binder *b, int64_t il, bool is_moe, ds_layer *L) {
    di_status st = bind_attention(b, il, L);
    if (st) return st;
    L->is_moe = is_moe;
    if (is_moe) {
        b->routed = 0;
        st = bind_moe(b, il, L);
        if (!st && b->params == &b->m->n_params_total) {
            b->m->n_params_routed += b->routed;
            b->m->n_params_active -=
                b->routed - b->routed / b->hp->n_routed_experts * b->hp->num_experts_per_tok;
        }
        return st;
    }
    char prefix[256];
    LNAME(prefix, il, "mlp");
    return bind_mlp(b, prefix, b->hp->intermediate_size, &L->dense);
}

static di_status bind_mtp(binder *b, int64_t il, ds_mtp *M) {
    const di_hparams *hp = b->hp;
    const int64_t H = hp->hidden_size;
    char n[512];
    di_status st = bind_layer(b, il, di_hparams_layer_is_moe(hp, il), &M->layer);
    LNAME(n, il, "eh_proj.weight");
    if (!st) st = bind_mat(b, n, H, 2 * H, false, &M->eh_proj);
    LNAME(n, il, "enorm.weight");
    if (!st) st = bind_vec(b, n, H, false, &M->enorm);
    LNAME(n, il, "hnorm.weight");
    if (!st) st = bind_vec(b, n, H, false, &M->hnorm);
    LNAME(n, il, "embed_tokens.weight");
    if (!st) st = bind_mat(b, n, hp->vocab_size, H, true, &M->embed);
    LNAME(n, il, "shared_head.norm.weight");
    if (!st) st = bind_vec(b, n, H, true, &M->head_norm);
    LNAME(n, il, "shared_head.head.weight");
    if (!st) st = bind_mat(b, n, hp->vocab_size, H, true, &M->head);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                               */
/* ---------------------------------------------------------------------------------------- */

void ds_model_free(ds_model *m) {
    if (!m) return;
    ds_model_release_device(m);
    for (int64_t i = 0; i < m->n_owned; i++)
        di_free(m->owned[i]);
    di_free(m->owned);
    di_free(m);
}

di_status ds_model_bind(const di_hparams *hp, const di_st_set *st, const char *dir,
                        ds_model **out) {
    *out = NULL;
    ds_model *m = di_calloc(1, sizeof *m);
    if (!m) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    m->hp = hp;
    binder b = {.st = st, .hp = hp, .dir = dir, .m = m, .params = &m->n_params_total};
    for (int64_t i = 0; i < di_st_count(st); i++)
        b.n_files = DI_MAX(b.n_files, di_st_at(st, i)->file_index + 1);

    const int64_t H = hp->hidden_size, V = hp->vocab_size;
    di_status s = DI_OK;
    m->layers = own(m, di_calloc((size_t)hp->num_hidden_layers, sizeof(ds_layer)));
    m->n_mtp = hp->num_nextn_predict_layers;
    m->mtp = m->n_mtp ? own(m, di_calloc((size_t)m->n_mtp, sizeof(ds_mtp))) : NULL;
    if (!m->layers || (m->n_mtp && !m->mtp)) s = di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");

    if (!s) s = bind_mat(&b, "model.embed_tokens.weight", V, H, false, &m->embed);
    for (int64_t il = 0; !s && il < hp->num_hidden_layers; il++)
        s = bind_layer(&b, il, di_hparams_layer_is_moe(hp, il), &m->layers[il]);
    if (!s) s = bind_vec(&b, "model.norm.weight", H, false, &m->norm);
    if (!s) {
        bool have_head = di_st_find(st, "lm_head.weight") != NULL;
        if (have_head || !hp->tie_word_embeddings)
            s = bind_mat(&b, "lm_head.weight", V, H, false, &m->lm_head);
        else
            m->lm_head = m->embed;
    }
    /* Active parameters: everything but the routed experts, plus top_k of them per layer
     * (bind_layer already subtracted the unused share). */
    m->n_params_active += m->n_params_total;

    b.params = &m->n_params_mtp;
    for (int64_t k = 0; !s && k < m->n_mtp; k++)
        s = bind_mtp(&b, hp->num_hidden_layers + k, &m->mtp[k]);

    if (s) {
        ds_model_free(m);
        return s;
    }
    *out = m;
    return DI_OK;
}
