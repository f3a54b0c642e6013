/*
 * test_sched_fake.h -- the fake model runner and the checked driver shared by the scheduler
 * tests (test_sched.c: targeted cases; test_sched_random.c: random request mixes).
 *
 * The fake runner keeps a fake paged KV: for every block slot, the token and position last
 * written there. It writes each scheduled token through the sequence's block table, checks
 * that replayed tokens are already present, and computes the next token as a hash of the
 * whole sequence *read back from its KV blocks*. So a wrong block table, a wrong prefix-cache
 * hit or a block overwritten by another request changes the output, and run_all compares
 * every output with a plain loop that generates the request alone (ref_generate). The runner
 * also models V4 window state per slot and checks that, whenever logits are taken, the slot
 * has seen the last replay_tokens positions since it was reset (bounded replay).
 *
 * run_all checks after every step: the budgets hold, no decoding request was left out (unless
 * preempted), and di_sched_check passes (refcounts equal block-table owners, pool lists,
 * prefix cache). At the end: every request finished with the reference output, no leaks.
 */
#ifndef DI_TEST_SCHED_FAKE_H
#define DI_TEST_SCHED_FAKE_H

#include "sched/sched.h"
#include "test.h"

#define VOCAB 50
#define EOS   3

/* ---------------------------------------------------------------------------------------- */
/* The model: next token is a hash of the whole sequence                                      */
/* ---------------------------------------------------------------------------------------- */

static inline int32_t next_token(const int32_t *seq, int64_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)seq[i];
        h *= 1099511628211ULL;
    }
    return (int32_t)((h >> 29) % VOCAB);
}

/* The request generated alone, by the rules the scheduler must follow. */
static inline int64_t ref_generate(const int32_t *prompt, int64_t n_prompt,
                                   const di_sched_req_params *p, int64_t max_model_len,
                                   int32_t *seq, di_finish_reason *why) {
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int64_t n = n_prompt;
    for (;;) {
        int32_t t = next_token(seq, n);
        seq[n++] = t;
        int64_t n_out = n - n_prompt;
        bool stop = (!p->ignore_eos && t == EOS);
        for (int64_t i = 0; i < p->n_stop_token_ids; i++)
            stop |= t == p->stop_token_ids[i];
        if (n_out >= p->min_tokens && stop) {
            *why = DI_FINISH_STOP;
            break;
        }
        if (n_out >= p->max_tokens || n >= max_model_len) {
            *why = DI_FINISH_LENGTH;
            break;
        }
    }
    return n - n_prompt;
}

typedef struct fake_runner {
    int32_t bs;
    int32_t *kv_tok;            /* [n_blocks * bs] */
    int64_t *kv_pos;            /* [n_blocks * bs] position written there, -1 if none */
    int64_t window;             /* replay_tokens; 0: no window state to check */
    int64_t *win_lo, *win_next; /* [max_running] positions the slot's state has seen */
    int32_t *buf;               /* [max_model_len] */
    int64_t n_placeholders;     /* overlap inputs resolved from the previous batch */
} fake_runner;

static inline void runner_init(fake_runner *fr, const di_sched_config *c) {
    size_t n = (size_t)c->n_blocks * (size_t)c->block_size;
    memset(fr, 0, sizeof *fr);
    fr->bs = c->block_size;
    fr->kv_tok = calloc(n, sizeof *fr->kv_tok);
    fr->kv_pos = malloc(n * sizeof *fr->kv_pos);
    for (size_t i = 0; i < n; i++)
        fr->kv_pos[i] = -1;
    fr->window = c->replay_tokens;
    fr->win_lo = calloc((size_t)c->max_running, sizeof *fr->win_lo);
    fr->win_next = calloc((size_t)c->max_running, sizeof *fr->win_next);
    fr->buf = calloc((size_t)c->max_model_len, sizeof *fr->buf);
}

static inline void runner_free(fake_runner *fr) {
    free(fr->kv_tok);
    free(fr->kv_pos);
    free(fr->win_lo);
    free(fr->win_next);
    free(fr->buf);
}

