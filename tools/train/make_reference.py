#!/usr/bin/env python3
"""Float64 reference outputs of the shipped tiny model, for checking the C engine against it.

Usage: python3 tools/train/make_reference.py [--model models/deepseek-v4-tiny]

Writes <model>/ref/<case>/ref.json and ref_logits.f64 for a few real prompts, in the format of
tests/data/v4_* (see tools/make_goldens_v4.py and docs/v4-reference-notes.md), computed with
transformers 5.17 on the CPU in float64 on exactly the stored (bf16/fp32) weights:
  ref_logits.f64      raw little-endian float64 [n_rows][vocab]: main-head prefill logits of
                      the prompt positions listed in ref.json "logits_positions" (all positions
                      for the short prompts; the last 16 for the long one, to keep the repository
                      small -- every position's argmax and top-2 gap are in ref.json)
  ref_mtp_logits.f64  float64 [n_rows][vocab]: MTP logits at "mtp_positions" (row t uses the main
                      streams at t and the token at t+1, predicts the token at t+2)
  ref.json            prompt text and ids, greedy continuation (full recompute == generate()),
                      argmax per position, margins, checks (stock float32-in-float64 HF diff,
                      chunked prefill/decode diff, independent from-the-notes forward diff)
The model folder itself (config.json, model.safetensors) is the checkpoint: "model_dir" is "../..".

Design stance: the same float64 machinery as tools/make_goldens_v4.py (imported from there):
transformers' modeling file re-executed with float32 -> float64, experts on the eager path.
The MTP module is tools/train/model_def.MTPModule built from that float64 module.
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))

torch.set_num_threads(2)

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import make_goldens_v4 as g  # noqa: E402
import model_def  # noqa: E402

GENESIS = (
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep. "
    "And the Spirit of God moved upon the face of the waters.\n"
    "And God said, Let there be light: and there was light.\n"
    "And God saw the light, that it was good: and God divided the light from the darkness.\n"
    "And God called the light Day, and the darkness he called Night. And the evening and the morning "
    "were the first day.\n"
    "And God said, Let there be a firmament in the midst of the waters, and let it divide the waters "
    "from the waters.\n"
    "And God made the firmament, and divided the waters which were under the firmament from the waters "
    "which were above the firmament: and it was so.\n"
    "And God called the firmament Heaven. And the evening and the morning were the second day.\n"
    "And God said, Let the waters under the heaven be gathered together unto one place, and let the dry "
    "land appear: and it was so.\n"
    "And God called the dry land Earth; and the gathering together of the waters called he Seas: and God "
    "saw that it was good.\n"
    "And God said, Let the earth bring forth grass, the herb yielding seed, and the fruit tree yielding "
    "fruit after his kind, whose seed is in itself, upon the earth: and it was so.\n"
    "And the earth brought forth grass, and herb yielding seed after his kind, and the tree yielding fruit, "
    "whose seed was in itself, after his kind: and God saw that it was good.\n"
    "And the evening and the morning were the third day.\n"
    "And God said, Let there be lights in the firmament of the heaven to divide the day from the night; "
    "and let them be for signs, and for seasons, and for days, and years:\n"
    "And let them be for lights in the firmament of the heaven to give light upon the earth: and it was so.\n"
    "And God made two great lights; the greater light to rule the day, and the lesser light to rule the "
    "night: he made the stars also.\n"
    "And God set them in the firmament of the heaven to give light upon the earth,\n"
)

CASES = {
    "short_kernel": dict(text="The kernel uses a spinlock to", n_new=24, last_rows=None,
                         chunks=[3, 1, 1, 2, 8]),
    "short_python": dict(text="A Python list is", n_new=24, last_rows=None, chunks=[2, 1, 1, 9]),
    # > 2 sliding windows, 2 HCA entries, > index_topk CSA entries: every path of the model is used
    # (the prompt is the longest prefix of GENESIS, 260..390 tokens, whose router and indexer
    # top-k cuts all have margins > 5e-5 / 2e-5 (in float64; stock transformers, which runs these in
    # float32, selects the same), so that float32 engines select the same experts and entries.
    # A trained model has many cuts: 1e-4, the bound of the random goldens, is not reached here.)
    "long_genesis": dict(text=GENESIS, n_new=16, last_rows=16, chunks=[100, 1, 1, 60, 1, 128],
                         prefix_range=(390, 260, -10)),
}
ROUTER_MARGIN = 5e-5
INDEXER_MARGIN = 2e-5


def mtp_f64(model_dir, cfg, f64mod):
    mtp = model_def.MTPModule(cfg, mod=f64mod)
    t = {k: v.to(torch.float64) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()
         if k.startswith("mtp.")}
    mtp.double()
    model_def.mtp_load_upstream(mtp, t)
    for k, v in mtp.state_dict().items():
        if "rotary" not in k and v.is_floating_point():
            assert v.dtype == torch.float64, k
    return mtp.eval()


def make_case(name, case, model_dir, out_root, cfg, eff, f64mod, tok):
    folder = os.path.join(out_root, name)
    os.makedirs(folder, exist_ok=True)
    full_prompt = tok(case["text"]).input_ids
    assert full_prompt[0] == 0 and full_prompt.count(0) == 1
    model = g.load_reference(cfg, eff, f64mod.DeepseekV4ForCausalLM)
    resolved = g.check_resolved(cfg, model)
    lengths = list(range(*case["prefix_range"])) if "prefix_range" in case else [len(full_prompt)]
    for L in lengths:
        prompt = full_prompt[:L]
        logits, greedy, gms, seq = g.compute_reference(dict(n_new=case["n_new"]), model, prompt)
        rmin, imin, n_cut, zero_rows = g.margins(model, cfg, torch.tensor([seq[:-1]]))
        if len(lengths) == 1 or (rmin > ROUTER_MARGIN and imin > INDEXER_MARGIN):
            break
        print(f"[{name}] prefix {L}: router margin {rmin:.2g}, indexer margin {imin:.2g}: too small", flush=True)
    else:
        raise SystemExit(f"{name}: no prefix with clear router/indexer margins")

    # MTP over the prompt: row t uses the streams at t and prompt[t+1]. The last row has no next
    # token; it gets the pad id and is dropped (causal: it cannot change earlier rows).
    mtp = mtp_f64(model_dir, cfg, f64mod)
    cap = model_def.Capture(model)
    ids = torch.tensor([prompt])
    nxt = torch.tensor([prompt[1:] + [cfg.pad_token_id]])
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        mlog = mtp(cap.streams, nxt, model.model.embed_tokens, model.lm_head, cap.layer_kwargs)[0, :-1]
    cap.remove()
    mtp_hits = (mlog[:-1].argmax(-1) == ids[0, 2:]).float().mean().item()

    stock = g.load_reference(cfg, eff, transformers.DeepseekV4ForCausalLM)
    with torch.no_grad():
        sl = stock(input_ids=ids, use_cache=False).logits[0]
    stock_diff = (sl - logits).abs().max().item()

    full_seq = seq[:-1]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([full_seq]), use_cache=False).logits[0]
    chunks = [c for c in case["chunks"]]
    while sum(chunks) > len(full_seq):
        chunks.pop()
    chunks.append(len(full_seq) - sum(chunks))
    chunks = [c for c in chunks if c > 0]
    ch = g.chunked_logits(model, full_seq, chunks)
    chunk_diff = (ch - full).abs().max().item()
    assert chunk_diff < 1e-9, chunk_diff

    ind = g.independent_forward(model_dir, full_seq)
    ind_diff = (ind - full).abs().max().item()
    assert ind_diff < 1e-9, f"independent implementation differs by {ind_diff}"

    n = len(prompt)
    rows = list(range(n)) if case["last_rows"] is None else list(range(n - case["last_rows"], n))
    logits[rows].contiguous().numpy().astype("<f8").tofile(os.path.join(folder, "ref_logits.f64"))
    mrows = list(range(n - 1)) if case["last_rows"] is None else list(range(n - 1 - case["last_rows"], n - 1))
    mlog[mrows].contiguous().numpy().astype("<f8").tofile(os.path.join(folder, "ref_mtp_logits.f64"))
    top2 = logits.topk(2, -1).values
    ref = {
        "case": name,
        "description": "bundled trained model models/deepseek-v4-tiny on a real prompt (tools/train/make_reference.py)",
        "model_dir": "../..",
        "prompt_text": tok.decode(prompt, skip_special_tokens=True),
        "prompt_ids": prompt,
        "n_prompt": n,
        "vocab_size": cfg.vocab_size,
        "logits_file": "ref_logits.f64",
        "logits_dtype": "float64",
        "logits_positions": rows,
        "logits_shape": [len(rows), cfg.vocab_size],
        "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy),
        "n_greedy": len(greedy),
        "prompt_argmax_ids": logits.argmax(-1).tolist(),
        "prompt_top2_gap": (top2[:, 0] - top2[:, 1]).tolist(),
        "prompt_logsumexp": torch.logsumexp(logits, -1).tolist(),
        "mtp": {
            "logits_file": "ref_mtp_logits.f64",
            "positions": mrows,
            "logits_shape": [len(mrows), cfg.vocab_size],
            "argmax_ids": mlog.argmax(-1).tolist(),
            "rule": "row t: MTP(main streams before hc_head at t, embed(prompt_ids[t+1])) predicts prompt_ids[t+2]",
            "top1_acc_on_prompt": mtp_hits,
        },
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "tensor_naming": "transformers_save_pretrained (+ upstream mtp.0.*)",
        "weights_dtype": "bf16 + fp32 (hc_*, attn_sink, ape, gate.bias) + int64 tid2eid",
        "min_router_margin": rmin,
        "min_indexer_margin": imin if imin != float("inf") else None,  # null: no top-k cut was made
        "indexer_cuts_checked": n_cut,
        "indexer_rows_with_zero_scores": zero_rows,
        "min_greedy_logit_margin": min(gms),
        "stock_transformers_f64_max_abs_diff": stock_diff,
        "chunked": {"chunks": chunks, "over": "prompt_ids + greedy_ids[:-1]", "max_abs_diff_vs_full_prefill": chunk_diff},
        "independent_impl_max_abs_diff": ind_diff,
        "resolved": resolved,
    }
    g.write_json(os.path.join(folder, "ref.json"), ref)
    print(f"[{name}] n_prompt {n}, greedy {tok.decode(greedy)!r}; router {rmin:.3g} indexer {imin:.3g} "
          f"({n_cut} cuts, {zero_rows} rows with 0 scores) greedy-gap {min(gms):.3g} stock {stock_diff:.2g} "
          f"chunked {chunk_diff:.2g} independent {ind_diff:.2g} mtp-acc {mtp_hits:.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", model_def.MODEL_NAME))
    ap.add_argument("--case", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()
    f64mod = g.load_f64_modeling()
    cfg = transformers.DeepseekV4Config.from_pretrained(args.model)
    raw = load_file(os.path.join(args.model, "model.safetensors"))
    eff = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in raw.items() if not k.startswith("mtp.")}
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    out_root = os.path.join(args.model, "ref")
    for name in args.case or list(CASES):
        make_case(name, CASES[name], args.model, out_root, cfg, eff, f64mod, tok)


if __name__ == "__main__":
    main()
