/*
 * deepseek_v4.c -- the DeepSeek-V4 (Flash / Pro) forward pass: embedding into n_hc streams,
 * per sublayer mHC (mixing weights with Sinkhorn, collapse, attention or MoE, stream update),
 * and the head with its own stream collapse. Attention lives in deepseek_v4_attn.c, tensor
 * binding in deepseek_v4_weights.c, the per-sequence state in src/kv/v4_state.c.
 *
 * Semantics are transformers 5.17's (docs/v4-reference-notes.md; tools/make_goldens_v4.py's
 * independent_forward() is the executable description):
 *   - RoPE: main (sliding layers, rope_theta) and compress (CSA / HCA layers,
 *     compress_rope_theta, YaRN when configured, attention factor 1); inverse frequencies,
 *     angles and cos / sin in float32 as transformers computes them.
 *   - MoE: sqrt(softplus) scores; moe layers pick the top-k of score + bias, hash_moe layers
 *     take tid2eid[token]; weights = score / (sum + 1e-20) * routed_scaling_factor; SwiGLU
 *     with the gate clamped above and the up projection clamped both ways at swiglu_limit,
 *     for the routed and the shared expert alike.
 *
 * The forward pass allocates nothing: every buffer is carved at context creation for
 * C = min(max_tokens, V4_MAX_CHUNK) rows; longer inputs run in chunks of C.
 */
#include "model/deepseek_v4.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define V4_MAX_CHUNK 128
#define V4_PI        3.14159265358979323846

/* ---------------------------------------------------------------------------------------- */
/* RoPE                                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* inv_freq for one rope flavour (transformers' default / YaRN formulas in float32). */
static void rope_inv_freq(const di_v4_rope *rp, int64_t rd, float *inv) {
    const float base = (float)rp->theta;
    float pos_freq[256];
    for (int64_t i = 0; i < rd / 2; i++) {
        pos_freq[i] = powf(base, (float)(2 * i) / (float)rd);
        inv[i] = 1.0f / pos_freq[i];
    }
    if (!rp->yarn) return;
    /* transformers 5.17 uses `factor` as given (config_v4.c defaults an absent one to
     * max_position_embeddings / original, its own fallback). */
    const double L0 = (double)rp->original_max_position_embeddings, factor = rp->factor;
#define CDIM(beta) ((double)rd * log(L0 / ((beta)*2.0 * V4_PI)) / (2.0 * log(rp->theta)))
    double lo = DI_MAX(floor(CDIM(rp->beta_fast)), 0.0);
    double hi = DI_MIN(ceil(CDIM(rp->beta_slow)), (double)(rd - 1));
#undef CDIM
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < rd / 2; i++) {
        float ramp = ((float)i - (float)lo) / (float)(hi - lo);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float extrap = 1.0f / pos_freq[i], interp = 1.0f / ((float)factor * pos_freq[i]);
        inv[i] = interp * ramp + extrap * (1.0f - ramp);
    }
}

