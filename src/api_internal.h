/*
 * api_internal.h -- the definition of the public di_model handle, shared by api.c (models and
 * contexts) and the engine (engine.c). Private to the library.
 *
 * A di_model is immutable after di_model_load; engines and contexts borrow it.
 */
#ifndef DI_API_INTERNAL_H
#define DI_API_INTERNAL_H

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
};

#endif /* DI_API_INTERNAL_H */
