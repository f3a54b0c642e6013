/*
 * registry.c -- family -> architecture vtable, one line per architecture.
 */
#include "model/model.h"

#include <stdio.h>

static const struct {
    di_family family;
    const di_arch_vtable *arch;
} g_registry[] = {
    {DI_FAMILY_DEEPSEEK_V2, &di_arch_deepseek_v3}, /* V2 / V2-Lite: same code path */
    {DI_FAMILY_DEEPSEEK_V3, &di_arch_deepseek_v3}, /* V3 / V3.1 / R1 */
    {DI_FAMILY_DEEPSEEK_V4, &di_arch_deepseek_v4}, /* V4 Flash / Pro */
};

const di_arch_vtable *di_arch_lookup(const di_hparams *hp, const char *config_path) {
    for (size_t i = 0; i < DI_ARRAY_LEN(g_registry); i++)
        if (g_registry[i].family == hp->family) return g_registry[i].arch;
    di_error(DI_ERR_UNSUPPORTED,
             "%s: architecture \"%s\" (model_type \"%s\") is not supported yet "
             "(supported: DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)",
             config_path, hp->architecture, hp->model_type);
    return NULL;
}
