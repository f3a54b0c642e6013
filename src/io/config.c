/*
 * config.c -- config.json -> di_hparams (see config.h).
 *
 * Design stance:
 *   - The reference for every default is transformers (DeepseekV2Config, DeepseekV3Config,
 *     DeepseekV32Config and modeling_rope_utils), because golden outputs are computed with it:
 *     an absent knob must mean here what it means there. Two exceptions, both on purpose:
 *       * sizes that define tensor shapes (hidden_size, kv_lora_rank, ...) and
 *         num_experts_per_tok are required: transformers' defaults are the full 236B / 671B
 *         models, and silently assuming those shapes is never what a user meant;
 *       * n_routed_experts absent means a dense model, and num_nextn_predict_layers absent
 *         means no MTP layers (transformers never runs them, so nothing to match).
 *   - rope: the legacy `rope_scaling` object wins over `rope_parameters` when both are
 *     present and non-empty, `rope_theta` inside the object wins over the top-level one,
 *     and beta_fast / beta_slow fall back to 32 / 1 when absent or 0, all as transformers 5
 *     standardizes them. mscale / mscale_all_dim / attention_factor are recorded as given
 *     (0 when absent); the model code applies transformers' formulas.
 *   - The result is built in a local and copied out only on success, so a failed call
 *     leaves *out as it was.
 *
 * Every error names the file and the field: `config.json: field "hidden_size" ...`.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/config.h"
#include "io/config_json.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Sizes above this are certainly corrupt, and keeping them small means products of two
 * sizes (vocab x hidden) cannot overflow int64 in the code that uses them. */
#define CFG_MAX_SIZE ((int64_t)1 << 32)

/* What an absent field means, per family (transformers' class defaults). */
typedef struct cfg_defaults {
    int64_t max_position_embeddings;
    int64_t n_shared_experts;
    int64_t n_group, topk_group; /* V2's None is 1: one group, i.e. no grouping */
    int64_t first_k_dense_replace;
    double routed_scaling_factor;
    bool norm_topk_prob;
    di_score_func scoring;
    di_topk_method topk;
} cfg_defaults;

static const cfg_defaults g_defaults_v2 = {2048,          2, 1, 1, 0, 1.0, false, DI_SCORE_SOFTMAX,
                                           DI_TOPK_GREEDY};
static const cfg_defaults g_defaults_v3 = {
    4096, 1, 8, 4, 3, 2.5, true, DI_SCORE_SIGMOID, DI_TOPK_NOAUX_TC};
static const cfg_defaults g_defaults_v32 = {
    163840, 1, 8, 4, 3, 2.5, true, DI_SCORE_SIGMOID, DI_TOPK_NOAUX_TC};

/* ---------------------------------------------------------------------------------------- */
/* Typed field access                                                                         */
/* ---------------------------------------------------------------------------------------- */

/* Copies s into a fixed buffer; names longer than the buffer are not ours anyway. */
static di_status cfg_copy(const di_cfg_reader *r, const char *key, const char *s, char *dst,
                          size_t cap) {
    if (strlen(s) >= cap)
        return di_error(DI_ERR_CONFIG, "%s: field \"%s\" is too long (\"%.40s...\")", r->path, key,
                        s);
    memcpy(dst, s, strlen(s) + 1);
    return DI_OK;
}


/* ---------------------------------------------------------------------------------------- */
/* Family                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static const struct {
    const char *arch, *model_type;
    di_family family;
} g_families[] = {
    {"DeepseekV2ForCausalLM", "deepseek_v2", DI_FAMILY_DEEPSEEK_V2},
    {"DeepseekV3ForCausalLM", "deepseek_v3", DI_FAMILY_DEEPSEEK_V3},
    {"DeepseekV32ForCausalLM", "deepseek_v32", DI_FAMILY_DEEPSEEK_V32},
    {"DeepseekV4ForCausalLM", "deepseek_v4", DI_FAMILY_DEEPSEEK_V4},
};

/* architectures[0] decides when present (fine-tunes such as Kimi-K2 keep the DeepSeek
 * architecture under their own model_type); an unknown one is refused even if model_type
 * looks familiar, since the class is what defines the weights. model_type is the fallback. */
