/*
 * deepseek_v3.h -- private to src/model: the DeepSeek-V2/V3 weight struct shared by the
 * binder (deepseek_v3_weights.c) and the forward pass (deepseek_v3.c).
 *
 * Matrices are di_weight views into the checkpoint mapping (or their device copies, see
 * ds_model_upload), in their stored dtype (nn.Linear layout [out][in]); small vectors (norms,
 * router bias, FP8 block scales) are float copies owned by the model (listed in `owned`). Shapes
 * below use H = hidden_size, nh = num_attention_heads, dn = qk_nope_head_dim, dr =
 * qk_rope_head_dim, dv = v_head_dim, R = kv_lora_rank, E = n_routed_experts, I =
 * moe_intermediate_size.
 */
#ifndef DI_DEEPSEEK_V3_H
#define DI_DEEPSEEK_V3_H

#include "model/device_copies.h"
#include "model/model.h"
#include "moe/router.h"

#include <stdbool.h>

typedef struct ds_mlp {
    di_weight gate; /* [inter][H] */
    di_weight up;   /* [inter][H] */
    di_weight down; /* [H][inter] */
} ds_mlp;

typedef struct ds_layer {
    const float *attn_norm; /* [H] input_layernorm */
    const float *ffn_norm;  /* [H] post_attention_layernorm */

    /* attention (MLA) */
    di_weight q_proj;       /* [nh * (dn + dr)][H]           when q_lora_rank == 0 */
    di_weight q_a_proj;     /* [q_lora_rank][H]              when q_lora_rank > 0  */
    const float *q_a_norm;  /* [q_lora_rank] */
    di_weight q_b_proj;     /* [nh * (dn + dr)][q_lora_rank] */
    di_weight kv_a_proj;    /* [R + dr][H] kv_a_proj_with_mqa */
    const float *kv_a_norm; /* [R] */
    di_weight kv_b_proj;    /* [nh * (dn + dv)][R] */
    di_weight *w_uk;        /* [nh] views of kv_b_proj: head h's [dn][R] key rows */
    di_weight *w_uv;        /* [nh] views of kv_b_proj: head h's [dv][R] value rows */
    di_weight o_proj;       /* [H][nh * dv] */
    /* [nh] views of a backend copy of W_UK transposed, head h's [R][dn] (BF16 kv_b_proj on a
     * backend that prefers untransposed head products: deepseek_v3_device.c), else NULL
     * (the runner multiplies by w_uk transposed). */
    di_weight *w_ukt;

    /* feed-forward: dense, or MoE */
    bool is_moe;
    ds_mlp dense;             /* inter = intermediate_size */
    di_weight router;         /* [E][H] mlp.gate.weight */
    const float *router_bias; /* [E] e_score_correction_bias (V3) or NULL */
    ds_mlp *experts;          /* [E], inter = I */
    bool has_shared;
    ds_mlp shared; /* inter = I * n_shared_experts */
    /* The routed experts per projection for the backend's matmul_experts (made at load by
     * ds_model_expert_sets; xw: [3][E] weights, gate / up / down, model-owned). */
    di_weight *xw;
    di_expert_weights x_gate, x_up, x_down;
} ds_layer;

/* A multi-token-prediction module (DeepSeek-V3 stores it as layer num_hidden_layers + k):
 * a decoder layer plus the projections that feed it. Bound and counted, not run yet. */
typedef struct ds_mtp {
    ds_layer layer;
    di_weight eh_proj;          /* [H][2H] */
    const float *enorm, *hnorm; /* [H] */
    di_weight embed;            /* [vocab][H] (optional: shared with the model) */
    const float *head_norm;     /* [H] shared_head.norm (optional) */
    di_weight head;             /* [vocab][H] shared_head.head (optional) */
} ds_mtp;

typedef struct ds_model {
    const di_hparams *hp; /* borrowed from di_model */
    di_weight embed;      /* [vocab][H] */
    const float *norm;    /* [H] final norm */
    di_weight lm_head;    /* [vocab][H] (the embedding when tied) */
    ds_layer *layers;     /* [num_hidden_layers] */
    ds_mtp *mtp;          /* [num_nextn_predict_layers], bound but unused by forward */
    int64_t n_mtp;

    /* derived at load */
    int64_t qk_head_dim;     /* dn + dr */
    float inv_freq[256];     /* [dr / 2] RoPE inverse frequencies (YaRN-corrected) */
    float rope_attn_factor;  /* multiplies cos and sin (YaRN attention_factor) */
    float softmax_scale;     /* qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2 */
    bool rope_interleaved;   /* pairs (2i, 2i+1) vs rotate_half */
    di_router_params router; /* bias set per layer */
    int64_t max_inter;       /* widest MLP intermediate (buffer sizing) */

    /* info */
    int64_t n_params_total, n_params_routed, n_params_active, n_params_mtp, weight_bytes;
    char dtypes[64];

    /* allocations owned by the model */
    void **owned;
    int64_t n_owned, cap_owned;

    /* The memory backend (model.h): states allocate through it. When it uploads weights,
     * every di_weight and norm above refers to its copies (router_bias too: routing runs on
     * the backend), listed here for release. */
    const di_backend *be;
    di_dev_copies dev; /* the backend copies (device_copies.h); dev.be == be */
} ds_model;

/* deepseek_v3_weights.c */
di_status ds_model_bind(const di_hparams *hp, const di_st_set *st, const char *dir, ds_model **out);
void ds_model_free(ds_model *m);
void ds_rope_setup(ds_model *m);
/* deepseek_v3_device.c: copies every tensor the forward reads to m->be's memory (a no-op for
 * a backend without weight_upload), and releases those copies. */
di_status ds_model_upload(ds_model *m);
/* Fills every MoE layer's x_gate / x_up / x_down (after ds_model_upload; any backend). */
di_status ds_model_expert_sets(ds_model *m);
void ds_model_release_device(ds_model *m);

#endif /* DI_DEEPSEEK_V3_H */
