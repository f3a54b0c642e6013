#!/usr/bin/env python3
"""Build tiny random DeepSeek-V4 checkpoints and float64 golden outputs for the e2e tests.

Usage: python3 tools/make_goldens_v4.py [--out tests/data] [--case NAME ...]

Same golden format as tools/make_goldens.py (V2/V3): each case folder holds
  config.json, model.safetensors
  ref.json          prompt, greedy continuation, margins, resolved rope, cross-checks
  ref_logits.f64    raw little-endian float64, row-major [n_prompt][vocab_size]

Design stance (see docs/v4-reference-notes.md):
- Weights are written as a real checkpoint would ship them: bf16 matrices and norms, fp32 for
  hc_*, attn_sink, ape, gate.bias, int64/int32 tid2eid. Two cases use the names transformers'
  save_pretrained writes (hybrid: model.layers.i.attn.wq_a.weight, ...); one case uses the
  upstream DeepSeek names with FP8 e4m3 (E8M0 128x128 block scales) and FP4 e2m1 routed
  experts (E8M0 scale per 32 columns), as V4-Flash ships.
- The reference runs in float64 on exactly the stored (dequantized) values. Stock transformers
  keeps mHC, RoPE, compressor softmax, indexer scores in float32 even in a float64 model, so the
  modeling file is re-executed with float32 -> float64 (load_f64_modeling); the stock deviation
  is recorded.
- Everything is seeded; a rerun writes byte-identical files.
- Router top-k (moe layers), Lightning-Indexer top-k and greedy choices are checked for
  near-ties; a case is reseeded until all margins are clear.
- independent_forward() is a from-the-files float64 forward written from the note alone.
"""

import json
import math
import os
import re
import shutil

import torch

torch.set_num_threads(1)

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import golden_common as gc  # noqa: E402
from golden_common import (  # noqa: E402
    compute_reference,
    dequantize_fp4,
    dequantize_fp8,
    quantize_fp4_e8m0,
    quantize_fp8_e8m0,
    write_json,
)

ROUTER_MARGIN = 1e-4
INDEXER_MARGIN = 1e-4
GREEDY_MARGIN = 1e-3
MAX_ATTEMPTS = 30

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

