#!/usr/bin/env python3
"""gpu_vs_transformers.py -- deepinfer's CUDA backend next to PyTorch + transformers on one GPU.

One run measures, on the same device and the same weights:
  1. the device's copy bandwidth (bytes read + written per second, a 4 GiB bf16 copy) and its
     bf16 matmul rate (8192^3 torch.matmul): the two rooflines;
  2. a DeepSeek-V2-Lite-shaped model with random bf16 weights (transformers' own initialisation,
     made on the GPU and saved as a Hugging Face folder; about 31 GB at full depth);
  3. batch-1 greedy decode tokens/s: transformers `generate` and `deepinfer generate --device
     cuda`, each as a fraction of the bandwidth roofline (bytes a decode step must read: every
     dense weight, the router, the shared experts, the top-k routed experts of each MoE layer,
     the lm_head; / copy bandwidth);
  4. throughput with C concurrent requests: transformers `generate` on a batch of C prompts, and
     deepinfer's engine (bench_engine --device cuda --overlap, a closed loop of C requests in
     flight; the overlap loop as `deepinfer batch --device cuda` runs it);
  5. the same with sampling at --sampled-concurrency (default 64): temperature 0.7, top_p 0.9
     on both sides (deepinfer draws on the device; transformers' `generate(do_sample=True)`).

usage: gpu_vs_transformers.py --deepinfer BUILD/deepinfer --bench-engine BUILD/bench_engine
                              [--layers 27] [--model-dir /tmp/v2lite-rand] [--gen 64]
                              [--prompt-len 16] [--concurrency 1,8,64] [--out results.json]
                              [--md table.md] [--plot plot.png] [--skip-hf]
                              [--no-invariant [--ni-concurrency 1,64]]
                              [--sampled-concurrency 64] [--repeat 2]
       gpu_vs_transformers.py --make-only [--layers N] [--model-dir DIR]  (only the folder)
       gpu_vs_transformers.py --from-json results.json [--concurrency ...] [--md] [--plot]
deepinfer runs first, transformers last, so a run cut short keeps deepinfer's rows.
Batch-1 decode speed: transformers = (time of N new tokens - time of 1 new token) / (N - 1)
(prefill not counted); deepinfer = the decode tok/s that `deepinfer generate --format json`
reports (tokens after the first / their time: model loading and prefill not counted). The
concurrent rows are output tokens / wall time of the whole batch (prefill included) for both.
Each time of transformers is the better of two `generate` calls; each deepinfer row likewise the
better of --repeat runs (default 2; every run's figure kept in the JSON under "runs").
The JSON is rewritten after every phase, so a run cut short keeps what it measured. Prints a
Markdown table (also to --md) and draws --plot (matplotlib) when given.
"""
import argparse
import json
import os
import subprocess
import sys
import time

try:
    import torch
except ImportError:  # --from-json needs no torch
    torch = None

# DeepSeek-V2-Lite's published config (deepseek-ai/DeepSeek-V2-Lite), transformers' field names.
V2_LITE = dict(
    vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
    num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, n_shared_experts=2,
    n_routed_experts=64, num_experts_per_tok=6, routed_scaling_factor=1.0, kv_lora_rank=512,
    q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
    topk_method="greedy", n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=False,
    max_position_embeddings=163840, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=100000,
    eos_token_id=100001, tie_word_embeddings=False, attention_bias=False,
)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def timed(fn, reps=5):
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def probe_device():
    n = 2 * 1024**3  # bf16 elements: 4 GiB per buffer
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1.0)
    t = timed(lambda: b.copy_(a))
    bw = 2 * a.numel() * 2 / t
    del a, b
    m = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = timed(lambda: m @ m)
    flops = 2 * 8192**3 / t
    return bw, flops


