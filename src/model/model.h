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
 *
 * Backends: a model is loaded for one backend kind, its "memory backend" (`be` of load,
 * owned by di_model and outliving the weights). When that backend has weight_upload (CUDA),
 * load makes one backend copy of every tensor the forward reads (norms included) and the
 * weights refer to those; otherwise (CPU) the views stay on the checkpoint mapping. States
 * allocate their caches and activation buffers through the same memory backend. The backend
 * passed to forward must be of the same kind and device (a context or engine makes its own,
 * e.g. its own CUDA stream on the model's device); the forward keeps host work to building
 * small inputs, one upload per chunk, and downloads (router logits, final logits).
 */
#ifndef DI_MODEL_H
#define DI_MODEL_H

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"

#include <stdbool.h>
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

/* ---- Batched forward (the engine's runner) -------------------------------------------- */

/* One sequence of a batch: n tokens at positions pos0 .. pos0 + n - 1 of that sequence. */
typedef struct di_batch_seq {
    const int32_t *ids; /* [n], all real ids */
    int64_t n;
    int64_t pos0;
    int64_t n_replay;           /* leading tokens whose paged rows exist: not written (V4) */
    const int32_t *block_table; /* covers positions 0 .. pos0 + n - 1 (paged caches) */
    int32_t slot;               /* per-sequence state slot (bounded window state, V4) */
    bool reset_state;           /* clear the slot's state before this piece */
    int64_t n_logits;           /* logits for the last n_logits tokens (0 .. n) */
    /* Its last logits row only decides a token that a device can find from its own copy
     * (di_sampler_device_draw): the draw with `sample`'s parameters (backend.h's
     * sample_rows), or the row's argmax when sample.temperature is greedy. A device runner
     * may then return the token instead of the row (di_batch_args.tokens). */
    bool device_draw;
    di_sample_row sample;
} di_batch_seq;

typedef struct di_batch_args {
    const di_batch_seq *seqs; /* [n_seqs] */
    int64_t n_seqs;
    float *logits; /* [sum of n_logits][vocab], in sequence order */
    /* NULL, or [sum of n_logits] set to -1 by the caller: a runner may set tokens[r] to the
     * token the host sampler would choose from logits row r (rows of device_draw sequences only) and
     * then leave row r unwritten -- a GPU runner so avoids downloading the rows of a decode step.
     * The caller takes tokens[r] >= 0 as the token. */
    int32_t *tokens;
    /* The engine's overlap loop on a device (backend.h: upload_async .. resolve_ids); false
     * and NULL otherwise. defer: a batch that is one decode chunk whose rows all return
     * tokens may be enqueued without waiting: the runner then sets *ticket to the backend
     * fence after which tokens[] holds them (fence_wait), else it runs the batch as usual and
     * sets *ticket = 0. pending_on_device: ids < 0 in seqs stand for tokens of the previous
     * batch, which the runner deferred: -1 - r is its row r, read on the device. */
    bool defer, pending_on_device;
    int64_t *ticket;
} di_batch_args;

/* Sizes of a batched runner state, fixed at creation (the forward allocates nothing). */
typedef struct di_batch_config {
    int64_t n_blocks, block_size; /* the paged KV pool */
    int32_t n_slots;              /* per-sequence state slots (max_running) */
    int64_t max_model_len;        /* longest sequence */
    int64_t max_batch_tokens;     /* tokens per forward call */
    /* NULL, or another batch state of the same weights and sizes whose KV pool and slot
     * states this one uses instead of allocating its own (its activation buffers stay its
     * own). The disaggregated engine gives its decode worker the prefill worker's state here:
     * both address the same blocks and slots, so handing a finished prefill to the decode
     * worker moves ownership of its block table and slot, not bytes. The scheduler keeps the
     * two from touching the same blocks or slots at once. `share` must outlive this state. A
     * runner whose workers have separate memories (two GPUs) would instead allocate its own
     * pool here and copy a handed-off request's blocks and slot. */
    const void *share;
} di_batch_config;

typedef struct di_arch_vtable {
    const char *name;
    /* Binds and checks every tensor; hp, st and be are borrowed and must outlive the
     * weights. `dir` is only used in error messages. An architecture that cannot run on `be`
     * fails with DI_ERR_UNSUPPORTED naming the backend. */
    di_status (*load)(const di_hparams *hp, const di_st_set *st, const char *dir,
                      const di_backend *be, void **out);
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
    /* Batched runner: a state over a paged KV pool and cfg->n_slots sequence slots (or those
     * of cfg->share), and a forward that runs the tokens of several sequences in one pass
     * (each weight read once per chunk of rows; attention per sequence through its block
     * table). Each row's result is independent of the other rows of the batch (batch
     * invariance). Two states sharing a pool may run forward_batch concurrently (own
     * backends) on disjoint blocks and slots. */
    di_status (*batch_state_create)(const void *weights, const di_batch_config *cfg, void **out);
    void (*batch_state_free)(void *state);
    void (*forward_batch)(const void *weights, void *state, const di_backend *be,
                          const di_batch_args *args);
    /* Tokens of window state to replay after a prefix-cache hit (0: none needed), and
     * whether prefix reuse is supported; the block size the architecture needs a multiple of. */
    int64_t (*replay_tokens)(const void *weights);
    bool (*prefix_cache_ok)(const void *weights);
    int64_t (*block_multiple)(const void *weights);
    /* Optional (NULL: not counted). Routed-expert weight reads since the last call, and the
     * counter reset: for every forward chunk and MoE layer, the number of distinct experts
     * its tokens were routed to (each is read once per chunk). Called by the thread that ran
     * the forward, after it. 0 where the backend's memory is not host-readable. */
    int64_t (*take_expert_loads)(void *state);
} di_arch_vtable;

/* The vtable for a parsed config, or NULL with an error naming the architecture and
 * `config_path` if it is not supported. */
const di_arch_vtable *di_arch_lookup(const di_hparams *hp, const char *config_path);

/* DeepSeek-V2 / V3 (deepseek_v3.c). */
extern const di_arch_vtable di_arch_deepseek_v3;
/* DeepSeek-V4 Flash / Pro (deepseek_v4.c). */
extern const di_arch_vtable di_arch_deepseek_v4;

#endif /* DI_MODEL_H */