CASES = {
    "v4_mix_yarn": dict(
        seed=41001,
        upstream=False,
        description="hc_mult 4; layers [sliding, CSA, HCA, CSA] (window 16, CSA m=4 with overlap + "
        "indexer 16 heads x 32, top-6; HCA m=8); mlp [hash, hash, moe, moe] sqrtsoftplus top-2 of 8 + "
        "correction bias, rsf 1.5, swiglu_limit 1.5 (clamps active); YaRN on compress layers (theta 160000, "
        "factor 8, orig 64), plain rope theta 10000 on sliding; head_dim 48 with rope 16 (partial 1/3); "
        "o_groups 2. transformers save_pretrained names, bf16 + fp32.",
        n_prompt=88,
        n_new=14,
        chunks=[37, 1, 1, 1, 5, 16, 35],
        config=dict(
            vocab_size=400,
            hidden_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=4,
            num_attention_heads=4,
            head_dim=48,
            q_lora_rank=40,
            partial_rotary_factor=1 / 3,
            o_groups=2,
            o_lora_rank=24,
            sliding_window=16,
            layer_types=[SWA, CSA, HCA, CSA],
            compress_rates={CSA: 4, HCA: 8},
            index_n_heads=16,
            index_head_dim=32,
            index_topk=6,
            n_routed_experts=8,
            num_experts_per_tok=2,
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            routed_scaling_factor=1.5,
            swiglu_limit=1.5,
            hc_mult=4,
            hc_sinkhorn_iters=20,
            hc_eps=1e-6,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            compress_rope_theta=160000.0,
            max_position_embeddings=512,
            rope_parameters=dict(
                rope_type="yarn", factor=8.0, original_max_position_embeddings=64, beta_fast=32, beta_slow=1
            ),
            tie_word_embeddings=False,
        ),
    ),
    "v4_hc3_plain": dict(
        seed=42002,
        upstream=False,
        description="hc_mult 3, odd sizes (hidden 72, 3 heads x 40, rope 16, q_lora 36, o_groups 3 x 20); "
        "layers [HCA, sliding, CSA, HCA, CSA, sliding] (window 20, CSA m=4 + indexer 12 heads x 24, top-5; "
        "HCA m=16); mlp [hash, moe x5] top-3 of 6, rsf 2.0, swiglu_limit 2.0; plain rope everywhere "
        "(rope_theta 10000 on sliding, compress_rope_theta 40000 on CSA/HCA), 12 Sinkhorn iters, hc_eps 1e-4. "
        "transformers save_pretrained names, bf16 + fp32.",
        n_prompt=120,
        n_new=12,
        chunks=[50, 1, 1, 31, 1, 36],
        config=dict(
            vocab_size=352,
            hidden_size=72,
            moe_intermediate_size=40,
            num_hidden_layers=6,
            num_attention_heads=3,
            head_dim=40,
            q_lora_rank=36,
            partial_rotary_factor=0.4,
            o_groups=3,
            o_lora_rank=20,
            sliding_window=20,
            layer_types=[HCA, SWA, CSA, HCA, CSA, SWA],
            compress_rates={CSA: 4, HCA: 16},
            index_n_heads=12,
            index_head_dim=24,
            index_topk=5,
            n_routed_experts=6,
            num_experts_per_tok=3,
            mlp_layer_types=["hash_moe", "moe", "moe", "moe", "moe", "moe"],
            routed_scaling_factor=2.0,
            swiglu_limit=2.0,
            hc_mult=3,
            hc_sinkhorn_iters=12,
            hc_eps=1e-4,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            compress_rope_theta=40000.0,
            max_position_embeddings=512,
            rope_parameters=None,
            tie_word_embeddings=False,
        ),
    ),
    "v4_upstream_fp8": dict(
        seed=43003,
        upstream=True,
        description="Upstream DeepSeek tensor names and dtypes as V4-Flash ships: FP8 e4m3 + E8M0 128x128 block "
        "scales (wq_a, wq_b, wkv, wo_a, wo_b, indexer.wq_b, shared experts), FP4 e2m1 routed experts packed "
        "2/byte (I8) + E8M0 scale per 32 columns, bf16 embed/head/norms/compressor/indexer/gate, fp32 hc_*, "
        "attn_sink, ape, gate.bias, int32 tid2eid; upstream config.json (compress_ratios, num_hash_layers, "
        "qk_rope_head_dim, rope_scaling, quantization_config). hc_mult 4, hidden 160 (partial FP8 blocks), "
        "layers [sliding, sliding, CSA, HCA] (window 16, CSA m=4 + indexer 16 x 32 top-4, HCA m=8 [Flash: 128]), "
        "mlp [hash, hash, moe, moe] top-2 of 8, YaRN factor 16 (orig 32). Reference on dequantized values.",
        n_prompt=72,
        n_new=12,
        chunks=[29, 1, 1, 1, 40],
        config=dict(
            vocab_size=320,
            hidden_size=160,
            moe_intermediate_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            head_dim=64,
            q_lora_rank=48,
            partial_rotary_factor=0.25,
            o_groups=2,
            o_lora_rank=32,
            sliding_window=16,
            layer_types=[SWA, SWA, CSA, HCA],
            compress_rates={CSA: 4, HCA: 8},
            index_n_heads=16,
            index_head_dim=32,
            index_topk=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            routed_scaling_factor=1.5,
            swiglu_limit=1.5,
            hc_mult=4,
            hc_sinkhorn_iters=20,
            hc_eps=1e-6,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            compress_rope_theta=160000.0,
            max_position_embeddings=512,
            rope_parameters=dict(
                rope_type="yarn", factor=16.0, original_max_position_embeddings=32, beta_fast=32, beta_slow=1
            ),
            tie_word_embeddings=False,
        ),
    ),
}

# --------------------------------------------------------------------------------------------
# A float64 copy of the transformers modeling code
# --------------------------------------------------------------------------------------------

def load_f64_modeling():
    """Return transformers' modeling_deepseek_v4 re-executed with float32 -> float64."""
    return gc.load_f64_modeling("deepseek_v4")


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

FP32_RE = re.compile(r"(hc_attn_|hc_ffn_|hc_head|attn_sink|\.ape$|gate\.bias$)")


