/*
 * test_cuda_model.c -- the DeepSeek-V2/V3 and V4 models end to end on the CUDA backend
 * (di_model_params.device = "cuda"). Without a CUDA device every GPU test is skipped with the
 * reason; the device-choice errors are checked everywhere. (The bundled V4 model on CUDA is
 * in test_bundled_model.c.)
 *
 *   - goldens: the V2/V3 and V4 golden cases through CUDA with test_goldens.c's tolerances (logits
 *     within 1e-3 * max|ref| per position, greedy ids identical, chunked prefill within 1e-5
 *     relative, 300 tokens in one call bitwise equal to calls of 50), plus the distance to
 *     the CPU logits (same 1e-3 bound);
 *   - engine (V3 FP8 and V4): a mixed batch of greedy requests gives the CPU engine's tokens;
 *   - batch invariance (V3 FP8 and V4): one request's logprobs (chosen and top-5, from the
 *     logits) are bitwise the same alone and inside a batch of several other requests on the
 *     GPU;
 *   - device sampling (V3 FP8): seeded temperature-only requests (and a top_p one) give the
 *     same tokens with the draw on the device (the default) as with the host sampler
 *     (DI_CUDA_SAMPLE=0);
 *   - errors: a bad device name.
 */
#define _POSIX_C_SOURCE 200809L
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "engine_util.h"
#include "golden_util.h"

#include <math.h>
#include <string.h>

static bool g_have_gpu;

static const char *const g_cases[] = {"v2_lite",      "v2_qlora_yarn",  "v3_grouped",
                                      "v3_fp8",       "v3_plain_rope",  "v4_mix_yarn",
                                      "v4_hc3_plain", "v4_upstream_fp8"};

/* The checkpoints the engine tests run: V3 with FP8 weights, V4 (CSA + HCA + hash layers)
 * and V4 in the upstream FP8 / FP4 layout. */
static const char *const g_engine_cases[] = {"v3_fp8", "v4_mix_yarn", "v4_upstream_fp8"};

/* tests/data/<name> on the device. */
static di_model *load_on(const char *name, const char *device) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, name);
    di_model_params mp = di_model_default_params();
    mp.n_threads = 2;
    mp.device = device;
    di_model *m = NULL;
    if (di_model_load(dir, &mp, &m) != DI_OK) {
        printf("  %s on %s: %s\n", dir, device, di_last_error());
        return NULL;
    }
    return m;
}

/* The layers with a branch on the backend's second stream (the default; V2/V3: the latent
 * projection and store beside the queries, the shared experts beside the routed ones; V4:
 * the shared expert beside the routing and the routed experts) against one stream
 * (DI_CUDA_STREAMS=1, read when a context makes its backend): the same bits, for the prompt in one
 * call (lg) and token by token (graphs, where the backend has them); a race between the streams
 * would show here. */
static void check_streams(const char *name, di_model *m, const golden *g, const float *lg) {
    const int64_t forks = di_backend_cuda_side_forks();
    float *two1 = eval_prompt(m, g, 1, 2);
    const bool forked = di_backend_cuda_side_forks() > forks;
    const int64_t forks_two = di_backend_cuda_side_forks();
    setenv("DI_CUDA_STREAMS", "1", 1);
    float *one = eval_prompt(m, g, 0, 2), *one1 = eval_prompt(m, g, 1, 2);
    unsetenv("DI_CUDA_STREAMS");
    CHECK(two1 && one && one1);
    CHECK_MSG(forked, "%s: no layer used the second stream", name);
    CHECK_MSG(di_backend_cuda_side_forks() == forks_two, "%s: DI_CUDA_STREAMS=1 forked", name);
    const size_t bytes = (size_t)(g->n_prompt * g->vocab) * sizeof(float);
    if (two1 && one && one1) {
        CHECK_MSG(memcmp(lg, one, bytes) == 0, "%s: two streams differ from one (prompt)", name);
        CHECK_MSG(memcmp(two1, one1, bytes) == 0, "%s: two streams differ from one (steps)", name);
    }
    free(two1), free(one), free(one1);
}