def decode_bytes(c):
    """Weight bytes one batch-1 decode step reads (bf16)."""
    H, nh = c["hidden_size"], c["num_attention_heads"]
    dn, dr, dv, R = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    attn = H * nh * (dn + dr) + H * (R + dr) + R * nh * (dn + dv) + nh * dv * H
    dense = 3 * H * c["intermediate_size"]
    moe_i = c["moe_intermediate_size"]
    moe = H * c["n_routed_experts"] + 3 * H * moe_i * (c["n_shared_experts"] + c["num_experts_per_tok"])
    L, k = c["num_hidden_layers"], c["first_k_dense_replace"]
    params = L * attn + k * dense + (L - k) * moe + c["vocab_size"] * H + H  # lm_head + embed row
    return 2 * params


def make_model(args):
    from transformers import AutoModelForCausalLM, DeepseekV2Config

    cfg = DeepseekV2Config(**dict(V2_LITE, num_hidden_layers=args.layers))
    torch.manual_seed(1234)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        t = time.perf_counter()
        model.save_pretrained(args.model_dir, max_shard_size="4GB")
        log("saved %s in %.1f s" % (args.model_dir, time.perf_counter() - t))
    return model, cfg


def hf_generate_time(model, batch, prompt_len, new_tokens, sampled=None):
    """Seconds of one generate of `new_tokens` per row (the better of two); sampled: None
    (greedy) or (temperature, top_p). (torch.no_grad inside, not as a decorator: --from-json
    runs without torch.)"""
    g = torch.Generator(device="cpu").manual_seed(7)
    ids = torch.randint(10, 100000, (batch, prompt_len), generator=g).cuda()
    kw = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
              pad_token_id=0, eos_token_id=None)
    if sampled:
        kw.update(do_sample=True, temperature=sampled[0], top_p=sampled[1], top_k=0)
    with torch.no_grad():
        model.generate(ids, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
        return timed(lambda: model.generate(ids, **kw), reps=2)


def hf_decode(model, batch, args, sampled=None):
    t1 = hf_generate_time(model, batch, args.prompt_len, 1, sampled)
    tn = hf_generate_time(model, batch, args.prompt_len, args.gen, sampled)
    return batch * (args.gen - 1) / (tn - t1), batch * args.gen / tn


def best_of(n, run, key):
    """The best of n calls of run() (the highest key(result)), as transformers' times are the
    better of two, with every call's key(result) under "runs"."""
    results = [run() for _ in range(max(n, 1))]
    best = max(results, key=key)
    best["runs"] = [key(r) for r in results]
    return best


def di_generate(args, new_tokens, env=None, extra=()):
    """One `deepinfer generate` process: (wall seconds incl. loading, its JSON object)."""
    ids = " ".join(str(10 + 37 * i % 99000) for i in range(args.prompt_len))
    cmd = [args.deepinfer, "generate", "--device", "cuda", "--model", args.model_dir, "--ids", ids,
           "--max-tokens", str(new_tokens), "--ignore-eos", "--format", "json"] + list(extra)
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return time.perf_counter() - t, json.loads(out.strip().splitlines()[-1])


def di_engine(args, conc, env=None, extra=()):
    """The engine as `deepinfer batch --device cuda` runs it: the overlap loop on (on a GPU the
    device loop, the next decode step queued behind the running one), after an untimed warm-up
    round of the same shape (--warmup: first kernel launches, the decode graph), as
    transformers gets its warm-up generate."""
    cmd = [args.bench_engine, "--device", "cuda", "--model", args.model_dir, "--mode", "engine",
           "--concurrency", str(conc), "--requests", str(conc), "--prompt-len", str(args.prompt_len),
           "--gen-len", str(args.gen), "--max-running", str(max(conc, 1)),
           "--max-batch-tokens", str(max(conc * args.prompt_len, 256)), "--overlap",
           "--warmup"] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepinfer")
    ap.add_argument("--bench-engine")
    ap.add_argument("--from-json", help="print the table (and --md / --plot) of this results "
                    "file of an earlier run, measuring nothing")
    ap.add_argument("--make-only", action="store_true",
                    help="only write the model folder (--model-dir, --layers) and exit")
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--model-dir", default="/tmp/v2lite-rand")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--concurrency", default="1,8,64")
    ap.add_argument("--out", default="gpu_vs_transformers.json")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--md", help="also write the Markdown table here")
    ap.add_argument("--plot", help="draw a PNG bar chart here")
    ap.add_argument("--no-invariant", action="store_true",
                    help="also batch 1 and the engine with --no-batch-invariant (the SIMT GEMV up "
                         "to 8 tokens, the tensor cores above)")
    ap.add_argument("--ni-concurrency", default="1,64",
                    help="the engine's concurrencies measured with --no-invariant")
    ap.add_argument("--sampled-concurrency", default="64",
                    help="also these concurrencies with sampling (temperature 0.7, top_p 0.9) on "
                         "both sides; empty: none")
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs per deepinfer row, the best kept (transformers: the better of two "
                         "generate calls per time)")
    ap.add_argument("--no-graphs", action="store_true",
                    help="also batch-1 decode with DI_CUDA_GRAPHS=0 (every op launched)")
    args = ap.parse_args()
    if args.make_only:
        make_model(args)
        return
    if args.from_json:  # only the table and the plot of an earlier run
        with open(args.from_json) as f:
            res = json.load(f)
        write_outputs(res, [int(x) for x in args.concurrency.split(",")], args)
        return
    if not args.deepinfer or not args.bench_engine:
        ap.error("--deepinfer and --bench-engine are required (except with --make-only and "
                 "--from-json)")
    res = {"device": torch.cuda.get_device_name(), "layers": args.layers, "gen": args.gen,
           "prompt_len": args.prompt_len}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    bw, flops = probe_device()
    res.update(copy_bw_Bps=bw, bf16_matmul_flops=flops)
    log("copy bandwidth %.2f TB/s, bf16 matmul %.0f TFLOP/s" % (bw / 1e12, flops / 1e12))

    t = time.perf_counter()
    model, cfg = make_model(args)
    log("transformers model ready in %.1f s" % (time.perf_counter() - t))
    c = dict(V2_LITE, num_hidden_layers=args.layers)
    nbytes = decode_bytes(c)
    res.update(decode_bytes=nbytes, roofline_tok_s=bw / nbytes)
    log("batch-1 decode reads %.2f GB -> roofline %.1f tok/s" % (nbytes / 1e9, bw / nbytes))
    save()

    concs = [int(x) for x in args.concurrency.split(",")]
    res["hf"] = {}

    def b1_run():
        wall, js = di_generate(args, args.gen)
        tm = js.get("timing", {})
        return {"decode_tok_s": tm.get("decode_tok_s"), "wall_s": wall, "timing": tm}

    try:
        res["deepinfer_b1"] = best_of(args.repeat, b1_run, lambda r: r["decode_tok_s"] or 0.0)
        tm = res["deepinfer_b1"]["timing"]
        wall = res["deepinfer_b1"]["wall_s"]
        log("deepinfer batch 1: decode %.1f tok/s (process wall %.1f s incl. loading)"
            % (tm.get("decode_tok_s", 0.0), wall))
    except subprocess.CalledProcessError as e:
        log("deepinfer generate failed: %s" % e.stderr[-2000:])
    save()
    res["deepinfer_engine"] = {}
    def tok_s(r):
        return r["output_tok_s"]

    for conc in concs:
        try:
            r = best_of(args.repeat, lambda: di_engine(args, conc), tok_s)
        except subprocess.CalledProcessError as e:
            log("bench_engine concurrency %d failed: %s" % (conc, e.stderr[-2000:]))
            continue
        res["deepinfer_engine"][str(conc)] = r
        log("deepinfer engine concurrency %d: %.1f output tok/s" % (conc, r["output_tok_s"]))
        save()

    sconcs = [int(x) for x in args.sampled_concurrency.split(",") if x]
    res["deepinfer_engine_sampled"] = {}
    for conc in sconcs:  # the draw on the device (temperature and top_p: sample_mass.h)
        try:
            sampling = ["--temperature", "0.7", "--top-p", "0.9"]
            r = best_of(args.repeat, lambda: di_engine(args, conc, extra=sampling), tok_s)
        except subprocess.CalledProcessError as e:
            log("bench_engine sampled concurrency %d failed: %s" % (conc, e.stderr[-2000:]))
            continue
        res["deepinfer_engine_sampled"][str(conc)] = r
        log("deepinfer engine concurrency %d, T 0.7 top_p 0.9: %.1f output tok/s"
            % (conc, r["output_tok_s"]))
        save()

    if args.no_graphs:
        try:
            wall, js = di_generate(args, args.gen, {"DI_CUDA_GRAPHS": "0"})
            res["deepinfer_b1_nographs"] = {"decode_tok_s": js["timing"]["decode_tok_s"]}
            log("deepinfer batch 1, DI_CUDA_GRAPHS=0: decode %.1f tok/s"
                % js["timing"]["decode_tok_s"])
        except subprocess.CalledProcessError as e:
            log("deepinfer generate (no graphs) failed: %s" % e.stderr[-2000:])
        save()
    if args.no_invariant:
        ni = ["--no-batch-invariant"]
        try:
            wall, js = di_generate(args, args.gen, extra=ni)
            res["deepinfer_b1_ni"] = {"decode_tok_s": js["timing"]["decode_tok_s"]}
            log("deepinfer batch 1, --no-batch-invariant: decode %.1f tok/s"
                % js["timing"]["decode_tok_s"])
        except subprocess.CalledProcessError as e:
            log("deepinfer generate (not invariant) failed: %s" % e.stderr[-2000:])
        res["deepinfer_engine_ni"] = {}
        for conc in [int(x) for x in args.ni_concurrency.split(",")]:
            try:
                r = di_engine(args, conc, extra=ni)
            except subprocess.CalledProcessError as e:
                log("bench_engine --no-batch-invariant concurrency %d failed: %s"
                    % (conc, e.stderr[-2000:]))
                continue
            res["deepinfer_engine_ni"][str(conc)] = r
            log("deepinfer engine --no-batch-invariant concurrency %d: %.1f output tok/s"
                % (conc, r["output_tok_s"]))
            save()
    # transformers last (its model stays in GPU memory meanwhile: 31 GB of the H200's 141), so
    # that a run cut short by a time limit keeps deepinfer's rows.
    if not args.skip_hf:
        for conc in concs:
            try:
                dec, tot = hf_decode(model, conc, args)
            except Exception as e:  # noqa: BLE001 -- keep the other measurements
                log("transformers batch %d failed: %r" % (conc, e))
                continue
            res["hf"][str(conc)] = {"decode_tok_s": dec, "output_tok_s": tot}
            log("transformers batch %d: decode %.1f tok/s, output %.1f tok/s" % (conc, dec, tot))
            save()
        res["hf_sampled"] = {}
        for conc in sconcs:
            try:
                dec, tot = hf_decode(model, conc, args, sampled=(0.7, 0.9))
            except Exception as e:  # noqa: BLE001 -- keep the other measurements
                log("transformers sampled batch %d failed: %r" % (conc, e))
                continue
            res["hf_sampled"][str(conc)] = {"decode_tok_s": dec, "output_tok_s": tot}
            log("transformers batch %d, T 0.7 top_p 0.9: output %.1f tok/s" % (conc, tot))
            save()
    del model
    torch.cuda.empty_cache()
    write_outputs(res, concs, args)


