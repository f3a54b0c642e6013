/*
 * safetensors.c -- memory-mapped safetensors checkpoints (see safetensors.h).
 *
 * Design stance:
 *   - The header is untrusted input. Each file's header is parsed and fully validated
 *     before its tensors join the set; a set that is handed out has only valid views.
 *   - Start-up touches only the headers: the data section is mapped but never read here,
 *     so opening a 700 GB checkpoint costs a few page faults per shard.
 *   - No madvise: the kernel's default readahead suits the loader's mostly sequential
 *     reads, and MADV_WILLNEED on a checkpoint larger than RAM would only evict useful
 *     pages. Callers that know their access pattern can advise per tensor.
 *   - One parser for mapped files and in-memory images (di_st_parse_buffer), so the fuzzer
 *     exercises exactly the code real checkpoints go through.
 *
 * Invariants of a di_st_set handed to a caller:
 *   - every tensor's [data, data + nbytes) lies inside its file's data section, nbytes equals
 *     di_dtype_bytes(dtype, numel), and no two non-empty tensors of a file overlap;
 *   - tensor names are unique across the whole set (the hash table relies on it);
 *   - tensors are ordered by file, then by offset inside the file (sequential reads).
 * Views are not aligned in general: safetensors only promises byte offsets.
 */
#define _POSIX_C_SOURCE 200809L
#include "io/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER_LEN ((uint64_t)100 * 1024 * 1024)
#define ST_INDEX_NAME     "model.safetensors.index.json"

typedef struct st_file {
    char *path;          /* owned; used in error messages */
    const uint8_t *base; /* whole file image */
    size_t len;
    bool mapped; /* true: munmap(base, len) on close; false: caller's buffer */
} st_file;

struct di_st_set {
    st_file *files; /* owned, n_files entries */
    int32_t n_files;
    di_st_tensor *tensors; /* owned, n_tensors entries; names owned too */
    int64_t n_tensors, cap_tensors;
    int64_t *slots; /* open-addressing hash table of tensor indices, -1 = empty */
    size_t n_slots; /* power of two, >= 2 x n_tensors */
};

/* ---------------------------------------------------------------------------------------- */
/* Set lifetime                                                                               */
/* ---------------------------------------------------------------------------------------- */

static di_st_set *st_set_new(void) {
    return di_calloc(1, sizeof(di_st_set));
}

void di_st_close(di_st_set *set) {
    if (!set) return;
    for (int32_t i = 0; i < set->n_files; i++) {
        if (set->files[i].mapped) munmap((void *)set->files[i].base, set->files[i].len);
        di_free(set->files[i].path);
    }
    for (int64_t i = 0; i < set->n_tensors; i++)
        di_free((void *)set->tensors[i].name);
    di_free(set->files);
    di_free(set->tensors);
    di_free(set->slots);
    di_free(set);
}

/* Registers a file image; on success the set owns the mapping (if any). */
static di_status st_add_file(di_st_set *set, const char *path, const void *base, size_t len,
                             bool mapped, int32_t *index) {
    st_file *files = di_realloc(set->files, (size_t)(set->n_files + 1) * sizeof(st_file));
    if (!files) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    set->files = files;
    char *p = di_strdup(path);
    if (!p) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    files[set->n_files] = (st_file){p, base, len, mapped};
    *index = set->n_files++;
    return DI_OK;
}

