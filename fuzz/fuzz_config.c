/*
 * fuzz_config.c -- libFuzzer target: the input is config.json text.
 *
 * di_config_parse must return a status for any input; on success the hyper-parameters must
 * satisfy the invariants the model code relies on (checked below), so a validation gap shows
 * up as a crash here rather than as a division by zero in a model.
 */
#include "io/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    di_hparams hp;
    if (di_config_parse(text, size, "config.json", &hp) == DI_OK) {
        if (hp.hidden_size <= 0 || hp.num_hidden_layers <= 0 || hp.qk_rope_head_dim % 2 ||
            hp.moe_layer_freq <= 0 || hp.n_group <= 0 || !(hp.rms_norm_eps > 0))
            abort();
        if (hp.n_routed_experts > 0 &&
            (hp.n_routed_experts % hp.n_group || hp.topk_group > hp.n_group ||
             hp.num_experts_per_tok > hp.n_routed_experts || hp.num_experts_per_tok <= 0))
            abort();
        for (int64_t il = 0; il < hp.num_hidden_layers && il < 4; il++)
            (void)di_hparams_layer_is_moe(&hp, il);
    }
    free(text);
    return 0;
}
