#!/usr/bin/env bash
# disagg_itl.sh -- inter-token latency of running decodes while long prompts arrive: the unified
# engine vs the disaggregated prefill/decode workers (bench_disagg), modes interleaved per
# repetition. Prints a markdown table of medians over the repetitions; raw JSON lines go to
# bench/out/disagg_itl_raw.jsonl.
#
# usage: bench/disagg_itl.sh [BUILD_DIR] ; environment: REPS (3), THREADS (2), PREFILL_THREADS
# (THREADS / 2), and per model "DIR LONG_LEN GEN_LEN" triples in CASES.
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
PREFILL_THREADS=${PREFILL_THREADS:-0}
CASES=${CASES:-"models/deepseek-v4-tiny 600 96
tests/data/v2_lite 120 96"}
mkdir -p bench/out
RAW=bench/out/disagg_itl_raw.jsonl
: >"$RAW"
while read -r dir long gen; do
    [ -n "$dir" ] || continue
    for rep in $(seq "$REPS"); do
        for mode in unified disagg; do
            "$BUILD/bench_disagg" --model "$dir" --mode "$mode" --threads "$THREADS" \
                --prefill-threads "$PREFILL_THREADS" --long-len "$long" --gen-len "$gen" \
                --longs 3 --long-every 16 --max-prefill-tokens 512 --seed "$rep" |
                python3 -c 'import json,sys; o=json.load(sys.stdin); o["model"]=sys.argv[1]; print(json.dumps(o))' "$dir" >>"$RAW"
        done
    done
done <<<"$CASES"
python3 - "$RAW" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| model | mode | decode ITL p50 ms | p99 ms | max ms | long-prompt TTFT p50 s | wall s | prefill / decode worker busy s |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    for mode in ("unified", "disagg"):
        rs = [r for r in rows if r["model"] == model and r["mode"] == mode]
        med = lambda f: statistics.median(f(r) for r in rs)
        busy = "-" if mode == "unified" else "%.2f / %.2f" % (med(lambda r: r["stats"]["time_prefill_busy_s"]), med(lambda r: r["stats"]["time_decode_busy_s"]))
        print("| %s | %s | %.1f | %.1f | %.1f | %.2f | %.2f | %s |" % (model.split("/")[-1], mode,
              1e3 * med(lambda r: r["decode_itl_s"]["p50"]), 1e3 * med(lambda r: r["decode_itl_s"]["p99"]),
              1e3 * med(lambda r: r["decode_itl_s"]["max"]), med(lambda r: r["long_ttft_s"]["p50"]),
              med(lambda r: r["wall_s"]), busy))
PY
