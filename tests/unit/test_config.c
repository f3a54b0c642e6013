/*
 * test_config.c -- config.json parsing: DeepSeek-V2-Lite's published config, a DeepSeek-V3
 * style config (DeepSeek spelling, yarn, FP8), a transformers-5 spelling, defaults, and each
 * impossible or unsupported value with the field named in the message.
 *
 * Bad cases are made by editing a valid config with jansson (set or delete one field), so
 * each case differs from a known-good text in exactly one place.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/config.h"
#include "test.h"

#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

/* DeepSeek-V2-Lite's published config.json (values as in bench-peers/make_random_v2lite.py). */
static const char *V2_LITE =
    "{\"architectures\":[\"DeepseekV2ForCausalLM\"],\"attention_bias\":false,"
    "\"attention_dropout\":0.0,\"aux_loss_alpha\":0.001,\"bos_token_id\":0,"
    "\"eos_token_id\":1,\"first_k_dense_replace\":1,\"hidden_act\":\"silu\","
    "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":10944,"
    "\"kv_lora_rank\":512,\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v2\","
    "\"moe_intermediate_size\":1408,\"moe_layer_freq\":1,\"n_group\":1,\"n_routed_experts\":64,"
    "\"n_shared_experts\":2,\"norm_topk_prob\":false,\"num_attention_heads\":16,"
    "\"num_experts_per_tok\":6,\"num_hidden_layers\":27,\"num_key_value_heads\":16,"
    "\"pretraining_tp\":1,\"q_lora_rank\":null,\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,"
    "\"mscale\":0.707,\"mscale_all_dim\":0.707,\"original_max_position_embeddings\":4096,"
    "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":1.0,"
    "\"scoring_func\":\"softmax\",\"seq_aux\":true,\"tie_word_embeddings\":false,"
    "\"topk_group\":1,\"topk_method\":\"greedy\",\"torch_dtype\":\"bfloat16\","
    "\"transformers_version\":\"4.33.1\",\"use_cache\":true,\"v_head_dim\":128,"
    "\"vocab_size\":102400}";

/* DeepSeek-V3 in DeepSeek's own spelling (rope_scaling, torch_dtype, FP8). */
static const char *V3 =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\","
    "\"auto_map\":{\"AutoConfig\":\"configuration_deepseek.DeepseekV3Config\"},"
    "\"bos_token_id\":0,\"eos_token_id\":1,\"first_k_dense_replace\":3,\"hidden_size\":7168,"
    "\"intermediate_size\":18432,\"kv_lora_rank\":512,\"max_position_embeddings\":163840,"
    "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":8,\"n_routed_experts\":256,"
    "\"n_shared_experts\":1,\"norm_topk_prob\":true,\"num_attention_heads\":128,"
    "\"num_experts_per_tok\":8,\"num_hidden_layers\":61,\"num_key_value_heads\":128,"
    "\"num_nextn_predict_layers\":1,\"q_lora_rank\":1536,\"qk_nope_head_dim\":128,"
    "\"qk_rope_head_dim\":64,\"quantization_config\":{\"activation_scheme\":\"dynamic\","
    "\"fmt\":\"e4m3\",\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]},"
    "\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,\"beta_slow\":1,\"factor\":40,"
    "\"mscale\":1.0,\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,"
    "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":2.5,"
    "\"scoring_func\":\"sigmoid\",\"tie_word_embeddings\":false,\"topk_group\":4,"
    "\"topk_method\":\"noaux_tc\",\"torch_dtype\":\"bfloat16\",\"v_head_dim\":128,"
    "\"vocab_size\":129280}";

/* A small model in the transformers-5 spelling, leaving most routing knobs to defaults. */
static const char *V3_TF5 =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"model_type\":\"deepseek_v3\","
    "\"vocab_size\":1000,\"hidden_size\":64,\"intermediate_size\":128,"
    "\"moe_intermediate_size\":32,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
    "\"kv_lora_rank\":32,\"q_lora_rank\":48,\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":8,"
    "\"v_head_dim\":16,\"n_routed_experts\":16,\"num_experts_per_tok\":4,\"n_group\":4,"
    "\"topk_group\":2,\"first_k_dense_replace\":1,\"rope_interleave\":false,"
    "\"dtype\":\"float32\",\"eos_token_id\":[7,2],\"bos_token_id\":null,"
    "\"max_position_embeddings\":2048,\"rope_parameters\":{\"rope_type\":\"yarn\","
    "\"rope_theta\":50000.0,\"factor\":4.0,\"original_max_position_embeddings\":512,"
    "\"beta_fast\":0,\"truncate\":false,\"attention_factor\":1.25}}";