def write_outputs(res, concs, args):
    """Prints the table of a run, and writes it to --md and the plot to --plot if given."""
    table = report(res, concs)
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table + "\n")
    if args.plot:
        plot(res, concs, args.plot)


def warm_b1(res):
    """Batch-1 decode tok/s from the 1-concurrent engine run: 1 / its mean decode step, after
    the warm-up (None when that run is missing or was not warmed up)."""
    e = res.get("deepinfer_engine", {}).get("1")
    if not e or not e.get("warmup"):
        return None
    steps = [st for st in e.get("decode_steps", []) if st[0] == 1]
    return 1.0 / steps[0][2] if steps and steps[0][2] > 0 else None


def report(res, concs):
    """The Markdown table of one run."""
    rl = res["roofline_tok_s"]
    lines = ["| what | tok/s | share of the copy-bandwidth roofline | deepinfer / transformers |",
             "|---|---|---|---|"]
    d1 = res.get("deepinfer_b1", {}).get("decode_tok_s")
    h1 = res.get("hf", {}).get("1", {}).get("decode_tok_s")
    dw = warm_b1(res)
    if dw:
        lines.append("| deepinfer batch-1 decode (the engine's warm decode steps) | %.1f | %.0f %% "
                     "| %s |" % (dw, 100 * dw / rl, "%.1fx" % (dw / h1) if h1 else "-"))
    if d1:
        lines.append("| deepinfer batch-1 decode (`deepinfer generate`: one process, its graph "
                     "capture included) | %.1f | %.0f %% | %s |"
                     % (d1, 100 * d1 / rl, "%.1fx" % (d1 / h1) if h1 else "-"))
    d1n = res.get("deepinfer_b1_nographs", {}).get("decode_tok_s")
    if d1n:
        lines.append("| deepinfer batch-1 decode, DI_CUDA_GRAPHS=0 | %.1f | %.0f %% | %s |"
                     % (d1n, 100 * d1n / rl, "%.1fx" % (d1n / h1) if h1 else "-"))
    d1i = res.get("deepinfer_b1_ni", {}).get("decode_tok_s")
    if d1i:
        lines.append("| deepinfer batch-1 decode, --no-batch-invariant | %.1f | %.0f %% | %s |"
                     % (d1i, 100 * d1i / rl, "%.1fx" % (d1i / h1) if h1 else "-"))
    if h1:
        lines.append("| transformers batch-1 decode | %.1f | %.0f %% | - |" % (h1, 100 * h1 / rl))
    for conc in concs:
        e = res.get("deepinfer_engine", {}).get(str(conc))
        h = res.get("hf", {}).get(str(conc))
        if e:
            ratio = "%.1fx" % (e["output_tok_s"] / h["output_tok_s"]) if h else "-"
            lines.append("| deepinfer engine, %d concurrent (output tok/s) | %.1f | - | %s |"
                         % (conc, e["output_tok_s"], ratio))
        em = res.get("deepinfer_engine_ni", {}).get(str(conc))
        if em:
            ratio = "%.1fx" % (em["output_tok_s"] / h["output_tok_s"]) if h else "-"
            lines.append("| deepinfer engine, %d concurrent, --no-batch-invariant (output tok/s) "
                         "| %.1f | - | %s |" % (conc, em["output_tok_s"], ratio))
        if h:
            lines.append("| transformers generate, batch %d (output tok/s) | %.1f | - | - |"
                         % (conc, h["output_tok_s"]))
    for conc, e in sorted(res.get("deepinfer_engine_sampled", {}).items(), key=lambda kv: int(kv[0])):
        h = res.get("hf_sampled", {}).get(conc)
        ratio = "%.1fx" % (e["output_tok_s"] / h["output_tok_s"]) if h else "-"
        lines.append("| deepinfer engine, %s concurrent, temperature 0.7, top_p 0.9 (output tok/s) "
                     "| %.1f | - | %s |" % (conc, e["output_tok_s"], ratio))
        if h:
            lines.append("| transformers generate, batch %s, temperature 0.7, top_p 0.9 (output "
                         "tok/s) | %.1f | - | - |" % (conc, h["output_tok_s"]))
    return "\n".join(lines)


def plot(res, concs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(concs))
    di = [res.get("deepinfer_engine", {}).get(str(c), {}).get("output_tok_s", 0) for c in concs]
    dm = [res.get("deepinfer_engine_ni", {}).get(str(c), {}).get("output_tok_s", 0)
          for c in concs]
    hf = [res.get("hf", {}).get(str(c), {}).get("output_tok_s", 0) for c in concs]
    ax.bar([x - 0.27 for x in xs], di, 0.27, label="deepinfer engine (CUDA, batch-invariant)")
    if any(dm):
        ax.bar(list(xs), dm, 0.27, label="deepinfer engine, --no-batch-invariant")
    ax.bar([x + 0.27 for x in xs], hf, 0.27, label="transformers generate")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([str(c) for c in concs])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_yscale("log")
    ax.set_title("%s, V2-Lite shape, %d layers, random bf16" % (res["device"], res["layers"]))
    ax.set_ylim(top=max(di + dm + hf + [1]) * 4)  # room above the bars for the legend
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
