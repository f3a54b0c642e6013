/*
 * test_sample.c -- the sampling module (src/sample): Philox known answers, parameter
 * validation, each logits processor on hand-made rows, greedy and its equivalents, masked
 * and malformed rows, raw logprobs. The distributions and the draws are tested in
 * test_sample_dist.c.
 */
#include "sample/philox.h"
#include "sample/sampler.h"
#include "test.h"

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
    RUN(top_k_one_is_greedy);
    RUN(very_low_temperature_is_greedy);
    RUN(all_masked_is_an_error);
    RUN(bad_rows_are_errors);
    RUN(raw_logprobs);
    return test_summary();
}
