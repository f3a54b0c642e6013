/*
 * config_json.c -- typed access to config.json fields (see config_json.h).
 */
#include "io/config_json.h"

/* A field is absent if the key is missing or its value is null (Python's None). */
const json_t *di_cfg_get(const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

/* Reads an integer field of obj; `where` prefixes nested names ("rope_scaling."). */
di_status di_cfg_int(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                     int64_t dflt, bool required, int64_t *out) {
    const json_t *v = di_cfg_get(obj, key);
    if (!v) {
        if (required)
            return di_error(DI_ERR_CONFIG, "%s: field \"%s%s\" missing", r->path, where, key);
        *out = dflt;
        return DI_OK;
    }
    if (!json_is_integer(v))
        return di_error(DI_ERR_CONFIG, "%s: field \"%s%s\" must be an integer", r->path, where,
                        key);
    *out = (int64_t)json_integer_value(v);
    return DI_OK;
}

di_status di_cfg_real(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                      double dflt, double *out) {
    const json_t *v = di_cfg_get(obj, key);
    if (!v) {
        *out = dflt;
        return DI_OK;
    }
    if (!json_is_number(v))
        return di_error(DI_ERR_CONFIG, "%s: field \"%s%s\" must be a number", r->path, where, key);
    *out = json_number_value(v);
    return DI_OK;
}

di_status di_cfg_bool(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                      bool dflt, bool *out) {
    const json_t *v = di_cfg_get(obj, key);
    if (!v) {
        *out = dflt;
        return DI_OK;
    }
    if (!json_is_boolean(v))
        return di_error(DI_ERR_CONFIG, "%s: field \"%s%s\" must be true or false", r->path, where,
                        key);
    *out = json_is_true(v);
    return DI_OK;
}

/* Reads an optional string field; *out is NULL when absent. */
di_status di_cfg_str(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                     const char **out) {
    const json_t *v = di_cfg_get(obj, key);
    *out = NULL;
    if (!v) return DI_OK;
    if (!json_is_string(v))
        return di_error(DI_ERR_CONFIG, "%s: field \"%s%s\" must be a string", r->path, where, key);
    *out = json_string_value(v);
    return DI_OK;
}

/* Checks lo <= *v <= hi for an integer field, naming it otherwise. */
di_status di_cfg_range(const di_cfg_reader *r, const char *key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return di_error(DI_ERR_CONFIG, "%s: field \"%s\" = %lld is out of range [%lld, %lld]",
                        r->path, key, (long long)v, (long long)lo, (long long)hi);
    return DI_OK;
}

/* bos/eos: an int, a list (the first one counts) or null / absent (-1). */
di_status di_cfg_token(const di_cfg_reader *r, const char *key, int32_t *out) {
    const json_t *v = di_cfg_get(r->root, key);
    if (json_is_array(v)) v = json_array_size(v) ? json_array_get(v, 0) : NULL;
    *out = -1;
    if (!v || json_is_null(v)) return DI_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return di_error(DI_ERR_CONFIG,
                        "%s: field \"%s\" must be a token id, a list of them or "
                        "null",
                        r->path, key);
    *out = (int32_t)json_integer_value(v);
    return DI_OK;
}
