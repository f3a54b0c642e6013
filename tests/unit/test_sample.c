/*
 * test_sample.c -- the sampling module (src/sample): Philox known answers, parameter
 * validation, each logits processor on hand-made rows, greedy and its equivalents, masked
 * and malformed rows, raw logprobs, the exponential's accuracy, and bit-identical results at
 * every SIMD level. The distributions and the draws are tested in test_sample_dist.c.
 */
#include "core/core.h"
#include "sample/philox.h"
#include "sample/sample_full_row.h"
#include "sample/sample_mass.h"
#include "sample/sample_vec.h"
#include "sample/sampler.h"
#include "test.h"

#include <float.h>

#define MAX_VOCAB 8192

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd01(void) { /* test-only xorshift, independent of the code under test */
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

static void *scratch_for(int64_t vocab) {
    static unsigned char *buf;
    static size_t cap;
    size_t need = di_sampler_scratch_size(vocab);
    if (need > cap) {
        free(buf);
        buf = malloc(need);
        cap = need;
    }
    return buf;
}

static di_sample_input input(const float *logits, int64_t vocab) {
    di_sample_input in = {0};
    in.logits = logits;
    in.vocab = vocab;
    in.eos_token_id = -1;
    in.seed = 1234;
    return in;
}

static int32_t sample(const di_sampling_params *p, di_sample_input in, int64_t position) {
    di_sample_result r;
    in.position = position;
    di_status st = di_sampler_sample(p, &in, scratch_for(in.vocab), &r);
    return st == DI_OK ? r.token : -2;
}

static void random_row(float *x, int64_t n, double scale) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((rnd01() * 2.0 - 1.0) * scale);
}

/* ---------------------------------------------------------------------------------------- */
/* Philox                                                                                     */
/* ---------------------------------------------------------------------------------------- */

/* Random123's known-answer vectors for Philox4x32-10, checked against a Python transcription
 * of the algorithm before being written here. */
TEST(philox_known_answers) {
    static const uint32_t v[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        di_philox4x32_10(v[t], v[t] + 4, out);
        for (int i = 0; i < 4; i++)
            CHECK_EQ_INT(out[i], v[t][6 + i]);
    }
}

/* The keying: seed 42 -> key (42, 0); position 7, sample 1, lane 0 -> counter (7, 0, 1, 0),
 * whose block (Python) is 4c78c45f 5281c34e ...; the double takes 27 + 26 bits of it. */
TEST(philox_uniform_keying) {
    double want =
        (double)(((uint64_t)(0x4c78c45fu >> 5) << 26) | (0x5281c34eu >> 6)) / 9007199254740992.0;
    CHECK(di_philox_uniform(42, 1, 7, 0) == want);
    CHECK(di_philox_uniform(42, 1, 7, 0) != di_philox_uniform(42, 1, 8, 0));
    CHECK(di_philox_uniform(42, 1, 7, 0) != di_philox_uniform(42, 0, 7, 0));
    CHECK(di_philox_uniform(42, 1, 7, 0) != di_philox_uniform(43, 1, 7, 0));
    CHECK(di_philox_uniform(42, 1, 7, 0) != di_philox_uniform(42, 1, 7, 1));
    double sum = 0.0;
    int in_range = 1;
    for (int64_t i = 0; i < 100000; i++) {
        double u = di_philox_uniform(-7, 0, i, 0);
        in_range &= u >= 0.0 && u < 1.0;
        sum += u;
    }
    CHECK(in_range);
    CHECK_NEAR(sum / 100000, 0.5, 0.005); /* sd of the mean is 0.0009 */
}

/* ---------------------------------------------------------------------------------------- */
/* Parameters                                                                                 */
/* ---------------------------------------------------------------------------------------- */

TEST(params_defaults) {
    di_sampling_params p = di_sampling_default_params();
    CHECK(p.temperature == 1.0f && p.top_p == 1.0f && p.min_p == 0.0f);
    CHECK_EQ_INT(p.top_k, -1);
    CHECK(p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f);
    CHECK(p.frequency_penalty == 0.0f && !p.ignore_eos);
    CHECK_EQ_INT(p.max_tokens, 16);
    CHECK_EQ_INT(p.min_tokens, 0);
    CHECK_EQ_INT(p.n, 1);
    CHECK_EQ_INT(p.logprobs, -1);
    CHECK_EQ_INT(p.prompt_logprobs, -1);
    CHECK_EQ_INT(p.seed, -1);
    char err[128] = "x";
    CHECK_EQ_INT(di_sampling_params_validate(&p, err, sizeof err), DI_OK);
    CHECK(err[0] == '\0');
    p.top_k = 0; /* off, as in vLLM */
    CHECK_EQ_INT(di_sampling_params_validate(&p, NULL, 0), DI_OK);
}

