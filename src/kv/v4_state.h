/*
 * v4_state.h -- one sequence's DeepSeek-V4 attention state: bounded sliding-window rings,
 * compressed entries, Lightning-indexer keys and the compressors' open windows.
 *
 * Per layer (d = head_dim, dI = index_head_dim, W = sliding_window, m = compress rate):
 *   - ring: the K=V rows of the last W positions, position p in slot p mod W. Exactly W rows
 *     whatever the context length (the bounded part of the state).
 *   - entries (CSA, HCA): one normalised, roped d-row per completed window of m tokens,
 *     appended in order; CSA also keeps one dI-row indexer key per window.
 *   - compressor state (CSA, HCA; CSA also for the indexer): the projected (c, z + ape) rows
 *     of the open window's tokens, and for the overlapping CSA compressor the previous
 *     complete window's rows, whose first halves join the next entry. Two halves of one
 *     buffer alternate as "open" and "previous", so completing a window copies nothing.
 *
 * Design stance: plain float rows, no tensors and no backend (src/kv rule); the model fills
 * and reads the rows. Capacity is fixed at init from max_tokens. The state does not track
 * the sequence length: the model's context does (n_past), and the state is consistent with
 * it after each forward call. Rows are float32 (what the CPU forward reads).
 */
#ifndef DI_V4_STATE_H
#define DI_V4_STATE_H

#include "core/core.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct di_v4_comp_state {
    int64_t m;     /* window length (tokens) */
    int64_t width; /* entry width (d or dI) */
    int64_t cw;    /* channels per token row: 2 width (overlapping) or width */
    bool overlap;  /* CSA: entry w also pools window w-1's first halves */
    float *c, *z;  /* [2][m][cw] each: half `open` is the open window, the other the previous */
    int64_t open;  /* 0 or 1 */
    int64_t fill;  /* tokens in the open window */
    bool has_prev; /* the previous half holds a complete window */
} di_v4_comp_state;

typedef struct di_v4_layer_state {
    int kind;          /* di_v4_layer_kind */
    int64_t m;         /* compress rate (0: sliding) */
    float *ring;       /* [W][d] */
    float *entries;    /* [max_entries][d] (CSA, HCA) */
    float *ientries;   /* [max_entries][dI] (CSA) */
    int64_t n_entries; /* completed windows so far */
    int64_t max_entries;
    di_v4_comp_state comp, icomp;
} di_v4_layer_state;

typedef struct di_v4_state {
    int64_t n_layers, window, dim, index_dim, max_tokens;
    di_v4_layer_state *layers; /* [n_layers], inside mem */
    void *mem;                 /* owns everything */
    size_t bytes;
} di_v4_state;

/* Allocates the state for n_layers layers of the given kinds and rates (kinds: uint8_t
 * di_v4_layer_kind per layer). On failure *s is left empty and the error names the size. */
di_status di_v4_state_init(di_v4_state *s, int64_t n_layers, const uint8_t *kinds,
                           const int64_t *rates, int64_t window, int64_t dim, int64_t index_dim,
                           int64_t max_tokens);
void di_v4_state_free(di_v4_state *s);
/* Forgets the sequence (entries and open windows); the rings need no clearing because a
 * slot is always written before it is read. */
void di_v4_state_reset(di_v4_state *s);

/* Row of the open window for its next token (c and z rows of cw floats), and the commit:
 * returns true when the window is now complete (the caller emits the entry, then calls
 * di_v4_comp_advance). */
float *di_v4_comp_next_c(di_v4_comp_state *cs);
float *di_v4_comp_next_z(di_v4_comp_state *cs);
bool di_v4_comp_commit(di_v4_comp_state *cs);
/* Row i of the open (prev == false) or previous window. */
const float *di_v4_comp_row_c(const di_v4_comp_state *cs, bool prev, int64_t i);
const float *di_v4_comp_row_z(const di_v4_comp_state *cs, bool prev, int64_t i);
/* The open window becomes the previous one; a new window opens empty. */
void di_v4_comp_advance(di_v4_comp_state *cs);

/* Cache accounting for `deepinfer info` (bytes of float32 rows, per layer):
 * the fixed part (ring + compressor windows) and the growth per token of context. */
int64_t di_v4_state_fixed_bytes(int kind, int64_t m, int64_t window, int64_t dim,
                                int64_t index_dim);
double di_v4_state_bytes_per_token(int kind, int64_t m, int64_t dim, int64_t index_dim);

#endif /* DI_V4_STATE_H */
