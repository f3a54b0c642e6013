#!/usr/bin/env python3
"""bytes_per_token.py MODEL_DIR -- the weight bytes a DeepSeek V2/V3 checkpoint reads per decoded
token at batch 1, from config.json and the safetensors header(s), as one JSON line:
{"bytes_per_token", "parts", "moe_layers", "layers", "formula", "model_type"}. The roofline of
a decode benchmark is the measured bandwidth divided by it (bench/cpu_decode.sh,
bench/gpu_vs_llamacpp.sh)."""
import json, os, re, struct, sys


def tensors(d):
    """Every tensor's header entry (dtype, shape, data_offsets) by name, from the safetensors
    header(s) of folder d: a single model.safetensors or an index of shards (also used by
    v4_decode.sh)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if not files:
        sys.exit(f"{d}: no *.safetensors files")
    out = {}
    for f in files:
        with open(os.path.join(d, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
        out.update((k, v) for k, v in hdr.items() if k != "__metadata__")
    return out


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    L = cfg["num_hidden_layers"]
    V = cfg["vocab_size"]
    topk = cfg.get("num_experts_per_tok") or 0
    size = {name: t["data_offsets"][1] - t["data_offsets"][0] for name, t in tensors(d).items()}

    # Per-token reads: every non-expert tensor of the first L layers (attention, norms, dense MLP,
    # router, shared experts); top-k routed experts per MoE layer, each the mean size of one expert
    # of that layer (gate+up+down, with any scales); the final norm and lm_head; one embedding row.
    # Layers >= L (multi-token-prediction modules) and the KV cache are not counted.
    cat = {"attention+norms": 0, "dense_mlp": 0, "router": 0, "shared_experts": 0,
           "routed_topk": 0, "final_norm+lm_head": 0, "embedding_row": 0}
    expert = {}          # layer -> {expert id -> bytes}
    lay = re.compile(r"model\.layers\.(\d+)\.(.*)")
    exp = re.compile(r"mlp\.experts\.(\d+)\.")
    for name, b in size.items():
        m = lay.match(name)
        if not m:
            if name == "model.embed_tokens.weight":
                cat["embedding_row"] += b // V
            elif name in ("lm_head.weight", "model.norm.weight"):
                cat["final_norm+lm_head"] += b
            continue
        i, rest = int(m.group(1)), m.group(2)
        if i >= L:
            continue
        e = exp.match(rest)
        if e:
            expert.setdefault(i, {}).setdefault(int(e.group(1)), 0)
            expert[i][int(e.group(1))] += b
        elif rest.startswith("mlp.shared_experts."):
            cat["shared_experts"] += b
        elif rest.startswith("mlp.gate."):
            cat["router"] += b
        elif rest.startswith("mlp."):
            cat["dense_mlp"] += b
        else:
            cat["attention+norms"] += b
    for i, ex in expert.items():
        cat["routed_topk"] += topk * sum(ex.values()) // len(ex)
    if cfg.get("tie_word_embeddings") and "lm_head.weight" not in size:
        cat["final_norm+lm_head"] += size.get("model.embed_tokens.weight", 0)
    total = sum(cat.values())
    H = cfg["hidden_size"]
    formula = ("bytes/token = sum over the %d layers of (attention + norms [+ dense MLP | + router + "
               "shared experts + num_experts_per_tok(%d) x one routed expert (3 x hidden(%d) x "
               "moe_intermediate_size(%s) x dtype bytes)]) + final norm + lm_head (vocab(%d) x hidden x "
               "dtype bytes) + one embedding row; sizes from the safetensors header; KV cache reads "
               "not counted" % (L, topk, H, cfg.get("moe_intermediate_size"), V))
    print(json.dumps({"bytes_per_token": total, "parts": cat, "moe_layers": len(expert),
                      "layers": L, "formula": formula, "model_type": cfg.get("model_type")}))


if __name__ == "__main__":
    main()