static bool cfg_lookup(const char *name, bool by_arch, di_family *out) {
    for (size_t i = 0; i < DI_ARRAY_LEN(g_families); i++) {
        if (strcmp(name, by_arch ? g_families[i].arch : g_families[i].model_type) != 0) continue;
        *out = g_families[i].family;
        return true;
    }
    return false;
}

static di_status cfg_family(const di_cfg_reader *r, di_hparams *hp) {
    const json_t *archs = di_cfg_get(r->root, "architectures");
    const char *arch = "", *mt = "";
    if (archs && (!json_is_array(archs) ||
                  (json_array_size(archs) > 0 && !json_is_string(json_array_get(archs, 0)))))
        return di_error(DI_ERR_CONFIG, "%s: field \"architectures\" must be a list of strings",
                        r->path);
    if (archs && json_array_size(archs) > 0) arch = json_string_value(json_array_get(archs, 0));
    di_status st = di_cfg_str(r, r->root, "", "model_type", &mt);
    if (st != DI_OK) return st;
    if (!mt) mt = "";
    if (!arch[0] && !mt[0])
        return di_error(DI_ERR_CONFIG, "%s: fields \"architectures\" and \"model_type\" missing",
                        r->path);
    bool known = arch[0] ? cfg_lookup(arch, true, &hp->family) : cfg_lookup(mt, false, &hp->family);
    if (!known)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: architecture \"%s\" (model_type \"%s\") is not supported", r->path,
                        arch, mt);
    st = cfg_copy(r, "architectures", arch, hp->architecture, sizeof hp->architecture);
    if (st == DI_OK) st = cfg_copy(r, "model_type", mt, hp->model_type, sizeof hp->model_type);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Sections                                                                                   */
/* ---------------------------------------------------------------------------------------- */

static di_status cfg_sizes(const di_cfg_reader *r, const cfg_defaults *d, di_hparams *hp) {
    const json_t *o = r->root;
    di_status st = di_cfg_int(r, o, "", "vocab_size", 0, true, &hp->vocab_size);
    if (!st) st = di_cfg_int(r, o, "", "hidden_size", 0, true, &hp->hidden_size);
    if (!st) st = di_cfg_int(r, o, "", "intermediate_size", 0, true, &hp->intermediate_size);
    if (!st) st = di_cfg_int(r, o, "", "num_hidden_layers", 0, true, &hp->num_hidden_layers);
    if (!st) st = di_cfg_int(r, o, "", "num_attention_heads", 0, true, &hp->num_attention_heads);
    if (!st)
        st = di_cfg_int(r, o, "", "max_position_embeddings", d->max_position_embeddings, false,
                     &hp->max_position_embeddings);
    if (!st) st = di_cfg_real(r, o, "", "rms_norm_eps", 1e-6, &hp->rms_norm_eps);
    if (!st) st = di_cfg_bool(r, o, "", "tie_word_embeddings", false, &hp->tie_word_embeddings);
    /* transformers 5 renamed num_nextn_predict_layers; accept its spelling as a fallback. */
    if (!st && !di_cfg_get(o, "num_nextn_predict_layers"))
        st = di_cfg_int(r, o, "", "num_mtp_layers", 0, false, &hp->num_nextn_predict_layers);
    else if (!st)
        st = di_cfg_int(r, o, "", "num_nextn_predict_layers", 0, false, &hp->num_nextn_predict_layers);
    return st;
}

