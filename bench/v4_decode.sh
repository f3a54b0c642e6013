#!/usr/bin/env bash
# v4_decode.sh -- CPU decode (batch 1) and prefill throughput of deepinfer on a shape-faithful
# DeepSeek-V4-Flash slice (bench/make_v4_flash_slice.py), against the memory-bandwidth
# roofline of that slice, plus the state (KV cache) bytes per token of context that the
# engine reports, against the spec's figure (6,880 B/token + 5.4 MiB fixed for Flash at bf16).
#
# Design stance (as bench/cpu_decode.sh): decode on a CPU is bound by reading the weights, so
# the yardstick is the roofline B / bytes_per_token, where B is the read bandwidth that
# build/bench_matmul measures and bytes_per_token is computed from the checkpoint itself
# (config.json plus the safetensors headers):
#   every layer: all attention tensors (wq_a, wq_b, wkv, wo_a, wo_b + their E8M0 block scales,
#     norms, attn_sink, and for CSA/HCA layers the compressor, for CSA the indexer), the hc_*
#     mixing params, the router (gate.weight + bias, or one tid2eid row on hash layers), the
#     shared expert, and num_experts_per_tok (6) routed experts -- FP4 bytes + E8M0 scales;
#     hash layers read the same count (tid2eid picks 6);
#   once: head.weight, final norm, hc_head_*, one embedding row;
#   state reads at the benchmark's context depth, averaged over the decoded positions t:
#     every layer its window min(t+1, 128) rows of head_dim floats; CSA the indexer keys of
#     all (t+1)/4 entries plus min(index_topk, (t+1)/4) main entries; HCA its (t+1)/128
#     entries. The engine keeps state in float32 (4 B per value).
# Two byte counts are shown: "as stored" (the checkpoint's dtypes) and "as the engine holds
# it": the engine converts the FP8 weights' E8M0 block scales and 1-D norms to float32 at
# load (src/model/deepseek_v4_weights.c); the FP4 experts' per-32-column E8M0 scales are read
# as stored by the kernels. The roofline % uses the engine figure.
#
# Timings: one `deepinfer generate` per repetition with an N_PROMPT-token prompt of random
# ids and N_GEN new tokens (--ignore-eos, greedy): timing.prefill_tok_s and decode_tok_s
# (decode runs at context depth N_PROMPT .. N_PROMPT+N_GEN). One untimed warm-up run (it also
# pulls the slice into the page cache), then the median of REPS runs.
#
# State: `deepinfer info --format json` gives the engine's kv_bytes_per_token and
# kv_fixed_bytes, and per layer type ("kv_by_layer_type"). A slice of 2 layers has only
# sliding layers: pass --state-model-dir with a slice of >= 4 layers (CSA + HCA) to measure
# those too (only `info` runs on it: a second or two, no weights are read but the scales).
# The per-type figures are scaled to the full model (2 sliding + 21 CSA + 20 HCA) and shown
# in float32 (what the engine allocates) and at bf16 (/2), next to the spec's formula.
#
# Usage: bench/v4_decode.sh [--name value ...]   (each name is also read from the environment)
#   --deepinfer PATH        build/deepinfer                               (DEEPINFER)
#   --model-dir DIR         default /work/peers/v4flash-slice             (MODEL_DIR)
#   --state-model-dir DIR   slice with CSA+HCA layers for `info`; optional (STATE_MODEL_DIR)
#   --bench-matmul PATH     default: bench_matmul beside DEEPINFER        (BENCH_MATMUL)
#   --bandwidth-gbs X       skip the measurement and use X GB/s           (BANDWIDTH_GBS)
#   --device D              cpu (default) or cuda[:N]                     (DEVICE)
#                           on cuda the bandwidth is the device copy bandwidth that
#                           bench_cuda_matmul beside DEEPINFER measures (bytes read + written)
#   --threads N             default: nproc                                (THREADS)
#   --n-prompt N            default 128                                   (N_PROMPT)
#   --n-gen N               default 64                                    (N_GEN)
#   --reps N                default 3                                     (REPS)
#   --out-dir DIR           default bench/out (git-ignored)               (OUT_DIR)
# Writes OUT_DIR/v4_decode.md (the table), OUT_DIR/v4_decode.json (all numbers) and the raw
# outputs of every run under OUT_DIR/v4_decode_raw/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)

