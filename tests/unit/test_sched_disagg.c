/*
 * test_sched_disagg.c -- the scheduler's disaggregated mode (two sides, prefill and decode,
 * each with one batch in flight at a time) with the fake runner of test_sched_fake.h.
 *
 * The driver simulates two workers running concurrently: each side schedules whenever its
 * worker is free, a prefill batch takes a random number of ticks, a decode batch one tick.
 * Besides every check of run_all (outputs equal the request generated alone, budgets,
 * di_sched_check after every step, no leaks), it checks what concurrency needs:
 *   - a new batch never reads or writes a block the other side's batch in flight writes, and
 *     never uses its state slots (so the workers cannot race on KV rows or window state);
 *   - the decode side holds decodes only, the prefill side prefill only, each under its
 *     budget; every decoding request not in flight is in each decode batch (with a pool big
 *     enough not to preempt: the decode worker never waits for prefill);
 *   - aborts on either side, in flight or not, and failing batches on either side.
 */
#include "test_sched_fake.h"

typedef struct dis_opts {
    int abort_per_mille, fail_per_mille;
    int prefill_ticks; /* a prefill batch takes 1 .. prefill_ticks ticks */
    bool roomy;        /* the pool never runs short: no decode may be left out */
} dis_opts;

typedef struct dis_totals {
    int64_t steps[2];
    int64_t decode_steps_during_prefill; /* decode batches run while a prefill one was out */
    int64_t aborts_in_flight;
    uint64_t digest;
} dis_totals;

/* Blocks the rows of b write (positions after the replay), marked in mark[] with value v. */
static void mark_written(const di_sched_batch *b, int32_t bs, uint8_t *mark, uint8_t v) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_sched_seq *q = &b->seqs[i];
        for (int64_t p = q->start + q->n_replay; p < q->start + q->n_tokens; p++)
            mark[q->block_table[p / bs]] = v;
    }
}

/* Every block b reads or writes (its tables up to its last position) and every slot must be
 * free of the other side's batch in flight. */
static void check_disjoint(const di_sched_batch *b, const di_sched_batch *other, int32_t bs,
                           const uint8_t *written) {
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_sched_seq *q = &b->seqs[i];
        int64_t nb = (q->start + q->n_tokens + bs - 1) / bs;
        for (int64_t k = 0; k < nb; k++)
            CHECK_MSG(!written[q->block_table[k]],
                      "req %lld uses block %d that the other side is writing", (long long)q->req_id,
                      (int)q->block_table[k]);
        for (int32_t j = 0; other && j < other->n_seqs; j++) {
            CHECK(other->seqs[j].slot != q->slot);
            CHECK(other->seqs[j].req_id != q->req_id);
        }
    }
}

