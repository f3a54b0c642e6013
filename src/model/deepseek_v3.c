/*
 * deepseek_v3.c -- the DeepSeek-V2 / V3 forward pass (MLA + DeepSeekMoE), written once
 * against the backend op interface.
 *
 * Semantics follow transformers 5.17 (modeling_deepseek_v2.py / modeling_deepseek_v3.py):
 *   - RMSNorm in float; q_a_layernorm and kv_a_layernorm use eps 1e-6 (transformers builds
 *     them without config.rms_norm_eps), the others rms_norm_eps.
 *   - RoPE over the qk_rope_head_dim slice. V2 always rotates adjacent pairs (complex
 *     multiply); V3 rotates adjacent pairs when rope_interleave (transformers de-interleaves
 *     first, which changes no q.k product) and rotate_half pairs otherwise. Inverse
 *     frequencies as modeling_rope_utils computes them (default / linear / YaRN with truncate),
 *     YaRN's attention_factor multiplied into cos and sin.
 *   - Softmax scale qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 when the rope
 *     type is not "default" and mscale_all_dim is set (the same rule in V2 and V3).
 *   - MoE layers are those with il >= first_k_dense_replace (and il % moe_layer_freq == 0);
 *     router logits in float from the gate weight; the backend's moe_route op picks experts
 *     by di_router_select's rules (the per-family ones, e.g. V2 never renormalising, live in
 *     di_router_params_from_hparams).
 *
 * Attention runs in absorbed form (see cpu_attention.c): the cache holds only the normed
 * latent c_kv and the rotated k_rope of each token; per head, q_nope is mapped into the
 * latent space through W_UK (matmul_t over a row view of kv_b_proj), and the attention's
 * latent output is mapped back through W_UV.
 *
 * MoE on a batch: tokens are grouped by expert (on the backend) so that each active expert's
 * weights are read once per chunk; each token's routed output is then summed in the order of
 * its selected experts, so the result does not depend on how tokens were grouped (batch
 * invariance).
 *
 * Batches: the engine's runner packs the tokens of several sequences into chunks of rows, so
 * every projection and expert reads its weights once per chunk; the latent rows go to a paged
 * pool through each sequence's block table and attention runs per sequence over it (the
 * block-table form of the MLA op). A context is the batch of one sequence over a pool of one
 * block, so both paths are the same code. Every per-row result depends only on that row's
 * sequence (batch invariance: kernels are row-invariant, MoE sums in slot order, attention
 * per sequence), which the engine tests check bitwise.
 *
 * The forward pass allocates nothing: every buffer is carved at state creation from
 * (chunk = min(max_tokens, DS_MAX_CHUNK)) rows, and longer inputs run in chunks.
 */
#include "model/deepseek_v3.h"
#include "sample/sampler.h"
#include "kv/mla_cache.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define DS_MAX_CHUNK 128
/* Rows per chunk of an engine batch. A chunk reads every weight once, so on a GPU larger
 * chunks amortise the experts' reads over more tokens: on the H200, the 27-layer V2-Lite
 * benchmark at 64 concurrent (512-token prefill steps) got its first tokens at p50 115 ms with
 * one chunk per step against 136 ms with two of 256 rows, and 2 % more output tokens/s
 * (src/backend/cuda/NOTES.md, eighteenth round). */
#define DS_MAX_BATCH_CHUNK 256
/* On a backend with its own memory, and with a chunk's routed entries (rows x top_k) within
 * what its moe_route takes (DI_BACKEND_ROUTE_ENTRIES: 1365 rows at V2's top-6, 1024 at V3's
 * top-8). */
#define DS_MAX_DEVICE_CHUNK 2048
#define DS_LATENT_NORM_EPS  1e-6f
#define DS_PI               3.14159265358979323846

/* ---------------------------------------------------------------------------------------- */
/* RoPE tables and softmax scale (transformers' formulas)                                     */
/* ---------------------------------------------------------------------------------------- */

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rot, double dim, double base, double max_pos) {
    return dim * log(max_pos / (rot * 2.0 * DS_PI)) / (2.0 * log(base));
}

