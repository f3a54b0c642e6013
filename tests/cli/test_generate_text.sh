#!/usr/bin/env bash
# test_generate_text.sh -- `deepinfer generate --prompt` and `--chat`: the text path through
# the tokenizer and the chat template must give exactly what the id path gives for the ids
# that `deepinfer tokenize` / `chat-template` produce, and the JSON "text" must equal
# `deepinfer detokenize` of the generated ids (special tokens skipped).
#
# The golden models have tiny vocabularies, so the tokenizer used is a small byte-level BPE
# (256 ids) from the tokenizer goldens, which fits inside v2_lite's 400-id vocabulary.
#
# usage: bash tests/cli/test_generate_text.sh <path-to-deepinfer> [<shared-dir>]
BIN=${1:?usage: test_generate_text.sh <path-to-deepinfer>}
MODEL=tests/data/v2_lite
TOKJSON=tests/data/tokenizer/variants/split_removed_invert.json
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$TOKJSON" ]; then
    echo "FAIL committed test data absent: $MODEL or $TOKJSON"
    echo "0 passed, 1 failed"
    exit 1
fi
field() { python3 -c "import json,sys; v=json.load(sys.stdin)['$1']; print(' '.join(map(str,v)) if isinstance(v,list) else v, end='')"; }

# Plain prompt: same ids as tokenizing then generating from ids.
ids=$("$BIN" tokenize --tokenizer "$TOKJSON" --text "hello world")
a=$("$BIN" generate --model "$MODEL" --tokenizer "$TOKJSON" --prompt "hello world" --max-tokens 6 --format json)
b=$("$BIN" generate --model "$MODEL" --ids "$ids" --max-tokens 6 --format json)
check "prompt ids == tokenized ids" "$(echo "$b" | field ids)" "$(echo "$a" | field ids)"
gen=$(echo "$a" | field ids)
check "json text == detokenize" "$("$BIN" detokenize --tokenizer "$TOKJSON" --ids "$gen")" "$(echo "$a" | field text)"

# Chat: a folder with the tokenizer and a tokenizer_config.json holding a chat template.
mkdir -p "$TMP/tok"
cp "$TOKJSON" "$TMP/tok/tokenizer.json"
cat >"$TMP/tok/tokenizer_config.json" <<'JSON'
{"bos_token": "a", "eos_token": "b",
 "chat_template": "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"}
JSON
echo '[{"role": "user", "content": "hello world"}]' >"$TMP/msgs.json"
rendered=$("$BIN" chat-template --model "$TMP/tok" --messages "$TMP/msgs.json" --add-generation-prompt)
check "chat template render" "a<user>hello world<assistant>" "$rendered"
cids=$("$BIN" tokenize --tokenizer "$TMP/tok/tokenizer.json" --text "$rendered")
c=$("$BIN" generate --model "$MODEL" --tokenizer "$TMP/tok" --prompt "hello world" --chat --max-tokens 6 --format json)
d=$("$BIN" generate --model "$MODEL" --ids "$cids" --max-tokens 6 --format json)
check "chat ids == rendered+tokenized ids" "$(echo "$d" | field ids)" "$(echo "$c" | field ids)"
check "chat prompt tokens" "$(echo "$cids" | wc -w)" "$(echo "$c" | python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"], end="")')"

# Constrained generation: the bundled model's output follows the grammar, given as text and
# as a file; a bad grammar fails naming the place.
BUNDLED=models/deepseek-v4-tiny
g=$("$BIN" generate --model "$BUNDLED" --prompt "Install it with" --max-tokens 40 --temperature 0.8 \
    --seed 7 --grammar 'root ::= "apt-get install " [a-z]+ ("-" [a-z0-9]+)? "." ' --format json)
gt=$(echo "$g" | field text)
check "grammar: text follows it" "yes stop" \
    "$(echo "$gt" | grep -Eqx 'apt-get install [a-z]+(-[a-z0-9]+)?\.' && echo yes || echo no) $(echo "$g" | field finish_reason)"
printf 'root ::= ("yes" | "no") "!"\n' >"$TMP/yn.gbnf"
g=$("$BIN" generate --model "$BUNDLED" --prompt "Is it?" --max-tokens 10 --grammar-file "$TMP/yn.gbnf" --format json)
check "grammar file: one of its sentences" "yes" "$(echo "$g" | field text | grep -Eqx '(yes|no)!' && echo yes || echo no)"
"$BIN" generate --model "$BUNDLED" --prompt "x" --grammar 'root ::= item' >"$TMP/out" 2>"$TMP/err"
check "bad grammar fails naming the rule" "1 yes" "$? $(grep -q 'line 1:10: undefined rule "item"' "$TMP/err" && echo yes || echo no)"

# Errors: no tokenizer in the model folder; --chat without --prompt.
"$BIN" generate --model "$MODEL" --prompt "hi" >"$TMP/out" 2>"$TMP/err"
rc=$?
check "missing tokenizer.json fails naming it" "1 yes 0" "$rc $(grep -q 'tokenizer.json' "$TMP/err" && echo yes || echo no) $(wc -c <"$TMP/out")"
"$BIN" generate --model "$MODEL" --chat --ids "1 2" >"$TMP/out" 2>"$TMP/err"
check "--chat without --prompt is a usage error" "2" "$?"

finish