static void check_case(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DATA_DIR, name);
    golden g;
    CHECK_MSG(golden_load(dir, &g), "%s: cannot read ref.json / logits", dir);
    if (!g.ref) return;
    di_model *m = load_on(name, "cuda"), *mc = load_on(name, "cpu");
    CHECK(m && mc);
    if (!m || !mc) {
        di_model_free(m);
        di_model_free(mc);
        golden_free(&g);
        return;
    }
    const int64_t V = g.vocab;

    /* 1. the prompt in one call vs the reference, and vs the CPU */
    float *lg = eval_prompt(m, &g, 0, 2), *lcpu = eval_prompt(mc, &g, 0, 2);
    CHECK(lg && lcpu);
    const double worst = lg ? check_vs_reference(name, &g, lg) : 0.0;
    double vs_cpu = 0.0;
    if (lg && lcpu) {
        vs_cpu = worst_ratio_f(lg, lcpu, g.n_prompt, V);
        CHECK_MSG(vs_cpu <= 1e-3, "%s: CUDA vs CPU logits differ by %.3g", name, vs_cpu);
    }

    /* 2. greedy generation, token by token */
    const int64_t matched = check_greedy(name, m, &g);

    /* 3. chunked prefill vs one call */
    const double chunk_worst = lg ? check_chunked(name, m, &g, lg) : 0.0;

    /* 3b. 300 tokens (more than the internal chunk) in one call vs calls of 50: bitwise */
    check_long_input(name, m, &g);

    /* 4. the second stream's branches vs one stream, bitwise */
    if (lg) check_streams(name, m, &g, lg);
    printf("  %-16s cuda: max error ratio %.3g, vs cpu %.3g, greedy %lld/%lld, chunked diff "
           "%.3g\n",
           name, worst, vs_cpu, (long long)matched, (long long)g.n_greedy, chunk_worst);
    free(lg);
    free(lcpu);
    di_model_free(m);
    di_model_free(mc);
    golden_free(&g);
}

TEST(goldens_cuda) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t i = 0; i < DI_ARRAY_LEN(g_cases); i++)
        check_case(g_cases[i]);
}

/* ---- engine ------------------------------------------------------------------------------ */

static uint32_t g_rng = 4321;
static int32_t rnd(int32_t n) {
    g_rng = g_rng * 1664525u + 1013904223u;
    return (int32_t)((g_rng >> 8) % (uint32_t)n);
}

#define N_MIXED 10

/* Runs the requests through an engine on m; false on an API failure. */
static bool run_engine(di_model *m, eu_req *reqs, int n) {
    const di_engine_params ep = eu_small_params();
    return eu_run_fresh(m, &ep, reqs, n);
}

/* Greedy requests, or with `sampled` most at temperature 0.5-1.4 (seeded) and one with top_p
 * (whose steps bring their rows to the host sampler). */
static void sampled_mixed_requests(const di_model_info *info, int32_t (*prompts)[96], eu_req *reqs,
                                   eu_result *res, bool sampled) {
    g_rng = 4321;
    for (int i = 0; i < N_MIXED; i++) {
        int64_t np = 1 + rnd(i % 3 == 0 ? 90 : 20);
        for (int64_t k = 0; k < np; k++)
            prompts[i][k] = 2 + rnd((int32_t)info->vocab_size - 2);
        di_sampling_params sp = di_sampling_default_params();
        sp.temperature = sampled && i % 4 != 0 ? 0.5f + 0.1f * (float)i : 0.0f;
        /* filters too (the device's filtered draw): top_p, top_k, both, min_p */
        sp.top_p = sampled && (i == 5 || i == 9) ? 0.9f : sampled && i == 7 ? 0.7f : 1.0f;
        sp.top_k = sampled && (i == 6 || i == 9) ? 20 : 0;
        sp.min_p = sampled && i == 7 ? 0.05f : 0.0f;
        sp.seed = 100 + i;
        sp.max_tokens = 2 + rnd(14);
        sp.ignore_eos = true;
        reqs[i] = (eu_req){.prompt = prompts[i],
                           .n_prompt = np,
                           .sp = sp,
                           .arrive = i < 3 ? 0 : rnd(8),
                           .abort_at = -1,
                           .res = &res[i]};
    }
}

static void mixed_requests(const di_model_info *info, int32_t (*prompts)[96], eu_req *reqs,
                           eu_result *res) {
    sampled_mixed_requests(info, prompts, reqs, res, false);
}

/* Requests a (results ra) and b (rb) gave the same full-length tokens, request by request;
 * returns how many, each difference a failed check saying `what`. */
static int same_tokens(const char *name, const eu_req *a, const eu_result *ra, const eu_result *rb,
                       const char *what) {
    int same = 0;
    for (int i = 0; i < N_MIXED; i++) {
        bool eq = ra[i].n == a[i].sp.max_tokens && ra[i].n == rb[i].n &&
                  memcmp(ra[i].tokens, rb[i].tokens, (size_t)ra[i].n * sizeof(int32_t)) == 0;
        CHECK_MSG(eq, "%s req %d: %s", name, i, what);
        same += eq;
    }
    return same;
}