/* cos, sin and -sin [n][rd / 2] for positions pos0 .. pos0 + n - 1. */
static void rope_tables(const float *inv, int64_t rd2, int64_t pos0, int64_t n, float *cs,
                        float *sn, float *nsn) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < rd2; i++) {
            float ang = (float)(pos0 + t) * inv[i];
            cs[t * rd2 + i] = (float)cos((double)ang);
            sn[t * rd2 + i] = (float)sin((double)ang);
            nsn[t * rd2 + i] = -sn[t * rd2 + i];
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Per-sequence context                                                                       */
/* ---------------------------------------------------------------------------------------- */

static void *carve(char **p, size_t bytes) {
    void *r = *p;
    *p += (bytes + 63) & ~(size_t)63;
    return r;
}

static di_status v4_state_create(const void *weights, int64_t max_tokens, void **out) {
    const v4_model *m = weights;
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    const int64_t D = hp->hidden_size, H = hp->num_attention_heads, d = v->head_dim;
    const int64_t n = v->hc_mult, E = hp->n_routed_experts, K = hp->num_experts_per_tok;
    const int64_t I = hp->moe_intermediate_size, nI = v->index_n_heads, dI = v->index_head_dim;
    const int64_t rd2 = v->rope_dim / 2;
    v4_ctx *c = di_calloc(1, sizeof *c);
    if (!c) return di_error(DI_ERR_OUT_OF_MEMORY, "context: out of memory");
    c->max_tokens = max_tokens;
    const int64_t C = c->chunk = DI_MIN(max_tokens, V4_MAX_CHUNK);

    /* Largest key list of a query: the window plus the most entries a layer can add. */
    int64_t extra = 0, m_max = 1;
    for (int64_t il = 0; il < hp->num_hidden_layers; il++) {
        int64_t mr = v->compress_rate[il];
        if (v->layer_kind[il] == DI_V4_SLIDING) continue;
        m_max = DI_MAX(m_max, mr);
        c->max_entries = DI_MAX(c->max_entries, max_tokens / mr);
        extra =
            DI_MAX(extra, v->layer_kind[il] == DI_V4_CSA ? DI_MIN(v->index_topk, max_tokens / mr)
                                                         : max_tokens / mr);
    }
    c->max_keys = DI_MIN(v->sliding_window, max_tokens) + extra;
    const int64_t MK = c->max_keys, ME = DI_MAX(c->max_entries, 1);

    di_status st = di_v4_state_init(&c->kv, hp->num_hidden_layers, v->layer_kind, v->compress_rate,
                                    v->sliding_window, d, dI, max_tokens);
    if (st) {
        di_free(c);
        return st;
    }
    const size_t f = sizeof(float), pz = sizeof(void *);
    size_t sizes[] = {C * n * D * f,
                      C * n * D * f,
                      C * D * f,
                      C * D * f,
                      C * D * f,
                      C * n * f,
                      C * n * n * f,
                      C * v->q_lora_rank * f,
                      C * H * d * f,
                      C * H * d * f,
                      C * d * f,
                      C * v->o_groups * v->o_lora_rank * f,
                      C * rd2 * f,
                      C * rd2 * f,
                      C * rd2 * f,
                      C * rd2 * f,
                      C * rd2 * f,
                      C * rd2 * f,
                      C * 2 * d * f,
                      C * 2 * d * f,
                      C * 2 * dI * f,
                      C * 2 * dI * f,
                      C * nI * dI * f,
                      C * nI * f,
                      C * ME * f,
                      DI_MAX(C, 64) * MK * f,
                      C * MK * pz,
                      C * sizeof(int32_t),
                      C * sizeof(int64_t),
                      (size_t)DI_MAX(v->index_topk, 1) * sizeof(int32_t),
                      2 * m_max * pz,
                      2 * m_max * pz,
                      C * E * f,
                      C * K * f,
                      3 * E * f,
                      C * K * I * f,
                      C * K * I * f,
                      C * K * D * f,
                      C * K * D * f,
                      C * K * D * f,
                      C * K * sizeof(int32_t),
                      (E + 1) * sizeof(int64_t),
                      C * K * sizeof(int32_t)};
    size_t total = 0;
    for (size_t i = 0; i < DI_ARRAY_LEN(sizes); i++)
        total += (sizes[i] + 63) & ~(size_t)63;
    c->arena = di_aligned_alloc(total);
    if (!c->arena) {
        di_v4_state_free(&c->kv);
        di_free(c);
        return di_error(DI_ERR_OUT_OF_MEMORY, "context: cannot allocate %zu bytes of buffers",
                        total);
    }
    memset(c->arena, 0, total);
    char *p = c->arena;
    size_t k = 0;
    c->x = carve(&p, sizes[k++]);
    c->x2 = carve(&p, sizes[k++]);
    c->h = carve(&p, sizes[k++]);
    c->xn = carve(&p, sizes[k++]);
    c->y = carve(&p, sizes[k++]);
    c->post = carve(&p, sizes[k++]);
    c->mix = carve(&p, sizes[k++]);
    c->qr = carve(&p, sizes[k++]);
    c->q = carve(&p, sizes[k++]);
    c->o = carve(&p, sizes[k++]);
    c->kvr = carve(&p, sizes[k++]);
    c->z = carve(&p, sizes[k++]);
    c->cos_m = carve(&p, sizes[k++]);
    c->sin_m = carve(&p, sizes[k++]);
    c->nsin_m = carve(&p, sizes[k++]);
    c->cos_c = carve(&p, sizes[k++]);
    c->sin_c = carve(&p, sizes[k++]);
    c->nsin_c = carve(&p, sizes[k++]);
    c->cc = carve(&p, sizes[k++]);
    c->zz = carve(&p, sizes[k++]);
    c->ic = carve(&p, sizes[k++]);
    c->iz = carve(&p, sizes[k++]);
    c->qi = carve(&p, sizes[k++]);
    c->iw = carve(&p, sizes[k++]);
    c->iscore = carve(&p, sizes[k++]);
    c->ascratch = carve(&p, sizes[k++]);
    c->scratch_rows = DI_MAX(C, 64);
    c->keys = carve(&p, sizes[k++]);
    c->n_keys = carve(&p, sizes[k++]);
    c->n_vis = carve(&p, sizes[k++]);
    c->sel = carve(&p, sizes[k++]);
    c->slot_c = carve(&p, sizes[k++]);
    c->slot_z = carve(&p, sizes[k++]);
    c->rlogits = carve(&p, sizes[k++]);
    c->sel_w = carve(&p, sizes[k++]);
    c->rscratch = carve(&p, sizes[k++]);
    c->gate = carve(&p, sizes[k++]);
    c->up = carve(&p, sizes[k++]);
    c->xe = carve(&p, sizes[k++]);
    c->moe_out = carve(&p, sizes[k++]);
    c->eo = carve(&p, sizes[k++]);
    c->sel_id = carve(&p, sizes[k++]);
    c->cnt = carve(&p, sizes[k++]);
    c->ent = carve(&p, sizes[k++]);
    *out = c;
    return DI_OK;
}

static void v4_state_free(void *state) {
    v4_ctx *c = state;
    if (!c) return;
    di_v4_state_free(&c->kv);
    di_aligned_free(c->arena);
    di_free(c);
}

/* ---------------------------------------------------------------------------------------- */
/* MoE                                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Clamped SwiGLU expert over n rows of x -> y. */
static void expert(const v4_model *m, const v4_mlp *w, v4_ctx *c, const di_backend *be,
                   const float *x, int64_t n, float *y) {
    const int64_t I = w->w1.rows;
    v4_matmul(be, &w->w1, x, n, c->gate);
    v4_matmul(be, &w->w3, x, n, c->up);
    be->ops->v4_swiglu(be->ctx, c->gate, c->up, n * I, (float)m->v->swiglu_limit, c->gate);
    v4_matmul(be, &w->w2, c->gate, n, y);
}

/* Hash routing: experts from tid2eid, weights from the unbiased scores. */
static void route_hash(const v4_model *m, const v4_block *L, const float *logits, int32_t tok,
                       int32_t *ids, float *w) {
    const int64_t K = m->hp->num_experts_per_tok;
    double s[64], sum = 0.0;
    for (int64_t j = 0; j < K && j < 64; j++) {
        ids[j] = L->tid2eid[(int64_t)tok * K + j];
        double x = logits[ids[j]];
        switch (m->hp->scoring_func) {
        case DI_SCORE_SIGMOID:
            s[j] = 1.0 / (1.0 + exp(-x));
            break;
        default: /* sqrt(softplus) (softmax is not used with hash layers) */
            s[j] = sqrt(x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x)));
            break;
        }
        s[j] = (float)s[j];
        sum += s[j];
    }
    for (int64_t j = 0; j < K && j < 64; j++)
        w[j] = (float)(s[j] / (sum + 1e-20) * m->hp->routed_scaling_factor);
}

