/*
 * deepinfer.h -- the one public header of deepinfer, an inference engine for DeepSeek's
 * Mixture-of-Experts language models.
 *
 * Design stance:
 *   - Opaque handles; plain-old-data parameter structs with *_default_params() constructors.
 *   - Every call that can fail returns a di_status. On failure, di_last_error() returns a
 *     message a user can act on (it names the file, tensor, field or argument), and the
 *     objects passed in are left as they were.
 *   - Whatever the library allocates, the library frees (di_*_free).
 *   - Functions that fill a caller's buffer return the count written, or -needed when the
 *     buffer is too small.
 *   - Sized integer types: int32_t token ids, int64_t counts and sizes.
 */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DI_BUILDING_LIBRARY)
#define DI_API __attribute__((visibility("default")))
#else
#define DI_API
#endif

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* One X-macro generates the enum and di_status_str(). */
#define DI_STATUS_LIST(X)                                                                      \
    X(DI_OK, "ok")                                                                             \
    X(DI_ERR_INVALID_ARG, "invalid argument")                                                  \
    X(DI_ERR_IO, "i/o error")                                                                  \
    X(DI_ERR_FORMAT, "malformed file")                                                         \
    X(DI_ERR_CONFIG, "invalid model configuration")                                            \
    X(DI_ERR_UNSUPPORTED, "unsupported")                                                       \
    X(DI_ERR_OUT_OF_MEMORY, "out of memory")                                                   \
    X(DI_ERR_NOT_FOUND, "not found")                                                           \
    X(DI_ERR_RANGE, "value out of range")                                                      \
    X(DI_ERR_INTERNAL, "internal error")

typedef enum {
#define DI_STATUS_ENUM_(name, str) name,
    DI_STATUS_LIST(DI_STATUS_ENUM_)
#undef DI_STATUS_ENUM_
        DI_STATUS_COUNT_
} di_status;

DI_API const char *di_status_str(di_status s);

/* The message of the last failure on the calling thread ("" if none). */
DI_API const char *di_last_error(void);

/* ---------------------------------------------------------------------------------------- */
/* Logging and allocation hooks                                                               */
/* ---------------------------------------------------------------------------------------- */

typedef enum { DI_LOG_DEBUG, DI_LOG_INFO, DI_LOG_WARN, DI_LOG_ERROR } di_log_level;
typedef void (*di_log_fn)(di_log_level level, const char *msg, void *user);

/* Replaces the log sink (default: stderr, level >= DI_LOG_WARN). fn == NULL restores it. */
DI_API void di_set_log(di_log_fn fn, void *user, di_log_level min_level);

typedef struct di_allocator {
    void *(*malloc_fn)(size_t size, void *user);
    void *(*realloc_fn)(void *p, size_t size, void *user);
    void (*free_fn)(void *p, void *user);
    void *user;
} di_allocator;

/* Replaces the allocator used for the library's own (non-mmap) allocations. Call before
 * creating any object; NULL restores the libc allocator. */
DI_API void di_set_allocator(const di_allocator *a);

/* Frees memory the library returned to the caller (e.g. from di_detokenize_alloc). */
DI_API void di_free(void *p);

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                     */
/* ---------------------------------------------------------------------------------------- */

typedef struct di_model di_model;

typedef struct di_model_params {
    int32_t n_threads; /* compute threads; <= 0 means all online cores */
    bool verbose;      /* log loading progress at INFO level */
    /* Where the model runs: NULL or "cpu" (default), "cuda" (device 0) or "cuda:N". A CUDA
     * model keeps one device copy of its weights; its contexts and engines run on that
     * device (each with its own stream) and return logits in host memory as on the CPU.
     * Without a CUDA device (or in a build without CUDA) loading fails with
     * DI_ERR_UNSUPPORTED ("no CUDA device"). DeepSeek-V2/V3 and V4 run on CUDA. */
    const char *device;
} di_model_params;

DI_API di_model_params di_model_default_params(void);

/* Backends compiled into this library: "cpu" or "cpu cuda". */
DI_API const char *di_backends_compiled(void);

typedef struct di_device_info {
    char name[256];
    int64_t memory_bytes;
    int32_t cc_major, cc_minor; /* compute capability */
} di_device_info;

/* The CUDA devices present: *n = their count, out[0 .. min(*n, cap)) filled. Fails with
 * DI_ERR_UNSUPPORTED ("no CUDA device: <why>") when there is none or the build has no
 * CUDA. */
