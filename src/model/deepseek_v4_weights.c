/*
 * deepseek_v4_weights.c -- binds a DeepSeek-V4 checkpoint's tensors into a v4_model,
 * checking every shape and dtype.
 *
 * Design stance:
 *   - Three spellings are accepted for every tensor (spec section 2): upstream
 *     ("layers.i.attn.wq_a.weight", "embed.weight", "hc_head_fn"), transformers'
 *     save_pretrained output (the same with a "model." prefix on most names, the main kv norm
 *     as "attn.norm.weight", "model.hc_head.hc_fn", ...), and transformers' in-memory names
 *     ("model.layers.i.self_attn.q_a_proj.weight", fused experts "mlp.experts.gate_up_proj").
 *     Lookup tries the upstream name, then with "model.", then the aliases.
 *   - Matrices stay in the mapping in their stored dtype. FP8 e4m3 needs "<base>.scale"
 *     (E8M0, 128 x 128 blocks) or "<base>.weight_scale_inv" (float); FP4 is stored as I8
 *     [rows][cols / 2] (low nibble = even column) with "<base>.scale" E8M0 [rows][cols / 32].
 *     FP8 scales become float arrays the model owns (small), for the existing FP8 kernels.
 *     FP4 scales stay in the mapping as E8M0 bytes (w->scale_e8m0): routed experts are read
 *     once per token, so the kernel reads only the stored bytes and decodes 2^(e - 127) in
 *     registers (a float copy made every expert read 18% larger).
 *   - tid2eid (I32 or I64 [vocab][top_k]) is copied to int32 and every entry range-checked:
 *     a bad expert id is a load error naming the tensor, the row and the value.
 *   - Errors name the file and tensor: `model.safetensors: tensor "x" has shape [4, 8],
 *     expected [8, 8]`.
 */
#include "model/deepseek_v4.h"

#include <stdio.h>
#include <string.h>

typedef struct binder {
    const di_st_set *st;
    const di_hparams *hp;
    const di_v4_hparams *v;
    const char *dir;
    v4_model *m;
    int64_t *params; /* receives element counts (main model or MTP) */
    int64_t routed;  /* elements bound while in_routed */
    bool in_routed;
} binder;

