#!/usr/bin/env bash
# cpu_decode.sh -- CPU prefill and decode throughput of deepinfer, against the memory-bandwidth
# roofline of the same model and against llama.cpp's llama-bench on the same weights.
#
# Design stance: decode on a CPU is bound by reading the weights, so the first yardstick is
# the roofline B / bytes_per_token, where B is the read bandwidth that build/bench_matmul
# measures and bytes_per_token is computed from the checkpoint itself (config.json plus the
# safetensors header). The second yardstick is llama.cpp, run on a GGUF holding the same bf16
# weights (for example the pair written by make_random_v2lite.py). llama.cpp is never built
# or downloaded here: pass the path of a llama-bench you built yourself, or leave it out and
# that column is skipped.
#
# Matching the two engines:
#   prefill  deepinfer: one `generate` call with an N_PROMPT-token prompt, timing.prefill_tok_s.
#            llama-bench: -p N_PROMPT -n 0 (one batch of N_PROMPT tokens from an empty context).
#   decode   deepinfer: the N_GEN tokens generated after that prompt (--ignore-eos), so decode
#            runs at context depth N_PROMPT .. N_PROMPT+N_GEN; timing.decode_tok_s.
#            llama-bench: -p 0 -n N_GEN -d N_PROMPT, i.e. N_GEN single-token decodes after an
#            N_PROMPT-token context (llama-bench's plain tg runs from an empty context).
#   Both use THREADS threads, bf16 weights and the median of REPS timed runs (deepinfer gets
#   one untimed warm-up run; llama-bench does its own warm-up). Both prompts are random ids
#   of the same length; with random weights the content does not change the work.
#
# Usage: bench/cpu_decode.sh [--name value ...]   (each name is also read from the environment)
#   --deepinfer PATH     build/deepinfer                         (DEEPINFER)
#   --model-dir DIR      Hugging Face checkpoint folder, required (MODEL_DIR)
#   --gguf PATH          GGUF of the same weights, for llama.cpp  (GGUF)
#   --llama-bench PATH   an already-built llama-bench; optional   (LLAMA_BENCH)
#   --bench-matmul PATH  default: bench_matmul beside DEEPINFER   (BENCH_MATMUL)
#                        (its arguments: BENCH_MATMUL_ARGS, default "THREADS")
#   --bandwidth-gbs X    skip the measurement and use X GB/s      (BANDWIDTH_GBS)
#   --threads N          default: nproc                           (THREADS)
#   --n-prompt N         default 128                              (N_PROMPT)
#   --n-gen N            default 64                               (N_GEN)
#   --reps N             default 3                                (REPS)
#   --out-dir DIR        default bench/out (git-ignored)          (OUT_DIR)
# Writes OUT_DIR/cpu_decode.md (the table), OUT_DIR/cpu_decode.json (all numbers) and the raw
# outputs of every run under OUT_DIR/cpu_decode_raw/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)