static dis_totals run_disagg(di_sched *s, const di_sched_config *cfg, spec *sp, int n, dis_opts o) {
    fake_runner fr;
    runner_init(&fr, cfg);
    dis_totals tot = {0};
    int32_t *sampled = calloc((size_t)cfg->max_running, sizeof *sampled);
    uint8_t *written[2] = {calloc((size_t)cfg->n_blocks, 1), calloc((size_t)cfg->n_blocks, 1)};
    const di_sched_batch *cur[2] = {NULL, NULL};
    int ticks_left[2] = {0, 0};
    const int64_t max_prefill =
        cfg->max_prefill_tokens > 0 ? cfg->max_prefill_tokens : cfg->max_batch_tokens;
    for (int64_t tick = 0; tick < 400000 && !test_cur_failed; tick++) {
        const bool all_added = add_arrivals(s, sp, n, tick);
        if (all_added && !di_sched_has_work(s) && !cur[0] && !cur[1]) break;
        /* Free workers take their side's next batch (decode first, as the engine does). */
        for (int k = 0; k < 2; k++) {
            di_sched_side side = k == 0 ? DI_SCHED_DECODE_SIDE : DI_SCHED_PREFILL_SIDE;
            if (cur[side]) continue;
            const di_sched_batch *b;
            CHECK_EQ_INT(di_sched_schedule_side(s, side, &b), DI_OK);
            if (test_cur_failed || b->n_seqs == 0) continue;
            const di_sched_batch *other = cur[1 - side];
            check_disjoint(b, other, cfg->block_size, written[1 - side]);
            if (side == DI_SCHED_DECODE_SIDE) {
                CHECK(b->n_prefill_tokens == 0 && b->n_replay_tokens == 0);
                CHECK(b->n_decode_tokens == b->n_tokens && b->n_tokens <= cfg->max_batch_tokens);
                if (other) tot.decode_steps_during_prefill++;
                /* Every decoding request not in the prefill batch is here. */
                for (int i = 0; o.roomy && i < n; i++) {
                    di_sched_req_info info;
                    if (!sp[i].added || di_sched_get(s, sp[i].id, &info) != DI_OK) continue;
                    if (info.state == DI_REQ_DECODE && !(other && in_batch(other, sp[i].id)))
                        CHECK_MSG(in_batch(b, sp[i].id), "decode of %lld left out",
                                  (long long)sp[i].id);
                }
            } else {
                CHECK(b->n_decode_tokens == 0);
                CHECK(b->n_tokens <= max_prefill);
            }
            tot.digest = digest_batch(tot.digest, b, (uint64_t)side << 60);
            cur[side] = b;
            mark_written(b, cfg->block_size, written[side], 1);
            ticks_left[side] =
                side == DI_SCHED_DECODE_SIDE ? 1 : 1 + (int)rnd((uint32_t)o.prefill_ticks);
            tot.steps[side]++;
        }
        /* Aborts land anywhere: waiting, running, or in flight on either side. */
        if (o.abort_per_mille && (int)rnd(1000) < o.abort_per_mille) {
            int i = (int)rnd((uint32_t)n);
            di_sched_req_info info;
            if (sp[i].added && di_sched_get(s, sp[i].id, &info) == DI_OK &&
                info.state != DI_REQ_FINISHED) {
                bool flying = (cur[0] && in_batch(cur[0], sp[i].id)) ||
                              (cur[1] && in_batch(cur[1], sp[i].id));
                CHECK_EQ_INT(di_sched_abort(s, sp[i].id), DI_OK);
                CHECK_EQ_INT(di_sched_get(s, sp[i].id, &info), DI_OK);
                /* In flight: it finishes when its side post-processes; else at once. */
                CHECK((info.state == DI_REQ_FINISHED) == !flying);
                tot.aborts_in_flight += flying;
                sp[i].aborted = true;
                CHECK_EQ_INT(di_sched_check(s), DI_OK);
            }
        }
        /* One tick of work; finished batches are post-processed (decode first). */
        for (int k = 0; k < 2 && !test_cur_failed; k++) {
            di_sched_side side = k == 0 ? DI_SCHED_DECODE_SIDE : DI_SCHED_PREFILL_SIDE;
            if (!cur[side] || --ticks_left[side] > 0) continue;
            const di_sched_batch *b = cur[side];
            runner_step(&fr, b, sampled, NULL);
            mark_written(b, cfg->block_size, written[side], 0);
            cur[side] = NULL;
            if (o.fail_per_mille && (int)rnd(1000) < o.fail_per_mille) {
                runner_scribble(&fr, b);
                CHECK_EQ_INT(di_sched_discard_side(s, side), DI_OK);
            } else {
                CHECK_EQ_INT(di_sched_postprocess_side(s, side, sampled), DI_OK);
            }
            di_status st = di_sched_check(s);
            CHECK_MSG(st == DI_OK, "tick %lld: %s", (long long)tick, di_last_error());
        }
    }
    CHECK(!cur[0] && !cur[1]);
    check_all_finished(s, cfg, sp, n);
    free(sampled);
    free(written[0]);
    free(written[1]);
    runner_free(&fr);
    return tot;
}

/* The unified calls are refused in disaggregated mode and the side calls in unified mode. */
TEST(mode_errors) {
    di_sched_config c = di_sched_default_config();
    c.disaggregate = true;
    di_sched *s = make(&c);
    if (!s) return;
    const di_sched_batch *b;
    int32_t tok[1] = {0};
    CHECK_EQ_INT(di_sched_schedule(s, &b), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_sched_postprocess(s, tok), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_sched_discard(s), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_sched_schedule_side(s, (di_sched_side)2, &b), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_ERR_INVALID_ARG);
    di_sched_req_params p = {.max_tokens = 2, .ignore_eos = true};
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    CHECK_EQ_INT(di_sched_add(s, 1, prompt, 5, &p), DI_OK);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &b), DI_OK);
    CHECK_EQ_INT(b->n_seqs, 1);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &b), DI_ERR_INVALID_ARG);
    di_sched_free(s);
    c.disaggregate = false;
    s = make(&c);
    if (!s) return;
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &b), DI_ERR_INVALID_ARG);
    CHECK_EQ_INT(di_sched_discard_side(s, DI_SCHED_DECODE_SIDE), DI_ERR_INVALID_ARG);
    di_sched_free(s);
}

