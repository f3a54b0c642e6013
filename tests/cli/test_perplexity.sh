#!/usr/bin/env bash
# test_perplexity.sh -- `deepinfer perplexity` against perplexities computed here, in Python,
# from the float64 reference logits of every V2/V3 golden case (transformers' logits, so
# this is an independent check), plus chunking (--ctx smaller than the input: each chunk
# must be scored from an empty context, checked against `deepinfer logits` per chunk, whose
# exactness test_goldens establishes) and bad input.
#
# usage: bash tests/cli/test_perplexity.sh <path-to-deepinfer> [<shared-dir>]
BIN=${1:?usage: test_perplexity.sh <path-to-deepinfer>}
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for dir in tests/data/v2_* tests/data/v3_*; do
    [ -f "$dir/ref.json" ] || continue
    case=$(basename "$dir")
    python3 -c "import json;print(' '.join(map(str,json.load(open('$dir/ref.json'))['prompt_ids'])))" >"$TMP/ids"
    got=$("$BIN" perplexity --model "$dir" --ids-file "$TMP/ids" --format json --threads 1)
    msg=$(python3 - "$dir" "$got" <<'EOF2'
import array, json, math, sys
d, got = sys.argv[1], json.loads(sys.argv[2])
r = json.load(open(d + "/ref.json"))
ids, V = r["prompt_ids"], r["vocab_size"]
a = array.array("d")
a.frombytes(open(d + "/" + r["logits_file"], "rb").read())
nll = 0.0
for t in range(len(ids) - 1):
    row = a[t * V:(t + 1) * V]
    m = max(row)
    nll -= (row[ids[t + 1]] - m) - math.log(sum(math.exp(x - m) for x in row))
ppl = math.exp(nll / (len(ids) - 1))
if got["tokens"] != len(ids) - 1 or got["vocab_size"] != V or abs(got["ppl"] - ppl) > 1e-4 * ppl:
    print("got %s, expected tokens %d ppl %.6f" % (got, len(ids) - 1, ppl))
EOF2
)
    [ -z "$msg" ] && pass "$case ppl matches reference logits" || fail "$case" "$msg"
done

# Chunking: --ctx 7 over v3_grouped's prompt equals per-chunk scoring of `deepinfer logits`.
dir=tests/data/v3_grouped
if [ -f "$dir/ref.json" ]; then
    python3 -c "import json;print(' '.join(map(str,json.load(open('$dir/ref.json'))['prompt_ids'])))" >"$TMP/ids"
    got=$("$BIN" perplexity --model "$dir" --ids-file "$TMP/ids" --ctx 7 --format json --threads 1)
    ids=($(cat "$TMP/ids"))
    : >"$TMP/chunks"
    for ((s = 0; s < ${#ids[@]}; s += 7)); do
        chunk="${ids[*]:s:7}"
        "$BIN" logits --model "$dir" --ids "$chunk" --out "$TMP/l$s" --threads 1 && echo "$TMP/l$s $chunk" >>"$TMP/chunks"
    done
    msg=$(python3 - "$got" "$TMP/chunks" "$(python3 -c "import json;print(json.load(open('$dir/ref.json'))['vocab_size'])")" <<'EOF2'
import array, json, math, sys
got, V = json.loads(sys.argv[1]), int(sys.argv[3])
nll, n = 0.0, 0
for line in open(sys.argv[2]):
    path, *ids = line.split()
    ids = list(map(int, ids))
    a = array.array("f")
    a.frombytes(open(path, "rb").read())
    for t in range(len(ids) - 1):
        row = a[t * V:(t + 1) * V]
        m = max(row)
        nll -= (row[ids[t + 1]] - m) - math.log(sum(math.exp(x - m) for x in row))
        n += 1
ppl = math.exp(nll / n)
if got["tokens"] != n or abs(got["ppl"] - ppl) > 1e-5 * ppl:
    print("got %s, expected tokens %d ppl %.6f" % (got, n, ppl))
EOF2
)
    [ -z "$msg" ] && pass "chunked --ctx 7 scoring" || fail "chunked" "$msg"
fi

# Bad input: both inputs, a missing file, a one-token input.
"$BIN" perplexity --model tests/data/v2_lite --file x --ids-file y >/dev/null 2>&1
[ $? -eq 2 ] && pass "--file with --ids-file is a usage error" || fail "both inputs" "exit $?"
"$BIN" perplexity --model tests/data/v2_lite --file /nonexistent/text.txt 2>"$TMP/err" >/dev/null
[ $? -ne 0 ] && grep -q "text.txt" "$TMP/err" && pass "missing --file is named" || fail "missing file" "$(cat "$TMP/err")"
echo 5 >"$TMP/one"
"$BIN" perplexity --model tests/data/v2_lite --ids-file "$TMP/one" >/dev/null 2>&1
[ $? -eq 2 ] && pass "one token is refused" || fail "one token" "exit $?"

echo "$n_pass passed, $n_fail failed"
[ "$n_fail" -eq 0 ]
