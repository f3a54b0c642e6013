/*
 * deepseek_v4.c -- the DeepSeek-V4 (Flash / Pro) forward pass: embedding into n_hc streams,
 * per sublayer mHC (mixing weights with Sinkhorn, collapse, attention or MoE, stream update),
 * and the head with its own stream collapse. Attention lives in deepseek_v4_attn.c, tensor
 * binding in deepseek_v4_weights.c, the paged entries and window slots in src/kv/v4_state.c.
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
 * Batches (the engine's runner, as in deepseek_v3.c): the tokens of several sequences are
 * packed into chunks of rows, so every projection, expert and the head read their weights
 * once per chunk; the compressed entries and indexer keys go to a paged pool through each
 * sequence's block table, the bounded window state to the sequence's slot, and the
 * per-sequence parts of attention run per segment (deepseek_v4_attn.c). A context is the
 * batch of one sequence over a pool of one block and one slot, so both paths are the same
 * code. Every row's result depends only on its own sequence (batch invariance).
 *
 * The forward pass allocates nothing: every buffer is carved at creation for C rows
 * (min(max_tokens, V4_MAX_CHUNK) for a context, min(max_batch_tokens, V4_MAX_BATCH_CHUNK)
 * for the engine); longer inputs run in chunks of C.
 */
#include "model/deepseek_v4.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define V4_MAX_CHUNK       128
#define V4_MAX_BATCH_CHUNK 256 /* rows per chunk of an engine batch */
#define V4_PI              3.14159265358979323846

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

/* cos, sin and -sin [n][rd / 2] for the positions pos[0 .. n). */
static void rope_tables(const float *inv, int64_t rd2, const int64_t *pos, int64_t n, float *cs,
                        float *sn, float *nsn) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t i = 0; i < rd2; i++) {
            float ang = (float)pos[t] * inv[i];
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

/* Least common multiple of the compress rates: block sizes must be a multiple of it. */
static int64_t rate_multiple(const v4_model *m) {
    int64_t r = 1;
    for (int64_t il = 0; il < m->hp->num_hidden_layers; il++) {
        if (m->v->layer_kind[il] == DI_V4_SLIDING) continue;
        int64_t a = r, b = m->v->compress_rate[il];
        while (b) {
            int64_t t = a % b;
            a = b;
            b = t;
        }
        r = r / a * m->v->compress_rate[il];
    }
    return r;
}

static void kv_free(v4_kv *kv) {
    if (!kv) return;
    di_v4_pool_free(&kv->pool);
    di_v4_slots_free(&kv->slots);
    di_free(kv);
}

/* The shared storage: n_blocks blocks of block_size positions and n_slots window states. */
static di_status kv_create(const v4_model *m, int64_t n_blocks, int64_t block_size, int64_t n_slots,
                           v4_kv **out) {
    const di_v4_hparams *v = m->v;
    const int64_t nl = m->hp->num_hidden_layers;
    v4_kv *kv = di_calloc(1, sizeof *kv);
    if (!kv) return di_error(DI_ERR_OUT_OF_MEMORY, "V4 state: out of memory");
    /* The rows live in the model's memory backend; a CPU model keeps them on the host. */
    const di_backend *be = m->be->ops->host_memory ? NULL : m->be;
    di_status st = di_v4_pool_init(&kv->pool, be, nl, v->layer_kind, v->compress_rate,
                                   v->head_dim, v->index_head_dim, n_blocks, block_size);
    if (!st)
        st = di_v4_slots_init(&kv->slots, be, n_slots, nl, v->layer_kind, v->compress_rate,
                              v->sliding_window, v->head_dim, v->index_head_dim);
    if (st) {
        kv_free(kv);
        return st;
    }
    *out = kv;
    return DI_OK;
}

static void ctx_free(v4_ctx *c) {
    if (!c) return;
    if (c->own_kv) kv_free(c->kv);
    if (c->dev) c->mem->ops->buf_free(c->mem->ctx, c->dev);
    di_aligned_free(c->host);
    di_free(c);
}

/* One buffer of the scratch: where its pointer goes and its size. */
typedef struct v4_buf {
    void **ptr;
    size_t bytes;
} v4_buf;

/* Carves the buffers of list[0 .. n) from one block (64-byte aligned each). */
static size_t bufs_total(const v4_buf *list, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++)
        t += (list[i].bytes + 63) & ~(size_t)63;
    return t;
}
static void bufs_carve(const v4_buf *list, int n, char *p) {
    for (int i = 0; i < n; i++)
        *list[i].ptr = carve(&p, list[i].bytes);
}

