/*
 * cmd_tokenize.c -- `deepinfer tokenize` and `deepinfer detokenize`.
 *
 *   tokenize (--tokenizer FILE.json | --model DIR) (--text T | --file F) [--add-special]
 *       prints the ids space-separated on one line.
 *   tokenize (--tokenizer FILE.json | --model DIR) --jsonl F [--add-special]
 *       reads one {"text": ...} per line, prints one JSON array of ids per line, in order.
 *   detokenize (--tokenizer FILE.json | --model DIR) --ids "1 2 3" [--skip-special]
 *       prints the text exactly, with no newline added.
 *
 * Output is built in memory and written only on success, so a failing command leaves stdout
 * empty (the convention of every command, see args.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "commands.h"
#include "ids.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
} outbuf;

static bool out_add(outbuf *o, const char *s, size_t n) {
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 4096;
        while (cap < o->n + n + 1)
            cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) return false;
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    return true;
}

static int load_tok(const char *cmd, const char *file, const char *dir, di_tokenizer **t) {
    if (!file == !dir) return cli_error(2, cmd, "give exactly one of --tokenizer and --model");
    di_status st = di_tokenizer_load(file ? file : dir, t);
    return st == DI_OK ? CLI_CONTINUE : cli_lib_error(cmd, st);
}

/* Encodes text and appends the ids, separated by sep, to o. */
static int encode_into(const char *cmd, const di_tokenizer *t, const char *text, size_t len,
                       bool special, const char *sep, outbuf *o) {
    cli_ids ids;
    di_status st = cli_ids_encode(t, text, len, special, &ids);
    if (st != DI_OK)
        return cli_error(1, cmd, "encoding failed: %s",
                         st == DI_ERR_OUT_OF_MEMORY ? "out of memory" : di_last_error());
    char num[16];
    bool ok = true;
    for (int64_t i = 0; i < ids.n && ok; i++) {
        int k = snprintf(num, sizeof num, "%s%d", i ? sep : "", ids.v[i]);
        ok = out_add(o, num, (size_t)k);
    }
    cli_ids_free(&ids);
    return ok ? CLI_CONTINUE : cli_error(1, cmd, "out of memory");
}

static int read_all(const char *cmd, const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return cli_error(1, cmd, "%s: %s", path, strerror(errno));
    outbuf o = {0};
    char chunk[65536];
    size_t k;
    bool ok = true;
    while (ok && (k = fread(chunk, 1, sizeof chunk, f)) > 0)
        ok = out_add(&o, chunk, k);
    fclose(f);
    if (!ok) return cli_error(1, cmd, "out of memory");
    *buf = o.p ? o.p : calloc(1, 1);
    *len = o.n;
    return CLI_CONTINUE;
}

