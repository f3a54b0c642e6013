#!/usr/bin/env bash
# test_cli.sh -- end-to-end checks of the `deepinfer` program's commands on the tiny golden
# model tests/data/v2_lite (info, logits, generate), and of its handling of bad input: every
# error must exit non-zero with exactly one line on stderr naming the problem and nothing on
# stdout.
#
# usage: bash tests/cli/test_cli.sh <path-to-deepinfer> [<shared-dir>]   (from the repo root)
#
# Checks that need the committed golden model fail when tests/data/v2_lite is absent; the
# rest (argument errors found before any model is loaded) always run. The last line is
# "N passed, N failed[, N skipped]"; the exit status is non-zero if anything failed.

BIN=${1:?usage: test_cli.sh <path-to-deepinfer> [<shared-dir>]}
CASE=tests/data/v2_lite
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Runs the program; leaves $TMP/out, $TMP/err and $rc.
run() {
    "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
}

# expect_ok NAME ARGS...: exit 0.
expect_ok() {
    local name=$1
    shift
    run "$@"
    if [ "$rc" -eq 0 ]; then return 0; fi
    fail "$name" "exit $rc: deepinfer $*" "stderr: $(head -c 400 "$TMP/err")"
    return 1
}

# expect_error NAME NEEDLE ARGS...: non-zero exit, empty stdout, one stderr line containing
# NEEDLE (a fixed string).
expect_error() {
    local name=$1 needle=$2
    shift 2
    run "$@"
    local lines
    lines=$(wc -l <"$TMP/err")
    if [ "$rc" -eq 0 ]; then
        fail "$name" "exit 0, expected an error: deepinfer $*"
    elif [ -s "$TMP/out" ]; then
        fail "$name" "stdout not empty: $(head -c 200 "$TMP/out")"
    elif [ "$lines" -ne 1 ]; then
        fail "$name" "expected 1 line on stderr, got $lines:" "$(head -c 400 "$TMP/err")"
    elif ! grep -qF -- "$needle" "$TMP/err"; then
        fail "$name" "stderr does not name \"$needle\": $(cat "$TMP/err")"
    else
        pass "$name"
    fi
}

# check_py NAME SCRIPT ARGS...: a python3 check that exits 0 when it holds (prints why not).
check_py() {
    local name=$1 script=$2
    shift 2
    local msg
    if msg=$(python3 -c "$script" "$@" 2>&1); then pass "$name"; else fail "$name" "$msg"; fi
}

# ---------------------------------------------------------------------------------------------
# Argument errors found before a model is loaded
# ---------------------------------------------------------------------------------------------

for cmd in info logits generate; do
    run "$cmd" --help
    if [ "$rc" -eq 0 ] && grep -q "usage: deepinfer $cmd" "$TMP/out" && [ ! -s "$TMP/err" ]; then
        pass "$cmd --help"
    else
        fail "$cmd --help" "exit $rc, stdout: $(head -c 200 "$TMP/out")"
    fi
done

# Without --model the bundled model is used; DEEPINFER_MODEL overrides where it is found.
expect_ok "info: the bundled model without --model" info --format json
DEEPINFER_MODEL=/nonexistent/model expect_error "info: DEEPINFER_MODEL without a model" "DEEPINFER_MODEL" info --format json
DEEPINFER_MODEL=/nonexistent/model expect_error "logits: DEEPINFER_MODEL without a model" "DEEPINFER_MODEL" logits --ids "1 2" --out "$TMP/x.bin"
expect_error "generate: nonexistent model dir" "$TMP/no-such-model" \
    generate --model "$TMP/no-such-model" --ids "1 2" --max-tokens 2
expect_error "info: nonexistent model dir" "$TMP/no-such-model" info --model "$TMP/no-such-model"
expect_error "generate: unknown option" "--bogus" generate --model "$CASE" --ids 1 --bogus
expect_error "info: unknown option" "--frobnicate" info --model "$CASE" --frobnicate 3
expect_error "generate: --temperature -1" "temperature" \
    generate --model "$CASE" --ids "1 2" --max-tokens 2 --temperature -1