/* Scratch for chunks of `chunk` rows of sequences up to max_tokens positions, working on kv
 * (taken over when own_kv; on failure an owned kv is freed). Backend buffers come from the
 * model's memory backend, host-side ones from the heap (see v4_ctx). */
static di_status ctx_create(const v4_model *m, v4_kv *kv, bool own_kv, int64_t max_tokens,
                            int64_t chunk, v4_ctx **out) {
    const di_hparams *hp = m->hp;
    const di_v4_hparams *v = m->v;
    const di_backend *mem = m->be;
    const bool same = mem->ops->host_memory; /* mirrors are the buffers themselves */
    const int64_t D = hp->hidden_size, H = hp->num_attention_heads, d = v->head_dim;
    const int64_t n = v->hc_mult, E = hp->n_routed_experts, K = hp->num_experts_per_tok;
    const int64_t I = hp->moe_intermediate_size, nI = v->index_n_heads, dI = v->index_head_dim;
    const int64_t rd2 = v->rope_dim / 2, V = hp->vocab_size;
    v4_ctx *c = di_calloc(1, sizeof *c);
    if (!c) {
        if (own_kv) kv_free(kv);
        return di_error(DI_ERR_OUT_OF_MEMORY, "context: out of memory");
    }
    c->kv = kv;
    c->own_kv = own_kv;
    c->mem = mem;
    c->max_tokens = max_tokens;
    const int64_t C = c->chunk = chunk;

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
    c->scratch_rows = DI_MAX(C, 64);

    const size_t f = sizeof(float), pz = sizeof(void *), i32 = sizeof(int32_t);
    const size_t i64 = sizeof(int64_t);
    c->emit_bytes = 4 * m_max * pz + 2 * rd2 * f;
    c->klist_head = (C * i32 + 7) & ~(size_t)7;
    const v4_buf dev[] = {
        {(void **)&c->x, C * n * D * f},
        {(void **)&c->x2, C * n * D * f},
        {(void **)&c->h, C * D * f},
        {(void **)&c->xn, C * D * f},
        {(void **)&c->y, C * D * f},
        {(void **)&c->post, C * n * f},
        {(void **)&c->mix, C * n * n * f},
        {(void **)&c->qr, C * v->q_lora_rank * f},
        {(void **)&c->q, C * H * d * f},
        {(void **)&c->o, C * H * d * f},
        {(void **)&c->kvr, C * d * f},
        {(void **)&c->z, C * v->o_groups * v->o_lora_rank * f},
        {(void **)&c->rope, 6 * C * rd2 * f},
        {(void **)&c->cc, C * 2 * d * f},
        {(void **)&c->zz, C * 2 * d * f},
        {(void **)&c->ic, C * 2 * dI * f},
        {(void **)&c->iz, C * 2 * dI * f},
        {(void **)&c->qi, C * nI * dI * f},
        {(void **)&c->iw, C * nI * f},
        {(void **)&c->ikeys, ME * dI * f},
        {(void **)&c->irows, ME * i32},
        {(void **)&c->iscore, C * ME * f},
        {(void **)&c->ascratch, c->scratch_rows * MK * f},
        {(void **)&c->klist, c->klist_head + C * MK * pz},
        {(void **)&c->n_vis, C * i64},
        {(void **)&c->emit, c->emit_bytes},
        {(void **)&c->rlogits, C * E * f},
        {(void **)&c->gate, C * K * I * f},
        {(void **)&c->up, C * K * I * f},
        {(void **)&c->sgate, C * I * f},
        {(void **)&c->sup, C * I * f},
        {(void **)&c->xe, C * K * D * f},
        {(void **)&c->moe_out, C * D * f},
        {(void **)&c->eo, C * K * D * f},
        {(void **)&c->route, 3 * C * K * i32},
        {(void **)&c->r_off, (E + 1) * i32},
        {(void **)&c->r_active, (E + 1) * i32},
        {(void **)&c->r_scratch, 3 * E * f},
        {(void **)&c->ids_d, C * i32},
        {(void **)&c->logits, same ? 0 : C * V * f},
    };
    /* Host-side buffers; the mirrors (the last six) only when backend memory is not host. */
    const v4_buf host[] = {
        {(void **)&c->ids, C * i32},
        {(void **)&c->pos, C * i64},
        {(void **)&c->segs, C * sizeof(v4_seg)},
        {(void **)&c->sel, (size_t)DI_MAX(v->index_topk, 1) * i32},
        {(void **)&c->rope_h, 6 * C * rd2 * f},
        {(void **)&c->iscore_h, C * ME * f},
        {(void **)&c->klist_h, c->klist_head + C * MK * pz},
        {(void **)&c->n_vis_h, C * i64},
        {(void **)&c->emit_h, c->emit_bytes},
        {(void **)&c->irows_h, ME * i32},
    };
    const int n_dev = (int)DI_ARRAY_LEN(dev), n_host = (int)DI_ARRAY_LEN(host) - (same ? 6 : 0);
    const size_t dev_bytes = bufs_total(dev, n_dev), host_bytes = bufs_total(host, n_host);
    c->dev = mem->ops->buf_alloc(mem->ctx, dev_bytes); /* zero-filled */
    c->host = di_aligned_alloc(host_bytes);
    if (!c->dev || !c->host) {
        ctx_free(c);
        return di_error(DI_ERR_OUT_OF_MEMORY, "context: cannot allocate %zu + %zu bytes of buffers",
                        dev_bytes, host_bytes);
    }
    memset(c->host, 0, host_bytes);
    bufs_carve(dev, n_dev, c->dev);
    bufs_carve(host, n_host, c->host);
    if (same) {
        c->logits = NULL;
        c->rope_h = c->rope;
        c->iscore_h = c->iscore;
        c->klist_h = c->klist;
        c->n_vis_h = c->n_vis;
        c->emit_h = c->emit;
        c->irows_h = c->irows;
        c->ids_d = c->ids;
    }
    c->n_keys = (int32_t *)c->klist;
    c->keys = (const float **)((char *)c->klist + c->klist_head);
    c->n_keys_h = (int32_t *)c->klist_h;
    c->keys_h = (const float **)((char *)c->klist_h + c->klist_head);
    c->slot_c = (const float **)c->emit;
    c->slot_z = c->slot_c + 2 * m_max;
    c->ecs = (float *)(c->slot_z + 2 * m_max);
    c->slot_c_h = (const float **)c->emit_h;
    c->slot_z_h = c->slot_c_h + 2 * m_max;
    c->ecs_h = (float *)(c->slot_z_h + 2 * m_max);
    float **tabs[6] = {&c->cos_m, &c->sin_m, &c->nsin_m, &c->cos_c, &c->sin_c, &c->nsin_c};
    for (int i = 0; i < 6; i++)
        *tabs[i] = c->rope + i * C * rd2;
    *out = c;
    return DI_OK;
}

