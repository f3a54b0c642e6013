/*
 * test_sched_random.c -- the scheduler under random request mixes: block sizes, tiny KV pools
 * that force preemption, budgets, arrival times, shared prefixes, prompts that can never fit,
 * stop conditions, aborts in flight, runner failures, prefix cache on and off, V4 replay.
 * Every step is checked by run_all (test_sched_fake.h); every output must equal the request
 * generated alone.
 */
#include "test_sched_fake.h"

TEST(random_mixes) {
    static spec sp[40];
    int64_t preemptions = 0, hits = 0, replays = 0, placeholders = 0;
    for (int trial = 0; trial < 400 && !test_cur_failed; trial++) {
        di_sched_config c = random_config(di_sched_default_config(), false);
        di_sched *s = make(&c);
        if (!s) return;
        int n = random_specs(&c, sp);
        run_opts opts = {5, trial % 3 == 0 ? 20 : 0, trial % 2 == 1};
        uint64_t rng_before = rng;
        run_totals t = run_all(s, &c, sp, n, opts);
        di_sched_stats st;
        di_sched_get_stats(s, &st);
        preemptions += st.n_preemptions;
        hits += st.prefix_hit_tokens;
        replays += t.replay_tokens;
        placeholders += t.placeholders;
        CHECK(opts.overlap || t.placeholders == 0);
        di_sched_free(s);
        if (trial % 10 == 0) { /* the same inputs give the same decisions, step for step */
            for (int i = 0; i < n; i++)
                sp[i].added = sp[i].aborted = false;
            s = make(&c);
            rng = rng_before;
            run_totals again = run_all(s, &c, sp, n, opts);
            CHECK(again.digest == t.digest && again.steps == t.steps);
            di_sched_free(s);
        }
    }
    printf("  random mixes: %lld preemptions, %lld prefix-hit tokens, %lld replayed tokens, %lld "
           "overlapped decodes\n",
           (long long)preemptions, (long long)hits, (long long)replays, (long long)placeholders);
    /* The mixes must actually exercise preemption, prefix hits and replay. */
    CHECK(preemptions > 100);
    CHECK(hits > 1000);
    CHECK(replays > 100);
    CHECK(placeholders > 1000);
}

TEST(long_prompt_mixes) {
    /* Fewer, longer requests: 16-token blocks, prompts up to 1,500 tokens over shared
     * 1,000-token prefixes, a pool of one to one-and-a-half sequences. */
    static spec sp[24];
    static int32_t base[2][1000];
    int64_t preemptions = 0, hits = 0;
    for (int trial = 0; trial < 6 && !test_cur_failed; trial++) {
        di_sched_config c = di_sched_default_config();
        c.block_size = 16;
        c.max_model_len = 2048;
        c.n_blocks = 128 + (int32_t)rnd(64);
        c.max_running = 2 + (int32_t)rnd(12);
        c.max_batch_tokens = 256 + rnd(512);
        c.max_prefill_tokens = 128 + rnd((uint32_t)c.max_batch_tokens - 127);
        c.replay_tokens = trial % 2 ? 0 : 200;
        c.eos_token_id = EOS;
        di_sched *s = make(&c);
        if (!s) return;
        for (int k = 0; k < 2; k++)
            fill_random(base[k], 1000);
        int n = 8 + (int)rnd(16);
        for (int i = 0; i < n; i++) {
            spec *p = &sp[i];
            memset(p, 0, sizeof *p);
            p->id = i;
            int64_t shared = rnd(1001), tail = 1 + rnd(500);
            memcpy(p->prompt, base[rnd(2)], (size_t)shared * sizeof(int32_t));
            fill_random(p->prompt + shared, tail);
            p->n_prompt = shared + tail;
            p->params.max_tokens = 1 + rnd(60);
            p->params.ignore_eos = rnd(2) == 0;
            p->arrival = rnd(40);
        }
        run_all(s, &c, sp, n, (run_opts){2, trial == 5 ? 10 : 0, trial % 2 == 0});
        di_sched_stats st;
        di_sched_get_stats(s, &st);
        preemptions += st.n_preemptions;
        hits += st.prefix_hit_tokens;
        di_sched_free(s);
    }
    printf("  long prompts: %lld preemptions, %lld prefix-hit tokens\n", (long long)preemptions,
           (long long)hits);
    CHECK(preemptions > 0);
    CHECK(hits > 5000);
}

int main(void) {
    RUN(long_prompt_mixes);
    RUN(random_mixes);
    return test_summary();
}
