/*
 * cmd_info.c -- `deepinfer info`: describes a checkpoint from di_model_get_info():
 * architecture, sizes, parameter counts, stored dtypes and memory needs. Human-readable by
 * default; --format json prints one JSON object whose keys are the di_model_info fields.
 * `info --devices` instead lists the backends compiled in and the CUDA devices found.
 */
#include "args.h"
#include "commands.h"

#include <jansson.h>
#include <stdio.h>

static const char *const k_usage =
    "usage: deepinfer info [--model DIR] [--format text|json] [--threads N] [--device D]\n"
    "       deepinfer info --devices [--format text|json]\n"
    "\n"
    "Describes a checkpoint: architecture, family, layers, hidden size, vocabulary, context,\n"
    "parameter counts (total, active per token, MTP), stored dtypes, weight and KV-cache bytes.\n"
    "\n"
    "options:\n"
    "  --model DIR      checkpoint folder (config.json + *.safetensors);\n"
    "                   default: the bundled model (models/deepseek-v4-tiny)\n"
    "  --format FMT     text (default) or json (one JSON object on stdout)\n"
    "  --threads N      compute threads; 0 = all cores (default)\n"
    "  --device D       " CLI_DEVICE_HELP "\n"
    "  --devices        list the backends compiled in and the CUDA devices found\n"
    "                   (name, memory, compute capability), or say there is none\n"
    "  -h, --help       show this help\n"
    "\n"
    "exit status: 0 ok, 1 the model could not be loaded, 2 bad command line\n";

#define GIB (1024.0 * 1024.0 * 1024.0)

/* 15706484224 -> "15.71 B"; small counts stay exact. */
static void format_count(int64_t n, char *buf, size_t size) {
    if (n >= 1000000000)
        snprintf(buf, size, "%.2f B", (double)n / 1e9);
    else if (n >= 1000000)
        snprintf(buf, size, "%.2f M", (double)n / 1e6);
    else if (n >= 1000)
        snprintf(buf, size, "%.2f K", (double)n / 1e3);
    else
        snprintf(buf, size, "%lld", (long long)n);
}

/* 1037200 -> "1012.89 KiB": the largest binary unit that keeps the number >= 1. */
static void format_bytes(double bytes, char *buf, size_t size) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, size, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
}

static void print_text(const di_model_info *in) {
    char total[32], active[32], mtp[32];
    format_count(in->n_params_total, total, sizeof total);
    format_count(in->n_params_active, active, sizeof active);
    format_count(in->n_params_mtp, mtp, sizeof mtp);
    printf("architecture     %s\n", in->architecture);
    printf("family           %s\n", in->family);
    printf("layers           %lld\n", (long long)in->n_layers);
    printf("hidden size      %lld\n", (long long)in->hidden_size);
    printf("vocabulary       %lld\n", (long long)in->vocab_size);
    printf("context          %lld tokens\n", (long long)in->max_context);
    printf("parameters       %s total, %s active per token, %s MTP\n", total, active, mtp);
    printf("stored dtypes    %s\n", in->dtypes);
    char weights[32], kv_full[32];
    format_bytes((double)in->weight_bytes, weights, sizeof weights);
    format_bytes((double)in->kv_bytes_per_token * (double)in->max_context, kv_full, sizeof kv_full);
    printf("weights          %s (%lld bytes)\n", weights, (long long)in->weight_bytes);
    printf("kv cache         %lld bytes per token (%s at full context)\n",
           (long long)in->kv_bytes_per_token, kv_full);
    if (in->kv_fixed_bytes > 0) {
        char fixed[32];
        format_bytes((double)in->kv_fixed_bytes, fixed, sizeof fixed);
        printf("kv fixed         %s per sequence (bounded window state, any context)\n", fixed);
    }
    if (in->kv_by_layer_type[0]) printf("kv by layer type %s\n", in->kv_by_layer_type);
    printf("bos / eos ids    %d / %d\n", (int)in->bos_token_id, (int)in->eos_token_id);
}