/* MoE over c->xn -> c->y. Tokens are grouped by expert so each expert's weights are read
 * once per chunk; each token sums its experts in slot order (batch invariance). */
static void moe(const v4_model *m, const v4_block *L, v4_ctx *c, const di_backend *be,
                const int32_t *tok, int64_t n) {
    const di_hparams *hp = m->hp;
    const int64_t D = hp->hidden_size, E = hp->n_routed_experts, K = hp->num_experts_per_tok;
    void *bc = be->ctx;
    v4_matmul(be, &L->gate, c->xn, n, c->rlogits);
    /* V4's rules (plain top-k of score + bias, always renormalised) are in the hparams. */
    di_router_params rp = di_router_params_from_hparams(hp);
    rp.bias = L->gate_bias;
    for (int64_t t = 0; t < n; t++) {
        if (L->hash)
            route_hash(m, L, c->rlogits + t * E, tok[t], c->sel_id + t * K, c->sel_w + t * K);
        else
            di_router_select(&rp, c->rlogits + t * E, c->sel_id + t * K, c->sel_w + t * K,
                             c->rscratch);
    }
    memset(c->cnt, 0, (size_t)(E + 1) * sizeof *c->cnt);
    for (int64_t i = 0; i < n * K; i++)
        c->cnt[c->sel_id[i] + 1]++;
    for (int64_t e = 0; e < E; e++)
        c->cnt[e + 1] += c->cnt[e];
    for (int64_t i = 0; i < n * K; i++)
        c->ent[c->cnt[c->sel_id[i]]++] = (int32_t)i;
    for (int64_t e = 0, begin = 0; e < E; begin = c->cnt[e], e++) {
        int64_t ne = c->cnt[e] - begin;
        if (ne == 0) continue;
        const int32_t *ent = c->ent + begin;
        for (int64_t i = 0; i < ne; i++)
            be->ops->copy2d(bc, c->xe + i * D, D, c->xn + (ent[i] / K) * D, D, 1, D);
        expert(m, &L->experts[e], c, be, c->xe, ne, c->moe_out);
        for (int64_t i = 0; i < ne; i++)
            be->ops->copy2d(bc, c->eo + (int64_t)ent[i] * D, D, c->moe_out + i * D, D, 1, D);
    }
    expert(m, &L->shared, c, be, c->xn, n, c->y);
    memset(c->moe_out, 0, (size_t)(n * D) * sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < K; k++)
            be->ops->axpy(bc, c->sel_w[t * K + k], c->eo + (t * K + k) * D, D, c->moe_out + t * D);
    be->ops->axpy(bc, 1.0f, c->moe_out, n * D, c->y);
}