static di_status cfg_mla(const di_cfg_reader *r, di_hparams *hp) {
    const json_t *o = r->root;
    /* q_lora_rank: null (V2-Lite) means no q compression; transformers' default is 1536. */
    const json_t *q = json_object_get(o, "q_lora_rank");
    di_status st = DI_OK;
    if (q && json_is_null(q))
        hp->q_lora_rank = 0;
    else
        st = di_cfg_int(r, o, "", "q_lora_rank", 1536, false, &hp->q_lora_rank);
    if (!st) st = di_cfg_int(r, o, "", "kv_lora_rank", 0, true, &hp->kv_lora_rank);
    if (!st) st = di_cfg_int(r, o, "", "qk_nope_head_dim", 0, true, &hp->qk_nope_head_dim);
    if (!st) st = di_cfg_int(r, o, "", "qk_rope_head_dim", 0, true, &hp->qk_rope_head_dim);
    if (!st) st = di_cfg_int(r, o, "", "v_head_dim", 0, true, &hp->v_head_dim);
    if (!st) st = di_cfg_bool(r, o, "", "rope_interleave", true, &hp->rope_interleave);
    return st;
}

static di_status cfg_enum_scoring(const di_cfg_reader *r, di_hparams *hp) {
    const char *s;
    di_status st = di_cfg_str(r, r->root, "", "scoring_func", &s);
    if (st || !s) return st;
    if (strcmp(s, "softmax") == 0)
        hp->scoring_func = DI_SCORE_SOFTMAX;
    else if (strcmp(s, "sigmoid") == 0)
        hp->scoring_func = DI_SCORE_SIGMOID;
    else if (strcmp(s, "sqrtsoftplus") == 0)
        hp->scoring_func = DI_SCORE_SQRTSOFTPLUS;
    else
        return di_error(DI_ERR_UNSUPPORTED, "%s: field \"scoring_func\": \"%s\" is not supported",
                        r->path, s);
    return DI_OK;
}

static di_status cfg_enum_topk(const di_cfg_reader *r, di_hparams *hp) {
    const char *s;
    di_status st = di_cfg_str(r, r->root, "", "topk_method", &s);
    if (st || !s) return st;
    if (strcmp(s, "greedy") == 0)
        hp->topk_method = DI_TOPK_GREEDY;
    else if (strcmp(s, "group_limited_greedy") == 0)
        hp->topk_method = DI_TOPK_GROUP_LIMITED_GREEDY;
    else if (strcmp(s, "noaux_tc") == 0)
        hp->topk_method = DI_TOPK_NOAUX_TC;
    else
        return di_error(DI_ERR_UNSUPPORTED, "%s: field \"topk_method\": \"%s\" is not supported",
                        r->path, s);
    return DI_OK;
}

static di_status cfg_moe(const di_cfg_reader *r, const cfg_defaults *d, di_hparams *hp) {
    const json_t *o = r->root;
    di_status st = di_cfg_int(r, o, "", "n_routed_experts", 0, false, &hp->n_routed_experts);
    bool moe = st == DI_OK && hp->n_routed_experts > 0;
    if (!st) st = di_cfg_int(r, o, "", "moe_intermediate_size", 0, moe, &hp->moe_intermediate_size);
    if (!st) st = di_cfg_int(r, o, "", "num_experts_per_tok", 0, moe, &hp->num_experts_per_tok);
    if (!st)
        st = di_cfg_int(r, o, "", "n_shared_experts", moe ? d->n_shared_experts : 0, false,
                     &hp->n_shared_experts);
    if (!st)
        st = di_cfg_int(r, o, "", "first_k_dense_replace", d->first_k_dense_replace, false,
                     &hp->first_k_dense_replace);
    if (!st) st = di_cfg_int(r, o, "", "moe_layer_freq", 1, false, &hp->moe_layer_freq);
    if (!st) st = di_cfg_int(r, o, "", "n_group", d->n_group, false, &hp->n_group);
    if (!st) st = di_cfg_int(r, o, "", "topk_group", d->topk_group, false, &hp->topk_group);
    if (!st) st = di_cfg_bool(r, o, "", "norm_topk_prob", d->norm_topk_prob, &hp->norm_topk_prob);
    if (!st)
        st = di_cfg_real(r, o, "", "routed_scaling_factor", d->routed_scaling_factor,
                      &hp->routed_scaling_factor);
    hp->scoring_func = d->scoring;
    hp->topk_method = d->topk;
    if (!st) st = cfg_enum_scoring(r, hp);
    if (!st) st = cfg_enum_topk(r, hp);
    return st;
}