static di_status parse(const char *text, di_hparams *hp) {
    return di_config_parse(text, strlen(text), "config.json", hp);
}

TEST(v2_lite) {
    di_hparams hp;
    CHECK_MSG(parse(V2_LITE, &hp) == DI_OK, "%s", di_last_error());
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V2);
    CHECK(strcmp(hp.architecture, "DeepseekV2ForCausalLM") == 0);
    CHECK(strcmp(hp.model_type, "deepseek_v2") == 0);
    CHECK_EQ_INT(hp.vocab_size, 102400);
    CHECK_EQ_INT(hp.hidden_size, 2048);
    CHECK_EQ_INT(hp.intermediate_size, 10944);
    CHECK_EQ_INT(hp.moe_intermediate_size, 1408);
    CHECK_EQ_INT(hp.num_hidden_layers, 27);
    CHECK_EQ_INT(hp.num_attention_heads, 16);
    CHECK_EQ_INT(hp.max_position_embeddings, 163840);
    CHECK_NEAR(hp.rms_norm_eps, 1e-6, 1e-12);
    CHECK(!hp.tie_word_embeddings);
    CHECK_EQ_INT(hp.bos_token_id, 0);
    CHECK_EQ_INT(hp.eos_token_id, 1);
    CHECK_EQ_INT(hp.q_lora_rank, 0);
    CHECK_EQ_INT(hp.kv_lora_rank, 512);
    CHECK_EQ_INT(hp.qk_nope_head_dim, 128);
    CHECK_EQ_INT(hp.qk_rope_head_dim, 64);
    CHECK_EQ_INT(hp.v_head_dim, 128);
    CHECK(hp.rope_interleave);
    CHECK(hp.rope.scaling == DI_ROPE_YARN);
    CHECK_NEAR(hp.rope.theta, 10000, 0);
    CHECK_NEAR(hp.rope.factor, 40, 0);
    CHECK_EQ_INT(hp.rope.original_max_position_embeddings, 4096);
    CHECK_NEAR(hp.rope.beta_fast, 32, 0);
    CHECK_NEAR(hp.rope.beta_slow, 1, 0);
    CHECK_NEAR(hp.rope.mscale, 0.707, 1e-12);
    CHECK_NEAR(hp.rope.mscale_all_dim, 0.707, 1e-12);
    CHECK_NEAR(hp.rope.attention_factor, 0, 0);
    CHECK(hp.rope.truncate);
    CHECK_EQ_INT(hp.n_routed_experts, 64);
    CHECK_EQ_INT(hp.n_shared_experts, 2);
    CHECK_EQ_INT(hp.num_experts_per_tok, 6);
    CHECK_EQ_INT(hp.first_k_dense_replace, 1);
    CHECK_EQ_INT(hp.moe_layer_freq, 1);
    CHECK_EQ_INT(hp.n_group, 1);
    CHECK_EQ_INT(hp.topk_group, 1);
    CHECK(!hp.norm_topk_prob);
    CHECK_NEAR(hp.routed_scaling_factor, 1.0, 0);
    CHECK(hp.scoring_func == DI_SCORE_SOFTMAX);
    CHECK(hp.topk_method == DI_TOPK_GREEDY);
    CHECK_EQ_INT(hp.num_nextn_predict_layers, 0);
    CHECK(!hp.fp8);
    CHECK(strcmp(hp.dtype, "bfloat16") == 0);
    CHECK(!di_hparams_layer_is_moe(&hp, 0));
    CHECK(di_hparams_layer_is_moe(&hp, 1) && di_hparams_layer_is_moe(&hp, 26));
}