/* ---------------------------------------------------------------------------------------- */
/* Forward                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* mHC around one sublayer: collapse the streams (c->h), norm into c->xn; after the sublayer
 * wrote c->y, mix the streams (c->x <- post y + M^T x). */
static void hc_pre(const v4_model *m, v4_ctx *c, const di_backend *be, int64_t n, const float *fn,
                   const float *base, const float *scale, const float *norm) {
    di_v4_hc_params p = {.n_tokens = n,
                         .n_hc = m->v->hc_mult,
                         .dim = m->hp->hidden_size,
                         .x = c->x,
                         .fn = fn,
                         .base = base,
                         .scale = scale,
                         .iters = m->v->hc_sinkhorn_iters,
                         .eps = (float)m->hp->rms_norm_eps,
                         .hc_eps = (float)m->v->hc_eps,
                         .h = c->h,
                         .post = c->post,
                         .mix = c->mix};
    be->ops->v4_hc_pre(be->ctx, &p);
    const int64_t D = m->hp->hidden_size;
    be->ops->rmsnorm(be->ctx, c->h, D, norm, n, D, (float)m->hp->rms_norm_eps, c->xn, D);
}

static void hc_post(const v4_model *m, v4_ctx *c, const di_backend *be, int64_t n) {
    be->ops->v4_hc_post(be->ctx, n, m->v->hc_mult, m->hp->hidden_size, c->x, c->y, c->post, c->mix,
                        c->x2);
    float *t = c->x;
    c->x = c->x2;
    c->x2 = t;
}

