/*
 * model.h -- the architecture interface and registry.
 *
 * An architecture (a model family) is one vtable: it binds a checkpoint's tensors into its
 * own weight struct, reports info, creates per-sequence state (cache + activation buffers)
 * and runs the forward pass against the backend op interface. The registry maps a parsed
 * config (di_hparams.family) to its vtable, one line per architecture; nothing else in the
 * engine switches on the architecture.
 *
 * Ownership: the weights object is immutable after load and may be shared by any number of
 * states (contexts); it keeps pointers into the di_st_set, which must outlive it. A state
 * belongs to one sequence and is used from one thread at a time.
 */
#ifndef DI_MODEL_H
#define DI_MODEL_H

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"

#include <stdint.h>

/* One forward call: n tokens at positions pos0 .. pos0 + n - 1 appended to the sequence.
 * If logits != NULL, rows for the last n_logits tokens are written to it,
 * [n_logits][vocab_size]. The state's cache rows [pos0, pos0 + n) are overwritten. */
typedef struct di_forward_args {
    const int32_t *ids; /* [n] */
    int64_t n;
    int64_t pos0;
    float *logits; /* [n_logits][vocab] or NULL */
    int64_t n_logits;
} di_forward_args;

typedef struct di_arch_vtable {
    const char *name;
    /* Binds and checks every tensor; hp and st are borrowed and must outlive the weights.
     * `dir` is only used in error messages. */
    di_status (*load)(const di_hparams *hp, const di_st_set *st, const char *dir, void **out);
    void (*free)(void *weights);
    /* Fills the counts, sizes and dtypes of *out (the caller fills the config fields). */
    void (*info)(const void *weights, di_model_info *out);
    /* Per-sequence state for up to max_tokens positions. */
    di_status (*state_create)(const void *weights, int64_t max_tokens, void **out);
    void (*state_free)(void *state);
    /* Runs the tokens through the model. Arguments are validated by the caller
     * (ids in range, pos0 + n <= max_tokens). Allocates nothing. */
    void (*forward)(const void *weights, void *state, const di_backend *be,
                    const di_forward_args *args);
} di_arch_vtable;

/* The vtable for a parsed config, or NULL with an error naming the architecture and
 * `config_path` if it is not supported. */
const di_arch_vtable *di_arch_lookup(const di_hparams *hp, const char *config_path);

/* DeepSeek-V2 / V3 (deepseek_v3.c). */
extern const di_arch_vtable di_arch_deepseek_v3;
/* DeepSeek-V4 Flash / Pro (deepseek_v4.c). */
extern const di_arch_vtable di_arch_deepseek_v4;

#endif /* DI_MODEL_H */
