/*
 * config_json.h -- typed access to config.json fields, shared by the V2/V3 parser (config.c)
 * and the V4 parser (config_v4.c).
 *
 * A field is absent when its key is missing or its value is null (Python's None). Errors name
 * the file and the field, with `where` prefixing nested names ("rope_scaling.").
 */
#ifndef DI_CONFIG_JSON_H
#define DI_CONFIG_JSON_H

#include "core/core.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct di_cfg_reader {
    const json_t *root;
    const char *path; /* for error messages */
} di_cfg_reader;

const json_t *di_cfg_get(const json_t *obj, const char *key);
di_status di_cfg_int(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                     int64_t dflt, bool required, int64_t *out);
di_status di_cfg_real(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                      double dflt, double *out);
di_status di_cfg_bool(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                      bool dflt, bool *out);
/* An optional string field; *out is NULL when absent. */
di_status di_cfg_str(const di_cfg_reader *r, const json_t *obj, const char *where, const char *key,
                     const char **out);
/* lo <= v <= hi for an integer field, naming it otherwise. */
di_status di_cfg_range(const di_cfg_reader *r, const char *key, int64_t v, int64_t lo, int64_t hi);
/* A token id field of the root: an integer, a list (its first element) or null (-1). */
di_status di_cfg_token(const di_cfg_reader *r, const char *key, int32_t *out);

#endif /* DI_CONFIG_JSON_H */
