/*
 * deepseek_v4_attn.c -- DeepSeek-V4 attention for one layer and one chunk of tokens:
 * sliding window, compressed sparse attention (CSA: overlapping compressor + Lightning
 * indexer top-k) and heavily compressed attention (HCA), over one shared K=V head with
 * per-head sinks, partial interleaved RoPE (inverse RoPE on the output) and the grouped
 * output projection. Semantics: docs/v4-reference-notes.md, "Attention".
 *
 * Chunks, sequences and state (why the result does not depend on how the input is split
 * or batched):
 *   - A chunk holds segments of one or more sequences (c->segs). Projections run over all
 *     rows; compressors, the indexer, key lists and the ring update run per segment.
 *   - A segment's K=V rows live in c->kvr while the chunk attends; its slot's ring still
 *     holds the W positions before the segment. Query p reads window position s from the
 *     chunk if s >= pos0 (the segment's first position), else from ring row s mod W
 *     (s > p - W >= pos0 - W, so the row still holds s). Positions below the slot's base
 *     (a replay started there) are not read. The ring is updated after the attention.
 *   - Compressor rows are stored at their position in the slot; the window a token
 *     completes emits its entry into the paged pool at once, before the chunk's attention,
 *     so query p sees exactly the entries w < (p + 1) / m whatever the chunking (n_vis[t]).
 *     Replay rows (positions below the segment's replay_end) rebuild the compressor rows
 *     but emit nothing: their entries exist in shared blocks.
 *   - Every key list is built in a fixed order (window by position, then entries by index)
 *     and every op is row-invariant, so a token's logits are bitwise the same in any chunk
 *     and next to any other sequences.
 *
 * Backend memory (CUDA): the rows (activations, pool, slots) live where the ops run; the
 * host keeps the bookkeeping and computes row addresses, never reading a row. Per layer it
 * uploads the key lists (row pointers) with their counts in one transfer; a CSA layer also
 * uploads the visible counts and, per sequence, the pool rows of the indexer keys it gathers
 * (one copy_rows), and downloads the indexer scores for the top-k; each emitted entry uploads
 * its pooling slots and rope angles in one transfer. The other row copies (compressor rows,
 * ring) are copy2d ops. On the CPU the mirrors are the buffers, nothing moves, and the
 * arithmetic is unchanged.
 */
#include "model/deepseek_v4.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void v4_matmul(const di_backend *be, const di_weight *w, const float *x, int64_t n, float *y) {
    if (w->dtype == DI_DTYPE_F4_E2M1)
        be->ops->matmul_fp4(be->ctx, w, x, n, y);
    else
        be->ops->matmul(be->ctx, w, x, n, y);
}

/* Rotates the trailing rd dims of n_heads vectors per token (interleaved pairs). */
static void rope(const v4_model *m, const di_backend *be, float *x, int64_t n, int64_t n_heads,
                 int64_t width, int64_t tstride, const float *cs, const float *sn) {
    const int64_t rd = m->v->rope_dim;
    di_rope_op_params p = {.x = x + (width - rd),
                           .n_tokens = n,
                           .n_heads = n_heads,
                           .rope_dim = rd,
                           .tstride = tstride,
                           .hstride = width,
                           .cos = cs,
                           .sin = sn,
                           .interleaved = true};
    be->ops->rope(be->ctx, &p);
}

/* ---------------------------------------------------------------------------------------- */
/* Compressor                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* Emits the entry of window w, which just completed in cs, into out ([width]): softmax
 * pooling over its slots (CSA: the previous window's first halves, then this window's
 * second halves), RMSNorm, RoPE (compress) at position w m. */
