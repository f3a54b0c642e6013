/*
 * cpu_rope.c -- rotary position embedding on the CPU, in place.
 *
 * The angles come precomputed per token (cos/sin tables built once per forward call by the
 * model, with YaRN's attention factor already multiplied in), so this op is a pure rotation:
 *     (a, b) -> (a cos - b sin, b cos + a sin)
 * of pair i = (2i, 2i+1) in DeepSeek's interleaved layout, or (i, i + d/2) for rotate_half.
 *
 * Transformers' V3 path de-interleaves the rotated slice ([evens rotated, odds rotated]);
 * we keep pairs in place instead. q . k sums the same products either way, and the rotated
 * slices only ever meet in q . k, so the attention is unchanged.
 */
#include "backend/cpu/cpu_nn.h"

static void rope_slice(float *x, int64_t half, const float *c, const float *s, bool interleaved) {
    if (interleaved) {
        for (int64_t i = 0; i < half; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * c[i] - b * s[i];
            x[2 * i + 1] = b * c[i] + a * s[i];
        }
    } else {
        for (int64_t i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            x[i] = a * c[i] - b * s[i];
            x[i + half] = b * c[i] + a * s[i];
        }
    }
}

void di_cpu_rope_ref(const di_rope_op_params *p) {
    int64_t half = p->rope_dim / 2;
    for (int64_t t = 0; t < p->n_tokens; t++)
        for (int64_t h = 0; h < p->n_heads; h++)
            rope_slice(p->x + t * p->tstride + h * p->hstride, half, p->cos + t * half,
                       p->sin + t * half, p->interleaved);
}

static void rope_tokens(void *vctx, int64_t b, int64_t e, int tid) {
    const di_rope_op_params *p = vctx;
    int64_t half = p->rope_dim / 2;
    for (int64_t t = b; t < e; t++)
        for (int64_t h = 0; h < p->n_heads; h++)
            rope_slice(p->x + t * p->tstride + h * p->hstride, half, p->cos + t * half,
                       p->sin + t * half, p->interleaved);
}

void di_cpu_rope(di_pool *pool, const di_rope_op_params *p) {
    if (p->n_tokens * p->n_heads * p->rope_dim < 65536) {
        rope_tokens((void *)p, 0, p->n_tokens, 0);
        return;
    }
    di_pool_run(pool, p->n_tokens, 1, rope_tokens, (void *)p);
}