static inline int64_t kv_index(const fake_runner *fr, const di_sched_seq *q, int64_t pos) {
    CHECK(pos / fr->bs < q->n_blocks_table);
    if (pos / fr->bs >= q->n_blocks_table) return 0;
    return (int64_t)q->block_table[pos / fr->bs] * fr->bs + pos % fr->bs;
}

/* Runs a batch. prev_sampled: the tokens of the previous batch, which the overlap loop's
 * placeholders refer to (NULL in the plain loop). */
static inline void runner_step(fake_runner *fr, const di_sched_batch *b, int32_t *sampled,
                               const int32_t *prev_sampled) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_sched_seq *q = &b->seqs[i];
        if (q->reset_state)
            fr->win_lo[q->slot] = fr->win_next[q->slot] = q->start;
        else
            CHECK_EQ_INT(q->start, fr->win_next[q->slot]); /* pieces arrive in order */
        for (int64_t j = 0; j < q->n_tokens; j++) {
            int64_t pos = q->start + j, k = kv_index(fr, q, pos);
            int32_t t = q->tokens[j];
            if (t < 0) { /* a placeholder: only a decode's input, only with overlap */
                CHECK(prev_sampled && q->n_tokens == 1);
                t = prev_sampled ? prev_sampled[-1 - t] : 0;
                fr->n_placeholders++;
            }
            if (j < q->n_replay) {
                CHECK(fr->kv_pos[k] == pos && fr->kv_tok[k] == t);
            } else {
                fr->kv_tok[k] = t;
                fr->kv_pos[k] = pos;
            }
        }
        fr->win_next[q->slot] = q->start + q->n_tokens;
        sampled[i] = -1;
        if (!q->n_logits) continue;
        int64_t end = q->start + q->n_tokens;
        if (fr->window > 0) CHECK(fr->win_lo[q->slot] <= DI_MAX(0, end - fr->window));
        for (int64_t p = 0; p < end; p++) {
            int64_t k = kv_index(fr, q, p);
            CHECK_MSG(fr->kv_pos[k] == p, "req %lld pos %lld: KV holds position %lld",
                      (long long)q->req_id, (long long)p, (long long)fr->kv_pos[k]);
            fr->buf[p] = fr->kv_tok[k];
        }
        sampled[i] = next_token(fr->buf, end);
    }
}

/* A failing runner may leave garbage in every row it was to write. */
static inline void runner_scribble(fake_runner *fr, const di_sched_batch *b) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_sched_seq *q = &b->seqs[i];
        for (int64_t j = q->n_replay; j < q->n_tokens; j++) {
            int64_t k = kv_index(fr, q, q->start + j);
            fr->kv_tok[k] = -7;
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Driving a scheduler through a mix of requests                                              */
/* ---------------------------------------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static inline uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

typedef struct spec {
    int64_t id;
    int32_t prompt[4200];
    int64_t n_prompt;
    di_sched_req_params params;
    int32_t stop[2];
    int64_t arrival; /* step at which it is added */
    bool added, aborted;
} spec;

typedef struct run_opts {
    int abort_per_mille; /* chance per step of aborting a random live request in flight */
    int fail_per_mille;  /* chance that the runner fails (after scribbling over its rows) */
    bool overlap;        /* schedule step N+1 before post-processing step N */
} run_opts;

typedef struct run_totals {
    int64_t steps, prefill_tokens, replay_tokens, decode_tokens, max_step_prefill;
    int64_t placeholders; /* decodes that consumed a token still in flight (overlap) */
    uint64_t digest;      /* of every batch decision: equal runs must decide equally */
} run_totals;

static inline bool in_batch(const di_sched_batch *b, int64_t id) {
    for (int32_t i = 0; i < b->n_seqs; i++)
        if (b->seqs[i].req_id == id) return true;
    return false;
}