void *v4_own(v4_model *m, void *p) {
    if (!p) return NULL;
    if (m->n_owned == m->cap_owned) {
        int64_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **n = di_realloc(m->owned, (size_t)cap * sizeof *n);
        if (!n) {
            di_free(p);
            return NULL;
        }
        m->owned = n;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return p;
}

static const char *file_of(const binder *b, const di_st_tensor *t) {
    return di_st_file_name(b->st, t);
}

static void note_dtype(binder *b, const char *name) {
    char *d = b->m->dtypes;
    size_t len = strlen(name), used = strlen(d);
    for (const char *p = d; (p = strstr(p, name)) != NULL; p += len)
        if ((p == d || p[-1] == '+') && (p[len] == '\0' || p[len] == '+')) return;
    if (used + len + 2 <= sizeof b->m->dtypes)
        snprintf(d + used, sizeof b->m->dtypes - used, "%s%s", used ? "+" : "", name);
}

static void note(binder *b, const di_st_tensor *t, int64_t n_params, const char *dtype) {
    b->m->weight_bytes += (int64_t)t->nbytes;
    *b->params += n_params;
    if (b->in_routed) b->routed += n_params;
    if (dtype) note_dtype(b, dtype);
}

/* ---------------------------------------------------------------------------------------- */
/* Name lookup                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Upstream suffix -> transformers spellings (save_pretrained's hybrid, then in-memory). */
static const char *g_alias[][3] = {
    {"attn_norm.weight", "input_layernorm.weight", NULL},
    {"ffn_norm.weight", "post_attention_layernorm.weight", NULL},
    {"hc_attn_fn", "attn_hc.fn", NULL},
    {"hc_attn_base", "attn_hc.base", NULL},
    {"hc_attn_scale", "attn_hc.scale", NULL},
    {"hc_ffn_fn", "ffn_hc.fn", NULL},
    {"hc_ffn_base", "ffn_hc.base", NULL},
    {"hc_ffn_scale", "ffn_hc.scale", NULL},
    {"attn.wq_a.weight", "self_attn.q_a_proj.weight", NULL},
    {"attn.q_norm.weight", "self_attn.q_a_norm.weight", NULL},
    {"attn.wq_b.weight", "self_attn.q_b_proj.weight", NULL},
    {"attn.wkv.weight", "self_attn.kv_proj.weight", NULL},
    {"attn.kv_norm.weight", "attn.norm.weight", "self_attn.kv_norm.weight"},
    {"attn.wo_a.weight", "self_attn.o_a_proj.weight", NULL},
    {"attn.wo_b.weight", "self_attn.o_b_proj.weight", NULL},
    {"attn.attn_sink", "self_attn.sinks", NULL},
    {"attn.compressor.wkv.weight", "self_attn.compressor.kv_proj.weight", NULL},
    {"attn.compressor.wgate.weight", "self_attn.compressor.gate_proj.weight", NULL},
    {"attn.compressor.ape", "self_attn.compressor.position_bias", NULL},
    {"attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight", NULL},
    {"attn.indexer.wq_b.weight", "self_attn.compressor.indexer.q_b_proj.weight", NULL},
    {"attn.indexer.weights_proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight",
     NULL},
    {"attn.indexer.compressor.wkv.weight", "self_attn.compressor.indexer.kv_proj.weight", NULL},
    {"attn.indexer.compressor.wgate.weight", "self_attn.compressor.indexer.gate_proj.weight", NULL},
    {"attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias", NULL},
    {"attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight", NULL},
    {"ffn.gate.weight", "mlp.gate.weight", NULL},
    {"ffn.gate.bias", "mlp.gate.e_score_correction_bias", NULL},
    {"ffn.gate.tid2eid", "mlp.gate.tid2eid", NULL},
    {"ffn.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight", NULL},
    {"ffn.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight", NULL},
    {"ffn.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight", NULL},
    /* globals (empty prefix) */
    {"embed.weight", "model.embed_tokens.weight", NULL},
    {"head.weight", "lm_head.weight", NULL},
    {"hc_head_fn", "model.hc_head.hc_fn", NULL},
    {"hc_head_base", "model.hc_head.hc_base", NULL},
    {"hc_head_scale", "model.hc_head.hc_scale", NULL},
};

static const di_st_tensor *try_name(const binder *b, const char *prefix, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    const di_st_tensor *t = di_st_find(b->st, name);
    if (t) return t;
    snprintf(name, sizeof name, "model.%s%s", prefix, suffix);
    return di_st_find(b->st, name);
}

/* Finds prefix + suffix in any spelling; NULL (and an error unless optional) when absent. */
static di_status find(const binder *b, const char *prefix, const char *suffix, bool optional,
                      const di_st_tensor **out) {
    *out = try_name(b, prefix, suffix);
    for (size_t i = 0; !*out && i < DI_ARRAY_LEN(g_alias); i++) {
        if (strcmp(g_alias[i][0], suffix) != 0) continue;
        for (int k = 1; k < 3 && !*out && g_alias[i][k]; k++)
            *out = try_name(b, prefix, g_alias[i][k]);
    }
    if (*out || optional) return DI_OK;
    return di_error(DI_ERR_NOT_FOUND,
                    "%s: tensor \"%s%s\" missing (also looked for its transformers spellings)",
                    b->dir, prefix, suffix);
}

static di_status check_shape(const binder *b, const di_st_tensor *t, int32_t ndim,
                             const int64_t *dims) {
    return di_st_check_shape(b->st, t, ndim, dims);
}

/* ---------------------------------------------------------------------------------------- */
/* Floats, matrices, index tables                                                             */
/* ---------------------------------------------------------------------------------------- */

/* n elements of t as a float array owned by the model (F32 / BF16 / F16 / F8_E8M0). */
static di_status to_float(binder *b, const di_st_tensor *t, int64_t n, const float **out) {
    float *f = v4_own(b->m, di_malloc((size_t)DI_MAX(n, 1) * sizeof(float)));
    if (!f) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    di_status st = di_st_to_float(b->st, t, n, f);
    if (st == DI_OK) *out = f;
    return st;
}

/* A float tensor of shape [d0] (d1 == 0) or [d0][d1] copied to floats. */
static di_status bind_floats(binder *b, const char *prefix, const char *suffix, int64_t d0,
                             int64_t d1, bool optional, const float **out) {
    const di_st_tensor *t;
    *out = NULL;
    di_status st = find(b, prefix, suffix, optional, &t);
    if (st || !t) return st;
    int64_t dims[2] = {d0, d1};
    if ((st = check_shape(b, t, d1 ? 2 : 1, dims))) return st;
    note(b, t, d0 * DI_MAX(d1, 1), NULL);
    char dt[16];
    snprintf(dt, sizeof dt, "%s", di_dtype_name(t->dtype));
    for (char *c = dt; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    note_dtype(b, dt);
    return to_float(b, t, d0 * DI_MAX(d1, 1), out);
}

/* The scale tensor of a quantized weight called `wname` ("x.weight" -> "x.scale", or
 * "x.weight_scale_inv"), shape [s0][s1], as floats. */
static di_status bind_scale(binder *b, const char *wname, int64_t s0, int64_t s1,
                            const float **out) {
    char name[512];
    size_t len = strlen(wname);
    size_t stem = len > 7 && strcmp(wname + len - 7, ".weight") == 0 ? len - 7 : len;
    snprintf(name, sizeof name, "%.*s.scale", (int)stem, wname);
    const di_st_tensor *s = di_st_find(b->st, name);
    if (!s) {
        snprintf(name, sizeof name, "%s_scale_inv", wname);
        s = di_st_find(b->st, name);
    }
    if (!s)
        return di_error(DI_ERR_NOT_FOUND, "%s: quantized tensor \"%s\" has no \"%.*s.scale\"",
                        b->dir, wname, (int)stem, wname);
    int64_t dims[2] = {s0, s1};
    di_status st = check_shape(b, s, 2, dims);
    if (st) return st;
    b->m->weight_bytes += (int64_t)s->nbytes;
    return to_float(b, s, s0 * s1, out);
}

/* The E8M0 scale bytes [rows][cols / 32] of the FP4 weight `wname`: the mapping itself when
 * stored as F8_E8M0 (the published format); a float tensor (F32 / BF16 / F16) is accepted if
 * every value is a power of two (or NaN), converted to E8M0 bytes the model owns. */
static di_status bind_scale_e8m0(binder *b, const char *wname, int64_t s0, int64_t s1,
                                 const uint8_t **out) {
    char name[512];
    size_t len = strlen(wname);
    size_t stem = len > 7 && strcmp(wname + len - 7, ".weight") == 0 ? len - 7 : len;
    snprintf(name, sizeof name, "%.*s.scale", (int)stem, wname);
    const di_st_tensor *s = di_st_find(b->st, name);
    if (!s)
        return di_error(DI_ERR_NOT_FOUND, "%s: FP4 tensor \"%s\" has no \"%s\"", b->dir, wname,
                        name);
    int64_t dims[2] = {s0, s1};
    di_status st = check_shape(b, s, 2, dims);
    if (st) return st;
    b->m->weight_bytes += (int64_t)s->nbytes;
    if (s->dtype == DI_DTYPE_F8_E8M0) {
        *out = s->data;
        return DI_OK;
    }
    const float *f;
    if ((st = to_float(b, s, s0 * s1, &f))) return st;
    uint8_t *e = v4_own(b->m, di_malloc((size_t)DI_MAX(s0 * s1, 1)));
    if (!e) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    for (int64_t i = 0; i < s0 * s1; i++) {
        uint32_t u = di_bits_from_f32(f[i]);
        if (f[i] != f[i]) {
            e[i] = 0xff;
        } else if (u == 0x00400000u) {
            e[i] = 0; /* 2^-127 */
        } else if ((u & 0x807fffffu) == 0 && (u >> 23) != 0 && (u >> 23) != 0xff) {
            e[i] = (uint8_t)(u >> 23);
        } else {
            return di_error(DI_ERR_FORMAT,
                            "%s: tensor \"%s\" element %lld is %g, not a power of two (FP4 "
                            "scales are E8M0)",
                            file_of(b, s), name, (long long)i, (double)f[i]);
        }
    }
    *out = e;
    return DI_OK;
}

/* A [rows][cols] matrix in BF16 / F16 / F32, FP8 e4m3 (+ block scales) or packed FP4. */
static di_status bind_mat(binder *b, const char *prefix, const char *suffix, int64_t rows,
                          int64_t cols, bool optional, di_weight *w) {
    const di_st_tensor *t;
    memset(w, 0, sizeof *w);
    di_status st = find(b, prefix, suffix, optional, &t);
    if (st || !t) return st;
    *w = (di_weight){
        .dtype = t->dtype, .rows = rows, .cols = cols, .row_stride = cols, .data = t->data};
    int64_t dims[2] = {rows, cols};
    switch (t->dtype) {
    case DI_DTYPE_F32:
    case DI_DTYPE_BF16:
    case DI_DTYPE_F16:
        if ((st = check_shape(b, t, 2, dims))) return st;
        note(b, t, rows * cols,
             t->dtype == DI_DTYPE_BF16  ? "bf16"
             : t->dtype == DI_DTYPE_F16 ? "f16"
                                        : "f32");
        return DI_OK;
    case DI_DTYPE_F8_E4M3:
        if ((st = check_shape(b, t, 2, dims))) return st;
        note(b, t, rows * cols, "f8_e4m3");
        w->block_rows = w->block_cols = 128;
        w->scale_cols = (cols + 127) / 128;
        return bind_scale(b, t->name, (rows + 127) / 128, w->scale_cols, &w->scale);
    case DI_DTYPE_I8:
    case DI_DTYPE_U8:
        /* FP4 e2m1 packed two per byte, scale per 32 columns. */
        if (cols % 32 != 0)
            return di_error(DI_ERR_FORMAT, "%s: FP4 tensor \"%s\" needs a multiple of 32 columns",
                            file_of(b, t), t->name);
        dims[1] = cols / 2;
        if ((st = check_shape(b, t, 2, dims))) return st;
        note(b, t, rows * cols, "fp4_e2m1");
        w->dtype = DI_DTYPE_F4_E2M1;
        w->block_rows = 1;
        w->block_cols = 32;
        w->scale_cols = cols / 32;
        return bind_scale_e8m0(b, t->name, rows, cols / 32, &w->scale_e8m0);
    default:
        return di_error(DI_ERR_UNSUPPORTED,
                        "%s: tensor \"%s\" has dtype %s (supported: F32, BF16, F16, F8_E4M3 + "
                        "scale, I8-packed FP4 + scale)",
                        file_of(b, t), t->name, di_dtype_name(t->dtype));
    }
}

/* tid2eid [vocab][K] (I32 / I64) -> int32 copy, every id checked against n_experts. */
static di_status bind_tid2eid(binder *b, const char *prefix, const int32_t **out) {
    const int64_t V = b->hp->vocab_size, K = b->hp->num_experts_per_tok;
    const int64_t E = b->hp->n_routed_experts;
    const di_st_tensor *t;
    di_status st = find(b, prefix, "ffn.gate.tid2eid", false, &t);
    if (st) return st;
    int64_t dims[2] = {V, K};
    if ((st = check_shape(b, t, 2, dims))) return st;
    if (t->dtype != DI_DTYPE_I32 && t->dtype != DI_DTYPE_I64)
        return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" has dtype %s, expected I32 or I64",
                        file_of(b, t), t->name, di_dtype_name(t->dtype));
    int32_t *ids = v4_own(b->m, di_malloc((size_t)(V * K) * sizeof(int32_t)));
    if (!ids) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
    for (int64_t i = 0; i < V * K; i++) {
        int64_t e;
        if (t->dtype == DI_DTYPE_I32) {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * i, 4);
            e = v32;
        } else {
            memcpy(&e, (const char *)t->data + 8 * i, 8);
        }
        if (e < 0 || e >= E)
            return di_error(DI_ERR_FORMAT,
                            "%s: tensor \"%s\": token %lld maps to expert %lld, outside "
                            "[0, n_routed_experts = %lld)",
                            file_of(b, t), t->name, (long long)(i / K), (long long)e, (long long)E);
        ids[i] = (int32_t)e;
    }
    b->m->weight_bytes += (int64_t)t->nbytes;
    *out = ids;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Blocks                                                                                     */
/* ---------------------------------------------------------------------------------------- */

static di_status bind_compressor(binder *b, const char *prefix, const char *base, int64_t m,
                                 int64_t width, bool overlap, v4_compressor *c) {
    const int64_t D = b->hp->hidden_size;
    char n[256];
    di_status st;
    c->m = m;
    c->width = width;
    c->overlap = overlap;
    c->cw = overlap ? 2 * width : width;
    snprintf(n, sizeof n, "%s.wkv.weight", base);
    if ((st = bind_mat(b, prefix, n, c->cw, D, false, &c->wkv))) return st;
    snprintf(n, sizeof n, "%s.wgate.weight", base);
    if ((st = bind_mat(b, prefix, n, c->cw, D, false, &c->wgate))) return st;
    snprintf(n, sizeof n, "%s.ape", base);
    if ((st = bind_floats(b, prefix, n, m, c->cw, false, &c->ape))) return st;
    snprintf(n, sizeof n, "%s.norm.weight", base);
    return bind_floats(b, prefix, n, width, 0, false, &c->norm);
}

static di_status bind_attention(binder *b, const char *p, v4_block *L) {
    const di_v4_hparams *v = b->v;
    const int64_t D = b->hp->hidden_size, H = b->hp->num_attention_heads, d = v->head_dim;
    const int64_t ql = v->q_lora_rank, g = v->o_groups, r = v->o_lora_rank;
    const int64_t nm = (2 + v->hc_mult) * v->hc_mult, nD = v->hc_mult * D;
    di_status st = bind_floats(b, p, "attn_norm.weight", D, 0, false, &L->attn_norm);
    if (!st) st = bind_floats(b, p, "ffn_norm.weight", D, 0, false, &L->ffn_norm);
    if (!st) st = bind_floats(b, p, "hc_attn_fn", nm, nD, false, &L->hc_attn_fn);
    if (!st) st = bind_floats(b, p, "hc_attn_base", nm, 0, false, &L->hc_attn_base);
    if (!st) st = bind_floats(b, p, "hc_attn_scale", 3, 0, false, &L->hc_attn_scale);
    if (!st) st = bind_floats(b, p, "hc_ffn_fn", nm, nD, false, &L->hc_ffn_fn);
    if (!st) st = bind_floats(b, p, "hc_ffn_base", nm, 0, false, &L->hc_ffn_base);
    if (!st) st = bind_floats(b, p, "hc_ffn_scale", 3, 0, false, &L->hc_ffn_scale);
    if (!st) st = bind_mat(b, p, "attn.wq_a.weight", ql, D, false, &L->wq_a);
    if (!st) st = bind_floats(b, p, "attn.q_norm.weight", ql, 0, false, &L->q_norm);
    if (!st) st = bind_mat(b, p, "attn.wq_b.weight", H * d, ql, false, &L->wq_b);
    if (!st) st = bind_mat(b, p, "attn.wkv.weight", d, D, false, &L->wkv);
    if (!st) st = bind_floats(b, p, "attn.kv_norm.weight", d, 0, false, &L->kv_norm);
    if (!st) st = bind_mat(b, p, "attn.wo_a.weight", g * r, H * d / g, false, &L->wo_a);
    if (!st) st = bind_mat(b, p, "attn.wo_b.weight", D, g * r, false, &L->wo_b);
    if (!st) st = bind_floats(b, p, "attn.attn_sink", H, 0, false, &L->sinks);
    if (st) return st;
    /* Group j of the output projection: rows [j r, (j + 1) r) of wo_a. */
    L->wo_a_group = v4_own(b->m, di_calloc((size_t)g, sizeof(di_weight)));
    if (!L->wo_a_group) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t j = 0; j < g; j++)
        L->wo_a_group[j] = di_weight_rows(&L->wo_a, j * r, r);

    if (L->kind == DI_V4_SLIDING) return DI_OK;
    st = bind_compressor(b, p, "attn.compressor", L->m, d, L->kind == DI_V4_CSA, &L->comp);
    if (st || L->kind != DI_V4_CSA) return st;
    const int64_t nI = v->index_n_heads, dI = v->index_head_dim;
    st = bind_mat(b, p, "attn.indexer.wq_b.weight", nI * dI, ql, false, &L->idx_wq_b);
    if (!st) st = bind_mat(b, p, "attn.indexer.weights_proj.weight", nI, D, false, &L->idx_weights);
    if (!st) st = bind_compressor(b, p, "attn.indexer.compressor", L->m, dI, true, &L->icomp);
    return st;
}

