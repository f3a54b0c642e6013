#!/usr/bin/env python3
"""make_v4_flash_slice.py -- a shape-faithful DeepSeek-V4-Flash slice with random weights.

Usage: python3 bench/make_v4_flash_slice.py --out DIR [--layers L] [--seed S] [--mtp]
                                            [--link-from DIR2] [--force]

Writes DIR/config.json (upstream style, as tools/make_goldens_v4.py writes it for the
v4_upstream_fp8 case), one safetensors shard per layer plus one for the global tensors, and
DIR/model.safetensors.index.json. Everything is the real V4-Flash shape
(../shared/specs/deepseek-v4.md, section 1-2): vocab 129280, hidden 4096, 64 heads x 512
(rope 64), q_lora 1024, o_groups 8 x o_lora 1024, window 128, compress ratios 4 (CSA) / 128
(HCA), indexer 64 heads x 128 top-512, 256 routed experts x 2048 (top-6) + 1 shared, 3 hash
layers, hc_mult 4 -- only the number of layers is cut to L. The first L layers follow the
real schedule: compress_ratios = [0, 0] + [4, 128] * 20 + [4] (layer 0-1 sliding, then CSA on
even and HCA on odd layers); layers 0-2 are hash-routed (tid2eid), the rest use the biased
top-k router. So L = 2 covers sliding + hash only, L = 3 adds CSA, L = 4 adds HCA and a
non-hash router.

Dtypes as upstream ships them: FP8 e4m3 + E8M0 128x128 block scales for wq_a, wq_b, wkv,
wo_a, wo_b, indexer.wq_b, the shared expert (and MTP e_proj/h_proj); FP4 e2m1 packed two per
byte (I8 [rows, cols/2], low nibble = even column) + E8M0 scale per 32 columns for the routed
experts; BF16 embed, head, norms, compressor / indexer projections, router gate; F32 hc_*,
attn_sink, ape, gate.bias; I32 tid2eid.

Sizes (bytes on disk): embed + head 2 x 1.06 GB; one layer ~3.6 GB (routed experts 3.4 GB
of it). L = 2: ~9.4 GB, L = 3: ~13 GB, L = 4: ~16.6 GB; --mtp adds one more layer.

Values: every tensor gets its own numpy generator seeded from (--seed, crc32(name)), so a
layer shard depends only on the seed and the layer index: two slices with the same seed
share their first layers byte for byte (--link-from hard-links identical shards instead of
rewriting them, e.g. an L = 4 slice next to an L = 2 one). Scales follow tools/
make_goldens_v4.py (std ~1/sqrt(fan_in); 1.25/sqrt(fan_in) for expert gate/up; 2/sqrt(D)
router and head; embed 0.5; norms 1 + 0.1 N) so activations stay O(1) and logits have std ~2.
FP8 values are N(0,1) rounded toward zero to e4m3 with one power-of-two scale per tensor
(stored in every 128x128 block); FP4 codes are uniform random nibbles (rms 2.93) with scale
2^-7 (std 0.023 ~ 1.25/sqrt(4096) ~ 1/sqrt(2048)).
"""

import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np

SWA, CSA, HCA = 0, 4, 128
FLASH = dict(
    vocab_size=129280,
    hidden_size=4096,
    moe_intermediate_size=2048,
    num_attention_heads=64,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=1024,
    o_lora_rank=1024,
    o_groups=8,
    sliding_window=128,
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
    n_routed_experts=256,
    num_experts_per_tok=6,
    hc_mult=4,
    num_hash_layers=3,
    n_layers_full=43,
)
FULL_RATIOS = [0, 0] + [4, 128] * 20 + [4]  # 43 layers; the MTP layer (sliding) is the 44th entry
assert len(FULL_RATIOS) == FLASH["n_layers_full"]
CHUNK = 1 << 24  # elements generated at a time


