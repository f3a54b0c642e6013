"""deepinfer: a thin Python binding over the C library (ctypes), shaped like vLLM's offline API.

    from deepinfer import LLM, SamplingParams
    llm = LLM("models/deepseek-v4-tiny")                  # device="cuda" for the GPU
    outs = llm.generate(["The Linux kernel", "Debian is"],
                        SamplingParams(temperature=0.7, max_tokens=32, seed=1))
    print(outs[0].outputs[0].text, outs[0].outputs[0].token_ids)

Everything runs in the C engine (continuous batching, the paged KV cache, the sampler, the
tokenizer); this module only converts arguments and results. Errors raise DeepInferError with
the library's message (it names the file, field or argument).
"""
import ctypes
import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from . import _lib

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Tokenizer",
           "DeepInferError"]

_L = None


def _lib_handle():
    global _L
    if _L is None:
        _L = _lib.load()
    return _L


class DeepInferError(RuntimeError):
    """A failed library call; the message is di_last_error()'s."""


def _check(status):
    if status != 0:
        raise DeepInferError(_lib_handle().di_last_error().decode("utf-8", "replace"))


def _b(s):
    return None if s is None else s.encode("utf-8")


@dataclass
class SamplingParams:
    """vLLM's SamplingParams (names, meanings and defaults), plus its structured outputs as
    `grammar` (GBNF), `json_schema` (a dict or its JSON text) and `regex`."""
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: Optional[int] = None
    max_tokens: int = 16
    min_tokens: int = 0
    stop: Union[None, str, Sequence[str]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    logit_bias: Optional[dict] = None
    grammar: Optional[str] = None
    json_schema: Union[None, str, dict] = None
    regex: Optional[str] = None

    def _to_c(self, keep):
        """The C struct; `keep` holds the buffers it points into alive."""
        sp = _lib_handle().di_sampling_default_params()
        for name in ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty", "max_tokens", "min_tokens",
                     "ignore_eos"):
            setattr(sp, name, getattr(self, name))
        sp.seed = -1 if self.seed is None else self.seed
        sp.logprobs = -1 if self.logprobs is None else self.logprobs
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if stops:
            arr = (ctypes.c_char_p * len(stops))(*[_b(s) for s in stops])
            keep.append(arr)
            sp.stop, sp.n_stop = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p)), len(stops)
        if self.stop_token_ids:
            ids = (ctypes.c_int32 * len(self.stop_token_ids))(*self.stop_token_ids)
            keep.append(ids)
            sp.stop_token_ids, sp.n_stop_token_ids = ids, len(self.stop_token_ids)
        if self.logit_bias:
            items = list(self.logit_bias.items())
            lb = (_lib.LogitBias * len(items))(*[_lib.LogitBias(int(k), float(v))
                                                 for k, v in items])
            keep.append(lb)
            sp.logit_bias, sp.n_logit_bias = lb, len(items)
        schema = self.json_schema
        if isinstance(schema, dict):
            schema = json.dumps(schema)
        for name, value in (("grammar", self.grammar), ("json_schema", schema),
                            ("regex", self.regex)):
            if value is not None:
                buf = _b(value)
                keep.append(buf)
                setattr(sp, name, buf)
        err = ctypes.create_string_buffer(256)
        if _lib_handle().di_sampling_params_validate(ctypes.byref(sp), err, 256) != 0:
            raise DeepInferError(err.value.decode("utf-8", "replace"))
        return sp


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str]
    logprobs: Optional[List[float]] = None  # the chosen tokens' raw logprobs, when asked
    seed: int = -1


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)


class Tokenizer:
    """The engine's tokenizer (di_tokenizer_*): encode / decode as Hugging Face's."""

    def __init__(self, path):
        self._h = ctypes.c_void_p()
        _check(_lib_handle().di_tokenizer_load(_b(path), ctypes.byref(self._h)))

    def encode(self, text, add_special_tokens=False):
        L, raw = _lib_handle(), _b(text)
        n = L.di_tokenizer_encode(self._h, raw, len(raw), add_special_tokens, None, 0)
        if n == -(1 << 63):
            raise DeepInferError(L.di_last_error().decode())
        cap = max(-n if n < 0 else n, 1)
        ids = (ctypes.c_int32 * cap)()
        n = L.di_tokenizer_encode(self._h, raw, len(raw), add_special_tokens, ids, cap)
        return list(ids[:n])

    def decode(self, ids, skip_special_tokens=True):
        L = _lib_handle()
        arr = (ctypes.c_int32 * max(len(ids), 1))(*ids)
        n = L.di_tokenizer_decode(self._h, arr, len(ids), skip_special_tokens, None, 0)
        cap = max(-n if n < 0 else n, 1)
        buf = ctypes.create_string_buffer(cap)
        n = L.di_tokenizer_decode(self._h, arr, len(ids), skip_special_tokens, buf, cap)
        return buf.raw[:n].decode("utf-8", "replace")

    def __del__(self):
        if getattr(self, "_h", None) and _L is not None:
            _L.di_tokenizer_free(self._h)
            self._h = None