TEST(v3_deepseek_spelling) {
    di_hparams hp;
    CHECK_MSG(parse(V3, &hp) == DI_OK, "%s", di_last_error());
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V3);
    CHECK_EQ_INT(hp.hidden_size, 7168);
    CHECK_EQ_INT(hp.q_lora_rank, 1536);
    CHECK_EQ_INT(hp.num_hidden_layers, 61);
    CHECK_EQ_INT(hp.n_routed_experts, 256);
    CHECK_EQ_INT(hp.n_group, 8);
    CHECK_EQ_INT(hp.topk_group, 4);
    CHECK_EQ_INT(hp.num_nextn_predict_layers, 1);
    CHECK(hp.norm_topk_prob);
    CHECK_NEAR(hp.routed_scaling_factor, 2.5, 0);
    CHECK(hp.scoring_func == DI_SCORE_SIGMOID);
    CHECK(hp.topk_method == DI_TOPK_NOAUX_TC);
    CHECK(hp.rope.scaling == DI_ROPE_YARN);
    CHECK_NEAR(hp.rope.factor, 40, 0);
    CHECK_NEAR(hp.rope.mscale, 1.0, 0);
    CHECK_NEAR(hp.rope.mscale_all_dim, 1.0, 0);
    CHECK_EQ_INT(hp.rope.original_max_position_embeddings, 4096);
    CHECK(hp.fp8);
    CHECK_EQ_INT(hp.fp8_block[0], 128);
    CHECK_EQ_INT(hp.fp8_block[1], 128);
    CHECK_EQ_INT(hp.bos_token_id, 0);
    CHECK_EQ_INT(hp.eos_token_id, 1);
    CHECK(!di_hparams_layer_is_moe(&hp, 2) && di_hparams_layer_is_moe(&hp, 3));
}

TEST(v3_transformers5_spelling) {
    di_hparams hp;
    CHECK_MSG(parse(V3_TF5, &hp) == DI_OK, "%s", di_last_error());
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V3);
    CHECK(!hp.rope_interleave);
    CHECK(strcmp(hp.dtype, "float32") == 0);
    CHECK_EQ_INT(hp.eos_token_id, 7);
    CHECK_EQ_INT(hp.bos_token_id, -1);
    CHECK(hp.rope.scaling == DI_ROPE_YARN);
    CHECK_NEAR(hp.rope.theta, 50000, 0);
    CHECK_NEAR(hp.rope.factor, 4, 0);
    CHECK_EQ_INT(hp.rope.original_max_position_embeddings, 512);
    CHECK_NEAR(hp.rope.beta_fast, 32, 0); /* 0 means the default, as in transformers */
    CHECK_NEAR(hp.rope.beta_slow, 1, 0);
    CHECK_NEAR(hp.rope.mscale, 0, 0);
    CHECK_NEAR(hp.rope.attention_factor, 1.25, 0);
    CHECK(!hp.rope.truncate);
    /* Defaults of DeepseekV3Config. */
    CHECK_EQ_INT(hp.n_shared_experts, 1);
    CHECK_NEAR(hp.routed_scaling_factor, 2.5, 0);
    CHECK(hp.norm_topk_prob);
    CHECK(hp.scoring_func == DI_SCORE_SIGMOID && hp.topk_method == DI_TOPK_NOAUX_TC);
    CHECK_EQ_INT(hp.moe_layer_freq, 1);
    CHECK_EQ_INT(hp.num_nextn_predict_layers, 0);
    CHECK_NEAR(hp.rms_norm_eps, 1e-6, 1e-12);
    CHECK(!hp.tie_word_embeddings && !hp.fp8);
}

/* ---------------------------------------------------------------------------------------- */
/* Editing helpers                                                                            */
/* ---------------------------------------------------------------------------------------- */

