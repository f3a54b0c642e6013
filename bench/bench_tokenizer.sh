#!/usr/bin/env bash
# bench_tokenizer.sh -- our tokenizer vs Hugging Face `tokenizers` on the same >= 4 MB corpus.
#
#   bench/bench_tokenizer.sh [BUILD_DIR] [TOKENIZER.json]
#
# Builds the corpus (golden texts + shared prompts, repeated to >= 4 MB) in $TMPDIR, runs
# bench_tokenizer (C) and bench_tokenizer.py (HF, single thread via RAYON_NUM_THREADS=1 and
# all threads), and prints both side by side with ratios. splitlines() in Python and our
# newline split agree for the \n-separated corpus we write (no \r, \v, \f, \x1c-\x1e, \x85,
# \u2028/9 inside lines: those are replaced by spaces when the corpus is built).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
tok="${2:-$root/../shared/tokenizers/deepseek-v3/tokenizer.json}"
corpus="${TMPDIR:-/tmp}/di_tok_corpus.txt"

python3 - "$root" "$corpus" <<'PY'
import glob, json, os, re, sys
root, out = sys.argv[1], sys.argv[2]
texts = [json.loads(l)["text"] for l in open(os.path.join(root, "tests/data/tokenizer/deepseek_v3.jsonl"), encoding="utf-8")]
for p in sorted(glob.glob(os.path.join(root, "../shared/prompts/*.jsonl"))):
    for l in open(p, encoding="utf-8"):
        texts += json.loads(l).get("turns", [])
bad = re.compile("[\r\v\f\x1c\x1d\x1e\x85\u2028\u2029\x00]")
lines = [bad.sub(" ", t) for t in texts]
body = "\n".join(lines) + "\n"
rep = -(-4_200_000 // len(body.encode()))
open(out, "w", encoding="utf-8").write(body * rep)
PY

ours="$("$build/bench_tokenizer" "$tok" "$corpus")"
hf1="$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false python3 "$here/bench_tokenizer.py" "$tok" "$corpus")"
hfn="$(TOKENIZERS_PARALLELISM=true python3 "$here/bench_tokenizer.py" "$tok" "$corpus")"
get() { sed -n "s/^$2=//p" <<<"$1"; }
printf 'corpus: %s MB, %s lines\n' "$(get "$ours" mb)" "$(get "$ours" lines)"
printf '%-26s %12s %12s %8s\n' metric deepinfer hf-tokenizers ratio
row() { printf '%-26s %12s %12s %8s\n' "$1" "$2" "$3" "$(python3 -c "print(f'{$4:.2f}x')")"; }
row "encode 1 thread (MB/s)" "$(get "$ours" st_mbps)" "$(get "$hf1" mbps)" "$(get "$ours" st_mbps)/$(get "$hf1" mbps)"
row "encode $(get "$ours" threads) threads (MB/s)" "$(get "$ours" mt_mbps)" "$(get "$hfn" mbps)" "$(get "$ours" mt_mbps)/$(get "$hfn" mbps)"
row "load (s)" "$(get "$ours" load_s)" "$(get "$hf1" load_s)" "$(get "$hf1" load_s)/$(get "$ours" load_s)"
row "peak RSS (MB)" "$(get "$ours" peak_rss_mb)" "$(get "$hf1" peak_rss_mb)" "$(get "$hf1" peak_rss_mb)/$(get "$ours" peak_rss_mb)"
if [ "$(get "$ours" ids)" != "$(get "$hf1" ids)" ]; then
  echo "WARNING: id counts differ: ours $(get "$ours" ids), hf $(get "$hf1" ids)"
else
  echo "ids: $(get "$ours" ids) (identical count)"
fi