while [ $# -gt 0 ]; do
    case "$1" in
        --deepinfer) DEEPINFER=$2 ;;
        --model-dir) MODEL_DIR=$2 ;;
        --state-model-dir) STATE_MODEL_DIR=$2 ;;
        --bench-matmul) BENCH_MATMUL=$2 ;;
        --bandwidth-gbs) BANDWIDTH_GBS=$2 ;;
        --device) DEVICE=$2 ;;
        --threads) THREADS=$2 ;;
        --n-prompt) N_PROMPT=$2 ;;
        --n-gen) N_GEN=$2 ;;
        --reps) REPS=$2 ;;
        --out-dir) OUT_DIR=$2 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "v4_decode.sh: unknown argument \"$1\" (see --help)" >&2
            exit 2
            ;;
    esac
    [ $# -ge 2 ] || { echo "v4_decode.sh: $1 needs a value" >&2; exit 2; }
    shift 2
done

DEEPINFER=${DEEPINFER:-$REPO/build/deepinfer}
MODEL_DIR=${MODEL_DIR:-/work/peers/v4flash-slice}
STATE_MODEL_DIR=${STATE_MODEL_DIR:-}
BENCH_MATMUL=${BENCH_MATMUL:-$(dirname "$DEEPINFER")/bench_matmul}
BANDWIDTH_GBS=${BANDWIDTH_GBS:-}
DEVICE=${DEVICE:-cpu}
THREADS=${THREADS:-$(nproc)}
N_PROMPT=${N_PROMPT:-128}
N_GEN=${N_GEN:-64}
REPS=${REPS:-3}
OUT_DIR=${OUT_DIR:-$REPO/bench/out}
RAW=$OUT_DIR/v4_decode_raw

die() { echo "v4_decode.sh: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

[ -f "$MODEL_DIR/config.json" ] || die "$MODEL_DIR/config.json: not found (write it with bench/make_v4_flash_slice.py)"
[ -z "$STATE_MODEL_DIR" ] || [ -f "$STATE_MODEL_DIR/config.json" ] || die "$STATE_MODEL_DIR/config.json: not found"
[ -x "$DEEPINFER" ] || die "$DEEPINFER: not an executable (build it, or pass --deepinfer PATH)"
for v in THREADS N_PROMPT N_GEN REPS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got \"${!v}\""
done
command -v python3 > /dev/null || die "python3 is needed to read JSON"
rm -rf "$RAW"
mkdir -p "$RAW"

# ---- (a) measured read bandwidth (as cpu_decode.sh) -------------------------------------------
source "$(dirname "${BASH_SOURCE[0]}")/lib_bandwidth.sh"

BW_SOURCE="BANDWIDTH_GBS"
BENCH_CUDA=$(dirname "$DEEPINFER")/bench_cuda_matmul
if [ -z "$BANDWIDTH_GBS" ] && [ "${DEVICE%%:*}" = cuda ]; then
    # The device's copy bandwidth: bench_cuda_matmul's first figure (`copy`: nothing else).
    [ -x "$BENCH_CUDA" ] || die "$BENCH_CUDA: not found (build it, or pass --bandwidth-gbs)"
    dev_index=0
    [ "$DEVICE" = cuda ] || dev_index=${DEVICE#cuda:}
    BANDWIDTH_GBS=$("$BENCH_CUDA" "$dev_index" copy 1 2>/dev/null |
        sed -n 's/^device copy bandwidth: \([0-9.]*\) GB\/s.*/\1/p')
    [ -n "$BANDWIDTH_GBS" ] || die "$BENCH_CUDA printed no copy bandwidth"
    BW_SOURCE="$(basename "$BENCH_CUDA") (device copy)"
elif [ -z "$BANDWIDTH_GBS" ]; then
    if [ -x "$BENCH_MATMUL" ]; then
        BANDWIDTH_GBS=$(measure_bandwidth)
        BW_SOURCE="$(basename "$BENCH_MATMUL")"
    else
        note "$BENCH_MATMUL not found: no roofline (pass --bandwidth-gbs to give one)"
        BANDWIDTH_GBS=0
        BW_SOURCE="none"
    fi
fi
note "read bandwidth: $BANDWIDTH_GBS GB/s ($BW_SOURCE)"

# ---- (b) bytes read per decoded token, from config.json and the safetensors headers -----------
# Also the per-layer bytes by (attention type, router type), for the full-model line.
BYTES_PY=$(cat << 'PY'
import json, os, re, sys
d, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, sys.argv[4])  # bench/: the safetensors headers' reader
from bytes_per_token import tensors
cfg = json.load(open(os.path.join(d, "config.json")))
L, V, D = cfg["num_hidden_layers"], cfg["vocab_size"], cfg["hidden_size"]
K = cfg["num_experts_per_tok"]
E = cfg["n_routed_experts"]
ratios = cfg["compress_ratios"][:L]
n_hash = cfg.get("num_hash_layers", 0)
W, hd, dI, topk = cfg["sliding_window"], cfg["head_dim"], cfg["index_head_dim"], cfg["index_topk"]
stored, engine = {}, {}
for name, t in tensors(d).items():
    b = t["data_offsets"][1] - t["data_offsets"][0]
    stored[name] = b
    # the engine's own copy: FP8 blocks' E8M0 scales -> f32 (x4; FP4 experts' per-32
    # scales are read as stored); 1-D bf16 norms -> f32 (x2)
    if t["dtype"] == "F8_E8M0" and ".experts." not in name:
        engine[name] = 4 * b
    elif t["dtype"] in ("BF16", "F16") and len(t["shape"]) == 1:
        engine[name] = 2 * b
    else:
        engine[name] = b
kind_name = {0: "sliding", 4: "csa", 128: "hca"}
lay = re.compile(r"^(?:model\.)?layers\.(\d+)\.(.*)$")
exp = re.compile(r"^ffn\.experts\.(\d+)\.")
def count(size):
    parts = {"attention": 0, "hc": 0, "router": 0, "shared_expert": 0, "routed_topk": 0,
             "head+final_norm+hc_head": 0, "embedding_row": 0}
    per_layer = [dict(attention=0, hc=0, router=0, shared_expert=0, routed_topk=0) for _ in range(L)]
    experts = [dict() for _ in range(L)]
    for name, b in size.items():
        m = lay.match(name)
        if not m:
            if name.startswith("mtp."):
                continue                       # MTP: not run by forward
            if name in ("embed.weight", "model.embed_tokens.weight"):
                parts["embedding_row"] += b // V
            else:                               # head.weight, norm.weight, hc_head_*
                parts["head+final_norm+hc_head"] += b
            continue
        i, rest = int(m.group(1)), m.group(2)
        if i >= L:
            continue
        e = exp.match(rest)
        if e:
            experts[i][int(e.group(1))] = experts[i].get(int(e.group(1)), 0) + b
        elif rest.startswith("hc_"):
            per_layer[i]["hc"] += b
        elif rest.startswith("ffn.shared_experts."):
            per_layer[i]["shared_expert"] += b
        elif rest == "ffn.gate.tid2eid":
            per_layer[i]["router"] += b // V    # one row: K expert ids
        elif rest.startswith("ffn.gate."):
            per_layer[i]["router"] += b
        else:                                   # attn.*, attn_norm, ffn_norm
            per_layer[i]["attention"] += b
    for i in range(L):
        if experts[i]:
            per_layer[i]["routed_topk"] = K * sum(experts[i].values()) // len(experts[i])
        for k, v in per_layer[i].items():
            parts[k] += v
    return parts, per_layer
parts_s, layers_s = count(stored)
parts_e, layers_e = count(engine)
# state reads per decoded token (engine: f32), averaged over the decoded positions
pos = range(n_prompt, n_prompt + n_gen)
state = 0.0
for t in pos:
    for r in ratios:
        rows = min(t + 1, W) * hd
        if r == 4:
            ne = (t + 1) // 4
            rows += ne * dI + min(topk, ne) * hd
        elif r == 128:
            rows += (t + 1) // 128 * hd
        state += 4 * rows
state /= n_gen
layer_kinds = [kind_name[r] + ("+hash" if i < n_hash else "") for i, r in enumerate(ratios)]
by_type = {}
for i, k in enumerate(layer_kinds):
    by_type.setdefault(k, {"stored": sum(layers_s[i].values()), "engine": sum(layers_e[i].values())})
print(json.dumps({
    "layers": L, "layer_kinds": layer_kinds, "experts": E, "top_k": K,
    "weights_stored": sum(parts_s.values()), "weights_engine": sum(parts_e.values()),
    "state_reads_f32": int(state), "parts_stored": parts_s, "parts_engine": parts_e,
    "per_layer_by_kind": by_type, "file_bytes": sum(stored.values()),
    "context": [n_prompt, n_prompt + n_gen]}))
PY
)
python3 -c "$BYTES_PY" "$MODEL_DIR" "$N_PROMPT" "$N_GEN" "$REPO/bench" > "$RAW/bytes_per_token.json"
if [ -n "$STATE_MODEL_DIR" ]; then
    python3 -c "$BYTES_PY" "$STATE_MODEL_DIR" "$N_PROMPT" "$N_GEN" "$REPO/bench" \
        > "$RAW/bytes_per_token_state_model.json"
fi
note "bytes per decoded token: $(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["weights_engine"] + j["state_reads_f32"])' "$RAW/bytes_per_token.json")"

# ---- (c) deepinfer info: state bytes -------------------------------------------------------------
note "deepinfer info --model $MODEL_DIR"
"$DEEPINFER" info --model "$MODEL_DIR" --format json > "$RAW/info.json" 2> "$RAW/info.err" ||
    die "deepinfer info failed: $(tail -n 5 "$RAW/info.err")"
if [ -n "$STATE_MODEL_DIR" ]; then
    note "deepinfer info --model $STATE_MODEL_DIR"
    "$DEEPINFER" info --model "$STATE_MODEL_DIR" --format json > "$RAW/info_state_model.json" \
        2> "$RAW/info_state_model.err" || die "deepinfer info failed: $(tail -n 5 "$RAW/info_state_model.err")"
fi

# ---- (d) deepinfer generate --------------------------------------------------------------------
PROMPT_IDS=$(python3 - "$MODEL_DIR/config.json" "$N_PROMPT" << 'PY'
import json, random, sys
V = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(20240601)
lo, hi = min(1000, V // 4), min(100000, V - 1)
print(" ".join(str(r.randrange(lo, hi)) for _ in range(int(sys.argv[2]))))
PY
)
GEN_ARGS=(generate --model "$MODEL_DIR" --ids "$PROMPT_IDS" --max-tokens "$N_GEN" --temperature 0
    --ignore-eos --format json --threads "$THREADS" --device "$DEVICE")
TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -v)   # peak RSS, when GNU time is there
for i in $(seq 0 "$REPS"); do
    tag=$([ "$i" -eq 0 ] && echo "warm-up" || echo "run $i/$REPS")
    note "deepinfer generate ($tag, $DEVICE): $N_PROMPT prompt tokens, $N_GEN new tokens, $THREADS threads"
    "${TIME[@]}" "$DEEPINFER" "${GEN_ARGS[@]}" > "$RAW/deepinfer_$i.json" 2> "$RAW/deepinfer_$i.err" ||
        die "deepinfer generate failed (exit $?): $(tail -n 5 "$RAW/deepinfer_$i.err")"
done

# ---- (e) the table -------------------------------------------------------------------------------
python3 - "$RAW" "$OUT_DIR" "$REPS" "$N_PROMPT" "$N_GEN" "$THREADS" "$BANDWIDTH_GBS" "$BW_SOURCE" \
    "$MODEL_DIR" "${STATE_MODEL_DIR:-}" "$DEVICE" << 'PY'
import json, os, platform, re, statistics, sys, time
raw, out, reps, n_prompt, n_gen, threads, bw, bw_src, model_dir, state_dir, device = sys.argv[1:]
reps, n_prompt, n_gen, threads, bw = int(reps), int(n_prompt), int(n_gen), int(threads), float(bw)
bpt = json.load(open(os.path.join(raw, "bytes_per_token.json")))
info = json.load(open(os.path.join(raw, "info.json")))
sinfo = json.load(open(os.path.join(raw, "info_state_model.json"))) if state_dir else None
sbpt = json.load(open(os.path.join(raw, "bytes_per_token_state_model.json"))) if state_dir else None

per_tok_engine = bpt["weights_engine"] + bpt["state_reads_f32"]
per_tok_stored = bpt["weights_stored"] + bpt["state_reads_f32"]
roof = bw * 1e9 / per_tok_engine if bw > 0 else None
roof_stored = bw * 1e9 / per_tok_stored if bw > 0 else None

runs, warn, rss = [], [], []
for i in range(1, reps + 1):
    j = json.load(open(os.path.join(raw, f"deepinfer_{i}.json")))
    t, u = j["timing"], j.get("usage", {})
    gen = u.get("completion_tokens", len(j.get("ids", [])))
    if gen != n_gen:
        warn.append(f"run {i} generated {gen} tokens, not {n_gen} (finish_reason {j.get('finish_reason')})")
    runs.append((t["prefill_tok_s"], t["decode_tok_s"]))
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(os.path.join(raw, f"deepinfer_{i}.err")).read())
    if m:
        rss.append(int(m.group(1)) * 1024)
pp = statistics.median(r[0] for r in runs)
tg = statistics.median(r[1] for r in runs)

# ---- state by layer type: parse "sliding x2: 512.0 KiB fixed, 0.0 B/token; csa x1: ..." ----
def by_type(s):
    d = {}
    for part in s.split(";"):
        m = re.match(r"\s*(\w+) x(\d+): ([0-9.]+) KiB fixed, ([0-9.]+) B/token", part)
        if m:
            n = int(m.group(2))
            d[m.group(1)] = {"count": n, "fixed_per_layer": float(m.group(3)) * 1024 / n,
                             "per_token_per_layer": float(m.group(4)) / n}
    return d
types = by_type(info["kv_by_layer_type"])
src = {k: "bench slice" for k in types}
if sinfo:
    for k, v in by_type(sinfo["kv_by_layer_type"]).items():
        if k not in types:
            types[k] = v
            src[k] = "state slice"
FULL = {"sliding": 2, "csa": 21, "hca": 20}           # V4-Flash, 43 layers (MTP not counted)
SPEC = {"sliding": (0, 128 * 1024), "csa": (320, 128 * 1024), "hca": (8, 128 * 1024)}  # bf16, spec sec. 4
full_tok = sum(FULL[k] * types[k]["per_token_per_layer"] for k in FULL if k in types)
full_fix = sum(FULL[k] * types[k]["fixed_per_layer"] for k in FULL if k in types)
full_ok = all(k in types for k in FULL)
spec_tok = sum(FULL[k] * SPEC[k][0] for k in FULL)
spec_fix = sum(FULL[k] * SPEC[k][1] for k in FULL)
W, hd = 128, 512
win_f32 = 43 * W * hd * 4

def f(x, d=2):
    return "n/a" if x is None else f"{x:.{d}f}"
def pct(x, r):
    return "n/a" if x is None or not r else f"{100 * x / r:.0f}%"
MiB = 1024 * 1024

cpu = platform.machine()
try:
    cpu = re.search(r"^model name\s*:\s*(.*)$", open("/proc/cpuinfo").read(), re.M).group(1)
except (OSError, AttributeError):
    pass
kinds = bpt["layer_kinds"]
L = []
where = "the CPU" if device == "cpu" else f"{device} (GPU)"
L.append(f"### DeepSeek-V4-Flash slice on {where}: decode / prefill vs. roofline, state bytes ({time.strftime('%Y-%m-%d %H:%M')})")
L.append("")
L.append(f"- model: `{model_dir}`: {bpt['layers']} of 43 V4-Flash layers ({', '.join(kinds)}), real dimensions, "
         f"random weights in the published dtypes ({info['dtypes']}); {bpt['file_bytes'] / 1e9:.2f} GB of tensors, "
         f"{info['n_params_total'] / 1e9:.2f} B params, {info['n_params_active'] / 1e9:.2f} B active")
L.append(f"- machine: {cpu}, {os.cpu_count()} logical CPUs, {threads} threads; device {device}; "
         f"measured bandwidth B = {f(bw if bw > 0 else None, 1)} GB/s ({bw_src})")
L.append(f"- prompt {n_prompt} random ids; decode = {n_gen} tokens at context {n_prompt}..{n_prompt + n_gen}; "
         f"median of {reps} runs after one warm-up" + (f"; peak RSS {max(rss) / 1e9:.1f} GB" if rss else ""))
L.append("")
L.append("| bytes read per decoded token | as stored | as the engine holds it |")
L.append("|---|---:|---:|")
ps, pe = bpt["parts_stored"], bpt["parts_engine"]
for k in ps:
    L.append(f"| {k.replace('_', ' ')} | {ps[k] / MiB:.1f} MiB | {pe[k] / MiB:.1f} MiB |")
L.append(f"| state reads (f32, mean over the decoded positions) | {bpt['state_reads_f32'] / MiB:.1f} MiB | {bpt['state_reads_f32'] / MiB:.1f} MiB |")
L.append(f"| **total** | **{per_tok_stored / MiB:.1f} MiB** | **{per_tok_engine / MiB:.1f} MiB** |")
L.append(f"| roofline B / bytes | {f(roof_stored)} tok/s | {f(roof)} tok/s |")
L.append("")
L.append("| deepinfer | tok/s (median) | runs | % of roofline (engine bytes) |")
L.append("|---|---:|---|---:|")
L.append(f"| decode, batch 1 | {f(tg)} | {', '.join(f(r[1]) for r in runs)} | {pct(tg, roof)} |")
L.append(f"| prefill ({n_prompt} tokens) | {f(pp)} | {', '.join(f(r[0]) for r in runs)} | n/a (compute-bound) |")
L.append("")
L.append("| state per sequence (engine, float32) | layers in slice | fixed per layer | growth per layer | source |")
L.append("|---|---:|---:|---:|---|")
for k in ("sliding", "csa", "hca"):
    if k in types:
        t = types[k]
        L.append(f"| {k} | {t['count']} | {t['fixed_per_layer'] / 1024:.1f} KiB | {t['per_token_per_layer']:.1f} B/token | {src[k]} |")
    else:
        L.append(f"| {k} | 0 | not measured | not measured | (pass --state-model-dir) |")
L.append(f"| this slice (deepinfer info) | {info['n_layers']} | {info['kv_fixed_bytes'] / MiB:.2f} MiB total | {info['kv_bytes_per_token']} B/token total | bench slice |")
L.append("")
L.append("| full V4-Flash (2 sliding + 21 CSA + 20 HCA) | per token of context | fixed per sequence |")
L.append("|---|---:|---:|")
if full_ok:
    L.append(f"| engine, float32 (measured per type x count) | {full_tok:.0f} B | {full_fix / MiB:.2f} MiB (window rings {win_f32 / MiB:.2f} MiB + compressor state {(full_fix - win_f32) / MiB:.2f} MiB) |")
    L.append(f"| engine at bf16 (/2) | {full_tok / 2:.0f} B | {full_fix / 2 / MiB:.2f} MiB (window rings {win_f32 / 2 / MiB:.2f} MiB) |")
else:
    L.append("| engine | n/a (slice lacks a layer type; pass --state-model-dir) | n/a |")
L.append(f"| spec (sec. 4, bf16: 21 x 320 + 20 x 8; 43 x 128 KiB windows) | {spec_tok} B | {spec_fix / MiB:.2f} MiB (+ compressor states, not in the figure) |")
if full_ok:
    pk = dict(bpt["per_layer_by_kind"])
    if sbpt:
        pk.update({k: v for k, v in sbpt["per_layer_by_kind"].items() if k not in pk})
    need = {"sliding+hash": 2, "csa+hash": 1, "csa": 20, "hca": 20}
    approx = "csa" not in pk and "csa+hash" in pk
    if approx:   # the first non-hash CSA layer is layer 4: same tensors but gate.bias for one tid2eid row
        pk["csa"] = pk["csa+hash"]
    if all(k in pk for k in need):
        g = (bpt["weights_engine"] - sum(pk[k]["engine"] * c for k, c in
             {kk: kinds.count(kk) for kk in set(kinds)}.items()))
        full_w = g + sum(pk[k]["engine"] * c for k, c in need.items())
        L.append("")
        L.append(f"- full 43-layer Flash by the same count (engine bytes, weights only): {full_w / 1e9:.2f} GB per decoded token "
                 f"-> weight roofline {f(bw * 1e9 / full_w if bw > 0 else None)} tok/s at B"
                 + (" (non-hash CSA layers sized as the hash CSA layer 2)" if approx else ""))
for w in warn:
    L.append(f"- warning: {w}")
L.append("")
text = "\n".join(L) + "\n"
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "v4_decode.md"), "w").write(text)
json.dump({"bandwidth_gbs": bw, "bandwidth_source": bw_src, "bytes": bpt, "roofline_tok_s": roof,
           "roofline_stored_tok_s": roof_stored, "decode_tok_s": tg, "prefill_tok_s": pp, "runs": runs,
           "peak_rss_bytes": rss, "info": info, "info_state_model": sinfo, "state_by_type": types,
           "full_model_state": {"engine_f32_per_token": full_tok, "engine_f32_fixed": full_fix,
                                "spec_bf16_per_token": spec_tok, "spec_bf16_fixed": spec_fix} if full_ok else None,
           "n_prompt": n_prompt, "n_gen": n_gen, "threads": threads, "reps": reps, "device": device,
           "warnings": warn},
          open(os.path.join(out, "v4_decode.json"), "w"), indent=1)
sys.stdout.write(text)
PY
