/*
 * config_v4.c -- config.json -> di_hparams + di_v4_hparams for DeepSeek-V4 (see config_v4.h).
 *
 * Design stance:
 *   - Defaults are transformers 5.17's DeepseekV4Config (= V4-Flash values), because the
 *     goldens are computed with it; sizes that define tensor shapes are required.
 *   - The layer schedule is resolved here into one kind + compress rate per layer, so the
 *     model never looks at spellings. Precedence: layer_types (transformers), else
 *     compress_ratios (upstream), else transformers' default (the V4-Pro pattern: two HCA
 *     layers, then HCA / CSA alternating). When both spellings are present they must agree.
 *   - The MLP schedule: mlp_layer_types, else num_hash_layers (first k layers hash-routed).
 *   - RoPE: main (sliding layers) and compress (CSA / HCA layers). transformers nests them in
 *     rope_parameters {main, compress}; upstream has rope_theta, compress_rope_theta and one
 *     rope_scaling that applies to the compress rope only (YaRN never touches sliding layers).
 *   - Errors name the file and the field; nothing is written to *hp unless config.c's caller
 *     copies the local result out on success.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/config.h"
#include "io/config_json.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define V4_MAX_SIZE ((int64_t)1 << 32)

static const char *g_kind_names[] = {"sliding_attention", "compressed_sparse_attention",
                                     "heavily_compressed_attention"};

const char *di_v4_layer_kind_name(di_v4_layer_kind k) {
    return (unsigned)k < 3 ? g_kind_names[k] : "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* Shared fields                                                                              */
/* ---------------------------------------------------------------------------------------- */

/* Fields only V4 defines (V3.2 shares index_*, and layer_types is generic in transformers,
 * so those are not listed). */
static const char *g_v4_only[] = {
    "compress_ratios", "compress_rates", "mlp_layer_types", "hc_mult",      "hc_sinkhorn_iters",
    "o_groups",        "o_lora_rank",    "num_hash_layers", "swiglu_limit", "compress_rope_theta"};

static const char *v4_only_field(const json_t *root) {
    for (size_t i = 0; i < DI_ARRAY_LEN(g_v4_only); i++)
        if (di_cfg_get(root, g_v4_only[i])) return g_v4_only[i];
    return NULL;
}

bool di_config_v4_fields_present(const json_t *root) {
    return v4_only_field(root) != NULL;
}

/* V2/V3 MLA / dense-MLP fields have no meaning in V4: their presence means a mixed-up file. */
static di_status reject_v3_fields(const di_cfg_reader *r) {
    static const char *v3[] = {
        "kv_lora_rank",   "qk_nope_head_dim", "v_head_dim", "first_k_dense_replace",
        "moe_layer_freq", "n_group",          "topk_group"};
    for (size_t i = 0; i < DI_ARRAY_LEN(v3); i++)
        if (di_cfg_get(r->root, v3[i]))
            return di_error(DI_ERR_CONFIG,
                            "%s: DeepSeek-V4 config has the V2/V3 field \"%s\" (V3 and V4 fields "
                            "mixed)",
                            r->path, v3[i]);
    return DI_OK;
}

