"""The Python binding (python/deepinfer) against the deepinfer program on the bundled model.

The program and the binding both drive the C engine, so for the same prompt and sampling
parameters they must give the same tokens and text: greedy, seeded sampling with n = 2, stop
strings and constrained generation. This also checks that the ctypes structures match the
header (a shifted field would change what the engine receives). Errors come back as
DeepInferError with the library's message.

usage: python3 tests/python/test_binding.py <path-to-deepinfer> <path-to-libdeepinfer.so>
       (DI_PY_DEVICE=cuda runs both on the GPU)
"""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(REPO, "models", "deepseek-v4-tiny")
BIN, LIB = sys.argv[1], sys.argv[2]
DEVICE = os.environ.get("DI_PY_DEVICE", "cpu")
os.environ["DEEPINFER_LIB"] = LIB
sys.path.insert(0, os.path.join(REPO, "python"))
import deepinfer  # noqa: E402
from deepinfer import LLM, SamplingParams, DeepInferError  # noqa: E402

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok   " + name)
    else:
        failed += 1
        print("FAIL " + name + (": " + detail if detail else ""))


def cli(*args):
    out = subprocess.run([BIN, "generate", "--model", MODEL, "--device", DEVICE, "--format",
                          "json"] + list(args),
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


llm = LLM(MODEL, device=DEVICE, n_threads=2)

# Greedy from a text prompt.
o = llm.generate("The Debian project", SamplingParams(temperature=0, max_tokens=24))[0]
c = cli("--prompt", "The Debian project", "--max-tokens", "24")
check("greedy text prompt: same ids as the program", o.outputs[0].token_ids == c["ids"],
      "%s vs %s" % (o.outputs[0].token_ids, c["ids"]))
check("greedy text prompt: same text", o.outputs[0].text == c["text"])
check("prompt token ids from the tokenizer", o.prompt_token_ids == llm.get_tokenizer().encode(
    "The Debian project", add_special_tokens=True) and len(o.prompt_token_ids) > 2)

# Seeded sampling, two completions, from token ids.
ids = llm.get_tokenizer().encode("apt-get install", add_special_tokens=True)
sp = SamplingParams(n=2, temperature=0.8, top_p=0.9, top_k=40, seed=7, max_tokens=20)
o = llm.generate([ids], sp)[0]
c = cli("--ids", " ".join(map(str, ids)), "--n", "2", "--temperature", "0.8", "--top-p", "0.9",
        "--top-k", "40", "--seed", "7", "--max-tokens", "20")
cli_ids = [ch["ids"] for ch in c["choices"]] if "choices" in c else [c["ids"]]
check("seeded n=2: same ids as the program", [x.token_ids for x in o.outputs] == cli_ids,
      "%s vs %s" % ([x.token_ids for x in o.outputs], cli_ids))
check("seed reported", all(x.seed == 7 for x in o.outputs))

# Stop strings and penalties reach the engine.
o = llm.generate("Linux", SamplingParams(temperature=0, max_tokens=40, stop=[" the"],
                                         repetition_penalty=1.3))[0]
c = cli("--prompt", "Linux", "--max-tokens", "40", "--stop", " the", "--repetition-penalty", "1.3")
check("stop string and penalty: same text as the program",
      o.outputs[0].text == c["text"] and o.outputs[0].finish_reason == c["finish_reason"],
      "%r/%s vs %r/%s" % (o.outputs[0].text, o.outputs[0].finish_reason, c["text"],
                          c["finish_reason"]))

# Constrained generation: a JSON schema given as a dict.
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
o = llm.generate(["Result:", "Status:"], SamplingParams(temperature=0.7, seed=3, max_tokens=60,
                                                         json_schema=schema))
for k, r in enumerate(o):
    t = r.outputs[0].text
    if r.outputs[0].finish_reason == "stop":
        doc = json.loads(t)
        check("json_schema %d: a valid document" % k,
              list(doc) == ["name", "ok"] and isinstance(doc["ok"], bool), t)
    else:
        check("json_schema %d: ran to the length limit" % k, r.outputs[0].finish_reason == "length")
o = llm.generate("Answer:", SamplingParams(temperature=0, max_tokens=10, regex="(yes|no)!"))[0]
check("regex: one of its matches", o.outputs[0].text in ("yes!", "no!"), o.outputs[0].text)

# Errors carry the library's message.
try:
    llm.generate("x", SamplingParams(grammar="root ::= item"))
    check("bad grammar raises", False)
except DeepInferError as e:
    check("bad grammar raises with the place", 'undefined rule "item"' in str(e), str(e))
try:
    SamplingParams(top_p=1.5)._to_c([])
    check("bad top_p raises", False)
except DeepInferError as e:
    check("bad top_p raises naming it", "top_p" in str(e), str(e))
try:
    LLM("/nonexistent/model")
    check("missing model raises", False)
except DeepInferError as e:
    check("missing model raises naming the folder", "/nonexistent/model" in str(e), str(e))

llm.close()
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