/* Parses `base` with field `key` set to the JSON value `value` (NULL: field deleted). */
static di_status parse_edit(const char *base, const char *key, const char *value, di_hparams *hp) {
    json_t *root = json_loads(base, 0, NULL);
    if (value)
        json_object_set_new(root, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(root, key);
    char *text = json_dumps(root, 0);
    di_status st = parse(text, hp);
    free(text);
    json_decref(root);
    return st;
}

static void expect(const char *base, const char *key, const char *value, di_status want,
                   const char *sub) {
    di_hparams hp;
    memset(&hp, 0x5a, sizeof hp);
    di_status st = parse_edit(base, key, value, &hp);
    CHECK_MSG(st == want, "%s=%s: status %s, want %s (%s)", key, value ? value : "(deleted)",
              di_status_str(st), di_status_str(want), di_last_error());
    CHECK_MSG(strstr(di_last_error(), sub) && strstr(di_last_error(), "config.json"),
              "%s=%s: message \"%s\" lacks \"%s\"", key, value ? value : "(deleted)",
              di_last_error(), sub);
    /* A failed call leaves the output untouched. */
    CHECK(hp.hidden_size == 0x5a5a5a5a5a5a5a5aLL);
}

/* ---------------------------------------------------------------------------------------- */
/* Defaults and alternatives                                                                  */
/* ---------------------------------------------------------------------------------------- */

TEST(rope_variants) {
    di_hparams hp;
    /* rope_parameters with the default type: no scaling, theta from inside the object. */
    CHECK(parse_edit(V3_TF5, "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":1e6}",
                     &hp) == DI_OK);
    CHECK(hp.rope.scaling == DI_ROPE_NONE);
    CHECK_NEAR(hp.rope.theta, 1e6, 0);
    /* No rope object at all: top-level rope_theta, or 10000. */
    CHECK(parse_edit(V3_TF5, "rope_parameters", NULL, &hp) == DI_OK);
    CHECK(hp.rope.scaling == DI_ROPE_NONE);
    CHECK_NEAR(hp.rope.theta, 10000, 0);
    /* Legacy rope_scaling wins over rope_parameters; yarn without the optional keys. */
    CHECK(parse_edit(V3_TF5, "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":8}", &hp) ==
          DI_OK);
    CHECK(hp.rope.scaling == DI_ROPE_YARN);
    CHECK_NEAR(hp.rope.factor, 8, 0);
    CHECK_EQ_INT(hp.rope.original_max_position_embeddings, 2048); /* max_position_embeddings */
    CHECK_NEAR(hp.rope.theta, 10000, 0);
    CHECK(hp.rope.truncate);
    CHECK(parse_edit(V3_TF5, "rope_scaling",
                     "{\"type\":\"yarn\",\"factor\":null,\"original_max_position_embeddings\":512}",
                     &hp) == DI_OK);
    CHECK_NEAR(hp.rope.factor, 4.0, 0); /* 2048 / 512 */
    CHECK(parse_edit(V3_TF5, "rope_scaling", "{\"type\":\"linear\",\"factor\":2}", &hp) == DI_OK);
    CHECK(hp.rope.scaling == DI_ROPE_LINEAR);
    /* An empty rope_scaling is ignored, as Python's falsy {} is. */
    CHECK(parse_edit(V3_TF5, "rope_scaling", "{}", &hp) == DI_OK);
    CHECK_NEAR(hp.rope.theta, 50000, 0);
}

TEST(other_defaults) {
    di_hparams hp;
    /* Dense model: no experts, no MoE fields needed. */
    json_t *root = json_loads(V3_TF5, 0, NULL);
    json_object_del(root, "n_routed_experts");
    json_object_del(root, "moe_intermediate_size");
    json_object_del(root, "num_experts_per_tok");
    char *text = json_dumps(root, 0);
    CHECK_MSG(parse(text, &hp) == DI_OK, "%s", di_last_error());
    CHECK_EQ_INT(hp.n_routed_experts, 0);
    CHECK(!di_hparams_layer_is_moe(&hp, 2));
    free(text);
    json_decref(root);
    /* V3's default first_k_dense_replace (3) on a 3-layer model: all dense, no error. */
    CHECK(parse_edit(V3_TF5, "first_k_dense_replace", NULL, &hp) == DI_OK);
    CHECK_EQ_INT(hp.first_k_dense_replace, 3);
    CHECK(!di_hparams_layer_is_moe(&hp, 2));
    /* moe_layer_freq 2: every other layer from first_k_dense_replace on. */
    CHECK(parse_edit(V3_TF5, "moe_layer_freq", "2", &hp) == DI_OK);
    CHECK(!di_hparams_layer_is_moe(&hp, 1) && di_hparams_layer_is_moe(&hp, 2));
    /* Family from model_type when the architecture is absent; V32 shares V3's fields. */
    CHECK(parse_edit(V3_TF5, "architectures", NULL, &hp) == DI_OK);
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V3);
    CHECK(parse_edit(V3_TF5, "architectures", "[\"DeepseekV32ForCausalLM\"]", &hp) == DI_OK);
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V32);
    /* A fine-tune with its own model_type but the DeepSeek architecture. */
    CHECK(parse_edit(V3_TF5, "model_type", "\"kimi_k2\"", &hp) == DI_OK);
    CHECK(hp.family == DI_FAMILY_DEEPSEEK_V3);
    /* num_mtp_layers (transformers 5 name) is read when the DeepSeek name is absent. */
    CHECK(parse_edit(V3_TF5, "num_mtp_layers", "2", &hp) == DI_OK);
    CHECK_EQ_INT(hp.num_nextn_predict_layers, 2);
    /* V2's group-limited routing. */
    CHECK(parse_edit(V2_LITE, "topk_method", "\"group_limited_greedy\"", &hp) == DI_OK);
    CHECK(hp.topk_method == DI_TOPK_GROUP_LIMITED_GREEDY);
    CHECK(parse_edit(V3_TF5, "eos_token_id", "[]", &hp) == DI_OK && hp.eos_token_id == -1);
}

