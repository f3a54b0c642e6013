#!/usr/bin/env bash
# gpu_vs_llamacpp.sh -- deepinfer on CUDA against llama.cpp's CUDA build on the same bf16
# weights and the same GPU, in one run: batch-1 decode and prefill (as a share of the copy-
# bandwidth roofline too), and decode at C concurrent sequences.
#
# Design stance: llama.cpp is never built or downloaded here. Pass the llama-bench and
# llama-batched-bench you built yourself (a CUDA build: -DGGML_CUDA=ON), and a GGUF holding the
# weights of the Hugging Face folder (for example the pair that make_random_v2lite.py writes
# from one random stream). Without them only deepinfer's columns are filled.
#
# Matching the two engines:
#   batch 1   deepinfer: `generate --device cuda` with an N_PROMPT-token prompt and N_GEN new
#             tokens (--ignore-eos): timing.prefill_tok_s and timing.decode_tok_s.
#             llama-bench -ngl 99: -p N_PROMPT -n 0 (prefill) and -p 0 -n N_GEN -d N_PROMPT
#             (N_GEN single-token decodes after an N_PROMPT-token context).
#   C seqs    deepinfer: bench_engine --concurrency C --requests C (one wave of C requests of
#             N_PROMPT + N_GEN tokens): decode tok/s = C / the mean decode step of C sequences,
#             output tok/s = C N_GEN / the wall time (prefill included).
#             llama-batched-bench -ngl 99 -npp N_PROMPT -ntg N_GEN -npl C: decode tok/s =
#             its S_TG (C N_GEN / the decode time), output tok/s = C N_GEN / (T_PP + T_TG).
#             (deepinfer's first token comes from its prefill, so it runs N_GEN - 1 decode
#             steps for N_GEN tokens where llama-batched-bench runs N_GEN: about 1.5 % in
#             deepinfer's favour at N_GEN = 64 in the output rate.)
#   Roofline: the device's copy bandwidth (bench_cuda_matmul) over the weight bytes one decoded
#   token reads at batch 1 (bench/bytes_per_token.py). deepinfer runs greedy with its default
#   batch invariance; medians of REPS runs at batch 1, one run per C.
#
# Usage: bench/gpu_vs_llamacpp.sh [--name value ...]   (each name is also read from the environment)
#   --deepinfer PATH             build/deepinfer (CUDA build)                  (DEEPINFER)
#   --model-dir DIR              Hugging Face checkpoint folder, required      (MODEL_DIR)
#   --gguf PATH                  GGUF of the same weights                      (GGUF)
#   --llama-bench PATH           llama.cpp's llama-bench, CUDA build           (LLAMA_BENCH)
#   --llama-batched-bench PATH   llama.cpp's llama-batched-bench, CUDA build   (LLAMA_BATCHED_BENCH)
#   --llama-build LABEL          its commit, for the table where llama-bench    (LLAMA_BUILD)
#                                reports none (a build from a source tarball)
#   --n-prompt N                 default 16                                    (N_PROMPT)
#   --n-gen N                    default 64                                    (N_GEN)
#   --concurrency "C ..."        default "1 8 64"                              (CONCURRENCY)
#   --reps N                     default 3                                     (REPS)
#   --out-dir DIR                default bench/out (git-ignored)               (OUT_DIR)
# Writes OUT_DIR/gpu_vs_llamacpp.md (the tables), OUT_DIR/gpu_vs_llamacpp.json and the raw
# outputs of every run under OUT_DIR/gpu_vs_llamacpp_raw/.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
    case "$1" in
        --deepinfer) DEEPINFER=${2-} ;;
        --model-dir) MODEL_DIR=${2-} ;;
        --gguf) GGUF=${2-} ;;
        --llama-bench) LLAMA_BENCH=${2-} ;;
        --llama-batched-bench) LLAMA_BATCHED_BENCH=${2-} ;;
        --llama-build) LLAMA_BUILD=${2-} ;;
        --n-prompt) N_PROMPT=${2-} ;;
        --n-gen) N_GEN=${2-} ;;
        --concurrency) CONCURRENCY=${2-} ;;
        --reps) REPS=${2-} ;;
        --out-dir) OUT_DIR=${2-} ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "gpu_vs_llamacpp.sh: unknown argument \"$1\" (see --help)" >&2
            exit 2
            ;;
    esac
    [ $# -ge 2 ] || { echo "gpu_vs_llamacpp.sh: $1 needs a value" >&2; exit 2; }
    shift 2
done

DEEPINFER=${DEEPINFER:-$REPO/build/deepinfer}
MODEL_DIR=${MODEL_DIR:-}
GGUF=${GGUF:-}
LLAMA_BENCH=${LLAMA_BENCH:-}
LLAMA_BATCHED_BENCH=${LLAMA_BATCHED_BENCH:-}
LLAMA_BUILD=${LLAMA_BUILD:-}
N_PROMPT=${N_PROMPT:-16}
N_GEN=${N_GEN:-64}
CONCURRENCY=${CONCURRENCY:-1 8 64}
REPS=${REPS:-3}
OUT_DIR=${OUT_DIR:-$REPO/bench/out}
RAW=$OUT_DIR/gpu_vs_llamacpp_raw
BIN=$(dirname "$DEEPINFER")

die() { echo "gpu_vs_llamacpp.sh: $*" >&2; exit 1; }
note() { echo "== $*" >&2; }

[ -n "$MODEL_DIR" ] || die "no checkpoint: pass --model-dir DIR (or set MODEL_DIR)"
[ -f "$MODEL_DIR/config.json" ] || die "$MODEL_DIR/config.json: not found"
for b in "$DEEPINFER" "$BIN/bench_engine" "$BIN/bench_cuda_matmul"; do
    [ -x "$b" ] || die "$b: not an executable (build the CUDA targets, or pass --deepinfer PATH)"
done
for v in N_PROMPT N_GEN REPS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got \"${!v}\""
done
for c in $CONCURRENCY; do
    [[ $c =~ ^[1-9][0-9]*$ ]] || die "CONCURRENCY must hold positive integers, got \"$c\""
done
command -v python3 > /dev/null || die "python3 is needed to read JSON"
LLAMA=0
if [ -n "$GGUF" ] && [ -f "$GGUF" ] && [ -x "$LLAMA_BENCH" ] && [ -x "$LLAMA_BATCHED_BENCH" ]; then
    LLAMA=1
else
    note "llama.cpp skipped (needs GGUF, a file, and LLAMA_BENCH and LLAMA_BATCHED_BENCH, executables)"
fi
rm -rf "$RAW"
mkdir -p "$RAW"

# ---- the roofline -------------------------------------------------------------------------------
source "$REPO/bench/lib_bandwidth.sh"
BANDWIDTH_GBS=$(BENCH_MATMUL=$BIN/bench_cuda_matmul BENCH_MATMUL_ARGS="0 copy" measure_bandwidth)
python3 "$REPO/bench/bytes_per_token.py" "$MODEL_DIR" > "$RAW/bytes_per_token.json"

# ---- batch 1 ------------------------------------------------------------------------------------
PROMPT_IDS=$(python3 -c '
import json, random, sys
V = json.load(open(sys.argv[1]))["vocab_size"]
r = random.Random(20240601)
print(" ".join(str(r.randrange(min(1000, V // 4), min(100000, V - 1))) for _ in range(int(sys.argv[2]))))
' "$MODEL_DIR/config.json" "$N_PROMPT")
for i in $(seq 0 "$REPS"); do
    note "deepinfer generate --device cuda ($([ "$i" -eq 0 ] && echo warm-up || echo "run $i/$REPS"))"
    "$DEEPINFER" generate --device cuda --model "$MODEL_DIR" --ids "$PROMPT_IDS" \
        --max-tokens "$N_GEN" --temperature 0 --ignore-eos --format json \
        > "$RAW/deepinfer_$i.json" 2> "$RAW/deepinfer_$i.err" ||
        die "deepinfer generate failed: $(tail -n 5 "$RAW/deepinfer_$i.err")"
done
if [ $LLAMA = 1 ]; then
    common=(-m "$GGUF" -ngl 99 -r "$REPS" -o json)
    note "llama-bench -p $N_PROMPT -n 0; -p 0 -n $N_GEN -d $N_PROMPT"
    "$LLAMA_BENCH" "${common[@]}" -p "$N_PROMPT" -n 0 > "$RAW/llama_pp.json" 2> "$RAW/llama_pp.err" ||
        die "llama-bench failed: $(tail -n 5 "$RAW/llama_pp.err")"
    "$LLAMA_BENCH" "${common[@]}" -p 0 -n "$N_GEN" -d "$N_PROMPT" > "$RAW/llama_tg.json" \
        2> "$RAW/llama_tg.err" || die "llama-bench failed: $(tail -n 5 "$RAW/llama_tg.err")"
fi

# ---- C concurrent sequences ----------------------------------------------------------------------
for c in $CONCURRENCY; do
    note "bench_engine --concurrency $c"
    "$BIN/bench_engine" --model "$MODEL_DIR" --device cuda --concurrency "$c" --requests "$c" \
        --max-running "$c" --prompt-len "$N_PROMPT" --gen-len "$N_GEN" \
        > "$RAW/engine_$c.json" 2> "$RAW/engine_$c.err" ||
        die "bench_engine failed: $(tail -n 5 "$RAW/engine_$c.err")"
done
if [ $LLAMA = 1 ]; then
    read -r -a cs <<< "$CONCURRENCY"
    npl=$(IFS=,; echo "${cs[*]}")
    cmax=$(printf '%s\n' "${cs[@]}" | sort -n | tail -1)
    note "llama-batched-bench -npp $N_PROMPT -ntg $N_GEN -npl $npl"
    "$LLAMA_BATCHED_BENCH" -m "$GGUF" -ngl 99 -c $((cmax * (N_PROMPT + N_GEN) + 256)) \
        -npp "$N_PROMPT" -ntg "$N_GEN" -npl "$npl" --output-format jsonl \
        > "$RAW/llama_batched.jsonl" 2> "$RAW/llama_batched.err" ||
        die "llama-batched-bench failed: $(tail -n 5 "$RAW/llama_batched.err")"
fi

# ---- the tables ---------------------------------------------------------------------------------
python3 - "$RAW" "$OUT_DIR" "$REPS" "$N_PROMPT" "$N_GEN" "$BANDWIDTH_GBS" "$LLAMA" "$MODEL_DIR" \
    "${GGUF:-}" "$CONCURRENCY" "$LLAMA_BUILD" << 'PY'
import json, os, statistics, sys, time
raw, out, reps, n_prompt, n_gen, bw, llama, model_dir, gguf, conc, llama_build = sys.argv[1:]
reps, n_prompt, n_gen, bw, llama = int(reps), int(n_prompt), int(n_gen), float(bw), llama == "1"
conc = [int(c) for c in conc.split()]
bpt = json.load(open(os.path.join(raw, "bytes_per_token.json")))
roof = bw * 1e9 / bpt["bytes_per_token"]

runs = []
for i in range(1, reps + 1):
    t = json.load(open(os.path.join(raw, f"deepinfer_{i}.json")))["timing"]
    runs.append((t["prefill_tok_s"], t["decode_tok_s"]))
di_pp, di_tg = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)

def bench_row(name):
    r = json.load(open(os.path.join(raw, name)))[0]
    return (statistics.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"]), r
lc_pp = lc_tg = None
info = {}
if llama:
    lc_pp, rp = bench_row("llama_pp.json")
    lc_tg, rt = bench_row("llama_tg.json")
    info = {k: rt.get(k) for k in ("build_commit", "gpu_info", "backends", "flash_attn",
                                   "n_batch", "n_ubatch", "type_k", "type_v")}
    if llama_build and info.get("build_commit") in (None, "", "unknown"):
        info["build_commit"] = llama_build
    info["flash_attn"] = {-1: "auto", 0: "off", 1: "on"}.get(info["flash_attn"], info["flash_attn"])

eng, lb = {}, {}
for c in conc:
    j = json.loads(open(os.path.join(raw, f"engine_{c}.json")).read().strip().splitlines()[-1])
    steps = [s for s in j.get("decode_steps", []) if s[0] == c]
    eng[c] = {"decode_tok_s": c / steps[0][2] if steps else None, "output_tok_s": j["output_tok_s"],
              "ttft_p50_ms": 1e3 * j["ttft_s"]["p50"], "itl_p50_ms": 1e3 * j["itl_s"]["p50"]}
if llama:
    for line in open(os.path.join(raw, "llama_batched.jsonl")):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            lb[r["pl"]] = {"decode_tok_s": r["speed_tg"], "output_tok_s": r["pl"] * r["tg"] / r["t"],
                           "t_pp_ms": 1e3 * r["t_pp"]}

f = lambda x, d=1: "n/a" if x is None else f"{x:.{d}f}"
ratio = lambda a, b: "n/a" if not a or not b else f"{a / b:.2f}"
pct = lambda x: "n/a" if x is None else f"{100 * x / roof:.0f} %"
L = [f"### GPU: deepinfer vs. llama.cpp (CUDA) on the same weights ({time.strftime('%Y-%m-%d %H:%M')})", ""]
L.append(f"- model: `{os.path.basename(os.path.normpath(model_dir))}` ({bpt['layers']} layers, "
         f"{bpt['moe_layers']} MoE); llama.cpp on `{os.path.basename(gguf) or 'n/a'}`")
L.append(f"- device copy bandwidth {bw:.1f} GB/s (bench_cuda_matmul); {bpt['bytes_per_token'] / 1e9:.3f} GB "
         f"of weights per decoded token at batch 1; roofline {roof:.1f} tok/s")
if info:
    L.append(f"- llama.cpp build {info.get('build_commit')} ({info.get('backends')}, {info.get('gpu_info')}), "
             f"-ngl 99, flash_attn={info.get('flash_attn')}, n_batch={info.get('n_batch')}, "
             f"n_ubatch={info.get('n_ubatch')}, KV {info.get('type_k')}/{info.get('type_v')}")
L.append(f"- batch 1: prompt {n_prompt} random ids, then {n_gen} tokens; median of {reps} runs. "
         f"C sequences: one wave of C requests of {n_prompt} + {n_gen} tokens (llama-batched-bench "
         f"`-npp {n_prompt} -ntg {n_gen} -npl C`), one run each")
L += ["", "| batch 1 | deepinfer | llama.cpp | deepinfer / llama.cpp |", "|---|---:|---:|---:|"]
L.append(f"| decode tok/s | {f(di_tg)} | {f(lc_tg)} | {ratio(di_tg, lc_tg)} |")
L.append(f"| decode, share of the roofline | {pct(di_tg)} | {pct(lc_tg)} | |")
L.append(f"| prefill tok/s ({n_prompt} tokens) | {f(di_pp)} | {f(lc_pp)} | {ratio(di_pp, lc_pp)} |")
L += ["", "| C | decode tok/s deepinfer | llama.cpp | ratio | output tok/s deepinfer | llama.cpp | ratio |",
      "|---:|---:|---:|---:|---:|---:|---:|"]
for c in conc:
    e, l = eng[c], lb.get(c, {})
    L.append(f"| {c} | {f(e['decode_tok_s'])} | {f(l.get('decode_tok_s'))} | "
             f"{ratio(e['decode_tok_s'], l.get('decode_tok_s'))} | {f(e['output_tok_s'])} | "
             f"{f(l.get('output_tok_s'))} | {ratio(e['output_tok_s'], l.get('output_tok_s'))} |")
md = "\n".join(L) + "\n"
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "gpu_vs_llamacpp.md"), "w").write(md)
json.dump({"bandwidth_gbs": bw, "roofline_tok_s": roof, "bytes_per_token": bpt,
           "deepinfer": {"decode_tok_s": di_tg, "prefill_tok_s": di_pp, "runs": runs, "engine": eng},
           "llama_cpp": {"decode_tok_s": lc_tg, "prefill_tok_s": lc_pp, "batched": lb, **info}},
          open(os.path.join(out, "gpu_vs_llamacpp.json"), "w"), indent=1)
sys.stdout.write(md)
PY
note "wrote $OUT_DIR/gpu_vs_llamacpp.md"
