#!/usr/bin/env python3
"""make_tok_goldens.py -- golden encodings for the tokenizer tests, from Hugging Face `tokenizers`.

Writes tests/data/tokenizer/:
  deepseek_v3.jsonl   one case per line for ../shared/tokenizers/deepseek-v3/tokenizer.json:
                      {"text", ["hex"], "ids", "ids_bos", "dec", "dec_skip"}
                      text  = the input as HF saw it. When "hex" is present the C test feeds
                              those raw bytes instead (invalid UTF-8); text is then
                              bytes.decode("utf-8", errors="replace") of them.
                      ids   = encode(text, add_special_tokens=False) with tokenizer.json
                      ids_bos = with add_special_tokens=True after applying the model folder's
                              tokenizer_config.json as transformers 4.x LlamaTokenizerFast does
                              (TemplateProcessing "<bos> $A"); omitted when equal to [0] + ids.
                      dec / dec_skip = decode(ids_bos) without / with skip_special_tokens;
                              omitted when equal to the obvious value (text / bos + text).
  variants/<name>.json + <name>.jsonl   small BPE tokenizers trained here, each with another
                      normalizer-free pipeline (Split behaviours, invert, Digits, ByteLevel
                      with prefix space / GPT-2 regex, TemplateProcessing, added tokens with
                      lstrip / rstrip / single_word, ignore_merges, merges as pairs).
Deterministic: fixed seeds, no network. Rerun after changing the text set.
"""
import json, os, random, sys
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, processors, decoders, Regex, AddedToken

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("DI_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
BOS = "<｜begin▁of▁sentence｜>"

FRAGMENTS = [
    "Hello, world!", " Hello World", "hello   world\n", "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。", "我爱北京天安门", "日本語のテキスト、ひらがなとカタカナ。東京タワー", "ｶﾀｶﾅ半角",
    "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир! Ёжик",
    "Γειά σου Κόσμε", "Tiếng Việt có dấu", "Vieết Nam", "résumé café naïve", "e\u0301 (NFD)", "Äpfel Führer",
    "def f(x):\n    return x ** 2\n", "int main(void) { return 0; }\n", "fn main() { println!(\"hi\"); }",
    "SELECT * FROM t WHERE a = 'b';", "const x = () => { console.log(`${a}`); };", "<div class=\"a\">&amp;</div>",
    "#include <stdio.h>\n\tprintf(\"%d\\n\", 42);", "    if x:\n\t\tpass\r\n", "a\u00a0b\u2003c\u3000d",
    "👨‍👩‍👧‍👦 family", "🇺🇸🇯🇵🇫🇷 flags", "👍🏽👍🏿 skin", "🦙.cpp", "❤️‍🔥", "∑∫√∞ ≠ ≤",
    "1234567890", "3.14159265358979", "1,000,000 and 12ab34", "٣٤٥ ١٢", "Ⅻ ½ ²",
    "I'm you're he's we've they'll I'd don't", "HE'S SHE'LL IT'S", "'s 't 're 've 'm 'll 'd",
    "   ", "\t\t", "\n\n\n", "\r\n\r\n", " \n \n", "a  b   c    d", "trailing spaces   ",
    BOS, "<｜end▁of▁sentence｜>", "<｜User｜>hi<｜Assistant｜>", "<｜begin▁of", "▁of▁sentence｜>",
    "<|im_start|>", "<｜tool▁calls▁begin｜>", "<think>x</think>", "<｜｜>", "<<｜User｜>>",
]

def invalid_byte_cases():
    return [b"\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xf0\x9f\x98",
            b"\xf0\x9f\x98\x80\xf0\x9f", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
            b"\xfe\xfe\xff\xff", b"ok\xe4\xbd\xa0\xe5\xa5", "你好".encode() + b"\x80\x80" + "世界".encode(),
            b"\xe0\x80\x80", b"\xf5\x80", b"<\xef\xbd\x9cUser\xef\xbd\x9c>\xff", b"\x00\x01\x7f"]

def make_texts(rng):
    texts = [f for f in FRAGMENTS] + [""]
    for _ in range(400):  # random mixtures
        k = rng.randint(1, 6)
        texts.append(rng.choice(["", " ", "\n", "  "]).join(rng.choice(FRAGMENTS) for _ in range(k)))
    texts += ["a" * 10000, "9" * 10000, "中" * 3000, " " * 5000, "ab" * 5000 + " end",
              "x" * 300 + "'s" * 50, "\U0001F600" * 2000]
    alphabet = [chr(c) for c in list(range(32, 127)) + [0xe9, 0x4e2d, 0x3042, 0xac00, 0x0627, 0x1f600, 0x200d, 0xa0, 0x3000, 0x2028]]
    for _ in range(200):  # random character soup
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    return texts

def prompt_texts():
    out = []
    pdir = os.path.join(SHARED, "prompts")
    for name in sorted(os.listdir(pdir)):
        if not name.endswith(".jsonl"):
            continue
        for line in open(os.path.join(pdir, name), encoding="utf-8"):
            row = json.loads(line)
            out += row.get("turns", [])
            if row.get("reference"):
                out += [r for r in row["reference"] if isinstance(r, str)] if isinstance(row["reference"], list) else [row["reference"]]
    return out

def conformance_texts():
    p = os.path.join(SHARED, "conformance", "tokenizer-vectors", "deepseek-v3.lenml-generated.inp")
    return open(p, encoding="utf-8").read().split("\n__ggml_vocab_test__\n")[:-1]

def deepseek_goldens(rng):
    path = os.path.join(SHARED, "tokenizers", "deepseek-v3", "tokenizer.json")
    tok = Tokenizer.from_file(path)
    bos = Tokenizer.from_file(path)  # what transformers 4.x LlamaTokenizerFast builds
    bos.post_processor = processors.TemplateProcessing(single=BOS + " $A:0", pair=BOS + " $A:0 " + BOS + " $B:1",
                                                       special_tokens=[(BOS, 0)])
    cases = [(t, None) for t in make_texts(rng) + conformance_texts() + prompt_texts()]
    cases += [(b.decode("utf-8", errors="replace"), b) for b in invalid_byte_cases()]
    rows = []
    for text, raw in cases:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_bos = bos.encode(text).ids
        row = {"text": text, "ids": ids}
        if raw is not None:
            row["hex"] = raw.hex()
        if ids_bos != [0] + ids:
            row["ids_bos"] = ids_bos
        dec, dec_skip = tok.decode(ids_bos, skip_special_tokens=False), tok.decode(ids_bos, skip_special_tokens=True)
        if dec != BOS + text:
            row["dec"] = dec
        if dec_skip != text:
            row["dec_skip"] = dec_skip
        rows.append(row)
    return rows

# ---- small trained variants ------------------------------------------------------------------

def train_base(texts, pre):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=800, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, tr)
    return tok

