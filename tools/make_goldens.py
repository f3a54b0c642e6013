#!/usr/bin/env python3
"""Build tiny random DeepSeek-V2/V3 checkpoints and float64 golden outputs for the e2e tests.

Usage: python3 tools/make_goldens.py [--out tests/data] [--case NAME ...]

Each case folder holds what a published Hugging Face checkpoint holds (config.json, safetensors
weights, optionally sharded with model.safetensors.index.json) plus
  ref.json          prompt, greedy continuation and the resolved semantics (rope, scales, ...)
  ref_logits.f64    raw little-endian float64, row-major [n_prompt][vocab_size]

Design stance:
- Weights are stored as bf16 (one case as DeepSeek-style block FP8). The reference runs on
  EXACTLY the stored values, converted to float64.
- Stock transformers 5.x upcasts to float32 in RMSNorm, the router, RoPE and the attention
  softmax even when the model is float64. To get a true float64 reference, the transformers
  modeling file is executed a second time with every float32 spelling replaced by float64
  (see load_f64_modeling). The code is otherwise the transformers code, line for line. The
  stock model is also run and its max deviation recorded in ref.json as a cross-check.
- Everything is seeded; a rerun writes byte-identical files.
- Routing and greedy choices are checked for near-ties; a case is reseeded until every
  top-k boundary has a margin > ROUTER_MARGIN and every greedy step > GREEDY_MARGIN.
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
from golden_common import FP8_BLOCK, compute_reference, dequantize_fp8, quantize_fp8, write_json  # noqa: E402

ROUTER_MARGIN = 1e-4
GREEDY_MARGIN = 1e-3
MAX_ATTEMPTS = 40

# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------

CASES = {
    "v2_lite": dict(
        arch="v2",
        seed=1001,
        spelling="deepseek",
        description="DeepSeek-V2-Lite shape: no q_lora, softmax greedy top-2 of 8, 2 shared experts, "
        "first layer dense, norm_topk_prob false, no rope scaling; DeepSeek config spelling.",
        n_prompt=24,
        n_new=16,
        config=dict(
            vocab_size=400,
            hidden_size=96,
            intermediate_size=192,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=48,
            qk_nope_head_dim=24,
            qk_rope_head_dim=16,
            v_head_dim=24,
            n_routed_experts=8,
            n_shared_experts=2,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            topk_method="greedy",
            n_group=None,
            topk_group=None,
            norm_topk_prob=False,
            routed_scaling_factor=1.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_theta=10000.0,
            rope_scaling=None,
            tie_word_embeddings=False,
        ),
    ),
    "v2_qlora_yarn": dict(
        arch="v2",
        seed=2002,
        spelling="deepseek",
        description="DeepSeek-V2 shape: q_lora, YaRN (factor 4, orig 64, mscale = mscale_all_dim = 0.707), "
        "softmax group_limited_greedy (8 experts, 4 groups, topk_group 2, top-2), routed_scaling_factor 1.5; "
        "DeepSeek config spelling.",
        n_prompt=32,
        n_new=14,
        config=dict(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=64,
            kv_lora_rank=48,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_theta=10000.0,
            rope_scaling=dict(
                type="yarn",
                factor=4.0,
                original_max_position_embeddings=64,
                beta_fast=32,
                beta_slow=1,
                mscale=0.707,
                mscale_all_dim=0.707,
            ),
            tie_word_embeddings=False,
        ),
    ),
    "v3_grouped": dict(
        arch="v3",
        seed=3003,
        spelling="hf5",
        sharded=True,
        mtp=True,
        description="DeepSeek-V3 shape: q_lora, sigmoid noaux_tc (16 experts, 4 groups, topk_group 2, top-4), "
        "non-zero e_score_correction_bias (F32), norm_topk_prob, routed_scaling_factor 2.5, YaRN factor 8 "
        "(mscale = mscale_all_dim = 1.0), interleaved rope; one MTP layer stored as model.layers.{L}.* "
        "(to be ignored); transformers-5 config spelling; sharded safetensors.",
        n_prompt=28,
        n_new=16,
        config=dict(
            vocab_size=384,
            hidden_size=96,
            intermediate_size=160,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=48,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=16,
            v_head_dim=24,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rms_norm_eps=1e-6,
            max_position_embeddings=512,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=8.0,
                original_max_position_embeddings=64,
                beta_fast=32,
                beta_slow=1,
                mscale=1.0,
                mscale_all_dim=1.0,
            ),
            rope_interleave=True,
            num_nextn_predict_layers=1,
            tie_word_embeddings=False,
        ),
    ),
    "v3_fp8": dict(
        arch="v3",
        seed=4004,
        spelling="deepseek",
        fp8=True,
        description="DeepSeek-V3 shape with block FP8 (e4m3, 128x128, weight_scale_inv) as published; "
        "hidden 192 and other dims not multiples of 128 (partial edge blocks); sigmoid noaux_tc "
        "(8 experts, 2 groups, topk_group 1, top-2), YaRN factor 4 with mscale 1.0 != mscale_all_dim 0.8 "
        "(so cos/sin attention_factor != 1); DeepSeek config spelling. Reference uses dequantized weights.",
        n_prompt=20,
        n_new=12,
        config=dict(
            vocab_size=320,
            hidden_size=192,
            intermediate_size=320,
            moe_intermediate_size=80,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=96,
            kv_lora_rank=64,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_theta=10000.0,
            rope_scaling=dict(
                type="yarn",
                factor=4.0,
                original_max_position_embeddings=64,
                beta_fast=32,
                beta_slow=1,
                mscale=1.0,
                mscale_all_dim=0.8,
            ),
            num_nextn_predict_layers=0,
            tie_word_embeddings=False,
        ),
    ),
    "v3_plain_rope": dict(
        arch="v3",
        seed=5005,
        spelling="hf5",
        description="DeepSeek-V3 variant: no q_lora, default rope (no YaRN), rope_interleave false "
        "(rotate-half layout), n_group 1 / topk_group 1, first_k_dense_replace 0 (all layers MoE), "
        "sigmoid noaux_tc top-3 of 8 with bias, routed_scaling_factor 1.0; transformers-5 config spelling.",
        n_prompt=30,
        n_new=16,
        config=dict(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=3,
            first_k_dense_replace=0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            rope_parameters=dict(rope_type="default", rope_theta=50000.0),
            rope_interleave=False,
            num_nextn_predict_layers=0,
            tie_word_embeddings=False,
        ),
    ),
}

# --------------------------------------------------------------------------------------------
# A float64 copy of the transformers modeling code
# --------------------------------------------------------------------------------------------

def load_f64_modeling(arch):
    """Return transformers' modeling_deepseek_v{2,3} re-executed with float32 -> float64."""
    return gc.load_f64_modeling({"v2": "deepseek_v2", "v3": "deepseek_v3"}[arch])