expect_error "generate: --top-p 1.5" "top_p" \
    generate --model "$CASE" --ids "1 2" --max-tokens 2 --temperature 0.7 --top-p 1.5
expect_error "generate: non-number id" "x7" generate --model "$CASE" --ids "5 x7" --max-tokens 2
expect_error "logits: non-number id" "abc" logits --model "$CASE" --ids "abc" --out "$TMP/x.bin"
expect_error "generate: bad --max-tokens" "--max-tokens" \
    generate --model "$CASE" --ids 1 --max-tokens ten
expect_error "info: bad --format" "xml" info --model "$CASE" --format xml

# ---------------------------------------------------------------------------------------------
# The golden model
# ---------------------------------------------------------------------------------------------

if [ ! -f "$CASE/ref.json" ] || [ ! -f "$CASE/config.json" ]; then
    for t in "info --format json" "info text" logits "logits --ids-file" "generate --format json" \
        "generate text" "generate: id out of range" "logits: unwritable --out"; do
        fail "$t" "$CASE is committed but absent"
    done
else
    PROMPT=$(python3 -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["prompt_ids"])))' "$CASE/ref.json")
    GREEDY=$(python3 -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["greedy_ids"])))' "$CASE/ref.json")
    N_GREEDY=$(echo "$GREEDY" | wc -w)
    VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CASE/config.json")

    # info --format json: one object with the fields, consistent with config.json.
    if expect_ok "info --format json" info --model "$CASE" --format json; then
        check_py "info --format json" '
import json, sys
info = json.load(open(sys.argv[1]))
cfg = json.load(open(sys.argv[2]))
def need(cond, what):
    if not cond:
        sys.exit(what + ": " + json.dumps(info))
for k in ("architecture", "family", "n_layers", "hidden_size", "vocab_size", "max_context",
          "n_params_total", "n_params_active", "n_params_mtp", "dtypes", "weight_bytes",
          "kv_bytes_per_token"):
    need(k in info, "missing field " + k)
need(info["architecture"] == cfg["architectures"][0], "architecture")
need(info["vocab_size"] == cfg["vocab_size"], "vocab_size")
need(info["n_layers"] == cfg["num_hidden_layers"], "n_layers")
need(info["hidden_size"] == cfg["hidden_size"], "hidden_size")
need(info["max_context"] == cfg["max_position_embeddings"], "max_context")
need(0 < info["n_params_active"] < info["n_params_total"], "parameter counts")
need(info["n_params_mtp"] >= 0, "n_params_mtp")
need(info["weight_bytes"] >= 2 * info["n_params_total"], "weight_bytes (bf16)")
need(info["kv_bytes_per_token"] > 0, "kv_bytes_per_token")
need(info["dtypes"] != "", "dtypes")
' "$TMP/out" "$CASE/config.json"
    fi

    if expect_ok "info text" info --model "$CASE"; then
        if grep -q "$VOCAB" "$TMP/out"; then pass "info text"; else fail "info text" "no vocab size"; fi
    fi

    # logits: exactly n_ids * vocab * 4 bytes; the last row's argmax is the first greedy id.
    if expect_ok "logits" logits --model "$CASE" --ids "$PROMPT" --out "$TMP/logits.bin"; then
        check_py "logits" '
import json, struct, sys
ref = json.load(open(sys.argv[2]))
n, vocab = len(ref["prompt_ids"]), ref["vocab_size"]
data = open(sys.argv[1], "rb").read()
if len(data) != n * vocab * 4:
    sys.exit("size %d, expected %d x %d x 4 = %d" % (len(data), n, vocab, n * vocab * 4))
last = struct.unpack("<%df" % vocab, data[(n - 1) * vocab * 4:])
best = max(range(vocab), key=lambda i: (last[i], -i))
if best != ref["greedy_ids"][0]:
    sys.exit("last row argmax %d, expected greedy_ids[0] = %d" % (best, ref["greedy_ids"][0]))