/* Runs until every spec has been added and finished, checking everything (see top). */
/* After a run: every request finished with the output it has when run alone (aborted ones
 * with "abort", ones that can never fit with an error naming max_model_len), and once all
 * are released no block is held and the scheduler's invariants hold. */
static inline void check_all_finished(di_sched *s, const di_sched_config *cfg, const spec *sp,
                                      int n) {
    int32_t *ref = malloc(8192 * sizeof *ref);
    for (int i = 0; i < n && !test_cur_failed; i++) {
        di_sched_req_info info;
        CHECK_EQ_INT(di_sched_get(s, sp[i].id, &info), DI_OK);
        CHECK_EQ_INT(info.state, DI_REQ_FINISHED);
        if (sp[i].aborted) {
            CHECK_EQ_INT(info.finish_reason, DI_FINISH_ABORT);
            continue;
        }
        if (sp[i].n_prompt >= cfg->max_model_len) {
            CHECK_EQ_INT(info.finish_reason, DI_FINISH_ERROR);
            CHECK(strstr(info.error, "max_model_len") != NULL);
            continue;
        }
        di_finish_reason why;
        int64_t n_out = ref_generate(sp[i].prompt, sp[i].n_prompt, &sp[i].params,
                                     cfg->max_model_len, ref, &why);
        CHECK_EQ_INT(info.n_output, n_out);
        CHECK_EQ_INT(info.finish_reason, why);
        CHECK(info.n_output == n_out &&
              memcmp(info.output, ref + sp[i].n_prompt, (size_t)n_out * sizeof *ref) == 0);
    }
    free(ref);
    int64_t ids[256];
    int64_t n_fin = di_sched_finished(s, ids, 256);
    CHECK_EQ_INT(n_fin, n);
    for (int64_t i = 0; i < n_fin && i < 256; i++)
        CHECK_EQ_INT(di_sched_release(s, ids[i]), DI_OK);
    di_sched_stats st;
    di_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.n_running + st.n_waiting + st.n_finished, 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0); /* no leaks: only cached blocks nobody holds remain */
    CHECK_EQ_INT(di_sched_check(s), DI_OK);
}

/* Adds the requests that have arrived by `now`; true when every request is added. */
static inline bool add_arrivals(di_sched *s, spec *sp, int n, int64_t now) {
    bool all_added = true;
    for (int i = 0; i < n; i++) {
        if (sp[i].added) continue;
        if (sp[i].arrival > now) {
            all_added = false;
            continue;
        }
        CHECK_EQ_INT(di_sched_add(s, sp[i].id, sp[i].prompt, sp[i].n_prompt, &sp[i].params),
                     DI_OK);
        sp[i].added = true;
    }
    return all_added;
}

/* Folds batch b's decisions (which request, from where, how many tokens; salt tells the
 * batches of different sides apart) into a digest. */
static inline uint64_t digest_batch(uint64_t d, const di_sched_batch *b, uint64_t salt) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_sched_seq *q = &b->seqs[i];
        uint64_t v = (uint64_t)q->req_id * 1000003u ^ (uint64_t)q->start * 8191u ^
                     (uint64_t)q->n_tokens ^ salt;
        d = (d ^ v) * 1099511628211ULL;
    }
    return d;
}