static void engine_matches_cpu(const char *name) {
    di_model *mg = load_on(name, "cuda"), *mc = load_on(name, "cpu");
    CHECK(mg && mc);
    if (mg && mc) {
        di_model_info info;
        di_model_get_info(mc, &info);
        static int32_t prompts[N_MIXED][96];
        static eu_req rg[N_MIXED], rc[N_MIXED];
        static eu_result resg[N_MIXED], resc[N_MIXED];
        /* eu_run appends to the results: start each checkpoint from empty ones. */
        memset(resg, 0, sizeof resg);
        memset(resc, 0, sizeof resc);
        mixed_requests(&info, prompts, rg, resg);
        mixed_requests(&info, prompts, rc, resc);
        CHECK(run_engine(mg, rg, N_MIXED));
        CHECK(run_engine(mc, rc, N_MIXED));
        const int same =
            same_tokens(name, rg, resg, resc, "CUDA engine tokens differ from the CPU engine's");
        printf("  engine %-16s %d/%d requests give the CPU engine's greedy tokens\n", name, same,
               N_MIXED);
    }
    di_model_free(mg);
    di_model_free(mc);
}

TEST(engine_cuda_matches_cpu) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t i = 0; i < DI_ARRAY_LEN(g_engine_cases); i++)
        engine_matches_cpu(g_engine_cases[i]);
}

/* Sampled requests through the CUDA engine with the draw on the device (the default:
 * sample_rows) and without (DI_CUDA_SAMPLE=0: rows downloaded to the host sampler): the same
 * logits on the same device, so the same tokens, bitwise. */
static void engine_device_sampling(const char *name) {
    di_model *mg = load_on(name, "cuda");
    CHECK(mg);
    if (!mg) return;
    di_model_info info;
    di_model_get_info(mg, &info);
    static int32_t prompts[N_MIXED][96];
    static eu_req rd[N_MIXED], rh[N_MIXED];
    static eu_result resd[N_MIXED], resh[N_MIXED];
    memset(resd, 0, sizeof resd);
    memset(resh, 0, sizeof resh);
    sampled_mixed_requests(&info, prompts, rd, resd, true);
    sampled_mixed_requests(&info, prompts, rh, resh, true);
    const int64_t launches = di_backend_cuda_sample_launches();
    CHECK(run_engine(mg, rd, N_MIXED));
    CHECK_MSG(di_backend_cuda_sample_launches() > launches, "%s: no draw ran on the device", name);
    const int64_t after = di_backend_cuda_sample_launches();
    setenv("DI_CUDA_SAMPLE", "0", 1); /* read when the engine makes its backend */
    CHECK(run_engine(mg, rh, N_MIXED));
    unsetenv("DI_CUDA_SAMPLE");
    CHECK_MSG(di_backend_cuda_sample_launches() == after, "%s: DI_CUDA_SAMPLE=0 drew on the device",
              name);
    const int same = same_tokens(name, rd, resd, resh,
                                 "tokens drawn on the device differ from the host sampler's");
    printf("  engine %-16s %d/%d sampled requests: device draw == host sampler\n", name, same,
           N_MIXED);
    di_model_free(mg);
}

TEST(engine_cuda_device_sampling) {
    if (!g_have_gpu) SKIP("no CUDA device");
    engine_device_sampling("v3_fp8");
}

/* Did a and b sample the same n tokens with the same logprobs and top logprobs, bitwise? */
static bool same_samples(const eu_result *a, const eu_result *b, int64_t n) {
    const size_t k = (size_t)n;
    return a->n == n && b->n == n && memcmp(a->tokens, b->tokens, k * sizeof a->tokens[0]) == 0 &&
           memcmp(a->lp, b->lp, k * sizeof a->lp[0]) == 0 &&
           memcmp(a->top_lp, b->top_lp, k * sizeof a->top_lp[0]) == 0 &&
           memcmp(a->top_ids, b->top_ids, k * sizeof a->top_ids[0]) == 0;
}