/* Step by step: the hand-off, a long prompt arriving during decodes, aborts on both sides. */
TEST(hand_off_and_aborts) {
    di_sched_config c = di_sched_default_config();
    c.disaggregate = true;
    c.block_size = 4;
    c.n_blocks = 256;
    c.max_model_len = 512;
    c.max_running = 4;
    c.max_prefill_tokens = 8;
    di_sched *s = make(&c);
    if (!s) return;
    di_sched_req_params p = {.max_tokens = 50, .ignore_eos = true};
    int32_t shortp[3] = {1, 2, 3}, longp[40];
    for (int i = 0; i < 40; i++)
        longp[i] = 5 + i % 30;
    int32_t tok[4] = {7, 7, 7, 7};
    const di_sched_batch *pb, *db;
    CHECK_EQ_INT(di_sched_add(s, 1, shortp, 3, &p), DI_OK);
    /* Prefill side: the prompt in one chunk; the decode side has nothing yet. */
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK_EQ_INT(db->n_seqs, 0);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &pb), DI_OK);
    CHECK(pb->n_seqs == 1 && pb->n_prefill_tokens == 3 && pb->seqs[0].n_logits == 1);
    int32_t slot = pb->seqs[0].slot;
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_PREFILL_SIDE, tok), DI_OK);
    /* Handed off: the decode side runs it with the same slot and blocks. */
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK(db->n_seqs == 1 && db->seqs[0].req_id == 1 && db->seqs[0].start == 3);
    CHECK(db->seqs[0].slot == slot && db->seqs[0].tokens[0] == 7);
    /* A long prompt arrives: its chunks run on the prefill side while request 1 decodes on
     * every decode step; 5 chunks of 8 tokens take 5 prefill steps. */
    CHECK_EQ_INT(di_sched_add(s, 2, longp, 40, &p), DI_OK);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &pb), DI_OK);
    CHECK(pb->n_seqs == 1 && pb->seqs[0].req_id == 2 && pb->n_tokens == 8);
    int decode_steps = 0;
    for (int k = 0; k < 6; k++) { /* the prefill chunk is slow: six decode steps meanwhile */
        if (k > 0) CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
        CHECK(db->n_seqs == 1 && db->seqs[0].req_id == 1);
        CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_OK);
        decode_steps++;
    }
    CHECK_EQ_INT(decode_steps, 6);
    /* Abort of request 2 in flight on the prefill side: deferred until its post-process. */
    CHECK_EQ_INT(di_sched_abort(s, 2), DI_OK);
    di_sched_req_info info;
    CHECK_EQ_INT(di_sched_get(s, 2, &info), DI_OK);
    CHECK_EQ_INT(info.state, DI_REQ_PREFILL);
    CHECK_EQ_INT(di_sched_check(s), DI_OK);
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_PREFILL_SIDE, tok), DI_OK);
    CHECK_EQ_INT(di_sched_get(s, 2, &info), DI_OK);
    CHECK(info.state == DI_REQ_FINISHED && info.finish_reason == DI_FINISH_ABORT);
    /* Abort of request 1 in flight on the decode side: the same. */
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK_EQ_INT(di_sched_abort(s, 1), DI_OK);
    CHECK_EQ_INT(di_sched_get(s, 1, &info), DI_OK);
    CHECK_EQ_INT(info.state, DI_REQ_DECODE);
    int64_t n_out = info.n_output;
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_OK);
    CHECK_EQ_INT(di_sched_get(s, 1, &info), DI_OK);
    CHECK(info.state == DI_REQ_FINISHED && info.finish_reason == DI_FINISH_ABORT);
    CHECK_EQ_INT(info.n_output, n_out); /* the aborted row's token is dropped */
    di_sched_stats st;
    di_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(di_sched_check(s), DI_OK);
    di_sched_free(s);
}

/* Preemption with a request in flight on the prefill side: the decode side may not take its
 * blocks, so it preempts the newest request that is not in flight, or waits. */
