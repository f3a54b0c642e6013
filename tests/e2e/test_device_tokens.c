/*
 * test_device_tokens.c -- the DeepSeek-V2/V3 runner's device-token path without a GPU.
 *
 * On a device the runner may return a decode step's tokens instead of its logits rows
 * (deepseek_v3.c fetch_decode): the rows' argmax when every sequence is plain greedy
 * (argmax_rows), the draw when every sequence is device_draw (sample_rows: temperature,
 * min_p, top_k, top_p). Here the runner runs on the separate-memory CPU backend
 * (sep_backend.h), whose argmax_rows / sample_rows are the CPU backend's, next to the same
 * runner on the plain CPU backend, over four sequences (paged, chunked prefill) and decode
 * steps of every mix: all greedy, temperature-only and filtered (top_k, top_p, min_p)
 * together, greedy with the others, and a step with a sequence that asked for logprobs
 * (which must bring the rows back). Each step's tokens must be
 * di_sampler_sample's tokens from the plain runner's logits, and where tokens came back the
 * logits buffer must be untouched (no rows downloaded); where rows came back, bitwise the
 * plain runner's. The separate-memory backend also has the second-stream ops (no-ops), so
 * these comparisons cover the runner's calls of them too; its chunks of several prompts take
 * the one-call attention a device backend gets.
 *
 * The same steps also run on a third state the way the engine's device loop drives it
 * (di_batch_args.defer / pending_on_device): step k + 1 is handed to the runner before step
 * k's tokens are waited for, its ids pending (-1 - s) wherever step k was deferred. A step of
 * tokens must come back deferred, its tokens absent until fence_wait and then the sampler's,
 * its logits buffer untouched; the logprobs step runs at once with its rows; the pending ids must
 * be resolved (counted) into the tokens that keep every later step equal to the plain runner.
 *
 * v3_untransposed_heads: with the backend flag prefers_untransposed_heads set (CUDA's), the
 * runner's W_UK^T copy holds exactly kv_b_proj's transposed key rows, and the logits stay
 * within rounding of the plain runner's.
 */
#define _POSIX_C_SOURCE 200809L
#include "api_internal.h"
#include "core/core.h"
#include "model/deepseek_v3.h"
#include "sample/sample_vec.h"
#include "sample/sampler.h"
#include "sep_backend.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_SEQ   4
#define N_STEPS 6
#define BS      16

/* How sequence s samples at decode step k: 0 greedy, 1 temperature only, 2 filtered (top_k,
 * top_p, min_p: still drawn on the device), 3 top_p with logprobs (the rows come back). */
static int mode_of(int k, int s) {
    static const int modes[N_STEPS][N_SEQ] = {{0, 0, 0, 0}, {1, 2, 1, 2}, {0, 1, 0, 1},
                                              {1, 3, 0, 2}, {0, 0, 0, 0}, {2, 0, 1, 1}};
    return modes[k][s];
}

static di_sampling_params params_of(int mode, int s) {
    di_sampling_params p = di_sampling_default_params();
    p.temperature = mode == 0 ? 0.0f : 0.6f + 0.3f * (float)s;
    if (mode >= 2) p.top_p = 0.8f;
    if (mode == 2) {
        p.top_k = s % 2 ? 40 : 0;
        p.min_p = s > 1 ? 0.02f : 0.0f;
    }
    if (mode == 3) p.logprobs = 1;
    return p;
}