/* A context is the batch of one sequence in slot 0 over a pool of one block that holds the
 * whole context (rounded up to the rates' multiple), so both paths run the same code. */
static di_status v4_state_create(const void *weights, int64_t max_tokens, void **out) {
    const v4_model *m = weights;
    const int64_t mult = rate_multiple(m);
    v4_kv *kv;
    di_status st = kv_create(m, 1, (max_tokens + mult - 1) / mult * mult, 1, &kv);
    if (st) return st;
    return ctx_create(m, kv, true, max_tokens, DI_MIN(max_tokens, V4_MAX_CHUNK), (v4_ctx **)out);
}

static void v4_state_free(void *state) {
    ctx_free(state);
}

/* ---------------------------------------------------------------------------------------- */
/* MoE                                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Clamped SwiGLU expert over n rows of x -> y (gate, up: [n][I] scratch). */
static void expert(const v4_model *m, const v4_mlp *w, const di_backend *be, const float *x,
                   int64_t n, float *gate, float *up, float *y) {
    const int64_t I = w->w1.rows;
    v4_matmul(be, &w->w1, x, n, gate);
    v4_matmul(be, &w->w3, x, n, up);
    be->ops->v4_swiglu(be->ctx, gate, up, n * I, (float)m->v->swiglu_limit, gate);
    v4_matmul(be, &w->w2, gate, n, y);
}