def stock_classes(arch):
    if arch == "v2":
        return transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM
    return transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def hf5_config_kwargs(case):
    """Config kwargs in the transformers-5 vocabulary (rope_parameters)."""
    kw = dict(case["config"])
    if "rope_scaling" in kw or "rope_theta" in kw:
        rs = kw.pop("rope_scaling", None)
        theta = kw.pop("rope_theta")
        if rs is None:
            kw["rope_parameters"] = dict(rope_type="default", rope_theta=theta)
        else:
            rp = {k: v for k, v in rs.items() if k != "type"}
            rp["rope_type"] = rs["type"]
            rp["rope_theta"] = theta
            kw["rope_parameters"] = rp
    kw["bos_token_id"] = 0
    kw["eos_token_id"] = 1
    return kw


def init_weights(model, gen, hidden):
    """Overwrite every parameter with seeded values of a realistic scale (float32)."""
    sd = model.state_dict()
    for name in sorted(sd):
        t = sd[name]
        if not t.is_floating_point() or "rotary_emb" in name:
            continue
        shape = t.shape
        v = gc.init_common(name, shape, gen, head_scale=3.0)
        if v is None:
            std = min(0.1, max(0.02, 0.8 / math.sqrt(shape[-1])))
            v = std * torch.randn(shape, generator=gen)
        t.copy_(v)


