#!/usr/bin/env bash
# test_batch.sh -- `deepinfer batch` on the golden model tests/data/v2_lite:
#   - a mixed file of completions (text, ids, several prompts), chat and error lines: greedy
#     results equal `deepinfer generate` for the same prompt, every error kind gives an error
#     line (response null) and every other line succeeds, each custom_id exactly once;
#   - kill -9 in the middle of a run, then rerun on the same output: every custom_id exactly
#     once and the results identical to an uninterrupted run; the same after a hand-made
#     truncated last line;
#   - progress lines on a non-terminal stderr; an unwritable output fails at start;
#   - --disaggregate (separate prefill and decode workers) gives the same results and reports
#     each worker's steps and busy time; so does --overlap (on the CPU the compute-thread
#     loop); --overlap excludes --disaggregate and --no-overlap.
#
# The tokenizer is a small byte-level BPE (256 ids, fits v2_lite's 400) in a temp folder with
# a tokenizer_config.json holding a simple chat template, as test_generate_text.sh does.
#
# usage: bash tests/cli/test_batch.sh <path-to-deepinfer> [<shared-dir>]
BIN=${1:?usage: test_batch.sh <path-to-deepinfer>}
MODEL=tests/data/v2_lite
TOKJSON=tests/data/tokenizer/variants/split_removed_invert.json
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$TOKJSON" ]; then
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
TOK="$TMP/tok"
mkdir -p "$TOK"
cp "$TOKJSON" "$TOK/tokenizer.json"
cat >"$TOK/tokenizer_config.json" <<'JSON'
{"bos_token": "a", "eos_token": "b",
 "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"}
JSON

# q FILE PYTHON-EXPR: evaluates EXPR with `by` = {custom_id: result line} of FILE (lines keyed
# by their input line, i.e. without a custom_id of their own, under their "batch_req_lineN" id).
q() {
    python3 - "$1" "$2" <<'PY'
import json, sys
by = {}
for line in open(sys.argv[1], encoding="utf-8"):
    o = json.loads(line)
    by[o["id"] if o["id"].startswith("batch_req_line") else o["custom_id"]] = o
def ids(k, i=0):
    return " ".join(map(str, body(k)["choices"][i]["token_ids"]))
def body(k):
    return by[k]["response"]["body"]
def count(k):
    return sum(1 for l in open(sys.argv[1]) if json.loads(l)["custom_id"] == k)
def chat_lp(k):
    c = body(k)["choices"][0]["logprobs"]["content"]
    return f"{len(c)} {len(c[0]['top_logprobs'])}"
def err(k):
    return by[k]["error"]["code"] if by[k]["response"] is None else "ok"
print(eval(sys.argv[2]), end="")
PY
}
# norm FILE: the results sorted by (custom_id, id), without the "created" times.
norm() {
    python3 - "$1" <<'PY'
import json, sys
rows = []
for line in open(sys.argv[1], encoding="utf-8"):
    o = json.loads(line)
    if o.get("response"):
        o["response"]["body"].pop("created", None)
    rows.append(json.dumps(o, sort_keys=True))
rows.sort()
print("\n".join(rows))
PY
}
gen_ids() { "$BIN" generate --model "$MODEL" --format json "$@" |
    python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["ids"])), end="")'; }

# ---- 1. mixed requests and error lines -------------------------------------------------------
IN="$TMP/in.jsonl"
{
    echo '{"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": "hello world", "max_tokens": 6, "temperature": 0}}'
    echo '{"custom_id": "ids", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0, "logprobs": 2}}'
    echo '{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hello world"}], "max_completion_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 1}}'
    echo '{"custom_id": "multi", "method": "POST", "url": "/v1/completions", "body": {"prompt": [[5, 6, 7], [9, 8]], "max_tokens": 4, "temperature": 0}}'
    echo '{"custom_id": "eos", "method": "POST", "url": "/v1/completions", "body": {"prompt": [4, 4], "max_tokens": 30, "temperature": 0, "ignore_eos": true, "seed": 3}}'
    echo 'this is not json'
    echo '{"custom_id": "bad_url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}'
    echo '{"custom_id": "no_body", "method": "POST", "url": "/v1/completions"}'
    echo '{"custom_id": "too_long", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "max_tokens": 250}}'
    echo '{"custom_id": "zero_max", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 0}}'
    printf '{"custom_id": "not_utf8", "method": "POST", "url": "/v1/completions", "body": {"prompt": "\xff\xfe"}}\n'
    echo '{"custom_id": "bad_top_p", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "top_p": 7}}'
    echo '{"custom_id": "unknown_field", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "temprature": 0}}'
    echo '{"custom_id": "bad_id", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 4000]}}'
    echo '{"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"prompt": "again"}}'
    echo ''
} >"$IN"
OUT="$TMP/out.jsonl"
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$IN" --output "$OUT" --progress-interval 0 \
    2>"$TMP/err1"
