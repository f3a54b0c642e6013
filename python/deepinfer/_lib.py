"""ctypes declarations of include/deepinfer.h (the part the binding uses).

The structures mirror the C ones field for field, in order; tests/python/test_binding.py
checks the binding's results against the deepinfer program's, which would expose a layout
that drifted from the header.
"""
import ctypes
import ctypes.util
import os

c_int32, c_int64, c_uint64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
c_float, c_bool, c_char_p, c_void_p = ctypes.c_float, ctypes.c_bool, ctypes.c_char_p, ctypes.c_void_p
P = ctypes.POINTER


class ModelParams(ctypes.Structure):
    _fields_ = [("n_threads", c_int32), ("verbose", c_bool), ("device", c_char_p)]


class EngineParams(ctypes.Structure):
    _fields_ = [("n_threads", c_int32), ("max_batch_tokens", c_int64),
                ("max_prefill_tokens", c_int64), ("max_running", c_int32),
                ("kv_memory_bytes", c_int64), ("block_size", c_int32),
                ("max_model_len", c_int64), ("enable_prefix_cache", c_bool),
                ("batch_invariant", c_bool), ("overlap", c_bool), ("disaggregate", c_bool),
                ("prefill_threads", c_int32), ("tokenizer_path", c_char_p),
                ("tokenizer", c_void_p)]


class LogitBias(ctypes.Structure):
    _fields_ = [("id", c_int32), ("bias", c_float)]


class SamplingParamsC(ctypes.Structure):
    _fields_ = [("temperature", c_float), ("top_k", c_int32), ("top_p", c_float),
                ("min_p", c_float), ("repetition_penalty", c_float),
                ("presence_penalty", c_float), ("frequency_penalty", c_float),
                ("logit_bias", P(LogitBias)), ("n_logit_bias", c_int64),
                ("stop", P(c_char_p)), ("n_stop", c_int64),
                ("stop_token_ids", P(c_int32)), ("n_stop_token_ids", c_int64),
                ("ignore_eos", c_bool), ("max_tokens", c_int64), ("min_tokens", c_int64),
                ("n", c_int32), ("logprobs", c_int32), ("prompt_logprobs", c_int32),
                ("seed", c_int64), ("grammar", c_char_p), ("json_schema", c_char_p),
                ("regex", c_char_p)]


class EngineRequest(ctypes.Structure):
    _fields_ = [("prompt_ids", P(c_int32)), ("n_prompt_ids", c_int64),
                ("prompt_text", c_char_p), ("add_special", c_bool),
                ("sampling", P(SamplingParamsC)), ("id", c_uint64), ("id_str", c_char_p)]


class EngineLogprobs(ctypes.Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float), ("n_top", c_int32),
                ("top_ids", P(c_int32)), ("top_logprobs", P(c_float))]


class EngineUsage(ctypes.Structure):
    _fields_ = [("prompt_tokens", c_int64), ("completion_tokens", c_int64),
                ("cached_tokens", c_int64)]


class EngineOutput(ctypes.Structure):
    _fields_ = [("id", c_uint64), ("id_str", c_char_p), ("sample_index", c_int32),
                ("seed", c_int64), ("tokens", P(c_int32)), ("n_tokens", c_int64),
                ("text", c_void_p), ("text_len", c_int64),
                ("logprobs", P(EngineLogprobs)), ("prompt_logprobs", P(EngineLogprobs)),
                ("n_prompt_logprobs", c_int64), ("finished", c_bool),
                ("finish_reason", ctypes.c_int), ("error", c_char_p), ("usage", EngineUsage)]


FINISH_REASONS = {0: None, 1: "stop", 2: "length", 3: "abort", 4: "error"}


def _candidates():
    env = os.environ.get("DEEPINFER_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    for build in ("build", "build-cpu", "build-gpu"):
        yield os.path.join(repo, build, "libdeepinfer.so")
    found = ctypes.util.find_library("deepinfer")
    if found:
        yield found


def load():
    """The library: $DEEPINFER_LIB, the repository's build folder, or the system's."""
    errors = []
    for path in _candidates():
        if path and (os.path.sep not in path or os.path.exists(path)):
            try:
                return _declare(ctypes.CDLL(path))
            except OSError as e:
                errors.append("%s: %s" % (path, e))
    raise OSError("deepinfer: libdeepinfer.so not found (build it with `make`, or set "
                  "DEEPINFER_LIB)" + ("; " + "; ".join(errors) if errors else ""))


def _declare(lib):
    def fn(name, restype, *argtypes):
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, list(argtypes)

    status = ctypes.c_int
    fn("di_last_error", c_char_p)
    fn("di_model_default_params", ModelParams)
    fn("di_model_load", status, c_char_p, P(ModelParams), P(c_void_p))
    fn("di_model_free", None, c_void_p)
    fn("di_engine_default_params", EngineParams)
    fn("di_engine_create", status, c_void_p, P(EngineParams), P(c_void_p))
    fn("di_engine_free", None, c_void_p)
    fn("di_engine_add_request", status, c_void_p, P(EngineRequest))
    fn("di_engine_step", status, c_void_p, P(EngineOutput), c_int64, P(c_int64))
    fn("di_engine_output_cap", c_int64, c_void_p)
    fn("di_engine_has_unfinished", c_bool, c_void_p)
    fn("di_sampling_default_params", SamplingParamsC)
    fn("di_sampling_params_validate", status, P(SamplingParamsC), c_char_p, ctypes.c_size_t)
    fn("di_tokenizer_load", status, c_char_p, P(c_void_p))
    fn("di_tokenizer_free", None, c_void_p)
    fn("di_tokenizer_encode", c_int64, c_void_p, c_char_p, ctypes.c_size_t, c_bool, P(c_int32),
       c_int64)
    fn("di_tokenizer_decode", c_int64, c_void_p, P(c_int32), c_int64, c_bool, c_char_p, c_int64)
    return lib