static di_status shared_fields(const di_cfg_reader *r, di_hparams *hp) {
    const json_t *o = r->root;
    di_status st = di_cfg_int(r, o, "", "vocab_size", 0, true, &hp->vocab_size);
    if (!st) st = di_cfg_int(r, o, "", "hidden_size", 0, true, &hp->hidden_size);
    if (!st) st = di_cfg_int(r, o, "", "num_hidden_layers", 0, true, &hp->num_hidden_layers);
    if (!st) st = di_cfg_int(r, o, "", "num_attention_heads", 0, true, &hp->num_attention_heads);
    if (!st)
        st = di_cfg_int(r, o, "", "max_position_embeddings", 1048576, false,
                     &hp->max_position_embeddings);
    if (!st) st = di_cfg_real(r, o, "", "rms_norm_eps", 1e-6, &hp->rms_norm_eps);
    if (!st) st = di_cfg_bool(r, r->root, "", "tie_word_embeddings", false, &hp->tie_word_embeddings);
    if (!st)
        st = di_cfg_int(r, o, "", "num_nextn_predict_layers", 0, false, &hp->num_nextn_predict_layers);
    if (!st) st = di_cfg_int(r, o, "", "n_routed_experts", 0, true, &hp->n_routed_experts);
    if (!st) st = di_cfg_int(r, o, "", "moe_intermediate_size", 0, true, &hp->moe_intermediate_size);
    if (!st) st = di_cfg_int(r, o, "", "num_experts_per_tok", 0, true, &hp->num_experts_per_tok);
    /* transformers always builds exactly one shared expert of moe_intermediate_size. */
    if (!st) st = di_cfg_int(r, o, "", "n_shared_experts", 1, false, &hp->n_shared_experts);
    if (!st) st = di_cfg_real(r, o, "", "routed_scaling_factor", 1.5, &hp->routed_scaling_factor);
    if (!st) st = di_cfg_token(r, "bos_token_id", &hp->bos_token_id);
    if (!st) st = di_cfg_token(r, "eos_token_id", &hp->eos_token_id);
    if (st) return st;
    hp->intermediate_size = hp->moe_intermediate_size; /* no dense MLP in V4 */
    hp->n_group = hp->topk_group = 1;
    hp->first_k_dense_replace = 0;
    hp->moe_layer_freq = 1;
    /* transformers renormalises the chosen weights whatever norm_topk_prob says. */
    hp->norm_topk_prob = true;
    hp->topk_method = DI_TOPK_GREEDY; /* plain top-k of score + bias */
    const char *s;
    if ((st = di_cfg_str(r, o, "", "scoring_func", &s))) return st;
    if (!s || strcmp(s, "sqrtsoftplus") == 0)
        hp->scoring_func = DI_SCORE_SQRTSOFTPLUS;
    else if (strcmp(s, "sigmoid") == 0)
        hp->scoring_func = DI_SCORE_SIGMOID;
    else if (strcmp(s, "softmax") == 0)
        hp->scoring_func = DI_SCORE_SOFTMAX; /* upstream only (transformers cannot run it) */
    else
        return di_error(DI_ERR_UNSUPPORTED, "%s: field \"scoring_func\": \"%s\" is not supported",
                        r->path, s);
    const char *key = di_cfg_get(o, "dtype") ? "dtype" : "torch_dtype";
    if ((st = di_cfg_str(r, o, "", key, &s))) return st;
    if (s) snprintf(hp->dtype, sizeof hp->dtype, "%s", s);

    /* FP8 (upstream): e4m3 with E8M0 block scales; the block size is informative only. */
    const json_t *q = di_cfg_get(o, "quantization_config");
    if (q) {
        const char *method = NULL, *fmt = NULL;
        if (!json_is_object(q))
            return di_error(DI_ERR_CONFIG, "%s: field \"quantization_config\" must be an object",
                            r->path);
        if ((st = di_cfg_str(r, q, "quantization_config.", "quant_method", &method))) return st;
        if (!method || strcmp(method, "fp8") != 0)
            return di_error(DI_ERR_UNSUPPORTED,
                            "%s: quantization_config.quant_method \"%s\" is not supported", r->path,
                            method ? method : "(missing)");
        if ((st = di_cfg_str(r, q, "quantization_config.", "fmt", &fmt))) return st;
        if (fmt && strcmp(fmt, "e4m3") != 0)
            return di_error(DI_ERR_UNSUPPORTED,
                            "%s: field \"quantization_config.fmt\": \"%s\" is not supported",
                            r->path, fmt);
        hp->fp8 = true;
        hp->fp8_block[0] = hp->fp8_block[1] = 128;
    }
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Layer schedules                                                                            */
/* ---------------------------------------------------------------------------------------- */

static di_status compress_rates(const di_cfg_reader *r, int64_t *csa, int64_t *hca) {
    *csa = 4;
    *hca = 128;
    const json_t *o = di_cfg_get(r->root, "compress_rates");
    di_status st = DI_OK;
    if (o) {
        if (!json_is_object(o))
            return di_error(DI_ERR_CONFIG, "%s: field \"compress_rates\" must be an object",
                            r->path);
        st = di_cfg_int(r, o, "compress_rates.", g_kind_names[DI_V4_CSA], *csa, false, csa);
        if (!st) st = di_cfg_int(r, o, "compress_rates.", g_kind_names[DI_V4_HCA], *hca, false, hca);
    }
    if (!st) st = di_cfg_int(r, r->root, "", "compress_rate_csa", *csa, false, csa);
    if (!st) st = di_cfg_int(r, r->root, "", "compress_rate_hca", *hca, false, hca);
    if (!st) st = di_cfg_range(r, "compress_rates.compressed_sparse_attention", *csa, 1, 1 << 20);
    if (!st) st = di_cfg_range(r, "compress_rates.heavily_compressed_attention", *hca, 1, 1 << 20);
    return st;
}

static di_status layer_schedule(const di_cfg_reader *r, int64_t L, int64_t n_mtp, di_v4_hparams *v) {
    int64_t csa, hca;
    di_status st = compress_rates(r, &csa, &hca);
    if (st) return st;
    const json_t *types = di_cfg_get(r->root, "layer_types");
    const json_t *ratios = di_cfg_get(r->root, "compress_ratios");
    if (types) {
        if (!json_is_array(types) || (int64_t)json_array_size(types) != L)
            return di_error(DI_ERR_CONFIG,
                            "%s: field \"layer_types\" must be a list of num_hidden_layers = %lld "
                            "layer types (has %lld)",
                            r->path, (long long)L,
                            (long long)(json_is_array(types) ? json_array_size(types) : 0));
        for (int64_t i = 0; i < L; i++) {
            const char *s = json_string_value(json_array_get(types, (size_t)i));
            int k = -1;
            for (int j = 0; s && j < 3; j++)
                if (strcmp(s, g_kind_names[j]) == 0) k = j;
            if (k < 0)
                return di_error(DI_ERR_UNSUPPORTED,
                                "%s: field \"layer_types[%lld]\": unknown layer type \"%s\" "
                                "(known: sliding_attention, compressed_sparse_attention, "
                                "heavily_compressed_attention)",
                                r->path, (long long)i, s ? s : "(not a string)");
            v->layer_kind[i] = (uint8_t)k;
            v->compress_rate[i] = k == DI_V4_SLIDING ? 0 : k == DI_V4_CSA ? csa : hca;
        }
    }
    if (ratios) {
        int64_t n = json_is_array(ratios) ? (int64_t)json_array_size(ratios) : -1;
        /* Upstream lists one ratio per layer plus one per MTP layer. */
        if (n != L && n != L + n_mtp)
            return di_error(DI_ERR_CONFIG,
                            "%s: field \"compress_ratios\" must be a list of num_hidden_layers = "
                            "%lld (+ %lld MTP) integers (has %lld)",
                            r->path, (long long)L, (long long)n_mtp, (long long)n);
        for (int64_t i = 0; i < L; i++) {
            const json_t *e = json_array_get(ratios, (size_t)i);
            int64_t m = json_is_integer(e) ? (int64_t)json_integer_value(e) : -1;
            if (m < 0 || m > (1 << 20))
                return di_error(DI_ERR_CONFIG,
                                "%s: field \"compress_ratios[%lld]\" must be an integer in "
                                "[0, 2^20]",
                                r->path, (long long)i);
            /* Upstream selects CSA by ratio == the CSA rate (4); any other non-zero is HCA. */
            uint8_t k = m == 0 ? DI_V4_SLIDING : m == csa ? DI_V4_CSA : DI_V4_HCA;
            if (types && (k != v->layer_kind[i] || m != v->compress_rate[i]))
                return di_error(DI_ERR_CONFIG,
                                "%s: fields \"layer_types\" and \"compress_ratios\" disagree at "
                                "layer %lld",
                                r->path, (long long)i);
            v->layer_kind[i] = k;
            v->compress_rate[i] = m;
        }
    }
    if (!types && !ratios) {
        /* transformers' default schedule (V4-Pro): HCA, HCA, then HCA / CSA alternating. */
        di_log(DI_LOG_WARN,
               "%s: no layer_types / compress_ratios; using transformers' default "
               "V4 schedule",
               r->path);
        for (int64_t i = 0; i < L; i++) {
            bool is_csa = i >= 2 && (i - 2) % 2 == 1;
            v->layer_kind[i] = is_csa ? DI_V4_CSA : DI_V4_HCA;
            v->compress_rate[i] = is_csa ? csa : hca;
        }
    }

    const json_t *mlp = di_cfg_get(r->root, "mlp_layer_types");
    int64_t n_hash = 0;
    if (mlp) {
        if (!json_is_array(mlp) || (int64_t)json_array_size(mlp) != L)
            return di_error(DI_ERR_CONFIG,
                            "%s: field \"mlp_layer_types\" must be a list of num_hidden_layers = "
                            "%lld MLP types",
                            r->path, (long long)L);
        for (int64_t i = 0; i < L; i++) {
            const char *s = json_string_value(json_array_get(mlp, (size_t)i));
            if (s && strcmp(s, "hash_moe") == 0)
                v->hash_moe[i] = true;
            else if (s && strcmp(s, "moe") == 0)
                v->hash_moe[i] = false;
            else
                return di_error(DI_ERR_UNSUPPORTED,
                                "%s: field \"mlp_layer_types[%lld]\": unknown MLP type \"%s\" "
                                "(known: hash_moe, moe)",
                                r->path, (long long)i, s ? s : "(not a string)");
        }
        return DI_OK;
    }
    if ((st = di_cfg_int(r, r->root, "", "num_hash_layers", 3, false, &n_hash))) return st;
    if ((st = di_cfg_range(r, "num_hash_layers", n_hash, 0, V4_MAX_SIZE))) return st;
    for (int64_t i = 0; i < L; i++)
        v->hash_moe[i] = i < n_hash;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* RoPE                                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* Reads one rope object (type default / yarn) into *rp; theta from the object if given. */
static di_status rope_object(const di_cfg_reader *r, const json_t *o, const char *where,
                             int64_t max_pos, di_v4_rope *rp) {
    const char *type = NULL;
    di_status st = di_cfg_str(r, o, where, "rope_type", &type);
    if (!st && !type) st = di_cfg_str(r, o, where, "type", &type);
    if (!st) st = di_cfg_real(r, o, where, "rope_theta", rp->theta, &rp->theta);
    if (st) return st;
    if (!type || strcmp(type, "default") == 0) {
        rp->yarn = false;
        return DI_OK;
    }
    if (strcmp(type, "yarn") != 0)
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: rope type \"%s\" (field \"%srope_type\") is not supported for "
                        "DeepSeek-V4 (default or yarn)",
                        r->path, type, where);
    rp->yarn = true;
    st = di_cfg_int(r, o, where, "original_max_position_embeddings", max_pos, false,
                 &rp->original_max_position_embeddings);
    if (!st)
        st = di_cfg_range(r, "original_max_position_embeddings", rp->original_max_position_embeddings, 1,
                   V4_MAX_SIZE);
    double ratio = (double)max_pos / (double)rp->original_max_position_embeddings;
    if (!st) st = di_cfg_real(r, o, where, "factor", ratio, &rp->factor);
    if (!st) st = di_cfg_real(r, o, where, "beta_fast", 32.0, &rp->beta_fast);
    if (!st) st = di_cfg_real(r, o, where, "beta_slow", 1.0, &rp->beta_slow);
    if (st) return st;
    if (rp->beta_fast == 0) rp->beta_fast = 32.0;
    if (rp->beta_slow == 0) rp->beta_slow = 1.0;
    if (!(rp->factor >= 1.0) || !isfinite(rp->factor))
        return di_error(DI_ERR_CONFIG, "%s: field \"%sfactor\" = %g is out of range", r->path,
                        where, rp->factor);
    return DI_OK;
}

static di_status rope(const di_cfg_reader *r, int64_t max_pos, di_v4_hparams *v) {
    di_status st = di_cfg_real(r, r->root, "", "rope_theta", 10000.0, &v->rope_main.theta);
    if (!st)
        st = di_cfg_real(r, r->root, "", "compress_rope_theta", 160000.0, &v->rope_compress.theta);
    if (st) return st;
    const json_t *rp = di_cfg_get(r->root, "rope_parameters");
    const json_t *rs = di_cfg_get(r->root, "rope_scaling");
    if (rp && !json_is_object(rp))
        return di_error(DI_ERR_CONFIG, "%s: field \"rope_parameters\" must be an object", r->path);
    if (rs && !json_is_object(rs))
        return di_error(DI_ERR_CONFIG, "%s: field \"rope_scaling\" must be an object", r->path);
    const json_t *main = rp ? di_cfg_get(rp, "main") : NULL, *comp = rp ? di_cfg_get(rp, "compress") : NULL;
    if (main || comp) { /* transformers' nested form */
        if ((main && !json_is_object(main)) || (comp && !json_is_object(comp)))
            return di_error(DI_ERR_CONFIG,
                            "%s: fields \"rope_parameters.main\" / \".compress\" must be objects",
                            r->path);
        if (main) st = rope_object(r, main, "rope_parameters.main.", max_pos, &v->rope_main);
        if (!st && comp)
            st = rope_object(r, comp, "rope_parameters.compress.", max_pos, &v->rope_compress);
        if (!st && v->rope_main.yarn)
            return di_error(DI_ERR_UNSUPPORTED,
                            "%s: YaRN on the main (sliding-layer) rope is not supported", r->path);
        return st;
    }
    /* Upstream / flat form: the scaling applies to the compress rope only, whose theta stays
     * compress_rope_theta (transformers overrides a rope_theta inside the object). */
    const json_t *flat = rs && json_object_size(rs) ? rs : rp && json_object_size(rp) ? rp : NULL;
    if (!flat) return DI_OK;
    double theta = v->rope_compress.theta;
    st = rope_object(r, flat, flat == rs ? "rope_scaling." : "rope_parameters.", max_pos,
                     &v->rope_compress);
    v->rope_compress.theta = theta;
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry point                                                                                */
/* ---------------------------------------------------------------------------------------- */

static di_status v4_sizes(const di_cfg_reader *r, const di_hparams *hp, di_v4_hparams *v) {
    const json_t *o = r->root;
    int64_t kvh = 1;
    di_status st = di_cfg_int(r, o, "", "head_dim", 0, true, &v->head_dim);
    if (!st) st = di_cfg_int(r, o, "", "q_lora_rank", 0, true, &v->q_lora_rank);
    if (!st) st = di_cfg_int(r, o, "", "o_lora_rank", 0, true, &v->o_lora_rank);
    if (!st) st = di_cfg_int(r, o, "", "o_groups", 0, true, &v->o_groups);
    if (!st) st = di_cfg_int(r, o, "", "sliding_window", 128, false, &v->sliding_window);
    if (!st) st = di_cfg_int(r, o, "", "index_n_heads", 64, false, &v->index_n_heads);
    if (!st) st = di_cfg_int(r, o, "", "index_head_dim", 128, false, &v->index_head_dim);
    if (!st) st = di_cfg_int(r, o, "", "index_topk", 512, false, &v->index_topk);
    if (!st) st = di_cfg_int(r, o, "", "hc_mult", 4, false, &v->hc_mult);
    if (!st) st = di_cfg_int(r, o, "", "hc_sinkhorn_iters", 20, false, &v->hc_sinkhorn_iters);
    if (!st) st = di_cfg_real(r, o, "", "hc_eps", 1e-6, &v->hc_eps);
    if (!st) st = di_cfg_real(r, o, "", "swiglu_limit", 10.0, &v->swiglu_limit);
    if (!st) st = di_cfg_int(r, o, "", "num_key_value_heads", 1, false, &kvh);
    if (st) return st;
    if (kvh != 1)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"num_key_value_heads\" = %lld: DeepSeek-V4 has one shared "
                        "K=V head",
                        r->path, (long long)kvh);
    /* rd as transformers resolves it: int(head_dim * partial_rotary_factor); without the
     * factor, upstream's qk_rope_head_dim; without either, 64 / 512 of head_dim. When both
     * are given they must agree. */
    double prf = 0.0;
    int64_t rd_given = -1;
    if ((st = di_cfg_real(r, o, "", "partial_rotary_factor", 0.0, &prf))) return st;
    if ((st = di_cfg_int(r, o, "", "qk_rope_head_dim", -1, false, &rd_given))) return st;
    if (prf > 0)
        v->rope_dim = (int64_t)((double)v->head_dim * prf);
    else
        v->rope_dim = rd_given >= 0 ? rd_given : (int64_t)((double)v->head_dim * (64.0 / 512.0));
    if (rd_given >= 0 && rd_given != v->rope_dim)
        return di_error(DI_ERR_CONFIG,
                        "%s: fields \"qk_rope_head_dim\" = %lld and \"partial_rotary_factor\" "
                        "(head_dim x %g = %lld) disagree",
                        r->path, (long long)rd_given, prf, (long long)v->rope_dim);

    const struct {
        const char *key;
        int64_t val, lo, hi;
    } f[] = {
        {"vocab_size", hp->vocab_size, 1, V4_MAX_SIZE},
        {"hidden_size", hp->hidden_size, 1, V4_MAX_SIZE},
        {"num_hidden_layers", hp->num_hidden_layers, 1, DI_V4_MAX_LAYERS},
        {"num_attention_heads", hp->num_attention_heads, 1, 1 << 16},
        {"max_position_embeddings", hp->max_position_embeddings, 1, V4_MAX_SIZE},
        {"num_nextn_predict_layers", hp->num_nextn_predict_layers, 0, 16},
        {"n_routed_experts", hp->n_routed_experts, 1, 1 << 20},
        {"moe_intermediate_size", hp->moe_intermediate_size, 1, V4_MAX_SIZE},
        {"num_experts_per_tok", hp->num_experts_per_tok, 1, hp->n_routed_experts},
        {"n_shared_experts", hp->n_shared_experts, 0, 1},
        {"head_dim", v->head_dim, 2, 1 << 16},
        {"qk_rope_head_dim", v->rope_dim, 2, DI_MIN(v->head_dim, 512)},
        {"q_lora_rank", v->q_lora_rank, 1, V4_MAX_SIZE},
        {"o_lora_rank", v->o_lora_rank, 1, V4_MAX_SIZE},
        {"o_groups", v->o_groups, 1, hp->num_attention_heads},
        {"sliding_window", v->sliding_window, 1, 1 << 24},
        {"index_n_heads", v->index_n_heads, 1, 1 << 16},
        {"index_head_dim", v->index_head_dim, 2, 1 << 16},
        {"index_topk", v->index_topk, 1, V4_MAX_SIZE},
        {"hc_mult", v->hc_mult, 1, 64},
        {"hc_sinkhorn_iters", v->hc_sinkhorn_iters, 1, 1 << 16},
    };
    for (size_t i = 0; i < DI_ARRAY_LEN(f); i++)
        if ((st = di_cfg_range(r, f[i].key, f[i].val, f[i].lo, f[i].hi))) return st;
    if (v->rope_dim % 2 != 0)
        return di_error(DI_ERR_CONFIG, "%s: field \"qk_rope_head_dim\" = %lld must be even",
                        r->path, (long long)v->rope_dim);
    if (v->index_head_dim < v->rope_dim)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"index_head_dim\" = %lld is smaller than the rope dims %lld",
                        r->path, (long long)v->index_head_dim, (long long)v->rope_dim);
    if (hp->num_attention_heads % v->o_groups != 0)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"o_groups\" = %lld does not divide num_attention_heads = %lld",
                        r->path, (long long)v->o_groups, (long long)hp->num_attention_heads);
    if (!(hp->rms_norm_eps > 0) || !(v->hc_eps >= 0) || !(v->swiglu_limit >= 0) ||
        !(hp->routed_scaling_factor > 0))
        return di_error(DI_ERR_CONFIG,
                        "%s: rms_norm_eps, hc_eps, swiglu_limit or routed_scaling_factor is "
                        "negative or not a number",
                        r->path);
    return DI_OK;
}