DI_API di_status di_cuda_devices(di_device_info *out, int32_t cap, int32_t *n);

/* Parses a device name as di_model_params.device takes it: NULL, "" or "cpu" gives -1,
 * "cuda" 0, "cuda:N" N. Fails with DI_ERR_INVALID_ARG naming the string and the accepted
 * forms. Checks the name only, not whether such a device exists. */
DI_API di_status di_device_parse(const char *device, int *cuda_device);

/* Loads a checkpoint folder as published (config.json + *.safetensors [+ index]).
 * Weights are memory-mapped and used in their stored dtype. */
DI_API di_status di_model_load(const char *dir, const di_model_params *params, di_model **out);
DI_API void di_model_free(di_model *model);

typedef struct di_model_info {
    char architecture[64];      /* e.g. "DeepseekV3ForCausalLM" */
    char family[32];            /* "deepseek_v2", "deepseek_v3", ... */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t n_layers;
    int64_t max_context;        /* max_position_embeddings */
    int64_t n_params_total;     /* parameters of the main model (MTP layers excluded) */
    int64_t n_params_active;    /* parameters touched per token */
    int64_t n_params_mtp;       /* parameters of the MTP layers, loaded but not used */
    int64_t weight_bytes;       /* bytes of weights as stored (main model + MTP) */
    int64_t kv_bytes_per_token; /* cache bytes per token of context, all layers */
    char dtypes[64];            /* stored dtypes seen, e.g. "bf16+f8_e4m3" */
    int32_t bos_token_id;       /* -1 if none */
    int32_t eos_token_id;       /* -1 if none */
    /* Per-sequence cache state that does not grow with the context (DeepSeek-V4: the
     * sliding-window rings and the compressors' open windows), bytes; 0 for V2/V3. */
    int64_t kv_fixed_bytes;
    /* That state and the growth split by layer type, e.g.
     * "sliding x2: 8.0 KiB fixed, 0 B/token; csa x1: ..." ("" when there is one type). */
    char kv_by_layer_type[256];
} di_model_info;

DI_API di_status di_model_get_info(const di_model *model, di_model_info *out);

/* ---------------------------------------------------------------------------------------- */
/* Contexts: one sequence's cache and scratch, for direct evaluation                          */
/* ---------------------------------------------------------------------------------------- */

typedef struct di_context di_context;

typedef struct di_context_params {
    int64_t max_tokens; /* capacity of the sequence (prompt + generated); <= 0: 4096 or the
                           model's context if smaller */
    int32_t n_threads;  /* <= 0: the model's */
} di_context_params;

DI_API di_context_params di_context_default_params(void);
/* The context runs on the model's device (di_model_params.device); logits come back in host
 * memory. On CUDA, n_threads only matters for host-side work. */
DI_API di_status di_context_create(di_model *model, const di_context_params *params,
                                   di_context **out);
DI_API void di_context_free(di_context *ctx);

/* Forgets the sequence; the next eval starts at position 0. */
DI_API void di_context_reset(di_context *ctx);

/* Number of tokens already in the context's cache. */
DI_API int64_t di_context_n_past(const di_context *ctx);

/* Appends n_ids tokens to the sequence and runs them through the model. If logits is not
 * NULL, writes float32 logits for the last n_logits of those positions, row-major
 * [n_logits][vocab_size] (1 <= n_logits <= n_ids). */
DI_API di_status di_context_eval(di_context *ctx, const int32_t *ids, int64_t n_ids,
                                 float *logits, int64_t n_logits);

/* ---------------------------------------------------------------------------------------- */
/* Engine: continuous batching of many requests over one model                              */
/* ---------------------------------------------------------------------------------------- */

/* An engine serves many requests at once over one model: a scheduler (continuous batching
 * under a token budget, chunked prefill, preemption), a paged KV pool with prefix reuse, the
 * batched model runner and the sampler. The caller adds requests, then calls di_engine_step
 * until di_engine_has_unfinished is false; each step reports what every request produced.
 *
 * Determinism: a request's random numbers are keyed by (seed, sample index, position) only,
 * and with batch_invariant (the default; its cost on the CPU backend is measured by
 * bench/batch_invariance.sh) every kernel computes a row independently of the rows around
 * it. So a request gives the same tokens and bitwise identical logprobs alone or inside any
 * batch, for any thread count, chunk size or preemption history.
 *
 * Threads: di_engine_add_request and di_engine_abort may be called from any thread, also
 * while another thread is inside di_engine_step (they go through a locked inbox drained at
 * the start of each step). Every other engine call must come from one thread at a time. */
