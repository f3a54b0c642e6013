#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer of the bundled tiny model and pre-tokenize the corpus.

Usage: python3 tools/train/train_tokenizer.py [--data .train-data] [--model models/deepseek-v4-tiny]
                                               [--vocab 6144]

Inputs: <data>/train.jsonl.xz, <data>/val.jsonl.xz (tools/train/prepare_corpus.py).
Outputs:
  <model>/tokenizer.json, <model>/tokenizer_config.json
  <data>/train.u16, <data>/val.u16   token ids (little-endian uint16) of every document as
                                     [BOS] text [EOS], documents in corpus order
  <data>/tokens_manifest.json        counts and sha256 of the token files

Design stance: the same *structure* as DeepSeek-V3's tokenizer (data copied from
../shared/tokenizers/deepseek-v3/tokenizer.json): no normaliser; pre-tokenizer = Split on
digit runs of 1-3, Split on CJK runs, Split on the GPT-style regex, then ByteLevel without its own
regex; ByteLevel decoder. BOS: a TemplateProcessing post-processor "<bos> $A" in tokenizer.json and add_bos_token
true in tokenizer_config.json (tokenizer_class PreTrainedTokenizerFast: transformers 5.17 loads
a LlamaTokenizerFast-class tokenizer.json with a Llama-style pre-tokenizer of its own, which breaks
byte-level BPE, and adds no BOS; the class used here keeps tokenizer.json as it is). Both paths add
exactly one BOS.
Special tokens take ids 0..4: <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>,
<｜User｜>, <｜Assistant｜>. Training is deterministic: documents are fed in a fixed order, one
thread is not required (the BPE trainer's merge order is a pure function of the counts, ties
broken by the pair's byte order), and the script checks the result against a second run when
--check is given.
"""

import argparse
import hashlib
import json
import lzma
import os

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, PAD, USER, ASSISTANT = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
)
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT]

# DeepSeek-V3's pre-tokenizer regexes (tokenizer.json "pre_tokenizer"), verbatim.
RE_DIGITS = r"\p{N}{1,3}"
RE_CJK = r"[一-龥぀-ゟ゠-ヿ]+"
RE_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
    r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# DeepSeek's chat format (V3 template without tool calls: this vocabulary has no tool tokens).
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}"
    "{% set ns.is_first_sp = false %}{%- else %}"
    "{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- endfor -%}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}"
)


def build_tokenizer():
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(RE_DIGITS), behavior="isolated", invert=False),
            pre_tokenizers.Split(Regex(RE_CJK), behavior="isolated", invert=False),
            pre_tokenizers.Split(Regex(RE_WORDS), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    return tok


def read_docs(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train(docs, vocab):
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def tokenizer_config(max_len):
    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}

    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": added(BOS),
        "eos_token": added(EOS),
        "pad_token": added(PAD),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": max_len,
        "sp_model_kwargs": {},
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def encode_docs(tok, docs):
    enc = tok.encode_batch(docs, add_special_tokens=False)
    out = []
    for e in enc:
        out.append(0)
        out.extend(e.ids)
        out.append(1)
    return np.asarray(out, dtype="<u2")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.normpath(os.path.join(here, "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(root, ".train-data"))
    ap.add_argument("--model", default=os.path.join(root, "models", "deepseek-v4-tiny"))
    ap.add_argument("--vocab", type=int, default=6144)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--check", action="store_true", help="train twice and require identical vocab/merges")
    args = ap.parse_args()

    train_docs = read_docs(os.path.join(args.data, "train.jsonl.xz"))
    val_docs = read_docs(os.path.join(args.data, "val.jsonl.xz"))
    tok = train(train_docs, args.vocab)
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    js = tok.to_str()
    if args.check:
        again = train(train_docs, args.vocab).to_str()
        assert again == js, "tokenizer training is not deterministic"
        print("determinism check: second training run is identical")

    os.makedirs(args.model, exist_ok=True)
    # V3 marks <｜User｜>/<｜Assistant｜> as non-special added tokens; here all five are special
    # so that decode(skip_special_tokens=True) drops the chat markers too.
    obj = json.loads(js)
    with open(os.path.join(args.model, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(args.model, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(args.max_len), f, ensure_ascii=False, indent=2)
        f.write("\n")

    man = {"vocab_size": args.vocab, "tokenizer_sha256": hashlib.sha256(js.encode()).hexdigest()}
    for split, docs in (("train", train_docs), ("val", val_docs)):
        ids = encode_docs(tok, docs)
        path = os.path.join(args.data, f"{split}.u16")
        ids.tofile(path)
        chars = sum(len(d) for d in docs)
        man[split] = {"tokens": int(ids.size), "docs": len(docs), "chars": chars,
                      "chars_per_token": chars / ids.size, "sha256": hashlib.sha256(ids.tobytes()).hexdigest()}
        print(f"{split}: {len(docs)} docs, {ids.size} tokens ({chars / ids.size:.2f} chars/token) -> {path}")
    with open(os.path.join(args.data, "tokens_manifest.json"), "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
