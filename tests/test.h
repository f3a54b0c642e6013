/*
 * test.h -- a minimal test harness for deepinfer's C tests.
 *
 *   TEST(name) { CHECK(cond); CHECK_EQ_INT(a, b); CHECK_NEAR(a, b, tol); }
 *   int main(void) { RUN(name); ...; return test_summary(); }
 *
 * Each failed check prints file:line and the expression. test_summary() prints the closing
 * line "N passed, N failed" (N skipped when any) and returns the process exit code.
 * A test may call SKIP("reason") to record a skip (e.g. a data file that is absent).
 */
#ifndef DI_TEST_H
#define DI_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_n_passed, test_n_failed, test_n_skipped;
static int test_cur_failed, test_cur_skipped;
static const char *test_cur_name;

#define TEST(name) static void test_##name(void)

/* DI_TEST_ONLY=a,b: run only the tests named (a quick rerun of a few on a GPU machine). */
static inline int test_selected(const char *name) {
    const char *only = getenv("DI_TEST_ONLY");
    if (!only || !*only) return 1;
    const size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

#define RUN(name)                                                                              \
    do {                                                                                       \
        if (!test_selected(#name)) break;                                                      \
        test_cur_failed = 0;                                                                   \
        test_cur_skipped = 0;                                                                  \
        test_cur_name = #name;                                                                 \
        test_##name();                                                                         \
        if (test_cur_skipped) {                                                                \
            test_n_skipped++;                                                                  \
        } else if (test_cur_failed) {                                                          \
            test_n_failed++;                                                                   \
            printf("FAIL %s\n", #name);                                                        \
        } else {                                                                               \
            test_n_passed++;                                                                   \
            printf("ok   %s\n", #name);                                                        \
        }                                                                                      \
        fflush(stdout);                                                                        \
    } while (0)

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("  %s:%d: %s: CHECK(%s) failed\n", __FILE__, __LINE__, test_cur_name,       \
                   #cond);                                                                     \
            test_cur_failed = 1;                                                               \
        }                                                                                      \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                   \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("  %s:%d: %s: CHECK(%s) failed: ", __FILE__, __LINE__, test_cur_name,       \
                   #cond);                                                                     \
            printf(__VA_ARGS__);                                                               \
            printf("\n");                                                                      \
            test_cur_failed = 1;                                                               \
        }                                                                                      \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                     \
    do {                                                                                       \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                  \
        if (va_ != vb_) {                                                                      \
            printf("  %s:%d: %s: %s == %s failed (%lld vs %lld)\n", __FILE__, __LINE__,        \
                   test_cur_name, #a, #b, va_, vb_);                                           \
            test_cur_failed = 1;                                                               \
        }                                                                                      \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                  \
    do {                                                                                       \
        double va_ = (double)(a), vb_ = (double)(b);                                           \
        if (!(fabs(va_ - vb_) <= (tol))) {                                                     \
            printf("  %s:%d: %s: |%s - %s| <= %g failed (%.9g vs %.9g)\n", __FILE__, __LINE__, \
                   test_cur_name, #a, #b, (double)(tol), va_, vb_);                            \
            test_cur_failed = 1;                                                               \
        }                                                                                      \
    } while (0)

#define SKIP(...)                                                                              \
    do {                                                                                       \
        printf("skip %s: ", test_cur_name);                                                    \
        printf(__VA_ARGS__);                                                                   \
        printf("\n");                                                                          \
        test_cur_skipped = 1;                                                                  \
        return;                                                                                \
    } while (0)

static inline int test_summary(void) {
    if (test_n_skipped)
        printf("%d passed, %d failed, %d skipped\n", test_n_passed, test_n_failed,
               test_n_skipped);
    else
        printf("%d passed, %d failed\n", test_n_passed, test_n_failed);
    return test_n_failed ? 1 : 0;
}

#endif /* DI_TEST_H */