static di_status cfg_dtype(const di_cfg_reader *r, di_hparams *hp) {
    const char *s = NULL;
    const char *key = di_cfg_get(r->root, "dtype") ? "dtype" : "torch_dtype";
    di_status st = di_cfg_str(r, r->root, "", key, &s);
    if (st || !s) return st;
    return cfg_copy(r, key, s, hp->dtype, sizeof hp->dtype);
}

/* ---------------------------------------------------------------------------------------- */
/* RoPE                                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* Picks the rope object and the prefix used to name its fields in messages. */
static di_status cfg_rope_object(const di_cfg_reader *r, const json_t **obj, const char **where) {
    static const char *keys[] = {"rope_scaling", "rope_parameters"};
    static const char *wheres[] = {"rope_scaling.", "rope_parameters."};
    *obj = NULL;
    *where = "";
    for (int i = 0; i < 2; i++) {
        const json_t *v = di_cfg_get(r->root, keys[i]);
        if (!v) continue;
        if (!json_is_object(v))
            return di_error(DI_ERR_CONFIG, "%s: field \"%s\" must be an object or null", r->path,
                            keys[i]);
        if (json_object_size(v) == 0) continue; /* {} is falsy in Python: ignored */
        *obj = v;
        *where = wheres[i];
        return DI_OK;
    }
    return DI_OK;
}

static di_status cfg_rope_type(const di_cfg_reader *r, const json_t *o, const char *where,
                               di_rope_params *rp) {
    const char *type = NULL;
    di_status st = di_cfg_str(r, o, where, "rope_type", &type);
    if (!st && !type) st = di_cfg_str(r, o, where, "type", &type);
    if (st) return st;
    if (!type || strcmp(type, "default") == 0)
        rp->scaling = DI_ROPE_NONE;
    else if (strcmp(type, "yarn") == 0)
        rp->scaling = DI_ROPE_YARN;
    else if (strcmp(type, "linear") == 0)
        rp->scaling = DI_ROPE_LINEAR;
    else
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: rope type \"%s\" (field \"%srope_type\") is "
                        "not supported",
                        r->path, type, where);
    return DI_OK;
}

/* The scaling parameters of yarn / linear; factor is required as in transformers. */
static di_status cfg_rope_scaling(const di_cfg_reader *r, const json_t *o, const char *where,
                                  int64_t max_pos, di_rope_params *rp) {
    if (!json_object_get(o, "factor"))
        return di_error(DI_ERR_CONFIG, "%s: field \"%sfactor\" missing", r->path, where);
    di_status st = di_cfg_int(r, o, where, "original_max_position_embeddings", max_pos, false,
                           &rp->original_max_position_embeddings);
    if (st) return st;
    st = di_cfg_range(r, "original_max_position_embeddings", rp->original_max_position_embeddings, 1,
                   CFG_MAX_SIZE);
    /* An explicit null factor is the context extension, max / original (transformers' yarn). */
    double ratio = (double)max_pos / (double)rp->original_max_position_embeddings;
    if (!st) st = di_cfg_real(r, o, where, "factor", ratio, &rp->factor);
    if (!st) st = di_cfg_real(r, o, where, "beta_fast", 32.0, &rp->beta_fast);
    if (!st) st = di_cfg_real(r, o, where, "beta_slow", 1.0, &rp->beta_slow);
    if (!st) st = di_cfg_real(r, o, where, "mscale", 0.0, &rp->mscale);
    if (!st) st = di_cfg_real(r, o, where, "mscale_all_dim", 0.0, &rp->mscale_all_dim);
    if (!st) st = di_cfg_real(r, o, where, "attention_factor", 0.0, &rp->attention_factor);
    if (!st) st = di_cfg_bool(r, o, where, "truncate", true, &rp->truncate);
    if (st) return st;
    /* transformers reads them as `x or default`, so an explicit 0 also means the default. */
    if (rp->beta_fast == 0) rp->beta_fast = 32.0;
    if (rp->beta_slow == 0) rp->beta_slow = 1.0;
    double min_factor = rp->scaling == DI_ROPE_YARN ? 1.0 : 0.0;
    if (!(rp->factor >= min_factor) || !isfinite(rp->factor) || rp->factor == 0)
        return di_error(DI_ERR_CONFIG, "%s: field \"%sfactor\" = %g is out of range", r->path,
                        where, rp->factor);
    return DI_OK;
}