static void check_model(const char *dir) {
    di_model *m = sep_model_load(dir);
    if (!m) return;
    const di_arch_vtable *arch = m->arch;
    const int64_t V = m->hp.vocab_size;
    di_backend cpu, sep;
    CHECK(di_backend_cpu_init(&cpu, m->pool, 512) == DI_OK);
    sep_init(&sep, m->pool, 512);
    void *ws = NULL;
    CHECK_MSG(arch->load(&m->hp, m->st, dir, &sep, &ws) == DI_OK && ws, "%s", di_last_error());
    di_batch_config cfg = {.n_blocks = N_SEQ * 4,
                           .block_size = BS,
                           .n_slots = N_SEQ,
                           .max_model_len = 4 * BS,
                           .max_batch_tokens = 7}; /* prefill in chunks of 7 rows */
    void *st_ref = NULL, *st_sep = NULL, *st_def = NULL;
    CHECK(arch->batch_state_create(m->weights, &cfg, &st_ref) == DI_OK);
    if (ws) CHECK(arch->batch_state_create(ws, &cfg, &st_sep) == DI_OK);
    if (ws) CHECK(arch->batch_state_create(ws, &cfg, &st_def) == DI_OK);
    float *ref = malloc((size_t)(N_SEQ * V) * sizeof(float));
    float *got = malloc((size_t)(N_SEQ * V) * sizeof(float));
    float *dgot = malloc((size_t)(N_SEQ * V) * sizeof(float));
    void *scratch = malloc(di_sampler_scratch_size(V));
    if (!st_ref || !st_sep || !st_def || !ref || !got || !dgot || !scratch) goto done;

    static const int64_t plen[N_SEQ] = {5, 9, 3, 12};
    int32_t ids[N_SEQ][32], table[N_SEQ][4];
    for (int s = 0; s < N_SEQ; s++) {
        for (int64_t i = 0; i < plen[s]; i++)
            ids[s][i] = (int32_t)((i * 7919 + 13 * s + 3) % (V - 2)) + 1;
        for (int j = 0; j < 4; j++)
            table[s][j] = s + N_SEQ * j;
    }
    di_batch_seq q[N_SEQ];
    for (int s = 0; s < N_SEQ; s++)
        q[s] = (di_batch_seq){.ids = ids[s],
                              .n = plen[s],
                              .block_table = table[s],
                              .slot = s,
                              .reset_state = true,
                              .n_logits = 1};
    const int64_t side = g_n_side;
    arch->forward_batch(
        m->weights, st_ref, &cpu,
        &(di_batch_args){.seqs = q, .n_seqs = N_SEQ, .logits = ref, .tokens = NULL});
    arch->forward_batch(
        ws, st_sep, &sep,
        &(di_batch_args){.seqs = q, .n_seqs = N_SEQ, .logits = got, .tokens = NULL});
    CHECK(memcmp(ref, got, (size_t)(N_SEQ * V) * sizeof(float)) == 0);
    CHECK_MSG(g_n_side > side, "%s: the runner did not call side_begin", dir);
    int64_t ticket = 0; /* the deferred state's prefill: rows, so not deferred */
    arch->forward_batch(ws, st_def, &sep,
                        &(di_batch_args){.seqs = q,
                                         .n_seqs = N_SEQ,
                                         .logits = dgot,
                                         .tokens = NULL,
                                         .defer = true,
                                         .ticket = &ticket});
    CHECK(ticket == 0 && memcmp(ref, dgot, (size_t)(N_SEQ * V) * sizeof(float)) == 0);

    /* The first decode step's inputs: the prefill's greedy tokens. */
    int32_t next[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        bool bad;
        int64_t first;
        di_sample_kernels_active()->scan(ref + s * V, V, &bad, &first);
        next[s] = (int32_t)first;
    }
    int n_token_steps = 0, n_row_steps = 0, n_deferred = 0;
    /* the deferred state's step in flight: its ticket, tokens and the tokens it must give */
    int64_t prev_ticket = 0;
    int32_t dtok[2][N_SEQ], want[N_SEQ], pend[N_SEQ];
    const int64_t resolved0 = g_n_resolved;
    for (int k = 0; k < N_STEPS; k++) {
        int32_t tokens[N_SEQ];
        di_sampling_params sp[N_SEQ];
        di_sample_input in[N_SEQ];
        bool device = true; /* every row greedy or unfiltered: tokens come back */
        for (int s = 0; s < N_SEQ; s++) {
            const int64_t pos = plen[s] + k; /* the input's position; the token chosen is pos + 1 */
            const int mode = mode_of(k, s);
            ids[s][pos] = next[s];
            sp[s] = params_of(mode, s);
            in[s] = (di_sample_input){.vocab = V,
                                      .eos_token_id = -1,
                                      .seed = 500 + s,
                                      .sample_index = s % 2,
                                      .position = pos + 1};
            q[s] = (di_batch_seq){
                .ids = &ids[s][pos],
                .n = 1,
                .pos0 = pos,
                .block_table = table[s],
                .slot = s,
                .n_logits = 1,
                .device_draw = di_sampler_device_draw(&sp[s], &in[s]),
                .sample = di_sample_row_of(&sp[s], in[s].seed, in[s].sample_index, in[s].position)};
            CHECK(q[s].device_draw == (mode < 3));
            device &= mode < 3;
            tokens[s] = -1;
        }
        arch->forward_batch(
            m->weights, st_ref, &cpu,
            &(di_batch_args){.seqs = q, .n_seqs = N_SEQ, .logits = ref, .tokens = NULL});
        for (int64_t i = 0; i < N_SEQ * V; i++)
            got[i] = dgot[i] = NAN;
        arch->forward_batch(
            ws, st_sep, &sep,
            &(di_batch_args){.seqs = q, .n_seqs = N_SEQ, .logits = got, .tokens = tokens});
        /* The deferred state: this step goes in before the previous one is waited for. */
        di_batch_seq dq[N_SEQ];
        int32_t *dt = dtok[k % 2];
        for (int s = 0; s < N_SEQ; s++) {
            dq[s] = q[s];
            pend[s] = -1 - s;
            if (prev_ticket) dq[s].ids = &pend[s];
            dt[s] = -1;
        }
        ticket = -1;
        arch->forward_batch(ws, st_def, &sep,
                            &(di_batch_args){.seqs = dq,
                                             .n_seqs = N_SEQ,
                                             .logits = dgot,
                                             .tokens = dt,
                                             .defer = true,
                                             .pending_on_device = prev_ticket > 0,
                                             .ticket = &ticket});
        if (prev_ticket) {
            const int32_t *pt = dtok[(k + 1) % 2];
            CHECK(sep.ops->fence_wait(sep.ctx, prev_ticket) == DI_OK);
            for (int s = 0; s < N_SEQ; s++)
                CHECK_MSG(pt[s] == want[s], "%s deferred step %d seq %d: token %d, want %d", dir,
                          k - 1, s, pt[s], want[s]);
        }
        for (int s = 0; s < N_SEQ; s++) { /* the host sampler on the plain runner's rows */
            di_sample_result r;
            in[s].logits = ref + s * V;
            CHECK(di_sampler_sample(&sp[s], &in[s], scratch, &r) == DI_OK);
            next[s] = r.token;
        }
        if (device) {
            CHECK_MSG(ticket > 0, "%s step %d: a step of tokens was not deferred", dir, k);
            for (int s = 0; s < N_SEQ; s++) {
                CHECK_MSG(dt[s] == -1, "%s step %d: a deferred token arrived before its fence", dir,
                          k);
                want[s] = next[s];
            }
            CHECK(isnan(dgot[0]) && isnan(dgot[N_SEQ * V - 1]));
            n_deferred++;
        } else {
            CHECK_MSG(ticket == 0, "%s step %d: a step of rows was deferred", dir, k);
            CHECK(memcmp(ref, dgot, (size_t)(N_SEQ * V) * sizeof(float)) == 0);
        }
        prev_ticket = ticket > 0 ? ticket : 0;
        if (device) {
            n_token_steps++;
            for (int s = 0; s < N_SEQ; s++)
                CHECK_MSG(tokens[s] == next[s], "%s step %d seq %d: token %d, the sampler's %d",
                          dir, k, s, tokens[s], next[s]);
            CHECK_MSG(isnan(got[0]) && isnan(got[N_SEQ * V - 1]),
                      "%s step %d: logits rows were downloaded with the tokens", dir, k);
        } else {
            n_row_steps++;
            for (int s = 0; s < N_SEQ; s++)
                CHECK(tokens[s] == -1);
            CHECK_MSG(memcmp(ref, got, (size_t)(N_SEQ * V) * sizeof(float)) == 0,
                      "%s step %d: the rows differ from the plain runner's", dir, k);
        }
    }
    CHECK(n_token_steps == N_STEPS - 1 && n_row_steps == 1); /* modes: one logprobs step */
    if (prev_ticket) {
        CHECK(sep.ops->fence_wait(sep.ctx, prev_ticket) == DI_OK);
        for (int s = 0; s < N_SEQ; s++)
            CHECK(dtok[(N_STEPS - 1) % 2][s] == want[s]);
    }
    /* pending ids: N_SEQ in each step that follows a deferred one (the steps after every
     * deferred step but the last, which is the loop's last step) */
    CHECK_MSG(g_n_resolved - resolved0 == (int64_t)(n_deferred - 1) * N_SEQ,
              "%s: %lld pending ids resolved, want %lld", dir,
              (long long)(g_n_resolved - resolved0), (long long)(n_deferred - 1) * N_SEQ);
    printf("  %-14s %d decode steps returned tokens (%d deferred), %d returned rows\n",
           strrchr(dir, '/') + 1, n_token_steps, n_deferred, n_row_steps);
done:
    if (st_ref) arch->batch_state_free(st_ref);
    if (st_sep) arch->batch_state_free(st_sep);
    if (st_def) arch->batch_state_free(st_def);
    if (ws) arch->free(ws);
    free(ref), free(got), free(dgot), free(scratch);
    di_backend_free(&sep);
    di_backend_free(&cpu);
    di_model_free(m);
}

