/*
 * batch_out.c -- the output file of `deepinfer batch` (see batch_out.h for the policy).
 */
#define _POSIX_C_SOURCE 200809L /* pread, fdatasync, strdup */
#include "batch_out.h"

#include "args.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------- */
/* String set                                                                                 */
/* ---------------------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The slot of key, or of the empty slot where it would go (cap > 0). */
static size_t set_find(const batch_set *s, const char *key) {
    size_t j = fnv1a(key) & (s->cap - 1);
    while (s->slots[j] && strcmp(s->slots[j], key))
        j = (j + 1) & (s->cap - 1);
    return j;
}

static bool set_grow(batch_set *s) {
    batch_set g = {.cap = s->cap ? s->cap * 2 : 64, .n = s->n};
    g.slots = calloc(g.cap, sizeof(char *));
    g.vals = calloc(g.cap, sizeof(int64_t));
    if (!g.slots || !g.vals) {
        free(g.slots);
        free(g.vals);
        return false;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->slots[i]) continue;
        size_t j = set_find(&g, s->slots[i]);
        g.slots[j] = s->slots[i];
        g.vals[j] = s->vals[i];
    }
    free(s->slots);
    free(s->vals);
    *s = g;
    return true;
}

bool batch_set_has(const batch_set *s, const char *key) {
    return s->cap && s->slots[set_find(s, key)];
}

bool batch_set_put(batch_set *s, const char *key, int64_t val, int64_t *old) {
    if (s->cap) {
        size_t j = set_find(s, key);
        if (s->slots[j]) {
            if (old) *old = s->vals[j];
            return false;
        }
    }
    char *copy = NULL;
    if (((s->n + 1) * 2 > s->cap && !set_grow(s)) || !(copy = strdup(key))) {
        if (old) *old = -1;
        return false;
    }
    size_t j = set_find(s, key);
    s->slots[j] = copy;
    s->vals[j] = val;
    s->n++;
    return true;
}

bool batch_set_add(batch_set *s, const char *key) {
    return batch_set_put(s, key, 0, NULL);
}

void batch_set_free(batch_set *s) {
    for (size_t i = 0; i < s->cap; i++)
        free(s->slots[i]);
    free(s->slots);
    free(s->vals);
    memset(s, 0, sizeof *s);
}

void batch_line_key(int64_t line, char *buf, size_t size) {
    snprintf(buf, size, "line:%lld", (long long)line);
}

/* ---------------------------------------------------------------------------------------- */
/* Resume scan                                                                                */
/* ---------------------------------------------------------------------------------------- */

/* Records the key of one result line; false when the line is not a result line. */
static bool note_result(batch_out *o, const char *line, size_t len) {
    json_t *root = json_loadb(line, len, 0, NULL);
    const json_t *id = json_object_get(root, "id");
    const json_t *cid = json_object_get(root, "custom_id");
    bool ok =
        json_is_object(root) && json_is_string(id) && (json_is_string(cid) || json_is_null(cid));
    if (ok) {
        const char *ids = json_string_value(id);
        long long n;
        char tail;
        if (sscanf(ids, "batch_req_line%lld%c", &n, &tail) == 1) {
            char key[48];
            batch_line_key(n, key, sizeof key);
            batch_set_add(&o->done_lines, key);
        } else if (json_is_string(cid)) {
            batch_set_add(&o->done_ids, json_string_value(cid));
        } else {
            ok = false;
        }
    }
    json_decref(root);
    return ok;
}

/* Reads the whole file; *out is NUL-terminated (free). */
static bool read_all(int fd, char **out, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return false;
    for (;;) {
        if (n + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) return free(buf), false;
            buf = b;
        }
        ssize_t got = pread(fd, buf + n, cap - 1 - n, (off_t)n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return free(buf), false;
        if (got == 0) break;
        n += (size_t)got;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return true;
}

/* Scans the existing lines; cuts off a truncated / unreadable tail. */
static bool scan_existing(batch_out *o, char *err, size_t err_size) {
    char *buf;
    size_t len;
    if (!read_all(o->fd, &buf, &len)) {
        snprintf(err, err_size, "%s: cannot read: %s", o->path, strerror(errno));
        return false;
    }
    size_t good_end = 0; /* end of the last good line */
    int64_t lineno = 0, bad_line = 0;
    bool ok = true;
    for (size_t at = 0; at < len;) {
        char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len;
        lineno++;
        bool blank = end == at;
        bool good = nl && !blank && note_result(o, buf + at, end - at);
        if (good) {
            if (bad_line) {
                snprintf(err, err_size,
                         "%s: line %lld is not a batch result line; refusing to append to a "
                         "file that is not a batch output",
                         o->path, (long long)bad_line);
                ok = false;
                break;
            }
            o->n_existing++;
            good_end = end + 1;
        } else if (!bad_line && !blank) {
            bad_line = lineno;
        }
        at = nl ? end + 1 : len;
    }
    free(buf);
    if (ok && good_end < len) {
        if (ftruncate(o->fd, (off_t)good_end) != 0) {
            snprintf(err, err_size, "%s: cannot cut off a truncated last line: %s", o->path,
                     strerror(errno));
            return false;
        }
        fprintf(stderr,
                "deepinfer batch: %s: dropped %zu bytes of an incomplete last line (a killed "
                "run); its request is run again\n",
                o->path, len - good_end);
    }
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* Writing                                                                                    */
/* ---------------------------------------------------------------------------------------- */

bool batch_out_open(batch_out *o, const char *path, double sync_interval_s, char *err,
                    size_t err_size) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->sync_interval_s = sync_interval_s;
    o->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        snprintf(err, err_size, "--output %s: cannot open for writing: %s", path, strerror(errno));
        return false;
    }
    struct stat sb;
    if (fstat(o->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, err_size, "--output %s: not a regular file", path);
        close(o->fd);
        return false;
    }
    if (!scan_existing(o, err, err_size)) {
        close(o->fd);
        batch_set_free(&o->done_ids);
        batch_set_free(&o->done_lines);
        return false;
    }
    o->last_sync = cli_now();
    return true;
}

bool batch_out_write_line(batch_out *o, const char *text, char *err, size_t err_size) {
    size_t n = strlen(text);
    char *line = malloc(n + 1);
    if (!line) {
        snprintf(err, err_size, "out of memory");
        return false;
    }
    memcpy(line, text, n);
    line[n] = '\n';
    size_t done = 0;
    while (done < n + 1) {
        ssize_t w = write(o->fd, line + done, n + 1 - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            snprintf(err, err_size, "%s: write failed: %s", o->path,
                     w < 0 ? strerror(errno) : "no progress");
            free(line);
            return false;
        }
        done += (size_t)w;
    }
    free(line);
    o->dirty = true;
    return true;
}

void batch_out_maybe_sync(batch_out *o, double now) {
    if (o->dirty && now - o->last_sync >= o->sync_interval_s) {
        (void)fdatasync(o->fd);
        o->dirty = false;
        o->last_sync = now;
    }
}

bool batch_out_close(batch_out *o, char *err, size_t err_size) {
    bool ok = true;
    if (o->fd >= 0) {
        if (fdatasync(o->fd) != 0 && errno != EINVAL) {
            snprintf(err, err_size, "%s: fdatasync failed: %s", o->path, strerror(errno));
            ok = false;
        }
        if (close(o->fd) != 0 && ok) {
            snprintf(err, err_size, "%s: close failed: %s", o->path, strerror(errno));
            ok = false;
        }
    }
    o->fd = -1;
    batch_set_free(&o->done_ids);
    batch_set_free(&o->done_lines);
    return ok;
}