typedef struct di_engine di_engine;

typedef struct di_tokenizer di_tokenizer; /* see "Tokenizer" below */

typedef struct di_engine_params {
    int32_t n_threads;          /* compute threads; <= 0: the model's */
    int64_t max_batch_tokens;   /* tokens per step, all sequences (default 2048) */
    int64_t max_prefill_tokens; /* prompt tokens per step, i.e. the prefill chunk size;
                                   <= 0 (the default): 512 on the CPU, max_batch_tokens on
                                   a GPU; capped at max_batch_tokens */
    int32_t max_running;        /* most sequences in one step (default 64) */
    int64_t kv_memory_bytes;    /* paged KV pool size; 0: enough for max_running sequences of
                                   max_model_len tokens, capped at 1 GiB on the CPU and at
                                   half the device's free memory on a GPU (default 0) */
    int32_t block_size;         /* tokens per KV block (default 16; DeepSeek-V4 rounds it up
                                   to a multiple of its largest compression ratio) */
    int64_t max_model_len;      /* prompt + output limit per sequence; <= 0: the model's
                                   context, capped at 4096 (default 0) */
    bool enable_prefix_cache;   /* reuse the KV of shared prompt prefixes (default true;
                                   DeepSeek-V4 rebuilds its sliding-window state by
                                   replaying a bounded number of tokens before a hit) */
    bool batch_invariant;       /* results independent of the batch (default true). false:
                                   the CPU matmul picks its kernel by the step's token count
                                   (faster for 5-8 tokens per weight on AVX-512: MoE experts
                                   at moderate concurrency), so results depend on the batch
                                   in the last bits (normalised error ~1e-6 per matmul) and
                                   the determinism guarantee below no longer holds */
    bool overlap;               /* schedule / post-process on the calling thread while the
                                   forward runs on a compute thread (default false); on a
                                   GPU the next decode step is queued on the device behind
                                   the running one instead (the same results) */
    bool disaggregate;          /* separate prefill and decode workers (default false): two
                                   threads with their own thread pools and activation
                                   buffers sharing the KV pool; decodes run every decode
                                   step, never waiting for a prompt chunk; max_prefill_tokens
                                   is the prefill worker's step. Same outputs as the unified
                                   engine. Not with overlap (DI_ERR_INVALID_ARG) */
    int32_t prefill_threads;    /* disaggregate: the prefill worker's threads, the decode
                                   worker gets the rest of n_threads (at least 1);
                                   <= 0: half (default 0) */
    /* tokenizer.json file or folder for text prompts, detokenized output and stop strings;
     * NULL: the model folder's, loaded lazily on the first need. Without one, text prompts
     * and stop strings fail at di_engine_add_request and outputs carry no text. */
    const char *tokenizer_path;
    /* An already loaded tokenizer to use instead (borrowed: it must outlive the engine);
     * takes precedence over tokenizer_path. Lets a caller that tokenizes too load it once. */
    const di_tokenizer *tokenizer;
} di_engine_params;

DI_API di_engine_params di_engine_default_params(void);

/* Creates an engine over `model` (borrowed: it must outlive the engine; several engines may
 * share one model). Allocates the KV pool and every per-step buffer now, on the model's
 * device (di_model_params.device: the KV pool in device memory on CUDA; sampling stays on
 * the host over downloaded logits rows). */
DI_API di_status di_engine_create(di_model *model, const di_engine_params *params,
                                  di_engine **out);
DI_API void di_engine_free(di_engine *e);

/* One request. Exactly one of prompt_ids / prompt_text is used (ids win when both are set).
 * Everything is copied by di_engine_add_request. */
typedef struct di_engine_request {
    const int32_t *prompt_ids; /* [n_prompt_ids] */
    int64_t n_prompt_ids;
    const char *prompt_text; /* NUL-terminated; tokenized with the engine's tokenizer */
    bool add_special;        /* text prompts: apply the post-processor (e.g. prepend BOS) */
    const struct di_sampling_params *sampling; /* NULL: di_sampling_default_params() */
    uint64_t id;        /* the caller's id, reported in outputs; must be unique among
                           unfinished requests */
    const char *id_str; /* optional caller string id (copied), reported in outputs; NULL: none */
} di_engine_request;