static void expect_invalid(const di_sampling_params *p, const char *needle, int line) {
    char err[160];
    di_status st = di_sampling_params_validate(p, err, sizeof err);
    if (st != DI_ERR_INVALID_ARG || !strstr(err, needle) || !strstr(di_last_error(), needle)) {
        printf("  line %d: expected an error naming \"%s\", got %d \"%s\"\n", line, needle, (int)st,
               err);
        test_cur_failed = 1;
    }
}

#define EXPECT_INVALID(field, value, needle)                                                       \
    do {                                                                                           \
        di_sampling_params p_ = di_sampling_default_params();                                      \
        p_.field = value;                                                                          \
        expect_invalid(&p_, needle, __LINE__);                                                     \
    } while (0)

TEST(params_validate_messages) {
    EXPECT_INVALID(temperature, -0.5f, "temperature must be finite and >= 0, got -0.5");
    EXPECT_INVALID(temperature, NAN, "temperature");
    EXPECT_INVALID(top_p, 0.0f, "top_p must be in (0, 1], got 0");
    EXPECT_INVALID(top_p, 1.5f, "top_p must be in (0, 1], got 1.5");
    EXPECT_INVALID(top_k, -2, "top_k must be -1 (off), 0 (off) or >= 1, got -2");
    EXPECT_INVALID(min_p, 1.25f, "min_p must be in [0, 1], got 1.25");
    EXPECT_INVALID(min_p, -0.1f, "min_p");
    EXPECT_INVALID(repetition_penalty, 0.0f, "repetition_penalty must be finite and > 0");
    EXPECT_INVALID(presence_penalty, 3.0f, "presence_penalty must be in [-2, 2]");
    EXPECT_INVALID(frequency_penalty, -2.5f, "frequency_penalty must be in [-2, 2]");
    EXPECT_INVALID(n, 0, "n must be >= 1, got 0");
    EXPECT_INVALID(logprobs, 21, "logprobs must be -1 (none) or in [0, 20], got 21");
    EXPECT_INVALID(prompt_logprobs, -3, "prompt_logprobs");
    EXPECT_INVALID(max_tokens, 0, "max_tokens must be >= 1, got 0");
    EXPECT_INVALID(min_tokens, 17, "min_tokens (17) must be <= max_tokens (16)");
    EXPECT_INVALID(seed, -2, "seed must be -1 (none) or >= 0");
    EXPECT_INVALID(n_logit_bias, 2, "logit_bias: 2 entries but no array");
    di_logit_bias bad[2] = {{3, 1.0f}, {-1, 2.0f}};
    di_sampling_params p = di_sampling_default_params();
    p.logit_bias = bad;
    p.n_logit_bias = 2;
    expect_invalid(&p, "logit_bias[1]: token id -1 is negative", __LINE__);
    const char *stops[2] = {"\n\n", ""};
    p = di_sampling_default_params();
    p.stop = stops;
    p.n_stop = 2;
    expect_invalid(&p, "stop[1] is empty", __LINE__);
    int32_t stop_ids[1] = {-4};
    p = di_sampling_default_params();
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    expect_invalid(&p, "stop_token_ids[0]: token id -4 is negative", __LINE__);
}

/* ---------------------------------------------------------------------------------------- */
/* Logits processors                                                                          */
/* ---------------------------------------------------------------------------------------- */

TEST(process_logit_bias) {
    const float logits[4] = {1.0f, 2.0f, -1.0f, 0.5f};
    di_logit_bias bias[2] = {{0, 2.5f}, {2, -100.0f}};
    di_sampling_params p = di_sampling_default_params();
    p.logit_bias = bias;
    p.n_logit_bias = 2;
    di_sample_input in = input(logits, 4);
    float row[4];
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[0] == 3.5f && row[1] == 2.0f && row[2] == -101.0f && row[3] == 0.5f);
    p.temperature = 0.0f; /* the bias moves the argmax from 1 to 0 */
    CHECK_EQ_INT(sample(&p, in, 0), 0);
}

/* EOS and stop ids are -inf until min_tokens outputs exist; ignore_eos spares EOS (vLLM
 * masks only the stop ids then). */
