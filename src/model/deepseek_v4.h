/*
 * deepseek_v4.h -- private to src/model: the DeepSeek-V4 weight struct shared by the binder
 * (deepseek_v4_weights.c) and the forward pass (deepseek_v4.c).
 *
 * Matrices are di_weight views into the checkpoint mapping in their stored dtype (BF16, FP8
 * e4m3 with the E8M0 block scales converted to floats at load, or FP4 e2m1 with a float scale
 * per 32 columns); small vectors and the fp32 mHC / sink / position-bias tensors are float
 * copies owned by the model. Shapes: D hidden, H heads, d head_dim, n = hc_mult,
 * nm = (2 + n) n mixing rows, ql = q_lora_rank, g = o_groups, r = o_lora_rank, E experts,
 * I moe_intermediate_size, nI x dI indexer heads, m compress rate, cw = c d (c = 2 for CSA).
 */
#ifndef DI_DEEPSEEK_V4_H
#define DI_DEEPSEEK_V4_H

#include "kv/v4_state.h"
#include "model/device_copies.h"
#include "model/model.h"
#include "moe/router.h"

#include <stdbool.h>

typedef struct v4_mlp {
    di_weight w1; /* [I][D] gate */
    di_weight w3; /* [I][D] up */
    di_weight w2; /* [D][I] down */
} v4_mlp;

typedef struct v4_compressor {
    int64_t m, width, cw; /* window, entry width (d or dI), channels (2 width if overlap) */
    bool overlap;         /* CSA-style overlapping windows */
    di_weight wkv;        /* [cw][D] */
    di_weight wgate;      /* [cw][D] */
    const float *ape;     /* [m][cw] position bias */
    const float *norm;    /* [width] */
} v4_compressor;

typedef struct v4_block {
    int kind;                                               /* di_v4_layer_kind */
    int64_t m;                                              /* compress rate (0 sliding) */
    const float *attn_norm, *ffn_norm;                      /* [D] */
    const float *hc_attn_fn, *hc_attn_base, *hc_attn_scale; /* [nm][n D], [nm], [3] */
    const float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;

    di_weight wq_a;        /* [ql][D] */
    const float *q_norm;   /* [ql] */
    di_weight wq_b;        /* [H d][ql] */
    di_weight wkv;         /* [d][D] */
    const float *kv_norm;  /* [d] */
    di_weight wo_a;        /* [g r][H d / g] */
    di_weight *wo_a_group; /* [g] row views [r][H d / g] */
    di_weight wo_b;        /* [D][g r] */
    const float *sinks;    /* [H] */

    v4_compressor comp;    /* CSA, HCA */
    v4_compressor icomp;   /* CSA: the indexer's own compressor (width dI) */
    di_weight idx_wq_b;    /* [nI dI][ql] */
    di_weight idx_weights; /* [nI][D] weights_proj */

    bool hash;              /* hash-routed MoE (tid2eid) */
    di_weight gate;         /* [E][D] */
    const float *gate_bias; /* [E] (top-k layers) */
    const int32_t *tid2eid; /* [vocab][K] (hash layers), range-checked at load */
    v4_mlp *experts;        /* [E] */
    v4_mlp shared;
    /* The routed experts per projection for the backend's matmul_experts (made at load by
     * v4_model_expert_sets; xw: [3][E] weights, gate / up / down, model-owned). */
    di_weight *xw;
    di_expert_weights x_gate, x_up, x_down;
} v4_block;

/* Upstream MTP module (mtp.k.*): a sliding, top-k-routed block plus the projections that
 * feed it and its own head mixing. Bound when present; not run by forward. */
typedef struct v4_mtp {
    v4_block block;
    di_weight e_proj, h_proj;   /* [D][D] */
    const float *enorm, *hnorm; /* [D] */
    const float *norm;          /* [D] */
    const float *hc_head_fn, *hc_head_base, *hc_head_scale;
} v4_mtp;