/* Queues a request (thread-safe, see above). Validates the prompt (non-empty, ids in the
 * vocabulary) and the sampling parameters (di_sampling_params_validate); a request without a
 * seed (seed < 0) gets one drawn now, reported in its outputs. Fails with
 * DI_ERR_INVALID_ARG on a duplicate id, DI_ERR_NOT_FOUND when text or stop strings need a
 * tokenizer and there is none. A prompt longer than max_model_len is accepted and finishes at
 * once with reason "error". */
DI_API di_status di_engine_add_request(di_engine *e, const di_engine_request *req);

/* Aborts a request (thread-safe): it finishes with reason "abort" at the next step, which
 * reports it. DI_ERR_NOT_FOUND when no unfinished request has that id. */
DI_API di_status di_engine_abort(di_engine *e, uint64_t id);

typedef enum {
    DI_ENGINE_FINISH_NONE,   /* still running */
    DI_ENGINE_FINISH_STOP,   /* EOS, a stop token id or a stop string */
    DI_ENGINE_FINISH_LENGTH, /* max_tokens or max_model_len */
    DI_ENGINE_FINISH_ABORT,  /* di_engine_abort */
    DI_ENGINE_FINISH_ERROR,  /* the request could not run: see error */
} di_engine_finish;

/* "stop", "length", "abort", "error" ("" for DI_ENGINE_FINISH_NONE). */
DI_API const char *di_engine_finish_str(di_engine_finish r);

/* One token's logprobs (vLLM's raw logprobs: log-softmax of the model's logits). */
typedef struct di_engine_logprobs {
    int32_t token;              /* the chosen (or, for prompt logprobs, the given) token */
    float logprob;              /* its logprob */
    int32_t n_top;              /* entries below: the request's logprobs N */
    const int32_t *top_ids;     /* [n_top] by decreasing logprob, ties: lower id */
    const float *top_logprobs;  /* [n_top] */
} di_engine_logprobs;

typedef struct di_engine_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens; /* of this sample */
    int64_t cached_tokens;     /* prompt tokens whose KV came from the prefix cache */
} di_engine_usage;

/* What one sample (sample_index < n) of one request produced in a step. Pointers are owned
 * by the engine and valid until the next di_engine_step or di_engine_free. */
typedef struct di_engine_output {
    uint64_t id;          /* the caller's id */
    const char *id_str;   /* the caller's string id, or NULL */
    int32_t sample_index; /* 0 .. n - 1 */
    int64_t seed;         /* the seed used (the caller's, or the one drawn at submission) */
    const int32_t *tokens; /* [n_tokens] ids generated this step (usually 0 or 1) */
    int64_t n_tokens;
    /* Text those tokens complete (streaming detokenizer: whole UTF-8 characters only, held
     * back while a stop string may be starting; a matched stop string and what follows it
     * are removed). NULL when the engine has no tokenizer. Not NUL-terminated. */
    const char *text;
    int64_t text_len;
    const di_engine_logprobs *logprobs; /* [n_tokens] when the request asked, else NULL */
    /* Prompt logprobs (positions 1 .. prompt_tokens - 1), on the sample's first output only,
     * when the request asked; else NULL / 0. Entry k is prompt position k + 1: its token, its
     * logprob under the raw logits of position k (log-softmax, as `logprobs`) and the top
     * prompt_logprobs entries (vLLM's list without its leading null for position 0). Every
     * sample of a request carries the same values. NULL also when the request ended before
     * its prompt was computed (abort, error). A request that asks does not use the prefix
     * cache for its own prompt, whose logits are all computed (usage.cached_tokens is 0). */
    const di_engine_logprobs *prompt_logprobs;
    int64_t n_prompt_logprobs;
    bool finished; /* last output of this sample */
    di_engine_finish finish_reason;
    const char *error; /* message when finish_reason is DI_ENGINE_FINISH_ERROR, else "" */
    di_engine_usage usage; /* so far; final when finished */
} di_engine_output;

/* Runs one engine step (drains the inbox, schedules, runs the batch, samples,
 * post-processes) and writes one record per sample that produced tokens or finished into
 * out[0 .. cap). Records that do not fit are kept and returned first by the next call (which
 * then runs no new step); cap >= di_engine_output_cap(e) always suffices. Returns the count
 * written in *n_out. A failure of the model runner is not an error of the step: the step's
 * requests are recomputed later. */