def init_weights(model, gen, cfg):
    """Overwrite every parameter with seeded values of a realistic scale (float32)."""
    sd = model.state_dict()
    n, D = cfg.hc_mult, cfg.hidden_size
    for name in sorted(sd):
        t = sd[name]
        if "rotary_emb" in name:
            continue
        shape = t.shape
        if name.endswith("tid2eid"):
            # distinct random experts per token
            v = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[: shape[1]] for _ in range(shape[0])])
            t.copy_(v)
            continue
        v = gc.init_common(name, shape, gen, head_scale=2.0)
        if v is not None:
            pass
        elif name.endswith("_hc.fn") or name.endswith("hc_head.hc_fn"):
            v = (1.0 / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
        elif name.endswith("_hc.base") or name.endswith("hc_base"):
            v = 0.5 * torch.randn(shape, generator=gen)
        elif name.endswith("_hc.scale") or name.endswith("hc_scale"):
            v = 0.5 + torch.rand(shape, generator=gen)
        elif name.endswith("sinks"):
            v = torch.randn(shape, generator=gen)
        elif name.endswith("position_bias"):
            v = 0.5 * torch.randn(shape, generator=gen)
        elif name.endswith("compressor.gate_proj.weight") or name.endswith("indexer.gate_proj.weight"):
            v = (1.5 / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
        elif ".experts.gate_up_proj" in name or name.endswith("shared_experts.gate_proj.weight") or name.endswith(
            "shared_experts.up_proj.weight"
        ):
            v = (1.25 / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
        else:
            v = (1.0 / math.sqrt(shape[-1])) * torch.randn(shape, generator=gen)
        t.copy_(v)


# HF save_pretrained name (hybrid) -> upstream name
def upstream_name(k):
    k = {
        "model.embed_tokens.weight": "embed.weight",
        "head.weight": "head.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }.get(k, k)
    if k.startswith("model."):
        k = k[len("model.") :]
    k = re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", k)
    return k


FP8_UP_RE = re.compile(r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|attn\.indexer\.wq_b|shared_experts\.w[123])\.weight$")
FP4_UP_RE = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def hf_config(case):
    c = dict(case["config"])
    if c.get("rope_parameters") is None:
        c.pop("rope_parameters", None)
    cfg = transformers.DeepseekV4Config(**c)
    return cfg


def upstream_config_json(case):
    c = case["config"]
    ratio = {SWA: 0, CSA: c["compress_rates"][CSA], HCA: c["compress_rates"][HCA]}
    n_hash = sum(1 for t in c["mlp_layer_types"] if t == "hash_moe")
    assert c["mlp_layer_types"] == ["hash_moe"] * n_hash + ["moe"] * (len(c["mlp_layer_types"]) - n_hash)
    rp = c["rope_parameters"]
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "moe_intermediate_size": c["moe_intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": c["head_dim"],
        "qk_rope_head_dim": int(c["head_dim"] * c["partial_rotary_factor"]),
        "q_lora_rank": c["q_lora_rank"],
        "o_lora_rank": c["o_lora_rank"],
        "o_groups": c["o_groups"],
        "hidden_act": "silu",
        "swiglu_limit": c["swiglu_limit"],
        "rms_norm_eps": c["rms_norm_eps"],
        "max_position_embeddings": c["max_position_embeddings"],
        "sliding_window": c["sliding_window"],
        "rope_theta": c["rope_theta"],
        "compress_rope_theta": c["compress_rope_theta"],
        "rope_scaling": {
            "type": "yarn",
            "factor": rp["factor"],
            "original_max_position_embeddings": rp["original_max_position_embeddings"],
            "beta_fast": rp["beta_fast"],
            "beta_slow": rp["beta_slow"],
        },
        "num_nextn_predict_layers": 1,
        "compress_ratios": [ratio[t] for t in c["layer_types"]] + [0],
        "index_n_heads": c["index_n_heads"],
        "index_head_dim": c["index_head_dim"],
        "index_topk": c["index_topk"],
        "hc_mult": c["hc_mult"],
        "hc_sinkhorn_iters": c["hc_sinkhorn_iters"],
        "hc_eps": c["hc_eps"],
        "n_routed_experts": c["n_routed_experts"],
        "n_shared_experts": 1,
        "num_experts_per_tok": c["num_experts_per_tok"],
        "norm_topk_prob": True,
        "routed_scaling_factor": c["routed_scaling_factor"],
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "num_hash_layers": n_hash,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    }


# --------------------------------------------------------------------------------------------
# Checkpoint
# --------------------------------------------------------------------------------------------


def build_checkpoint(case, attempt, folder):
    """Create the random model and write the case folder. Returns eff: float64 effective
    weights in transformers save_pretrained naming (what the reference loads)."""
    cfg = hf_config(case)
    gen = gc.seed_case(case, attempt)
    model = transformers.DeepseekV4ForCausalLM(cfg).eval()
    with torch.no_grad():
        init_weights(model, gen, cfg)
    hf_cfg, tensors = gc.save_pretrained_tensors(model)
    out = {}
    for k, t in tensors.items():
        if t.is_floating_point():
            out[k] = t.to(torch.float32) if FP32_RE.search(k) else t.to(torch.bfloat16)
        else:
            out[k] = t.to(torch.int64)
    eff = {k: (t.to(torch.float64) if t.is_floating_point() else t) for k, t in out.items()}
    os.makedirs(folder, exist_ok=True)
    if case["upstream"]:
        up = {}
        for k in sorted(out):
            u = upstream_name(k)
            t = out[k]
            if FP8_UP_RE.search(u):
                q, s = quantize_fp8_e8m0(t)
                up[u] = q
                up[u[: -len(".weight")] + ".scale"] = s
                eff[k] = dequantize_fp8(q, s)
            elif FP4_UP_RE.search(u):
                q, s = quantize_fp4_e8m0(t)
                up[u] = q
                up[u[: -len(".weight")] + ".scale"] = s
                eff[k] = dequantize_fp4(q, s)
            elif u.endswith("tid2eid"):
                up[u] = t.to(torch.int32)
            else:
                up[u] = t
        gc.write_safetensors(folder, up)
        write_json(os.path.join(folder, "config.json"), upstream_config_json(case))
    else:
        gc.write_safetensors(folder, out)
        hf_cfg["dtype"] = "bfloat16"
        hf_cfg.pop("transformers_version", None)
        write_json(os.path.join(folder, "config.json"), hf_cfg)
    return cfg, eff


def load_reference(cfg, eff, cls):
    """Load `cls` (float64 rewrite or stock) in float64 on exactly the effective weights."""
    model = gc.load_f64_scratch(cls, eff, cfg.save_pretrained)
    msd = model.state_dict()
    # every weight equals the stored value exactly
    gc.check_experts(model, eff, "model.layers.{layer}.ffn.experts.{e}.", "w1.weight", "w3.weight", "w2.weight")
    n_checked = sum(1 for k in msd if msd[k].dtype == torch.float64)
    assert n_checked > 0
    return model


# --------------------------------------------------------------------------------------------
# Reference runs
# --------------------------------------------------------------------------------------------


def exact_inv_freq(cfg, kind):
    rp = cfg.rope_parameters[kind]
    rd = cfg.qk_rope_head_dim
    base = float(rp["rope_theta"])
    i = torch.arange(0, rd, 2, dtype=torch.float64)
    inv = 1.0 / (base ** (i / rd))
    if rp["rope_type"] == "yarn":
        f = float(rp["factor"])
        L0 = rp["original_max_position_embeddings"]

        def cdim(b):
            return rd * math.log(L0 / (b * 2 * math.pi)) / (2 * math.log(base))

        lo = max(math.floor(cdim(rp["beta_fast"])), 0)
        hi = min(math.ceil(cdim(rp["beta_slow"])), rd - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(rd // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        inv = (inv / f) * ramp + inv * (1 - ramp)
    else:
        assert rp["rope_type"] == "default"
    return inv


def check_resolved(cfg, model):
    rot = model.model.rotary_emb
    res = {"qk_rope_head_dim": cfg.qk_rope_head_dim}
    for kind in ("main", "compress"):
        inv = exact_inv_freq(cfg, kind)
        got = getattr(rot, f"{kind}_inv_freq").to(torch.float64)
        assert (got - inv).abs().max().item() < 1e-15 * 10, (kind, got, inv)
        att = getattr(rot, f"{kind}_attention_scaling")
        assert att == 1.0, att
        rp = cfg.rope_parameters[kind]
        res[kind] = {
            "rope_type": rp["rope_type"],
            "rope_theta": rp["rope_theta"],
            "attention_factor": att,
            "inv_freq": inv.tolist(),
        }
        if rp["rope_type"] == "yarn":
            res[kind].update({k: rp[k] for k in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")})
    res["layer_types"] = list(cfg.layer_types)
    res["mlp_layer_types"] = list(cfg.mlp_layer_types)
    res["compress_rates"] = dict(cfg.compress_rates)
    res["softmax_scale"] = cfg.head_dim**-0.5
    res["indexer_score_scale"] = cfg.index_head_dim**-0.5
    res["indexer_weight_scale"] = cfg.index_n_heads**-0.5
    return res


def margins(model, cfg, ids):
    """Smallest float64 gap at any router (moe) / indexer top-k cut over the sequence ids."""
    routers, scores = [], []

    def rhook(mod, args):
        routers.append((mod, args[0].detach().reshape(-1, mod.hidden_dim)))

    def shook(mod, args, out):
        scores.append((mod, out.detach()[0]))

    hs = []
    for n, m in model.named_modules():
        if n.endswith("mlp.gate") and type(m).__name__ == "DeepseekV4TopKRouter":
            hs.append(m.register_forward_pre_hook(rhook))
        if n.endswith("indexer.scorer"):
            hs.append(m.register_forward_hook(shook))
    gc.forward_with_hooks(model, ids, hs)
    rworst = float("inf")
    for mod, x in routers:
        s = torch.nn.functional.softplus(x @ mod.weight.detach().T).sqrt() + mod.e_score_correction_bias.to(torch.float64)
        ss = s.sort(-1, descending=True).values
        rworst = min(rworst, (ss[:, mod.top_k - 1] - ss[:, mod.top_k]).min().item())
    iworst, n_cut, zero_rows = float("inf"), 0, 0
    m, k = cfg.compress_rates[CSA], cfg.index_topk
    for mod, sc in scores:
        T = sc.shape[0]
        for t in range(T):
            nv = (t + 1) // m
            if nv <= k:
                continue
            v = sc[t, :nv].sort(descending=True).values
            n_cut += 1
            iworst = min(iworst, (v[k - 1] - v[k]).item())
            zero_rows += int((v == 0).any())
    return rworst, iworst, n_cut, zero_rows


def chunked_logits(model, seq, chunks):
    """Run seq through the model in chunks with a DynamicCache (prefill pieces and 1-token steps)."""
    from transformers import DynamicCache

    assert sum(chunks) == len(seq), (sum(chunks), len(seq))
    cache = DynamicCache(config=model.config)
    outs, pos = [], 0
    with torch.no_grad():
        for c in chunks:
            ids = torch.tensor([seq[pos : pos + c]])
            out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                        position_ids=torch.arange(pos, pos + c).unsqueeze(0))
            cache = out.past_key_values
            outs.append(out.logits[0])
            pos += c
    return torch.cat(outs, 0)


def swiglu_clamp_stats(model, ids):
    """Counts of routed-expert gate/up pre-activations hit by the swiglu_limit clamp (prompt+greedy)."""
    cnt = {"gate": 0, "up": 0, "total": 0}
    stats = []
    L = model.config.swiglu_limit
    for n, m in model.named_modules():
        if n.endswith("mlp.experts"):
            orig = m._apply_gate

            def wrap(gu, orig=orig):
                g, u = gu.chunk(2, dim=-1)
                stats.append(((g > L).sum().item(), ((u > L) | (u < -L)).sum().item(), g.numel()))
                return orig(gu)

            m._apply_gate = wrap
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for n, m in model.named_modules():
        if n.endswith("mlp.experts"):
            del m._apply_gate
    for g, u, t in stats:
        cnt["gate"] += g
        cnt["up"] += u
        cnt["total"] += t
    return cnt


# --------------------------------------------------------------------------------------------
# Independent check: a from-the-files float64 forward pass written from docs/v4-reference-notes.md,
# sharing no code with transformers. Reads either config spelling and either tensor naming.
# --------------------------------------------------------------------------------------------


def read_checkpoint(folder):
    """Return (cfg dict normalised, weights dict in canonical upstream-style names, float64)."""
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    raw = load_file(os.path.join(folder, "model.safetensors"))
    L = c["num_hidden_layers"]
    if "layer_types" in c:  # transformers spelling
        types_ = c["layer_types"]
        rates = c["compress_rates"]
        ratio = [0 if t == SWA else rates[t] for t in types_]
        kinds = ["swa" if t == SWA else ("csa" if t == CSA else "hca") for t in types_]
        hashl = [t == "hash_moe" for t in c["mlp_layer_types"]]
        rd = int(c["head_dim"] * c["partial_rotary_factor"])
        comp = c["rope_parameters"]["compress"]
        main_theta = c["rope_parameters"]["main"]["rope_theta"]
        yarn = comp if comp.get("rope_type") == "yarn" else None
        comp_theta = comp["rope_theta"]
    else:  # upstream spelling
        ratio = c["compress_ratios"][:L]
        kinds = ["swa" if r == 0 else ("csa" if r == 4 else "hca") for r in ratio]
        hashl = [i < c["num_hash_layers"] for i in range(L)]
        rd = c["qk_rope_head_dim"]
        yarn = c.get("rope_scaling")
        main_theta, comp_theta = c["rope_theta"], c["compress_rope_theta"]
    cfg = dict(c, ratio=ratio, kinds=kinds, hashl=hashl, rd=rd, yarn=yarn, main_theta=main_theta, comp_theta=comp_theta)

    # canonical names: upstream (strip "model.", kv_norm for the main attention norm)
    w = {}
    for k, t in raw.items():
        if k.endswith(".scale") and (k[: -len(".scale")] + ".weight") in raw:
            continue
        u = upstream_name(k)
        if k.endswith(".weight") and (k[: -len(".weight")] + ".scale") in raw:
            s = raw[k[: -len(".weight")] + ".scale"]
            if t.dtype == torch.float8_e4m3fn:
                t = dequantize_fp8(t, s)
            else:
                assert t.dtype == torch.int8
                t = dequantize_fp4(t, s)
        w[u] = t.to(torch.float64) if t.is_floating_point() else t.long()
    return cfg, w


def independent_forward(folder, ids):
    cfg, W = read_checkpoint(folder)
    f64 = torch.float64
    T = len(ids)
    tok = torch.tensor(ids)
    D, H, d, rd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["rd"]
    n = cfg["hc_mult"]
    eps, hc_eps = cfg["rms_norm_eps"], cfg["hc_eps"]
    Wn, g, r = cfg["sliding_window"], cfg["o_groups"], cfg["o_lora_rank"]
    nI, dI, topk = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    K, L_sw, rsf = cfg["num_experts_per_tok"], cfg["swiglu_limit"], cfg["routed_scaling_factor"]
    pos = torch.arange(T, dtype=f64)

    def rms(x, wt=None):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y * wt if wt is not None else y

    def inv_freq(theta, yarn):
        i = torch.arange(0, rd, 2, dtype=f64)
        inv = 1.0 / (theta ** (i / rd))
        if yarn:
            L0, f = yarn["original_max_position_embeddings"], yarn["factor"]
            cd = lambda b: rd * math.log(L0 / (b * 2 * math.pi)) / (2 * math.log(theta))  # noqa: E731
            lo, hi = max(math.floor(cd(yarn["beta_fast"])), 0), min(math.ceil(cd(yarn["beta_slow"])), rd - 1)
            hi = hi + 0.001 if lo == hi else hi
            ramp = ((torch.arange(rd // 2, dtype=f64) - lo) / (hi - lo)).clamp(0, 1)
            inv = inv / f * ramp + inv * (1 - ramp)
        return inv

    inv_main = inv_freq(cfg["main_theta"], None)
    inv_comp = inv_freq(cfg["comp_theta"], cfg["yarn"])

    def rope(x, p, inv, sign=1.0):
        # x [P, ..., dim], positions p [P] on dim 0; rotate the trailing rd dims, pairs (2i, 2i+1)
        ang = p[:, None] * inv[None, :]  # [P, rd/2]
        shape = [x.shape[0]] + [1] * (x.dim() - 2) + [rd // 2]
        cos, sin = torch.cos(ang).view(shape), (sign * torch.sin(ang)).view(shape)
        a, b = x[..., -rd::2], x[..., -rd + 1 :: 2]
        rot = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
        return torch.cat([x[..., :-rd], rot], -1)

    def hc_pre(X, fn, base, scale, iters):
        flat = X.reshape(T, n * D)
        flat = flat / torch.sqrt((flat * flat).mean(-1, keepdim=True) + eps)
        mix = flat @ fn.T
        pre = torch.sigmoid(mix[:, :n] * scale[0] + base[:n]) + hc_eps
        if iters is None:
            return pre, None, None
        post = 2 * torch.sigmoid(mix[:, n : 2 * n] * scale[1] + base[n : 2 * n])
        M = torch.softmax(mix[:, 2 * n :].view(T, n, n) * scale[2] + base[2 * n :].view(n, n), -1) + hc_eps
        M = M / (M.sum(-2, keepdim=True) + hc_eps)
        for _ in range(iters - 1):
            M = M / (M.sum(-1, keepdim=True) + hc_eps)
            M = M / (M.sum(-2, keepdim=True) + hc_eps)
        return pre, post, M

    def compress(x, p, m, width, overlap, normw):
        """Entries of the (overlapping) compressor; returns [nW, width] (normed, roped at w*m)."""
        nW = T // m
        if nW == 0:
            return torch.zeros(0, width, dtype=f64)
        c = x[: nW * m] @ W[p + "wkv.weight"].T
        z = x[: nW * m] @ W[p + "wgate.weight"].T + W[p + "ape"].repeat(nW, 1)
        c, z = c.view(nW, m, -1), z.view(nW, m, -1)
        if overlap:  # slots: previous window's first half (Ca), this window's second half (Cb)
            cb, zb = c[..., width:], z[..., width:]
            ca = torch.cat([torch.zeros(1, m, width, dtype=f64), c[:-1, :, :width]], 0)
            za = torch.cat([torch.full((1, m, width), -math.inf, dtype=f64), z[:-1, :, :width]], 0)
            c, z = torch.cat([ca, cb], 1), torch.cat([za, zb], 1)
        e = (c * torch.softmax(z, 1)).sum(1)
        e = rms(e, W[p + "norm.weight"])
        return rope(e, torch.arange(nW, dtype=f64) * m, inv_comp)

    def attention(x, i, kind):
        p = f"layers.{i}.attn."
        inv = inv_main if kind == "swa" else inv_comp
        qr = rms(x @ W[p + "wq_a.weight"].T, W[p + "q_norm.weight"])
        q = rms((qr @ W[p + "wq_b.weight"].T).view(T, H, d))
        q = rope(q, pos, inv)
        kv = rope(rms(x @ W[p + "wkv.weight"].T, W[p + "kv_norm.weight"]), pos, inv)  # [T, d]
        t_idx = torch.arange(T)
        # window mask [T, T]: t-W < s <= t
        allow = (t_idx[None, :] <= t_idx[:, None]) & (t_idx[:, None] - t_idx[None, :] < Wn)
        keys = kv
        if kind != "swa":
            m = cfg["ratio"][i]
            ent = compress(x, p + "compressor.", m, d, kind == "csa", None)
            nW = ent.shape[0]
            vis = torch.arange(nW)[None, :] < ((t_idx + 1) // m)[:, None]  # [T, nW]
            if kind == "csa" and nW > 0:
                pi = p + "indexer."
                KI = compress(x, pi + "compressor.", m, dI, True, None)
                qI = rope((qr @ W[pi + "wq_b.weight"].T).view(T, nI, dI), pos, inv_comp)
                wgt = (x @ W[pi + "weights_proj.weight"].T) * nI**-0.5
                sc = (torch.relu(torch.einsum("thc,wc->thw", qI, KI)) * dI**-0.5 * wgt[:, :, None]).sum(1)
                sc = sc.masked_fill(~vis, -math.inf)
                sel = torch.zeros_like(vis)
                for t in range(T):
                    nv = int(vis[t].sum())
                    if nv:
                        sel[t, sc[t].topk(min(topk, nv)).indices] = True
                vis = sel
            keys = torch.cat([kv, ent], 0)
            allow = torch.cat([allow, vis], 1)
        lg = torch.einsum("thc,sc->ths", q, keys) * d**-0.5
        lg = lg.masked_fill(~allow[:, None, :], -math.inf)
        sink = W[p + "attn_sink"].view(1, H, 1).expand(T, H, 1)
        full = torch.cat([lg, sink], -1)
        pr = torch.softmax(full, -1)[..., :-1]
        o = torch.einsum("ths,sc->thc", pr, keys)
        o = rope(o, pos, inv, sign=-1.0).reshape(T, g, H * d // g)
        wa = W[p + "wo_a.weight"].view(g, r, H * d // g)
        z = torch.einsum("tgc,grc->tgr", o, wa).reshape(T, g * r)
        return z @ W[p + "wo_b.weight"].T

    def swiglu(x, w1, w3, w2):
        a = torch.nn.functional.silu((x @ w1.T).clamp(max=L_sw)) * (x @ w3.T).clamp(-L_sw, L_sw)
        return a @ w2.T

    def moe(x, i):
        p = f"layers.{i}.ffn."
        s = torch.sqrt(torch.nn.functional.softplus(x @ W[p + "gate.weight"].T))
        if cfg["hashl"][i]:
            sel = W[p + "gate.tid2eid"][tok]
        else:
            sel = (s + W[p + "gate.bias"]).topk(K, -1).indices
        wt = s.gather(1, sel)
        wt = wt / (wt.sum(-1, keepdim=True) + 1e-20) * rsf
        out = torch.zeros(T, D, dtype=f64)
        for t in range(T):
            for j in range(K):
                e = int(sel[t, j])
                q = p + f"experts.{e}."
                out[t] += wt[t, j] * swiglu(x[t : t + 1], W[q + "w1.weight"], W[q + "w3.weight"], W[q + "w2.weight"])[0]
        sp = p + "shared_experts."
        return out + swiglu(x, W[sp + "w1.weight"], W[sp + "w3.weight"], W[sp + "w2.weight"])

    X = W["embed.weight"][tok][:, None, :].expand(T, n, D).clone()
    iters = cfg["hc_sinkhorn_iters"]
    for i in range(cfg["num_hidden_layers"]):
        pl = f"layers.{i}."
        for sub in ("attn", "ffn"):
            pre, post, M = hc_pre(X, W[pl + f"hc_{sub}_fn"], W[pl + f"hc_{sub}_base"], W[pl + f"hc_{sub}_scale"], iters)
            h = (pre[:, :, None] * X).sum(1)
            if sub == "attn":
                y = attention(rms(h, W[pl + "attn_norm.weight"]), i, cfg["kinds"][i])
            else:
                y = moe(rms(h, W[pl + "ffn_norm.weight"]), i)
            X = post[:, :, None] * y[:, None, :] + torch.einsum("tjk,tjd->tkd", M, X)
    pre, _, _ = hc_pre(X, W["hc_head_fn"], W["hc_head_base"], W["hc_head_scale"].expand(3), None)
    h = (pre[:, :, None] * X).sum(1)
    return rms(h, W["norm.weight"]) @ W["head.weight"].T


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def make_case(name, out_root):
    case = CASES[name]
    folder = os.path.join(out_root, name)
    f64 = load_f64_modeling()
    for attempt in range(MAX_ATTEMPTS):
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        cfg, eff = build_checkpoint(case, attempt, folder)
        model = load_reference(cfg, eff, f64.DeepseekV4ForCausalLM)
        resolved = check_resolved(cfg, model)
        prompt = gc.random_prompt(case, cfg.vocab_size)
        logits, greedy, gms, seq = compute_reference(case, model, prompt)
        rmin, imin, n_cut, zero_rows = margins(model, cfg, torch.tensor([seq[:-1]]))
        gmin = min(gms)
        print(f"[{name}] attempt {attempt}: router {rmin:.3g} indexer {imin:.3g} ({n_cut} cuts, {zero_rows} with 0-scores) "
              f"greedy {gmin:.3g} logit std {logits.std().item():.3g}", flush=True)
        if rmin > ROUTER_MARGIN and imin > INDEXER_MARGIN and gmin > GREEDY_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no seed with clear margins in {MAX_ATTEMPTS} attempts")

    stock = load_reference(cfg, eff, transformers.DeepseekV4ForCausalLM)
    with torch.no_grad():
        sl = stock(input_ids=torch.tensor([prompt]), use_cache=False).logits[0]
    stock_diff = (sl - logits).abs().max().item()
    assert stock_diff < 1e-3, stock_diff

    full_seq = seq[:-1]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([full_seq]), use_cache=False).logits[0]
    chunks = list(case["chunks"])
    if sum(chunks) < len(full_seq):
        chunks.append(len(full_seq) - sum(chunks))
    ch = chunked_logits(model, full_seq, chunks)
    chunk_diff = (ch - full).abs().max().item()
    assert chunk_diff < 1e-9, chunk_diff

    clamp = swiglu_clamp_stats(model, torch.tensor([full_seq]))

    ind = independent_forward(folder, full_seq)
    ind_diff = (ind[: len(prompt)] - logits).abs().max().item()
    ind_full_diff = (ind - full).abs().max().item()
    assert ind_full_diff < 1e-9, f"independent implementation differs by {ind_full_diff}"
    assert ind[len(prompt) - 1 :].argmax(-1).tolist() == greedy

    gc.write_f64(os.path.join(folder, "ref_logits.f64"), logits)
    ref = {
        **gc.ref_json_head(name, case, prompt, cfg.vocab_size, greedy, attempt),
        "tensor_naming": "upstream" if case["upstream"] else "transformers_save_pretrained",
        "weights_dtype": "fp8_e4m3+e8m0_block128, fp4_e2m1+e8m0_per32 (routed experts), bf16, fp32" if case["upstream"] else "bf16 + fp32 (hc_*, attn_sink, ape, gate.bias) + int64 tid2eid",
        "min_router_margin": rmin,
        "min_indexer_margin": imin,
        "indexer_cuts_checked": n_cut,
        "min_greedy_logit_margin": gmin,
        "prompt_argmax_ids": logits.argmax(-1).tolist(),
        "swiglu_clamped": clamp,
        "stock_transformers_f64_max_abs_diff": stock_diff,
        "chunked": {
            "chunks": chunks,
            "over": "prompt_ids + greedy_ids[:-1] (positions 0..n_prompt+n_greedy-2)",
            "max_abs_diff_vs_full_prefill": chunk_diff,
        },
        "independent_impl_max_abs_diff": max(ind_diff, ind_full_diff),
        "resolved": resolved,
    }
    write_json(os.path.join(folder, "ref.json"), ref)
    total = gc.list_folder(folder, 24)
    print(f"[{name}] done: {total} bytes, stock diff {stock_diff:.3g}, chunked diff {chunk_diff:.3g}, "
          f"independent diff {max(ind_diff, ind_full_diff):.3g}, clamp {clamp}", flush=True)
    assert total < 2 * 1024 * 1024, total


def main():
    gc.main(__doc__, CASES, make_case)


if __name__ == "__main__":
    main()
