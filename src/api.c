/*
 * api.c -- the public model and context API of include/deepinfer.h.
 *
 * A di_model is: the folder's parsed config, the memory-mapped safetensors set, the
 * architecture's bound weights (views into the mapping, or their device copies when the
 * model was loaded for CUDA), its memory backend and a thread pool. It is immutable
 * after di_model_load and may back several contexts (used one thread at a time each; contexts
 * that share the model's pool must not run concurrently).
 *
 * A di_context is one sequence: the architecture's state (cache + activation buffers, sized
 * once from max_tokens), a backend bound to a pool, and n_past. di_context_eval validates
 * everything a caller can get wrong before touching any state, so a failed call leaves the
 * context as it was.
 */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/core.h"

#define DI_CONTEXT_DEFAULT_TOKENS 4096
#include "core/threadpool.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "api_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct di_context {
    di_model *model;   /* borrowed */
    di_pool *own_pool; /* owned when the context asked for its own thread count, else NULL */
    di_backend be;     /* owned */
    void *state;       /* owned through model->arch->state_free */
    int64_t max_tokens, n_past;
};

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                     */
/* ---------------------------------------------------------------------------------------- */

di_model_params di_model_default_params(void) {
    di_model_params p = {.n_threads = 0, .verbose = false, .device = NULL};
    return p;
}

const char *di_backends_compiled(void) {
#ifdef DI_HAVE_CUDA
    return "cpu cuda";
#else
    return "cpu";
#endif
}

di_status di_cuda_devices(di_device_info *out, int32_t cap, int32_t *n) {
    if (!n || (cap > 0 && !out))
        return di_error(DI_ERR_INVALID_ARG, "di_cuda_devices: NULL argument");
    return di_cuda_list_devices(out, cap, n);
}

di_status di_device_parse(const char *device, int *cuda_device) {
    *cuda_device = -1;
    if (!device || !device[0] || strcmp(device, "cpu") == 0) return DI_OK;
    if (strcmp(device, "cuda") == 0) {
        *cuda_device = 0;
        return DI_OK;
    }
    if (strncmp(device, "cuda:", 5) == 0 && device[5] >= '0' && device[5] <= '9') {
        char *end = NULL;
        long v = strtol(device + 5, &end, 10);
        if (*end == '\0' && v >= 0 && v < 1024) {
            *cuda_device = (int)v;
            return DI_OK;
        }
    }
    return di_error(DI_ERR_INVALID_ARG, "device \"%s\": expected cpu, cuda or cuda:N", device);
}

di_status (*di_backend_init_override)(const di_model *m, di_pool *pool, int64_t max_ctx,
                                      di_backend *out) = NULL;

di_status di_model_backend_init(const di_model *m, di_pool *pool, int64_t max_ctx,
                                di_backend *out) {
    if (di_backend_init_override) return di_backend_init_override(m, pool, max_ctx, out);
    if (m->cuda_device >= 0) return di_backend_cuda_init(out, m->cuda_device, max_ctx);
    return di_backend_cpu_init(out, pool, max_ctx);
}

int64_t di_model_device_free(const di_model *m) {
    return m->cuda_device >= 0 ? di_cuda_device_free_bytes(m->cuda_device) : -1;
}

di_status di_model_load(const char *dir, const di_model_params *params, di_model **out) {
    if (!dir || !out) return di_error(DI_ERR_INVALID_ARG, "di_model_load: NULL argument");
    *out = NULL;
    di_model_params p = params ? *params : di_model_default_params();
    double t0 = di_time_now();

    di_model *m = di_calloc(1, sizeof *m);
    if (!m) return di_error(DI_ERR_OUT_OF_MEMORY, "di_model_load: out of memory");
    di_status st = DI_OK;
    m->dir = di_strdup(dir);
    if (!m->dir) st = di_error(DI_ERR_OUT_OF_MEMORY, "di_model_load: out of memory");
    m->cuda_device = -1;
    if (!st) st = di_device_parse(p.device, &m->cuda_device);
    if (!st) st = di_config_load_dir(dir, &m->hp);
    if (!st) {
        char *cfg = di_path_join(dir, "config.json");
        m->arch = di_arch_lookup(&m->hp, cfg ? cfg : "config.json");
        di_free(cfg);
        if (!m->arch) st = DI_ERR_UNSUPPORTED;
    }
    if (!st) st = di_st_open_dir(dir, &m->st);
    if (!st) {
        m->pool = di_pool_create(p.n_threads);
        if (!m->pool) st = DI_ERR_INTERNAL;
    }
    /* The memory backend only allocates and uploads: no attention scratch (max_ctx 1). */
    if (!st) st = di_model_backend_init(m, m->pool, 1, &m->be);
    if (!st) st = m->arch->load(&m->hp, m->st, dir, &m->be, &m->weights);
    if (st) {
        di_model_free(m);
        return st;
    }
    if (p.verbose)
        di_log(DI_LOG_INFO, "%s: loaded %s (%lld layers) in %.2f s with %d threads on %s", dir,
               m->hp.architecture, (long long)m->hp.num_hidden_layers, di_time_now() - t0,
               di_pool_size(m->pool), m->be.ops->name);
    *out = m;
    return DI_OK;
}