DI_API di_status di_engine_step(di_engine *e, di_engine_output *out, int64_t cap,
                                int64_t *n_out);

/* The most records one step can produce (so the caller can size its array once). */
DI_API int64_t di_engine_output_cap(const di_engine *e);

/* True while a request is queued, running or has outputs not yet returned. */
DI_API bool di_engine_has_unfinished(di_engine *e);

typedef struct di_engine_stats {
    int32_t n_running;              /* sequences holding KV (a request with n > 1 counts n) */
    int32_t n_waiting;              /* queued, preempted, or in the inbox */
    int32_t kv_blocks_used;         /* blocks held by running sequences */
    int32_t kv_blocks_total;
    int64_t prefix_cache_hit_tokens; /* cumulative */
    int64_t n_preemptions;           /* cumulative */
    int64_t n_steps;
    int64_t n_prompt_tokens;    /* tokens run through the model as prefill (incl. recompute) */
    int64_t n_generated_tokens; /* sampled tokens */
    /* Cumulative wall seconds: scheduling (incl. inbox and batch building), the forward
     * (device time), post-processing (sampling, stop checks, detokenizing, outputs), and the
     * whole of di_engine_step. With overlap, device time runs concurrently with the others. */
    double time_schedule_s, time_device_s, time_postprocess_s, time_total_s;
    /* Disaggregated mode: forward calls and busy seconds of each worker (device time is
     * their sum; the two run concurrently). Zero otherwise. */
    int64_t n_prefill_steps, n_decode_steps;
    double time_prefill_busy_s, time_decode_busy_s;
    /* Routed experts whose weights the forwards read (cumulative): for every forward chunk
     * and MoE layer, the distinct experts its tokens were routed to. Counted by the V2/V3
     * models on the CPU backend; 0 elsewhere. What a step's memory traffic depends on. */
    int64_t n_expert_loads;
} di_engine_stats;

DI_API di_status di_engine_get_stats(const di_engine *e, di_engine_stats *out);

/* ---------------------------------------------------------------------------------------- */
/* Sampling                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* The most top-N logprobs a request may ask for (vLLM's default limit). */
#define DI_SAMPLING_MAX_LOGPROBS 20

/* Adds bias to the logit of token id before any other processing. */
typedef struct di_logit_bias {
    int32_t id;
    float bias;
} di_logit_bias;

/* How one request's tokens are chosen. Names, meanings and defaults follow vLLM's
 * SamplingParams. The arrays are borrowed: the caller keeps them alive for as long as the
 * struct is used (the engine copies them when a request is added). */
typedef struct di_sampling_params {
    float temperature;        /* 1.0; 0 (below 1e-5) = greedy: argmax, lowest id on ties */
    int32_t top_k;            /* -1 = off (0 is also off); else keep the k most likely */
    float top_p;              /* 1.0 = off; in (0, 1]: smallest set with mass >= top_p */
    float min_p;              /* 0.0 = off; in [0, 1]: drop p < min_p * p_max */
    float repetition_penalty; /* 1.0 = off; > 0, on tokens of the prompt and the output */
    float presence_penalty;   /* 0.0; in [-2, 2], subtracted once per token in the output */
    float frequency_penalty;  /* 0.0; in [-2, 2], times the token's count in the output */
    const di_logit_bias *logit_bias; /* [n_logit_bias] or NULL */
    int64_t n_logit_bias;
    const char *const *stop; /* [n_stop] stop strings, matched by the engine on the text */
    int64_t n_stop;
    const int32_t *stop_token_ids; /* [n_stop_token_ids] or NULL */
    int64_t n_stop_token_ids;
    bool ignore_eos;          /* false; true: keep generating after the EOS token */
    int64_t max_tokens;       /* 16; most tokens to generate, >= 1 */
    int64_t min_tokens;       /* 0; EOS and stop_token_ids are masked until this many */
    int32_t n;                /* 1; completions per prompt */
    int32_t logprobs;         /* -1 = none; N in [0, 20]: the sampled token's and top-N */
    int32_t prompt_logprobs;  /* -1 = none; N in [0, 20]: each prompt token's logprob and the
                                 top N per prompt position (di_engine_output) */
    int64_t seed;             /* -1 = none: the engine draws one and reports it */
    /* Constrained generation (vLLM's structured outputs): at most one of these; NULL = none.
     *   grammar:     a GBNF grammar (llama.cpp's format, start rule "root");
     *   json_schema: a JSON Schema (text); the output is a JSON document valid under it, with
     *                object keys in the schema's order (docs/constrained.md: the keywords
     *                enforced, the ones not);
     *   regex:       a regular expression the whole output must match.
     * Each step only tokens the constraint allows can be chosen, EOS only once the output is
     * complete, and the request finishes ("stop") as soon as nothing can follow. Needs the
     * engine's tokenizer. Compiled when the request is added: di_engine_add_request fails
     * with DI_ERR_INVALID_ARG and a message naming the place (line and column, schema path,
     * regex offset). Rows of such requests are sampled on the host (a GPU hands their logits
     * back). */
    const char *grammar;
    const char *json_schema;
    const char *regex;
} di_sampling_params;

