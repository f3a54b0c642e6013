/*
 * api_internal.h -- the definition of the public di_model handle, shared by api.c (models and
 * contexts) and the engine (engine.c). Private to the library.
 *
 * A di_model is immutable after di_model_load; engines and contexts borrow it.
 */
#ifndef DI_API_INTERNAL_H
#define DI_API_INTERNAL_H

#include "backend/backend.h"
#include "core/threadpool.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"

struct di_model {
    char *dir;                  /* owned */
    di_hparams hp;              /* the weights point at this copy */
    di_st_set *st;              /* owned; the weights are views into it */
    di_pool *pool;              /* owned */
    const di_arch_vtable *arch; /* static */
    void *weights;              /* owned through arch->free */
    int cuda_device;            /* -1: the CPU backend; else the CUDA device index */
    di_backend be;              /* owned: the memory backend the weights live on (model.h) */
};

/* A compute backend of the model's kind for a context or engine: the CPU backend over pool,
 * or a CUDA backend (its own stream) on the model's device. max_ctx: the longest sequence. */
di_status di_model_backend_init(const di_model *m, di_pool *pool, int64_t max_ctx, di_backend *out);

/* Tests only (NULL otherwise): when set, di_model_backend_init returns its backend instead --
 * e.g. tests/e2e/test_device_loop.c's separate-memory CPU backend, which drives an engine
 * through the paths of a device without one. */
extern di_status (*di_backend_init_override)(const di_model *m, di_pool *pool, int64_t max_ctx,
                                             di_backend *out);

/* Free bytes of the model's device now (after its weights), or -1 on the CPU or when the
 * device cannot say. */
int64_t di_model_device_free(const di_model *m);

#endif /* DI_API_INTERNAL_H */