' "$TMP/logits.bin" "$CASE/ref.json"
    fi

    echo "$PROMPT" | tr ' ' '\n' >"$TMP/ids.txt"
    if expect_ok "logits --ids-file" logits --model "$CASE" --ids-file "$TMP/ids.txt" \
        --out "$TMP/logits2.bin"; then
        if cmp -s "$TMP/logits.bin" "$TMP/logits2.bin"; then pass "logits --ids-file"
        else fail "logits --ids-file" "differs from --ids"; fi
    fi

    # generate: the golden greedy continuation.
    if expect_ok "generate --format json" generate --model "$CASE" --ids "$PROMPT" \
        --max-tokens "$N_GREEDY" --temperature 0 --ignore-eos --format json; then
        check_py "generate --format json" '
import json, sys
out = json.loads(open(sys.argv[1]).read())
ref = json.load(open(sys.argv[2]))
if out["ids"] != ref["greedy_ids"]:
    sys.exit("ids %s, expected %s" % (out["ids"], ref["greedy_ids"]))
if out["finish_reason"] != "length":
    sys.exit("finish_reason " + out["finish_reason"])
u, t = out["usage"], out["timing"]
if u["prompt_tokens"] != len(ref["prompt_ids"]) or u["completion_tokens"] != len(ref["greedy_ids"]):
    sys.exit("usage " + json.dumps(u))
for k in ("prefill_s", "decode_s", "prefill_tok_s", "decode_tok_s"):
    if not t.get(k, -1) >= 0:
        sys.exit("timing " + json.dumps(t))
' "$TMP/out" "$CASE/ref.json"
    fi

    if expect_ok "generate text" generate --model "$CASE" --ids "$PROMPT" \
        --max-tokens "$N_GREEDY" --ignore-eos; then
        if [ "$(cat "$TMP/out")" = "$GREEDY" ] && grep -q "^prompt .* tok/s" "$TMP/err"; then
            pass "generate text"
        else
            fail "generate text" "stdout: $(cat "$TMP/out")" "expected: $GREEDY" \
                "stderr: $(cat "$TMP/err")"
        fi
    fi

    expect_error "generate: id out of range" "$VOCAB" \
        generate --model "$CASE" --ids "1 $VOCAB 2" --max-tokens 2

    # Sampling: a seeded run repeats exactly and reports its seed and logprobs; --n gives
    # that many choices, the first being the n = 1 run.
    SAMPLE_ARGS="--ids 5 --max-tokens 6 --temperature 0.8 --top-p 0.9 --seed 42 --logprobs 3 --ignore-eos --format json"
    # shellcheck disable=SC2086
    if expect_ok "generate sampled" generate --model "$CASE" $SAMPLE_ARGS; then
        cp "$TMP/out" "$TMP/sampled1"
        # shellcheck disable=SC2086
        if expect_ok "generate sampled --n 3" generate --model "$CASE" $SAMPLE_ARGS --n 3; then
            check_py "generate sampled" '
import json, sys
a = json.loads(open(sys.argv[1]).read())
b = json.loads(open(sys.argv[2]).read())
if a["seed"] != 42 or len(a["ids"]) != 6 or len(a["logprobs"]) != 6:
    sys.exit("seed/ids/logprobs: " + json.dumps(a))
if any(len(l["top"]) != 3 for l in a["logprobs"]):
    sys.exit("top-3 missing")
if len(b["choices"]) != 3 or b["choices"][0]["ids"] != a["ids"] or b["ids"] != a["ids"]:
    sys.exit("choices: " + json.dumps(b["choices"]))
' "$TMP/sampled1" "$TMP/out"
        fi
    fi
    expect_error "logits: unwritable --out" "$TMP/no/such/dir/x.bin" \
        logits --model "$CASE" --ids "$PROMPT" --out "$TMP/no/such/dir/x.bin"
fi

finish
