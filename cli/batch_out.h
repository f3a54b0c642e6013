/*
 * batch_out.h -- the output file of `deepinfer batch`: resuming from what an earlier run
 * wrote, and appending whole lines.
 *
 * Durability policy:
 *   - Every result is one line, written with a single write() of the whole line and its
 *     newline to a descriptor opened with O_APPEND (a short write, which regular files only
 *     give on a full disk, is continued and then reported). So a killed process leaves at
 *     most one truncated line, at the very end.
 *   - fdatasync() runs at most once per sync interval (default 1 s) while lines are written,
 *     and once at close: a SIGKILL loses nothing written (the page cache has it); a power
 *     failure loses at most the last interval.
 *   - On open, an existing file is scanned: each complete line must be a result line (a JSON
 *     object with "id" and "custom_id"); a truncated or unreadable tail is cut off with
 *     ftruncate() and reported on stderr; an unreadable line followed by good ones is an error
 *     (the file is not ours to repair).
 *
 * Resume keys: a result for the first occurrence of a custom_id is keyed by that custom_id;
 * a result for a line without a custom_id, or for a repeated custom_id, is keyed by its input
 * line number, which its "id" carries ("batch_req_line<N>").
 */
#ifndef DI_CLI_BATCH_OUT_H
#define DI_CLI_BATCH_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A set of strings (custom_ids, "line:N" keys), each with an integer value. */
typedef struct batch_set {
    char **slots;  /* [cap], open addressing; NULL = empty; owned */
    int64_t *vals; /* [cap] */
    size_t cap, n;
} batch_set;

/* Adds key with value val; false when it is already there (*old, if given, gets its value)
 * or on OOM (*old = -1). */
bool batch_set_put(batch_set *s, const char *key, int64_t val, int64_t *old);
bool batch_set_add(batch_set *s, const char *key); /* batch_set_put with value 0 */
bool batch_set_has(const batch_set *s, const char *key);
void batch_set_free(batch_set *s);

typedef struct batch_out {
    int fd;
    const char *path;
    batch_set done_ids;   /* custom_ids with a result */
    batch_set done_lines; /* "line:N" keys with a result */
    int64_t n_existing;   /* result lines found at open */
    double sync_interval_s, last_sync;
    bool dirty;
} batch_out;

/* Opens (creating) path for appending; scans what is there. On failure writes a message to
 * err and returns false. */
bool batch_out_open(batch_out *o, const char *path, double sync_interval_s, char *err,
                    size_t err_size);

/* Appends text (no newline) plus "\n" as one write. */
bool batch_out_write_line(batch_out *o, const char *text, char *err, size_t err_size);

/* Syncs if the interval has passed since the last sync. */
void batch_out_maybe_sync(batch_out *o, double now);

/* Syncs and closes; false when the final sync or close failed. */
bool batch_out_close(batch_out *o, char *err, size_t err_size);

/* The resume key of a line-keyed result: "line:N". */
void batch_line_key(int64_t line, char *buf, size_t size);

#endif /* DI_CLI_BATCH_OUT_H */