def mtp_tensors(model_sd, cfg, gen, layer_idx):
    """DeepSeek-V3's published MTP module: a full decoder layer at model.layers.{L} plus
    enorm, hnorm, eh_proj, shared_head.{norm,head} and a copy of embed_tokens. Random values."""
    h = cfg.hidden_size
    out = {}
    # The decoder-layer part: take layer (L-1)'s tensor names and shapes (an MoE layer).
    src = f"model.layers.{layer_idx - 1}."
    for name in sorted(model_sd):
        if name.startswith(src):
            t = model_sd[name]
            new = f"model.layers.{layer_idx}." + name[len(src) :]
            if name.endswith("norm.weight"):
                out[new] = (1.0 + 0.1 * torch.randn(t.shape, generator=gen)).to(t.dtype)
            elif name.endswith("e_score_correction_bias"):
                out[new] = (0.1 * torch.randn(t.shape, generator=gen)).to(t.dtype)
            else:
                out[new] = (0.05 * torch.randn(t.shape, generator=gen)).to(t.dtype)
    p = f"model.layers.{layer_idx}."
    bf = torch.bfloat16
    out[p + "enorm.weight"] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(bf)
    out[p + "hnorm.weight"] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(bf)
    out[p + "eh_proj.weight"] = (0.05 * torch.randn(h, 2 * h, generator=gen)).to(bf)
    out[p + "shared_head.norm.weight"] = (1.0 + 0.1 * torch.randn(h, generator=gen)).to(bf)
    # As published: the MTP embed/head are copies of the main model's.
    out[p + "embed_tokens.weight"] = model_sd["model.embed_tokens.weight"].clone()
    out[p + "shared_head.head.weight"] = model_sd["lm_head.weight"].clone()
    return out


# Linear weights DeepSeek-V3 stores as FP8 (attention and MLP/expert projections). The router
# (mlp.gate.weight), embeddings, lm_head and all norms stay bf16; the bias stays F32.
_FP8_RE = re.compile(
    r"\.(self_attn\.(q_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.shared_experts\.(gate_proj|up_proj|down_proj)"
    r"|mlp\.experts\.\d+\.(gate_proj|up_proj|down_proj))\.weight$"
)

# --------------------------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------------------------