static di_status cfg_rope(const di_cfg_reader *r, di_hparams *hp) {
    di_rope_params *rp = &hp->rope;
    *rp = (di_rope_params){.theta = 10000.0, .scaling = DI_ROPE_NONE, .truncate = true};
    const json_t *o;
    const char *where;
    di_status st = cfg_rope_object(r, &o, &where);
    if (!st) st = di_cfg_real(r, r->root, "", "rope_theta", 10000.0, &rp->theta);
    if (st || !o) return st;
    if (di_cfg_get(o, "rope_theta")) st = di_cfg_real(r, o, where, "rope_theta", 0, &rp->theta);
    if (!st) st = cfg_rope_type(r, o, where, rp);
    if (st || rp->scaling == DI_ROPE_NONE) return st;
    return cfg_rope_scaling(r, o, where, hp->max_position_embeddings, rp);
}

/* ---------------------------------------------------------------------------------------- */
/* Quantization                                                                               */
/* ---------------------------------------------------------------------------------------- */

static di_status cfg_fp8(const di_cfg_reader *r, const json_t *q, di_hparams *hp) {
    const char *w = "quantization_config.";
    const char *fmt = NULL, *act = NULL;
    di_status st = di_cfg_str(r, q, w, "fmt", &fmt);
    if (!st) st = di_cfg_str(r, q, w, "activation_scheme", &act);
    if (st) return st;
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: field \"%sfmt\": fp8 format \"%s\" is not "
                        "supported (only e4m3)",
                        r->path, w, fmt);
    if (act && strcmp(act, "dynamic") != 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: field \"%sactivation_scheme\": \"%s\" is not "
                        "supported (only dynamic)",
                        r->path, w, act);
    hp->fp8 = true;
    hp->fp8_block[0] = hp->fp8_block[1] = 128; /* transformers' FP8 default */
    const json_t *b = di_cfg_get(q, "weight_block_size");
    if (!b) return DI_OK;
    if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)))
        return di_error(DI_ERR_CONFIG, "%s: field \"%sweight_block_size\" must be [rows, cols]",
                        r->path, w);
    hp->fp8_block[0] = (int64_t)json_integer_value(json_array_get(b, 0));
    hp->fp8_block[1] = (int64_t)json_integer_value(json_array_get(b, 1));
    st = di_cfg_range(r, "quantization_config.weight_block_size[0]", hp->fp8_block[0], 1, 1 << 20);
    if (!st)
        st = di_cfg_range(r, "quantization_config.weight_block_size[1]", hp->fp8_block[1], 1, 1 << 20);
    return st;
}