static inline run_totals run_all(di_sched *s, const di_sched_config *cfg, spec *sp, int n,
                                 run_opts o) {
    fake_runner fr;
    runner_init(&fr, cfg);
    run_totals tot = {0};
    int32_t *cur = calloc((size_t)cfg->max_running, sizeof *cur);
    int32_t *prev = calloc((size_t)cfg->max_running, sizeof *prev);
    bool have_prev = false; /* overlap: a batch whose results are not yet post-processed */
    bool *decoding = calloc((size_t)n, sizeof *decoding);
    for (int64_t step = 0; step < 200000 && !test_cur_failed; step++) {
        const bool all_added = add_arrivals(s, sp, n, step);
        if (all_added && !di_sched_has_work(s) && !have_prev) break;
        for (int i = 0; i < n; i++) {
            di_sched_req_info info;
            decoding[i] = sp[i].added && di_sched_get(s, sp[i].id, &info) == DI_OK &&
                          info.state == DI_REQ_DECODE;
            /* Overlap: a token in flight may already end it by length. */
            if (decoding[i] && o.overlap &&
                (info.n_output + 1 >= sp[i].params.max_tokens ||
                 info.n_prompt + info.n_output + 1 >= cfg->max_model_len))
                decoding[i] = false;
        }
        const di_sched_batch *b;
        CHECK_EQ_INT(di_sched_schedule(s, &b), DI_OK);
        if (b->n_seqs == 0) { /* idle until the next arrival, or the last results */
            if (have_prev) CHECK_EQ_INT(di_sched_postprocess(s, prev), DI_OK);
            have_prev = false;
            continue;
        }
        /* Budgets. */
        int64_t sum = 0;
        for (int32_t i = 0; i < b->n_seqs; i++)
            sum += b->seqs[i].n_tokens;
        CHECK_EQ_INT(sum, b->n_tokens);
        CHECK(b->n_tokens <= cfg->max_batch_tokens);
        int64_t max_prefill =
            cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens : cfg->max_batch_tokens;
        CHECK(b->n_prefill_tokens + b->n_replay_tokens <= max_prefill);
        CHECK(b->n_seqs <= cfg->max_running);
        /* Decodes are never left out, unless their request was preempted. */
        for (int i = 0; i < n; i++) {
            if (!decoding[i]) continue;
            di_sched_req_info info;
            CHECK_EQ_INT(di_sched_get(s, sp[i].id, &info), DI_OK);
            CHECK(in_batch(b, sp[i].id) || info.state == DI_REQ_PREEMPTED);
        }
        tot.steps++;
        tot.digest = digest_batch(tot.digest, b, 0);
        tot.prefill_tokens += b->n_prefill_tokens;
        tot.replay_tokens += b->n_replay_tokens;
        tot.decode_tokens += b->n_decode_tokens;
        tot.max_step_prefill = DI_MAX(tot.max_step_prefill, b->n_prefill_tokens);
        runner_step(&fr, b, cur, have_prev ? prev : NULL);
        if (o.fail_per_mille && (int)rnd(1000) < o.fail_per_mille) {
            runner_scribble(&fr, b);
            CHECK_EQ_INT(di_sched_discard(s), DI_OK); /* both batches, with overlap */
            CHECK_EQ_INT(di_sched_check(s), DI_OK);
            have_prev = false;
            continue;
        }
        if (o.abort_per_mille && (int)rnd(1000) < o.abort_per_mille) {
            int i = (int)rnd((uint32_t)n);
            di_sched_req_info info;
            if (sp[i].added && di_sched_get(s, sp[i].id, &info) == DI_OK &&
                info.state != DI_REQ_FINISHED) {
                CHECK_EQ_INT(di_sched_abort(s, sp[i].id), DI_OK);
                sp[i].aborted = true;
            }
        }
        if (o.overlap) {
            if (have_prev) CHECK_EQ_INT(di_sched_postprocess(s, prev), DI_OK);
            int32_t *t = prev;
            prev = cur;
            cur = t;
            have_prev = true;
        } else {
            CHECK_EQ_INT(di_sched_postprocess(s, cur), DI_OK);
        }
        di_status st = di_sched_check(s);
        CHECK_MSG(st == DI_OK, "step %lld: %s", (long long)step, di_last_error());
    }
    check_all_finished(s, cfg, sp, n);
    tot.placeholders = fr.n_placeholders;
    free(cur);
    free(prev);
    free(decoding);
    runner_free(&fr);
    return tot;
}

static inline void fill_random(int32_t *t, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)rnd(VOCAB);
}

static inline void plain_params(spec *p, int64_t max_tokens) {
    memset(&p->params, 0, sizeof p->params);
    p->params.max_tokens = max_tokens;
    p->params.ignore_eos = true;
}

