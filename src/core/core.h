/*
 * core.h -- internal basics every module uses: errors with context, allocation through the
 * replaceable allocator, logging, timing and small helpers.
 *
 * Error convention: a function that fails calls di_error(status, fmt, ...) which records a
 * message for di_last_error() and returns the status, so failure paths read
 *     return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" has dtype %s", path, name, dt);
 */
#ifndef DI_CORE_H
#define DI_CORE_H

#include "deepinfer.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define DI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DI_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DI_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DI_UNUSED(x) (void)(x)

#if defined(__GNUC__)
#define DI_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define DI_PRINTF(fmt_idx, arg_idx)
#endif

/* Records a formatted message as the calling thread's last error and returns status. */
di_status di_error(di_status status, const char *fmt, ...) DI_PRINTF(2, 3);
/* Prefixes the current last-error message with "prefix: " (adds context on the way up). */
di_status di_error_prefix(di_status status, const char *fmt, ...) DI_PRINTF(2, 3);
void di_clear_error(void);

/* Allocation through the replaceable allocator. di_xcalloc zero-fills and checks overflow. */
void *di_malloc(size_t size);
void *di_calloc(size_t n, size_t size);
void *di_realloc(void *p, size_t size);
char *di_strdup(const char *s);
/* 64-byte aligned allocation (SIMD rows, thread-private scratch); free with di_aligned_free. */
void *di_aligned_alloc(size_t size);
void di_aligned_free(void *p);

void di_log(di_log_level level, const char *fmt, ...) DI_PRINTF(2, 3);

/* Monotonic time in seconds. */
double di_time_now(void);

/* Number of online CPU cores (>= 1). */
int di_cpu_count(void);

/* Reads a whole file into a NUL-terminated buffer (owned by the caller, di_free). */
di_status di_read_file(const char *path, char **out, size_t *out_len);

/* Joins dir and name into a new string ("dir/name"); caller frees with di_free. */
char *di_path_join(const char *dir, const char *name);

#endif /* DI_CORE_H */
