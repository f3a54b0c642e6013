/*
 * ids.c -- parsing of token id lists (see ids.h).
 *
 * Items are split on whitespace and each must be all decimal digits and fit an int32_t;
 * the first bad item stops parsing, and its message quotes it (cut to 32 bytes).
 */
#include "ids.h"
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITEM_QUOTE_MAX 32

/* ---------------------------------------------------------------------------------------- */
/* Parsing                                                                                    */
/* ---------------------------------------------------------------------------------------- */

static bool push_id(cli_ids *ids, int64_t *cap, int32_t id) {
    if (ids->n == *cap) {
        int64_t new_cap = *cap ? 2 * *cap : 64;
        int32_t *v = realloc(ids->v, (size_t)new_cap * sizeof *v);
        if (!v) return false;
        ids->v = v;
        *cap = new_cap;
    }
    ids->v[ids->n++] = id;
    return true;
}

/* Converts one item of `len` bytes; false (with a message) if it is not a token id. */
static bool parse_item(const char *s, size_t len, int64_t index, int32_t *id, char *err,
                       size_t err_size) {
    int shown = (int)(len < ITEM_QUOTE_MAX ? len : ITEM_QUOTE_MAX);
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) {
            const char *why = s[0] == '-' && len > 1 && isdigit((unsigned char)s[1])
                                  ? "is negative"
                                  : "is not a token id";
            snprintf(err, err_size,
                     "item %lld \"%.*s\" %s (expected non-negative integers separated by "
                     "spaces)",
                     (long long)index, shown, s, why);
            return false;
        }
        v = v * 10 + (s[i] - '0');
        if (v > INT32_MAX) {
            snprintf(err, err_size, "item %lld \"%.*s\" is too large for a token id",
                     (long long)index, shown, s);
            return false;
        }
    }
    *id = (int32_t)v;
    return true;
}

bool cli_ids_parse(const char *text, cli_ids *out, char *err, size_t err_size) {
    int64_t cap = 0;
    const char *p = text;
    out->v = NULL;
    out->n = 0;
    for (;;) {
        while (isspace((unsigned char)*p))
            p++;
        if (!*p) break;
        size_t len = 0;
        while (p[len] && !isspace((unsigned char)p[len]))
            len++;
        int32_t id;
        if (!parse_item(p, len, out->n + 1, &id, err, err_size)) goto fail;
        if (!push_id(out, &cap, id)) {
            snprintf(err, err_size, "out of memory after %lld ids", (long long)out->n);
            goto fail;
        }
        p += len;
    }
    if (out->n == 0) {
        snprintf(err, err_size, "no token ids given");
        goto fail;
    }
    return true;
fail:
    cli_ids_free(out);
    return false;
}

/* ---------------------------------------------------------------------------------------- */
/* Files and checks                                                                           */
/* ---------------------------------------------------------------------------------------- */

/* Reads a whole file into a NUL-terminated buffer (caller frees); NULL with errno set. */
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - 1 - len, f);
        if (len < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            errno = ENOMEM;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = buf && ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    if (buf) buf[len] = '\0';
    return buf;
}

bool cli_ids_read_file(const char *path, cli_ids *out, char *err, size_t err_size) {
    out->v = NULL;
    out->n = 0;
    char *text = read_text(path);
    if (!text) {
        snprintf(err, err_size, "cannot read: %s", strerror(errno));
        return false;
    }
    bool ok = cli_ids_parse(text, out, err, err_size);
    free(text);
    return ok;
}

bool cli_ids_check_range(const cli_ids *ids, int64_t vocab_size, char *err, size_t err_size) {
    for (int64_t i = 0; i < ids->n; i++) {
        if (ids->v[i] >= vocab_size) {
            snprintf(err, err_size,
                     "token id %d (item %lld) is out of range: the vocabulary has %lld ids "
                     "[0, %lld)",
                     (int)ids->v[i], (long long)(i + 1), (long long)vocab_size,
                     (long long)vocab_size);
            return false;
        }
    }
    return true;
}

void cli_ids_free(cli_ids *ids) {
    free(ids->v);
    ids->v = NULL;
    ids->n = 0;
}

int cli_ids_from_options(const char *cmd, const char *ids_text, const char *ids_file,
                         cli_ids *out) {
    char err[256];
    if (ids_text && ids_file)
        return cli_error(CLI_EXIT_USAGE, cmd, "give either --ids or --ids-file, not both");
    if (!ids_text && !ids_file) return cli_missing(cmd, "ids");
    if (ids_text && !cli_ids_parse(ids_text, out, err, sizeof err))
        return cli_error(CLI_EXIT_USAGE, cmd, "--ids: %s", err);
    if (ids_file && !cli_ids_read_file(ids_file, out, err, sizeof err))
        return cli_error(CLI_EXIT_USAGE, cmd, "--ids-file %s: %s", ids_file, err);
    return CLI_CONTINUE;
}

di_status cli_ids_encode(const di_tokenizer *tok, const char *text, size_t len, bool add_special,
                         cli_ids *out) {
    *out = (cli_ids){0};
    int64_t need = di_tokenizer_encode(tok, text, len, add_special, NULL, 0);
    if (need == DI_TOK_ERROR) return DI_ERR_INVALID_ARG;
    int64_t cap = need < 0 ? -need : need;
    out->v = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(int32_t));
    if (!out->v) return DI_ERR_OUT_OF_MEMORY;
    int64_t got = di_tokenizer_encode(tok, text, len, add_special, out->v, cap);
    if (got < 0) {
        cli_ids_free(out);
        return DI_ERR_INVALID_ARG;
    }
    out->n = got;
    return DI_OK;
}