static di_status cfg_quant(const di_cfg_reader *r, di_hparams *hp) {
    const json_t *q = di_cfg_get(r->root, "quantization_config");
    if (!q) return DI_OK;
    if (!json_is_object(q))
        return di_error(DI_ERR_CONFIG, "%s: field \"quantization_config\" must be an object",
                        r->path);
    const char *method = NULL;
    di_status st = di_cfg_str(r, q, "quantization_config.", "quant_method", &method);
    if (st) return st;
    if (!method)
        return di_error(DI_ERR_CONFIG, "%s: field \"quantization_config.quant_method\" missing",
                        r->path);
    if (strcmp(method, "fp8") != 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: quantization_config.quant_method \"%s\" is not "
                        "supported",
                        r->path, method);
    return cfg_fp8(r, q, hp);
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static di_status cfg_check_sizes(const di_cfg_reader *r, const di_hparams *hp) {
    const struct {
        const char *key;
        int64_t v, lo;
    } f[] = {
        {"vocab_size", hp->vocab_size, 1},
        {"hidden_size", hp->hidden_size, 1},
        {"intermediate_size", hp->intermediate_size, 1},
        {"num_hidden_layers", hp->num_hidden_layers, 1},
        {"num_attention_heads", hp->num_attention_heads, 1},
        {"max_position_embeddings", hp->max_position_embeddings, 1},
        {"q_lora_rank", hp->q_lora_rank, 0},
        {"kv_lora_rank", hp->kv_lora_rank, 1},
        {"qk_nope_head_dim", hp->qk_nope_head_dim, 1},
        {"qk_rope_head_dim", hp->qk_rope_head_dim, 2},
        {"v_head_dim", hp->v_head_dim, 1},
        {"n_routed_experts", hp->n_routed_experts, 0},
        {"n_shared_experts", hp->n_shared_experts, 0},
        {"moe_layer_freq", hp->moe_layer_freq, 1},
        {"n_group", hp->n_group, 1},
        {"topk_group", hp->topk_group, 1},
        {"num_nextn_predict_layers", hp->num_nextn_predict_layers, 0},
        {"first_k_dense_replace", hp->first_k_dense_replace, 0},
    };
    for (size_t i = 0; i < DI_ARRAY_LEN(f); i++) {
        di_status st = di_cfg_range(r, f[i].key, f[i].v, f[i].lo, CFG_MAX_SIZE);
        if (st) return st;
    }
    if (hp->qk_rope_head_dim % 2 != 0)
        return di_error(DI_ERR_CONFIG, "%s: field \"qk_rope_head_dim\" = %lld must be even",
                        r->path, (long long)hp->qk_rope_head_dim);
    return DI_OK;
}

static di_status cfg_check_moe(const di_cfg_reader *r, const di_hparams *hp) {
    if (hp->n_routed_experts == 0) return DI_OK;
    di_status st =
        di_cfg_range(r, "moe_intermediate_size", hp->moe_intermediate_size, 1, CFG_MAX_SIZE);
    if (!st)
        st = di_cfg_range(r, "num_experts_per_tok", hp->num_experts_per_tok, 1, hp->n_routed_experts);
    if (!st) st = di_cfg_range(r, "topk_group", hp->topk_group, 1, hp->n_group);
    if (st) return st;
    if (hp->n_routed_experts % hp->n_group != 0)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"n_group\" = %lld does not divide "
                        "n_routed_experts = %lld",
                        r->path, (long long)hp->n_group, (long long)hp->n_routed_experts);
    int64_t per_group = hp->n_routed_experts / hp->n_group;
    if (hp->topk_method != DI_TOPK_GREEDY && hp->topk_group * per_group < hp->num_experts_per_tok)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"num_experts_per_tok\" = %lld exceeds the "
                        "%lld experts of topk_group groups",
                        r->path, (long long)hp->num_experts_per_tok,
                        (long long)(hp->topk_group * per_group));
    /* noaux_tc scores a group by the sum of its top two experts. */
    if (hp->topk_method == DI_TOPK_NOAUX_TC && per_group < 2)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"n_group\" = %lld leaves fewer than 2 experts "
                        "per group (noaux_tc)",
                        r->path, (long long)hp->n_group);
    return DI_OK;
}