static di_status st_push_tensor(di_st_set *set, const di_st_tensor *t, const char *path) {
    if (set->n_tensors == set->cap_tensors) {
        int64_t cap = set->cap_tensors ? 2 * set->cap_tensors : 64;
        di_st_tensor *n = di_realloc(set->tensors, (size_t)cap * sizeof(di_st_tensor));
        if (!n) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        set->tensors = n;
        set->cap_tensors = cap;
    }
    set->tensors[set->n_tensors++] = *t;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Header validation                                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Reads a JSON integer >= 0; false if it is not one. */
static bool st_json_uint(const json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (int64_t)json_integer_value(v);
    return true;
}

static di_status st_parse_dtype(const json_t *desc, const char *path, const char *name,
                                di_dtype *out) {
    const json_t *v = json_object_get(desc, "dtype");
    if (!json_is_string(v))
        return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\": \"dtype\" missing or not a string", path,
                        name);
    if (di_dtype_parse(json_string_value(v), out) != 0)
        return di_error(DI_ERR_UNSUPPORTED, "%s: tensor \"%s\": unsupported dtype \"%s\"", path,
                        name, json_string_value(v));
    return DI_OK;
}

/* Shape: at most DI_ST_MAX_DIMS non-negative dims whose product (and its size in bits)
 * fits comfortably in 64 bits. */
static di_status st_parse_shape(const json_t *desc, const char *path, const char *name,
                                di_st_tensor *t, int64_t *numel) {
    const json_t *shape = json_object_get(desc, "shape");
    if (!json_is_array(shape))
        return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\": \"shape\" missing or not an array", path,
                        name);
    size_t nd = json_array_size(shape);
    if (nd > DI_ST_MAX_DIMS)
        return di_error(DI_ERR_UNSUPPORTED, "%s: tensor \"%s\": %zu dimensions (at most %d)", path,
                        name, nd, DI_ST_MAX_DIMS);
    const int64_t limit = INT64_MAX / 64; /* numel x 64 bits must not overflow */
    int64_t n = 1;
    for (size_t i = 0; i < nd; i++) {
        int64_t d;
        if (!st_json_uint(json_array_get(shape, i), &d))
            return di_error(DI_ERR_FORMAT,
                            "%s: tensor \"%s\": shape[%zu] is not a non-negative integer", path,
                            name, i);
        if (d != 0 && n > limit / d)
            return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", path, name);
        n *= d;
        t->shape[i] = d;
    }
    t->ndim = (int32_t)nd;
    *numel = n;
    return DI_OK;
}

static di_status st_parse_offsets(const json_t *desc, const char *path, const char *name,
                                  int64_t *begin, int64_t *end) {
    const json_t *offs = json_object_get(desc, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !st_json_uint(json_array_get(offs, 0), begin) ||
        !st_json_uint(json_array_get(offs, 1), end))
        return di_error(DI_ERR_FORMAT,
                        "%s: tensor \"%s\": \"data_offsets\" must be [begin, end] with "
                        "non-negative integers",
                        path, name);
    if (*begin > *end)
        return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%lld, %lld) reversed",
                        path, name, (long long)*begin, (long long)*end);
    return DI_OK;
}

