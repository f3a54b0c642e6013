"""Shared pieces of the float64 golden-reference generators.

Used by tools/make_goldens.py (V2/V3), tools/make_goldens_v4.py (V4) and, through the latter,
tools/train/make_reference.py:
- load_f64_modeling: a transformers modeling file re-executed with float32 -> float64
- seeding (seed_case, random_prompt)
- checkpoint writing (write_json, write_safetensors, write_f64, save_pretrained_tensors)
- FP8 / FP4 block quantizers and their inverses
- loading a model in float64 on exact weights (load_f64_pretrained, load_f64_scratch, check_experts)
- the greedy reference run and its margins (top2_gap, compute_reference)
- the shared command line (main)

Nothing here changes torch's thread count; each script sets it before importing transformers.
"""

import argparse
import hashlib
import json
import math
import os
import re
import sys
import tempfile
import types

import torch
import transformers
from safetensors.torch import load_file, save_file

# --------------------------------------------------------------------------------------------
# A float64 copy of the transformers modeling code
# --------------------------------------------------------------------------------------------

_F64_CACHE = {}


def _rewrite_f64(src):
    src = re.sub(r"\btorch\.float32\b", "torch.float64", src)
    src = re.sub(r"\btorch\.float\b(?!\d)", "torch.float64", src)
    src = re.sub(r"\.float\(\)", ".double()", src)
    return src


def _exec_module(path, name, package):
    with open(path) as f:
        src = _rewrite_f64(f.read())
    mod = types.ModuleType(name)
    mod.__file__ = path
    mod.__package__ = package
    sys.modules[name] = mod
    exec(compile(src, path + " [float64 rewrite]", "exec"), mod.__dict__)
    return mod


def load_f64_modeling(model):
    """Return transformers' models/<model>/modeling_<model>.py (e.g. model = "deepseek_v3")
    re-executed with float32 -> float64, using a float64 rewrite of modeling_rope_utils too."""
    if model in _F64_CACHE:
        return _F64_CACHE[model]
    tdir = os.path.dirname(transformers.__file__)
    rope = _F64_CACHE.get("rope")
    if rope is None:
        rope = _exec_module(os.path.join(tdir, "modeling_rope_utils.py"), "transformers._f64_rope_utils", "transformers")
        _F64_CACHE["rope"] = rope
    mod = _exec_module(
        os.path.join(tdir, "models", model, f"modeling_{model}.py"),
        f"transformers.models.{model}._f64_modeling",
        f"transformers.models.{model}",
    )
    mod.ROPE_INIT_FUNCTIONS = rope.ROPE_INIT_FUNCTIONS
    _F64_CACHE[model] = mod
    return mod


# --------------------------------------------------------------------------------------------
# Seeding
# --------------------------------------------------------------------------------------------


def seed_case(case, attempt):
    """Seed torch's global generator for model construction; return the generator for the weights."""
    seed = case["seed"] + 7919 * attempt
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def random_prompt(case, vocab_size):
    """The case's prompt: n_prompt ids in [2, vocab_size), independent of the attempt."""
    pg = torch.Generator().manual_seed(case["seed"] * 31 + 7)
    return torch.randint(2, vocab_size, (case["n_prompt"],), generator=pg).tolist()