check "batch exits 0 with error lines in the input" "0" "$?"
check "one line per request (blank lines skipped)" "15" "$(wc -l <"$OUT" | tr -d ' ')"
check "text prompt == generate --prompt" \
    "$(gen_ids --tokenizer "$TOK" --prompt "hello world" --max-tokens 6)" "$(q "$OUT" 'ids("text")')"
check "text output == generate text" \
    "$("$BIN" generate --model "$MODEL" --tokenizer "$TOK" --prompt "hello world" --max-tokens 6 --format json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["text"], end="")')" \
    "$(q "$OUT" 'body("text")["choices"][0]["text"]')"
check "ids prompt == generate --ids" "$(gen_ids --ids "1 2 3" --max-tokens 8)" "$(q "$OUT" 'ids("ids")')"
check "chat == generate --chat" \
    "$(gen_ids --tokenizer "$TOK" --prompt "hello world" --chat --max-tokens 6)" "$(q "$OUT" 'ids("chat")')"
check "several prompts: one choice each, in order" \
    "$(gen_ids --ids "5 6 7" --max-tokens 4)|$(gen_ids --ids "9 8" --max-tokens 4)" \
    "$(q "$OUT" 'ids("multi", 0) + "|" + ids("multi", 1)')"
check "ignore_eos runs to max_tokens" "30 length" \
    "$(q "$OUT" 'str(len(body("eos")["choices"][0]["token_ids"])) + " " + body("eos")["choices"][0]["finish_reason"]')"
check "object kinds and model names" "text_completion tiny chat.completion v2_lite assistant" \
    "$(q "$OUT" '" ".join([body("text")["object"], body("text")["model"], body("chat")["object"], body("chat")["model"], body("chat")["choices"][0]["message"]["role"]])')"
check "usage" "3 8 11 0" \
    "$(q "$OUT" '" ".join(str(body("ids")["usage"][k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens")) + " " + str(body("ids")["usage"]["prompt_tokens_details"]["cached_tokens"])')"
# (top_logprobs dicts are keyed by token text, so two tokens with one text share an entry)
check "completion logprobs shape" "8 8 8 8 True" \
    "$(q "$OUT" '(lambda l: " ".join(map(str, (len(l["tokens"]), len(l["token_logprobs"]), len(l["text_offset"]), len(l["top_logprobs"]), all(1 <= len(t) <= 2 for t in l["top_logprobs"])))))(body("ids")["choices"][0]["logprobs"])')"
check "chat logprobs shape" "6 1" \
    "$(q "$OUT" 'chat_lp("chat")')"
check "status 200 and error null on successes" "True" \
    "$(q "$OUT" 'all(by[k]["response"]["status_code"] == 200 and by[k]["error"] is None for k in ("text", "ids", "chat", "multi", "eos"))')"
check "error kinds" \
    "invalid_json_line invalid_url missing_required_parameter context_length_exceeded invalid_parameter invalid_utf8 invalid_parameter unknown_parameter invalid_prompt duplicate_custom_id" \
    "$(q "$OUT" '" ".join([err("batch_req_line6"), err("bad_url"), err("no_body"), err("too_long"), err("zero_max"), err("batch_req_line11"), err("bad_top_p"), err("unknown_field"), err("bad_id"), err("batch_req_line15")])')"
check "unknown field is named" "1" "$(grep -c '"temprature\\"' "$OUT")"
check "each custom_id once (the duplicate keyed by line)" "text:2 ids:1 chat:1" \
    "$(q "$OUT" '" ".join(f"{k}:{count(k)}" for k in ("text", "ids", "chat"))')"
check "non-tty progress lines" "yes yes" \
    "$(grep -q '^batch: .*/15 requests done' "$TMP/err1" && echo yes || echo no) $(grep -q '^batch: finished 15 requests' "$TMP/err1" && echo yes || echo no)"

