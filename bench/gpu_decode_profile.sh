#!/usr/bin/env bash
# gpu_decode_profile.sh BUILD_DIR OUTDIR [LAYERS] -- where a batch-1 decode step's time goes on
# the GPU, for a DeepSeek-V2-Lite-shaped model with random bf16 weights and LAYERS layers
# (default 4: one dense, the rest MoE; made once by gpu_vs_transformers.py --make-only).
#   decode.txt  `deepinfer generate --device cuda` decode tok/s: CUDA graphs with and without
#               programmatic dependent launch (DI_CUDA_PDL=0), and no graphs; the device time
#               of one replayed step (DI_CUDA_GRAPH_TIMING=1) next to the step's wall time, at
#               batch 1 and for each C in CONCURRENCY (bench_engine's inter-token latency;
#               replay.err holds the last run's stderr)
#   ncu.csv     Nsight Compute's duration of every kernel of a short run (no graphs)
#   step.txt    the last decode step kernel by kernel (duration, DRAM bytes read and their
#               rate), summed by kernel, against the step time
#   stepC.txt   the same for a decode step of C sequences (the engine, bench_engine at C
#               concurrent requests) for each C in CONCURRENCY (e.g. CONCURRENCY="8 64")
#   prefillC.txt the first forward of that run: the prefill chunk of its C 16-token prompts
# Needs a CUDA build of deepinfer in BUILD_DIR, python3 with torch + transformers, and ncu
# (Nsight Compute) for step.txt. MODEL_DIR overrides the model folder (/tmp/v2lite-L<LAYERS>).
set -euo pipefail
build=$(cd "${1:?usage: gpu_decode_profile.sh BUILD_DIR OUTDIR [LAYERS]}" && pwd)
out=${2:?usage: gpu_decode_profile.sh BUILD_DIR OUTDIR [LAYERS]}
layers=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
model=${MODEL_DIR:-/tmp/v2lite-L$layers}
mkdir -p "$out"

[ -f "$model/config.json" ] ||
    python3 "$here/gpu_vs_transformers.py" --make-only --layers "$layers" --model-dir "$model"

ids=$(seq 10 37 600 | head -16 | tr '\n' ' ')
gen() { # gen N [env...]: decode tok/s of one generate run of N tokens
    local n=$1
    shift
    env "$@" "$build/deepinfer" generate --device cuda --model "$model" --ids "$ids" \
        --max-tokens "$n" --ignore-eos --format json 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["timing"]["decode_tok_s"])'
}
g1=$(gen 128)
g0=$(gen 128 DI_CUDA_GRAPHS=0)
gp=$(gen 128 DI_CUDA_PDL=0)
ms() { python3 -c "print('%.3f' % (1000 / $1))"; }
{
    echo "layers=$layers model=$model"
    echo "decode tok/s, graphs + PDL:   $g1 (step $(ms "$g1") ms)"
    echo "decode tok/s, graphs, no PDL: $gp (step $(ms "$gp") ms)"
    echo "decode tok/s, no graphs:      $g0 (step $(ms "$g0") ms)"
} | tee "$out/decode.txt"
# The device's share of a step: each graph replay timed between two events (the backend
# prints the mean when it is freed), next to the measured step.
replay() { sed -n 's/^cuda backend: //p' "$out/replay.err" | tail -1; }
{
    DI_CUDA_GRAPH_TIMING=1 "$build/deepinfer" generate --device cuda --model "$model" \
        --ids "$ids" --max-tokens 128 --ignore-eos >/dev/null 2>"$out/replay.err"
    echo "batch 1, step $(ms "$g1") ms: $(replay)"
    for c in ${CONCURRENCY:-}; do # one run: its inter-token latency and its replays' time
        itl=$(DI_CUDA_GRAPH_TIMING=1 "$build/bench_engine" --model "$model" --device cuda \
            --concurrency "$c" --requests "$c" --prompt-len 16 --gen-len 64 2>"$out/replay.err" |
            python3 -c 'import json,sys; print("%.3f" % (1e3 * json.load(sys.stdin)["itl_s"]["p50"]))')
        echo "$c concurrent, inter-token p50 $itl ms: $(replay)"
    done
} | tee -a "$out/decode.txt"

if command -v ncu >/dev/null; then
    DI_CUDA_GRAPHS=0 ncu --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$build/deepinfer" generate --device cuda \
        --model "$model" --ids "$ids" --max-tokens 4 --ignore-eos >"$out/ncu.csv" 2>"$out/ncu.err"
    python3 "$here/ncu_step_table.py" "$out/ncu.csv" "$(python3 -c "print(1000 / $g1)")" \
        >"$out/step.txt"
    tail -40 "$out/step.txt"
    for c in ${CONCURRENCY:-}; do
        DI_CUDA_GRAPHS=0 ncu --clock-control none --cache-control none --csv \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum "$build/bench_engine" \
            --model "$model" --device cuda --concurrency "$c" --requests "$c" \
            --prompt-len 16 --gen-len 3 >"$out/ncu$c.csv" 2>"$out/ncu$c.err"
        python3 "$here/ncu_step_table.py" "$out/ncu$c.csv" >"$out/step$c.txt"
        tail -40 "$out/step$c.txt"
        # the same run's first forward: the prefill chunk of its C prompts (up to the
        # engine's 512 prefill tokens per step)
        python3 "$here/ncu_step_table.py" "$out/ncu$c.csv" --first >"$out/prefill$c.txt"
        sed -n '/^by kernel/,$p' "$out/prefill$c.txt" | head -20
    done
else
    echo "ncu not found: no per-kernel table" | tee "$out/step.txt"
fi