void di_model_free(di_model *m) {
    if (!m) return;
    if (m->weights) m->arch->free(m->weights);
    di_backend_free(&m->be);
    di_pool_free(m->pool);
    di_st_close(m->st);
    di_free(m->dir);
    di_free(m);
}

static const char *family_name(di_family f) {
    switch (f) {
    case DI_FAMILY_DEEPSEEK_V2:
        return "deepseek_v2";
    case DI_FAMILY_DEEPSEEK_V3:
        return "deepseek_v3";
    case DI_FAMILY_DEEPSEEK_V32:
        return "deepseek_v32";
    case DI_FAMILY_DEEPSEEK_V4:
        return "deepseek_v4";
    }
    return "unknown";
}

di_status di_model_get_info(const di_model *m, di_model_info *out) {
    if (!m || !out) return di_error(DI_ERR_INVALID_ARG, "di_model_get_info: NULL argument");
    memset(out, 0, sizeof *out);
    const di_hparams *hp = &m->hp;
    snprintf(out->architecture, sizeof out->architecture, "%s", hp->architecture);
    snprintf(out->family, sizeof out->family, "%s", family_name(hp->family));
    out->vocab_size = hp->vocab_size;
    out->hidden_size = hp->hidden_size;
    out->n_layers = hp->num_hidden_layers;
    out->max_context = hp->max_position_embeddings;
    out->bos_token_id = hp->bos_token_id;
    out->eos_token_id = hp->eos_token_id;
    m->arch->info(m->weights, out);
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Contexts                                                                                   */
/* ---------------------------------------------------------------------------------------- */

di_context_params di_context_default_params(void) {
    di_context_params p = {.max_tokens = 0, .n_threads = 0};
    return p;
}

di_status di_context_create(di_model *model, const di_context_params *params, di_context **out) {
    if (!model || !out) return di_error(DI_ERR_INVALID_ARG, "di_context_create: NULL argument");
    *out = NULL;
    di_context_params p = params ? *params : di_context_default_params();
    /* The default is a working length, not the model's full context: a V3 cache sized for
     * 163,840 positions would take tens of GB before the first token. */
    int64_t max_tokens = p.max_tokens > 0
                             ? p.max_tokens
                             : DI_MIN(DI_CONTEXT_DEFAULT_TOKENS, model->hp.max_position_embeddings);
    if (max_tokens <= 0)
        return di_error(DI_ERR_INVALID_ARG, "di_context_create: max_tokens must be positive");

    di_context *c = di_calloc(1, sizeof *c);
    if (!c) return di_error(DI_ERR_OUT_OF_MEMORY, "di_context_create: out of memory");
    c->model = model;
    c->max_tokens = max_tokens;
    di_pool *pool = model->pool;
    di_status st = DI_OK;
    if (p.n_threads > 0 && p.n_threads != di_pool_size(model->pool)) {
        c->own_pool = di_pool_create(p.n_threads);
        if (!c->own_pool) st = DI_ERR_INTERNAL;
        pool = c->own_pool;
    }
    if (!st) st = di_model_backend_init(model, pool, max_tokens, &c->be);
    if (!st) st = model->arch->state_create(model->weights, max_tokens, &c->state);
    if (st) {
        di_context_free(c);
        return st;
    }
    *out = c;
    return DI_OK;
}

void di_context_free(di_context *c) {
    if (!c) return;
    if (c->state) c->model->arch->state_free(c->state);
    di_backend_free(&c->be);
    di_pool_free(c->own_pool);
    di_free(c);
}

void di_context_reset(di_context *c) {
    if (c) c->n_past = 0;
}

int64_t di_context_n_past(const di_context *c) {
    return c ? c->n_past : 0;
}

di_status di_context_eval(di_context *c, const int32_t *ids, int64_t n_ids, float *logits,
                          int64_t n_logits) {
    if (!c || !ids) return di_error(DI_ERR_INVALID_ARG, "di_context_eval: NULL argument");
    if (n_ids <= 0)
        return di_error(DI_ERR_INVALID_ARG, "di_context_eval: n_ids = %lld must be positive",
                        (long long)n_ids);
    if (logits && (n_logits < 1 || n_logits > n_ids))
        return di_error(DI_ERR_INVALID_ARG, "di_context_eval: n_logits = %lld must be in [1, %lld]",
                        (long long)n_logits, (long long)n_ids);
    if (n_ids > c->max_tokens - c->n_past)
        return di_error(DI_ERR_RANGE,
                        "di_context_eval: %lld tokens do not fit: %lld of %lld "
                        "positions used",
                        (long long)n_ids, (long long)c->n_past, (long long)c->max_tokens);
    const int64_t vocab = c->model->hp.vocab_size;
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return di_error(DI_ERR_RANGE,
                            "di_context_eval: token id %d at index %lld is outside "
                            "the vocabulary [0, %lld)",
                            ids[i], (long long)i, (long long)vocab);
    di_forward_args a = {.ids = ids,
                         .n = n_ids,
                         .pos0 = c->n_past,
                         .logits = logits,
                         .n_logits = logits ? n_logits : 0};
    c->model->arch->forward(c->model->weights, c->state, &c->be, &a);
    /* Ops cannot fail one by one; a device reports their first error here. The positions
     * are not committed then. */
    di_status st = c->be.ops->sync(c->be.ctx);
    if (st) return di_error_prefix(st, "di_context_eval");
    c->n_past += n_ids;
    return DI_OK;
}