static di_status bind_mlp(binder *b, const char *p, const char *base, v4_mlp *mlp) {
    const int64_t D = b->hp->hidden_size, I = b->hp->moe_intermediate_size;
    char n[256];
    di_status st;
    snprintf(n, sizeof n, "%s.w1.weight", base);
    if ((st = bind_mat(b, p, n, I, D, false, &mlp->w1))) return st;
    snprintf(n, sizeof n, "%s.w3.weight", base);
    if ((st = bind_mat(b, p, n, I, D, false, &mlp->w3))) return st;
    snprintf(n, sizeof n, "%s.w2.weight", base);
    return bind_mat(b, p, n, D, I, false, &mlp->w2);
}

static di_status bind_experts(binder *b, const char *p, v4_block *L) {
    const int64_t D = b->hp->hidden_size, I = b->hp->moe_intermediate_size;
    const int64_t E = b->hp->n_routed_experts;
    L->experts = v4_own(b->m, di_calloc((size_t)E, sizeof(v4_mlp)));
    if (!L->experts) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    const di_st_tensor *gu;
    di_status st = find(b, p, "mlp.experts.gate_up_proj", true, &gu);
    if (st) return st;
    if (gu) { /* transformers' fused [E][2I][D] + [E][D][I] (BF16 / F32 only) */
        const di_st_tensor *dn;
        if ((st = find(b, p, "mlp.experts.down_proj", false, &dn))) return st;
        int64_t d1[3] = {E, 2 * I, D}, d2[3] = {E, D, I};
        if ((st = check_shape(b, gu, 3, d1)) || (st = check_shape(b, dn, 3, d2))) return st;
        if (gu->dtype != DI_DTYPE_BF16 && gu->dtype != DI_DTYPE_F32 && gu->dtype != DI_DTYPE_F16)
            return di_error(DI_ERR_UNSUPPORTED, "%s: fused experts \"%s\" must be BF16/F16/F32",
                            file_of(b, gu), gu->name);
        di_weight wgu = {
            .dtype = gu->dtype, .rows = E * 2 * I, .cols = D, .row_stride = D, .data = gu->data};
        di_weight wdn = {
            .dtype = dn->dtype, .rows = E * D, .cols = I, .row_stride = I, .data = dn->data};
        note(b, gu, E * 2 * I * D, NULL);
        note(b, dn, E * D * I, NULL);
        for (int64_t e = 0; e < E; e++) {
            L->experts[e].w1 = di_weight_rows(&wgu, e * 2 * I, I);
            L->experts[e].w3 = di_weight_rows(&wgu, e * 2 * I + I, I);
            L->experts[e].w2 = di_weight_rows(&wdn, e * D, D);
        }
        return DI_OK;
    }
    for (int64_t e = 0; e < E; e++) {
        char base[64];
        snprintf(base, sizeof base, "ffn.experts.%lld", (long long)e);
        if ((st = bind_mlp(b, p, base, &L->experts[e]))) return st;
    }
    return DI_OK;
}

