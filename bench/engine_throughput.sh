#!/usr/bin/env bash
# engine_throughput.sh -- engine serving benchmark: output tokens/s, TTFT and inter-token
# latency against concurrency (1, 2, 4, ... requests in flight) next to a one-request-at-a-time
# loop, the prefix-cache speed-up on a shared system prompt, the scheduler's CPU share, and the
# decode roofline per batch size. The work is done by build/bench_engine; the sweep, the
# roofline and the plots by bench/engine_throughput.py (see its header for the definitions).
#
# usage: bench/engine_throughput.sh [--model DIR] [--build DIR] [--full] [more options of
#        engine_throughput.py: --threads N, --max-concurrency C, --prompt-len P, --gen-len G,
#        --shared-prefix S, --bandwidth-gbs X, --matmul-gflops Y, --no-plots]
#   --model DIR   checkpoint folder (default: tests/data/v2_lite, a plumbing check only)
#   --build DIR   build folder with deepinfer, bench_engine, bench_matmul (default: build)
#   --full        concurrency up to 256 with 128-token prompts and outputs (long; take the
#                 numbers on a quiet machine)
# Writes bench/out/engine_throughput.{json,md} and docs/engine_{throughput,roofline,prefix_cache}.png.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-tests/data/v2_lite}
BUILD=${BUILD:-build}
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL=$2; shift 2 ;;
        --build) BUILD=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
for b in deepinfer bench_engine bench_matmul; do
    if [ ! -x "$BUILD/$b" ]; then
        echo "engine_throughput.sh: $BUILD/$b not found; build first (make, or cmake --build $BUILD)" >&2
        exit 1
    fi
done
if ! python3 -c 'import matplotlib' 2>/dev/null; then
    echo "engine_throughput.sh: matplotlib missing; trying pip install --user matplotlib" >&2
    python3 -m pip install --user --quiet matplotlib || echo "  (no plots then)" >&2
fi
exec python3 bench/engine_throughput.py --model "$MODEL" --deepinfer "$BUILD/deepinfer" \
    --bench-engine "$BUILD/bench_engine" --bench-matmul "$BUILD/bench_matmul" ${args[@]+"${args[@]}"}