DI_API di_sampling_params di_sampling_default_params(void);

/* Checks every field. On failure returns DI_ERR_INVALID_ARG and writes a message that names
 * the parameter (e.g. "top_p must be in (0, 1], got 1.5") to err (when err != NULL and
 * errlen > 0) and to di_last_error(). */
DI_API di_status di_sampling_params_validate(const di_sampling_params *params, char *err,
                                             size_t errlen);

/* ---------------------------------------------------------------------------------------- */
/* Tokenizer                                                                                  */
/* ---------------------------------------------------------------------------------------- */

/* Byte-level BPE read from a Hugging Face tokenizer.json (DeepSeek V2/V3/V4, Qwen, Llama-3,
 * GPT-2 families). Encoding matches the `tokenizers` library id for id. A tokenizer is
 * immutable once loaded: any number of threads may encode / decode with one at once.
 *
 * Text in is bytes. Ill-formed UTF-8 is repaired before tokenizing: every ill-formed
 * sequence becomes U+FFFD by the "maximal subpart" rule (WHATWG, Python's
 * bytes.decode("utf-8", errors="replace")). Text out is always valid UTF-8. */
typedef struct di_tokenizer di_tokenizer;
typedef struct di_detok di_detok;

/* Returned by di_tokenizer_encode / di_tokenizer_decode on failure (see di_last_error). */
#define DI_TOK_ERROR INT64_MIN

/* `path` is a tokenizer.json file or a model folder. From a folder, tokenizer.json is read
 * and tokenizer_config.json (if present) sets bos / eos and, when it has add_bos_token /
 * add_eos_token, which of them add_special prepends / appends (what transformers 4.x's
 * LlamaTokenizerFast does for DeepSeek checkpoints). Unsupported parts (a Unigram model, an
 * NFKC normalizer, ...) fail with DI_ERR_UNSUPPORTED naming them. */
DI_API di_status di_tokenizer_load(const char *path, di_tokenizer **out);
/* Same, from tokenizer.json contents in memory (no tokenizer_config.json). */
DI_API di_status di_tokenizer_load_json(const char *json, size_t len, di_tokenizer **out);
DI_API void di_tokenizer_free(di_tokenizer *tok);

/* Encodes len bytes of text into ids. Added / special tokens in the text are always
 * recognized. add_special applies the post-processor (e.g. prepends BOS). Returns the
 * number of ids written, -needed if cap is too small (nothing useful written), or
 * DI_TOK_ERROR. */
DI_API int64_t di_tokenizer_encode(const di_tokenizer *tok, const char *text, size_t len,
                                   bool add_special, int32_t *ids, int64_t cap);

/* Decodes ids to UTF-8 text as HF's decode does (unknown ids are ignored; skip_special drops
 * special added tokens). Writes no terminating NUL. Returns bytes written, -needed if cap is
 * too small, or DI_TOK_ERROR. */
DI_API int64_t di_tokenizer_decode(const di_tokenizer *tok, const int32_t *ids, int64_t n_ids,
                                   bool skip_special, char *out, int64_t cap);

/* Number of ids: 1 + the largest id of the vocab and the added tokens. */
DI_API int32_t di_tokenizer_vocab_size(const di_tokenizer *tok);
/* The id of a token's text (added tokens first, then the vocab), or -1. */
DI_API int32_t di_tokenizer_token_to_id(const di_tokenizer *tok, const char *token, size_t len);
/* The text of an id as stored in tokenizer.json (e.g. "Ġworld"), NUL-terminated and owned
 * by the tokenizer; NULL when the id has no token. */