static int print_json(const char *cmd, const di_model_info *in) {
    json_t *o = json_object();
    json_object_set_new(o, "architecture", json_string(in->architecture));
    json_object_set_new(o, "family", json_string(in->family));
    json_object_set_new(o, "n_layers", json_integer(in->n_layers));
    json_object_set_new(o, "hidden_size", json_integer(in->hidden_size));
    json_object_set_new(o, "vocab_size", json_integer(in->vocab_size));
    json_object_set_new(o, "max_context", json_integer(in->max_context));
    json_object_set_new(o, "n_params_total", json_integer(in->n_params_total));
    json_object_set_new(o, "n_params_active", json_integer(in->n_params_active));
    json_object_set_new(o, "n_params_mtp", json_integer(in->n_params_mtp));
    json_object_set_new(o, "dtypes", json_string(in->dtypes));
    json_object_set_new(o, "weight_bytes", json_integer(in->weight_bytes));
    json_object_set_new(o, "weight_gib", json_real((double)in->weight_bytes / GIB));
    json_object_set_new(o, "kv_bytes_per_token", json_integer(in->kv_bytes_per_token));
    json_object_set_new(o, "kv_fixed_bytes", json_integer(in->kv_fixed_bytes));
    json_object_set_new(o, "kv_by_layer_type", json_string(in->kv_by_layer_type));
    json_object_set_new(o, "bos_token_id", json_integer(in->bos_token_id));
    json_object_set_new(o, "eos_token_id", json_integer(in->eos_token_id));
    int rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (rc != 0) return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write JSON to stdout");
    putchar('\n');
    return CLI_EXIT_OK;
}

#define INFO_MAX_DEVICES 64

/* `info --devices`: the backends compiled in, then the CUDA devices or why there is none
 * (that is not an error: the exit status is 0). */
static int print_devices(const char *cmd, bool json) {
    di_device_info dev[INFO_MAX_DEVICES];
    int32_t n = 0;
    di_status st = di_cuda_devices(dev, INFO_MAX_DEVICES, &n);
    const char *why = st ? di_last_error() : "";
    n = n < INFO_MAX_DEVICES ? n : INFO_MAX_DEVICES;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        json_object_set_new(o, "backends", json_string(di_backends_compiled()));
        for (int32_t i = 0; i < n; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "index", json_integer(i));
            json_object_set_new(d, "name", json_string(dev[i].name));
            json_object_set_new(d, "memory_bytes", json_integer(dev[i].memory_bytes));
            char cc[32];
            snprintf(cc, sizeof cc, "%d.%d", (int)dev[i].cc_major, (int)dev[i].cc_minor);
            json_object_set_new(d, "compute_capability", json_string(cc));
            json_array_append_new(arr, d);
        }
        json_object_set_new(o, "cuda_devices", arr);
        if (st) json_object_set_new(o, "cuda_note", json_string(why));
        int rc = json_dumpf(o, stdout, JSON_PRESERVE_ORDER);
        json_decref(o);
        if (rc != 0) return cli_error(CLI_EXIT_FAILURE, cmd, "cannot write JSON to stdout");
        putchar('\n');
        return CLI_EXIT_OK;
    }
    printf("backends         %s\n", di_backends_compiled());
    if (st) printf("cuda devices     none: %s\n", why);
    for (int32_t i = 0; i < n; i++)
        printf("cuda:%-11d %s, %.1f GiB, compute capability %d.%d\n", (int)i, dev[i].name,
               (double)dev[i].memory_bytes / GIB, (int)dev[i].cc_major, (int)dev[i].cc_minor);
    return CLI_EXIT_OK;
}

int cmd_info(int argc, char **argv) {
    const char *cmd = "info";
    const char *model_dir = NULL, *format = "text", *device = NULL;
    int64_t threads = 0;
    bool devices = false;
    const cli_opt opts[] = {
        {"model", CLI_OPT_STRING, &model_dir, 0, 0}, {"format", CLI_OPT_STRING, &format, 0, 0},
        {"threads", CLI_OPT_INT, &threads, 0, 4096}, {"device", CLI_OPT_STRING, &device, 0, 0},
        {"devices", CLI_OPT_FLAG, &devices, 0, 0},
    };
    int rc = cli_parse(cmd, k_usage, opts, (int)CLI_LEN(opts), argc, argv);
    if (rc != CLI_CONTINUE) return rc;
    bool json;
    if ((rc = cli_parse_format(cmd, format, &json)) != CLI_CONTINUE) return rc;
    if (devices) return print_devices(cmd, json);
    if (!(model_dir = cli_model_dir(cmd, model_dir))) return CLI_EXIT_USAGE;

    di_model *model;
    di_model_info info;
    rc = cli_load_model(cmd, model_dir, device, threads, &model, &info);
    if (rc != CLI_CONTINUE) return rc;
    rc = CLI_EXIT_OK;
    if (json)
        rc = print_json(cmd, &info);
    else
        print_text(&info);
    di_model_free(model);
    return rc;
}
