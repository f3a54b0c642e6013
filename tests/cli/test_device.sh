#!/usr/bin/env bash
# test_device.sh -- the device choice of the `deepinfer` commands: `info --devices`, and
# `--device cpu|cuda[:N]` on every command that runs a model. Without a CUDA device (CI) a
# CUDA run must exit 1 with one line saying "no CUDA device"; with one, a V2/V3 golden model
# and the bundled DeepSeek-V4 model run and give the CPU's greedy ids. Bad device names are
# usage errors (exit 2).
#
# usage: bash tests/cli/test_device.sh <path-to-deepinfer> [<shared-dir>]   (from the repo root)
# The last line is "N passed, N failed[, N skipped]"; the exit status is non-zero on failure.

BIN=${1:?usage: test_device.sh <path-to-deepinfer> [<shared-dir>]}
CASE=tests/data/v3_fp8
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
run() {
    "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
}
# expect_err NAME CODE PATTERN ARGS...: exit CODE, one stderr line matching PATTERN, no stdout.
expect_err() {
    local name=$1 code=$2 pat=$3
    shift 3
    run "$@"
    if [ "$rc" = "$code" ] && [ ! -s "$TMP/out" ] && [ "$(wc -l <"$TMP/err")" = 1 ] &&
        grep -qE "$pat" "$TMP/err"; then
        pass "$name"
    else
        fail "$name" "exit $rc (want $code), stderr: $(head -c 300 "$TMP/err")" \
            "stdout: $(head -c 200 "$TMP/out")"
    fi
}

# --- info --devices ---------------------------------------------------------------------------
run info --devices
if [ "$rc" = 0 ] && grep -q "^backends .*cpu" "$TMP/out" &&
    grep -qE "^cuda devices +none: |^cuda:0 " "$TMP/out"; then
    pass "info --devices"
else
    fail "info --devices" "exit $rc: $(cat "$TMP/out" "$TMP/err" | head -c 300)"
fi
run info --devices --format json
if [ "$rc" = 0 ] && grep -q '"backends"' "$TMP/out" && grep -q '"cuda_devices"' "$TMP/out"; then
    pass "info --devices --format json"
else
    fail "info --devices --format json" "exit $rc: $(head -c 300 "$TMP/out")"
fi
have_gpu=0
grep -q "^cuda:0 " <("$BIN" info --devices 2>/dev/null) && have_gpu=1

# --- bad device names (usage errors, before any model is loaded) -------------------------------
for cmd in "generate --ids 1" "logits --ids 1 --out $TMP/l.bin" "perplexity --ids 1" \
    "info" "batch --input $TMP/none.jsonl --output $TMP/o.jsonl"; do
    # shellcheck disable=SC2086
    expect_err "${cmd%% *} --device tpu" 2 'device "tpu": expected cpu, cuda or cuda:N' \
        $cmd --model "$CASE" --device tpu
done
expect_err "generate --device cuda:x" 2 'expected cpu, cuda or cuda:N' \
    generate --model "$CASE" --ids "1 2" --device cuda:x

# --- CUDA runs -----------------------------------------------------------------------------------
# The DeepSeek-V4 check uses the bundled model; a copy of the tree without models/ (a GPU
# machine) falls back to the V4 golden case.
V4=models/deepseek-v4-tiny
[ -f "$V4/config.json" ] || V4=tests/data/v4_hc3_plain
if [ $have_gpu = 0 ]; then
    expect_err "generate --device cuda without a GPU" 1 "no CUDA device" \
        generate --model "$CASE" --ids "1 2 3" --max-tokens 4 --device cuda
    expect_err "logits --device cuda:0 without a GPU" 1 "no CUDA device" \
        logits --model "$CASE" --ids "1 2 3" --out "$TMP/l.bin" --device cuda:0
    expect_err "perplexity --device cuda without a GPU" 1 "no CUDA device" \
        perplexity --model "$CASE" --ids "1 2 3 4" --device cuda
    expect_err "info --device cuda without a GPU" 1 "no CUDA device" \
        info --model "$CASE" --device cuda
    expect_err "V4 --device cuda without a GPU" 1 "no CUDA device" \
        generate --model "$V4" --ids "1 2 3" --max-tokens 4 --device cuda
else
    # V2/V3 (the golden case) and V4 (the bundled model or its golden case) alike.
    for m in "$CASE" "$V4"; do
        run generate --model "$m" --ids "1 2 3 4 5" --max-tokens 16 --device cuda
        gpu_ids=$(cat "$TMP/out")
        gpu_rc=$rc
        run generate --model "$m" --ids "1 2 3 4 5" --max-tokens 16 --device cpu
        if [ "$gpu_rc" = 0 ] && [ "$rc" = 0 ] && [ -n "$gpu_ids" ] &&
            [ "$gpu_ids" = "$(cat "$TMP/out")" ]; then
            pass "generate --device cuda gives the CPU's greedy ids ($(basename "$m"))"
        else
            fail "generate --device cuda gives the CPU's greedy ids ($(basename "$m"))" \
                "cuda: $gpu_ids" "cpu: $(cat "$TMP/out")"
        fi
    done
fi

finish
