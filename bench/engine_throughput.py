#!/usr/bin/env python3
"""engine_throughput.py -- serving throughput of the engine against concurrency, next to the
one-request-at-a-time loop, the prefix-cache speed-up, the scheduler's CPU share, and the
per-batch-size roofline. Run through bench/engine_throughput.sh (which finds the binaries).

Measurements (all by build/bench_engine, one JSON object per run):
  sweep     closed loop at concurrency C = 1, 2, 4, ... (C requests in flight, 2C or more in
            all): output tokens/s, TTFT and inter-token latency percentiles, and the engine's
            stats (scheduling / device / post-processing seconds -> scheduler CPU share).
            Also the compute wait: the share of the wall time in which no forward ran (the
            thread driving the forward idle between steps, waiting for scheduling, post-
            processing and the client loop) = 1 - time_device_s / wall.
  overlap   the top concurrency again with the engine's overlap loop (forward on a compute
            thread, scheduling / post-processing of the neighbouring steps meanwhile); its
            compute wait is the compute thread's idle time between steps.
  baseline  the same requests one at a time over di_context (what `deepinfer generate` does).
  prefix    requests sharing a long "system prompt": prefix cache on vs off (wall time, TTFT).
  roofline  for each decode batch size B seen in the sweep (steps with no prompt tokens), the
            measured step time against max(bytes(B) / bandwidth, flops(B) / matmul rate):
              bytes(B) = weights every step reads (attention, norms, shared experts, dense
                         MLPs, router, lm_head) + sum over MoE layers of distinct_experts(B) x
                         expert bytes + B x context x kv_bytes_per_token
              flops(B) = 2 x B x active parameters per token
            distinct_experts(B): measured, when the engine counts them (di_engine_stats.
            n_expert_loads: V2/V3 on the CPU backend), as the mean over the decode steps of
            batch B of the experts read per MoE layer; else the uniform-routing estimate
            E (1 - (1 - k/E)^B) (marked "est."). Both are reported.
            Bandwidth and matmul rate come from build/bench_matmul (read bandwidth over 256 MiB;
            the best prefill GFLOP/s of the model's dtype), or --bandwidth-gbs / --matmul-gflops.

Outputs: bench/out/engine_throughput.json (everything), bench/out/engine_throughput.md (tables),
docs/engine_throughput.png, docs/engine_roofline.png, docs/engine_prefix_cache.png.

The default run is short (concurrency up to 16, 32-token prompts and outputs; under a minute
on the tiny golden model with 2 cores). --full sweeps up to 256 with longer requests.
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1,
               "I32": 4, "I64": 8, "F64": 8}


def run_json(cmd):
    print("  $ " + " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# ---- the model's bytes and parameters ---------------------------------------------------------

def safetensors_tensors(model_dir):
    """{name: (dtype, shape, nbytes)} over every *.safetensors file of the folder."""
    tensors = {}
    for fn in sorted(os.listdir(model_dir)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(model_dir, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            tensors[name] = (t["dtype"], t["shape"], b - a)
    return tensors


def model_costs(model_dir, info):
    """Bytes and parameters split into what every step reads and what each routed expert adds."""
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    n_layers = cfg["num_hidden_layers"]
    n_experts = cfg.get("n_routed_experts") or 0
    k = cfg.get("num_experts_per_tok") or 0
    expert_re = re.compile(r"layers\.(\d+)\.mlp\.experts\.(\d+)\.")
    layer_re = re.compile(r"layers\.(\d+)\.")
    shared_bytes = shared_params = 0
    expert_bytes = {}   # layer -> bytes of one expert (mean)
    expert_params = {}
    count = {}
    for name, (dtype, shape, nbytes) in safetensors_tensors(model_dir).items():
        m = layer_re.search(name)
        if m and int(m.group(1)) >= n_layers:
            continue  # MTP layers: loaded, never run
        params = math.prod(shape) if shape else 1
        e = expert_re.search(name)
        if e:
            layer = int(e.group(1))
            expert_bytes[layer] = expert_bytes.get(layer, 0) + nbytes
            expert_params[layer] = expert_params.get(layer, 0) + params
            count.setdefault(layer, set()).add(int(e.group(2)))
        elif "embed_tokens" in name:
            continue  # one row per token: negligible
        else:
            shared_bytes += nbytes
            shared_params += params
    per_expert_bytes = {l: b / len(count[l]) for l, b in expert_bytes.items()}
    per_expert_params = {l: p / len(count[l]) for l, p in expert_params.items()}
    return {
        "n_experts": n_experts, "k": k, "moe_layers": sorted(per_expert_bytes),
        "shared_bytes": shared_bytes, "shared_params": shared_params,
        "expert_bytes": per_expert_bytes, "expert_params": per_expert_params,
        "active_params": shared_params + k * sum(per_expert_params.values()),
        "kv_bytes_per_token": info.get("kv_bytes_per_token", 0),
    }


def distinct_experts(n_experts, k, batch):
    """Expected experts touched by `batch` tokens routed uniformly and independently."""
    if n_experts == 0:
        return 0.0
    return n_experts * (1.0 - (1.0 - k / n_experts) ** batch)


def roofline(costs, batch, context, bw_bytes_s, flops_s, measured_experts=None):
    est = distinct_experts(costs["n_experts"], costs["k"], batch)
    d = measured_experts if measured_experts else est
    nbytes = (costs["shared_bytes"] + sum(d * b for b in costs["expert_bytes"].values())
              + batch * context * costs["kv_bytes_per_token"])
    flops = 2.0 * batch * costs["active_params"]
    t_mem, t_flop = nbytes / bw_bytes_s, flops / flops_s
    return {"batch": batch, "distinct_experts_per_layer_est": est,
            "distinct_experts_per_layer_measured": measured_experts,
            "distinct_experts_per_layer": d, "bytes": nbytes, "flops": flops,
            "t_mem_s": t_mem, "t_compute_s": t_flop, "t_s": max(t_mem, t_flop),
            "tok_s": batch / max(t_mem, t_flop), "bound": "memory" if t_mem >= t_flop else "compute"}


def machine_rates(args, dtype):
    """(bandwidth bytes/s, matmul flop/s), measured by bench_matmul unless given."""
    bw, rate = args.bandwidth_gbs, args.matmul_gflops
    if bw is None or rate is None:
        print("  $ %s %d" % (args.bench_matmul, args.threads), file=sys.stderr, flush=True)
        text = subprocess.run([args.bench_matmul, str(args.threads)], check=True, text=True,
                              stdout=subprocess.PIPE).stdout
        m = re.search(r"read bandwidth[^:]*:\s*([0-9.]+)\s*GB/s", text)
        if bw is None and m:
            bw = float(m.group(1))
        rates = [float(x.group(2)) for x in
                 re.finditer(r"prefill\s+(\S+)\s.*?([0-9.]+)\s*GFLOP/s", text)
                 if x.group(1).lower().startswith(dtype.lower())]
        if rate is None:
            rate = max(rates) if rates else max(
                [float(x) for x in re.findall(r"([0-9.]+)\s*GFLOP/s", text)] or [1.0])
    return bw * 1e9, rate * 1e9


# ---- runs ---------------------------------------------------------------------------------------

def bench(args, **kw):
    cmd = [args.bench_engine, "--model", args.model, "--threads", str(args.threads)]
    for key, val in kw.items():
        if val is True:
            cmd.append("--" + key.replace("_", "-"))
        elif val is not None and val is not False:
            cmd += ["--" + key.replace("_", "-"), str(val)]
    return run_json(cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bench-engine", required=True)
    ap.add_argument("--bench-matmul", required=True)
    ap.add_argument("--deepinfer", required=True)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="concurrency up to 256, longer requests")
    ap.add_argument("--max-concurrency", type=int)
    ap.add_argument("--prompt-len", type=int)
    ap.add_argument("--gen-len", type=int)
    ap.add_argument("--shared-prefix", type=int, help="system prompt tokens (prefix test)")
    ap.add_argument("--bandwidth-gbs", type=float)
    ap.add_argument("--matmul-gflops", type=float)
    ap.add_argument("--out-dir", default="bench/out")
    ap.add_argument("--docs-dir", default="docs")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args()

    info = json.loads(subprocess.run([args.deepinfer, "info", "--model", args.model, "--format",
                                      "json"], check=True, text=True, stdout=subprocess.PIPE).stdout)
    ctx = min(info["max_context"], 4096)
    max_c = args.max_concurrency or (256 if args.full else 16)
    plen = args.prompt_len or (128 if args.full else 32)
    glen = args.gen_len or (128 if args.full else 32)
    prefix = args.shared_prefix or (1024 if args.full else 128)
    if plen + glen >= ctx:
        plen = glen = max(1, (ctx - 1) // 2)
    prefix = max(0, min(prefix, ctx - plen - glen - 1))

    res = {"model": args.model, "info": info, "prompt_len": plen, "gen_len": glen}
    conc = [1]
    while conc[-1] * 2 <= max_c:
        conc.append(conc[-1] * 2)
    print("sweep: concurrency %s, prompt %d, output %d tokens" % (conc, plen, glen), file=sys.stderr)
    res["sweep"] = [bench(args, concurrency=c, requests=max(2 * c, 8), prompt_len=plen,
                          gen_len=glen, max_running=max(c, 1)) for c in conc]
    # The same top concurrency with the overlap loop (forward on a compute thread): how long
    # that thread waits for the scheduler and post-processing between steps.
    res["overlap"] = bench(args, concurrency=conc[-1], requests=max(2 * conc[-1], 8),
                           prompt_len=plen, gen_len=glen, max_running=conc[-1], overlap=True)
    res["baseline"] = bench(args, mode="context", requests=8, prompt_len=plen, gen_len=glen)
    print("prefix cache: %d shared tokens" % prefix, file=sys.stderr)
    pc = dict(concurrency=4, requests=16, prompt_len=min(plen, 16), gen_len=min(glen, 8),
              shared_prefix=prefix)
    res["prefix"] = {"on": bench(args, **pc), "off": bench(args, no_prefix_cache=True, **pc)}

    for r in res["sweep"] + [res["overlap"]]:
        s = r["stats"]
        tot = s["time_total_s"] or 1.0
        r["scheduler_share"] = s["time_schedule_s"] / tot
        r["postprocess_share"] = s["time_postprocess_s"] / tot

    # Roofline per decode batch size.
    costs = model_costs(args.model, info)
    dtype = info.get("dtypes", "bf16").split("+")[0]
    bw, rate = machine_rates(args, dtype)
    res["machine"] = {"bandwidth_gbs": bw / 1e9, "matmul_gflops": rate / 1e9}
    res["costs"] = {k: v for k, v in costs.items() if k not in ("expert_bytes", "expert_params")}
    measured = {}
    for r in res["sweep"]:
        for step in r["decode_steps"]:
            b, n, mean_s = step[:3]
            loads = step[3] if len(step) > 3 else 0.0
            m = measured.setdefault(b, [0, 0.0, 0.0])
            m[0] += n
            m[1] += n * mean_s
            m[2] += n * loads
    context = plen + glen // 2
    res["roofline"] = []
    for b in sorted(measured):
        n_moe = len(costs["moe_layers"])
        per_layer = measured[b][2] / measured[b][0] / n_moe if n_moe else 0.0
        row = roofline(costs, b, context, bw, rate, per_layer if per_layer > 0 else None)
        row["measured_step_s"] = measured[b][1] / measured[b][0]
        row["measured_tok_s"] = b / row["measured_step_s"]
        row["fraction_of_roofline"] = row["measured_tok_s"] / row["tok_s"]
        res["roofline"].append(row)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "engine_throughput.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = table(res)
    with open(os.path.join(args.out_dir, "engine_throughput.md"), "w") as f:
        f.write(md)
    print(md)
    if not args.no_plots:
        plots(res, args.docs_dir)


def table(res):
    b = res["baseline"]
    lines = ["| concurrency | out tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | sched. CPU % | post-proc % | compute wait % |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             "| 1 request at a time | %.1f | %.2f / %.2f | %.3f / %.3f | - | - | - |" % (
                 b["output_tok_s"], 1e3 * b["ttft_s"]["p50"], 1e3 * b["ttft_s"]["p99"],
                 1e3 * b["itl_s"]["p50"], 1e3 * b["itl_s"]["p99"])]
    for r in res["sweep"] + [res["overlap"]]:
        itl = r["itl_s"] or {"p50": 0, "p99": 0}
        lines.append("| %d%s | %.1f | %.2f / %.2f | %.3f / %.3f | %.1f | %.1f | %.1f |" % (
            r["concurrency"], " (overlap)" if r.get("overlap") else "", r["output_tok_s"],
            1e3 * r["ttft_s"]["p50"], 1e3 * r["ttft_s"]["p99"], 1e3 * itl["p50"],
            1e3 * itl["p99"], 100 * r["scheduler_share"], 100 * r["postprocess_share"],
            100 * r["compute_wait_frac"]))
    on, off = res["prefix"]["on"], res["prefix"]["off"]
    lines += ["", "Prefix cache, %d shared tokens: wall %.3f s (on) vs %.3f s (off), x%.2f; "
              "TTFT p50 %.2f vs %.2f ms; %d hit tokens" % (
                  on["shared_prefix"], on["wall_s"], off["wall_s"], off["wall_s"] / on["wall_s"],
                  1e3 * on["ttft_s"]["p50"], 1e3 * off["ttft_s"]["p50"],
                  on["stats"]["prefix_cache_hit_tokens"]), "",
              "Roofline (bandwidth %.1f GB/s, matmul %.1f GFLOP/s; experts per MoE layer as the "
              "engine counted them where it did, else the uniform-routing estimate):" % (
                  res["machine"]["bandwidth_gbs"], res["machine"]["matmul_gflops"]), "",
              "| batch | experts/layer counted | (est.) | roofline tok/s | bound | measured tok/s | fraction |",
              "|---:|---:|---:|---:|---|---:|---:|"]
    for r in res["roofline"]:
        m = r["distinct_experts_per_layer_measured"]
        lines.append("| %d | %s | %.1f | %.1f | %s | %.1f | %.2f |" % (
            r["batch"], "%.1f" % m if m else "-", r["distinct_experts_per_layer_est"], r["tok_s"],
            r["bound"], r["measured_tok_s"], r["fraction_of_roofline"]))
    return "\n".join(lines) + "\n"


def plots(res, docs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install matplotlib): no plots", file=sys.stderr)
        return
    os.makedirs(docs, exist_ok=True)
    sw = res["sweep"]
    c = [r["concurrency"] for r in sw]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    ax[0].plot(c, [r["output_tok_s"] for r in sw], "o-", label="engine")
    ax[0].axhline(res["baseline"]["output_tok_s"], color="gray", ls="--", label="one at a time")
    ax[0].set(xscale="log", xlabel="concurrent requests", ylabel="output tokens/s",
              title="throughput")
    ax[0].legend()
    for key, name in (("ttft_s", "TTFT"), ("itl_s", "ITL")):
        for p, ls in (("p50", "-"), ("p99", ":")):
            ax[1].plot(c, [1e3 * (r[key] or {p: float("nan")})[p] for r in sw], "o" + ls,
                       label="%s %s" % (name, p))
    ax[1].set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="ms",
              title="latency")
    ax[1].legend()
    ax[2].plot(c, [100 * r["scheduler_share"] for r in sw], "o-", label="schedule")
    ax[2].plot(c, [100 * r["postprocess_share"] for r in sw], "o-", label="post-process")
    ax[2].set(xscale="log", xlabel="concurrent requests", ylabel="% of step time",
              title="engine CPU share")
    ax[2].legend()
    fig.suptitle("%s: prompt %d, output %d tokens" % (os.path.basename(res["model"].rstrip("/")),
                                                     res["prompt_len"], res["gen_len"]))
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "engine_throughput.png"), dpi=110)
    plt.close(fig)

    rl = res["roofline"]
    if rl:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        b = [r["batch"] for r in rl]
        ax.plot(b, [r["tok_s"] for r in rl], "k-", label="roofline max(mem, compute)")
        ax.plot(b, [r["batch"] / r["t_mem_s"] for r in rl], "b:", label="memory bound")
        ax.plot(b, [r["batch"] / r["t_compute_s"] for r in rl], "r:", label="compute bound")
        ax.plot(b, [r["measured_tok_s"] for r in rl], "o-", label="measured decode steps")
        ax.set(xscale="log", yscale="log", xlabel="decode batch size", ylabel="tokens/s",
               title="decode roofline (experts touched: %s)" % (
                   "as counted by the engine" if rl[0]["distinct_experts_per_layer_measured"]
                   else "uniform-routing estimate"))
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(docs, "engine_roofline.png"), dpi=110)
        plt.close(fig)

    on, off = res["prefix"]["on"], res["prefix"]["off"]
    fig, ax = plt.subplots(1, 2, figsize=(8, 3.6))
    ax[0].bar(["cache on", "cache off"], [on["wall_s"], off["wall_s"]], color=["C0", "C7"])
    ax[0].set(ylabel="wall s", title="%d requests, %d-token shared prefix" % (
        on["requests"], on["shared_prefix"]))
    ax[1].bar(["cache on", "cache off"], [1e3 * on["ttft_s"]["p50"], 1e3 * off["ttft_s"]["p50"]],
              color=["C0", "C7"])
    ax[1].set(ylabel="TTFT p50 ms", title="x%.2f faster" % (off["wall_s"] / on["wall_s"]))
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "engine_prefix_cache.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