TEST(process_min_tokens) {
    const float logits[5] = {0.1f, 5.0f, 0.2f, 4.0f, 0.3f};
    int32_t stop_ids[1] = {3};
    di_sampling_params p = di_sampling_default_params();
    p.min_tokens = 2;
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    di_token_counts h = {0};
    di_sample_input in = input(logits, 5);
    in.eos_token_id = 1;
    in.history = &h;
    float row[5];
    h.n_output = 1;
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[1] == -INFINITY && row[3] == -INFINITY && row[0] == 0.1f && row[4] == 0.3f);
    p.ignore_eos = true;
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[1] == 5.0f && row[3] == -INFINITY);
    p.ignore_eos = false;
    h.n_output = 2; /* reached: nothing masked */
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[1] == 5.0f && row[3] == 4.0f);
    in.history = NULL; /* no history = nothing generated yet */
    p.temperature = 0.0f;
    CHECK_EQ_INT(sample(&p, in, 0), 4);
}

/* Repetition divides positive and multiplies negative logits of every seen token (prompt and
 * output); frequency and presence subtract on output tokens only. */
TEST(process_penalties) {
    const float logits[5] = {4.0f, -2.0f, 3.0f, 1.0f, 6.0f};
    const int32_t ids[3] = {0, 1, 2};
    const int32_t out_count[3] = {0, 3, 1}; /* token 0 is in the prompt only */
    di_token_counts h = {ids, out_count, 3, 4};
    di_sampling_params p = di_sampling_default_params();
    p.repetition_penalty = 2.0f;
    di_sample_input in = input(logits, 5);
    in.history = &h;
    float row[5];
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[0] == 2.0f && row[1] == -4.0f && row[2] == 1.5f && row[3] == 1.0f);
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[0] == 4.0f);                 /* prompt only: untouched */
    CHECK(row[1] == -2.0f - 1.5f - 0.25f); /* 3 x 0.5 + 0.25 */
    CHECK(row[2] == 3.0f - 0.5f - 0.25f);
    CHECK(row[4] == 6.0f);
    p.presence_penalty = -1.0f; /* negative penalties reward */
    p.frequency_penalty = 0.0f;
    CHECK_EQ_INT(di_sampler_process(&p, &in, row), DI_OK);
    CHECK(row[2] == 4.0f);
}

TEST(process_checks_ids) {
    const float logits[3] = {0, 0, 0};
    di_logit_bias bias[1] = {{3, 1.0f}};
    di_sampling_params p = di_sampling_default_params();
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    di_sample_input in = input(logits, 3);
    di_sample_result r;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_ERR_RANGE);
    CHECK(strstr(di_last_error(), "logit_bias[0] = token 3 is outside the vocabulary"));
    CHECK_EQ_INT(r.token, -1);
}

/* ---------------------------------------------------------------------------------------- */
/* Greedy and its equivalents                                                                 */
/* ---------------------------------------------------------------------------------------- */

TEST(greedy_ties_lowest_id) {
    const float logits[6] = {-1.0f, 3.0f, 2.0f, 3.0f, -INFINITY, 3.0f};
    di_sampling_params p = di_sampling_default_params();
    p.temperature = 0.0f;
    for (int64_t pos = 0; pos < 10; pos++)
        CHECK_EQ_INT(sample(&p, input(logits, 6), pos), 1);
    p.temperature = 0.5e-5f; /* below vLLM's epsilon: still greedy */
    CHECK_EQ_INT(sample(&p, input(logits, 6), 3), 1);
}

/* Greedy follows penalties (vLLM applies them before the argmax). */
TEST(greedy_uses_processed_row) {
    const float logits[3] = {2.0f, 1.9f, 0.0f};
    const int32_t ids[1] = {0};
    const int32_t cnt[1] = {1};
    di_token_counts h = {ids, cnt, 1, 1};
    di_sampling_params p = di_sampling_default_params();
    p.temperature = 0.0f;
    p.presence_penalty = 0.5f;
    di_sample_input in = input(logits, 3);
    in.history = &h;
    CHECK_EQ_INT(sample(&p, in, 0), 1);
}

/* Plain greedy -- di_sampler_device_draw at a greedy temperature: true exactly when the token
 * is the raw row's first argmax (a device may then compute it), false whenever a processor,
 * logprobs or the temperature could change it or an id check would fail. */
static bool greedy_plain(const di_sampling_params *p, const di_sample_input *in) {
    return p->temperature < DI_SAMPLING_GREEDY_EPS && di_sampler_device_draw(p, in);
}

