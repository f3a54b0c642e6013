"""The bundled tiny DeepSeek-V4 model: configuration, the MTP module, checkpoint naming.

Shared by tools/train/train.py (training on the GPU) and tools/train/make_reference.py (float64
reference on the CPU). The main model is transformers 5.17's DeepseekV4ForCausalLM unchanged; the
one-layer multi-token-prediction (MTP) module, which transformers does not build, is written here
from ../shared/specs/deepseek-v4.md §3 "MTP" and the upstream layout (`mtp.0.*`):

    e   = enorm(embed(tok[t+1]))                      [D]       shared embedding
    h_j = hnorm(X_main[t, j])  for each stream j      [n, D]    X_main = main streams before hc_head
    X'  = e_proj(e) (broadcast over streams) + h_proj(h)
    X'' = block(X')            one decoder block: sliding attention, top-k ("moe") MoE, mHC
    logits = head(norm(hc_head_mtp(X'')))             own hc_head_* and norm, shared head

It predicts tok[t+2] at row t. Positions are the main model's (t); since every MTP operation is
relative in position, any uniform shift (vLLM uses t+1) gives the same result.
"""

import copy
import re

import torch
import torch.nn as nn
import transformers
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mv4

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

MODEL_NAME = "deepseek-v4-tiny"

# transformers DeepseekV4Config keyword arguments of the bundled model.
CONFIG = dict(
    vocab_size=6144,
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    q_lora_rank=96,
    partial_rotary_factor=0.25,  # rope on the trailing 16 of 64 dims
    o_groups=2,
    o_lora_rank=64,
    sliding_window=128,
    layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],  # Flash-like: [0, 0] + [4, 128] * 2
    compress_rates={CSA: 4, HCA: 128},
    index_n_heads=8,
    index_head_dim=32,
    index_topk=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    scoring_func="sqrtsoftplus",
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    max_position_embeddings=2048,
    rope_parameters=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=1024, beta_fast=32, beta_slow=1),
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=2,
    tie_word_embeddings=False,
)

# Stored dtypes, as a real V4 checkpoint ships them: fp32 for these, bf16 for every other float.
FP32_RE = re.compile(r"(hc_attn_|hc_ffn_|hc_head|attn_sink|\.ape$|gate\.bias$)")


def make_config(**over):
    c = copy.deepcopy(CONFIG)
    c.update(over)
    return transformers.DeepseekV4Config(**c)


def mtp_config(cfg):
    """Config of the MTP block: one sliding-attention layer with a top-k routed MoE."""
    d = cfg.to_dict()
    for k in ("transformers_version", "architectures", "model_type", "dtype", "torch_dtype"):
        d.pop(k, None)
    d.update(num_hidden_layers=1, layer_types=[SWA], mlp_layer_types=["moe"])
    mcfg = transformers.DeepseekV4Config(**d)
    mcfg._attn_implementation = "eager"
    mcfg._experts_implementation = "eager"
    return mcfg


class MTPModule(nn.Module):
    """One MTP depth (upstream `mtp.0`). embed/head are the main model's, passed at call time."""

    def __init__(self, cfg, mod=mv4):
        """mod: the modeling module whose classes build the block (stock transformers, or the
        float64 rewrite that tools/make_goldens_v4.py makes for references)."""
        super().__init__()
        D = cfg.hidden_size
        mcfg = mtp_config(cfg)
        self.enorm = mod.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.hnorm = mod.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)
        self.e_proj = nn.Linear(D, D, bias=False)
        self.h_proj = nn.Linear(D, D, bias=False)
        self.block = mod.DeepseekV4DecoderLayer(mcfg, 0)
        self.hc_head = mod.DeepseekV4HyperHead(mcfg)
        self.norm = mod.DeepseekV4RMSNorm(D, eps=cfg.rms_norm_eps)

    def forward(self, streams, next_ids, embed, head, layer_kwargs):
        """streams [B, S, n, D] main streams before hc_head; next_ids [B, S] = tok[t+1];
        layer_kwargs: position_embeddings, position_ids, attention_mask of the main layers."""
        e = self.e_proj(self.enorm(embed(next_ids)))
        x = self.h_proj(self.hnorm(streams)) + e.unsqueeze(2)
        x = self.block(x, input_ids=None, **layer_kwargs)
        return head(self.norm(self.hc_head(x)))


def init_mtp(mtp, cfg, gen):
    """transformers-style init for the MTP module (std = initializer_range; hc base 0, scale 1)."""
    std = cfg.initializer_range
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("hc.base") or name.endswith("hc_base") or name.endswith("sinks") or name.endswith("position_bias"):
                p.zero_()
            elif name.endswith("hc.scale") or name.endswith("hc_scale"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
        mtp.block.mlp.gate.e_score_correction_bias.zero_()


def init_tid2eid(model, cfg, gen):
    """Hash-routing tables: k distinct experts per token id, seeded (transformers leaves zeros)."""
    for layer in model.model.layers:
        g = layer.mlp.gate
        if isinstance(g, mv4.DeepseekV4HashRouter):
            t = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[: cfg.num_experts_per_tok]
                             for _ in range(cfg.vocab_size)])
            g.tid2eid.copy_(t)


# ---------------------------------------------------------------------------------------------
# MTP tensor names: transformers module names inside MTPModule -> upstream `mtp.0.*` names
# ---------------------------------------------------------------------------------------------