/* The long-prompt scenario: a roomy pool, 4 short requests of 8 prompt tokens and
 * short_tokens outputs from the start, then one of 4000 prompt tokens and 3 outputs at
 * step 3 (its prefill takes 16 chunks of max_prefill_tokens = 256). */
static inline di_sched_config long_prompt_config(bool disaggregate) {
    di_sched_config c = di_sched_default_config();
    c.disaggregate = disaggregate;
    c.block_size = 16;
    c.n_blocks = 1024;
    c.max_model_len = 8192;
    c.max_running = 8;
    c.max_batch_tokens = 300;
    c.max_prefill_tokens = 256;
    return c;
}

static inline void long_prompt_specs(spec sp[5], int64_t short_tokens) {
    for (int i = 0; i < 5; i++) {
        memset(&sp[i], 0, sizeof sp[i]);
        sp[i].id = i;
        sp[i].n_prompt = i < 4 ? 8 : 4000;
        fill_random(sp[i].prompt, sp[i].n_prompt);
        plain_params(&sp[i], i < 4 ? short_tokens : 3);
        sp[i].arrival = i < 4 ? 0 : 3;
    }
}

static inline di_sched *make(const di_sched_config *c) {
    di_sched *s = NULL;
    di_status st = di_sched_create(c, &s);
    CHECK_MSG(st == DI_OK, "%s", di_last_error());
    return s;
}

/* A random configuration for the random-mix tests: block size 1-8, max_model_len 40-119, a
 * pool of one sequence's blocks plus up to as many again (tiny: forces preemption) or, roomy,
 * 64 sequences' worth; budgets, prefix cache and V4 replay drawn too. */
static inline di_sched_config random_config(di_sched_config c, bool roomy) {
    c.block_size = 1 << rnd(4);
    c.max_model_len = 40 + rnd(80);
    int32_t min_blocks = (int32_t)((c.max_model_len + c.block_size - 1) / c.block_size);
    c.n_blocks = roomy ? 64 * min_blocks : min_blocks + (int32_t)rnd((uint32_t)min_blocks + 1);
    c.max_running = 1 + (int32_t)rnd(8);
    c.max_batch_tokens = c.max_running + rnd(64);
    c.max_prefill_tokens = rnd(2) ? 0 : 1 + rnd((uint32_t)c.max_batch_tokens);
    c.enable_prefix_cache = rnd(4) != 0;
    const int64_t replay_choices[5] = {0, 0, 3, 10, 30};
    c.replay_tokens = replay_choices[rnd(5)];
    c.eos_token_id = EOS;
    return c;
}

/* 10-39 random requests into sp[]: prompts sharing prefixes of three base sequences, one in
 * 20 too long to ever fit, random lengths, min_tokens, ignore_eos, a stop token and arrival
 * step. Returns their count. */
static inline int random_specs(const di_sched_config *c, spec *sp) {
    int32_t base[3][120];
    for (int k = 0; k < 3; k++)
        fill_random(base[k], 120);
    int n = 10 + (int)rnd(30);
    for (int i = 0; i < n; i++) {
        spec *p = &sp[i];
        memset(p, 0, sizeof *p);
        p->id = 1000 + i;
        int64_t shared = 1 + rnd(60), tail = rnd(10);
        memcpy(p->prompt, base[rnd(3)], (size_t)shared * sizeof(int32_t));
        fill_random(p->prompt + shared, tail);
        p->n_prompt = shared + tail;
        if (rnd(20) == 0) { /* can never fit */
            p->n_prompt = c->max_model_len + rnd(3);
            fill_random(p->prompt, p->n_prompt);
        }
        p->params.max_tokens = 1 + rnd(40);
        p->params.min_tokens = rnd(4);
        p->params.ignore_eos = rnd(4) == 0;
        if (rnd(3) == 0) {
            p->stop[0] = (int32_t)rnd(VOCAB);
            p->params.stop_token_ids = p->stop;
            p->params.n_stop_token_ids = 1;
        }
        p->arrival = rnd(60);
    }
    return n;
}

#endif /* DI_TEST_SCHED_FAKE_H */