# ---- arguments -------------------------------------------------------------------------------
while [ $# -gt 0 ]; do
    case "$1" in
        --deepinfer) DEEPINFER=${2-} ;;
        --model-dir) MODEL_DIR=${2-} ;;
        --gguf) GGUF=${2-} ;;
        --llama-bench) LLAMA_BENCH=${2-} ;;
        --bench-matmul) BENCH_MATMUL=${2-} ;;
        --bandwidth-gbs) BANDWIDTH_GBS=${2-} ;;
        --threads) THREADS=${2-} ;;
        --n-prompt) N_PROMPT=${2-} ;;
        --n-gen) N_GEN=${2-} ;;
        --reps) REPS=${2-} ;;
        --out-dir) OUT_DIR=${2-} ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "cpu_decode.sh: unknown argument \"$1\" (see --help)" >&2
            exit 2
            ;;
    esac
    [ $# -ge 2 ] || { echo "cpu_decode.sh: $1 needs a value" >&2; exit 2; }
    shift 2
done

DEEPINFER=${DEEPINFER:-$REPO/build/deepinfer}
MODEL_DIR=${MODEL_DIR:-}
GGUF=${GGUF:-}
LLAMA_BENCH=${LLAMA_BENCH:-}
BENCH_MATMUL=${BENCH_MATMUL:-$(dirname "$DEEPINFER")/bench_matmul}
BANDWIDTH_GBS=${BANDWIDTH_GBS:-}
THREADS=${THREADS:-$(nproc)}
N_PROMPT=${N_PROMPT:-128}
N_GEN=${N_GEN:-64}
REPS=${REPS:-3}
OUT_DIR=${OUT_DIR:-$REPO/bench/out}
RAW=$OUT_DIR/cpu_decode_raw

die() { echo "cpu_decode.sh: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

[ -n "$MODEL_DIR" ] || die "no checkpoint: pass --model-dir DIR (or set MODEL_DIR)"
[ -f "$MODEL_DIR/config.json" ] || die "$MODEL_DIR/config.json: not found"
[ -x "$DEEPINFER" ] || die "$DEEPINFER: not an executable (build it, or pass --deepinfer PATH)"
for v in THREADS N_PROMPT N_GEN REPS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got \"${!v}\""
done
command -v python3 > /dev/null || die "python3 is needed to read JSON"
rm -rf "$RAW"
mkdir -p "$RAW"

# ---- (a) measured read bandwidth (lib_bandwidth.sh) -------------------------------------------
source "$(dirname "${BASH_SOURCE[0]}")/lib_bandwidth.sh"

BW_SOURCE="BANDWIDTH_GBS"
if [ -z "$BANDWIDTH_GBS" ]; then
    if [ -x "$BENCH_MATMUL" ]; then
        BANDWIDTH_GBS=$(measure_bandwidth)
        BW_SOURCE="$(basename "$BENCH_MATMUL")"
    else
        note "$BENCH_MATMUL not found: no roofline (pass --bandwidth-gbs to give one)"
        BANDWIDTH_GBS=0
        BW_SOURCE="none"
    fi
fi

# ---- (b) bytes read per decoded token, from config.json and the safetensors header ------------
python3 "$REPO/bench/bytes_per_token.py" "$MODEL_DIR" > "$RAW/bytes_per_token.json"
BYTES_PER_TOKEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes_per_token"])' "$RAW/bytes_per_token.json")
note "bytes per decoded token: $BYTES_PER_TOKEN"

# ---- (c) deepinfer generate -------------------------------------------------------------------
PROMPT_IDS=$(python3 - "$MODEL_DIR/config.json" "$N_PROMPT" << 'PY'
import json, random, sys
V = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(20240601)
# Ordinary (non-special) token ids: DeepSeek tokenizers keep specials at the ends of the range.
lo, hi = min(1000, V // 4), min(100000, V - 1)
print(" ".join(str(r.randrange(lo, hi)) for _ in range(int(sys.argv[2]))))
PY
)
GEN_HELP=$("$DEEPINFER" generate -h 2>&1 || true)
GEN_ARGS=(generate --model "$MODEL_DIR" --ids "$PROMPT_IDS" --max-tokens "$N_GEN" --temperature 0
    --format json)
if grep -q -- "--ignore-eos" <<< "$GEN_HELP"; then
    GEN_ARGS+=(--ignore-eos)
else
    note "deepinfer generate has no --ignore-eos: runs that stop early are reported"
fi
if grep -q -- "--threads" <<< "$GEN_HELP"; then GEN_ARGS+=(--threads "$THREADS"); fi

for i in $(seq 0 "$REPS"); do
    tag=$([ "$i" -eq 0 ] && echo "warm-up" || echo "run $i/$REPS")
    note "deepinfer generate ($tag): $N_PROMPT prompt tokens, $N_GEN new tokens, $THREADS threads"
    "$DEEPINFER" "${GEN_ARGS[@]}" > "$RAW/deepinfer_$i.json" 2> "$RAW/deepinfer_$i.err" ||
        die "deepinfer generate failed (exit $?): $(tail -n 5 "$RAW/deepinfer_$i.err")"
done

# ---- (d) llama-bench ----------------------------------------------------------------------------
LLAMA_OK=0
if [ -n "$LLAMA_BENCH" ] && [ -x "$LLAMA_BENCH" ] && [ -n "$GGUF" ] && [ -f "$GGUF" ]; then
    common=(-m "$GGUF" -t "$THREADS" -r "$REPS" -o json)
    note "llama-bench prefill: -p $N_PROMPT -n 0"
    "$LLAMA_BENCH" "${common[@]}" -p "$N_PROMPT" -n 0 > "$RAW/llama_pp.json" 2> "$RAW/llama_pp.err" ||
        die "llama-bench failed: $(tail -n 5 "$RAW/llama_pp.err")"
    note "llama-bench decode: -p 0 -n $N_GEN -d $N_PROMPT"
    "$LLAMA_BENCH" "${common[@]}" -p 0 -n "$N_GEN" -d "$N_PROMPT" > "$RAW/llama_tg.json" \
        2> "$RAW/llama_tg.err" || die "llama-bench failed: $(tail -n 5 "$RAW/llama_tg.err")"
    LLAMA_OK=1
else
    note "llama.cpp skipped (needs LLAMA_BENCH, an executable, and GGUF, a file)"
fi

# ---- (e) the table ------------------------------------------------------------------------------
python3 - "$RAW" "$OUT_DIR" "$REPS" "$N_PROMPT" "$N_GEN" "$THREADS" "$BANDWIDTH_GBS" "$BW_SOURCE" \
    "$LLAMA_OK" "$MODEL_DIR" "${GGUF:-}" << 'PY'
import json, os, platform, re, statistics, sys, time
raw, out, reps, n_prompt, n_gen, threads, bw, bw_src, llama_ok, model_dir, gguf = sys.argv[1:]
reps, n_prompt, n_gen, threads, bw, llama_ok = int(reps), int(n_prompt), int(n_gen), int(threads), float(bw), llama_ok == "1"
bpt = json.load(open(os.path.join(raw, "bytes_per_token.json")))
roof = bw * 1e9 / bpt["bytes_per_token"] if bw > 0 else None

runs, warn = [], []
for i in range(1, reps + 1):
    j = json.load(open(os.path.join(raw, f"deepinfer_{i}.json")))
    t, u = j["timing"], j.get("usage", {})
    gen = u.get("completion_tokens", len(j.get("ids", [])))
    if gen != n_gen:
        warn.append(f"deepinfer run {i} generated {gen} tokens, not {n_gen} (finish_reason {j.get('finish_reason')})")
    runs.append((t["prefill_tok_s"], t["decode_tok_s"]))
di_pp = statistics.median(r[0] for r in runs)
di_tg = statistics.median(r[1] for r in runs)

def llama(path):
    rows = json.load(open(path))
    r = rows[0]
    return statistics.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"], r

lc_pp = lc_tg = None
lc_info = {}
if llama_ok:
    lc_pp, rp = llama(os.path.join(raw, "llama_pp.json"))
    lc_tg, rt = llama(os.path.join(raw, "llama_tg.json"))
    lc_info = {k: rt.get(k) for k in ("build_commit", "cpu_info", "model_type", "model_size",
                                      "flash_attn", "n_batch", "n_ubatch", "type_k", "type_v")}
    lc_info["flash_attn"] = {-1: "auto", 0: "off", 1: "on"}.get(lc_info["flash_attn"], lc_info["flash_attn"])

def f(x, d=2):
    return "n/a" if x is None else f"{x:.{d}f}"

def ratio(a, b):
    return "n/a" if not a or not b else f"{a / b:.2f}"

def pct(x):
    return "n/a" if x is None or roof is None else f"{100 * x / roof:.0f}%"

gb = bpt["bytes_per_token"] / 1e9
L = []
L.append(f"### CPU decode: deepinfer vs. roofline and llama.cpp ({time.strftime('%Y-%m-%d %H:%M')})")
L.append("")
L.append(f"- model: `{os.path.basename(os.path.normpath(model_dir))}` ({bpt['layers']} layers, "
         f"{bpt['moe_layers']} MoE), bf16; llama.cpp on `{os.path.basename(gguf) or 'n/a'}`")
cpu = platform.machine()
try:
    cpu = re.search(r"^model name\s*:\s*(.*)$", open("/proc/cpuinfo").read(), re.M).group(1)
except (OSError, AttributeError):
    pass
L.append(f"- machine: {lc_info.get('cpu_info') or cpu}, "
         f"{os.cpu_count()} logical CPUs; {threads} threads for both engines")
L.append(f"- measured read bandwidth B = {f(bw if bw > 0 else None, 1)} GB/s ({bw_src}); "
         f"bytes per decoded token = {gb:.3f} GB; roofline = B / bytes = {f(roof)} tok/s")
L.append(f"- prompt {n_prompt} random ids; decode = {n_gen} tokens at context {n_prompt}..{n_prompt + n_gen} "
         f"(llama-bench `-p 0 -n {n_gen} -d {n_prompt}`); prefill = {n_prompt} tokens from an empty "
         f"context (llama-bench `-p {n_prompt} -n 0`); median of {reps} runs")
if lc_info:
    L.append(f"- llama.cpp build {lc_info.get('build_commit')}, flash_attn={lc_info.get('flash_attn')}, "
             f"n_batch={lc_info.get('n_batch')}, n_ubatch={lc_info.get('n_ubatch')}, "
             f"KV {lc_info.get('type_k')}/{lc_info.get('type_v')}")
L.append("")
L.append("| | deepinfer | llama.cpp | deepinfer / llama.cpp |")
L.append("|---|---:|---:|---:|")
L.append(f"| decode tok/s | {f(di_tg)} | {f(lc_tg)} | {ratio(di_tg, lc_tg)} |")
L.append(f"| decode, % of roofline ({f(roof)} tok/s) | {pct(di_tg)} | {pct(lc_tg)} | |")
L.append(f"| prefill tok/s ({n_prompt} tokens) | {f(di_pp, 1)} | {f(lc_pp, 1)} | {ratio(di_pp, lc_pp)} |")
L.append("")
L.append("Runs (tok/s, decode / prefill): deepinfer " +
         ", ".join(f"{d:.2f} / {p:.1f}" for p, d in runs) +
         ("; llama.cpp " + ", ".join(f"{x:.2f}" for x in rt.get("samples_ts", [])) + " / " +
          ", ".join(f"{x:.1f}" for x in rp.get("samples_ts", [])) if llama_ok else "") + ".")
L.append("")
L.append("bytes per token: " + bpt["formula"] + ". Parts (MB): " +
         ", ".join(f"{k} {v / 1e6:.1f}" for k, v in bpt["parts"].items()) + ".")
for w in warn:
    L.append("")
    L.append("WARNING: " + w)
md = "\n".join(L) + "\n"
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "cpu_decode.md"), "w").write(md)
json.dump({"deepinfer": {"decode_tok_s": di_tg, "prefill_tok_s": di_pp, "runs": runs},
           "llama_cpp": {"decode_tok_s": lc_tg, "prefill_tok_s": lc_pp, **lc_info},
           "bandwidth_gbs": bw, "bandwidth_source": bw_src, "roofline_tok_s": roof,
           "bytes_per_token": bpt, "n_prompt": n_prompt, "n_gen": n_gen, "threads": threads,
           "reps": reps, "warnings": warn},
          open(os.path.join(out, "cpu_decode.json"), "w"), indent=1)
sys.stdout.write(md)
PY
note "wrote $OUT_DIR/cpu_decode.md"