DI_API const char *di_tokenizer_id_to_token(const di_tokenizer *tok, int32_t id);
DI_API bool di_tokenizer_is_special(const di_tokenizer *tok, int32_t id);
/* The raw bytes the decoder emits for id (for a byte-level vocabulary, the token's bytes,
 * which may end inside a UTF-8 character), owned by the tokenizer, their count in *len; NULL
 * when the id has no token. What constrained generation matches grammars against. */
DI_API const char *di_tokenizer_id_bytes(const di_tokenizer *tok, int32_t id, size_t *len);
/* BOS / EOS ids (-1 if unknown): from tokenizer_config.json when loaded from a folder,
 * otherwise from the post-processor or well-known token names. */
DI_API int32_t di_tokenizer_bos_id(const di_tokenizer *tok);
DI_API int32_t di_tokenizer_eos_id(const di_tokenizer *tok);

/* Streaming detokenizer: push ids one at a time and get text that only ever contains whole
 * UTF-8 characters; bytes of an unfinished character are held back until a later id
 * completes them. The concatenation of all pushes and the final flush equals
 * di_tokenizer_decode of the whole sequence. The tokenizer must outlive the detokenizer. */
DI_API di_status di_detok_create(const di_tokenizer *tok, bool skip_special, di_detok **out);
/* Writes the text that id completes; returns bytes written (may be 0), or -needed if cap is
 * too small (the id is then not consumed), or DI_TOK_ERROR. */
DI_API int64_t di_detok_push(di_detok *d, int32_t id, char *out, int64_t cap);
/* Writes what is held back (an unfinished character becomes U+FFFD, as decode does) and
 * resets the detokenizer for a new sequence. Returns bytes written or -needed. */
DI_API int64_t di_detok_flush(di_detok *d, char *out, int64_t cap);
DI_API void di_detok_free(di_detok *d);

/* ---- Chat templates ---------------------------------------------------------------------- */

/* A model's Jinja chat template (tokenizer_config.json "chat_template"), rendered the way
 * transformers' apply_chat_template(tokenize=False) renders it. Immutable once loaded; one
 * template may be rendered from several threads at once. */
typedef struct di_chat_template di_chat_template;

/* path: a model folder (reads DIR/tokenizer_config.json), a tokenizer_config.json file, or a
 * raw .jinja template file (then bos_token/eos_token/... are not defined). The special
 * tokens (bos/eos/unk/sep/pad/cls/mask_token, a string or {"content": ...}) become template
 * variables, as transformers passes them. */
DI_API di_status di_chat_template_load(const char *path, di_chat_template **out);

/* A template from its text; special tokens come from special_tokens_from (a model folder or
 * a tokenizer_config.json), or none when it is NULL. Syntax errors report "line L:C". */
DI_API di_status di_chat_template_from_text(const char *jinja_text,
                                            const char *special_tokens_from,
                                            di_chat_template **out);

typedef struct di_chat_render_params {
    /* JSON array of messages ({"role": ..., "content": ..., ...}), or an object
     * {"messages": [...], "tools": [...]}. Required. */
    const char *messages_json;
    const char *tools_json;     /* JSON array, or NULL (tools is none, unless messages_json
                                   is an object with "tools") */
    const char *extra_json;     /* JSON object of further variables, e.g. {"thinking": true};
                                   NULL for none */
    bool add_generation_prompt;
} di_chat_render_params;

/* Renders the prompt text into *out_text (NUL-terminated, free with di_free). Errors: bad
 * JSON (DI_ERR_INVALID_ARG), the template's raise_exception or a failing expression
 * (DI_ERR_INVALID_ARG, message "line L:C: ..."), limits on work or size (DI_ERR_RANGE). */
DI_API di_status di_chat_template_render_ex(const di_chat_template *tmpl,
                                            const di_chat_render_params *params,
                                            char **out_text);
DI_API di_status di_chat_template_render(const di_chat_template *tmpl,
                                         const char *messages_json,
                                         bool add_generation_prompt, const char *tools_json,
                                         char **out_text);
/* The template's Jinja text. */
DI_API const char *di_chat_template_text(const di_chat_template *tmpl);
DI_API void di_chat_template_free(di_chat_template *tmpl);

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_H */
