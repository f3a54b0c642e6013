/*
 * batch_progress.c -- the progress bar / periodic lines of `deepinfer batch`.
 */
#define _POSIX_C_SOURCE 200809L /* fileno */
#include "batch_progress.h"

#include "args.h"

#include <stdio.h>
#include <unistd.h>

void batch_progress_init(batch_progress *p, int64_t total, int64_t already_done, double interval_s,
                         bool quiet) {
    *p = (batch_progress){0};
    p->tty = isatty(fileno(stderr));
    p->quiet = quiet;
    p->interval_s = interval_s;
    p->total = total;
    p->done = already_done;
    p->t_start = p->t_last = cli_now();
}

static double rate(const batch_progress *p, double now) {
    double dt = now - p->t_start;
    return dt > 0 ? (double)p->tokens / dt : 0.0;
}

/* Seconds left, or -1 when nothing has finished yet to extrapolate from. */
static double eta(const batch_progress *p, double now) {
    if (p->done_here == 0) return -1;
    return (now - p->t_start) / (double)p->done_here * (double)(p->total - p->done);
}

static void draw_bar(batch_progress *p, double now) {
    enum { WIDTH = 24 };
    int fill = p->total > 0 ? (int)(WIDTH * p->done / p->total) : WIDTH;
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = '\0';
    double e = eta(p, now);
    char etas[32] = "--:--:--";
    if (e >= 0) {
        long long s = (long long)(e + 0.5);
        snprintf(etas, sizeof etas, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    }
    fprintf(stderr, "\r[%s] %lld/%lld requests  %.1f tok/s  ETA %s\033[K", bar, (long long)p->done,
            (long long)p->total, rate(p, now), etas);
    fflush(stderr);
    p->drawn = true;
}

static void print_line(const batch_progress *p, double now) {
    double e = eta(p, now);
    fprintf(stderr, "batch: %lld/%lld requests done (%lld errors), %lld tokens, %.1f tok/s",
            (long long)p->done, (long long)p->total, (long long)p->errors, (long long)p->tokens,
            rate(p, now));
    if (e >= 0 && p->done < p->total) fprintf(stderr, ", ETA %.0f s", e);
    fputc('\n', stderr);
}

void batch_progress_update(batch_progress *p, bool force) {
    if (p->quiet) return;
    double now = cli_now();
    double every = p->tty ? 0.1 : p->interval_s;
    /* Plain mode with interval 0: a line per finished request (forced), none per step. */
    if (!force && (now - p->t_last < every || (!p->tty && every <= 0))) return;
    p->t_last = now;
    if (p->tty)
        draw_bar(p, now);
    else
        print_line(p, now);
}

void batch_progress_finish(batch_progress *p) {
    if (p->quiet) return;
    double now = cli_now();
    if (p->tty) {
        draw_bar(p, now);
        fputc('\n', stderr);
    }
    fprintf(stderr,
            "batch: finished %lld requests in %.1f s (%lld errors), %lld tokens generated, "
            "%.1f tok/s\n",
            (long long)p->done_here, now - p->t_start, (long long)p->errors, (long long)p->tokens,
            rate(p, now));
}