/* Parses one tensor entry of a header; fills t (name not yet set) and its offsets. */
static di_status st_parse_entry(const json_t *desc, const char *path, const char *name,
                                uint64_t data_len, di_st_tensor *t, int64_t *begin) {
    if (!json_is_object(desc))
        return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\": entry is not an object", path, name);
    int64_t numel = 0, end = 0;
    di_status st = st_parse_dtype(desc, path, name, &t->dtype);
    if (st == DI_OK) st = st_parse_shape(desc, path, name, t, &numel);
    if (st == DI_OK) st = st_parse_offsets(desc, path, name, begin, &end);
    if (st != DI_OK) return st;
    if ((uint64_t)end > data_len)
        return di_error(DI_ERR_FORMAT,
                        "%s: tensor \"%s\": data range [%lld, %lld) outside the data section "
                        "(%llu bytes)",
                        path, name, (long long)*begin, (long long)end,
                        (unsigned long long)data_len);
    size_t want = di_dtype_bytes(t->dtype, numel);
    if ((uint64_t)(end - *begin) != (uint64_t)want)
        return di_error(DI_ERR_FORMAT,
                        "%s: tensor \"%s\": data range [%lld, %lld) holds %lld bytes, but %s "
                        "x %lld elements need %zu",
                        path, name, (long long)*begin, (long long)end, (long long)(end - *begin),
                        di_dtype_name(t->dtype), (long long)numel, want);
    t->nbytes = want;
    return DI_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* One file image -> tensors                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int st_cmp_offset(const void *pa, const void *pb) {
    const di_st_tensor *a = pa, *b = pb;
    if (a->data != b->data) return (const uint8_t *)a->data < (const uint8_t *)b->data ? -1 : 1;
    if (a->nbytes != b->nbytes) return a->nbytes < b->nbytes ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Tensors [first, n) belong to one file; sort them by offset and reject overlaps. Empty
 * tensors occupy no bytes and cannot overlap anything. */
static di_status st_check_overlaps(di_st_set *set, int64_t first, const char *path) {
    int64_t n = set->n_tensors - first;
    if (n == 0) return DI_OK; /* also: set->tensors may still be NULL */
    di_st_tensor *t = set->tensors + first;
    qsort(t, (size_t)n, sizeof *t, st_cmp_offset);
    const di_st_tensor *prev = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (t[i].nbytes == 0) continue;
        if (prev && (const uint8_t *)t[i].data < (const uint8_t *)prev->data + prev->nbytes)
            return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" overlaps tensor \"%s\"", path,
                            t[i].name, prev->name);
        prev = &t[i];
    }
    return DI_OK;
}

