/*
 * v4_state.h -- DeepSeek-V4 attention state, split the way the engine shares it:
 *
 *   - di_v4_pool: what grows with the context. Per CSA / HCA layer, one normalised, roped
 *     d-row per completed window of m tokens ("entry"), and per CSA layer one dI-row indexer
 *     key per window, stored in paged blocks: block b holds the entries of the windows that
 *     start inside its block_size positions, rows b * (block_size / m) .. + block_size / m.
 *     block_size is a multiple of every rate, so a window never straddles two blocks and a
 *     block's entries depend only on the tokens up to its end (prefix-cacheable, shareable).
 *   - di_v4_slots: the bounded window state of one running sequence per slot. Per layer the
 *     ring of the last W K=V rows (position p in row p mod W) and the compressors' rows
 *     (projected c, z + ape) of the open window and the one before it (the overlapping CSA
 *     compressor pools the previous window's first halves into the next entry). Compressor
 *     rows are position-addressed too: position p's row is row p mod m of half (p / m) mod 2,
 *     so completing a window copies nothing and the state needs no counters.
 *
 * A slot remembers `base`, the first position it has seen since its reset: positions below
 * it are not in the ring (a replay after a prefix-cache hit starts mid-sequence, and the
 * rows it would read there belong to another sequence).
 *
 * Design stance: plain float rows, no tensors; the model fills and reads the rows (through
 * backend ops when they live in device memory). The rows are allocated in one piece through
 * the backend given at init (NULL: host memory); the bookkeeping (slot and layer structs)
 * is always host memory, so the model computes row addresses on the host either way. Sizes
 * are fixed at init. Layer kinds use the values of
 * di_v4_layer_kind (0 sliding, 1 CSA, 2 HCA) without including the config header.
 */
#ifndef DI_V4_STATE_H
#define DI_V4_STATE_H

#include "backend/backend.h"
#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- Window state (per slot) ---------------------------------------------------------- */

typedef struct di_v4_comp_state {
    int64_t m;     /* window length (tokens) */
    int64_t width; /* entry width (d or dI) */
    int64_t cw;    /* channels per token row: 2 width (overlapping) or width */
    bool overlap;  /* CSA: entry w also pools window w-1's first halves */
    float *c, *z;  /* [2][m][cw] each, position-addressed (see above) */
} di_v4_comp_state;

typedef struct di_v4_slot_layer {
    float *ring;                  /* [W][d] */
    di_v4_comp_state comp, icomp; /* CSA, HCA; CSA's indexer (m == 0: none) */
} di_v4_slot_layer;

typedef struct di_v4_slot {
    int64_t base;             /* first position seen since the reset */
    di_v4_slot_layer *layers; /* [n_layers] */
} di_v4_slot;

typedef struct di_v4_slots {
    int64_t n_slots, n_layers, window;
    di_v4_slot *slot;     /* [n_slots], inside mem */
    void *mem;            /* owns the bookkeeping (host memory) */
    void *rows;           /* owns every row (backend memory) */
    const di_backend *be; /* allocated rows (NULL: host memory) */
    size_t bytes;         /* both allocations */
    size_t rows_bytes;    /* the rows alone */
} di_v4_slots;

/* Allocates n_slots window states for n_layers layers of the given kinds (uint8_t
 * di_v4_layer_kind per layer) and rates, the rows in `be`'s memory (borrowed, must outlive
 * s; NULL: host memory). On failure *s is left empty and the error names the size. */
di_status di_v4_slots_init(di_v4_slots *s, const di_backend *be, int64_t n_slots,
                           int64_t n_layers, const uint8_t *kinds, const int64_t *rates,
                           int64_t window, int64_t dim, int64_t index_dim);
void di_v4_slots_free(di_v4_slots *s);

/* Starts a sequence in the slot at position base. Nothing is cleared: every row is written
 * before it is read, and rows of positions below base are never read. */
static inline void di_v4_slot_reset(di_v4_slot *s, int64_t base) {
    s->base = base;
}

/* The c / z row of position p (cw floats). */
static inline float *di_v4_comp_c(const di_v4_comp_state *cs, int64_t p) {
    return cs->c + (((p / cs->m) & 1) * cs->m + p % cs->m) * cs->cw;
}
static inline float *di_v4_comp_z(const di_v4_comp_state *cs, int64_t p) {
    return cs->z + (((p / cs->m) & 1) * cs->m + p % cs->m) * cs->cw;
}

/* ---- Paged entries (shared, refcounted blocks) ----------------------------------------- */

typedef struct di_v4_pool_layer {
    int64_t m;         /* compress rate (0: sliding, no rows) */
    int64_t per_block; /* entries per block: block_size / m */
    float *entries;    /* [n_blocks * per_block][d] (CSA, HCA) */
    float *ientries;   /* [n_blocks * per_block][dI] (CSA) */
} di_v4_pool_layer;

typedef struct di_v4_pool {
    int64_t n_layers, n_blocks, block_size, dim, index_dim;
    di_v4_pool_layer *layers; /* [n_layers], inside mem (host memory) */
    void *mem;
    void *rows;           /* owns every entry row (backend memory) */
    const di_backend *be; /* allocated rows (NULL: host memory) */
    size_t bytes;         /* both allocations */
    size_t rows_bytes;    /* the rows alone */
} di_v4_pool;

/* Allocates the entry rows of n_blocks blocks of block_size positions in `be`'s memory
 * (borrowed, must outlive p; NULL: host memory). Fails with DI_ERR_INVALID_ARG naming
 * block_size when it is not a multiple of every layer's rate. */
di_status di_v4_pool_init(di_v4_pool *p, const di_backend *be, int64_t n_layers,
                          const uint8_t *kinds, const int64_t *rates, int64_t dim,
                          int64_t index_dim, int64_t n_blocks, int64_t block_size);
void di_v4_pool_free(di_v4_pool *p);

/* The row of entry w of layer il of the sequence with block table `table`, in that layer's
 * entries (d floats each) and indexer keys (dI floats each, CSA layers). */
static inline int64_t di_v4_pool_row(const di_v4_pool *p, int64_t il, const int32_t *table,
                                     int64_t w) {
    const di_v4_pool_layer *L = &p->layers[il];
    return (int64_t)table[w / L->per_block] * L->per_block + w % L->per_block;
}
static inline float *di_v4_pool_entry(const di_v4_pool *p, int64_t il, const int32_t *table,
                                      int64_t w) {
    return p->layers[il].entries + di_v4_pool_row(p, il, table, w) * p->dim;
}
static inline float *di_v4_pool_ientry(const di_v4_pool *p, int64_t il, const int32_t *table,
                                       int64_t w) {
    return p->layers[il].ientries + di_v4_pool_row(p, il, table, w) * p->index_dim;
}

/* Cache accounting for `deepinfer info` (bytes of float32 rows, per layer):
 * the fixed part (ring + compressor windows) and the growth per token of context. */
int64_t di_v4_state_fixed_bytes(int kind, int64_t m, int64_t window, int64_t dim,
                                int64_t index_dim);
double di_v4_state_bytes_per_token(int kind, int64_t m, int64_t dim, int64_t index_dim);

#endif /* DI_V4_STATE_H */