TEST(preemption_skips_in_flight) {
    di_sched_config c = di_sched_default_config();
    c.disaggregate = true;
    c.block_size = 4;
    c.max_model_len = 32;
    c.n_blocks = 8; /* exactly one sequence of max_model_len */
    c.max_running = 4;
    c.max_prefill_tokens = 32;
    c.enable_prefix_cache = false;
    di_sched *s = make(&c);
    if (!s) return;
    di_sched_req_params p = {.max_tokens = 20, .ignore_eos = true};
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, bp[20];
    for (int i = 0; i < 20; i++)
        bp[i] = 9 + i;
    int32_t tok[4] = {4, 4, 4, 4};
    const di_sched_batch *pb, *db;
    CHECK_EQ_INT(di_sched_add(s, 1, a, 8, &p), DI_OK); /* 2 blocks */
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &pb), DI_OK);
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_PREFILL_SIDE, tok), DI_OK);
    /* Request 2 (5 blocks) goes in flight on the prefill side; 1 block is left free. */
    CHECK_EQ_INT(di_sched_add(s, 2, bp, 20, &p), DI_OK);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_PREFILL_SIDE, &pb), DI_OK);
    CHECK(pb->n_seqs == 1 && pb->seqs[0].req_id == 2);
    /* Request 1 decodes positions 8 .. 11 in a new block (the last free one), then needs
     * another at position 12: request 2 is in flight, so request 1 waits instead. */
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK(db->n_seqs == 1);
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_OK);
    for (int k = 0; k < 3; k++) {
        CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
        CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_OK);
    }
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK_EQ_INT(db->n_seqs, 0); /* waits: the only newer request is in flight */
    di_sched_stats st;
    di_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.n_preemptions, 0);
    CHECK_EQ_INT(di_sched_check(s), DI_OK);
    /* Once request 2's chunk is post-processed it can be preempted: request 1 proceeds and
     * request 2 goes back to the waiting queue (the prefill side). */
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_PREFILL_SIDE, tok), DI_OK);
    CHECK_EQ_INT(di_sched_schedule_side(s, DI_SCHED_DECODE_SIDE, &db), DI_OK);
    CHECK(db->n_seqs == 1 && db->seqs[0].req_id == 1);
    di_sched_req_info info;
    CHECK_EQ_INT(di_sched_get(s, 2, &info), DI_OK);
    CHECK_EQ_INT(info.state, DI_REQ_PREEMPTED);
    CHECK_EQ_INT(di_sched_postprocess_side(s, DI_SCHED_DECODE_SIDE, tok), DI_OK);
    CHECK_EQ_INT(di_sched_check(s), DI_OK);
    di_sched_free(s);
}

/* A long prompt among decodes, with a roomy pool: the decode side runs every decoding
 * request on every decode step while the prompt's chunks are out. */
TEST(long_prompt_never_stalls_decodes) {
    di_sched_config c = long_prompt_config(true);
    di_sched *s = make(&c);
    if (!s) return;
    static spec sp[5];
    long_prompt_specs(sp, 60);
    dis_totals t = run_disagg(s, &c, sp, 5, (dis_opts){0, 0, 4, true});
    /* 16 chunks of the long prompt, each 1-4 ticks, while the short ones decode. */
    CHECK(t.steps[DI_SCHED_PREFILL_SIDE] >= 16 + 1);
    CHECK(t.decode_steps_during_prefill >= 16);
    di_sched_free(s);
}

TEST(random_mixes) {
    static spec sp[40];
    int64_t preemptions = 0, hits = 0, in_flight_aborts = 0, overlapped = 0;
    for (int trial = 0; trial < 300 && !test_cur_failed; trial++) {
        bool roomy = trial % 4 == 0;
        di_sched_config c = di_sched_default_config();
        c.disaggregate = true;
        c = random_config(c, roomy);
        di_sched *s = make(&c);
        if (!s) return;
        int n = random_specs(&c, sp);
        dis_opts o = {roomy ? 0 : 8, trial % 3 == 0 ? 20 : 0, 1 + (int)rnd(5), roomy};
        if (roomy) o.fail_per_mille = 0; /* a discarded batch may preempt: not "roomy" */
        uint64_t rng_before = rng;
        dis_totals t = run_disagg(s, &c, sp, n, o);
        di_sched_stats st;
        di_sched_get_stats(s, &st);
        preemptions += st.n_preemptions;
        hits += st.prefix_hit_tokens;
        in_flight_aborts += t.aborts_in_flight;
        overlapped += t.decode_steps_during_prefill;
        di_sched_free(s);
        if (trial % 10 == 0) { /* the same inputs give the same decisions */
            for (int i = 0; i < n; i++)
                sp[i].added = sp[i].aborted = false;
            s = make(&c);
            rng = rng_before;
            dis_totals again = run_disagg(s, &c, sp, n, o);
            CHECK(again.digest == t.digest && again.steps[0] == t.steps[0] &&
                  again.steps[1] == t.steps[1]);
            di_sched_free(s);
        }
    }
    printf("  disaggregated mixes: %lld preemptions, %lld prefix-hit tokens, %lld aborts in "
           "flight, %lld decode steps during prefill\n",
           (long long)preemptions, (long long)hits, (long long)in_flight_aborts,
           (long long)overlapped);
    CHECK(preemptions > 100);
    CHECK(hits > 1000);
    CHECK(in_flight_aborts > 20);
    CHECK(overlapped > 1000);
}

int main(void) {
    RUN(mode_errors);
    RUN(hand_off_and_aborts);
    RUN(preemption_skips_in_flight);
    RUN(long_prompt_never_stalls_decodes);
    RUN(random_mixes);
    return test_summary();
}
