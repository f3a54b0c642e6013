/*
 * core.c -- errors, allocation hooks, logging, time and file helpers (see core.h).
 *
 * The last-error message is thread-local so that concurrent callers (an engine stepping on
 * one thread while another adds requests) never see each other's messages.
 */
#define _POSIX_C_SOURCE 200809L
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* Status strings and errors                                                                  */
/* ---------------------------------------------------------------------------------------- */

const char *di_status_str(di_status s) {
    switch (s) {
#define DI_STATUS_CASE_(name, str)                                                              \
    case name:                                                                                 \
        return str;
        DI_STATUS_LIST(DI_STATUS_CASE_)
#undef DI_STATUS_CASE_
    default:
        return "unknown status";
    }
}

static _Thread_local char g_last_error[1024];

const char *di_last_error(void) { return g_last_error; }

void di_clear_error(void) { g_last_error[0] = '\0'; }

di_status di_error(di_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

di_status di_error_prefix(di_status status, const char *fmt, ...) {
    char prefix[512];
    char old[sizeof g_last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_last_error, sizeof old);
    if (old[0])
        snprintf(g_last_error, sizeof g_last_error, "%s: %s", prefix, old);
    else
        snprintf(g_last_error, sizeof g_last_error, "%s", prefix);
    return status;
}

/* ---------------------------------------------------------------------------------------- */
/* Allocation                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static void *libc_malloc(size_t size, void *user) { (void)user; return malloc(size); }
static void *libc_realloc(void *p, size_t size, void *user) { (void)user; return realloc(p, size); }
static void libc_free(void *p, void *user) { (void)user; free(p); }

static di_allocator g_alloc = {libc_malloc, libc_realloc, libc_free, NULL};

void di_set_allocator(const di_allocator *a) {
    if (a && a->malloc_fn && a->realloc_fn && a->free_fn)
        g_alloc = *a;
    else
        g_alloc = (di_allocator){libc_malloc, libc_realloc, libc_free, NULL};
}

void *di_malloc(size_t size) { return g_alloc.malloc_fn(size ? size : 1, g_alloc.user); }

void *di_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = di_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void *di_realloc(void *p, size_t size) { return g_alloc.realloc_fn(p, size ? size : 1, g_alloc.user); }

void di_free(void *p) {
    if (p) g_alloc.free_fn(p, g_alloc.user);
}

char *di_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = di_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Aligned blocks are large and few (activation buffers), so they bypass the hook and use
 * posix_memalign directly; this keeps the hook interface to malloc/realloc/free. */
void *di_aligned_alloc(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, 64, size ? size : 64) != 0) return NULL;
    return p;
}

void di_aligned_free(void *p) { free(p); }

/* ---------------------------------------------------------------------------------------- */
/* Logging                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static di_log_fn g_log_fn = NULL;
static void *g_log_user = NULL;
static di_log_level g_log_min = DI_LOG_WARN;

void di_set_log(di_log_fn fn, void *user, di_log_level min_level) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_min = min_level;
}

void di_log(di_log_level level, const char *fmt, ...) {
    if (level < g_log_min) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_log_fn) {
        g_log_fn(level, msg, g_log_user);
    } else {
        static const char *names[] = {"debug", "info", "warning", "error"};
        fprintf(stderr, "deepinfer %s: %s\n", names[level], msg);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Time, cores, files                                                                         */
/* ---------------------------------------------------------------------------------------- */

double di_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int di_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

di_status di_read_file(const char *path, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return di_error(DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return di_error(DI_ERR_IO, "%s: cannot seek", path);
    }
    long len = ftell(f);
    if (len < 0) {
        fclose(f);
        return di_error(DI_ERR_IO, "%s: cannot determine size", path);
    }
    rewind(f);
    char *buf = di_malloc((size_t)len + 1);
    if (!buf) {
        fclose(f);
        return di_error(DI_ERR_OUT_OF_MEMORY, "%s: cannot allocate %ld bytes", path, len);
    }
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    if (got != (size_t)len) {
        di_free(buf);
        return di_error(DI_ERR_IO, "%s: short read", path);
    }
    buf[len] = '\0';
    *out = buf;
    if (out_len) *out_len = (size_t)len;
    return DI_OK;
}

char *di_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = di_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}