typedef struct v4_model {
    const di_hparams *hp;                      /* borrowed */
    const di_v4_hparams *v;                    /* &hp->v4 */
    di_weight embed;                           /* [V][D] */
    di_weight head;                            /* [V][D] */
    const float *norm;                         /* [D] */
    const float *hc_head_fn;                   /* [n][n D] */
    const float *hc_head_base, *hc_head_scale; /* [n], [1] */
    v4_block *blocks;                          /* [num_hidden_layers] */
    v4_mtp *mtp;                               /* [n_mtp] or NULL */
    int64_t n_mtp;

    /* derived at load */
    float inv_main[256], inv_comp[256]; /* [rd / 2] inverse frequencies */
    const float *ones;                  /* [max(d, D)] weight of the unweighted RMSNorms */

    /* info */
    int64_t n_params_total, n_params_routed, n_params_active, n_params_mtp, weight_bytes;
    char dtypes[64];

    void **owned;
    int64_t n_owned, cap_owned;

    /* The memory backend (borrowed from load). With weight_upload (CUDA) every tensor the
     * forward reads was replaced by a backend copy (deepseek_v4_device.c), owned here. */
    const di_backend *be;
    di_dev_copies dev; /* the backend copies (device_copies.h); dev.be == be */
} v4_model;

/* The attention storage a runner reads and writes: the paged entry pool (compressed rows and
 * indexer keys, addressed through block tables) and the window slots (rings, compressor
 * windows). It is separate from the per-forward scratch (v4_ctx) so that a second runner
 * state can share it. */
typedef struct v4_kv {
    di_v4_pool pool;
    di_v4_slots slots;
} v4_kv;

/* The rows of one sequence inside a chunk. */
typedef struct v4_seg {
    const int32_t *table; /* the sequence's block table */
    di_v4_slot *slot;     /* its window state */
    int64_t pos0;         /* position of the segment's first row */
    int64_t n, row0;      /* rows, first chunk row */
    int64_t replay_end;   /* positions below it are replay: the pool is not written */
    int64_t lrow0, lcnt;  /* chunk rows lrow0 .. + lcnt need logits */
} v4_seg;

/* Per-forward scratch: every activation buffer, carved once for C = chunk rows (longer
 * batches run in chunks of C rows, each holding segments of one or more sequences), plus
 * the storage it works on. Shapes as above, plus rd2 = rd / 2, K = num_experts_per_tok,
 * MK = max keys per query, ME = max entries of any layer for one sequence.
 *
 * Memories: `dev` is backend memory (what the ops read and write), `host` is host memory
 * (what the host-side logic reads and writes: the indexer top-k, key lists, compressor
 * bookkeeping). A buffer both sides use has a host mirror (the _h fields) moved with one
 * upload / download where the logic needs it; when backend memory is host memory (CPU) the
 * mirrors are the buffers themselves and nothing moves. Row pointers handed to the ops
 * (key lists, pooling slots) always point into backend memory. */