static void engine_batch_invariance(const char *name) {
    di_model *m = load_on(name, "cuda");
    CHECK(m != NULL);
    if (!m) return;
    di_model_info info;
    di_model_get_info(m, &info);
    static int32_t prompts[N_MIXED + 1][96];
    static eu_req reqs[N_MIXED + 1];
    static eu_result res[N_MIXED + 1], alone;
    memset(res, 0, sizeof res); /* eu_run appends: start each checkpoint from empty */
    memset(&alone, 0, sizeof alone);
    mixed_requests(&info, prompts, reqs, res);
    /* The target: 30 prompt tokens, 20 generated with logprobs, arriving at step 2. */
    for (int k = 0; k < 30; k++)
        prompts[N_MIXED][k] = 3 + (k * 7919) % ((int32_t)info.vocab_size - 3);
    di_sampling_params sp = di_sampling_default_params();
    sp.temperature = 0.0f;
    sp.max_tokens = 20;
    sp.ignore_eos = true;
    sp.logprobs = 5;
    eu_req target = {.prompt = prompts[N_MIXED],
                     .n_prompt = 30,
                     .sp = sp,
                     .arrive = 0,
                     .abort_at = -1,
                     .res = &alone};
    CHECK(run_engine(m, &target, 1));
    reqs[N_MIXED] = target;
    reqs[N_MIXED].arrive = 2;
    reqs[N_MIXED].res = &res[N_MIXED];
    CHECK(run_engine(m, reqs, N_MIXED + 1));
    const eu_result *b = &res[N_MIXED];
    const bool same = same_samples(&alone, b, 20);
    CHECK_MSG(same, "%s: the request's tokens / logprobs differ alone and inside a batch of %d",
              name, N_MIXED + 1);
    printf("  batch invariance on cuda %-16s %s\n", name, same ? "bitwise" : "DIFFER");
    di_model_free(m);
}

TEST(engine_cuda_batch_invariance) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t i = 0; i < DI_ARRAY_LEN(g_engine_cases); i++)
        engine_batch_invariance(g_engine_cases[i]);
}

/* The same requests with the prompts prefilled a few tokens per step (chunks of at most 64
 * rows) and all in one step (V2/V3: one chunk of 900 rows, where the host's chunks stop at
 * 256: a chunk reads every weight once, so a device takes larger ones; V4: chunks of 256): the
 * same tokens and logprobs, bitwise (batch-invariant mode). */
static void engine_chunk_invariance(const char *name) {
    di_model *m = load_on(name, "cuda");
    CHECK(m != NULL);
    if (!m) return;
    di_model_info info;
    di_model_get_info(m, &info);
    static int32_t prompts[N_MIXED][96];
    static eu_req small[N_MIXED], whole[N_MIXED];
    static eu_result rs[N_MIXED], rw[N_MIXED];
    memset(rs, 0, sizeof rs);
    memset(rw, 0, sizeof rw);
    mixed_requests(&info, prompts, small, rs);
    mixed_requests(&info, prompts, whole, rw);
    int64_t n_prompt = 0;
    for (int i = 0; i < N_MIXED; i++) { /* 90-token prompts: 900 rows in all */
        for (int k = (int)small[i].n_prompt; k < 90; k++)
            prompts[i][k] = 2 + rnd((int32_t)info.vocab_size - 2);
        small[i].n_prompt = whole[i].n_prompt = 90;
        small[i].arrive = whole[i].arrive = 0;
        small[i].sp.logprobs = whole[i].sp.logprobs = 5;
        n_prompt += small[i].n_prompt;
    }
    di_engine_params ps = eu_small_params(), pw = eu_small_params();
    ps.max_running = pw.max_running = N_MIXED;
    pw.max_batch_tokens = pw.max_prefill_tokens = 2048;
    CHECK(eu_run_fresh(m, &ps, small, N_MIXED));
    CHECK(eu_run_fresh(m, &pw, whole, N_MIXED));
    int same = 0;
    for (int i = 0; i < N_MIXED; i++) {
        const bool eq = same_samples(&rs[i], &rw[i], small[i].sp.max_tokens);
        CHECK_MSG(eq,
                  "%s req %d: tokens / logprobs differ between 24 prompt rows per step and "
                  "%lld in one step",
                  name, i, (long long)n_prompt);
        same += eq;
    }
    printf("  chunk invariance on cuda %-16s %d/%d requests bitwise (%lld prompt rows in one "
           "step)\n",
           name, same, N_MIXED, (long long)n_prompt);
    di_model_free(m);
}

TEST(engine_cuda_chunk_invariance) {
    if (!g_have_gpu) SKIP("no CUDA device");
    for (size_t i = 0; i < DI_ARRAY_LEN(g_engine_cases); i++)
        engine_chunk_invariance(g_engine_cases[i]);
}

/* The same requests through the plain loop and the overlap loop, which on CUDA is the device
 * loop (engine.c: decode steps enqueued behind the running one, their ids read on the device):
 * the same tokens, bitwise. Two passes: greedy requests, then seeded temperature draws on the
 * device with one top_p request (whose steps bring their rows to the host sampler and are not
 * deferred) and three requests that end on a stop token -- their third token in a first plain
 * run -- so that they finish while the next step is already queued. V4's runner defers
 * nothing, so its device loop runs every step at once. */