TEST(load_dir) {
    char dir[] = "/tmp/di-test-cfg-XXXXXX";
    if (!mkdtemp(dir)) SKIP("mkdtemp failed");
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(V2_LITE, f);
    fclose(f);
    di_hparams hp;
    CHECK_MSG(di_config_load_dir(dir, &hp) == DI_OK, "%s", di_last_error());
    CHECK_EQ_INT(hp.hidden_size, 2048);
    unlink(path);
    CHECK(di_config_load_dir(dir, &hp) == DI_ERR_IO);
    CHECK(strstr(di_last_error(), "config.json") != NULL);
    rmdir(dir);
}

/* ---------------------------------------------------------------------------------------- */
/* Bad configs                                                                                */
/* ---------------------------------------------------------------------------------------- */

TEST(missing_required) {
    static const char *req[] = {
        "vocab_size",        "hidden_size",           "num_hidden_layers",  "num_attention_heads",
        "kv_lora_rank",      "qk_nope_head_dim",      "qk_rope_head_dim",   "v_head_dim",
        "intermediate_size", "moe_intermediate_size", "num_experts_per_tok"};
    for (size_t i = 0; i < DI_ARRAY_LEN(req); i++) {
        char sub[64];
        snprintf(sub, sizeof sub, "field \"%s\" missing", req[i]);
        expect(V3, req[i], NULL, DI_ERR_CONFIG, sub);
        expect(V3, req[i], "null", DI_ERR_CONFIG, sub);
    }
    expect(V3, "rope_scaling", "{\"type\":\"yarn\"}", DI_ERR_CONFIG, "rope_scaling.factor");
}

TEST(wrong_types) {
    expect(V3, "hidden_size", "\"big\"", DI_ERR_CONFIG, "\"hidden_size\" must be an integer");
    expect(V3, "hidden_size", "7168.0", DI_ERR_CONFIG, "\"hidden_size\"");
    expect(V3, "rms_norm_eps", "\"tiny\"", DI_ERR_CONFIG, "\"rms_norm_eps\"");
    expect(V3, "tie_word_embeddings", "\"no\"", DI_ERR_CONFIG, "\"tie_word_embeddings\"");
    expect(V3, "eos_token_id", "\"</s>\"", DI_ERR_CONFIG, "\"eos_token_id\"");
    expect(V3, "architectures", "\"DeepseekV3ForCausalLM\"", DI_ERR_CONFIG, "architectures");
    expect(V3, "rope_scaling", "[1]", DI_ERR_CONFIG, "\"rope_scaling\"");
    expect(V3, "rope_scaling", "{\"type\":\"yarn\",\"factor\":\"x\"}", DI_ERR_CONFIG,
           "rope_scaling.factor");
    expect(V3, "quantization_config", "{\"quant_method\":\"fp8\",\"weight_block_size\":128}",
           DI_ERR_CONFIG, "weight_block_size");
    di_hparams hp;
    CHECK(di_config_parse("{\"a\":", 5, "config.json", &hp) == DI_ERR_CONFIG);
    CHECK(strstr(di_last_error(), "config.json: not valid JSON") != NULL);
    CHECK(di_config_parse("[]", 2, "config.json", &hp) == DI_ERR_CONFIG);
}