static void emit_entry(const v4_model *m, const v4_compressor *cw, const di_v4_comp_state *cs,
                       v4_ctx *c, const di_backend *be, int64_t w, float *out) {
    const int64_t mm = cs->m, width = cs->width;
    int64_t ns = 0;
    if (cs->overlap && w > 0)
        for (int64_t i = 0; i < mm; i++, ns++) {
            c->slot_c_h[ns] = di_v4_comp_c(cs, (w - 1) * mm + i);
            c->slot_z_h[ns] = di_v4_comp_z(cs, (w - 1) * mm + i);
        }
    const int64_t off = cs->overlap ? width : 0;
    for (int64_t i = 0; i < mm; i++, ns++) {
        c->slot_c_h[ns] = di_v4_comp_c(cs, w * mm + i) + off;
        c->slot_z_h[ns] = di_v4_comp_z(cs, w * mm + i) + off;
    }
    const int64_t rd2 = m->v->rope_dim / 2;
    for (int64_t i = 0; i < rd2; i++) {
        float ang = (float)(w * mm) * m->inv_comp[i];
        c->ecs_h[i] = (float)cos((double)ang);
        c->ecs_h[rd2 + i] = (float)sin((double)ang);
    }
    v4_up(be, c->emit, c->emit_h, c->emit_bytes); /* slots and angles: one transfer */
    di_v4_pool_params pp = {
        .n_slots = ns, .width = width, .c = c->slot_c, .z = c->slot_z, .out = out};
    be->ops->v4_pool(be->ctx, &pp);
    be->ops->rmsnorm(be->ctx, out, width, cw->norm, 1, width, (float)m->hp->rms_norm_eps, out,
                     width);
    rope(m, be, out, 1, 1, width, width, c->ecs, c->ecs + rd2);
}

/* Stores one segment's compressor rows (cc, zz: [n][cw], the segment's rows) in the slot
 * and emits the entry of every window they complete into the pool (index keys when
 * `index`), except for replay positions. n_vis (or NULL) gets each row's visible count. */