/* Fills inv_freq, rope_attn_factor, softmax_scale and rope_interleaved. */
void ds_rope_setup(ds_model *m) {
    const di_hparams *hp = m->hp;
    const di_rope_params *rp = &hp->rope;
    const int64_t dim = hp->qk_rope_head_dim, half = dim / 2;
    const float base = (float)rp->theta;
    float pos_freq[256];
    for (int64_t i = 0; i < half; i++) {
        pos_freq[i] = powf(base, (float)(2 * i) / (float)dim);
        m->inv_freq[i] = 1.0f / pos_freq[i];
    }
    m->rope_attn_factor = 1.0f;
    double factor = rp->factor;
    if (rp->scaling == DI_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++)
            m->inv_freq[i] /= (float)factor;
    } else if (rp->scaling == DI_ROPE_YARN) {
        double orig = (double)rp->original_max_position_embeddings;
        if (orig <= 0) orig = (double)hp->max_position_embeddings;
        if (!(factor > 0)) factor = (double)hp->max_position_embeddings / orig;
        double af = rp->attention_factor;
        if (!(af > 0)) {
            if (rp->mscale != 0 && rp->mscale_all_dim != 0)
                af = yarn_get_mscale(factor, rp->mscale) /
                     yarn_get_mscale(factor, rp->mscale_all_dim);
            else
                af = yarn_get_mscale(factor, 1.0);
        }
        m->rope_attn_factor = (float)af;
        double beta_fast = rp->beta_fast != 0 ? rp->beta_fast : 32.0;
        double beta_slow = rp->beta_slow != 0 ? rp->beta_slow : 1.0;
        double low = yarn_correction_dim(beta_fast, (double)dim, rp->theta, orig);
        double high = yarn_correction_dim(beta_slow, (double)dim, rp->theta, orig);
        if (rp->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        low = DI_MAX(low, 0.0);
        high = DI_MIN(high, (double)(dim - 1));
        if (low == high) high += 0.001;
        for (int64_t i = 0; i < half; i++) {
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extrap_factor = 1.0f - ramp;
            float extrap = 1.0f / pos_freq[i];
            float interp = 1.0f / ((float)factor * pos_freq[i]);
            m->inv_freq[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
        }
    }
    double scale = 1.0 / sqrt((double)(hp->qk_nope_head_dim + hp->qk_rope_head_dim));
    if (rp->scaling != DI_ROPE_NONE && rp->mscale_all_dim != 0) {
        double ms = yarn_get_mscale(factor, rp->mscale_all_dim);
        scale = scale * ms * ms;
    }
    m->softmax_scale = (float)scale;
    m->rope_interleaved = hp->family == DI_FAMILY_DEEPSEEK_V2 ? true : hp->rope_interleave;
}

/* cos/sin [half] of position pos, as float32 like transformers. */
static void rope_row(const ds_model *m, int64_t pos, float *cs, float *sn) {
    const int64_t half = m->hp->qk_rope_head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float ang = (float)pos * m->inv_freq[i];
        cs[i] = (float)cos((double)ang) * m->rope_attn_factor;
        sn[i] = (float)sin((double)ang) * m->rope_attn_factor;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Per-sequence state                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* The part of one sequence that falls into a chunk of rows. */
typedef struct ds_seg {
    const di_batch_seq *seq;
    int64_t off;          /* index in seq->ids of the segment's first token */
    int64_t n;            /* tokens */
    int64_t row0;         /* first chunk row */
    const int32_t *table; /* the sequence's block table in backend memory (chunk inputs) */
} ds_seg;

/* One state serves both paths: a context is a batch of one sequence whose block table is
 * {0} with block_size = capacity, so the single-sequence and the engine's paged path run the
 * same code and give bitwise equal results.
 *
 * Memory: the pool and every activation buffer are backend memory (allocated through the
 * model's memory backend); the host keeps only what it builds: the chunk's inputs before
 * their upload. Routing and grouping run on the backend (no per-layer round trip). */
typedef struct ds_state {
    const di_backend *mem;     /* the model's memory backend: allocated the buffers below */
    di_mla_cache cache;        /* the row pool: [n_layers][capacity] rows */
    bool cache_shared;         /* borrowed from another state (di_batch_config.share) */
    int64_t expert_loads;      /* distinct experts per chunk and MoE layer (take_expert_loads) */
    int64_t block_size;        /* rows per block of the pool */
    int32_t ctx_table[1];      /* {0}: the context path's block table */
    int64_t max_tokens, chunk; /* chunk = C below */
    int64_t max_blocks;        /* block-table entries of the longest sequence */
    /* backend memory, one allocation (dev) */
    void *dev;
    float *x;             /* [C][H] residual stream */
    float *xn;            /* [C][H] normed input of a block */
    float *qa;            /* [C][q_lora_rank] */
    float *q;             /* [C][nh][dn + dr] */
    float *kva;           /* [C][R + dr] kv_a_proj_with_mqa output */
    float *q_lat;         /* [nh][C][R] absorbed queries */
    float *o_lat;         /* [nh][C][R] attention output in latent space */
    float *attn;          /* [C][nh * dv] o_proj input */
    float *hbuf;          /* [C][H] block output before the residual add; in a MoE layer the
                           * shared experts' output, waiting for the routed ones' */
    float *gate, *up;     /* [C][max_inter] */
    float *rlogits;       /* [C][E] router logits */
    float *xe;            /* [C K][H] routed inputs, grouped by expert */
    float *xg, *xu;       /* [C K][I] routed gate / up products, grouped by expert */
    float *eo;            /* [C K][H] routed outputs, grouped by expert */
    float *moe_out;       /* [C][H] */
    float *logits;        /* [C][V] unless backend memory is host memory (then NULL) */
    int32_t *tokens;      /* [C] each logits row's token (argmax_rows or sample_rows) */
    int32_t *prev_tokens; /* [C] a deferred step's tokens, for the next step's pending ids */
    di_sample_row *srows; /* [C] sample_rows' parameters (staged in srows_h) */
    int32_t *in;          /* chunk inputs (in_words 4-byte words, layout in pack_inputs) */
    /* routing (moe_route's outputs): offsets [E + 1], active [E + 1], src / rows_of [C K],
     * weights [C K], router scratch [3 E] */
    int32_t *r_off, *r_active, *r_src, *r_rows;
    float *r_w, *r_scratch;
    /* host memory, one allocation (host) */
    void *host;
    int32_t *in_h; /* staging of `in` */
    int64_t in_words;
    ds_seg *segs;           /* [C] sequences in the chunk */
    di_sample_row *srows_h; /* [C] staging of srows */
    /* views into `in` for the current chunk (set by pack_inputs) */
    const int32_t *ids;
    const float *cos, *sin;     /* [n][dr / 2] */
    const int32_t *wsrc, *wdst; /* [nw] chunk rows -> pool rows of the new tokens */
    int64_t nw;
    /* decode: a decode chunk (one token per sequence). pos, toff: each row's position, and
     * where its block table starts among the tables, for one attention call over all rows
     * (a decode chunk's, or on a device a chunk of several sequences: attention()) */
    bool decode;
    const int32_t *pos, *toff, *tables;
    /* The engine's overlap loop (di_batch_args): may_defer, the batch may be deferred (one
     * chunk); pending, its ids < 0 are the previous step's tokens (prev_tokens). */
    bool may_defer, pending;
    /* Captured decode steps (CUDA graphs), one per row count n <= C (graphs[n]), made on
     * first use; graphs_off after a capture failed (the ops then run one by one). */
    void **graphs;
    bool graphs_off;
} ds_state;

static void *carve(char **p, size_t bytes) {
    void *r = *p;
    *p += (bytes + 63) & ~(size_t)63;
    return r;
}

static size_t total_of(const size_t *sizes, size_t n) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += (sizes[i] + 63) & ~(size_t)63;
    return total;
}

static void ds_state_free(void *state) {
    ds_state *s = state;
    if (!s) return;
    if (!s->cache_shared) di_mla_cache_free(&s->cache);
    for (int64_t n = 0; s->graphs && n <= s->chunk; n++)
        if (s->graphs[n]) s->mem->ops->graph_free(s->mem->ctx, s->graphs[n]);
    di_free(s->graphs);
    if (s->dev) s->mem->ops->buf_free(s->mem->ctx, s->dev);
    di_aligned_free(s->host);
    di_free(s);
}

/* rows: rows of the pool per layer; chunk: rows per forward chunk. */
static di_status state_create(const void *weights, int64_t rows, int64_t block_size,
                              int64_t max_tokens, int64_t chunk, const ds_state *share,
                              void **out) {
    const ds_model *m = weights;
    const di_hparams *hp = m->hp;
    const di_backend *mem = m->be;
    const int64_t H = hp->hidden_size, nh = hp->num_attention_heads, R = hp->kv_lora_rank;
    const int64_t dn = hp->qk_nope_head_dim, dr = hp->qk_rope_head_dim, dv = hp->v_head_dim;
    const int64_t E = DI_MAX(hp->n_routed_experts, 1), K = DI_MAX(hp->num_experts_per_tok, 1);
    const int64_t V = hp->vocab_size, I = DI_MAX(hp->moe_intermediate_size, 1);
    ds_state *s = di_calloc(1, sizeof *s);
    if (!s) return di_error(DI_ERR_OUT_OF_MEMORY, "context: out of memory");
    s->mem = mem;
    s->max_tokens = max_tokens;
    s->block_size = block_size;
    s->max_blocks = (max_tokens + block_size - 1) / block_size;
    const int64_t C = s->chunk = chunk;
    /* ids, cos, sin, write rows (src, dst), each row's position and table offset, then one
     * block table per segment */
    s->in_words = C * (1 + dr + 4) + C * s->max_blocks;
    di_status st = DI_OK;
    if (share) { /* the same pool: rows written by one state are read by the other */
        if (share->cache.capacity != rows || share->block_size != block_size)
            st = di_error(DI_ERR_INVALID_ARG,
                          "batch state: the shared pool has %lld rows in blocks of %lld, "
                          "this state needs %lld in blocks of %lld",
                          (long long)share->cache.capacity, (long long)share->block_size,
                          (long long)rows, (long long)block_size);
        s->cache = share->cache;
        s->cache_shared = true;
    } else {
        st = di_mla_cache_init(&s->cache, mem, hp->num_hidden_layers, rows, R, dr);
    }
    if (st) {
        di_free(s);
        return st;
    }
    const size_t f = sizeof(float), w4 = sizeof(int32_t);
    const size_t dsizes[] = {C * H * f,
                             C * H * f,
                             C * DI_MAX(hp->q_lora_rank, 1) * f,
                             C * nh * (dn + dr) * f,
                             C * (R + dr) * f,
                             nh * C * R * f,
                             nh * C * R * f,
                             C * nh * dv * f,
                             C * H * f,
                             C * m->max_inter * f,
                             C * m->max_inter * f,
                             C * E * f,
                             C * K * H * f,
                             C * K * I * f,
                             C * K * I * f,
                             C * K * H * f,
                             C * H * f,
                             mem->ops->host_memory ? 0 : C * V * f,
                             C * w4,
                             C * w4,
                             C * sizeof(di_sample_row),
                             s->in_words * w4,
                             (E + 1) * w4,
                             (E + 1) * w4,
                             C * K * w4,
                             C * K * w4,
                             C * K * f,
                             3 * E * f};
    const size_t hsizes[] = {s->in_words * w4, C * sizeof(ds_seg), C * sizeof(di_sample_row)};
    const size_t dtotal = total_of(dsizes, DI_ARRAY_LEN(dsizes));
    const size_t htotal = total_of(hsizes, DI_ARRAY_LEN(hsizes));
    s->dev = mem->ops->buf_alloc(mem->ctx, dtotal);
    s->host = di_aligned_alloc(htotal);
    if (!s->dev || !s->host) {
        ds_state_free(s);
        return di_error(DI_ERR_OUT_OF_MEMORY,
                        "context: cannot allocate %zu bytes of buffers on %s and %zu on the "
                        "host",
                        dtotal, mem->ops->name, htotal);
    }
    memset(s->host, 0, htotal);
    char *p = s->dev;
    size_t k = 0;
    s->x = carve(&p, dsizes[k++]);
    s->xn = carve(&p, dsizes[k++]);
    s->qa = carve(&p, dsizes[k++]);
    s->q = carve(&p, dsizes[k++]);
    s->kva = carve(&p, dsizes[k++]);
    s->q_lat = carve(&p, dsizes[k++]);
    s->o_lat = carve(&p, dsizes[k++]);
    s->attn = carve(&p, dsizes[k++]);
    s->hbuf = carve(&p, dsizes[k++]);
    s->gate = carve(&p, dsizes[k++]);
    s->up = carve(&p, dsizes[k++]);
    s->rlogits = carve(&p, dsizes[k++]);
    s->xe = carve(&p, dsizes[k++]);
    s->xg = carve(&p, dsizes[k++]);
    s->xu = carve(&p, dsizes[k++]);
    s->eo = carve(&p, dsizes[k++]);
    s->moe_out = carve(&p, dsizes[k++]);
    s->logits = mem->ops->host_memory ? (k++, NULL) : carve(&p, dsizes[k++]);
    s->tokens = carve(&p, dsizes[k++]);
    s->prev_tokens = carve(&p, dsizes[k++]);
    s->srows = carve(&p, dsizes[k++]);
    s->in = carve(&p, dsizes[k++]);
    s->r_off = carve(&p, dsizes[k++]);
    s->r_active = carve(&p, dsizes[k++]);
    s->r_src = carve(&p, dsizes[k++]);
    s->r_rows = carve(&p, dsizes[k++]);
    s->r_w = carve(&p, dsizes[k++]);
    s->r_scratch = carve(&p, dsizes[k++]);
    p = s->host;
    k = 0;
    s->in_h = carve(&p, hsizes[k++]);
    s->segs = carve(&p, hsizes[k++]);
    s->srows_h = carve(&p, hsizes[k++]);
    s->graphs = di_calloc((size_t)(C + 1), sizeof(void *));
    if (!s->graphs) {
        ds_state_free(s);
        return di_error(DI_ERR_OUT_OF_MEMORY, "context: out of memory");
    }
    *out = s;
    return DI_OK;
}

static di_status ds_state_create(const void *weights, int64_t max_tokens, void **out) {
    return state_create(weights, max_tokens, max_tokens, max_tokens,
                        DI_MIN(max_tokens, DS_MAX_CHUNK), NULL, out);
}

static di_status ds_batch_state_create(const void *weights, const di_batch_config *cfg,
                                       void **out) {
    const ds_model *m = weights;
    int64_t rows = cfg->n_blocks * cfg->block_size;
    int64_t cap = m->be->ops->host_memory ? DS_MAX_BATCH_CHUNK : DS_MAX_DEVICE_CHUNK;
    const int64_t top_k = DI_MAX(m->hp->num_experts_per_tok, 1);
    if (!m->be->ops->host_memory) cap = DI_MIN(cap, DI_BACKEND_ROUTE_ENTRIES / top_k);
    return state_create(weights, rows, cfg->block_size, cfg->max_model_len,
                        DI_MAX(DI_MIN(cfg->max_batch_tokens, cap), 1), cfg->share, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Blocks                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* y += W x, rounded as matmul into tmp then axpy(1, tmp, y): one launch where the backend
 * has matmul_add. */
static void matmul_add(const di_backend *be, const di_weight *w, const float *x, int64_t n,
                       float *tmp, float *y) {
    if (be->ops->matmul_add) {
        be->ops->matmul_add(be->ctx, w, x, n, y);
        return;
    }
    be->ops->matmul(be->ctx, w, x, n, tmp);
    be->ops->axpy(be->ctx, 1.0f, tmp, n * w->rows, y);
}

/* MLA for the chunk's n rows (s->nseg sequences): reads s->xn, writes the new tokens' latent
 * and rope-key rows into the paged pool through each sequence's block table, and adds its
 * output ([n][H]) to the residual stream s->x. Projections (W_UK and W_UV included) run over
 * all rows at once; the absorbed attention runs per sequence (in one call where that can be
 * one launch: below). */
static void attention(const ds_model *m, const ds_layer *L, int64_t il, ds_state *s,
                      const di_backend *be, int64_t n, int64_t nseg) {
    const di_hparams *hp = m->hp;
    const int64_t nh = hp->num_attention_heads, R = hp->kv_lora_rank, dv = hp->v_head_dim;
    const int64_t dn = hp->qk_nope_head_dim, dr = hp->qk_rope_head_dim, qk = dn + dr;
    const int64_t bs = s->block_size;
    void *c = be->ctx;
    (void)il;

    /* Latent (normed) and rotated rope key of each new token, into the pool: one op where
     * the backend has mla_store, else normed and rotated in place and copied. On a backend
     * with a second stream (side_begin) this branch runs there, beside the queries' chain
     * below, until the attention needs the pool (side_join): at a few tokens both chains
     * are short kernels that leave most of the device idle. */
    const bool beside = be->ops->side_begin != NULL;
    if (beside) be->ops->side_begin(c);
    be->ops->matmul(c, &L->kv_a_proj, s->xn, n, s->kva);
    float *ckv = di_mla_cache_ckv(&s->cache, il, 0);  /* [rows][R] */
    float *kr = di_mla_cache_krope(&s->cache, il, 0); /* [rows][dr] */
    const bool store = be->ops->mla_store != NULL;
    if (store) {
        di_mla_store_params sp = {.kva = s->kva,
                                  .R = R,
                                  .dr = dr,
                                  .norm_w = L->kv_a_norm,
                                  .eps = DS_LATENT_NORM_EPS,
                                  .cos = s->cos,
                                  .sin = s->sin,
                                  .interleaved = m->rope_interleaved,
                                  .src_rows = s->wsrc,
                                  .dst_rows = s->wdst,
                                  .n_rows = s->nw,
                                  .ckv = ckv,
                                  .krope = kr};
        be->ops->mla_store(c, &sp);
    } else {
        be->ops->rmsnorm(c, s->kva, R + dr, L->kv_a_norm, n, R, DS_LATENT_NORM_EPS, s->kva, R + dr);
        di_rope_op_params rk = {.x = s->kva + R,
                                .n_tokens = n,
                                .n_heads = 1,
                                .rope_dim = dr,
                                .tstride = R + dr,
                                .hstride = 0,
                                .cos = s->cos,
                                .sin = s->sin,
                                .interleaved = m->rope_interleaved};
        be->ops->rope(c, &rk);
        /* The new tokens' rows (not the replayed ones) into the pool: a gather-scatter each. */
        be->ops->copy_rows(c, ckv, R, s->wdst, s->kva, R + dr, s->wsrc, s->nw, R);
        be->ops->copy_rows(c, kr, dr, s->wdst, s->kva + R, R + dr, s->wsrc, s->nw, dr);
    }
    if (beside) be->ops->side_end(c);

    /* Queries: [n][nh][dn + dr]. */
    if (hp->q_lora_rank > 0) {
        be->ops->matmul(c, &L->q_a_proj, s->xn, n, s->qa);
        be->ops->rmsnorm(c, s->qa, hp->q_lora_rank, L->q_a_norm, n, hp->q_lora_rank,
                         DS_LATENT_NORM_EPS, s->qa, hp->q_lora_rank);
        be->ops->matmul(c, &L->q_b_proj, s->qa, n, s->q);
    } else {
        be->ops->matmul(c, &L->q_proj, s->xn, n, s->q);
    }
    /* Their rope parts rotated here, or by the attention as it reads them (one launch fewer
     * on the queries' critical path; the same bits). */
    const bool rotates = be->ops->mla_attention_rotates;
    if (!rotates) {
        di_rope_op_params rq = {.x = s->q + dn,
                                .n_tokens = n,
                                .n_heads = nh,
                                .rope_dim = dr,
                                .tstride = nh * qk,
                                .hstride = qk,
                                .cos = s->cos,
                                .sin = s->sin,
                                .interleaved = m->rope_interleaved};
        be->ops->rope(c, &rq);
    }

    /* Absorb W_UK over all rows: q_lat(h, t) = W_UK_h^T q_nope(h, t)  ([dn] -> [R]); from the
     * transposed copy where the backend has one (a plain product per head). */
    di_head_matmul_params uk = {.w = L->w_ukt ? L->w_ukt : L->w_uk,
                                .transposed = !L->w_ukt,
                                .n_heads = nh,
                                .n_tokens = n,
                                .x = s->q,
                                .x_hstride = qk,
                                .x_tstride = nh * qk,
                                .y = s->q_lat,
                                .y_hstride = n * R,
                                .y_tstride = R};
    be->ops->head_matmul(c, &uk);

    /* Attention per sequence, over its own rows of the pool. A decode chunk (one row per
     * sequence) is one call, each row's position and block table read from backend memory;
     * so is a chunk of several sequences on a backend with its own memory (each row a query
     * of its own: the same bits as its sequence's call, one launch instead of one per
     * sequence -- on the H200 a 256-row prefill of 16 prompts took 16 launches of 9 us per
     * layer, then one of 38 us). A host-memory backend (the CPU) keeps the call per sequence,
     * which spreads a long prompt's queries over its threads. */
    if (beside) be->ops->side_join(c); /* the new rows are in the pool */
    const bool one_call = s->decode || (nseg > 1 && !be->ops->host_memory);
    if (one_call) {
        di_mla_attn_params ap = {.n_tokens = n,
                                 .n_heads = nh,
                                 .kv_lora_rank = R,
                                 .rope_dim = dr,
                                 .scale = m->softmax_scale,
                                 .q_lat = s->q_lat,
                                 .q_rope = s->q + dn,
                                 .q_rope_tstride = nh * qk,
                                 .q_rope_hstride = qk,
                                 .c_kv = ckv,
                                 .k_rope = kr,
                                 .out = s->o_lat,
                                 .block_size = bs,
                                 .q_lat_hstride = n * R,
                                 .out_hstride = n * R,
                                 .q_pos = s->pos,
                                 .q_tables = s->tables,
                                 .q_table_off = s->toff,
                                 .q_cos = rotates ? s->cos : NULL,
                                 .q_sin = rotates ? s->sin : NULL,
                                 .q_rope_interleaved = m->rope_interleaved};
        be->ops->mla_attention(c, &ap);
    }
    for (int64_t g = 0; !one_call && g < nseg; g++) {
        const ds_seg *sg = &s->segs[g];
        di_mla_attn_params ap = {.n_tokens = sg->n,
                                 .n_heads = nh,
                                 .pos0 = sg->seq->pos0 + sg->off,
                                 .kv_lora_rank = R,
                                 .rope_dim = dr,
                                 .scale = m->softmax_scale,
                                 .q_lat = s->q_lat + sg->row0 * R,
                                 .q_rope = s->q + sg->row0 * nh * qk + dn,
                                 .q_rope_tstride = nh * qk,
                                 .q_rope_hstride = qk,
                                 .c_kv = ckv,
                                 .k_rope = kr,
                                 .out = s->o_lat + sg->row0 * R,
                                 .block_table = sg->table,
                                 .block_size = bs,
                                 .q_lat_hstride = n * R,
                                 .out_hstride = n * R,
                                 .q_cos = rotates ? s->cos + sg->row0 * (dr / 2) : NULL,
                                 .q_sin = rotates ? s->sin + sg->row0 * (dr / 2) : NULL,
                                 .q_rope_interleaved = m->rope_interleaved};
        be->ops->mla_attention(c, &ap);
    }

    /* Un-absorb W_UV over all rows: attn(t, h) = W_UV_h o_lat(h, t)  ([R] -> [dv]). */
    di_head_matmul_params uv = {.w = L->w_uv,
                                .transposed = false,
                                .n_heads = nh,
                                .n_tokens = n,
                                .x = s->o_lat,
                                .x_hstride = n * R,
                                .x_tstride = R,
                                .y = s->attn,
                                .y_hstride = dv,
                                .y_tstride = nh * dv};
    be->ops->head_matmul(c, &uv);
    matmul_add(be, &L->o_proj, s->attn, n, s->hbuf, s->x);
}

/* silu(gate x) * (up x) over n rows of x ([n][H]) into s->gate. */
static void swiglu(const ds_mlp *w, ds_state *s, const di_backend *be, const float *x, int64_t n) {
    void *c = be->ctx;
    if (be->ops->matmul_glu) {
        be->ops->matmul_glu(c, &w->gate, &w->up, x, n, s->gate);
    } else {
        be->ops->matmul(c, &w->gate, x, n, s->gate);
        be->ops->matmul(c, &w->up, x, n, s->up);
        be->ops->silu_mul(c, s->gate, s->up, n * w->gate.rows, s->gate);
    }
}

/* SwiGLU MLP over n rows of x ([n][H]), added to y ([n][H]). */
static void mlp(const ds_mlp *w, ds_state *s, const di_backend *be, const float *x, int64_t n,
                float *y) {
    swiglu(w, s, be, x, n);
    matmul_add(be, &w->down, s->gate, n, s->hbuf, y);
}

/* DeepSeekMoE over s->xn: routed experts grouped by expert, plus shared experts, added to
 * the residual stream s->x ([n][H]). With next_norm (the next layer's first RMSNorm weight, or
 * NULL) a backend that has moe_combine_add_norm also writes that norm of the new s->x into
 * s->xn: then it returns true, and the caller skips that rmsnorm. Everything stays on the
 * backend: moe_route selects and groups (the offsets and the active-expert list live in
 * backend memory), the routed rows are read in expert order through moe_route's src list (the
 * fused gate / up product reads them in place where it can; else one gather op),
 * matmul_experts runs each active expert once over its rows (gate, up, then down), and the
 * combine sums each token's outputs in its slot order, so the result does not depend on the
 * grouping (batch invariance).
 *
 * The shared experts come first, into s->hbuf, added after the combine (the arithmetic of
 * matmul_add into the combined rows). On a backend with a second stream (side_begin) they
 * run there, beside the routing and the routed experts: at one token the routing is a chain
 * of small kernels that leaves the device's bandwidth mostly idle. */
static bool moe(const ds_model *m, const ds_layer *L, ds_state *s, const di_backend *be, int64_t n,
                const float *next_norm) {
    const di_hparams *hp = m->hp;
    const int64_t H = hp->hidden_size, K = hp->num_experts_per_tok;
    const int64_t nk = n * K, I = hp->moe_intermediate_size;
    const int64_t na = DI_MIN(hp->n_routed_experts, nk); /* most experts that can be active */
    void *c = be->ctx;
    const bool beside = L->has_shared && be->ops->side_begin;
    const float *shared = L->has_shared ? s->hbuf : NULL;
    if (beside) be->ops->side_begin(c);
    if (shared) {
        swiglu(&L->shared, s, be, s->xn, n);
        be->ops->matmul(c, &L->shared.down, s->gate, n, s->hbuf);
    }
    if (beside) be->ops->side_end(c);

    be->ops->matmul(c, &L->router, s->xn, n, s->rlogits);
    di_moe_route_params rp = {.router = m->router,
                              .n = n,
                              .logits = s->rlogits,
                              .scratch = s->r_scratch,
                              .offsets = s->r_off,
                              .active = s->r_active,
                              .src = s->r_src,
                              .rows_of = s->r_rows,
                              .w = s->r_w};
    rp.router.bias = L->router_bias;
    be->ops->moe_route(c, &rp);
    /* On a host-memory backend the op has run: count the experts this chunk reads. */
    if (be->ops->host_memory) s->expert_loads += s->r_active[0];

    if (be->ops->matmul_experts_glu) { /* the routed rows read in place, or gathered into xe */
        be->ops->matmul_experts_glu(c, &L->x_gate, &L->x_up, s->r_off, s->r_active, na, nk, s->xn,
                                    s->r_src, s->xe, s->xg);
    } else {
        be->ops->copy_rows(c, s->xe, H, NULL, s->xn, H, s->r_src, nk, H);
        be->ops->matmul_experts(c, &L->x_gate, s->r_off, s->r_active, na, nk, s->xe, s->xg);
        be->ops->matmul_experts(c, &L->x_up, s->r_off, s->r_active, na, nk, s->xe, s->xu);
        be->ops->silu_mul(c, s->xg, s->xu, nk * I, s->xg);
    }
    be->ops->matmul_experts(c, &L->x_down, s->r_off, s->r_active, na, nk, s->xg, s->eo);
    if (beside) be->ops->side_join(c);
    if (next_norm && be->ops->moe_combine_add_norm) { /* and the next norm: the same bits */
        be->ops->moe_combine_add_norm(c, s->eo, s->r_rows, s->r_w, n, K, H, shared, s->x, next_norm,
                                      (float)hp->rms_norm_eps, s->xn);
        return true;
    }
    if (be->ops->moe_combine_add) { /* one op, the same bits */
        be->ops->moe_combine_add(c, s->eo, s->r_rows, s->r_w, n, K, H, shared, s->x);
        return false;
    }
    be->ops->moe_combine(c, s->eo, s->r_rows, s->r_w, n, K, H, s->moe_out);
    if (shared) be->ops->axpy(c, 1.0f, shared, n * H, s->moe_out);
    be->ops->axpy(c, 1.0f, s->moe_out, n * H, s->x);
    return false;
}

/* Builds the chunk's small inputs on the host and uploads them in one transfer (without
 * waiting where `async`: a deferred step): token ids, rope cos/sin, the pool rows of the new
 * tokens, and each segment's block table. Pending ids (s->pending: < 0) are then resolved on
 * the backend from the previous step's tokens. Sets the views into s->in that the blocks
 * read. */
static void pack_inputs(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                        int64_t nseg, bool async) {
    const int64_t half = m->hp->qk_rope_head_dim / 2, bs = s->block_size;
    int32_t *h = s->in_h;
    int32_t *ids = h;
    float *cs = (float *)(ids + n), *sn = cs + n * half;
    int32_t *wsrc = (int32_t *)(sn + n * half), *wdst = wsrc + n;
    int32_t *qpos = wdst + n, *toff = qpos + n;
    int32_t *tab = toff + n;
    int64_t nw = 0;
    bool pending = false;
    for (int64_t g = 0; g < nseg; g++) {
        const ds_seg *sg = &s->segs[g];
        for (int64_t t = 0; t < sg->n; t++) {
            int64_t r = sg->row0 + t, pos = sg->seq->pos0 + sg->off + t;
            ids[r] = sg->seq->ids[sg->off + t];
            pending |= ids[r] < 0;
            rope_row(m, pos, cs + r * half, sn + r * half);
            if (sg->off + t < sg->seq->n_replay) continue; /* rows exist, maybe shared */
            wsrc[nw] = (int32_t)r;
            wdst[nw] = (int32_t)((int64_t)sg->seq->block_table[pos / bs] * bs + pos % bs);
            nw++;
        }
    }
    /* Block tables after the write rows; also each row's position and the offset of its
     * segment's table, for an attention call over all rows (see attention()). */
    int64_t used = tab - h;
    for (int64_t g = 0; g < nseg; g++) {
        ds_seg *sg = &s->segs[g];
        int64_t nb = (sg->seq->pos0 + sg->off + sg->n + bs - 1) / bs;
        memcpy(h + used, sg->seq->block_table, (size_t)nb * sizeof(int32_t));
        sg->table = s->in + used;
        for (int64_t t = 0; t < sg->n; t++) {
            qpos[sg->row0 + t] = (int32_t)(sg->seq->pos0 + sg->off + t);
            toff[sg->row0 + t] = (int32_t)(used - (tab - h));
        }
        used += nb;
    }
    (async ? be->ops->upload_async : be->ops->upload)(be->ctx, s->in, h,
                                                      (size_t)used * sizeof(int32_t));
    if (pending && s->pending) be->ops->resolve_ids(be->ctx, s->in, n, s->prev_tokens);
    s->ids = s->in;
    s->cos = (const float *)(s->in + n);
    s->sin = s->cos + n * half;
    s->wsrc = (const int32_t *)(s->sin + n * half);
    s->wdst = s->wsrc + n;
    s->pos = s->wdst + n;
    s->toff = s->pos + n;
    s->tables = s->toff + n;
    s->nw = nw;
}

/* Is the chunk a decode step: one new token per sequence, each wanting its logits, none
 * replayed? Then row g is segment g, the attention runs in one call and the step can be
 * captured once per row count (its shapes and buffers are then fixed). */
static bool is_decode(const ds_state *s, int64_t n, int64_t nseg) {
    if (nseg != n) return false;
    for (int64_t g = 0; g < nseg; g++) {
        const ds_seg *sg = &s->segs[g];
        if (sg->n != 1 || sg->off != 0 || sg->seq->n != 1 || sg->seq->n_logits < 1 ||
            sg->seq->n_replay > 0)
            return false;
    }
    return true;
}

/* The layers over the chunk's rows, then the final norm of the rows that need logits into
 * s->xn (returns their count; their lm_head product is the caller's). */
static int64_t forward_layers(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                              int64_t nseg) {
    const di_hparams *hp = m->hp;
    const int64_t H = hp->hidden_size;
    const float eps = (float)hp->rms_norm_eps;
    void *c = be->ctx;

    be->ops->embed(c, &m->embed, s->ids, n, s->x);
    const int64_t nl = hp->num_hidden_layers;
    bool normed = false; /* s->xn holds the norm the next step needs (a MoE layer's end) */
    for (int64_t il = 0; il < nl; il++) {
        const ds_layer *L = &m->layers[il];
        if (!normed) be->ops->rmsnorm(c, s->x, H, L->attn_norm, n, H, eps, s->xn, H);
        attention(m, L, il, s, be, n, nseg); /* adds its output to s->x */

        be->ops->rmsnorm(c, s->x, H, L->ffn_norm, n, H, eps, s->xn, H);
        normed = false;
        if (L->is_moe) {
            /* the next layer's attention norm, or a decode step's final norm (every row) */
            const float *next = il + 1 < nl ? m->layers[il + 1].attn_norm
                                : s->decode ? m->norm
                                            : NULL;
            normed = moe(m, L, s, be, n, next);
        } else {
            mlp(&L->dense, s, be, s->xn, n, s->x);
        }
    }
    if (s->decode) { /* every row, in order */
        if (!normed) be->ops->rmsnorm(c, s->x, H, m->norm, n, H, eps, s->xn, H);
        return n;
    }
    /* Gather the rows that need logits (final norm per row). */
    int64_t k = 0;
    for (int64_t g = 0; g < nseg; g++) {
        const ds_seg *sg = &s->segs[g];
        int64_t first = DI_MAX(sg->seq->n - sg->seq->n_logits, sg->off); /* seq token index */
        int64_t cnt = sg->off + sg->n - first;
        if (cnt <= 0) continue;
        be->ops->rmsnorm(c, s->x + (sg->row0 + first - sg->off) * H, H, m->norm, cnt, H, eps,
                         s->xn + k * H, H);
        k += cnt;
    }
    return k;
}

/* A decode step on a backend with graphs: the step's ops (layers and lm_head into s->logits)
 * are captured the first time a row count n comes, then replayed; the inputs were uploaded
 * into the fixed buffers already. Returns false where no graph can be used (the caller then
 * runs the ops directly). */
static bool forward_graph(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                          int64_t nseg) {
    if (!s->decode || s->graphs_off || !be->ops->graph_begin || be->ops->host_memory) return false;
    void *c = be->ctx;
    if (!s->graphs[n]) {
        be->ops->graph_begin(c);
        int64_t k = forward_layers(m, s, be, n, nseg);
        be->ops->matmul(c, &m->lm_head, s->xn, k, s->logits);
        if (be->ops->argmax_rows)
            be->ops->argmax_rows(c, s->logits, k, m->hp->vocab_size, s->tokens);
        if (be->ops->graph_end(c, &s->graphs[n]) != DI_OK) {
            s->graphs_off = true; /* e.g. a backend op that cannot be captured */
            return false;
        }
    }
    be->ops->graph_launch(c, s->graphs[n]);
    return true;
}

/* The n logits rows of a decode step (in s->logits; their argmax already in s->tokens where
 * the backend has argmax_rows) to the host, or only their tokens: when every row is
 * device_draw and greedy, the argmax; when every row is device_draw and the backend draws
 * (sample_rows; the parameters staged by stage_draw), the draw -- n ints instead of n V floats, the
 * step's largest transfer. All rows otherwise, or when a row's token is -1 (NaN, +inf: the host
 * sampler then reports the row). */
/* Do the decode step's n rows all qualify for the argmax (device_draw and greedy)? */
static bool all_greedy(const ds_state *s, const di_backend *be, int64_t n, const int32_t *tokens) {
    bool greedy = tokens && be->ops->argmax_rows;
    for (int64_t g = 0; greedy && g < n; g++)
        greedy = s->segs[g].seq->device_draw &&
                 s->segs[g].seq->sample.temperature < DI_SAMPLING_GREEDY_EPS;
    return greedy;
}

/* Will a decode step's rows be drawn on the device (every row device_draw, not every row
 * greedy, the backend draws)? */
static bool all_drawn(const ds_state *s, const di_backend *be, int64_t n, const int32_t *tokens) {
    bool drawn = tokens && be->ops->sample_rows && !all_greedy(s, be, n, tokens);
    for (int64_t g = 0; drawn && g < n; g++)
        drawn = s->segs[g].seq->device_draw;
    return drawn;
}

/* Before a decode step's forward: when its rows will be drawn on the device, their
 * parameters go up now, with the inputs (without waiting where `async`), so that the draw
 * after the forward waits for nothing. Returns whether they did. */
static bool stage_draw(ds_state *s, const di_backend *be, int64_t n, const int32_t *tokens,
                       bool async) {
    if (!all_drawn(s, be, n, tokens)) return false;
    for (int64_t g = 0; g < n; g++)
        s->srows_h[g] = s->segs[g].seq->sample;
    return (async ? be->ops->upload_async : be->ops->upload)(be->ctx, s->srows, s->srows_h,
                                                             (size_t)n * sizeof *s->srows) == DI_OK;
}

static void fetch_decode(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                         float *logits, int32_t *tokens, bool staged) {
    const int64_t V = m->hp->vocab_size;
    void *c = be->ctx;
    bool greedy = all_greedy(s, be, n, tokens);
    if (!greedy && staged) {
        be->ops->sample_rows(c, s->logits, n, V, s->srows, s->tokens);
        greedy = true; /* s->tokens holds the rows' tokens now */
    }
    if (greedy && be->ops->download(c, tokens, s->tokens, (size_t)n * sizeof(int32_t)) == DI_OK) {
        bool all = true;
        for (int64_t g = 0; g < n; g++)
            all &= tokens[g] >= 0;
        if (all) return;
        for (int64_t g = 0; g < n; g++)
            tokens[g] = -1;
    }
    be->ops->download(c, logits, s->logits, (size_t)(n * V) * sizeof(float));
}

/* A decode step enqueued without waiting (di_batch_args.defer; every row's token comes from
 * the device): the inputs through upload_async, the step (its graph where the backend has
 * them), the rows' tokens, a copy of them for the next step's pending ids, and their download
 * into tokens[], which *ticket's fence_wait completes. */
static int64_t forward_deferred(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                                int64_t nseg, float *logits, int32_t *tokens, int64_t *ticket) {
    const int64_t V = m->hp->vocab_size;
    void *c = be->ctx;
    pack_inputs(m, s, be, n, nseg, true);
    const bool staged = stage_draw(s, be, n, tokens, true);
    if (!forward_graph(m, s, be, n, nseg)) {
        forward_layers(m, s, be, n, nseg);
        be->ops->matmul(c, &m->lm_head, s->xn, n, s->logits);
        if (be->ops->argmax_rows) be->ops->argmax_rows(c, s->logits, n, V, s->tokens);
    }
    if (staged) be->ops->sample_rows(c, s->logits, n, V, s->srows, s->tokens);
    /* a byte copy (copy2d moves floats' bytes unchanged) */
    be->ops->copy2d(c, (float *)s->prev_tokens, n, (const float *)s->tokens, n, 1, n);
    if (be->ops->download_async(c, tokens, s->tokens, (size_t)n * sizeof(int32_t)) == DI_OK) {
        *ticket = be->ops->fence(c);
    } else { /* then the rows, and the host sampler (the same tokens) */
        for (int64_t g = 0; g < n; g++)
            tokens[g] = -1;
        be->ops->download(c, logits, s->logits, (size_t)(n * V) * sizeof(float));
        *ticket = 0;
    }
    return n;
}

/* One chunk of n <= C rows holding s->segs[0 .. nseg). The logits rows of its sequences
 * (each one's last n_logits tokens) go to logits[0 ..) (host memory), in order, or for a
 * decode step possibly only their tokens to tokens[0 ..) (fetch_decode); returns their
 * count. */
static int64_t forward_chunk(const ds_model *m, ds_state *s, const di_backend *be, int64_t n,
                             int64_t nseg, float *logits, int32_t *tokens, int64_t *ticket) {
    const int64_t V = m->hp->vocab_size;
    void *c = be->ctx;

    s->decode = logits && is_decode(s, n, nseg);
    if (s->decode && s->may_defer && (all_greedy(s, be, n, tokens) || all_drawn(s, be, n, tokens)))
        return forward_deferred(m, s, be, n, nseg, logits, tokens, ticket);
    pack_inputs(m, s, be, n, nseg, false);
    const bool staged = s->decode && !be->ops->host_memory && stage_draw(s, be, n, tokens, false);
    if (s->decode && forward_graph(m, s, be, n, nseg)) {
        fetch_decode(m, s, be, n, logits, tokens, staged);
        return n;
    }
    int64_t k = forward_layers(m, s, be, n, nseg);
    if (k > 0 && logits) {
        if (be->ops->host_memory) {
            be->ops->matmul(c, &m->lm_head, s->xn, k, logits);
        } else {
            be->ops->matmul(c, &m->lm_head, s->xn, k, s->logits);
            if (s->decode && (be->ops->argmax_rows || be->ops->sample_rows)) {
                if (be->ops->argmax_rows) be->ops->argmax_rows(c, s->logits, k, V, s->tokens);
                fetch_decode(m, s, be, n, logits, tokens, staged);
            } else {
                be->ops->download(c, logits, s->logits, (size_t)(k * V) * sizeof(float));
            }
        }
    }
    return k;
}

/* Packs the batch's tokens into chunks of at most C rows (a sequence may span chunks: its
 * earlier rows are in the pool by then) and runs them. */
static void ds_forward_batch(const void *weights, void *state, const di_backend *be,
                             const di_batch_args *a) {
    const ds_model *m = weights;
    ds_state *s = state;
    const int64_t V = m->hp->vocab_size;
    int64_t rows = 0, nseg = 0, lrow = 0, n_rows = 0;
    for (int64_t i = 0; i < a->n_seqs; i++)
        n_rows += a->seqs[i].n;
    int64_t *ticket = a->ticket;
    if (ticket) *ticket = 0;
    const di_backend_ops *o = be->ops;
    s->may_defer = a->defer && ticket && n_rows <= s->chunk && !o->host_memory && o->fence &&
                   o->fence_wait && o->upload_async && o->download_async && o->resolve_ids;
    s->pending = a->pending_on_device;
    for (int64_t i = 0; i < a->n_seqs; i++) {
        const di_batch_seq *q = &a->seqs[i];
        for (int64_t off = 0; off < q->n;) {
            int64_t take = DI_MIN(q->n - off, s->chunk - rows);
            s->segs[nseg] = (ds_seg){.seq = q, .off = off, .n = take, .row0 = rows};
            nseg++, rows += take, off += take;
            if (rows == s->chunk) {
                lrow += forward_chunk(m, s, be, rows, nseg, a->logits ? a->logits + lrow * V : NULL,
                                      a->tokens ? a->tokens + lrow : NULL, ticket);
                rows = nseg = 0;
            }
        }
    }
    if (rows > 0)
        forward_chunk(m, s, be, rows, nseg, a->logits ? a->logits + lrow * V : NULL,
                      a->tokens ? a->tokens + lrow : NULL, ticket);
    s->may_defer = s->pending = false;
}

static void ds_forward(const void *weights, void *state, const di_backend *be,
                       const di_forward_args *a) {
    ds_state *s = state;
    di_batch_seq q = {.ids = a->ids,
                      .n = a->n,
                      .pos0 = a->pos0,
                      .block_table = s->ctx_table,
                      .n_logits = a->logits ? a->n_logits : 0};
    di_batch_args b = {.seqs = &q, .n_seqs = 1, .logits = a->logits};
    ds_forward_batch(weights, state, be, &b);
}

static int64_t ds_replay_tokens(const void *weights) {
    (void)weights;
    return 0;
}

static bool ds_prefix_cache_ok(const void *weights) {
    (void)weights;
    return true;
}

static int64_t ds_take_expert_loads(void *state) {
    ds_state *s = state;
    int64_t n = s->expert_loads;
    s->expert_loads = 0;
    return n;
}

static int64_t ds_block_multiple(const void *weights) {
    (void)weights;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* vtable                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static di_status ds_load(const di_hparams *hp, const di_st_set *st, const char *dir,
                         const di_backend *be, void **out) {
    if (hp->qk_rope_head_dim / 2 > 256)
        return di_error(DI_ERR_UNSUPPORTED, "config.json: qk_rope_head_dim %lld is too large",
                        (long long)hp->qk_rope_head_dim);
    ds_model *m;
    di_status s = ds_model_bind(hp, st, dir, &m);
    if (s) return s;
    m->qk_head_dim = hp->qk_nope_head_dim + hp->qk_rope_head_dim;
    m->max_inter =
        DI_MAX(hp->intermediate_size, hp->moe_intermediate_size * DI_MAX(hp->n_shared_experts, 1));
    m->router = di_router_params_from_hparams(hp);
    ds_rope_setup(m);
    m->be = be;
    m->dev.be = be;
    s = ds_model_upload(m);
    if (!s) s = ds_model_expert_sets(m);
    if (s) {
        ds_model_free(m);
        return di_error_prefix(s, "%s", dir);
    }
    *out = m;
    return DI_OK;
}

static void ds_free(void *weights) {
    ds_model_free(weights);
}

static void ds_info(const void *weights, di_model_info *out) {
    const ds_model *m = weights;
    const di_hparams *hp = m->hp;
    out->n_params_total = m->n_params_total;
    out->n_params_active = m->n_params_active;
    out->n_params_mtp = m->n_params_mtp;
    out->weight_bytes = m->weight_bytes;
    out->kv_bytes_per_token =
        di_mla_cache_bytes_per_token(hp->num_hidden_layers, hp->kv_lora_rank, hp->qk_rope_head_dim);
    snprintf(out->dtypes, sizeof out->dtypes, "%s", m->dtypes);
}

const di_arch_vtable di_arch_deepseek_v3 = {
    .name = "deepseek_v3",
    .load = ds_load,
    .free = ds_free,
    .info = ds_info,
    .state_create = ds_state_create,
    .state_free = ds_state_free,
    .forward = ds_forward,
    .batch_state_create = ds_batch_state_create,
    .batch_state_free = ds_state_free,
    .forward_batch = ds_forward_batch,
    .replay_tokens = ds_replay_tokens,
    .prefix_cache_ok = ds_prefix_cache_ok,
    .block_multiple = ds_block_multiple,
    .take_expert_loads = ds_take_expert_loads,
};