static void engine_overlap(const char *name, bool defers) {
    di_model *m = load_on(name, "cuda");
    CHECK(m != NULL);
    if (!m) return;
    di_model_info info;
    di_model_get_info(m, &info);
    static int32_t prompts[N_MIXED][96], stops[N_MIXED];
    static eu_req rp[N_MIXED], ro[N_MIXED];
    static eu_result resp[N_MIXED], reso[N_MIXED];
    const di_engine_params pp = eu_small_params();
    di_engine_params po = eu_small_params();
    po.overlap = true;
    int64_t deferred = 0;
    int same = 0, stopped = 0;
    for (int pass = 0; pass < 2; pass++) {
        memset(resp, 0, sizeof resp);
        sampled_mixed_requests(&info, prompts, rp, resp, pass == 1);
        if (pass == 1) { /* the stop tokens, from a plain run without them */
            CHECK(eu_run_fresh(m, &pp, rp, N_MIXED));
            for (int i = 1; i < N_MIXED; i += 3) {
                if (resp[i].n < 4) continue;
                stops[i] = resp[i].tokens[2];
                rp[i].sp.stop_token_ids = &stops[i];
                rp[i].sp.n_stop_token_ids = 1;
            }
            memset(resp, 0, sizeof resp);
        }
        memset(reso, 0, sizeof reso);
        for (int i = 0; i < N_MIXED; i++)
            ro[i] = rp[i], ro[i].res = &reso[i], rp[i].res = &resp[i];
        CHECK(eu_run_fresh(m, &pp, rp, N_MIXED));
        const int64_t fences = di_backend_cuda_fences();
        CHECK(eu_run_fresh(m, &po, ro, N_MIXED));
        deferred += di_backend_cuda_fences() - fences;
        for (int i = 0; i < N_MIXED; i++) {
            const bool eq =
                resp[i].n == reso[i].n && resp[i].n > 0 &&
                memcmp(resp[i].tokens, reso[i].tokens, (size_t)resp[i].n * sizeof(int32_t)) == 0;
            CHECK_MSG(eq, "%s pass %d req %d: the overlap loop's tokens differ", name, pass, i);
            same += eq;
            stopped += pass == 1 && resp[i].n < rp[i].sp.max_tokens;
        }
    }
    CHECK_MSG(defers ? deferred > 0 : deferred == 0, "%s: the device loop deferred %lld steps",
              name, (long long)deferred);
    CHECK_MSG(stopped > 0, "%s: no request ended on its stop token", name);
    printf("  overlap on cuda %-16s %d/%d requests bitwise (%d ended on a stop token), %lld "
           "steps deferred\n",
           name, same, 2 * N_MIXED, stopped, (long long)deferred);
    di_model_free(m);
}

TEST(engine_cuda_overlap) {
    if (!g_have_gpu) SKIP("no CUDA device");
    engine_overlap("v3_fp8", true);
    engine_overlap("v4_mix_yarn", false);
}

/* ---- device errors (run everywhere) -------------------------------------------------------- */

TEST(device_errors) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/v2_lite", DATA_DIR);
    di_model_params mp = di_model_default_params();
    di_model *m = NULL;
    mp.device = "tpu";
    CHECK(di_model_load(dir, &mp, &m) == DI_ERR_INVALID_ARG);
    CHECK(strstr(di_last_error(), "tpu") != NULL);
    mp.device = "cuda:x";
    CHECK(di_model_load(dir, &mp, &m) == DI_ERR_INVALID_ARG);
    mp.device = "cuda";
    di_status st = di_model_load(dir, &mp, &m);
    if (!g_have_gpu) {
        CHECK(st == DI_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(di_last_error(), "no CUDA device") != NULL, "%s", di_last_error());
    } else {
        CHECK(st == DI_OK);
    }
    di_model_free(m);
}

int main(void) {
    di_backend be;
    g_have_gpu = di_backend_cuda_init(&be, 0, 16) == DI_OK;
    if (g_have_gpu)
        di_backend_free(&be);
    else
        printf("skip: %s\n", di_last_error());
    RUN(device_errors);
    RUN(goldens_cuda);
    RUN(engine_cuda_matches_cpu);
    RUN(engine_cuda_batch_invariance);
    RUN(engine_cuda_chunk_invariance);
    RUN(engine_cuda_device_sampling);
    RUN(engine_cuda_overlap);
    return test_summary();
}
