/*
 * config.h -- config.json -> hyper-parameters of a DeepSeek checkpoint.
 *
 * Both spellings seen in the wild are accepted:
 *   DeepSeek's own:   rope_theta, rope_scaling {type|rope_type: yarn, factor,
 *                     original_max_position_embeddings, beta_fast, beta_slow, mscale,
 *                     mscale_all_dim}, torch_dtype
 *   transformers 5:   rope_parameters {rope_type, rope_theta, factor, ...}, rope_interleave,
 *                     dtype
 * Unknown fields are ignored. A field the model needs that is missing or impossible is an
 * error that names the file and the field, e.g.
 *   config.json: field "kv_lora_rank" missing
 */
#ifndef DI_CONFIG_H
#define DI_CONFIG_H

#include "core/core.h"
#include "io/config_v4.h"

#include <stdbool.h>

typedef enum {
    DI_FAMILY_DEEPSEEK_V2, /* DeepseekV2ForCausalLM (V2, V2-Lite)      */
    DI_FAMILY_DEEPSEEK_V3, /* DeepseekV3ForCausalLM (V3, V3.1, R1)     */
    DI_FAMILY_DEEPSEEK_V32,
    DI_FAMILY_DEEPSEEK_V4,
} di_family;

typedef enum { DI_SCORE_SOFTMAX, DI_SCORE_SIGMOID, DI_SCORE_SQRTSOFTPLUS } di_score_func;

typedef enum {
    DI_TOPK_GREEDY,               /* plain top-k over all experts                 */
    DI_TOPK_GROUP_LIMITED_GREEDY, /* V2: group score = max in group               */
    DI_TOPK_NOAUX_TC,             /* V3: group score = sum of top-2, with bias    */
} di_topk_method;

typedef enum { DI_ROPE_NONE, DI_ROPE_YARN, DI_ROPE_LINEAR } di_rope_scaling_type;

typedef struct di_rope_params {
    double theta;                 /* rope_theta */
    di_rope_scaling_type scaling; /* DI_ROPE_NONE if no rope_scaling / rope_type "default" */
    double factor;
    int64_t original_max_position_embeddings;
    double beta_fast, beta_slow;
    double mscale, mscale_all_dim; /* 0 when absent */
    double attention_factor;       /* 0 when absent (derived from mscale then) */
    bool truncate;                 /* transformers' yarn "truncate" (default true) */
} di_rope_params;

typedef struct di_hparams {
    di_family family;
    char architecture[64]; /* architectures[0] */
    char model_type[32];

    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;     /* dense MLP */
    int64_t moe_intermediate_size; /* each routed / shared expert */
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    int32_t bos_token_id, eos_token_id; /* -1 if absent; first of a list */

    /* MLA */
    int64_t q_lora_rank; /* 0 = no q compression (q_proj) */
    int64_t kv_lora_rank;
    int64_t qk_nope_head_dim;
    int64_t qk_rope_head_dim;
    int64_t v_head_dim;
    bool rope_interleave; /* rotate adjacent pairs (DeepSeek layout); default true */
    di_rope_params rope;

    /* MoE */
    int64_t n_routed_experts; /* 0 = dense model */
    int64_t n_shared_experts;
    int64_t num_experts_per_tok;
    int64_t first_k_dense_replace;
    int64_t moe_layer_freq;
    int64_t n_group, topk_group; /* 1 / 1 when absent */
    bool norm_topk_prob;
    double routed_scaling_factor;
    di_score_func scoring_func;
    di_topk_method topk_method;

    int64_t num_nextn_predict_layers; /* MTP layers stored after the main layers */

    /* FP8 block quantization (quantization_config) */
    bool fp8;
    int64_t fp8_block[2]; /* weight_block_size, e.g. 128 x 128 */
    char dtype[16];       /* torch_dtype / dtype, e.g. "bfloat16" */

    di_v4_hparams v4; /* DeepSeek-V4 only (config_v4.c); zero for other families */
} di_hparams;

/* Parses config.json text; `path` is used in error messages. */
di_status di_config_parse(const char *json, size_t len, const char *path, di_hparams *out);
/* Reads and parses DIR/config.json. */
di_status di_config_load_dir(const char *dir, di_hparams *out);

/* True if layer il uses routed experts (il >= first_k_dense_replace && il % freq == 0). */
bool di_hparams_layer_is_moe(const di_hparams *hp, int64_t il);

#endif /* DI_CONFIG_H */