static void forward_chunk(const v4_model *m, v4_ctx *c, const di_backend *be, const int32_t *ids,
                          int64_t n, int64_t pos0, float *logits, int64_t lrow0) {
    const di_hparams *hp = m->hp;
    const int64_t D = hp->hidden_size, nh = m->v->hc_mult, rd2 = m->v->rope_dim / 2;
    void *bc = be->ctx;

    be->ops->embed(bc, &m->embed, ids, n, c->y);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < nh; j++)
            be->ops->copy2d(bc, c->x + (t * nh + j) * D, D, c->y + t * D, D, 1, D);
    rope_tables(m->inv_main, rd2, pos0, n, c->cos_m, c->sin_m, c->nsin_m);
    rope_tables(m->inv_comp, rd2, pos0, n, c->cos_c, c->sin_c, c->nsin_c);

    for (int64_t il = 0; il < hp->num_hidden_layers; il++) {
        const v4_block *L = &m->blocks[il];
        hc_pre(m, c, be, n, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm);
        v4_attention(m, L, il, c, be, n, pos0);
        hc_post(m, c, be, n);
        hc_pre(m, c, be, n, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm);
        moe(m, L, c, be, ids, n);
        hc_post(m, c, be, n);
    }
    if (!logits || lrow0 >= n) return;

    /* Head: collapse with its own weights (no Sinkhorn), final norm, lm head. */
    di_v4_hc_params p = {.n_tokens = n - lrow0,
                         .n_hc = nh,
                         .dim = D,
                         .x = c->x + lrow0 * nh * D,
                         .fn = m->hc_head_fn,
                         .base = m->hc_head_base,
                         .scale = m->hc_head_scale,
                         .iters = 0,
                         .eps = (float)hp->rms_norm_eps,
                         .hc_eps = (float)m->v->hc_eps,
                         .h = c->h};
    be->ops->v4_hc_pre(bc, &p);
    be->ops->rmsnorm(bc, c->h, D, m->norm, n - lrow0, D, (float)hp->rms_norm_eps, c->xn, D);
    v4_matmul(be, &m->head, c->xn, n - lrow0, logits);
}

/* Runs n tokens of the sequence whose state is in c->kv. */
static void run_seq(const v4_model *m, v4_ctx *c, const di_backend *be, const int32_t *ids,
                    int64_t n, int64_t pos0, float *logits, int64_t n_logits) {
    const int64_t V = m->hp->vocab_size;
    const int64_t first = logits ? n - n_logits : n;
    for (int64_t c0 = 0; c0 < n; c0 += c->chunk) {
        int64_t cn = DI_MIN(c->chunk, n - c0);
        int64_t lrow0 = DI_MAX(first - c0, 0);
        float *lg = logits && lrow0 < cn ? logits + (c0 + lrow0 - first) * V : NULL;
        forward_chunk(m, c, be, ids + c0, cn, pos0 + c0, lg, lrow0);
    }
}