TEST(greedy_plain) {
    static float x[MAX_VOCAB];
    const int32_t ids[2] = {0, 5}, cnt[2] = {0, 1}, bad_stop[1] = {3000}, stop[1] = {7};
    di_token_counts h = {ids, cnt, 2, 1};
    di_logit_bias bias[1] = {{5, 1.0f}};
    di_sampling_params g = di_sampling_default_params();
    g.temperature = 0.0f;
    di_sample_input in = input(x, 3000);
    in.history = &h;
    for (int rep = 0; rep < 20; rep++) { /* plain: the sampler's token is the first argmax */
        random_row(x, 3000, 4.0);
        if (rep % 4 == 0) x[11] = x[2000] = 9.0f;
        CHECK(greedy_plain(&g, &in));
        int32_t first = 0;
        for (int32_t i = 1; i < 3000; i++)
            first = x[i] > x[first] ? i : first;
        CHECK_EQ_INT(sample(&g, in, rep), first);
    }
    di_sampling_params p = g;
    p.stop_token_ids = stop, p.n_stop_token_ids = 1; /* valid stop ids: still plain */
    CHECK(greedy_plain(&p, &in));
    p.stop_token_ids = bad_stop; /* the sampler would fail: not plain */
    CHECK(!greedy_plain(&p, &in));
    p = g, p.temperature = 0.7f;
    CHECK(!greedy_plain(&p, &in));
    p = g, p.logprobs = 0;
    CHECK(!greedy_plain(&p, &in));
    p = g, p.logit_bias = bias, p.n_logit_bias = 1;
    CHECK(!greedy_plain(&p, &in));
    p = g, p.presence_penalty = 0.5f;
    CHECK(!greedy_plain(&p, &in));
    p = g, p.min_tokens = 2; /* one output so far: EOS and stops still banned */
    CHECK(!greedy_plain(&p, &in));
    p.min_tokens = 1; /* reached */
    CHECK(greedy_plain(&p, &in));
}

/* di_sampler_device_draw: greedy, or any draw (temperature, top_k, top_p, min_p) with no
 * processor and no logprobs, over at most DI_SAMPLE_DEVICE_MAX_VOCAB ids. */
TEST(device_draw) {
    static float x[3000];
    const int32_t ids[2] = {0, 5}, cnt[2] = {0, 1};
    di_token_counts h = {ids, cnt, 2, 1};
    di_sample_input in = input(x, 3000);
    in.history = &h;
    di_sampling_params t = di_sampling_default_params();
    t.temperature = 0.7f;
    struct {
        di_sampling_params p;
        bool want;
    } cases[9];
    for (int i = 0; i < 9; i++)
        cases[i].p = t, cases[i].want = true;
    cases[1].p.temperature = 0.0f;
    cases[2].p.top_k = 3000;
    cases[3].p.top_k = 50;
    cases[4].p.top_p = 0.9f;
    cases[5].p.min_p = 0.05f;
    cases[6].p.logprobs = 2, cases[6].want = false;
    cases[7].p.frequency_penalty = 0.3f, cases[7].want = false;
    cases[8].p.temperature = 0.0f, cases[8].p.top_p = 0.5f; /* greedy ignores the filters */
    for (int i = 0; i < 9; i++) {
        const bool u = di_sampler_device_draw(&cases[i].p, &in);
        CHECK_MSG(u == cases[i].want, "case %d", i);
    }
    /* a vocabulary past what a device draws: every row is the host's */
    in.vocab = (int64_t)DI_SAMPLE_DEVICE_MAX_VOCAB + 1;
    CHECK(!di_sampler_device_draw(&t, &in) && !di_sampler_device_draw(&cases[1].p, &in));
}

/* sample_full_row.h (the draw a GPU runs without the row leaving it) against the sampler:
 * the same token for temperature-only sampling over rows of every tail shape (ids past the
 * last full block, blocks of -inf), temperatures, seeds and positions; its exponential and
 * Philox equal the host's bit for bit. */