di_status di_config_v4_parse(const json_t *root, const char *path, di_hparams *hp) {
    di_cfg_reader r = {root, path};
    if (hp->family != DI_FAMILY_DEEPSEEK_V4)
        return di_error(DI_ERR_CONFIG,
                        "%s: %s config has the DeepSeek-V4 field \"%s\" (V3 and V4 fields mixed)",
                        path, hp->architecture[0] ? hp->architecture : hp->model_type,
                        v4_only_field(root) ? v4_only_field(root) : "?");
    di_v4_hparams *v = &hp->v4;
    memset(v, 0, sizeof *v);
    di_status st = reject_v3_fields(&r);
    if (!st) st = shared_fields(&r, hp);
    if (!st) st = v4_sizes(&r, hp, v);
    if (!st) st = layer_schedule(&r, hp->num_hidden_layers, hp->num_nextn_predict_layers, v);
    if (!st) st = rope(&r, hp->max_position_embeddings, v);
    if (st) return st;
    if (!(v->rope_main.theta > 0) || !(v->rope_compress.theta > 0))
        return di_error(DI_ERR_CONFIG,
                        "%s: fields \"rope_theta\" / \"compress_rope_theta\" must be positive",
                        path);
    /* Mirror into the shared fields that generic code (router, info) reads. */
    hp->qk_rope_head_dim = v->rope_dim;
    hp->q_lora_rank = v->q_lora_rank;
    hp->rope.theta = v->rope_main.theta;
    hp->rope_interleave = true;
    return DI_OK;
}
