/*
 * config_v4.h -- DeepSeek-V4 hyper-parameters (config.json of DeepseekV4ForCausalLM).
 *
 * V4 shares little with V2/V3's MLA fields, so its specific knobs live in their own struct,
 * embedded in di_hparams as `v4` (config.c calls di_config_v4_parse for the V4 family; the
 * shared fields -- sizes, MoE, bos/eos, dtype, FP8 -- are filled in di_hparams as usual).
 *
 * Both spellings are accepted (see docs/v4-reference-notes.md, "Config"):
 *   transformers 5:  layer_types, mlp_layer_types, compress_rates {type: m},
 *                    rope_parameters {main: {...}, compress: {...}}, partial_rotary_factor
 *   upstream:        compress_ratios (one per layer, + MTP), num_hash_layers,
 *                    compress_rate_csa / compress_rate_hca, qk_rope_head_dim, rope_theta,
 *                    compress_rope_theta, rope_scaling (applies to the compress rope only)
 * A schedule whose length does not match num_hidden_layers, an unknown layer type and V3
 * MLA fields inside a V4 config are errors that name the field.
 */
#ifndef DI_CONFIG_V4_H
#define DI_CONFIG_V4_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* Flash has 43 layers, Pro 61; this bound keeps the schedule a fixed array. */
#define DI_V4_MAX_LAYERS 256

typedef enum {
    DI_V4_SLIDING = 0, /* sliding_attention: window only                         */
    DI_V4_CSA = 1,     /* compressed_sparse_attention: window + indexer-picked    */
    DI_V4_HCA = 2,     /* heavily_compressed_attention: window + every entry      */
} di_v4_layer_kind;

/* One rope flavour (main: sliding layers; compress: CSA / HCA layers). */
typedef struct di_v4_rope {
    double theta;
    bool yarn; /* else default (no scaling) */
    double factor;
    int64_t original_max_position_embeddings;
    double beta_fast, beta_slow;
} di_v4_rope;

typedef struct di_v4_hparams {
    int64_t head_dim;       /* d: width of q heads, the shared K=V row, entries */
    int64_t rope_dim;       /* rd: trailing rotated dims of every rope'd vector */
    int64_t q_lora_rank;    /* wq_a output */
    int64_t o_lora_rank;    /* r: per-group rank of the grouped output projection */
    int64_t o_groups;       /* g */
    int64_t sliding_window; /* W */
    int64_t index_n_heads, index_head_dim, index_topk;
    int64_t hc_mult; /* n_hc streams */
    int64_t hc_sinkhorn_iters;
    double hc_eps;
    double swiglu_limit; /* 0 = no clamp */
    di_v4_rope rope_main, rope_compress;
    uint8_t layer_kind[DI_V4_MAX_LAYERS];    /* di_v4_layer_kind per layer */
    int64_t compress_rate[DI_V4_MAX_LAYERS]; /* m per layer (0 for sliding) */
    bool hash_moe[DI_V4_MAX_LAYERS];         /* hash-routed (tid2eid) MoE layer */
} di_v4_hparams;

struct di_hparams;
struct json_t;

/* Parses a V4 config.json object into hp (shared fields) and hp->v4. Called by config.c
 * after the family fields; for a V2/V3 family it only reports the mixed-in V4 field. */
di_status di_config_v4_parse(const struct json_t *root, const char *path, struct di_hparams *hp);

/* True if the config object has a field that only DeepSeek-V4 defines (compress_ratios,
 * hc_mult, o_groups, ...): config.c routes such V2/V3 files to di_config_v4_parse, which
 * refuses the mix with a message naming the field. */
bool di_config_v4_fields_present(const struct json_t *root);

/* Name of a layer kind as transformers spells it. */
const char *di_v4_layer_kind_name(di_v4_layer_kind k);

#endif /* DI_CONFIG_V4_H */