static void v4_forward(const void *weights, void *state, const di_backend *be,
                       const di_forward_args *a) {
    v4_ctx *c = state;
    /* A call at position 0 starts a new sequence (di_context_reset rewinds to 0). */
    if (a->pos0 == 0) di_v4_state_reset(&c->kv);
    run_seq(weights, c, be, a->ids, a->n, a->pos0, a->logits, a->logits ? a->n_logits : 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Batched runner                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* The engine's V4 state: one activation context and a full attention state per slot. The
 * compressed entries live in the slot too (not in the paged pool yet), so a sequence that
 * loses its slot is recomputed from position 0 and prefix reuse is off for V4 (see
 * v4_prefix_cache_ok). Sequences run one after another through the per-sequence path, so
 * each one's result is exactly that of a context. */
typedef struct v4_batch_state {
    v4_ctx *ctx;          /* owned; its own kv is unused */
    di_v4_state *slots;   /* [n_slots], owned unless slots_shared */
    int32_t n_slots;
    /* The slots are another state's (di_batch_config.share): a slot handed from the
     * prefill worker to the decode worker moves, it is not copied. */
    bool slots_shared;
} v4_batch_state;

static void v4_batch_state_free(void *state) {
    v4_batch_state *b = state;
    if (!b) return;
    for (int32_t i = 0; b->slots && !b->slots_shared && i < b->n_slots; i++)
        di_v4_state_free(&b->slots[i]);
    if (!b->slots_shared) di_free(b->slots);
    v4_state_free(b->ctx);
    di_free(b);
}

static di_status v4_batch_state_create(const void *weights, const di_batch_config *cfg,
                                       void **out) {
    const v4_model *m = weights;
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    v4_batch_state *b = di_calloc(1, sizeof *b);
    if (!b) return di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    di_status st = v4_state_create(weights, cfg->max_model_len, (void **)&b->ctx);
    const v4_batch_state *share = cfg->share;
    if (!st && share) {
        if (share->n_slots != cfg->n_slots)
            st = di_error(DI_ERR_INVALID_ARG, "batch state: the shared state has %d slots, not %d",
                          (int)share->n_slots, (int)cfg->n_slots);
        b->slots = share->slots;
        b->n_slots = share->n_slots;
        b->slots_shared = true;
    } else if (!st) {
        b->slots = di_calloc((size_t)cfg->n_slots, sizeof *b->slots);
        if (!b->slots) st = di_error(DI_ERR_OUT_OF_MEMORY, "engine: out of memory");
    }
    for (int32_t i = 0; !st && !b->slots_shared && i < cfg->n_slots; i++, b->n_slots = i)
        st = di_v4_state_init(&b->slots[i], hp->num_hidden_layers, v->layer_kind,
                              v->compress_rate, v->sliding_window, v->head_dim,
                              v->index_head_dim, cfg->max_model_len);
    if (st) {
        v4_batch_state_free(b);
        return st;
    }
    *out = b;
    return DI_OK;
}

static void v4_forward_batch(const void *weights, void *state, const di_backend *be,
                             const di_batch_args *a) {
    const v4_model *m = weights;
    v4_batch_state *b = state;
    const int64_t V = m->hp->vocab_size;
    di_v4_state own = b->ctx->kv;
    int64_t lrow = 0;
    for (int64_t i = 0; i < a->n_seqs; i++) {
        const di_batch_seq *q = &a->seqs[i];
        b->ctx->kv = b->slots[q->slot];
        if (q->reset_state) di_v4_state_reset(&b->ctx->kv);
        run_seq(m, b->ctx, be, q->ids, q->n, q->pos0,
                q->n_logits > 0 && a->logits ? a->logits + lrow * V : NULL, q->n_logits);
        b->slots[q->slot] = b->ctx->kv;
        lrow += q->n_logits;
    }
    b->ctx->kv = own;
}

static int64_t v4_replay_tokens(const void *weights) {
    const v4_model *m = weights;
    return (m->hp->num_hidden_layers + 1) * m->v->sliding_window;
}

static bool v4_prefix_cache_ok(const void *weights) {
    (void)weights;
    return false; /* compressed entries are per slot, not paged (see v4_batch_state) */
}

static int64_t v4_block_multiple(const void *weights) {
    const v4_model *m = weights;
    int64_t r = 1;
    for (int64_t il = 0; il < m->hp->num_hidden_layers; il++)
        if (m->v->layer_kind[il] != DI_V4_SLIDING) r = DI_MAX(r, m->v->compress_rate[il]);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* vtable                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static di_status v4_load(const di_hparams *hp, const di_st_set *st, const char *dir,
                         const di_backend *be, void **out) {
    /* The V4 forward reads host buffers directly (its own ops are CPU-only so far). */
    if (!be->ops->host_memory)
        return di_error(DI_ERR_UNSUPPORTED, "%s: DeepSeek-V4 is not supported on %s yet", dir,
                        be->ops->name);
    v4_model *m;
    di_status s = v4_model_bind(hp, st, dir, &m);
    if (s) return s;
    const di_v4_hparams *v = m->v;
    rope_inv_freq(&v->rope_main, v->rope_dim, m->inv_main);
    rope_inv_freq(&v->rope_compress, v->rope_dim, m->inv_comp);
    int64_t n1 = DI_MAX(v->head_dim, hp->hidden_size);
    m->ones = v4_own(m, di_malloc((size_t)n1 * sizeof(float)));
    if (!m->ones) {
        v4_model_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < n1; i++)
        m->ones[i] = 1.0f;
    *out = m;
    return DI_OK;
}

static void v4_free(void *weights) {
    v4_model_free(weights);
}

/* Cache per token of context (the compressed entries and indexer keys that grow) summed
 * over layers; the bounded window cost is logged by layer type. */
static void v4_info(const void *weights, di_model_info *out) {
    const v4_model *m = weights;
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    out->n_params_total = m->n_params_total;
    out->n_params_active = m->n_params_active;
    out->n_params_mtp = m->n_params_mtp;
    out->weight_bytes = m->weight_bytes;
    /* Per layer type: count, fixed bytes (ring + open compressor windows), growth. */
    double per_tok = 0.0, grow[3] = {0, 0, 0};
    int64_t count[3] = {0, 0, 0}, fixed[3] = {0, 0, 0};
    for (int64_t il = 0; il < hp->num_hidden_layers; il++) {
        int k = v->layer_kind[il];
        double g =
            di_v4_state_bytes_per_token(k, v->compress_rate[il], v->head_dim, v->index_head_dim);
        per_tok += g;
        grow[k] += g;
        count[k]++;
        fixed[k] += di_v4_state_fixed_bytes(k, v->compress_rate[il], v->sliding_window, v->head_dim,
                                            v->index_head_dim);
    }
    out->kv_bytes_per_token = (int64_t)ceil(per_tok);
    out->kv_fixed_bytes = fixed[0] + fixed[1] + fixed[2];
    static const char *names[3] = {"sliding", "csa", "hca"};
    size_t used = 0;
    for (int k = 0; k < 3; k++) {
        if (!count[k]) continue;
        int w = snprintf(out->kv_by_layer_type + used, sizeof out->kv_by_layer_type - used,
                         "%s%s x%lld: %.1f KiB fixed, %.1f B/token", used ? "; " : "", names[k],
                         (long long)count[k], (double)fixed[k] / 1024.0, grow[k]);
        if (w < 0 || (size_t)w >= sizeof out->kv_by_layer_type - used) break;
        used += (size_t)w;
    }
    snprintf(out->dtypes, sizeof out->dtypes, "%s", m->dtypes);
}

const di_arch_vtable di_arch_deepseek_v4 = {
    .name = "deepseek_v4",
    .load = v4_load,
    .free = v4_free,
    .info = v4_info,
    .state_create = v4_state_create,
    .state_free = v4_state_free,
    .forward = v4_forward,
    .batch_state_create = v4_batch_state_create,
    .batch_state_free = v4_batch_state_free,
    .forward_batch = v4_forward_batch,
    .replay_tokens = v4_replay_tokens,
    .prefix_cache_ok = v4_prefix_cache_ok,
    .block_multiple = v4_block_multiple,
};