def deepseek_config_json(case):
    """config.json in DeepSeek's own spelling (as in deepseek-ai/DeepSeek-V2-Lite, DeepSeek-V3)."""
    c = case["config"]
    v3 = case["arch"] == "v3"
    d = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": c["first_k_dense_replace"],
        "hidden_act": "silu",
        "hidden_size": c["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": c["intermediate_size"],
        "kv_lora_rank": c["kv_lora_rank"],
        "max_position_embeddings": c["max_position_embeddings"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "moe_intermediate_size": c["moe_intermediate_size"],
        "moe_layer_freq": 1,
        "n_group": c["n_group"],
        "n_routed_experts": c["n_routed_experts"],
        "n_shared_experts": c["n_shared_experts"],
        "norm_topk_prob": c["norm_topk_prob"],
        "num_attention_heads": c["num_attention_heads"],
        "num_experts_per_tok": c["num_experts_per_tok"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_key_value_heads": c["num_key_value_heads"],
        "pretraining_tp": 1,
        "q_lora_rank": c["q_lora_rank"],
        "qk_nope_head_dim": c["qk_nope_head_dim"],
        "qk_rope_head_dim": c["qk_rope_head_dim"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_scaling": c["rope_scaling"],
        "rope_theta": c["rope_theta"],
        "routed_scaling_factor": c["routed_scaling_factor"],
        "scoring_func": "sigmoid" if v3 else "softmax",
        "seq_aux": True,
        "tie_word_embeddings": c["tie_word_embeddings"],
        "topk_group": c["topk_group"],
        "topk_method": "noaux_tc" if v3 else c["topk_method"],
        "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3" if v3 else "4.39.3",
        "use_cache": True,
        "v_head_dim": c["v_head_dim"],
        "vocab_size": c["vocab_size"],
    }
    if v3:
        d["num_nextn_predict_layers"] = c.get("num_nextn_predict_layers", 0)
    if case.get("fp8"):
        d["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    return d


# --------------------------------------------------------------------------------------------
# Writing the checkpoint
# --------------------------------------------------------------------------------------------


def build_checkpoint(case, attempt, folder):
    """Create the random model and write the case folder. Returns (tensors written, f64 state
    dict of the effective weights in checkpoint naming)."""
    arch = case["arch"]
    cfg_cls, lm_cls = stock_classes(arch)
    kw = hf5_config_kwargs(case)
    cfg = cfg_cls(**kw)
    gen = gc.seed_case(case, attempt)
    model = lm_cls(cfg).eval()
    with torch.no_grad():
        init_weights(model, gen, cfg.hidden_size)
    bias = {
        n: b.detach().clone().to(torch.float32) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")
    }
    model = model.to(torch.bfloat16)
    hf_cfg, tensors = gc.save_pretrained_tensors(model)
    # The correction bias is F32 in DeepSeek-V3's checkpoints.
    for n, b in bias.items():
        assert n in tensors, n
        tensors[n] = b
    for k, t in tensors.items():
        if not k.endswith("e_score_correction_bias"):
            assert t.dtype == torch.bfloat16, (k, t.dtype)

    # The effective weights the reference uses (float64, checkpoint names, no MTP).
    eff = {k: t.to(torch.float64) for k, t in tensors.items()}

    if case.get("fp8"):
        for k in sorted(tensors):
            if _FP8_RE.search(k):
                q, s = quantize_fp8(tensors[k])
                tensors[k] = q
                tensors[k + "_scale_inv"] = s
                eff[k] = dequantize_fp8(q, s)

    if case.get("mtp"):
        n_mtp = case["config"].get("num_nextn_predict_layers", 0)
        for i in range(n_mtp):
            tensors.update(mtp_tensors(tensors, cfg, gen, cfg.num_hidden_layers + i))

    os.makedirs(folder, exist_ok=True)
    gc.write_safetensors(folder, tensors, 3 if case.get("sharded") else 1)

    if case["spelling"] == "deepseek":
        write_json(os.path.join(folder, "config.json"), deepseek_config_json(case))
    else:
        hf_cfg["dtype"] = "bfloat16"
        if arch == "v3":
            hf_cfg["num_nextn_predict_layers"] = case["config"].get("num_nextn_predict_layers", 0)
        write_json(os.path.join(folder, "config.json"), hf_cfg)
    return tensors, eff


# --------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------


def load_reference(case, folder, eff, cls):
    """Load `cls` (float64 modeling, or stock) on the case's effective weights in float64."""
    if case.get("fp8"):
        # transformers' FP8 path needs a GPU: write the dequantized weights (F64) and a config
        # without quantization_config to a scratch folder and load that.
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        c.pop("quantization_config")
        model = gc.load_f64_scratch(cls, eff, lambda tmp: write_json(os.path.join(tmp, "config.json"), c))
    else:
        model = gc.load_f64_pretrained(cls, folder)
    # Check every weight equals the stored value exactly.
    msd = model.state_dict()
    for k, v in eff.items():
        if k in msd:
            assert torch.equal(msd[k].to(torch.float64), v), k
    gc.check_experts(model, eff, "model.layers.{layer}.mlp.experts.{e}.", "gate_proj.weight", "up_proj.weight",
                     "down_proj.weight")
    return model


def exact_inv_freq(rp, dim, max_pos):
    """The rope inverse frequencies, in float64, by the transformers formulas."""
    base = rp["rope_theta"]
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if rp["rope_type"] == "default":
        return 1.0 / pos, 1.0
    assert rp["rope_type"] == "yarn"
    factor = rp["factor"]
    omax = rp["original_max_position_embeddings"]

    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
    att = get_mscale(factor, ms) / get_mscale(factor, msa) if (ms and msa) else get_mscale(factor)
    bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

    def corr_dim(nrot):
        return (dim * math.log(omax / (nrot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr_dim(bf)), 0), min(math.ceil(corr_dim(bs)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    return inv, att


def check_resolved(case, model):
    """Verify the loaded config means what the case intends; return the resolved semantics."""
    c = model.config
    rp = dict(c.rope_parameters)
    want = case["config"]
    if "rope_parameters" in want:
        want_rp = dict(want["rope_parameters"])
    elif want.get("rope_scaling"):
        want_rp = {k: v for k, v in want["rope_scaling"].items() if k != "type"}
        want_rp["rope_type"] = want["rope_scaling"]["type"]
        want_rp["rope_theta"] = want["rope_theta"]
    else:
        want_rp = {"rope_type": "default", "rope_theta": want["rope_theta"]}
    for k, v in want_rp.items():
        assert rp.get(k) == v, f"rope_parameters[{k}] = {rp.get(k)!r}, expected {v!r}"
    for k in ("q_lora_rank", "kv_lora_rank", "n_group", "topk_group", "num_experts_per_tok", "norm_topk_prob",
              "routed_scaling_factor", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
              "tie_word_embeddings"):
        if k in want:
            assert getattr(c, k) == want[k], f"{k} = {getattr(c, k)!r}, expected {want[k]!r}"
    if case["arch"] == "v2":
        assert c.topk_method == want["topk_method"], c.topk_method
    else:
        assert c.rope_interleave == want.get("rope_interleave", True), c.rope_interleave
    rot = model.model.rotary_emb
    inv, att = exact_inv_freq(rp, c.qk_rope_head_dim, c.max_position_embeddings)
    assert rot.inv_freq.dtype == torch.float64, rot.inv_freq.dtype
    # from_pretrained may re-run the stock (float32) rope init on this buffer: force exact f64.
    err = (rot.inv_freq - inv).abs().max().item()
    assert err < 1e-6 * inv.max().item(), f"inv_freq mismatch {err}"
    with torch.no_grad():
        rot.inv_freq.copy_(inv)
        rot.original_inv_freq.copy_(inv)
    assert abs(rot.attention_scaling - att) < 1e-15, (rot.attention_scaling, att)
    attn = model.model.layers[0].self_attn
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    sm = qk ** -0.5
    if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
        sm = sm * m * m
    assert abs(attn.scaling - sm) < 1e-15, (attn.scaling, sm)
    return {
        "rope_type": rp["rope_type"],
        "rope_theta": rp["rope_theta"],
        "rope_parameters": {k: rp[k] for k in sorted(rp)},
        "rope_layout": ("interleaved_pairs" if (case["arch"] == "v2" or c.rope_interleave) else "rotate_half"),
        "rope_dim": c.qk_rope_head_dim,
        "inv_freq": [float(x) for x in inv],
        "rope_attention_factor": float(att),
        "softmax_scale": float(attn.scaling),
        "qk_head_dim": qk,
        "rms_norm_eps": c.rms_norm_eps,
        "scoring": "sigmoid_noaux_tc" if case["arch"] == "v3" else "softmax_" + c.topk_method,
    }


def router_margins(case, model, ids):
    """Run ids through the model, capturing each router's input; return the smallest gap at
    any top-k (and group) selection boundary."""
    captured = []

    def hook(mod, args):
        captured.append((mod, args[0].detach().reshape(-1, mod.hidden_dim).to(torch.float64)))

    hs = [m.register_forward_pre_hook(hook) for n, m in model.named_modules() if n.endswith("mlp.gate")]
    gc.forward_with_hooks(model, ids, hs)
    worst = float("inf")
    for mod, x in captured:
        logits = x @ mod.weight.detach().to(torch.float64).T
        ne, k = mod.num_experts, mod.top_k
        if case["arch"] == "v2":
            s = logits.softmax(-1)
            if mod.topk_method == "group_limited_greedy":
                g = s.view(-1, mod.num_group, ne // mod.num_group).max(-1).values
                gs = g.sort(-1, descending=True).values
                worst = min(worst, (gs[:, mod.topk_group - 1] - gs[:, mod.topk_group]).min().item())
                gi = g.topk(mod.topk_group, -1).indices
                mask = torch.zeros_like(g).scatter_(1, gi, 1).repeat_interleave(ne // mod.num_group, 1)
                s = s.masked_fill(mask == 0, 0.0)
            ss = s.sort(-1, descending=True).values
            worst = min(worst, (ss[:, k - 1] - ss[:, k]).min().item())
        else:
            sc = logits.sigmoid() + mod.e_score_correction_bias.to(torch.float64)
            gsz = ne // mod.num_group
            g = sc.view(-1, mod.num_group, gsz).topk(2, -1).values.sum(-1)
            if mod.num_group > mod.topk_group:
                gs = g.sort(-1, descending=True).values
                worst = min(worst, (gs[:, mod.topk_group - 1] - gs[:, mod.topk_group]).min().item())
            gi = g.topk(mod.topk_group, -1).indices
            mask = torch.zeros_like(g).scatter_(1, gi, 1).repeat_interleave(gsz, 1)
            if mod.topk_group * gsz > k:
                scm = sc.masked_fill(mask == 0, float("-inf"))
                ss = scm.sort(-1, descending=True).values
                worst = min(worst, (ss[:, k - 1] - ss[:, k]).min().item())
    return worst


# --------------------------------------------------------------------------------------------
# Independent check: a from-the-files float64 forward pass, written from the notes in
# docs/reference-notes.md and sharing no code with transformers. It reads config.json in either
# spelling and the safetensors exactly as the engine must.
# --------------------------------------------------------------------------------------------


def read_checkpoint(folder):
    idx = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    raw = {}
    for fn in files:
        raw.update(load_file(os.path.join(folder, fn)))
    w = {}
    for k, t in raw.items():
        if k.endswith("_scale_inv"):
            continue
        if k + "_scale_inv" in raw:
            w[k] = dequantize_fp8(t, raw[k + "_scale_inv"])
        else:
            w[k] = t.to(torch.float64)
    return w


def independent_forward(folder, ids):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    w = read_checkpoint(folder)
    v3 = c["model_type"] == "deepseek_v3"
    if "rope_parameters" in c:
        rp = dict(c["rope_parameters"])
    else:
        rp = dict(c.get("rope_scaling") or {})
        rp["rope_type"] = rp.pop("type", "default")
        rp["rope_theta"] = c["rope_theta"]
    interleave = (not v3) or c.get("rope_interleave", True)
    H, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    eps = c["rms_norm_eps"]
    inv, att = exact_inv_freq(rp, dr, c["max_position_embeddings"])
    scale = (dn + dr) ** -0.5
    if rp["rope_type"] != "default" and rp.get("mscale_all_dim"):
        m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0
        scale *= m * m
    T = len(ids)
    pos = torch.arange(T, dtype=torch.float64)
    ang = pos[:, None] * inv[None, :]  # [T, dr/2]
    cos, sin = att * torch.cos(ang), att * torch.sin(ang)

    def rms(x, g, e=1e-6):
        return g * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + e))

    def rope(x):  # x [T, ..., dr]; returns the same layout
        if interleave:
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            a, b = x[..., : dr // 2], x[..., dr // 2 :]
        shp = (T,) + (1,) * (x.dim() - 2) + (dr // 2,)
        cs, sn = cos.view(shp), sin.view(shp)
        ra, rb = a * cs - b * sn, b * cs + a * sn
        out = torch.empty_like(x)
        if interleave:
            out[..., 0::2], out[..., 1::2] = ra, rb
        else:
            out[..., : dr // 2], out[..., dr // 2 :] = ra, rb
        return out

    def mlp(p, x):
        g, u = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ w[p + "down_proj.weight"].T

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    for li in range(c["num_hidden_layers"]):
        p = f"model.layers.{li}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        a = p + "self_attn."
        if c["q_lora_rank"] is None:
            q = h @ w[a + "q_proj.weight"].T
        else:
            q = rms(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"]) @ w[a + "q_b_proj.weight"].T
        q = q.view(T, H, dn + dr)
        ckv = h @ w[a + "kv_a_proj_with_mqa.weight"].T
        lat, kr = ckv[:, : c["kv_lora_rank"]], ckv[:, c["kv_lora_rank"] :]
        kv = (rms(lat, w[a + "kv_a_layernorm.weight"]) @ w[a + "kv_b_proj.weight"].T).view(T, H, dn + dv)
        qn, qr = q[..., :dn], rope(q[..., dn:])
        kn, v = kv[..., :dn], kv[..., dn:]
        kr = rope(kr)  # [T, dr], shared by all heads
        s = (torch.einsum("thd,shd->hts", qn, kn) + torch.einsum("thd,sd->hts", qr, kr)) * scale + causal
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * dv)
        x = x + o @ w[a + "o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if li < c["first_k_dense_replace"]:
            x = x + mlp(m, h)
            continue
        ne, k = c["n_routed_experts"], c["num_experts_per_tok"]
        logits = h @ w[m + "gate.weight"].T
        if v3:
            sc = logits.sigmoid()
            choice = sc + w[m + "gate.e_score_correction_bias"]
            ng, tg = c["n_group"], c["topk_group"]
            gs = choice.view(T, ng, ne // ng).topk(2, -1).values.sum(-1)
            gmask = torch.zeros(T, ng, dtype=torch.bool).scatter_(1, gs.topk(tg, -1).indices, True)
            choice = choice.masked_fill(~gmask.repeat_interleave(ne // ng, 1), float("-inf"))
            idx = choice.topk(k, -1).indices
            wt = sc.gather(1, idx)
            if c["norm_topk_prob"]:
                wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        else:
            sc = logits.softmax(-1)
            if c["topk_method"] == "group_limited_greedy":
                ng, tg = c["n_group"], c["topk_group"]
                gs = sc.view(T, ng, ne // ng).max(-1).values
                gmask = torch.zeros(T, ng, dtype=torch.bool).scatter_(1, gs.topk(tg, -1).indices, True)
                sc = sc.masked_fill(~gmask.repeat_interleave(ne // ng, 1), 0.0)
            wt, idx = sc.topk(k, -1)  # V2 in transformers 5.17 never renormalises
        wt = wt * c["routed_scaling_factor"]
        y = mlp(m + "shared_experts.", h)
        for t in range(T):
            for j in range(k):
                y[t] += wt[t, j] * mlp(f"{m}experts.{int(idx[t, j])}.", h[t : t + 1])[0]
        x = x + y
    x = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def make_case(name, out_root):
    case = CASES[name]
    folder = os.path.join(out_root, name)
    arch = case["arch"]
    f64 = load_f64_modeling(arch)
    f64_cls = f64.DeepseekV2ForCausalLM if arch == "v2" else f64.DeepseekV3ForCausalLM
    for attempt in range(MAX_ATTEMPTS):
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        tensors, eff = build_checkpoint(case, attempt, folder)
        model = load_reference(case, folder, eff, f64_cls)
        resolved = check_resolved(case, model)
        prompt = gc.random_prompt(case, case["config"]["vocab_size"])
        logits, greedy, gmargins, seq = compute_reference(case, model, prompt)
        rmargin = router_margins(case, model, torch.tensor([seq[:-1]]))
        gmin = min(gmargins)
        print(f"[{name}] attempt {attempt}: router margin {rmargin:.3g}, greedy margin {gmin:.3g}, greedy {greedy}")
        if rmargin > ROUTER_MARGIN and gmin > GREEDY_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no seed with clear routing/greedy margins in {MAX_ATTEMPTS} attempts")

    # Cross-check against stock transformers (which computes norms/router/rope/softmax in f32).
    _, stock_cls = stock_classes(arch)
    stock = load_reference(case, folder, eff, stock_cls)
    with torch.no_grad():
        sl = stock(input_ids=torch.tensor([prompt]), use_cache=False).logits[0]
    stock_diff = (sl - logits).abs().max().item()
    assert stock_diff < 1e-3, f"stock transformers differs by {stock_diff}"

    # Independent from-the-files implementation (see docs/reference-notes.md).
    ind = independent_forward(folder, prompt + greedy)
    ind_diff = (ind[: len(prompt)] - logits).abs().max().item()
    assert ind_diff < 1e-9, f"independent implementation differs by {ind_diff}"
    assert ind[len(prompt) - 1 :].argmax(-1).tolist()[: len(greedy)] == greedy

    gc.write_f64(os.path.join(folder, "ref_logits.f64"), logits)
    ref = {
        **gc.ref_json_head(name, case, prompt, case["config"]["vocab_size"], greedy, attempt),
        "weights_dtype": "fp8_e4m3_block128+bf16" if case.get("fp8") else "bfloat16",
        "min_router_margin": rmargin,
        "min_greedy_logit_margin": gmin,
        "prompt_argmax_ids": logits.argmax(-1).tolist(),
        "stock_transformers_f64_max_abs_diff": stock_diff,
        "independent_impl_max_abs_diff": ind_diff,
        "resolved": resolved,
    }
    write_json(os.path.join(folder, "ref.json"), ref)
    total = gc.list_folder(folder, 48)
    print(f"[{name}] done: {total} bytes, stock diff {stock_diff:.3g}, independent diff {ind_diff:.3g}")


def main():
    gc.main(__doc__, CASES, make_case)


if __name__ == "__main__":
    main()