static di_status st_load_header(const st_file *f, json_t **root, const uint8_t **data,
                                uint64_t *data_len) {
    if (f->len < 8)
        return di_error(DI_ERR_FORMAT, "%s: file too short (%zu bytes) for a safetensors header",
                        f->path, f->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->base[i]; /* little-endian u64 */
    if (hlen > ST_MAX_HEADER_LEN)
        return di_error(DI_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", f->path,
                        (unsigned long long)hlen);
    if (hlen > f->len - 8)
        return di_error(DI_ERR_FORMAT,
                        "%s: header length %llu runs past the end of the file "
                        "(%zu bytes)",
                        f->path, (unsigned long long)hlen, f->len);
    json_error_t err;
    /* Duplicate keys would make a tensor's meaning depend on the parser: reject them. */
    *root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!*root)
        return di_error(DI_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", f->path,
                        err.text, err.position);
    if (!json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return di_error(DI_ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    *data = f->base + 8 + hlen;
    *data_len = (uint64_t)f->len - 8 - hlen;
    return DI_OK;
}

static di_status st_add_entry(di_st_set *set, int32_t fi, const char *key, const json_t *desc,
                              const uint8_t *data, uint64_t data_len) {
    const char *path = set->files[fi].path;
    di_st_tensor t = {0};
    int64_t begin = 0;
    di_status st = st_parse_entry(desc, path, key, data_len, &t, &begin);
    if (st != DI_OK) return st;
    t.data = data + begin;
    t.file_index = fi;
    t.name = di_strdup(key);
    if (!t.name) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    st = st_push_tensor(set, &t, path);
    if (st != DI_OK) di_free((void *)t.name);
    return st;
}

/* Parses file fi's header and appends its tensors. On failure the set may hold some of this
 * file's tensors; callers then discard the whole set. */
static di_status st_parse_file(di_st_set *set, int32_t fi) {
    json_t *root = NULL;
    const uint8_t *data = NULL;
    uint64_t data_len = 0;
    di_status st = st_load_header(&set->files[fi], &root, &data, &data_len);
    if (st != DI_OK) return st;
    int64_t first = set->n_tensors;
    const char *key;
    json_t *desc;
    json_object_foreach(root, key, desc) {
        if (strcmp(key, "__metadata__") == 0) continue; /* free-form; nothing we need */
        st = st_add_entry(set, fi, key, desc, data, data_len);
        if (st != DI_OK) break;
    }
    if (st == DI_OK) st = st_check_overlaps(set, first, set->files[fi].path);
    json_decref(root);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Name lookup                                                                                */
/* ---------------------------------------------------------------------------------------- */

static uint64_t st_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Builds the table over all tensors; a name seen twice is an error naming both files. */
static di_status st_build_index(di_st_set *set) {
    size_t n = 16;
    while (n < 2 * (size_t)set->n_tensors)
        n *= 2;
    di_free(set->slots);
    set->slots = di_malloc(n * sizeof(int64_t));
    if (!set->slots) return di_error(DI_ERR_OUT_OF_MEMORY, "safetensors: out of memory");
    set->n_slots = n;
    for (size_t i = 0; i < n; i++)
        set->slots[i] = -1;
    for (int64_t i = 0; i < set->n_tensors; i++) {
        const di_st_tensor *t = &set->tensors[i];
        size_t s = st_hash(t->name) & (n - 1);
        for (; set->slots[s] >= 0; s = (s + 1) & (n - 1)) {
            const di_st_tensor *o = &set->tensors[set->slots[s]];
            if (strcmp(o->name, t->name) == 0)
                return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" is also in %s",
                                set->files[t->file_index].path, t->name,
                                set->files[o->file_index].path);
        }
        set->slots[s] = i;
    }
    return DI_OK;
}

const di_st_tensor *di_st_find(const di_st_set *set, const char *name) {
    if (!set || !set->slots || !name) return NULL;
    size_t mask = set->n_slots - 1;
    for (size_t s = st_hash(name) & mask; set->slots[s] >= 0; s = (s + 1) & mask) {
        const di_st_tensor *t = &set->tensors[set->slots[s]];
        if (strcmp(t->name, name) == 0) return t;
    }
    return NULL;
}

int64_t di_st_count(const di_st_set *set) {
    return set ? set->n_tensors : 0;
}

const di_st_tensor *di_st_at(const di_st_set *set, int64_t i) {
    return set && i >= 0 && i < set->n_tensors ? &set->tensors[i] : NULL;
}

const char *di_st_file_path(const di_st_set *set, int32_t file_index) {
    return set && file_index >= 0 && file_index < set->n_files ? set->files[file_index].path : "?";
}

int64_t di_st_numel(const di_st_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* ---------------------------------------------------------------------------------------- */
/* Buffers and mapped files                                                                   */
/* ---------------------------------------------------------------------------------------- */

static di_status st_finish(di_st_set *set, di_status st, di_st_set **out) {
    if (st == DI_OK && !set->slots) st = st_build_index(set);
    if (st != DI_OK) {
        di_st_close(set);
        return st;
    }
    *out = set;
    return DI_OK;
}

di_status di_st_parse_buffer(const void *file, size_t file_len, const char *name, di_st_set **out) {
    *out = NULL;
    if (!file && file_len) return di_error(DI_ERR_INVALID_ARG, "%s: NULL buffer", name);
    di_st_set *set = st_set_new();
    if (!set) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", name);
    int32_t fi;
    di_status st = st_add_file(set, name, file, file_len, false, &fi);
    if (st == DI_OK) st = st_parse_file(set, fi);
    return st_finish(set, st, out);
}

/* Maps a whole file read-only; MAP_PRIVATE so that nothing we do can reach the file. */
static di_status st_map(const char *path, const void **base, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return di_error(DI_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return di_error(DI_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) { /* also avoids mmap of length 0, which fails */
        close(fd);
        return di_error(DI_ERR_FORMAT,
                        "%s: file too short (%lld bytes) for a safetensors "
                        "header",
                        path, (long long)sb.st_size);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd); /* the mapping keeps the file alive */
    if (p == MAP_FAILED) return di_error(DI_ERR_IO, "%s: mmap failed: %s", path, strerror(err));
    *base = p;
    *len = (size_t)sb.st_size;
    return DI_OK;
}

/* Maps and parses one file into the set. */
static di_status st_open_into(di_st_set *set, const char *path, int32_t *index) {
    const void *base = NULL;
    size_t len = 0;
    di_status st = st_map(path, &base, &len);
    if (st != DI_OK) return st;
    int32_t fi;
    st = st_add_file(set, path, base, len, true, &fi);
    if (st != DI_OK) {
        munmap((void *)base, len);
        return st;
    }
    if (index) *index = fi;
    return st_parse_file(set, fi);
}

di_status di_st_open_file(const char *path, di_st_set **out) {
    *out = NULL;
    di_st_set *set = st_set_new();
    if (!set) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    return st_finish(set, st_open_into(set, path, NULL), out);
}

/* ---------------------------------------------------------------------------------------- */
/* Folders: index.json or every *.safetensors                                                 */
/* ---------------------------------------------------------------------------------------- */

static int st_cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void st_free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++)
        di_free(names[i]);
    di_free(names);
}

/* Appends a copy of s to a growable array. */
static bool st_names_push(char ***names, size_t *n, const char *s) {
    char **g = di_realloc(*names, (*n + 1) * sizeof(char *));
    if (!g) return false;
    *names = g;
    if (!(g[*n] = di_strdup(s))) return false;
    (*n)++;
    return true;
}

static bool st_has_suffix(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Opens the files of `names` (relative to dir), in the given order. */
static di_status st_open_files(di_st_set *set, const char *dir, char **names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char *path = di_path_join(dir, names[i]);
        if (!path) return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        di_status st = st_open_into(set, path, NULL);
        di_free(path);
        if (st != DI_OK) return st;
    }
    return DI_OK;
}

static di_status st_list_dir(const char *dir, char ***names, size_t *n) {
    DIR *d = opendir(dir);
    if (!d) return di_error(DI_ERR_IO, "%s: cannot open folder: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !st_has_suffix(e->d_name, ".safetensors")) continue;
        if (!st_names_push(names, n, e->d_name)) {
            closedir(d);
            return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
        }
    }
    closedir(d);
    if (*n == 0)
        return di_error(DI_ERR_NOT_FOUND, "%s: no *.safetensors files and no %s", dir,
                        ST_INDEX_NAME);
    qsort(*names, *n, sizeof(char *), st_cmp_str); /* readdir order is arbitrary */
    return DI_OK;
}

/* Collects the distinct shard names of weight_map, sorted. Shard names must be plain file
 * names: an index must not point outside its folder. */
static di_status st_index_shards(const json_t *map, const char *ipath, char ***names, size_t *n) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        if (!json_is_string(v))
            return di_error(DI_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a string", ipath, key);
        const char *s = json_string_value(v);
        if (!s[0] || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
            return di_error(DI_ERR_FORMAT, "%s: weight_map[\"%s\"]: bad shard name \"%s\"", ipath,
                            key, s);
        bool seen = false;
        for (size_t i = 0; i < *n && !seen; i++)
            seen = strcmp((*names)[i], s) == 0;
        if (!seen && !st_names_push(names, n, s))
            return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", ipath);
    }
    qsort(*names, *n, sizeof(char *), st_cmp_str);
    return DI_OK;
}

/* Every tensor the index names must be in the shard the index names. */
static di_status st_check_index(const di_st_set *set, const json_t *map, const char *ipath) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)map, key, v) {
        const char *shard = json_string_value(v);
        const di_st_tensor *t = di_st_find(set, key);
        if (!t)
            return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" listed in %s is missing", shard, key,
                            ipath);
        const char *actual = set->files[t->file_index].path;
        size_t a = strlen(actual), b = strlen(shard);
        if (a <= b || strcmp(actual + a - b, shard) != 0 || actual[a - b - 1] != '/')
            return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" is in %s, not in %s", ipath, key,
                            actual, shard);
    }
    return DI_OK;
}

