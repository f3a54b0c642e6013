/*
 * v4_state.c -- DeepSeek-V4 per-sequence attention state (see v4_state.h).
 *
 * One allocation holds every layer's rows; it is carved in layer order. Layer kinds use the
 * values of di_v4_layer_kind (0 sliding, 1 CSA, 2 HCA) without including the config header,
 * so that src/kv depends on core only.
 */
#include "kv/v4_state.h"

#include <string.h>

enum { KIND_SLIDING = 0, KIND_CSA = 1, KIND_HCA = 2 };

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static size_t comp_bytes(int64_t m, int64_t cw) {
    return 2 * align64((size_t)(2 * m * cw) * sizeof(float));
}

/* Bytes layer il needs; with base != NULL also carves them from *base into L. */
static size_t layer_layout(di_v4_layer_state *L, char **base, int kind, int64_t m, int64_t W,
                           int64_t d, int64_t dI, int64_t max_tokens) {
    size_t total = align64((size_t)(W * d) * sizeof(float));
    int64_t me = kind == KIND_SLIDING ? 0 : max_tokens / m;
    int64_t cw = kind == KIND_CSA ? 2 * d : d, icw = 2 * dI;
    if (kind != KIND_SLIDING)
        total += align64((size_t)(me * d) * sizeof(float)) + comp_bytes(m, cw);
    if (kind == KIND_CSA) total += align64((size_t)(me * dI) * sizeof(float)) + comp_bytes(m, icw);
    if (!base) return total;

    char *p = *base;
    memset(L, 0, sizeof *L);
    L->kind = kind;
    L->m = m;
    L->max_entries = me;
    L->ring = (float *)p;
    p += align64((size_t)(W * d) * sizeof(float));
    if (kind != KIND_SLIDING) {
        L->entries = (float *)p;
        p += align64((size_t)(me * d) * sizeof(float));
        L->comp = (di_v4_comp_state){.m = m, .width = d, .cw = cw, .overlap = kind == KIND_CSA};
        L->comp.c = (float *)p;
        p += align64((size_t)(2 * m * cw) * sizeof(float));
        L->comp.z = (float *)p;
        p += align64((size_t)(2 * m * cw) * sizeof(float));
    }
    if (kind == KIND_CSA) {
        L->ientries = (float *)p;
        p += align64((size_t)(me * dI) * sizeof(float));
        L->icomp = (di_v4_comp_state){.m = m, .width = dI, .cw = icw, .overlap = true};
        L->icomp.c = (float *)p;
        p += align64((size_t)(2 * m * icw) * sizeof(float));
        L->icomp.z = (float *)p;
        p += align64((size_t)(2 * m * icw) * sizeof(float));
    }
    *base = p;
    return total;
}

di_status di_v4_state_init(di_v4_state *s, int64_t n_layers, const uint8_t *kinds,
                           const int64_t *rates, int64_t window, int64_t dim, int64_t index_dim,
                           int64_t max_tokens) {
    memset(s, 0, sizeof *s);
    size_t total = align64((size_t)n_layers * sizeof(di_v4_layer_state));
    for (int64_t il = 0; il < n_layers; il++)
        total += layer_layout(NULL, NULL, kinds[il], rates[il], window, dim, index_dim, max_tokens);
    s->mem = di_aligned_alloc(total);
    if (!s->mem)
        return di_error(DI_ERR_OUT_OF_MEMORY, "context: cannot allocate %zu bytes of V4 state",
                        total);
    memset(s->mem, 0, total);
    s->bytes = total;
    s->n_layers = n_layers;
    s->window = window;
    s->dim = dim;
    s->index_dim = index_dim;
    s->max_tokens = max_tokens;
    s->layers = s->mem;
    char *p = (char *)s->mem + align64((size_t)n_layers * sizeof(di_v4_layer_state));
    for (int64_t il = 0; il < n_layers; il++)
        layer_layout(&s->layers[il], &p, kinds[il], rates[il], window, dim, index_dim, max_tokens);
    return DI_OK;
}

void di_v4_state_free(di_v4_state *s) {
    if (!s) return;
    di_aligned_free(s->mem);
    memset(s, 0, sizeof *s);
}

static void comp_reset(di_v4_comp_state *cs) {
    cs->open = 0;
    cs->fill = 0;
    cs->has_prev = false;
}

void di_v4_state_reset(di_v4_state *s) {
    for (int64_t il = 0; il < s->n_layers; il++) {
        s->layers[il].n_entries = 0;
        comp_reset(&s->layers[il].comp);
        comp_reset(&s->layers[il].icomp);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Compressor windows                                                                         */
/* ---------------------------------------------------------------------------------------- */

static float *row(float *buf, const di_v4_comp_state *cs, int64_t half, int64_t i) {
    return buf + (half * cs->m + i) * cs->cw;
}

float *di_v4_comp_next_c(di_v4_comp_state *cs) {
    return row(cs->c, cs, cs->open, cs->fill);
}

float *di_v4_comp_next_z(di_v4_comp_state *cs) {
    return row(cs->z, cs, cs->open, cs->fill);
}

bool di_v4_comp_commit(di_v4_comp_state *cs) {
    cs->fill++;
    return cs->fill == cs->m;
}

const float *di_v4_comp_row_c(const di_v4_comp_state *cs, bool prev, int64_t i) {
    return row(cs->c, cs, prev ? 1 - cs->open : cs->open, i);
}

const float *di_v4_comp_row_z(const di_v4_comp_state *cs, bool prev, int64_t i) {
    return row(cs->z, cs, prev ? 1 - cs->open : cs->open, i);
}

void di_v4_comp_advance(di_v4_comp_state *cs) {
    cs->open = 1 - cs->open;
    cs->fill = 0;
    cs->has_prev = true;
}

/* ---------------------------------------------------------------------------------------- */
/* Accounting                                                                                 */
/* ---------------------------------------------------------------------------------------- */

int64_t di_v4_state_fixed_bytes(int kind, int64_t m, int64_t window, int64_t dim,
                                int64_t index_dim) {
    int64_t b = window * dim * (int64_t)sizeof(float);
    if (kind == KIND_CSA) b += 2 * 2 * m * (2 * dim + 2 * index_dim) * (int64_t)sizeof(float);
    if (kind == KIND_HCA) b += 2 * 2 * m * dim * (int64_t)sizeof(float);
    return b;
}

double di_v4_state_bytes_per_token(int kind, int64_t m, int64_t dim, int64_t index_dim) {
    if (kind == KIND_SLIDING || m <= 0) return 0.0;
    double row = (double)dim + (kind == KIND_CSA ? (double)index_dim : 0.0);
    return row * (double)sizeof(float) / (double)m;
}