# Stop strings: cut the greedy text of "text" at one of its characters.
stop=$(q "$OUT" '(lambda t: t[len(t) // 2] if len(t) > 1 else "")(body("text")["choices"][0]["text"])')
if [ -n "$stop" ]; then
    python3 - "$stop" >"$TMP/stop.jsonl" <<'PY'
import json, sys
print(json.dumps({"custom_id": "s", "method": "POST", "url": "/v1/completions",
                  "body": {"prompt": "hello world", "max_tokens": 6, "temperature": 0,
                           "stop": [sys.argv[1]]}}))
PY
    "$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$TMP/stop.jsonl" --output "$TMP/stop_out.jsonl" --quiet
    want=$(q "$OUT" 'body("text")["choices"][0]["text"]' | python3 -c 'import sys; t = sys.stdin.read(); print(t[:t.index(sys.argv[1])], end="")' "$stop")
    check "stop string cuts the text, finish_reason stop" "$want|stop" \
        "$(q "$TMP/stop_out.jsonl" 'body("s")["choices"][0]["text"] + "|" + body("s")["choices"][0]["finish_reason"]')"
fi

# prompt_logprobs (vLLM's extra field): on the completion choice, [null, {"<id>": ...}, ...],
# the same numbers as `deepinfer generate --prompt-logprobs`; on the chat body.
PLP="$TMP/plp.jsonl"
{
    echo '{"custom_id": "p", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0, "prompt_logprobs": 2}}'
    echo '{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2, "prompt_logprobs": 0}}'
} >"$PLP"
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$PLP" --output "$TMP/plp_out.jsonl" --quiet
check "prompt_logprobs lines succeed" "0 ok ok" "$? $(q "$TMP/plp_out.jsonl" 'err("p") + " " + err("c")')"
check "prompt_logprobs on the choice: null first, then the prompt token (+ top 2)" "4 None 6 7 8 True" \
    "$(q "$TMP/plp_out.jsonl" '(lambda l: " ".join(map(str, [len(l), l[0]] + [next(iter(x)) for x in l[1:]] + [all(2 <= len(x) <= 3 for x in l[1:])])))(body("p")["choices"][0]["prompt_logprobs"])')"
check "prompt_logprobs == generate --prompt-logprobs" \
    "$("$BIN" generate --model "$MODEL" --ids "5 6 7 8" --max-tokens 3 --prompt-logprobs 2 --format json |
        python3 -c 'import json,sys; print([{k: round(v["logprob"], 4) for k, v in x.items()} for x in json.load(sys.stdin)["prompt_logprobs"][1:]])')" \
    "$(q "$TMP/plp_out.jsonl" '[{k: round(v["logprob"], 4) for k, v in x.items()} for x in body("p")["choices"][0]["prompt_logprobs"][1:]]')"
check "chat: prompt_logprobs on the body" "None True" \
    "$(q "$TMP/plp_out.jsonl" '(lambda l: str(l[0]) + " " + str(len(l) > 1 and all(len(x) == 1 for x in l[1:])))(body("c")["prompt_logprobs"])')"

# A rerun on the complete output adds nothing.
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$IN" --output "$OUT" 2>"$TMP/err2"
check "rerun on a complete output adds nothing" "0 15" "$? $(wc -l <"$OUT" | tr -d ' ')"

# ---- 2. kill -9 mid-run, then resume -----------------------------------------------------------
BIG="$TMP/big.jsonl"
python3 - "$BIG" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(160):
        body = {"prompt": [(i * 7 + k) % 300 + 2 for k in range(1 + i % 5)], "max_tokens": 120,
                "ignore_eos": True}
        body.update({"temperature": 0} if i % 2 else {"temperature": 0.9, "seed": i})
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": body}) + "\n")
PY
REF="$TMP/ref.jsonl"
"$BIN" batch --model "$MODEL" --input "$BIG" --output "$REF" --max-running 4 --quiet
check "uninterrupted run" "0 160" "$? $(wc -l <"$REF" | tr -d ' ')"
RES="$TMP/res.jsonl"
"$BIN" batch --model "$MODEL" --input "$BIG" --output "$RES" --max-running 4 --quiet &
pid=$!
for _ in $(seq 1 400); do
    [ -f "$RES" ] && [ "$(wc -l <"$RES")" -ge 8 ] && break
    sleep 0.01
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
n_killed=$(wc -l <"$RES" | tr -d ' ')
echo "     (killed with $n_killed of 160 lines written)"
"$BIN" batch --model "$MODEL" --input "$BIG" --output "$RES" --max-running 4 --quiet
check "resumed run exits 0" "0" "$?"
check "after kill -9 + rerun: every custom_id exactly once" "160 160" \
    "$(wc -l <"$RES" | tr -d ' ') $(q "$RES" 'len(by)')"