static void run_compressor(const v4_model *m, const v4_compressor *cw, const di_v4_comp_state *cs,
                           int64_t il, bool index, const v4_seg *sg, v4_ctx *c,
                           const di_backend *be, const float *cc, const float *zz, int64_t *n_vis) {
    const int64_t w_ = cs->cw, mm = cs->m;
    const di_v4_pool *pool = &c->kv->pool;
    for (int64_t t = 0; t < sg->n; t++) {
        const int64_t p = sg->pos0 + t;
        float *rc = di_v4_comp_c(cs, p), *rz = di_v4_comp_z(cs, p);
        be->ops->copy2d(be->ctx, rc, w_, cc + t * w_, w_, 1, w_);
        /* rz = zz + ape: the copy, then + 1 * ape (the same rounding as the sum). */
        be->ops->copy2d(be->ctx, rz, w_, zz + t * w_, w_, 1, w_);
        be->ops->axpy(be->ctx, 1.0f, cw->ape + (p % mm) * w_, w_, rz);
        if (p % mm == mm - 1 && p >= sg->replay_end) {
            const int64_t w = p / mm;
            /* The rows pooled must be this sequence's: the replay reached back far enough
             * (v4_replay_tokens) for the windows it emits after the replay. */
            assert(w * mm >= sg->slot->base &&
                   (!cs->overlap || w == 0 || (w - 1) * mm >= sg->slot->base));
            float *out = index ? di_v4_pool_ientry(pool, il, sg->table, w)
                               : di_v4_pool_entry(pool, il, sg->table, w);
            emit_entry(m, cw, cs, c, be, w, out);
        }
        if (n_vis) n_vis[t] = (p + 1) / mm;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Lightning indexer                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Heap order: a ranks below b if its score is lower, or equal with a higher index (torch's
 * top-k ties are avoided by the goldens; lower index first is our rule). */
static bool below(const float *s, int32_t a, int32_t b) {
    return s[a] < s[b] || (s[a] == s[b] && a > b);
}

static void sift_down(int32_t *hp, int64_t n, int64_t i, const float *s) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, lo = i;
        if (l < n && below(s, hp[l], hp[lo])) lo = l;
        if (r < n && below(s, hp[r], hp[lo])) lo = r;
        if (lo == i) return;
        int32_t tmp = hp[i];
        hp[i] = hp[lo];
        hp[lo] = tmp;
        i = lo;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The k best of scores[0, nv) into sel (ascending entry index); returns k. A min-heap of
 * the current best k: O(nv log k) per query. */
static int64_t top_k(const float *scores, int64_t nv, int64_t k, int32_t *sel) {
    if (k > nv) k = nv;
    for (int64_t i = 0; i < k; i++)
        sel[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        sift_down(sel, k, i, scores);
    for (int64_t w = k; w < nv; w++) {
        if (!below(scores, sel[0], (int32_t)w)) continue;
        sel[0] = (int32_t)w;
        sift_down(sel, k, 0, scores);
    }
    qsort(sel, (size_t)k, sizeof *sel, cmp_i32);
    return k;
}

/* ---------------------------------------------------------------------------------------- */
/* Attention                                                                                  */
/* ---------------------------------------------------------------------------------------- */

void v4_attention(const v4_model *m, const v4_block *L, int64_t il, v4_ctx *c, const di_backend *be,
                  int64_t n) {
    const di_v4_hparams *v = m->v;
    const int64_t H = m->hp->num_attention_heads, d = v->head_dim, W = v->sliding_window;
    const int64_t ql = v->q_lora_rank, g = v->o_groups, r = v->o_lora_rank;
    const float eps = (float)m->hp->rms_norm_eps;
    const bool comp = L->kind != DI_V4_SLIDING, csa = L->kind == DI_V4_CSA;
    const float *cs = comp ? c->cos_c : c->cos_m, *sn = comp ? c->sin_c : c->sin_m;
    const float *nsn = comp ? c->nsin_c : c->nsin_m;
    const di_v4_pool *pool = &c->kv->pool;
    void *bc = be->ctx;

    /* 1. Queries: q LoRA (normed), heads normalised without weight, RoPE at t. */
    v4_matmul(be, &L->wq_a, c->xn, n, c->qr);
    be->ops->rmsnorm(bc, c->qr, ql, L->q_norm, n, ql, eps, c->qr, ql);
    v4_matmul(be, &L->wq_b, c->qr, n, c->q);
    be->ops->rmsnorm(bc, c->q, d, m->ones, n * H, d, eps, c->q, d);
    rope(m, be, c->q, n, H, d, H * d, cs, sn);

    /* 2. The shared K=V row of each token. */
    v4_matmul(be, &L->wkv, c->xn, n, c->kvr);
    be->ops->rmsnorm(bc, c->kvr, d, L->kv_norm, n, d, eps, c->kvr, d);
    rope(m, be, c->kvr, n, 1, d, d, cs, sn);

    /* 3. Compressed entries (and indexer keys) of every window this chunk completes. */
    if (comp) {
        const v4_compressor *cp = &L->comp;
        const int64_t cw = cp->cw;
        v4_matmul(be, &cp->wkv, c->xn, n, c->cc);
        v4_matmul(be, &cp->wgate, c->xn, n, c->zz);
        if (csa) {
            v4_matmul(be, &L->icomp.wkv, c->xn, n, c->ic);
            v4_matmul(be, &L->icomp.wgate, c->xn, n, c->iz);
        }
        for (int64_t gi = 0; gi < c->n_segs; gi++) {
            const v4_seg *sg = &c->segs[gi];
            const di_v4_slot_layer *S = &sg->slot->layers[il];
            run_compressor(m, cp, &S->comp, il, false, sg, c, be, c->cc + sg->row0 * cw,
                           c->zz + sg->row0 * cw, c->n_vis_h + sg->row0);
            if (csa) {
                const int64_t icw = L->icomp.cw;
                run_compressor(m, &L->icomp, &S->icomp, il, true, sg, c, be, c->ic + sg->row0 * icw,
                               c->iz + sg->row0 * icw, NULL);
            }
        }
        /* only the indexer reads them on the backend (HCA key lists are built here) */
        if (csa) v4_up(be, c->n_vis, c->n_vis_h, (size_t)n * sizeof(int64_t));
    }

    /* 4. Indexer scores of the visible entries (CSA), per sequence over its gathered keys. */
    if (csa) {
        const int64_t nI = v->index_n_heads, dI = v->index_head_dim;
        v4_matmul(be, &L->idx_wq_b, c->qr, n, c->qi);
        rope(m, be, c->qi, n, nI, dI, nI * dI, cs, sn);
        v4_matmul(be, &L->idx_weights, c->xn, n, c->iw);
        for (int64_t gi = 0; gi < c->n_segs; gi++) {
            const v4_seg *sg = &c->segs[gi];
            const int64_t nv = c->n_vis_h[sg->row0 + sg->n - 1]; /* the most any row sees */
            /* The keys gathered in one op (their pool rows up in one transfer): a copy per
             * key was a launch per visible entry on a GPU, every layer, every token. */
            for (int64_t w = 0; w < nv; w++) {
                const int64_t row = di_v4_pool_row(pool, il, sg->table, w);
                assert(row <= INT32_MAX); /* copy_rows takes 32-bit rows */
                c->irows_h[w] = (int32_t)row;
            }
            v4_up(be, c->irows, c->irows_h, (size_t)nv * sizeof(int32_t));
            be->ops->copy_rows(bc, c->ikeys, dI, NULL, pool->layers[il].ientries, dI, c->irows,
                               nv, dI);
            di_v4_index_params ip = {.n_tokens = sg->n,
                                     .n_heads = nI,
                                     .dim = dI,
                                     .scale = (float)(1.0 / sqrt((double)nI) / sqrt((double)dI)),
                                     .q = c->qi + sg->row0 * nI * dI,
                                     .weights = c->iw + sg->row0 * nI,
                                     .keys = c->ikeys,
                                     .n_visible = c->n_vis + sg->row0,
                                     .out = c->iscore + sg->row0 * c->max_entries,
                                     .out_stride = c->max_entries};
            be->ops->v4_index_scores(bc, &ip);
        }
        v4_down(be, c->iscore_h, c->iscore, (size_t)(n * c->max_entries) * sizeof(float));
    }

    /* 5. Key lists: window (by position), then the visible / selected entries. */
    for (int64_t gi = 0; gi < c->n_segs; gi++) {
        const v4_seg *sg = &c->segs[gi];
        const float *ring = sg->slot->layers[il].ring;
        for (int64_t t = 0; t < sg->n; t++) {
            const int64_t p = sg->pos0 + t, row = sg->row0 + t;
            const float **k = c->keys_h + row * c->max_keys;
            int64_t nk = 0;
            /* Outside replay the window never reaches below the slot's base. */
            assert(p < sg->replay_end || DI_MAX(0, p - W + 1) >= sg->slot->base);
            for (int64_t s = DI_MAX(sg->slot->base, p - W + 1); s <= p; s++)
                k[nk++] = s >= sg->pos0 ? c->kvr + (row + s - p) * d : ring + (s % W) * d;
            if (csa) {
                int64_t ns = top_k(c->iscore_h + row * c->max_entries, c->n_vis_h[row],
                                   v->index_topk, c->sel);
                for (int64_t i = 0; i < ns; i++)
                    k[nk++] = di_v4_pool_entry(pool, il, sg->table, c->sel[i]);
            } else if (comp) {
                for (int64_t w = 0; w < c->n_vis_h[row]; w++)
                    k[nk++] = di_v4_pool_entry(pool, il, sg->table, w);
            }
            c->n_keys_h[row] = (int32_t)nk;
        }
    }
    v4_up(be, c->klist, c->klist_h, c->klist_head + (size_t)(n * c->max_keys) * sizeof(float *));

    di_v4_attn_params ap = {.n_tokens = n,
                            .n_heads = H,
                            .dim = d,
                            .scale = (float)(1.0 / sqrt((double)d)),
                            .q = c->q,
                            .q_tstride = H * d,
                            .sinks = L->sinks,
                            .keys = c->keys,
                            .n_keys = c->n_keys,
                            .max_keys = c->max_keys,
                            .out = c->o,
                            .out_tstride = H * d,
                            .scratch = c->ascratch,
                            .scratch_rows = c->scratch_rows};
    be->ops->v4_attention(bc, &ap);

    /* Each ring now takes its segment's last W rows (after every query has read it): at most
     * two copies, the rows up to the ring's end and those wrapping to its start. */
    for (int64_t gi = 0; gi < c->n_segs; gi++) {
        const v4_seg *sg = &c->segs[gi];
        float *ring = sg->slot->layers[il].ring;
        for (int64_t t = DI_MAX(0, sg->n - W); t < sg->n;) {
            const int64_t slot = (sg->pos0 + t) % W, len = DI_MIN(sg->n - t, W - slot);
            be->ops->copy2d(bc, ring + slot * d, d, c->kvr + (sg->row0 + t) * d, d, len, d);
            t += len;
        }
    }

    /* 6. Inverse RoPE at t (values carried rope), grouped output projection. */
    rope(m, be, c->o, n, H, d, H * d, cs, nsn);
    di_head_matmul_params gp = {.w = L->wo_a_group,
                                .transposed = false,
                                .n_heads = g,
                                .n_tokens = n,
                                .x = c->o,
                                .x_hstride = H * d / g,
                                .x_tstride = H * d,
                                .y = c->z,
                                .y_hstride = r,
                                .y_tstride = g * r};
    be->ops->head_matmul(bc, &gp);
    v4_matmul(be, &L->wo_b, c->z, n, c->y);
}