def upstream_config(L, n_mtp):
    c = FLASH
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "moe_intermediate_size": c["moe_intermediate_size"],
        "num_hidden_layers": L,
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": 1,
        "head_dim": c["head_dim"],
        "qk_rope_head_dim": c["qk_rope_head_dim"],
        "q_lora_rank": c["q_lora_rank"],
        "o_lora_rank": c["o_lora_rank"],
        "o_groups": c["o_groups"],
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1048576,
        "sliding_window": c["sliding_window"],
        "rope_theta": 10000.0,
        "compress_rope_theta": 160000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 65536,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "num_nextn_predict_layers": 1,
        "compress_ratios": FULL_RATIOS[:L] + [0],
        "index_n_heads": c["index_n_heads"],
        "index_head_dim": c["index_head_dim"],
        "index_topk": c["index_topk"],
        "hc_mult": c["hc_mult"],
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "n_routed_experts": c["n_routed_experts"],
        "n_shared_experts": 1,
        "num_experts_per_tok": c["num_experts_per_tok"],
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "num_hash_layers": c["num_hash_layers"],
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
        "slice_of": "DeepSeek-V4-Flash (43 layers + 1 MTP); random weights; bench/make_v4_flash_slice.py",
        "slice_mtp_included": bool(n_mtp),
    }


# ------------------------------------------------------------------------------------------
# Tensor recipes: (name, dtype, shape, kind, param). Data is produced chunk by chunk.
# ------------------------------------------------------------------------------------------