TEST(full_row_draw_matches) {
    static float x[MAX_VOCAB];
    static double bsum[MAX_VOCAB / DI_SAMPLE_BLOCK + 1];
    const int64_t vocabs[] = {1, 7, 255, 256, 257, 1000, 4099};
    const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
    for (int k = 0; k < 2000; k++) {
        const float y = -90.0f * (float)rnd01();
        const float want = di_sample_exp(y), got = y >= DI_SAMPLE_EXP_MIN ? ds_exp_core(y) : 0.0f;
        CHECK(memcmp(&want, &got, sizeof got) == 0);
        const int64_t seed = (int64_t)(rnd01() * 1e12) - 5, pos = (int64_t)(rnd01() * 1e6);
        const double a = di_philox_uniform(seed, k % 3, pos, 0),
                     b = ds_philox_uniform(seed, k % 3, pos, 0);
        CHECK(a == b);
    }
    for (size_t vi = 0; vi < DI_ARRAY_LEN(vocabs); vi++) {
        const int64_t n = vocabs[vi];
        for (int rep = 0; rep < 6; rep++) {
            random_row(x, n, rep < 3 ? 3.0 : 12.0);
            if (rep == 2)
                for (int64_t i = 0; i < n; i += 2)
                    x[i] = -INFINITY;
            if (rep == 4 && n > 300)
                for (int64_t i = 0; i < 256; i++)
                    x[i] = -INFINITY; /* a whole block out */
            float max = -INFINITY;
            for (int64_t i = 0; i < n; i++)
                max = x[i] > max ? x[i] : max;
            if (max == -INFINITY) { /* every token banned: an error, which a device leaves */
                di_sampling_params p = di_sampling_default_params();
                CHECK(sample(&p, input(x, n), 0) == -2); /* to the host sampler to report */
                continue;
            }
            for (size_t ti = 0; ti < DI_ARRAY_LEN(temps); ti++) {
                di_sampling_params p = di_sampling_default_params();
                p.temperature = temps[ti];
                const float inv_t = 1.0f / p.temperature;
                double total = 0.0;
                const int64_t nb = (n + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK;
                for (int64_t b = 0; b < nb; b++) {
                    const int64_t b0 = b * DI_SAMPLE_BLOCK;
                    bsum[b] =
                        ds_block_sum(x, b0, DI_MIN(b0 + DI_SAMPLE_BLOCK, n), max, inv_t, -FLT_MAX);
                    total += bsum[b];
                }
                for (int64_t pos = 0; pos < 12; pos++) {
                    di_sample_input in = input(x, n);
                    in.seed = 77 + rep;
                    in.sample_index = (int32_t)(pos % 2);
                    const double u = ds_philox_uniform(in.seed, in.sample_index, pos, 0);
                    const int32_t got =
                        ds_draw_full_row(x, n, max, inv_t, -FLT_MAX, bsum, u * total);
                    CHECK_MSG(got == sample(&p, in, pos),
                              "vocab %lld rep %d T %g pos %lld: %d vs the sampler's %d",
                              (long long)n, rep, (double)p.temperature, (long long)pos, got,
                              sample(&p, in, pos));
                }
            }
        }
    }
}

TEST(top_k_one_is_greedy) {
    static float x[MAX_VOCAB];
    di_sampling_params g = di_sampling_default_params(), k1 = g;
    g.temperature = 0.0f;
    k1.top_k = 1;
    k1.temperature = 1.7f;
    for (int rep = 0; rep < 50; rep++) {
        random_row(x, 3000, 4.0);
        if (rep % 5 == 0) x[17] = x[2999] = 9.0f; /* a tie at the top */
        int32_t want = sample(&g, input(x, 3000), rep);
        CHECK_EQ_INT(sample(&k1, input(x, 3000), rep), want);
        if (rep % 5 == 0) CHECK_EQ_INT(want, 17);
    }
}

/* At T = 1e-3 a gap of 0.05 in logits is a factor e^-50: the draw is the argmax. */
TEST(very_low_temperature_is_greedy) {
    const float logits[4] = {1.0f, 1.05f, 0.9f, -3.0f};
    di_sampling_params p = di_sampling_default_params();
    p.temperature = 1e-3f;
    for (int64_t pos = 0; pos < 2000; pos++)
        CHECK_EQ_INT(sample(&p, input(logits, 4), pos), 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Masked and malformed rows                                                                  */
/* ---------------------------------------------------------------------------------------- */

TEST(all_masked_is_an_error) {
    const float masked[3] = {-INFINITY, -INFINITY, -INFINITY};
    di_sampling_params p = di_sampling_default_params();
    di_sample_result r;
    for (int greedy = 0; greedy < 2; greedy++) {
        p.temperature = greedy ? 0.0f : 1.0f;
        di_sample_input in = input(masked, 3);
        CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_ERR_RANGE);
        CHECK_EQ_INT(r.token, -1);
        CHECK(strstr(di_last_error(), "every token is masked"));
    }
    /* Masked by processing: vocab {0: EOS, 1: stop id} before min_tokens. */
    const float two[2] = {1.0f, 2.0f};
    int32_t stop_ids[1] = {1};
    p.min_tokens = 1;
    p.stop_token_ids = stop_ids;
    p.n_stop_token_ids = 1;
    di_sample_input in = input(two, 2);
    in.eos_token_id = 0;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(2), &r), DI_ERR_RANGE);
    /* min_p = 1 keeps only the maximum (and its ties): never empty. */
    const float row[4] = {0.5f, 2.0f, 2.0f, -INFINITY};
    p = di_sampling_default_params();
    p.min_p = 1.0f;
    p.top_p = 0.3f;
    for (int64_t pos = 0; pos < 200; pos++) {
        int32_t t = sample(&p, input(row, 4), pos);
        CHECK(t == 1 || t == 2);
    }
}