typedef struct v4_ctx {
    v4_kv *kv; /* the storage (owned when own_kv) */
    bool own_kv;
    const di_backend *mem; /* allocated dev and the storage (the model's memory backend) */
    int32_t ctx_table[1];  /* {0}: the single-sequence path's block table */
    int64_t max_tokens, chunk, max_keys, max_entries;
    void *dev;      /* owns every backend buffer below */
    void *host;     /* owns every host buffer below */
    int32_t *ids;   /* [C] token ids of the chunk (host) */
    int32_t *ids_d; /* [C] the same in backend memory (embed) */
    int64_t *pos;   /* [C] positions of the chunk's rows (host) */
    v4_seg *segs;   /* [C] sequences of the chunk (host) */
    int64_t n_segs;
    float *x, *x2;                  /* [C][n][D] residual streams (ping-pong through hc_post) */
    float *h, *xn, *y;              /* [C][D] collapsed input, its norm, the sublayer output */
    float *post, *mix;              /* [C][n], [C][n][n] */
    float *qr;                      /* [C][ql] normed q LoRA vector */
    float *q, *o;                   /* [C][H d] queries, attention outputs */
    float *kvr;                     /* [C][d] this chunk's K=V rows */
    float *z;                       /* [C][g r] grouped output projection */
    float *rope, *rope_h;           /* the six tables below, contiguous, and their host mirror */
    float *cos_m, *sin_m, *nsin_m;  /* [C][rd2] main rope (nsin: inverse rotation) */
    float *cos_c, *sin_c, *nsin_c;  /* [C][rd2] compress rope */
    /* One emitted entry's inputs, contiguous so that one upload moves them (emit, emit_h:
     * emit_bytes): its pooling slots (slot_c, slot_z) and rope angles (ecs). */
    void *emit, *emit_h;
    size_t emit_bytes;
    float *ecs, *ecs_h; /* [2][rd2] cos, sin of one compressed entry */
    float *cc, *zz;                 /* [C][2 d] main compressor projections */
    float *ic, *iz;                 /* [C][2 dI] indexer compressor projections */
    float *qi, *iw;                 /* [C][nI dI], [C][nI] indexer queries and head weights */
    float *ikeys;                   /* [ME][dI] one sequence's indexer keys, gathered */
    float *iscore, *iscore_h;       /* [C][ME] indexer scores */
    float *ascratch;                /* [scratch_rows][MK] attention score rows */
    int64_t scratch_rows;           /* max(C, 64): also one row per worker for up to 64 workers */
    /* The key lists, one upload per layer (klist, klist_h): each query's count (n_keys, [C],
     * klist_head bytes with the padding to 8), then its key rows (keys, [C][MK]). */
    void *klist, *klist_h;
    size_t klist_head;            /* bytes before keys */
    const float **keys, **keys_h; /* [C][MK] key rows per query */
    int32_t *n_keys, *n_keys_h;   /* [C] */
    int64_t *n_vis, *n_vis_h;       /* [C] entries visible to each query */
    int32_t *sel;                   /* [MK] indexer top-k scratch (host) */
    int32_t *irows, *irows_h;       /* [ME] pool rows of one sequence's indexer keys */
    const float **slot_c, **slot_z; /* [2 m_max] compressor pooling slots */
    const float **slot_c_h, **slot_z_h;
    float *rlogits;             /* [C][E] router logits */
    int32_t *r_off, *r_active;  /* [E + 1] each: moe_route's offsets and active list */
    float *r_scratch;           /* [3 E] moe_route's scratch */
    /* an expert may get every (token, slot) pair if tid2eid repeats ids: K C rows */
    float *gate, *up;    /* [K C][I] */
    float *sgate, *sup;  /* [C][I] the shared expert's (beside the routed ones: side stream) */
    float *xe;           /* [K C][D] the routed rows, grouped by expert */
    float *moe_out;      /* [C][D] the combined routed experts */
    float *eo;           /* [K C][D] expert outputs, grouped by expert */
    /* [3 K C] words: grouped row g's token (src), entry i's grouped row (rows_of), entry i's
     * weight -- moe_route's gather and combine lists (for n rows: 3 runs of n K words) */
    int32_t *route;
    float *logits;       /* [C][V] head output, unless backend memory is host memory (NULL) */
} v4_ctx;

/* Host -> backend / backend -> host for a mirrored buffer; nothing when they are the same
 * memory (CPU). Ordered after the ops enqueued before (backend.h). */
static inline void v4_up(const di_backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) (void)be->ops->upload(be->ctx, dst, src, bytes);
}
static inline void v4_down(const di_backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) (void)be->ops->download(be->ctx, dst, src, bytes);
}

/* deepseek_v4_attn.c: one layer's attention for the chunk's n rows (c->segs; reads c->xn
 * and c->pos, writes c->y, the slots' window state and, outside replay, the pool's rows). */
void v4_attention(const v4_model *m, const v4_block *L, int64_t il, v4_ctx *c, const di_backend *be,
                  int64_t n);
/* deepseek_v4.c: a runner state sharing `owner`'s pool and slots (own scratch); for the
 * engine's disaggregated workers, to be wired to the model.h hook that shares a KV pool. */
di_status v4_batch_state_create_shared(const void *weights, void *owner, const di_batch_config *cfg,
                                       void **out);
/* y = x W^T whatever W's dtype (FP4 through matmul_fp4). */
void v4_matmul(const di_backend *be, const di_weight *w, const float *x, int64_t n, float *y);

/* deepseek_v4_device.c: backend copies of the weights the forward reads (no-op for a backend
 * without weight_upload); the release frees them. */
di_status v4_model_upload(v4_model *m);
/* The expert sets of every layer for matmul_experts (every backend; after the upload). */
di_status v4_model_expert_sets(v4_model *m);
void v4_model_release_device(v4_model *m);

/* deepseek_v4_weights.c */
di_status v4_model_bind(const di_hparams *hp, const di_st_set *st, const char *dir, v4_model **out);
void v4_model_free(v4_model *m);
void *v4_own(v4_model *m, void *p);

#endif /* DI_DEEPSEEK_V4_H */