class LLM:
    """A model and an engine over it, as vLLM's LLM: generate() runs a list of prompts to the
    end and returns their outputs in order.

    model: a checkpoint folder (Hugging Face layout). device: "cpu", "cuda" or "cuda:N".
    Engine limits (max_model_len, max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
    batch_invariant) keep vLLM's names where it has one."""

    def __init__(self, model, device="cpu", n_threads=0, max_model_len=0, max_num_seqs=64,
                 max_num_batched_tokens=2048, enable_prefix_caching=True,
                 batch_invariant=True, tokenizer=None):
        L = _lib_handle()
        mp = L.di_model_default_params()
        mp.n_threads, mp.device = n_threads, _b(device)
        self._model = ctypes.c_void_p()
        _check(L.di_model_load(_b(model), ctypes.byref(mp), ctypes.byref(self._model)))
        ep = L.di_engine_default_params()
        ep.n_threads, ep.max_model_len, ep.max_running = n_threads, max_model_len, max_num_seqs
        ep.max_batch_tokens = max_num_batched_tokens
        ep.enable_prefix_cache, ep.batch_invariant = enable_prefix_caching, batch_invariant
        self._tok_path = _b(tokenizer)
        ep.tokenizer_path = self._tok_path
        self._engine = ctypes.c_void_p()
        try:
            _check(L.di_engine_create(self._model, ctypes.byref(ep), ctypes.byref(self._engine)))
        except DeepInferError:
            L.di_model_free(self._model)
            raise
        self._path, self._tokenizer, self._next_id = tokenizer or model, None, 1

    def get_tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self._path)
        return self._tokenizer

    def generate(self, prompts, sampling_params=None):
        """prompts: a string, a list of strings, or lists of token ids. sampling_params: one
        SamplingParams for all, or one per prompt. Returns a RequestOutput per prompt."""
        L = _lib_handle()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        if not isinstance(params, (list, tuple)):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams, or one per prompt")
        keep, results, by_id = [], [], {}
        for prompt, sp in zip(prompts, params):
            csp = sp._to_c(keep)
            keep.append(csp)
            req = _lib.EngineRequest()
            if isinstance(prompt, str):
                req.prompt_text = _b(prompt)
                keep.append(req.prompt_text)
                req.add_special = True
                ids = self.get_tokenizer().encode(prompt, add_special_tokens=True)
            else:
                arr = (ctypes.c_int32 * len(prompt))(*prompt)
                keep.append(arr)
                req.prompt_ids, req.n_prompt_ids = arr, len(prompt)
                ids = list(prompt)
            req.sampling = ctypes.pointer(csp)
            req.id = self._next_id
            self._next_id += 1
            _check(L.di_engine_add_request(self._engine, ctypes.byref(req)))
            out = RequestOutput(str(req.id), prompt if isinstance(prompt, str) else None, ids,
                                [CompletionOutput(i, "", [], None) for i in range(sp.n)])
            by_id[req.id] = (out, [bytearray() for _ in range(sp.n)])
            results.append(out)
        cap = L.di_engine_output_cap(self._engine)
        recs = (_lib.EngineOutput * cap)()
        n = ctypes.c_int64()
        while L.di_engine_has_unfinished(self._engine):
            _check(L.di_engine_step(self._engine, recs, cap, ctypes.byref(n)))
            for r in recs[:n.value]:
                out, texts = by_id[r.id]
                c = out.outputs[r.sample_index]
                c.token_ids.extend(r.tokens[:r.n_tokens])
                c.seed = r.seed
                if r.text and r.text_len:
                    texts[r.sample_index] += ctypes.string_at(r.text, r.text_len)
                if r.logprobs:
                    c.logprobs = (c.logprobs or []) + [r.logprobs[k].logprob
                                                       for k in range(r.n_tokens)]
                if r.finished:
                    c.finish_reason = _lib.FINISH_REASONS.get(r.finish_reason)
                    if c.finish_reason == "error":
                        raise DeepInferError((r.error or b"").decode("utf-8", "replace"))
        for out, texts in by_id.values():
            for c, t in zip(out.outputs, texts):
                c.text = t.decode("utf-8", "replace")
        return results

    def close(self):
        L = _L
        if L is not None and getattr(self, "_engine", None):
            L.di_engine_free(self._engine)
            self._engine = None
        if L is not None and getattr(self, "_model", None):
            L.di_model_free(self._model)
            self._model = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
