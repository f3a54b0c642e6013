/*
 * bench_tokenizer.c -- encode throughput of the tokenizer, single thread and all threads.
 *
 *   bench_tokenizer TOKENIZER.json CORPUS.txt [threads]
 *
 * The corpus is split into lines; each line is one encode call (like HF's encode_batch over
 * lines). Threads take interleaved blocks of lines. One untimed warm-up pass, then the best
 * of three timed passes. Prints key=value lines for bench_tokenizer.sh: load_s, mb, ids,
 * st_mbps, mt_mbps, threads, peak_rss_mb.
 */
#define _POSIX_C_SOURCE 200809L
#include "deepinfer.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const di_tokenizer *t;
    char **line;
    size_t *len;
    size_t n_lines, first, step;
    int64_t n_ids;
} job;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *run(void *arg) {
    job *j = arg;
    int64_t cap = 1 << 16;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    j->n_ids = 0;
    for (size_t b = j->first * 64; b < j->n_lines; b += j->step * 64)
        for (size_t i = b; i < b + 64 && i < j->n_lines; i++) {
            int64_t n = di_tokenizer_encode(j->t, j->line[i], j->len[i], false, ids, cap);
            if (n < 0 && n != DI_TOK_ERROR) {
                cap = -n;
                ids = realloc(ids, (size_t)cap * sizeof *ids);
                n = di_tokenizer_encode(j->t, j->line[i], j->len[i], false, ids, cap);
            }
            j->n_ids += n;
        }
    free(ids);
    return NULL;
}

static double pass(job *jobs, int n_threads, int64_t *n_ids) {
    pthread_t th[256];
    double t0 = now();
    for (int i = 0; i < n_threads; i++)
        pthread_create(&th[i], NULL, run, &jobs[i]);
    *n_ids = 0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        *n_ids += jobs[i].n_ids;
    }
    return now() - t0;
}

static double best_of(const di_tokenizer *t, char **line, size_t *len, size_t n, int n_threads,
                      int64_t *n_ids) {
    job jobs[256];
    for (int i = 0; i < n_threads; i++)
        jobs[i] = (job){t, line, len, n, (size_t)i, (size_t)n_threads, 0};
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double s = pass(jobs, n_threads, n_ids);
        if (r > 0 && s < best) best = s; /* pass 0 warms the caches */
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER.json CORPUS.txt [threads]\n");
        return 2;
    }
    int n_threads = argc > 3 ? atoi(argv[3]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1 || n_threads > 256) n_threads = 1;
    double t0 = now();
    di_tokenizer *t;
    if (di_tokenizer_load(argv[1], &t) != DI_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", di_last_error());
        return 1;
    }
    double load_s = now() - t0;
    FILE *f = fopen(argv[2], "rb");
    if (!f) return 1;
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    rewind(f);
    char *buf = malloc(size + 1);
    if (fread(buf, 1, size, f) != size) return 1;
    fclose(f);
    size_t n = 0, cap = 1024;
    char **line = malloc(cap * sizeof *line);
    size_t *len = malloc(cap * sizeof *len);
    for (size_t i = 0; i < size;) {
        char *e = memchr(buf + i, '\n', size - i);
        size_t end = e ? (size_t)(e - buf) + 1 : size; /* keep the newline, as HF sees it */
        if (n == cap) {
            cap *= 2;
            line = realloc(line, cap * sizeof *line);
            len = realloc(len, cap * sizeof *len);
        }
        line[n] = buf + i;
        len[n++] = end - i;
        i = end;
    }
    int64_t ids1, idsn;
    double st = best_of(t, line, len, n, 1, &ids1);
    double mt = best_of(t, line, len, n, n_threads, &idsn);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mb = (double)size / 1e6;
    printf("load_s=%.4f\nmb=%.2f\nlines=%zu\nids=%lld\nst_mbps=%.2f\nmt_mbps=%.2f\nthreads=%d\n"
           "peak_rss_mb=%.1f\n",
           load_s, mb, n, (long long)ids1, mb / st, mb / mt, n_threads,
           (double)ru.ru_maxrss / 1024.0);
    if (ids1 != idsn) fprintf(stderr, "bench_tokenizer: id counts differ across threads\n");
    di_tokenizer_free(t);
    free(line);
    free(len);
    free(buf);
    return 0;
}