static di_status bind_ffn(binder *b, const char *p, v4_block *L) {
    const int64_t D = b->hp->hidden_size, E = b->hp->n_routed_experts;
    di_status st = bind_mat(b, p, "ffn.gate.weight", E, D, false, &L->gate);
    if (st) return st;
    if (L->hash)
        st = bind_tid2eid(b, p, &L->tid2eid);
    else
        st = bind_floats(b, p, "ffn.gate.bias", E, 0, false, &L->gate_bias);
    if (st) return st;
    b->in_routed = true;
    b->routed = 0;
    st = bind_experts(b, p, L);
    b->in_routed = false;
    if (st) return st;
    if (b->params == &b->m->n_params_total) {
        b->m->n_params_routed += b->routed;
        b->m->n_params_active -= b->routed - b->routed / E * b->hp->num_experts_per_tok;
    }
    return bind_mlp(b, p, "ffn.shared_experts", &L->shared);
}

static di_status bind_block(binder *b, const char *prefix, int kind, int64_t m, bool hash,
                            v4_block *L) {
    L->kind = kind;
    L->m = m;
    L->hash = hash;
    di_status st = bind_attention(b, prefix, L);
    return st ? st : bind_ffn(b, prefix, L);
}

/* MTP module k (upstream "mtp.k."): optional; bound when its e_proj is present. */
static di_status bind_mtp(binder *b, int64_t k, v4_mtp *M, bool *present) {
    const int64_t D = b->hp->hidden_size, n = b->v->hc_mult;
    char p[32];
    snprintf(p, sizeof p, "mtp.%lld.", (long long)k);
    const di_st_tensor *t;
    di_status st = find(b, p, "e_proj.weight", true, &t);
    *present = t != NULL;
    if (st || !t) return st;
    st = bind_block(b, p, DI_V4_SLIDING, 0, false, &M->block);
    if (!st) st = bind_mat(b, p, "e_proj.weight", D, D, false, &M->e_proj);
    if (!st) st = bind_mat(b, p, "h_proj.weight", D, D, false, &M->h_proj);
    if (!st) st = bind_floats(b, p, "enorm.weight", D, 0, false, &M->enorm);
    if (!st) st = bind_floats(b, p, "hnorm.weight", D, 0, false, &M->hnorm);
    if (!st) st = bind_floats(b, p, "norm.weight", D, 0, false, &M->norm);
    if (!st) st = bind_floats(b, p, "hc_head_fn", n, n * D, false, &M->hc_head_fn);
    if (!st) st = bind_floats(b, p, "hc_head_base", n, 0, false, &M->hc_head_base);
    if (!st) st = bind_floats(b, p, "hc_head_scale", 1, 0, false, &M->hc_head_scale);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                               */
/* ---------------------------------------------------------------------------------------- */

void v4_model_free(v4_model *m) {
    if (!m) return;
    for (int64_t i = 0; i < m->n_owned; i++)
        di_free(m->owned[i]);
    di_free(m->owned);
    di_free(m);
}

di_status v4_model_bind(const di_hparams *hp, const di_st_set *st, const char *dir,
                        v4_model **out) {
    *out = NULL;
    v4_model *m = di_calloc(1, sizeof *m);
    if (!m) return di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
    m->hp = hp;
    m->v = &hp->v4;
    const di_v4_hparams *v = m->v;
    binder b = {.st = st, .hp = hp, .v = v, .dir = dir, .m = m, .params = &m->n_params_total};
    const int64_t D = hp->hidden_size, V = hp->vocab_size, L = hp->num_hidden_layers;
    const int64_t n = v->hc_mult;
    di_status s = DI_OK;
    m->blocks = v4_own(m, di_calloc((size_t)L, sizeof(v4_block)));
    if (!m->blocks) s = di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");

    if (!s) s = bind_mat(&b, "", "embed.weight", V, D, false, &m->embed);
    for (int64_t il = 0; !s && il < L; il++) {
        char p[32];
        snprintf(p, sizeof p, "layers.%lld.", (long long)il);
        s = bind_block(&b, p, v->layer_kind[il], v->compress_rate[il], v->hash_moe[il],
                       &m->blocks[il]);
    }
    if (!s) s = bind_floats(&b, "", "norm.weight", D, 0, false, &m->norm);
    if (!s) s = bind_floats(&b, "", "hc_head_fn", n, n * D, false, &m->hc_head_fn);
    if (!s) s = bind_floats(&b, "", "hc_head_base", n, 0, false, &m->hc_head_base);
    if (!s) s = bind_floats(&b, "", "hc_head_scale", 1, 0, false, &m->hc_head_scale);
    if (!s) {
        const di_st_tensor *t;
        s = find(&b, "", "head.weight", hp->tie_word_embeddings, &t);
        if (!s && t)
            s = bind_mat(&b, "", "head.weight", V, D, false, &m->head);
        else if (!s)
            m->head = m->embed;
    }
    m->n_params_active += m->n_params_total;

    /* MTP: bound if the checkpoint has it (transformers drops it; none of the goldens has
     * one). Counted separately; forward does not run it. */
    b.params = &m->n_params_mtp;
    if (!s && hp->num_nextn_predict_layers > 0) {
        m->mtp = v4_own(m, di_calloc((size_t)hp->num_nextn_predict_layers, sizeof(v4_mtp)));
        if (!m->mtp) s = di_error(DI_ERR_OUT_OF_MEMORY, "out of memory");
        for (int64_t k = 0; !s && k < hp->num_nextn_predict_layers; k++) {
            bool present = false;
            s = bind_mtp(&b, k, &m->mtp[k], &present);
            if (!s && present) m->n_mtp = k + 1;
            if (!present) break;
        }
    }
    if (s) {
        v4_model_free(m);
        return s;
    }
    *out = m;
    return DI_OK;
}