TEST(v3_device_tokens) {
    check_model(DI_SOURCE_DIR "/tests/data/v3_fp8");
    check_model(DI_SOURCE_DIR "/tests/data/v2_lite");
}

/* A backend that prefers untransposed head products (CUDA's flag, set here on the
 * separate-memory CPU backend): the runner uploads W_UK^T as a weight of its own
 * (deepseek_v3_device.c) and multiplies by it untransposed. The copy must hold exactly the
 * transposed key rows of kv_b_proj, and the logits stay within rounding of the plain
 * runner's (the same products summed in another order). */
TEST(v3_untransposed_heads) {
    const char *dir = DI_SOURCE_DIR "/tests/data/v2_lite"; /* BF16 kv_b_proj */
    di_model *m = sep_model_load(dir);
    if (!m) return;
    const di_arch_vtable *arch = m->arch;
    const di_hparams *hp = &m->hp;
    const int64_t V = hp->vocab_size, nh = hp->num_attention_heads, R = hp->kv_lora_rank;
    const int64_t dn = hp->qk_nope_head_dim, dv = hp->v_head_dim;
    di_backend cpu, sep;
    CHECK(di_backend_cpu_init(&cpu, m->pool, 512) == DI_OK);
    sep_init(&sep, m->pool, 512);
    g_ops.prefers_untransposed_heads = true;
    void *ws = NULL, *st_ref = NULL, *st_sep = NULL;
    float *ref = NULL, *got = NULL;
    CHECK_MSG(arch->load(hp, m->st, dir, &sep, &ws) == DI_OK && ws, "%s", di_last_error());
    if (!ws) goto done;
    const ds_model *host = m->weights, *dev = ws;
    int64_t bad = 0;
    for (int64_t il = 0; il < hp->num_hidden_layers; il++) {
        const ds_layer *L = &dev->layers[il], *H = &host->layers[il];
        CHECK_MSG(L->w_ukt != NULL, "layer %lld: no W_UK^T copy", (long long)il);
        if (!L->w_ukt) continue;
        const uint16_t *kv = H->kv_b_proj.data;
        for (int64_t h = 0; h < nh; h++) {
            const uint16_t *t = L->w_ukt[h].data;
            CHECK(L->w_ukt[h].rows == R && L->w_ukt[h].cols == dn);
            for (int64_t c = 0; c < R; c++)
                for (int64_t d = 0; d < dn; d++)
                    bad += t[c * L->w_ukt[h].row_stride + d] !=
                           kv[(h * (dn + dv) + d) * H->kv_b_proj.row_stride + c];
        }
    }
    CHECK_MSG(bad == 0, "%lld elements of the W_UK^T copy are not kv_b_proj's", (long long)bad);

    di_batch_config cfg = {.n_blocks = 8,
                           .block_size = BS,
                           .n_slots = 2,
                           .max_model_len = 4 * BS,
                           .max_batch_tokens = 7};
    CHECK(arch->batch_state_create(m->weights, &cfg, &st_ref) == DI_OK);
    CHECK(arch->batch_state_create(ws, &cfg, &st_sep) == DI_OK);
    ref = malloc((size_t)(2 * V) * sizeof(float));
    got = malloc((size_t)(2 * V) * sizeof(float));
    if (!st_ref || !st_sep || !ref || !got) goto done;
    int32_t ids[2][9], table[2][4];
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 9; i++)
            ids[s][i] = (int32_t)((i * 7919 + 31 * s + 5) % (V - 2)) + 1;
        for (int j = 0; j < 4; j++)
            table[s][j] = s + 2 * j;
    }
    di_batch_seq q[2];
    for (int s = 0; s < 2; s++) /* prompts of 5 and 9 tokens, in chunks of 7 rows */
        q[s] = (di_batch_seq){.ids = ids[s],
                              .n = s ? 9 : 5,
                              .block_table = table[s],
                              .slot = s,
                              .reset_state = true,
                              .n_logits = 1};
    arch->forward_batch(m->weights, st_ref, &cpu,
                        &(di_batch_args){.seqs = q, .n_seqs = 2, .logits = ref, .tokens = NULL});
    arch->forward_batch(ws, st_sep, &sep,
                        &(di_batch_args){.seqs = q, .n_seqs = 2, .logits = got, .tokens = NULL});
    double max_ref = 0.0, max_diff = 0.0;
    for (int64_t i = 0; i < 2 * V; i++) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        max_diff = fmax(max_diff, fabs((double)ref[i] - got[i]));
    }
    CHECK_MSG(max_diff <= 1e-5 * max_ref, "logits: max difference %.3g of max |logit| %.3g",
              max_diff, max_ref);
done:
    if (st_ref) arch->batch_state_free(st_ref);
    if (st_sep) arch->batch_state_free(st_sep);
    if (ws) arch->free(ws);
    free(ref), free(got);
    di_backend_free(&sep);
    di_backend_free(&cpu);
    di_model_free(m);
}

int main(void) {
    RUN(v3_device_tokens);
    RUN(v3_untransposed_heads);
    return test_summary();
}