def variants(texts):
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    v = {}
    t = train_base(texts, gpt2)
    t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    t.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    t.add_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=False, normalized=False),
                  AddedToken("word", single_word=True, normalized=True), AddedToken("wordy", normalized=False)])
    v["gpt2_template_added"] = t
    t = train_base(texts, pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True))
    v["bytelevel_prefix_space"] = t
    seq = lambda *p: pre_tokenizers.Sequence(list(p) + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    v["digits_split_behaviors"] = train_base(texts, seq(pre_tokenizers.Digits(individual_digits=True),
                                                        pre_tokenizers.Split(Regex(r"\s+"), "merged_with_next"),
                                                        pre_tokenizers.Split(",", "merged_with_previous")))
    v["split_removed_invert"] = train_base(texts, seq(pre_tokenizers.Split(Regex(r"[aeiou]"), "removed", invert=True),
                                                      pre_tokenizers.Digits(individual_digits=False)))
    v["split_contiguous_isolated"] = train_base(texts, seq(pre_tokenizers.Split(Regex(r"\p{L}"), "contiguous"),
                                                           pre_tokenizers.Split(Regex(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"), "isolated")))
    t = train_base(texts, gpt2)
    d = json.loads(t.to_str())
    d["model"]["ignore_merges"] = True
    d["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in d["model"]["merges"]]
    v["ignore_merges_pairs"] = Tokenizer.from_str(json.dumps(d))
    return v

def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

def main():
    rng = random.Random(1234)
    os.makedirs(os.path.join(OUT, "variants"), exist_ok=True)
    rows = deepseek_goldens(rng)
    write_jsonl(os.path.join(OUT, "deepseek_v3.jsonl"), rows)
    rng = random.Random(99)
    texts = make_texts(rng)[:300]
    probe = texts[:200] + ["<mask> hi  <mask>  x", "a word wordy swordy word.", "<s>x</s>", "12 345 6789", ""]
    probe += [b.decode("utf-8", errors="replace") for b in invalid_byte_cases()]
    for name, tok in variants(texts).items():
        tok.save(os.path.join(OUT, "variants", name + ".json"))
        vrows = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids, "ids_special": tok.encode(t).ids,
                  "dec": tok.decode(tok.encode(t).ids, skip_special_tokens=False)} for t in probe]
        write_jsonl(os.path.join(OUT, "variants", name + ".jsonl"), vrows)
    print(f"{len(rows)} deepseek cases, {len(probe)} cases x {len(variants(texts))} variants", file=sys.stderr)

if __name__ == "__main__":
    main()