/* MoE over c->xn -> c->y, all on the backend (no host round trip): moe_route selects (hash
 * layers: the token's tid2eid row) and groups the (token, slot) entries by expert, one gather
 * puts the rows in expert order, matmul_experts runs each active expert once over its rows
 * (gate, up, the clamped SwiGLU, down), and the combine sums each token's experts in slot
 * order, so no row depends on the grouping (batch invariance). The shared expert goes first,
 * into c->y, on the backend's second stream where it has one (side_begin): at one token the
 * routing is a chain of small kernels and the FP4 products do not fill the device's bandwidth
 * either; the combine adds the routed sum into its output after the join. */
static void moe(const v4_model *m, const v4_block *L, v4_ctx *c, const di_backend *be,
                int64_t n) {
    const di_hparams *hp = m->hp;
    const int64_t D = hp->hidden_size, K = hp->num_experts_per_tok;
    const int64_t I = hp->moe_intermediate_size, nk = n * K;
    const int64_t na = DI_MIN(hp->n_routed_experts, nk); /* most experts that can be active */
    void *bc = be->ctx;
    int32_t *src = c->route, *rows_of = src + nk;
    float *w = (float *)(rows_of + nk);
    const bool beside = be->ops->side_begin != NULL;
    if (beside) be->ops->side_begin(bc);
    expert(m, &L->shared, be, c->xn, n, c->sgate, c->sup, c->y);
    if (beside) be->ops->side_end(bc);

    v4_matmul(be, &L->gate, c->xn, n, c->rlogits);
    /* V4's rules (plain top-k of score + bias, always renormalised) are in the hparams. */
    di_moe_route_params rp = {.router = di_router_params_from_hparams(hp),
                              .n = n,
                              .logits = c->rlogits,
                              .scratch = c->r_scratch,
                              .offsets = c->r_off,
                              .active = c->r_active,
                              .src = src,
                              .rows_of = rows_of,
                              .w = w,
                              .hash_table = L->hash ? L->tid2eid : NULL,
                              .tokens = c->ids_d};
    rp.router.bias = L->gate_bias;
    be->ops->moe_route(bc, &rp);
    be->ops->copy_rows(bc, c->xe, D, NULL, c->xn, D, src, nk, D);
    be->ops->matmul_experts(bc, &L->x_gate, c->r_off, c->r_active, na, nk, c->xe, c->gate);
    be->ops->matmul_experts(bc, &L->x_up, c->r_off, c->r_active, na, nk, c->xe, c->up);
    be->ops->v4_swiglu(bc, c->gate, c->up, nk * I, (float)m->v->swiglu_limit, c->gate);
    be->ops->matmul_experts(bc, &L->x_down, c->r_off, c->r_active, na, nk, c->gate, c->eo);
    if (beside) be->ops->side_join(bc);
    if (be->ops->moe_combine_add) { /* the combine and the add below in one op, the same bits */
        be->ops->moe_combine_add(bc, c->eo, rows_of, w, n, K, D, NULL, c->y);
        return;
    }
    be->ops->moe_combine(bc, c->eo, rows_of, w, n, K, D, c->moe_out);
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

/* One chunk of n rows holding c->segs[0 .. n_segs). The logits rows of its sequences go to
 * logits[0 ..) in order; returns their count. */
static int64_t forward_chunk(const v4_model *m, v4_ctx *c, const di_backend *be, int64_t n,
                             float *logits) {
    const di_hparams *hp = m->hp;
    const int64_t D = hp->hidden_size, nh = m->v->hc_mult, rd2 = m->v->rope_dim / 2;
    void *bc = be->ctx;

    v4_up(be, c->ids_d, c->ids, (size_t)n * sizeof(int32_t));
    be->ops->embed(bc, &m->embed, c->ids_d, n, c->y);
    for (int64_t j = 0; j < nh; j++) /* every token's embedding into its stream j */
        be->ops->copy2d(bc, c->x + j * D, nh * D, c->y, D, n, D);
    /* The rope tables are built on the host and moved in one upload. */
    const int64_t tab = c->chunk * rd2;
    float *rt = c->rope_h;
    rope_tables(m->inv_main, rd2, c->pos, n, rt, rt + tab, rt + 2 * tab);
    rope_tables(m->inv_comp, rd2, c->pos, n, rt + 3 * tab, rt + 4 * tab, rt + 5 * tab);
    v4_up(be, c->rope, c->rope_h, (size_t)(6 * tab) * sizeof(float));

    for (int64_t il = 0; il < hp->num_hidden_layers; il++) {
        const v4_block *L = &m->blocks[il];
        hc_pre(m, c, be, n, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, L->attn_norm);
        v4_attention(m, L, il, c, be, n);
        hc_post(m, c, be, n);
        hc_pre(m, c, be, n, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, L->ffn_norm);
        moe(m, L, c, be, n);
        hc_post(m, c, be, n);
    }

    /* Gather the rows that need logits into x2 (free after the last hc_post). */
    int64_t k = 0;
    for (int64_t g = 0; g < c->n_segs; g++) {
        const v4_seg *sg = &c->segs[g];
        if (sg->lcnt <= 0) continue;
        be->ops->copy2d(bc, c->x2 + k * nh * D, nh * D, c->x + sg->lrow0 * nh * D, nh * D, sg->lcnt,
                        nh * D);
        k += sg->lcnt;
    }
    if (k == 0 || !logits) return k;

    /* Head: collapse with its own weights (no Sinkhorn), final norm, lm head. */
    di_v4_hc_params p = {.n_tokens = k,
                         .n_hc = nh,
                         .dim = D,
                         .x = c->x2,
                         .fn = m->hc_head_fn,
                         .base = m->hc_head_base,
                         .scale = m->hc_head_scale,
                         .iters = 0,
                         .eps = (float)hp->rms_norm_eps,
                         .hc_eps = (float)m->v->hc_eps,
                         .h = c->h};
    be->ops->v4_hc_pre(bc, &p);
    be->ops->rmsnorm(bc, c->h, D, m->norm, k, D, (float)hp->rms_norm_eps, c->xn, D);
    if (!c->logits) {
        v4_matmul(be, &m->head, c->xn, k, logits);
    } else {
        v4_matmul(be, &m->head, c->xn, k, c->logits);
        v4_down(be, logits, c->logits, (size_t)(k * hp->vocab_size) * sizeof(float));
    }
    return k;
}

/* Packs the batch's tokens into chunks of at most C rows (a sequence may span chunks: its
 * earlier rows are in its slot and the pool by then) and runs them. Every projection and
 * expert reads its weights once per chunk; the per-sequence parts run per segment. */
static void v4_forward_batch(const void *weights, void *state, const di_backend *be,
                             const di_batch_args *a) {
    const v4_model *m = weights;
    v4_ctx *c = state;
    const int64_t V = m->hp->vocab_size;
    int64_t rows = 0, lrow = 0;
    c->n_segs = 0;
    for (int64_t i = 0; i < a->n_seqs; i++) {
        const di_batch_seq *q = &a->seqs[i];
        assert(q->slot >= 0 && q->slot < c->kv->slots.n_slots);
        assert(q->n_replay >= 0 && q->n_replay <= q->n);
#ifndef NDEBUG
        /* The table covers the sequence's blocks, all inside the pool. */
        for (int64_t b = 0; b <= (q->pos0 + q->n - 1) / c->kv->pool.block_size; b++)
            assert(q->block_table[b] >= 0 && q->block_table[b] < c->kv->pool.n_blocks);
#endif
        di_v4_slot *slot = &c->kv->slots.slot[q->slot];
        if (q->reset_state) di_v4_slot_reset(slot, q->pos0);
        const int64_t lfirst = a->logits ? q->n - q->n_logits : q->n; /* seq token index */
        for (int64_t off = 0; off < q->n;) {
            int64_t take = DI_MIN(q->n - off, c->chunk - rows);
            v4_seg *sg = &c->segs[c->n_segs++];
            int64_t first = DI_MAX(lfirst, off);
            *sg = (v4_seg){.table = q->block_table,
                           .slot = slot,
                           .pos0 = q->pos0 + off,
                           .n = take,
                           .row0 = rows,
                           .replay_end = q->pos0 + q->n_replay,
                           .lrow0 = rows + first - off,
                           .lcnt = DI_MAX(off + take - first, 0)};
            for (int64_t t = 0; t < take; t++) {
                c->ids[rows + t] = q->ids[off + t];
                c->pos[rows + t] = q->pos0 + off + t;
            }
            rows += take, off += take;
            if (rows == c->chunk) {
                lrow += forward_chunk(m, c, be, rows, a->logits ? a->logits + lrow * V : NULL);
                rows = c->n_segs = 0;
            }
        }
    }
    if (rows > 0) forward_chunk(m, c, be, rows, a->logits ? a->logits + lrow * V : NULL);
}

static void v4_forward(const void *weights, void *state, const di_backend *be,
                       const di_forward_args *a) {
    v4_ctx *c = state;
    /* A call at position 0 starts a new sequence (di_context_reset rewinds to 0). */
    di_batch_seq q = {.ids = a->ids,
                      .n = a->n,
                      .pos0 = a->pos0,
                      .block_table = c->ctx_table,
                      .slot = 0,
                      .reset_state = a->pos0 == 0,
                      .n_logits = a->logits ? a->n_logits : 0};
    di_batch_args b = {.seqs = &q, .n_seqs = 1, .logits = a->logits};
    v4_forward_batch(weights, state, be, &b);
}

/* ---------------------------------------------------------------------------------------- */
/* Batched runner                                                                             */
/* ---------------------------------------------------------------------------------------- */

/* The engine's V4 state: the shared storage (paged entries over cfg's blocks, one window
 * slot per running sequence) and the scratch for chunks of up to V4_MAX_BATCH_CHUNK rows. */
static di_status v4_batch_state_create(const void *weights, const di_batch_config *cfg,
                                       void **out) {
    const v4_model *m = weights;
    /* A second state over another's pool and slots (disaggregated workers, model.h). */
    if (cfg->share) return v4_batch_state_create_shared(weights, (void *)cfg->share, cfg, out);
    v4_kv *kv;
    di_status st = kv_create(m, cfg->n_blocks, cfg->block_size, cfg->n_slots, &kv);
    if (st) return st;
    return ctx_create(m, kv, true, cfg->max_model_len,
                      DI_MAX(DI_MIN(cfg->max_batch_tokens, V4_MAX_BATCH_CHUNK), 1), (v4_ctx **)out);
}

/* A second runner state over the storage of `owner` (a state from v4_batch_state_create):
 * its own scratch for chunks of cfg's sizes, the same pool and slots. For two workers over
 * one KV pool (disaggregated prefill / decode); the owner must outlive it, and the two must
 * not run forwards on the same slot or write the same blocks at once. */
di_status v4_batch_state_create_shared(const void *weights, void *owner, const di_batch_config *cfg,
                                       void **out) {
    const v4_ctx *o = owner;
    if (cfg->block_size != o->kv->pool.block_size || cfg->n_blocks != o->kv->pool.n_blocks ||
        cfg->n_slots > o->kv->slots.n_slots)
        return di_error(DI_ERR_INVALID_ARG,
                        "engine: a shared V4 state needs the owner's pool (%lld blocks of %lld) "
                        "and at most its %lld slots",
                        (long long)o->kv->pool.n_blocks, (long long)o->kv->pool.block_size,
                        (long long)o->kv->slots.n_slots);
    return ctx_create(weights, o->kv, false, cfg->max_model_len,
                      DI_MAX(DI_MIN(cfg->max_batch_tokens, V4_MAX_BATCH_CHUNK), 1), (v4_ctx **)out);
}

/* Tokens to replay after a prefix-cache hit of H tokens (H a multiple of the block size,
 * hence of every rate) so that the window state at H is exactly the uninterrupted one; the
 * derivation is in docs/engine-design.md ("V4: window layers and bounded replay"). The
 * replay starts at S = H - R with the slot's base at S. The input of layer k at position p
 * is exact once p - S >= k (W - 1): layer 0's input is the embedding, and each window layer
 * reads the W - 1 positions before p of the layer below (entries come from the pool and
 * are exact). After the replay, layer k needs
 *   - its ring: K=V rows of positions H - W + 1 .. H - 1, so R >= (k + 1)(W - 1);
 *   - the overlapping (CSA) compressors: the c / z rows of the window before H, positions
 *     H - m .. H - 1, pooled into the first entry after H, so R >= m + k (W - 1);
 *   - the compressors' open window: empty at H (m divides H), so nothing more. */
static int64_t v4_replay_tokens(const void *weights) {
    const v4_model *m = weights;
    const int64_t W1 = m->v->sliding_window - 1;
    int64_t r = 0;
    for (int64_t k = 0; k < m->hp->num_hidden_layers; k++) {
        r = DI_MAX(r, (k + 1) * W1);
        if (m->v->layer_kind[k] == DI_V4_CSA) r = DI_MAX(r, m->v->compress_rate[k] + k * W1);
    }
    return r;
}

static bool v4_prefix_cache_ok(const void *weights) {
    (void)weights;
    return true; /* entries are paged; window state is rebuilt by the replay */
}

static int64_t v4_block_multiple(const void *weights) {
    return rate_multiple(weights);
}

/* ---------------------------------------------------------------------------------------- */
/* vtable                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static void v4_free(void *weights);

static di_status v4_load(const di_hparams *hp, const di_st_set *st, const char *dir,
                         const di_backend *be, void **out) {
    v4_model *m;
    di_status s = v4_model_bind(hp, st, dir, &m);
    if (s) return s;
    m->be = be;
    m->dev.be = be;
    const di_v4_hparams *v = m->v;
    rope_inv_freq(&v->rope_main, v->rope_dim, m->inv_main);
    rope_inv_freq(&v->rope_compress, v->rope_dim, m->inv_comp);
    int64_t n1 = DI_MAX(v->head_dim, hp->hidden_size);
    float *ones = v4_own(m, di_malloc((size_t)n1 * sizeof(float)));
    if (!ones) {
        v4_model_free(m);
        return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < n1; i++)
        ones[i] = 1.0f;
    m->ones = ones;
    s = v4_model_upload(m);
    if (!s) s = v4_model_expert_sets(m);
    if (s) {
        v4_free(m);
        return s;
    }
    *out = m;
    return DI_OK;
}

static void v4_free(void *weights) {
    if (weights) v4_model_release_device(weights);
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
    .batch_state_free = v4_state_free,
    .forward_batch = v4_forward_batch,
    .replay_tokens = v4_replay_tokens,
    .prefix_cache_ok = v4_prefix_cache_ok,
    .block_multiple = v4_block_multiple,
};