static di_status cfg_check(const di_cfg_reader *r, di_hparams *hp, bool fkdr_given) {
    di_status st = cfg_check_sizes(r, hp);
    if (st) return st;
    /* A default larger than a tiny model's depth just means "all dense", as in transformers;
     * an explicit one is a mistake. */
    if (hp->first_k_dense_replace > hp->num_hidden_layers) {
        if (fkdr_given)
            return di_cfg_range(r, "first_k_dense_replace", hp->first_k_dense_replace, 0,
                             hp->num_hidden_layers);
        hp->first_k_dense_replace = hp->num_hidden_layers;
    }
    if (!(hp->rms_norm_eps > 0) || !isfinite(hp->rms_norm_eps))
        return di_error(DI_ERR_CONFIG, "%s: field \"rms_norm_eps\" = %g must be positive", r->path,
                        hp->rms_norm_eps);
    if (!(hp->rope.theta > 0) || !isfinite(hp->rope.theta))
        return di_error(DI_ERR_CONFIG, "%s: field \"rope_theta\" = %g must be positive", r->path,
                        hp->rope.theta);
    if (!isfinite(hp->routed_scaling_factor) || hp->routed_scaling_factor <= 0)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"routed_scaling_factor\" = %g must be "
                        "positive",
                        r->path, hp->routed_scaling_factor);
    return cfg_check_moe(r, hp);
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                               */
/* ---------------------------------------------------------------------------------------- */

static di_status cfg_parse_root(const di_cfg_reader *r, di_hparams *hp) {
    di_status st = cfg_family(r, hp);
    if (st) return st;
    if (hp->family == DI_FAMILY_DEEPSEEK_V4 || di_config_v4_fields_present(r->root))
        return di_config_v4_parse(r->root, r->path, hp); /* V4, or refuses V4 fields in V2/V3 */
    const cfg_defaults *d = hp->family == DI_FAMILY_DEEPSEEK_V2   ? &g_defaults_v2
                            : hp->family == DI_FAMILY_DEEPSEEK_V3 ? &g_defaults_v3
                                                                  : &g_defaults_v32;
    st = cfg_sizes(r, d, hp);
    if (!st) st = cfg_mla(r, hp);
    if (!st) st = cfg_moe(r, d, hp);
    if (!st) st = di_cfg_token(r, "bos_token_id", &hp->bos_token_id);
    if (!st) st = di_cfg_token(r, "eos_token_id", &hp->eos_token_id);
    if (!st) st = cfg_dtype(r, hp);
    if (!st) st = cfg_rope(r, hp);
    if (!st) st = cfg_quant(r, hp);
    if (!st) st = cfg_check(r, hp, di_cfg_get(r->root, "first_k_dense_replace") != NULL);
    return st;
}

di_status di_config_parse(const char *json, size_t len, const char *path, di_hparams *out) {
    if (!path) path = "config.json";
    if (!json || !out) return di_error(DI_ERR_INVALID_ARG, "%s: NULL argument", path);
    json_error_t err;
    json_t *root = json_loadb(json, len, 0, &err);
    if (!root)
        return di_error(DI_ERR_CONFIG, "%s: not valid JSON: %s (line %d, column %d)", path,
                        err.text, err.line, err.column);
    di_status st = DI_OK;
    if (!json_is_object(root)) st = di_error(DI_ERR_CONFIG, "%s: not a JSON object", path);
    di_cfg_reader r = {root, path};
    di_hparams hp;
    memset(&hp, 0, sizeof hp);
    if (!st) st = cfg_parse_root(&r, &hp);
    json_decref(root);
    if (!st) *out = hp;
    return st;
}

di_status di_config_load_dir(const char *dir, di_hparams *out) {
    char *path = di_path_join(dir, "config.json");
    if (!path) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    char *text;
    size_t len;
    di_status st = di_read_file(path, &text, &len);
    if (!st) {
        st = di_config_parse(text, len, path, out);
        di_free(text);
    }
    di_free(path);
    return st;
}

bool di_hparams_layer_is_moe(const di_hparams *hp, int64_t il) {
    return hp->n_routed_experts > 0 && il >= hp->first_k_dense_replace && hp->moe_layer_freq > 0 &&
           il % hp->moe_layer_freq == 0;
}