static di_status st_load_index(const char *ipath, json_t **root, json_t **map) {
    char *text;
    size_t len;
    di_status st = di_read_file(ipath, &text, &len);
    if (st != DI_OK) return st;
    json_error_t err;
    *root = json_loadb(text, len, 0, &err);
    di_free(text);
    if (!*root)
        return di_error(DI_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", ipath, err.text,
                        err.line);
    *map = json_object_get(*root, "weight_map");
    if (!json_is_object(*map))
        return di_error(DI_ERR_FORMAT, "%s: \"weight_map\" missing or not an object", ipath);
    return DI_OK;
}

static di_status st_open_indexed(di_st_set *set, const char *dir, const char *ipath) {
    json_t *root = NULL, *map = NULL;
    char **names = NULL;
    size_t n = 0;
    di_status st = st_load_index(ipath, &root, &map);
    if (st == DI_OK) st = st_index_shards(map, ipath, &names, &n);
    if (st == DI_OK) st = st_open_files(set, dir, names, n);
    if (st == DI_OK) st = st_build_index(set);
    if (st == DI_OK) st = st_check_index(set, map, ipath);
    st_free_names(names, n);
    json_decref(root);
    return st;
}

di_status di_st_open_dir(const char *dir, di_st_set **out) {
    *out = NULL;
    di_st_set *set = st_set_new();
    char *ipath = di_path_join(dir, ST_INDEX_NAME);
    if (!set || !ipath) {
        di_free(set);
        di_free(ipath);
        return di_error(DI_ERR_OUT_OF_MEMORY, "%s: out of memory", dir);
    }
    di_status st;
    if (access(ipath, F_OK) == 0) {
        st = st_open_indexed(set, dir, ipath);
    } else {
        char **names = NULL;
        size_t n = 0;
        st = st_list_dir(dir, &names, &n);
        if (st == DI_OK) st = st_open_files(set, dir, names, n);
        st_free_names(names, n);
    }
    di_free(ipath);
    return st_finish(set, st, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Helpers for the model loaders                                                              */
/* ---------------------------------------------------------------------------------------- */

const char *di_st_file_name(const di_st_set *set, const di_st_tensor *t) {
    const char *path = di_st_file_path(set, t->file_index);
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void fmt_shape(char *buf, size_t cap, int32_t ndim, const int64_t *dims) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

di_status di_st_check_shape(const di_st_set *set, const di_st_tensor *t, int32_t ndim,
                            const int64_t *dims) {
    bool ok = t->ndim == ndim;
    for (int32_t i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == dims[i];
    if (ok) return DI_OK;
    char have[128], want[128];
    fmt_shape(have, sizeof have, t->ndim, t->shape);
    fmt_shape(want, sizeof want, ndim, dims);
    return di_error(DI_ERR_FORMAT, "%s: tensor \"%s\" has shape %s, expected %s",
                    di_st_file_name(set, t), t->name, have, want);
}

di_status di_st_to_float(const di_st_set *set, const di_st_tensor *t, int64_t n, float *out) {
    const unsigned char *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        switch (t->dtype) {
        case DI_DTYPE_F32:
            memcpy(&out[i], src + 4 * i, 4);
            break;
        case DI_DTYPE_BF16:
            memcpy(&h, src + 2 * i, 2);
            out[i] = di_bf16_to_f32(h);
            break;
        case DI_DTYPE_F16:
            memcpy(&h, src + 2 * i, 2);
            out[i] = di_f16_to_f32(h);
            break;
        case DI_DTYPE_F8_E8M0:
            out[i] = di_e8m0_to_f32(src[i]);
            break;
        default:
            return di_error(DI_ERR_FORMAT,
                            "%s: tensor \"%s\" has dtype %s, expected F32, BF16 or F16",
                            di_st_file_name(set, t), t->name, di_dtype_name(t->dtype));
        }
    }
    return DI_OK;
}