ITEMSIZE = {"F32": 4, "I32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}


def fp8(name, rows, cols, std):
    """An FP8 e4m3 matrix with E8M0 128x128 block scales: two recipes."""
    # one power-of-two scale per tensor, chosen so the e4m3 payload has std in (32, 64]
    k = math.ceil(math.log2(std / 64.0))
    base = name[: -len(".weight")]
    br, bc = -(-rows // 128), -(-cols // 128)
    return [
        (name, "F8_E4M3", [rows, cols], "fp8", std / 2.0**k),
        (base + ".scale", "F8_E8M0", [br, bc], "const_u8", 127 + k),
    ]


def fp4(name, rows, cols):
    base = name[: -len(".weight")]
    return [
        (name, "I8", [rows, cols // 2], "rand_bytes", None),
        (base + ".scale", "F8_E8M0", [rows, cols // 32], "const_u8", 127 - 7),
    ]


def bf16(name, shape, std, mean=0.0):
    return [(name, "BF16", list(shape), "normal_bf16", (mean, std))]


def f32(name, shape, std, mean=0.0):
    return [(name, "F32", list(shape), "normal_f32", (mean, std))]


def layer_recipes(p, ratio, hash_layer, mtp=False):
    c = FLASH
    D, H, d, ql = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    g, r, I, E = c["o_groups"], c["o_lora_rank"], c["moe_intermediate_size"], c["n_routed_experts"]
    n = c["hc_mult"]
    nm, nD = (2 + n) * n, n * D
    nI, dI = c["index_n_heads"], c["index_head_dim"]
    s = lambda x: 1.0 / math.sqrt(x)  # noqa: E731
    R = []
    R += bf16(p + "attn_norm.weight", [D], 0.1, 1.0)
    R += bf16(p + "ffn_norm.weight", [D], 0.1, 1.0)
    for h in ("attn", "ffn"):
        R += f32(p + f"hc_{h}_fn", [nm, nD], s(nD))
        R += f32(p + f"hc_{h}_base", [nm], 0.5)
        R += [(p + f"hc_{h}_scale", "F32", [3], "uniform_f32", (0.5, 1.5))]
    R += fp8(p + "attn.wq_a.weight", ql, D, s(D))
    R += bf16(p + "attn.q_norm.weight", [ql], 0.1, 1.0)
    R += fp8(p + "attn.wq_b.weight", H * d, ql, s(ql))
    R += fp8(p + "attn.wkv.weight", d, D, s(D))
    R += bf16(p + "attn.kv_norm.weight", [d], 0.1, 1.0)
    R += fp8(p + "attn.wo_a.weight", g * r, H * d // g, s(H * d // g))
    R += fp8(p + "attn.wo_b.weight", D, g * r, s(g * r))
    R += f32(p + "attn.attn_sink", [H], 1.0)
    if ratio:
        cw = 2 * d if ratio == CSA else d
        R += bf16(p + "attn.compressor.wkv.weight", [cw, D], s(D))
        R += bf16(p + "attn.compressor.wgate.weight", [cw, D], 1.5 * s(D))
        R += f32(p + "attn.compressor.ape", [ratio, cw], 0.5)
        R += bf16(p + "attn.compressor.norm.weight", [d], 0.1, 1.0)
    if ratio == CSA:
        R += fp8(p + "attn.indexer.wq_b.weight", nI * dI, ql, s(ql))
        R += bf16(p + "attn.indexer.weights_proj.weight", [nI, D], s(D))
        R += bf16(p + "attn.indexer.compressor.wkv.weight", [2 * dI, D], s(D))
        R += bf16(p + "attn.indexer.compressor.wgate.weight", [2 * dI, D], 1.5 * s(D))
        R += f32(p + "attn.indexer.compressor.ape", [ratio, 2 * dI], 0.5)
        R += bf16(p + "attn.indexer.compressor.norm.weight", [dI], 0.1, 1.0)
    R += bf16(p + "ffn.gate.weight", [E, D], 2.0 * s(D))
    if hash_layer:
        R += [(p + "ffn.gate.tid2eid", "I32", [c["vocab_size"], c["num_experts_per_tok"]], "tid2eid", E)]
    else:
        R += f32(p + "ffn.gate.bias", [E], 0.1)
    for e in range(E):
        q = p + f"ffn.experts.{e}."
        R += fp4(q + "w1.weight", I, D) + fp4(q + "w3.weight", I, D) + fp4(q + "w2.weight", D, I)
    q = p + "ffn.shared_experts."
    R += fp8(q + "w1.weight", I, D, 1.25 * s(D)) + fp8(q + "w3.weight", I, D, 1.25 * s(D))
    R += fp8(q + "w2.weight", D, I, s(I))
    if mtp:
        R += fp8(p + "e_proj.weight", D, D, s(D)) + fp8(p + "h_proj.weight", D, D, s(D))
        for nn in ("enorm", "hnorm", "norm"):
            R += bf16(p + nn + ".weight", [D], 0.1, 1.0)
        R += f32(p + "hc_head_fn", [n, nD], s(nD))
        R += f32(p + "hc_head_base", [n], 0.5)
        R += [(p + "hc_head_scale", "F32", [1], "uniform_f32", (0.5, 1.5))]
    return R


def global_recipes():
    c = FLASH
    V, D, n = c["vocab_size"], c["hidden_size"], c["hc_mult"]
    R = []
    R += bf16("embed.weight", [V, D], 0.5)
    R += bf16("head.weight", [V, D], 2.0 / math.sqrt(D))
    R += bf16("norm.weight", [D], 0.1, 1.0)
    R += f32("hc_head_fn", [n, n * D], 1.0 / math.sqrt(n * D))
    R += f32("hc_head_base", [n], 0.5)
    R += [("hc_head_scale", "F32", [1], "uniform_f32", (0.5, 1.5))]
    return R


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------


def to_e4m3(x):
    """float32 -> e4m3 codes (uint8), rounding toward zero; |x| clipped to 448, |x| < 2^-6
    flushed to (signed) zero. Exact for the normal range, no NaN codes."""
    x = np.clip(x, -448.0, 448.0)
    b = x.view(np.uint32)
    sign = ((b >> 24) & 0x80).astype(np.uint8)
    e = ((b >> 23) & 0xFF).astype(np.int32) - 120  # e4m3 exponent field (bias 7)
    mant = ((b >> 20) & 0x7).astype(np.uint8)
    code = ((np.clip(e, 0, 15).astype(np.uint8) << 3) | mant) * (e >= 1)
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def chunks(rng, kind, param, count):
    """Yield the tensor's bytes in pieces."""
    if kind == "rand_bytes":
        left = count
        while left:
            k = min(left, 1 << 26)
            yield rng.bytes(k)
            left -= k
        return
    if kind == "const_u8":
        yield np.full(count, param, dtype=np.uint8).tobytes()
        return
    if kind == "tid2eid":
        V, K = count // 6, 6
        E = param
        out = []
        for i in range(0, V, 16384):
            m = min(16384, V - i)
            r = rng.random((m, E), dtype=np.float32)
            ids = np.argpartition(r, K, axis=1)[:, :K].astype(np.int32)
            out.append(ids.tobytes())
        yield b"".join(out)
        return
    left = count
    while left:
        k = min(left, CHUNK)
        left -= k
        if kind == "uniform_f32":
            yield rng.uniform(param[0], param[1], k).astype(np.float32).tobytes()
            continue
        x = rng.standard_normal(k, dtype=np.float32)
        if kind == "fp8":
            x *= np.float32(param)
            yield to_e4m3(x).tobytes()
        elif kind == "normal_f32":
            yield (x * np.float32(param[1]) + np.float32(param[0])).tobytes()
        elif kind == "normal_bf16":
            x = x * np.float32(param[1]) + np.float32(param[0])
            u = x.view(np.uint32)
            u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
            yield u.astype(np.uint16).tobytes()
        else:
            raise ValueError(kind)


def write_shard(path, recipes, seed):
    # f32/i32 first, then bf16, then bytes: every tensor stays aligned to its element size.
    recipes = sorted(recipes, key=lambda r: (-ITEMSIZE[r[1]], r[0]))
    header, off = {}, 0
    for name, dt, shape, _, _ in recipes:
        nb = ITEMSIZE[dt] * int(np.prod(shape))
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    header["__metadata__"] = {"format": "pt", "generator": "bench/make_v4_flash_slice.py", "seed": str(seed)}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-(8 + len(hb)) % 64)  # data starts 64-byte aligned
    tmp = path + ".partial"
    with open(tmp, "wb", buffering=1 << 22) as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, dt, shape, kind, param in recipes:
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            n = int(np.prod(shape))
            nb = 0
            for piece in chunks(rng, kind, param, n * ITEMSIZE[dt] if kind == "rand_bytes" else n):
                f.write(piece)
                nb += len(piece)
            assert nb == ITEMSIZE[dt] * n, (name, nb)
    os.replace(tmp, path)
    return [r[0] for r in recipes], off + 8 + len(hb)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/work/peers/v4flash-slice")
    ap.add_argument("--layers", type=int, default=2, help="layers 0..L-1 of the real schedule (1..43)")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--mtp", action="store_true", help="add the MTP module mtp.0.* (+3.6 GB; not run by forward)")
    ap.add_argument("--link-from", default=None, help="hard-link identical shards from this slice (same seed)")
    ap.add_argument("--force", action="store_true", help="rewrite shards that already exist")
    a = ap.parse_args()
    L = a.layers
    if not 1 <= L <= FLASH["n_layers_full"]:
        sys.exit("--layers must be in 1..43")
    os.makedirs(a.out, exist_ok=True)
    shards = [("model-globals.safetensors", global_recipes)]
    for i in range(L):
        shards.append((f"model-layer-{i:02d}.safetensors",
                       lambda i=i: layer_recipes(f"layers.{i}.", FULL_RATIOS[i], i < FLASH["num_hash_layers"])))
    if a.mtp:
        shards.append(("model-mtp-0.safetensors", lambda: layer_recipes("mtp.0.", 0, False, mtp=True)))
    weight_map, total = {}, 0
    meta_path = os.path.join(a.out, ".slice_shards.json")
    done = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    for fname, fn in shards:
        path = os.path.join(a.out, fname)
        recipes = fn()
        key = f"seed={a.seed}"
        t0 = time.time()
        src = os.path.join(a.link_from, fname) if a.link_from else None
        if os.path.exists(path) and done.get(fname) == key and not a.force:
            how = "kept"
        elif src and os.path.exists(src) and json.load(open(os.path.join(a.link_from, ".slice_shards.json"))).get(fname) == key:
            if os.path.exists(path):
                os.remove(path)
            os.link(src, path)
            how = "linked"
        else:
            write_shard(path, recipes, a.seed)
            how = "written"
        done[fname] = key
        with open(meta_path, "w") as f:
            json.dump(done, f, indent=1)
        for r in recipes:
            weight_map[r[0]] = fname
        sz = os.path.getsize(path)
        total += sz
        print(f"{fname}: {how}, {sz / 1e9:.3f} GB, {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    # stale shards of a larger earlier slice are removed so the folder matches the index
    for f in os.listdir(a.out):
        if f.endswith(".safetensors") and f not in dict(shards):
            os.remove(os.path.join(a.out, f))
            done.pop(f, None)
    with open(meta_path, "w") as f:
        json.dump(done, f, indent=1)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(upstream_config(L, 1 if a.mtp else 0), f, indent=2)
        f.write("\n")
    kinds = {0: "sliding", 4: "CSA", 128: "HCA"}
    sched = ", ".join(f"{i}:{kinds[FULL_RATIOS[i]]}{'+hash' if i < 3 else ''}" for i in range(L))
    print(f"{a.out}: {L} layers [{sched}]{' + MTP' if a.mtp else ''}, {total / 1e9:.2f} GB", file=sys.stderr)


if __name__ == "__main__":
    main()