check "after kill -9 + rerun: results identical to an uninterrupted run" "$(norm "$REF")" "$(norm "$RES")"

# A truncated last line (what a kill in the middle of a write would leave) is cut and redone.
CUT="$TMP/cut.jsonl"
head -n 50 "$REF" >"$CUT"
sed -n 51p "$REF" | head -c 100 >>"$CUT"
"$BIN" batch --model "$MODEL" --input "$BIG" --output "$CUT" --max-running 4 --progress-interval 0 2>"$TMP/err3"
check "truncated last line: reported" "1" "$(grep -c 'incomplete last line' "$TMP/err3")"
check "truncated last line: resumes from 50" "1" "$(grep -c 'resuming: 50 of 160' "$TMP/err3")"
check "truncated last line: results identical" "$(norm "$REF")" "$(norm "$CUT")"

# ---- 3. command-line failures ------------------------------------------------------------------
"$BIN" batch --model "$MODEL" --input "$IN" --output "$TMP/no/such/dir/out.jsonl" >"$TMP/o" 2>"$TMP/e"
check "unwritable output fails at start" "1 1 0" \
    "$? $(grep -c 'cannot open for writing' "$TMP/e") $(wc -c <"$TMP/o" | tr -d ' ')"
"$BIN" batch --model "$MODEL" --input "$IN" --output "$TMP/x.jsonl" --kv-memory 12Q >/dev/null 2>&1
check "bad --kv-memory is a usage error" "2" "$?"
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$IN" --output "$TMP/x.jsonl" --kv-memory 64M --max-batch-tokens 64 \
    --max-running 2 --threads 1 --quiet
check "--kv-memory 64M --max-batch-tokens --max-running --threads" "0 15" "$? $(wc -l <"$TMP/x.jsonl" | tr -d ' ')"
check "same results with other engine limits" "$(norm "$OUT")" "$(norm "$TMP/x.jsonl")"
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$IN" --output "$TMP/d.jsonl" --disaggregate \
    --threads 2 --prefill-threads 1 --max-prefill-tokens 4 --progress-interval 0 2>"$TMP/err4"
check "--disaggregate --prefill-threads 1" "0 15" "$? $(wc -l <"$TMP/d.jsonl" | tr -d ' ')"
check "--disaggregate: same results as the unified engine" "$(norm "$OUT")" "$(norm "$TMP/d.jsonl")"
check "--disaggregate: worker stats reported" "1" \
    "$(grep -Ec '^batch: prefill worker [1-9][0-9]* steps, [0-9.]+ s busy; decode worker [1-9][0-9]* steps' "$TMP/err4")"
"$BIN" batch --model "$MODEL" --input "$IN" --output "$TMP/z.jsonl" --prefill-threads 1 >/dev/null 2>"$TMP/e"
check "--prefill-threads without --disaggregate is a usage error" "2 1" "$? $(grep -c 'needs --disaggregate' "$TMP/e")"
"$BIN" batch --model "$MODEL" --tokenizer "$TOK" --input "$IN" --output "$TMP/o.jsonl" --overlap --quiet
check "--overlap (the CPU's compute-thread loop)" "0 15" "$? $(wc -l <"$TMP/o.jsonl" | tr -d ' ')"
check "--overlap: same results as the plain loop" "$(norm "$OUT")" "$(norm "$TMP/o.jsonl")"
"$BIN" batch --model "$MODEL" --input "$IN" --output "$TMP/z.jsonl" --overlap --disaggregate >/dev/null 2>"$TMP/e"
check "--overlap with --disaggregate is a usage error" "2 1" "$? $(grep -c 'exclude each other' "$TMP/e")"
"$BIN" batch --model "$MODEL" --input "$IN" --output "$TMP/z.jsonl" --overlap --no-overlap >/dev/null 2>"$TMP/e"
check "--overlap with --no-overlap is a usage error" "2 1" "$? $(grep -c 'exclude each other' "$TMP/e")"
"$BIN" batch --model "$MODEL" --input "$IN" --output "$IN" >/dev/null 2>&1
check "output == input is refused" "2" "$?"
"$BIN" batch --model "$MODEL" --input "$TMP/none.jsonl" --output "$TMP/y.jsonl" >/dev/null 2>&1
check "missing input fails" "1" "$?"

finish