def init_common(name, shape, gen, head_scale):
    """Seeded float32 values for the parameters every generator initialises alike (norms,
    router, correction bias, embeddings, lm_head of std head_scale/sqrt(in)); None for others.
    Draws from gen only when it returns a value."""
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("e_score_correction_bias"):
        return 0.1 * torch.randn(shape, generator=gen)
    if name.endswith("mlp.gate.weight"):
        # Router: logits of std ~2 so the top-k boundaries are well separated.
        return (2.0 / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
    if name.endswith("embed_tokens.weight"):
        return 0.5 * torch.randn(shape, generator=gen)
    if name == "lm_head.weight":
        return (head_scale / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
    return None


# --------------------------------------------------------------------------------------------
# Writing files
# --------------------------------------------------------------------------------------------


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def ref_json_head(name, case, prompt, vocab_size, greedy, attempt):
    """The leading fields of a random case's ref.json, in their order; ref_logits.f64 holds the
    float64 prefill logits of the prompt."""
    return {
        "case": name,
        "description": case["description"],
        "prompt_ids": prompt,
        "n_prompt": len(prompt),
        "vocab_size": vocab_size,
        "logits_file": "ref_logits.f64",
        "logits_dtype": "float64",
        "logits_shape": [len(prompt), vocab_size],
        "greedy_ids": greedy,
        "n_greedy": len(greedy),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": case["seed"],
        "seed_attempt": attempt,
    }


def write_f64(path, t):
    """Raw little-endian float64, row-major."""
    t.contiguous().numpy().astype("<f8").tofile(path)


def save_sorted(tensors, path, metadata=None):
    """save_file with the tensors in name order."""
    save_file({k: tensors[k].contiguous() for k in sorted(tensors)}, path, metadata=metadata)


def write_safetensors(folder, tensors, n_shards=1):
    """model.safetensors, or n_shards shards + model.safetensors.index.json, names in order."""
    names = sorted(tensors)
    meta = {"format": "pt"}
    if n_shards <= 1:
        save_sorted(tensors, os.path.join(folder, "model.safetensors"), metadata=meta)
        return
    # Split by cumulative byte size, keeping the name order.
    sizes = [tensors[k].numel() * tensors[k].element_size() for k in names]
    total = sum(sizes)
    target = total / n_shards
    shards, cur, acc = [], [], 0
    for k, s in zip(names, sizes):
        if cur and acc + s / 2 > target * (len(shards) + 1) and len(shards) < n_shards - 1:
            shards.append(cur)
            cur = []
        cur.append(k)
        acc += s
    shards.append(cur)
    weight_map = {}
    for i, keys in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_sorted({k: tensors[k] for k in keys}, os.path.join(folder, fn), metadata=meta)
        for k in keys:
            weight_map[k] = fn
    write_json(
        os.path.join(folder, "model.safetensors.index.json"),
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )


def save_pretrained_tensors(model):
    """model.save_pretrained into a scratch folder; return (its config.json dict, all its tensors)."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "config.json")) as f:
            hf_cfg = json.load(f)
        tensors = {}
        for fn in sorted(x for x in os.listdir(tmp) if x.endswith(".safetensors")):
            tensors.update(load_file(os.path.join(tmp, fn)))
    return hf_cfg, tensors


def list_folder(folder, width):
    """Make the folder's files 0644 (safetensors writes 0600), print name/size/hash; return total bytes."""
    total = 0
    for fn in sorted(os.listdir(folder)):
        p = os.path.join(folder, fn)
        os.chmod(p, 0o644)
        total += os.path.getsize(p)
        with open(p, "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()[:16]
        print(f"  {fn:{width}s} {os.path.getsize(p):9d}  {h}")
    return total


# --------------------------------------------------------------------------------------------
# FP8 / FP4 quantization
# --------------------------------------------------------------------------------------------

FP8_MAX, FP8_BLOCK = 448.0, 128
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _quantize_fp8_blocks(w, scale_of, s_dtype):
    """e4m3 q [R,C] and per-128x128-block scales s [ceil(R/128), ceil(C/128)] (dtype s_dtype),
    w ~= q * s per block; scale_of(amax) gives a block's scale, w / scale is rounded to e4m3
    (through float32) in w's dtype."""
    r, c = w.shape
    br, bc = -(-r // FP8_BLOCK), -(-c // FP8_BLOCK)
    q = torch.empty(r, c, dtype=torch.float8_e4m3fn)
    s = torch.empty(br, bc, dtype=s_dtype)
    for i in range(br):
        for j in range(bc):
            sl = (slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK), slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK))
            sc = scale_of(w[sl].abs().max().item())
            s[i, j] = sc
            q[sl] = (w[sl] / sc).to(torch.float32).to(torch.float8_e4m3fn)
    return q, s


def quantize_fp8(w):
    """DeepSeek-V3 style: block-quantize a 2-D weight in float32: returns (q e4m3 [R,C],
    scale_inv f32 [ceil(R/128), ceil(C/128)]) with w ~= q * scale_inv per block."""

    def scale_of(amax):
        return torch.tensor(amax / FP8_MAX if amax > 0 else 1.0, dtype=torch.float32)

    return _quantize_fp8_blocks(w.to(torch.float32), scale_of, torch.float32)


def dequantize_fp8(q, s):
    r, c = q.shape
    sf = s.to(torch.float64).repeat_interleave(FP8_BLOCK, 0)[:r].repeat_interleave(FP8_BLOCK, 1)[:, :c]
    return q.to(torch.float64) * sf


def ceil_log2_pow2(x):
    """2**ceil(log2(x)) for x > 0 (E8M0-representable power-of-two scale), computed exactly."""
    m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    return 2.0 ** (e - 1) if m == 0.5 else 2.0**e


def quantize_fp8_e8m0(w):
    """DeepSeek-V4 style: 128x128 blocks in float64, power-of-two scale 2^ceil(log2(amax/448))
    stored as E8M0."""

    def scale_of(amax):
        return ceil_log2_pow2(amax / FP8_MAX) if amax > 0 else 1.0

    q, s = _quantize_fp8_blocks(w.to(torch.float64), scale_of, torch.float64)
    return q, s.to(torch.float8_e8m0fnu)


def quantize_fp4_e8m0(w):
    """E2M1 per element, E8M0 scale 2^ceil(log2(amax/6)) per 32 columns; packed 2 per byte,
    low nibble = even column; nibble = sign<<3 | index into FP4_VALUES."""
    w = w.to(torch.float64)
    r, c = w.shape
    assert c % 32 == 0
    blocks = w.view(r, c // 32, 32)
    amax = blocks.abs().amax(-1)
    s = torch.tensor([[ceil_log2_pow2(a / 6.0) if a > 0 else 1.0 for a in row] for row in amax.tolist()], dtype=torch.float64)
    x = blocks / s[..., None]
    vals = torch.tensor(FP4_VALUES, dtype=torch.float64)
    d = (x.abs()[..., None] - vals).abs()
    # nearest; ties -> even index (even mantissa)
    idx = d.argmin(-1)
    best = d.gather(-1, idx[..., None])[..., 0]
    for k in range(7):
        tie = (d[..., k] == best) & (d[..., k + 1] == best)
        idx = torch.where(tie, torch.full_like(idx, k if k % 2 == 0 else k + 1), idx)
    code = idx | ((x < 0) & (idx > 0)).long() << 3
    code = code.view(r, c)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, s.to(torch.float8_e8m0fnu)


def dequantize_fp4(packed, s):
    p = packed.view(torch.uint8).long()
    r = p.shape[0]
    codes = torch.stack([p & 15, p >> 4], -1).view(r, -1)
    vals = torch.tensor(FP4_VALUES, dtype=torch.float64)
    v = vals[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).to(torch.float64)
    return v * s.to(torch.float64).repeat_interleave(32, 1)


# --------------------------------------------------------------------------------------------
# Loading the reference model
# --------------------------------------------------------------------------------------------


def load_f64_pretrained(cls, folder):
    """`cls`.from_pretrained(folder) in float64, eager attention and experts, KV cache on."""
    model = cls.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    model.config.use_cache = True
    for k, v in model.named_parameters():
        assert v.dtype == torch.float64, (k, v.dtype)
    return model


def load_f64_scratch(cls, eff, write_config):
    """load_f64_pretrained on a scratch folder holding write_config(folder)'s config.json and
    the effective weights eff (float64, in name order)."""
    with tempfile.TemporaryDirectory() as tmp:
        write_config(tmp)
        save_sorted(eff, os.path.join(tmp, "model.safetensors"))
        return load_f64_pretrained(cls, tmp)


def check_experts(model, eff, prefix, gate, up, down):
    """Every fused expert of the model equals the stored per-expert weights exactly;
    prefix is formatted with layer= and e=."""
    for name, mod in model.named_modules():
        if name.endswith("mlp.experts"):
            layer = name.split(".")[2]
            for e in range(mod.num_experts):
                p = prefix.format(layer=layer, e=e)
                gu = torch.cat([eff[p + gate], eff[p + up]], 0)
                assert torch.equal(mod.gate_up_proj[e].detach(), gu), p
                assert torch.equal(mod.down_proj[e].detach(), eff[p + down]), p


# --------------------------------------------------------------------------------------------
# Reference runs
# --------------------------------------------------------------------------------------------


def top2_gap(row):
    v = row.topk(2).values
    return (v[0] - v[1]).item()


def forward_with_hooks(model, ids, handles):
    """One forward pass of ids without the KV cache (for the hooks that capture router /
    indexer inputs and scores for the margin checks), then remove the hook handles."""
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()


def compute_reference(case, model, prompt):
    """Prefill logits of the prompt, greedy continuation of case["n_new"] tokens by full
    recompute (checked against generate() with the KV cache), the greedy top-2 gaps, and the
    whole sequence prompt + greedy."""
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]
    seq = list(prompt)
    greedy, gm = [], []
    with torch.no_grad():
        for _ in range(case["n_new"]):
            lg = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            nxt = int(lg.argmax())
            gm.append(top2_gap(lg))
            greedy.append(nxt)
            seq.append(nxt)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=case["n_new"],
            min_new_tokens=case["n_new"],
            do_sample=False,
            use_cache=True,
        )
    gen_ids = out[0, len(prompt) :].tolist()
    assert gen_ids == greedy, f"generate() {gen_ids} != full-recompute greedy {greedy}"
    return logits, greedy, gm, seq


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def main(doc, cases, make_case):
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data"))
    ap.add_argument("--case", action="append", choices=sorted(cases), help="case to build (repeatable); default all")
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    for name in args.case or list(cases):
        make_case(name, os.path.normpath(args.out))