static int tokenize_jsonl(const char *cmd, const di_tokenizer *t, const char *path, bool special,
                          outbuf *o) {
    FILE *f = fopen(path, "rb");
    if (!f) return cli_error(1, cmd, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = CLI_CONTINUE;
    ssize_t got;
    while (rc == CLI_CONTINUE && (got = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t err;
        json_t *row = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, &err);
        json_t *text = json_object_get(row, "text");
        if (!json_is_string(text)) {
            rc = cli_error(1, cmd, "%s: line %ld: expected {\"text\": \"...\"}%s%s", path, lineno,
                           row ? "" : ": ", row ? "" : err.text);
        } else if (!out_add(o, "[", 1)) {
            rc = cli_error(1, cmd, "out of memory");
        } else if ((rc = encode_into(cmd, t, json_string_value(text), json_string_length(text),
                                     special, ",", o)) == CLI_CONTINUE) {
            if (!out_add(o, "]\n", 2)) rc = cli_error(1, cmd, "out of memory");
        }
        json_decref(row);
    }
    free(line);
    fclose(f);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize";
    const char *file = NULL, *dir = NULL, *text = NULL, *in_file = NULL, *jsonl = NULL;
    bool special = false;
    const cli_opt opts[] = {
        {"tokenizer", CLI_OPT_STRING, &file, 0, 0}, {"model", CLI_OPT_STRING, &dir, 0, 0},
        {"text", CLI_OPT_STRING, &text, 0, 0},      {"file", CLI_OPT_STRING, &in_file, 0, 0},
        {"jsonl", CLI_OPT_STRING, &jsonl, 0, 0},    {"add-special", CLI_OPT_FLAG, &special, 0, 0},
    };
    const char *usage =
        "usage: deepinfer tokenize (--tokenizer FILE.json | --model DIR)\n"
        "                          (--text T | --file F | --jsonl F) [--add-special]\n"
        "  --text/--file: prints the token ids space-separated on one line.\n"
        "  --jsonl F: one {\"text\": ...} per line; prints one JSON array of ids per line.\n"
        "  --add-special: add BOS/EOS as the tokenizer's post-processor (or the model\n"
        "                 folder's tokenizer_config.json) says.\n";
    int rc = cli_parse(cmd, usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if ((text != NULL) + (in_file != NULL) + (jsonl != NULL) != 1)
        return cli_error(2, cmd, "give exactly one of --text, --file and --jsonl");
    di_tokenizer *t = NULL;
    if ((rc = load_tok(cmd, file, dir, &t)) != CLI_CONTINUE) return rc;
    outbuf o = {0};
    char *buf = NULL;
    size_t len = 0;
    if (jsonl) {
        rc = tokenize_jsonl(cmd, t, jsonl, special, &o);
    } else {
        if (in_file) rc = read_all(cmd, in_file, &buf, &len);
        if (rc == CLI_CONTINUE)
            rc = encode_into(cmd, t, in_file ? buf : text, in_file ? len : strlen(text), special,
                             " ", &o);
        if (rc == CLI_CONTINUE && !out_add(&o, "\n", 1)) rc = cli_error(1, cmd, "out of memory");
    }
    if (rc == CLI_CONTINUE) {
        fwrite(o.p, 1, o.n, stdout);
        rc = fflush(stdout) == 0 ? 0 : cli_error(1, cmd, "cannot write the output");
    }
    free(buf);
    free(o.p);
    di_tokenizer_free(t);
    return rc;
}

/* Parses "1 2 3" (spaces, commas or tabs between ids). */
static int parse_ids(const char *cmd, const char *s, int32_t **ids, int64_t *n) {
    size_t cap = strlen(s) / 2 + 1;
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids) return cli_error(1, cmd, "out of memory");
    for (const char *p = s; *p;) {
        if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX ||
            (*end && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n'))
            return cli_error(2, cmd, "--ids: \"%.20s\" is not a token id", p);
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return CLI_CONTINUE;
}

int cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize";
    const char *file = NULL, *dir = NULL, *ids_s = NULL;
    bool skip = false;
    const cli_opt opts[] = {
        {"tokenizer", CLI_OPT_STRING, &file, 0, 0},
        {"model", CLI_OPT_STRING, &dir, 0, 0},
        {"ids", CLI_OPT_STRING, &ids_s, 0, 0},
        {"skip-special", CLI_OPT_FLAG, &skip, 0, 0},
    };
    const char *usage =
        "usage: deepinfer detokenize (--tokenizer FILE.json | --model DIR) --ids \"1 2 3\"\n"
        "                            [--skip-special]\n"
        "  prints the decoded text exactly (no newline is added).\n";
    int rc = cli_parse(cmd, usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    if (!ids_s) return cli_missing(cmd, "--ids");
    int32_t *ids = NULL;
    int64_t n = 0;
    di_tokenizer *t = NULL;
    if ((rc = parse_ids(cmd, ids_s, &ids, &n)) == CLI_CONTINUE &&
        (rc = load_tok(cmd, file, dir, &t)) == CLI_CONTINUE) {
        int64_t need = di_tokenizer_decode(t, ids, n, skip, NULL, 0);
        need = need == DI_TOK_ERROR ? -1 : -need;
        char *out = malloc((size_t)(need > 0 ? need : 1));
        if (need < 0 || !out || di_tokenizer_decode(t, ids, n, skip, out, need) != need) {
            rc = cli_error(1, cmd, "decoding failed: %s", di_last_error());
        } else {
            fwrite(out, 1, (size_t)need, stdout);
            rc = fflush(stdout) == 0 ? 0 : cli_error(1, cmd, "cannot write the output");
        }
        free(out);
    }
    free(ids);
    di_tokenizer_free(t);
    return rc;
}