_MTP_RENAME = [
    (r"^enorm\.weight$", "enorm.weight"),
    (r"^hnorm\.weight$", "hnorm.weight"),
    (r"^e_proj\.weight$", "e_proj.weight"),
    (r"^h_proj\.weight$", "h_proj.weight"),
    (r"^norm\.weight$", "norm.weight"),
    (r"^hc_head\.hc_fn$", "hc_head_fn"),
    (r"^hc_head\.hc_base$", "hc_head_base"),
    (r"^hc_head\.hc_scale$", "hc_head_scale"),
    (r"^block\.input_layernorm\.weight$", "attn_norm.weight"),
    (r"^block\.post_attention_layernorm\.weight$", "ffn_norm.weight"),
    (r"^block\.attn_hc\.(fn|base|scale)$", r"hc_attn_\1"),
    (r"^block\.ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"^block\.self_attn\.q_a_proj\.weight$", "attn.wq_a.weight"),
    (r"^block\.self_attn\.q_a_norm\.weight$", "attn.q_norm.weight"),
    (r"^block\.self_attn\.q_b_proj\.weight$", "attn.wq_b.weight"),
    (r"^block\.self_attn\.kv_proj\.weight$", "attn.wkv.weight"),
    (r"^block\.self_attn\.kv_norm\.weight$", "attn.kv_norm.weight"),
    (r"^block\.self_attn\.o_a_proj\.weight$", "attn.wo_a.weight"),
    (r"^block\.self_attn\.o_b_proj\.weight$", "attn.wo_b.weight"),
    (r"^block\.self_attn\.sinks$", "attn.attn_sink"),
    (r"^block\.mlp\.gate\.weight$", "ffn.gate.weight"),
    (r"^block\.mlp\.gate\.e_score_correction_bias$", "ffn.gate.bias"),
    (r"^block\.mlp\.shared_experts\.gate_proj\.weight$", "ffn.shared_experts.w1.weight"),
    (r"^block\.mlp\.shared_experts\.up_proj\.weight$", "ffn.shared_experts.w3.weight"),
    (r"^block\.mlp\.shared_experts\.down_proj\.weight$", "ffn.shared_experts.w2.weight"),
]


def mtp_upstream_tensors(mtp, prefix="mtp.0."):
    """MTP state as upstream-named tensors (fp32 here; dtypes are set when saving)."""
    out = {}
    sd = {k: v.detach().float().cpu() for k, v in mtp.state_dict().items()}
    for k, v in sd.items():
        if "rotary_emb" in k:
            continue
        if k == "block.mlp.experts.gate_up_proj":
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{prefix}ffn.experts.{e}.w1.weight"] = v[e, :inter].clone()
                out[f"{prefix}ffn.experts.{e}.w3.weight"] = v[e, inter:].clone()
            continue
        if k == "block.mlp.experts.down_proj":
            for e in range(v.shape[0]):
                out[f"{prefix}ffn.experts.{e}.w2.weight"] = v[e].clone()
            continue
        for pat, rep in _MTP_RENAME:
            if re.match(pat, k):
                out[prefix + re.sub(pat, rep, k)] = v
                break
        else:
            raise KeyError(f"MTP tensor {k!r} has no upstream name")
    return out


def mtp_load_upstream(mtp, tensors, prefix="mtp.0."):
    """Inverse of mtp_upstream_tensors: fill an MTPModule from upstream-named tensors."""
    sd = mtp.state_dict()
    new = {}
    for k in sd:
        if "rotary_emb" in k:
            new[k] = sd[k]
            continue
        if k == "block.mlp.experts.gate_up_proj":
            E = sd[k].shape[0]
            new[k] = torch.stack([torch.cat([tensors[f"{prefix}ffn.experts.{e}.w1.weight"],
                                             tensors[f"{prefix}ffn.experts.{e}.w3.weight"]], 0) for e in range(E)])
            continue
        if k == "block.mlp.experts.down_proj":
            E = sd[k].shape[0]
            new[k] = torch.stack([tensors[f"{prefix}ffn.experts.{e}.w2.weight"] for e in range(E)])
            continue
        for pat, rep in _MTP_RENAME:
            if re.match(pat, k):
                new[k] = tensors[prefix + re.sub(pat, rep, k)]
                break
        else:
            raise KeyError(k)
    mtp.load_state_dict({k: v.to(sd[k].dtype) for k, v in new.items()})


def stored_dtype(name, t):
    if not t.is_floating_point():
        return t.to(torch.int64)
    return t.to(torch.float32) if FP32_RE.search(name) else t.to(torch.bfloat16)


class Capture:
    """Forward hooks that expose, on each main-model call, the layer kwargs (mask, rope,
    positions) and the streams entering hc_head, for the MTP module."""

    def __init__(self, model):
        self.layer_kwargs = None
        self.streams = None
        self.handles = [
            model.model.layers[0].register_forward_pre_hook(self._pre_layer, with_kwargs=True),
            model.model.hc_head.register_forward_pre_hook(self._pre_head),
        ]

    def _pre_layer(self, mod, args, kwargs):
        self.layer_kwargs = {k: kwargs[k] for k in ("position_embeddings", "position_ids", "attention_mask")}

    def _pre_head(self, mod, args):
        self.streams = args[0]

    def remove(self):
        for h in self.handles:
            h.remove()