TEST(impossible_values) {
    expect(V3, "hidden_size", "0", DI_ERR_CONFIG, "\"hidden_size\" = 0");
    expect(V3, "vocab_size", "-5", DI_ERR_CONFIG, "\"vocab_size\"");
    expect(V3, "num_hidden_layers", "0", DI_ERR_CONFIG, "\"num_hidden_layers\"");
    expect(V3, "v_head_dim", "99999999999", DI_ERR_CONFIG, "\"v_head_dim\"");
    expect(V3, "num_experts_per_tok", "300", DI_ERR_CONFIG, "\"num_experts_per_tok\"");
    expect(V3, "n_group", "7", DI_ERR_CONFIG, "\"n_group\" = 7 does not divide");
    expect(V3, "n_group", "0", DI_ERR_CONFIG, "\"n_group\"");
    expect(V3, "n_group", "256", DI_ERR_CONFIG, "\"num_experts_per_tok\" = 8 exceeds");
    expect(V3, "topk_group", "9", DI_ERR_CONFIG, "\"topk_group\"");
    expect(V3, "qk_rope_head_dim", "63", DI_ERR_CONFIG, "\"qk_rope_head_dim\" = 63 must be even");
    expect(V3, "rms_norm_eps", "0", DI_ERR_CONFIG, "\"rms_norm_eps\"");
    expect(V3, "rms_norm_eps", "-1e-6", DI_ERR_CONFIG, "\"rms_norm_eps\"");
    expect(V3, "first_k_dense_replace", "62", DI_ERR_CONFIG, "\"first_k_dense_replace\"");
    expect(V3, "moe_layer_freq", "0", DI_ERR_CONFIG, "\"moe_layer_freq\"");
    expect(V3, "rope_theta", "0", DI_ERR_CONFIG, "\"rope_theta\"");
    expect(V3, "rope_scaling", "{\"type\":\"yarn\",\"factor\":0.5}", DI_ERR_CONFIG,
           "rope_scaling.factor");
    expect(V3, "eos_token_id", "-3", DI_ERR_CONFIG, "\"eos_token_id\"");
}

TEST(unsupported) {
    expect(V3, "architectures", "[\"LlamaForCausalLM\"]", DI_ERR_UNSUPPORTED,
           "\"LlamaForCausalLM\"");
    /* A V3 file relabelled as V4: the V4 parser refuses the mixed fields. */
    expect(V3, "architectures", "[\"DeepseekV4ForCausalLM\"]", DI_ERR_CONFIG,
           "V3 and V4 fields mixed");
    expect(V3, "rope_scaling", "{\"type\":\"dynamic\",\"factor\":2}", DI_ERR_UNSUPPORTED,
           "rope type \"dynamic\"");
    expect(V3, "quantization_config", "{\"quant_method\":\"gptq\",\"bits\":4}", DI_ERR_UNSUPPORTED,
           "quant_method \"gptq\"");
    expect(V3, "quantization_config", "{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\"}",
           DI_ERR_UNSUPPORTED, "\"e5m2\"");
    expect(V3, "scoring_func", "\"relu\"", DI_ERR_UNSUPPORTED, "\"scoring_func\"");
    expect(V3, "topk_method", "\"random\"", DI_ERR_UNSUPPORTED, "\"topk_method\"");
    json_t *root = json_loads(V3, 0, NULL);
    json_object_del(root, "architectures");
    json_object_set_new(root, "model_type", json_string("deepseek_v4"));
    char *text = json_dumps(root, 0);
    di_hparams hp;
    CHECK(parse(text, &hp) == DI_ERR_CONFIG);
    CHECK(strstr(di_last_error(), "DeepSeek-V4") != NULL);
    free(text);
    json_decref(root);
}

int main(void) {
    RUN(v2_lite);
    RUN(v3_deepseek_spelling);
    RUN(v3_transformers5_spelling);
    RUN(rope_variants);
    RUN(other_defaults);
    RUN(load_dir);
    RUN(missing_required);
    RUN(wrong_types);
    RUN(impossible_values);
    RUN(unsupported);
    return test_summary();
}