TEST(bad_rows_are_errors) {
    float row[3] = {0.0f, NAN, 1.0f};
    di_sampling_params p = di_sampling_default_params();
    di_sample_result r;
    di_sample_input in = input(row, 3);
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_ERR_RANGE);
    CHECK(strstr(di_last_error(), "logit of token 1 is NaN"));
    row[1] = INFINITY;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_ERR_RANGE);
    CHECK(strstr(di_last_error(), "+inf"));
    in.vocab = 0;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_ERR_INVALID_ARG);
    /* A huge bias on a huge logit saturates instead of overflowing to +inf. */
    row[1] = 3e38f;
    in.vocab = 3;
    di_logit_bias b[1] = {{1, 3e38f}};
    p.logit_bias = b;
    p.n_logit_bias = 1;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(3), &r), DI_OK);
    CHECK_EQ_INT(r.token, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Logprobs                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* Logprobs come from the raw row, whatever the processing: log_softmax([ln 1, ln 2, ln 4,
 * ln 1]) = ln([1, 2, 4, 1] / 8). */
TEST(raw_logprobs) {
    const float logits[4] = {0.0f, (float)log(2.0), (float)log(4.0), 0.0f};
    di_logit_bias bias[1] = {{3, 50.0f}};
    di_sampling_params p = di_sampling_default_params();
    p.temperature = 0.0f;
    p.logit_bias = bias;
    p.n_logit_bias = 1;
    p.logprobs = 3;
    di_sample_input in = input(logits, 4);
    di_sample_result r;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(4), &r), DI_OK);
    CHECK_EQ_INT(r.token, 3);
    CHECK_NEAR(r.logprob, log(1.0 / 8), 1e-6);
    CHECK_EQ_INT(r.n_top, 3);
    CHECK_EQ_INT(r.top_ids[0], 2);
    CHECK_EQ_INT(r.top_ids[1], 1);
    CHECK_EQ_INT(r.top_ids[2], 0); /* 0 and 3 tie: the lower id */
    CHECK_NEAR(r.top_logprobs[0], log(0.5), 1e-6);
    CHECK_NEAR(r.top_logprobs[1], log(0.25), 1e-6);
    CHECK_NEAR(r.top_logprobs[2], log(0.125), 1e-6);
    p.logprobs = 0; /* only the sampled token's */
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(4), &r), DI_OK);
    CHECK_EQ_INT(r.n_top, 0);
    CHECK_NEAR(r.logprob, log(1.0 / 8), 1e-6);
    p.logprobs = -1;
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(4), &r), DI_OK);
    CHECK(r.logprob == 0.0f && r.n_top == 0);
    /* top-N over a large row equals a brute-force ranking. */
    static float x[MAX_VOCAB];
    random_row(x, MAX_VOCAB, 3.0);
    x[100] = x[5000] = 3.5f;
    p = di_sampling_default_params();
    p.logprobs = 20;
    in = input(x, MAX_VOCAB);
    CHECK_EQ_INT(di_sampler_sample(&p, &in, scratch_for(MAX_VOCAB), &r), DI_OK);
    CHECK_EQ_INT(r.top_ids[0], 100);
    CHECK_EQ_INT(r.top_ids[1], 5000);
    for (int j = 2; j < 20; j++) {
        int32_t better = 0; /* tokens ranked before top_ids[j] */
        for (int64_t i = 0; i < MAX_VOCAB; i++)
            better += x[i] > x[r.top_ids[j]] || (x[i] == x[r.top_ids[j]] && i < r.top_ids[j]);
        CHECK_EQ_INT(better, j);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The exponential and the SIMD levels                                                        */
/* ---------------------------------------------------------------------------------------- */

/* sample_vec.h documents a maximum relative error of 8.2e-8 and monotonicity, found by
 * checking every float in [DI_SAMPLE_EXP_MIN, 0]; here every 1021st of them, plus the edges. */
TEST(exp_accuracy) {
    CHECK(di_sample_exp(0.0f) == 1.0f);
    CHECK(di_sample_exp(-0.0f) == 1.0f);
    CHECK(di_sample_exp(-INFINITY) == 0.0f);
    CHECK(di_sample_exp(NAN) == 0.0f);
    CHECK(di_sample_exp(nextafterf(DI_SAMPLE_EXP_MIN, -INFINITY)) == 0.0f);
    CHECK(di_sample_exp(DI_SAMPLE_EXP_MIN) >= FLT_MIN);
    double worst = 0.0;
    float at = 0.0f;
    int monotone = 1;
    for (uint32_t b = 0x80000000u;; b += 1021) {
        float y;
        memcpy(&y, &b, sizeof y);
        if (!(y >= DI_SAMPLE_EXP_MIN)) break;
        double want = exp((double)y), rel = fabs((double)di_sample_exp(y) - want) / want;
        if (rel > worst) worst = rel, at = y;
        monotone &= di_sample_exp(nextafterf(y, 0.0f)) >= di_sample_exp(y);
    }
    CHECK_MSG(worst <= 8.2e-8, "max relative error %.3g at %.9g", worst, (double)at);
    CHECK(monotone);
}

/* Rows that exercise the kernels' edges: ties at the top, -inf, signed zeros, a length that
 * is not a multiple of the vector width or of the summation block. */
static void awkward_row(float *x, int64_t n, int variant) {
    random_row(x, n, variant == 2 ? 30.0 : 4.0);
    for (int i = 0; i < 40; i++)
        x[(int64_t)(rnd01() * (double)n)] += 8.0f;
    x[n / 3] = -INFINITY;
    x[n - 1] = -INFINITY;
    if (variant == 1) { /* a tie at the top between a -0 and a +0, and many more -inf */
        for (int64_t i = 0; i < n; i++)
            x[i] = x[i] > 0.0f ? -x[i] : x[i];
        x[5] = -0.0f;
        x[n - 2] = 0.0f;
        for (int64_t i = 7; i < n; i += 5)
            x[i] = -INFINITY;
    }
}

/* The kernels themselves: same maximum, positions, weights and sums, bit for bit. */
static void compare_kernels(const float *x, int64_t n) {
    const di_sample_kernels *s = &di_sample_kernels_scalar, *v = di_sample_kernels_active();
    bool bad_s, bad_v;
    int64_t first_s, first_v;
    float ms = s->scan(x, n, &bad_s, &first_s), mv = v->scan(x, n, &bad_v, &first_v);
    CHECK(ms == mv && bad_s == bad_v);
    CHECK_EQ_INT(first_s, first_v);
    for (int64_t from = 0; from < n; from += n / 7 + 1)
        CHECK_EQ_INT(s->next_at_least(x, from, n, ms - 1.0f),
                     v->next_at_least(x, from, n, ms - 1.0f));
    CHECK_EQ_INT(s->next_at_least(x, 0, n, ms), v->next_at_least(x, 0, n, ms));
    int32_t *ids_s = malloc(sizeof(int32_t) * (size_t)n),
            *ids_v = malloc(sizeof(int32_t) * (size_t)n);
    int64_t cs = s->collect_at_least(x, n, ms - 3.0f, ids_s);
    CHECK_EQ_INT(cs, v->collect_at_least(x, n, ms - 3.0f, ids_v));
    CHECK(memcmp(ids_s, ids_v, sizeof(int32_t) * (size_t)cs) == 0);
    const size_t nb = (size_t)((n + DI_SAMPLE_BLOCK - 1) / DI_SAMPLE_BLOCK);
    float *ws = malloc(sizeof(float) * (size_t)n), *wv = malloc(sizeof(float) * (size_t)n);
    double *bs = malloc(sizeof(double) * nb), *bv = malloc(sizeof(double) * nb);
    const float inv_t[3] = {1.0f, 1.0f / 0.7f, 1.0f / 0.013f};
    for (int c = 0; c < 3; c++) {
        float cutoff = c == 1 ? ms - 2.0f : -FLT_MAX;
        double ts = s->weights(x, n, ms, inv_t[c], cutoff, ws, bs);
        double tv = v->weights(x, n, ms, inv_t[c], cutoff, wv, bv);
        CHECK_MSG(memcmp(&ts, &tv, sizeof ts) == 0, "n %lld: totals %.17g vs %.17g", (long long)n,
                  ts, tv);
        CHECK(memcmp(ws, wv, sizeof(float) * (size_t)n) == 0);
        CHECK(memcmp(bs, bv, sizeof(double) * nb) == 0);
    }
    free(ids_s), free(ids_v), free(ws), free(wv), free(bs), free(bv);
}

/* What the sampler returns for one row and params: the distribution, and some draws with
 * their logprobs. */
typedef struct run_result {
    double probs[MAX_VOCAB];
    di_sample_result draws[64];
} run_result;

static void run_all(const di_sampling_params *p, di_sample_input in, run_result *r) {
    CHECK_EQ_INT(di_sampler_probs(p, &in, scratch_for(in.vocab), r->probs), DI_OK);
    for (int64_t pos = 0; pos < 64; pos++) {
        in.position = pos;
        CHECK_EQ_INT(di_sampler_sample(p, &in, scratch_for(in.vocab), &r->draws[pos]), DI_OK);
    }
}

/* One vector level against the scalar kernels on every row variant, size and case. */
static void compare_level(const char *level) {
    static float x[MAX_VOCAB];
    static run_result a, b;
    const int32_t hist_ids[4] = {3, 100, 2047, 5000};
    const int32_t hist_cnt[4] = {1, 0, 2, 1};
    di_token_counts h = {hist_ids, hist_cnt, 4, 4};
    struct {
        float t, top_p, min_p;
        int32_t k;
        bool history;
    } cases[] = {
        {0.0f, 1.0f, 0.0f, -1, false},    {1.0f, 1.0f, 0.0f, -1, false},
        {0.7f, 1.0f, 0.05f, -1, true},    {0.013f, 1.0f, 0.0f, -1, false},
        {1.0f, 0.9f, 0.0f, -1, false},    {1.3f, 0.5f, 0.0f, -1, true},
        {0.8f, 1.0f, 0.0f, 50, false},    {1.0f, 0.9f, 0.02f, 50, true},
        {1.0f, 0.95f, 0.0f, 1500, false},
    };
    const int64_t sizes[4] = {MAX_VOCAB, 8191, 1000, 13};
    for (int v = 0; v < 3; v++)
        for (int si = 0; si < 4; si++) {
            const int64_t n = sizes[si];
            awkward_row(x, n, v);
            di_sample_simd_force(level);
            compare_kernels(x, n);
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
                di_sampling_params p = di_sampling_default_params();
                p.temperature = cases[c].t;
                p.top_p = cases[c].top_p;
                p.min_p = cases[c].min_p;
                p.top_k = cases[c].k;
                p.logprobs = 5;
                p.repetition_penalty = 1.3f;
                p.frequency_penalty = 0.4f;
                di_sample_input in = input(x, n);
                in.history = cases[c].history && n > 5000 ? &h : NULL;
                di_sample_simd_force(level);
                run_all(&p, in, &a);
                di_sample_simd_force("scalar");
                run_all(&p, in, &b);
                CHECK_MSG(memcmp(a.probs, b.probs, sizeof(double) * (size_t)n) == 0 &&
                              memcmp(a.draws, b.draws, sizeof a.draws) == 0,
                          "%s: row variant %d, vocab %lld, case %zu differs", level, v,
                          (long long)n, c);
            }
        }
}

/* Every vector level this machine runs gives the scalar kernels' probabilities, tokens and
 * logprobs, bit for bit, whatever the parameters. */
TEST(simd_and_scalar_agree) {
    const char *levels[2] = {"avx2", "avx512"};
    int compared = 0;
    for (int l = 0; l < 2; l++) {
        if (di_sample_simd_force(levels[l]) != 0) continue;
        printf("  comparing %s with scalar\n", levels[l]);
        compare_level(levels[l]);
        compared++;
    }
    if (!compared) printf("  (no vector level on this machine: nothing to compare)\n");
    di_sample_simd_force(NULL);
}

int main(void) {
    RUN(philox_known_answers);
    RUN(philox_uniform_keying);
    RUN(params_defaults);
    RUN(params_validate_messages);
    RUN(process_logit_bias);
    RUN(process_min_tokens);
    RUN(process_penalties);
    RUN(process_checks_ids);
    RUN(greedy_ties_lowest_id);
    RUN(greedy_uses_processed_row);
    RUN(greedy_plain);
    RUN(device_draw);
    RUN(full_row_draw_matches);
    RUN(top_k_one_is_greedy);
    RUN(very_low_temperature_is_greedy);
    RUN(all_masked_is_an_error);
    RUN(bad_rows_are_errors);
    RUN(raw_logprobs);
    RUN(exp_accuracy);
    RUN(simd_and_scalar_agree);
    return test_summary();
}
