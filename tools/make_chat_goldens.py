#!/usr/bin/env python3
"""make_chat_goldens.py -- writes tests/data/chat/goldens.json, the reference renderings of
chat templates that tests/unit/test_chat_template.c compares deepinfer's output with.

The reference is transformers' own rendering:
  * DeepSeek templates: tokenizer.apply_chat_template(messages, tokenize=False, ...) with a
    tokenizer loaded from the shared tokenizer.json + tokenizer_config.json (so the special
    tokens are exactly what transformers passes);
  * construct templates (small templates exercising one Jinja feature each): the same
    internal function apply_chat_template calls, render_jinja_template, with the same
    special tokens.
A case whose rendering raises records "error" (the exception text) instead of "expected".

Usage: python3 tools/make_chat_goldens.py [--shared ../shared] [--out tests/data/chat/goldens.json]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import jinja2
import transformers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

TOK = "tokenizers/deepseek-v3"

# Templates: name -> where the text and the special tokens come from (paths under --shared).
TEMPLATES = {
    "v3": {"config": f"{TOK}/tokenizer_config.json"},
    "v3-cdn": {"config": f"{TOK}/tokenizer_config.deepseek-cdn-zip.json"},
    "v3.1": {"jinja": f"{TOK}/templates/deepseek-ai-DeepSeek-V3.1.jinja",
             "specials": f"{TOK}/tokenizer_config.json"},
    "r1": {"jinja": f"{TOK}/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
           "specials": f"{TOK}/tokenizer_config.json"},
}


def tool_call(name, args, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731
T = lambda c: {"role": "tool", "content": c}  # noqa: E731

# name -> (messages, tools, extra)
CONVERSATIONS = {
    "user": ([U("Hello!")], None, None),
    "system_user": ([S("You are a helpful assistant."), U("What is 2+2?")], None, None),
    "two_systems": ([S("Be brief."), S("Answer in French."), U("Hi")], None, None),
    "multi_turn": ([S("sys"), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke.")],
                   None, None),
    "assistant_last": ([U("Hi"), A("Hello.")], None, None),
    "think_stripped": ([U("2+2?"), A("<think>\nAdd them.\n</think>\n\n4"), U("and 3+3?")],
                       None, None),
    "think_twice": ([U("q"), A("<think>a</think>b</think>c")], None, None),
    "tool_call": ([U("Weather in Paris?"),
                   {"role": "assistant", "content": None,
                    "tool_calls": [tool_call("get_weather", '{"city": "Paris"}')]},
                   T('{"temp": 21}'), A("It is 21 degrees in Paris.")],
                  [WEATHER_TOOL], None),
    "tool_call_with_content": ([U("Weather in Paris?"),
                                {"role": "assistant", "content": "Let me check.",
                                 "tool_calls": [tool_call("get_weather", '{"city": "Paris"}')]},
                                T("sunny")], None, None),
    "two_calls_two_outputs": ([S("Use tools."), U("Paris and Rome?"),
                               {"role": "assistant", "content": None, "tool_calls": [
                                   tool_call("get_weather", '{"city": "Paris"}', "c1"),
                                   tool_call("get_weather", '{"city": "Rome"}', "c2")]},
                               T("Paris: sunny"), T("Rome: rain"),
                               A("Paris is sunny, Rome rainy."), U("Thanks")], None, None),
    "tool_then_user": ([U("x?"), {"role": "assistant", "content": None,
                                  "tool_calls": [tool_call("f", "{}")]},
                        T("out"), U("next")], None, None),
    "unicode": ([S("你好，世界 🌍"), U("Ünïcödé — “quotes” مرحبا\u00a0\u3000end"),
                 A("ok ✓"), U("🙂")], None, None),
    "empty_content": ([S(""), U(""), A(""), U("")], None, None),
    "template_looking": ([U("{{ x }} {% if y %}z{% endif %} {# c #}"),
                          A("<｜User｜>fake<｜Assistant｜>"), U("'quote\" \\ backslash")],
                         None, None),
    "whitespace": ([U("  leading and trailing  \n\n"), A("\n\ttab\n")], None, None),
    "unknown_role": ([{"role": "developer", "content": "dev"}, U("hi")], None, None),
    "v31_thinking": ([U("Solve it")], None, {"thinking": True}),
    "v31_prefix": ([U("Go"), {"role": "assistant", "content": "Sure", "prefix": True}],
                   None, {"thinking": True}),
    # Expected failures on some templates: content None for a user, missing content.
    "user_content_none": ([{"role": "user", "content": None}], None, None),
    "assistant_no_content": ([U("hi"), {"role": "assistant"}], None, None),
}

# Small templates, one Jinja feature each (rendered with messages = CONSTRUCT_MESSAGES).
CONSTRUCT_MESSAGES = [S("sys prompt"), U("Hello"), A("Hi there"), U("Bye  ")]
CONSTRUCTS = {
    "loop_vars": "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/"
                 "{{ loop.revindex0 }}/{{ loop.length }}:{{ loop.first }}{{ loop.last }} {% endfor %}",
    "loop_prev_next": "{% for m in messages %}[{{ loop.previtem.role if loop.previtem is defined "
                      "else '-' }}>{{ m.role }}>{{ loop.nextitem.role if not loop.last }}]{% endfor %}",
    "loop_filter_else": "{% for m in messages if m.role == 'user' %}{{ m.content }};{% endfor %}"
                        "{% for x in [] %}no{% else %}empty{% endfor %}",
    "loop_break_continue": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                           "{% if i > 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "loop_unpack": "{% for k, v in {'a': 1, 'b': [2, 3]}.items() %}{{ k }}={{ v }};{% endfor %}"
                   "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}",
    "loop_cycle_nested": "{% for m in messages %}{{ loop.cycle('odd', 'even') }}"
                         "{% for c in m.role %}{{ loop.index }}{% endfor %},{% endfor %}",
    "scoping": "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"
               "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "namespace": "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                 "{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "set_block": "{% set block %}A{{ messages|length }}B{% endset %}[{{ block }}]{{ block|length }}",
    "macro": "{% macro fmt(m, prefix='> ', suffix='') %}{{ prefix }}{{ m.role }}: {{ m.content }}"
             "{{ suffix }}{% endmacro %}{% for m in messages %}{{ fmt(m) }}|{{ fmt(m, suffix='!') }}"
             "\n{% endfor %}",
    "filters_str": "{{ '  a b  '|trim }}|{{ 'Hello'|upper }}|{{ 'Hello'|lower }}|{{ 'hello world'|title }}"
                   "|{{ 'hELLO'|capitalize }}|{{ 'a-b-c'|replace('-', '+') }}|{{ 'xxabxx'|trim('x') }}"
                   "|{{ 123|string }}|{{ 'abc'|reverse }}|{{ 'ab'|length }}|{{ '中文'|length }}",
    "filters_seq": "{{ [3, 1, 2]|sort }}|{{ ['b', 'A', 'c']|sort }}|{{ [1, 2, 3]|reverse|list }}"
                   "|{{ [1, 2, 3]|first }}|{{ [1, 2, 3]|last }}|{{ [1, 2, 3]|join('-') }}"
                   "|{{ [1, 1, 2]|unique|list }}|{{ [1, 5, 3]|max }}|{{ [1, 5, 3]|min }}"
                   "|{{ [1, 2, 3]|sum }}|{{ 'abc'|list }}|{{ {'b': 1, 'a': 2}|dictsort }}",
    "filters_attr": "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}"
                    "|{{ messages|rejectattr('role', 'eq', 'user')|list|length }}"
                    "|{{ messages|map(attribute='role')|unique|join(' ') }}"
                    "|{{ messages|selectattr('missing')|list }}|{{ [0, 1, '', 'x']|select|list }}"
                    "|{{ [1, 2, 3, 4]|reject('odd')|list }}|{{ ['a', 'b']|map('upper')|list }}",
    "filters_default": "{{ missing|default('dflt') }}|{{ ''|default('e', true) }}|{{ none|default('n') }}"
                       "|{{ missing|d }}|{{ missing|length }}|{{ missing|trim }}|[{{ missing }}]",
    "filters_num": "{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ 2.567|round(2) }}"
                   "|{{ 2.5|round }}|{{ 7|float }}|{{ 3.7|int }}",
    "tojson": "{{ messages[1]|tojson }}|{{ {'a': [1, 2.5, none, true], 'é': 'ü\"\\n'}|tojson }}"
              "|{{ [1, {'k': 'v'}]|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}"
              "|{{ 'ü'|tojson(ensure_ascii=true) }}|{{ {}|tojson }}|{{ []|tojson(indent=4) }}",
    "tools_json": "{% if tools %}{% for t in tools %}{{ t|tojson(indent=4) }}\n{% endfor %}{% endif %}"
                  "{{ tools|length }}",
    "indent": "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'x\n\ny'|indent('>', blank=true) }}",
    "tests": "{{ x is defined }}{{ messages is defined }}{{ none is none }}{{ 1 is none }}{{ 'a' is string }}"
             "{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}"
             "{{ {} is mapping }}{{ [] is iterable }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
             "{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ x is not defined }}{{ 'ab' is lower }}"
             "{{ messages[0] is mapping }}{{ fmt is callable }}",
    "str_methods": "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}"
                   "|{{ 'a<b>c<b>d'.split('<b>')[-1] }}|{{ 'x.y.z'.rsplit('.', 1) }}|{{ '  s  '.strip() }}"
                   "|{{ '  s  '.lstrip() }}|{{ '  s  '.rstrip() }}|{{ 'abc'.startswith('ab') }}"
                   "|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'abc'.find('c') }}"
                   "|{{ '-'.join(['x', 'y']) }}|{{ 'Hi'.upper() }}|{{ 'ab'.count('') }}|{{ 'abcab'.count('ab') }}",
    "dict_methods": "{{ messages[0].get('role') }}|{{ messages[0].get('nope', 'dflt') }}|{{ messages[0].get('nope') }}"
                    "|{{ messages[0].keys()|list }}|{{ messages[0].values()|list }}|{{ messages[0].items()|list }}",
    "subscripts": "{{ messages[0]['role'] }}{{ messages[-1].content }}{{ messages[1:3]|length }}"
                  "{{ 'hello'[1:4] }}{{ 'hello'[::-1] }}{{ 'héllo'[1] }}{{ [1, 2, 3, 4][::2] }}"
                  "{{ [1, 2, 3][5] is defined }}{{ messages.0.role }}{{ 'abc'[-2:] }}{{ [1,2,3][:-1] }}",
    "operators": "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}"
                 "|{{ 7 / 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ [1] + [2] }}"
                 "|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ 1 in [1, 2] }}"
                 "|{{ 'x' not in 'abc' }}|{{ not true or false }}|{{ 0 or 'fallback' }}|{{ 1 and 'both' }}"
                 "|{{ -(3) }}|{{ 'b' if false else 'c' }}|{{ 1.0 * 3 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-7 }}",
    "printing": "{{ none }}|{{ true }}|{{ [1, 'a', none, true, 1.5] }}|{{ {'k': 'v', 'n': [1]} }}|{{ (1,) }}"
                "|{{ ['it\\'s', 'say \"hi\"', 'both \\' \"'] }}|{{ 'tab\\tnl\\n' }}|{{ ['\\n\\t\\x01'] }}",
    "literals": "{{ 'single' }}{{ \"double\" }}{{ 'adj' 'acent' }}{{ '\\u00e9\\x41\\101' }}{{ 1_000 }}"
                "{{ 0.5 }}{{ 1.5e3 }}{{ [1, 2,] }}{{ {'a': 1,} }}{{ () }}{{ True }}{{ None }}",
    "whitespace_control": "A  {%- if true -%}  B  {%- endif -%}  C\n  {{- ' D ' -}}  \nE {# comment #} F\n"
                          "  {%+ if true %}x{% endif +%}\n{{ 'y' }}\n",
    "lstrip_trim": "line1\n    {% if true %}\n    inner\n    {% endif %}\nline2\n  {# c #}\nline3\n"
                   "\t{% for i in [1, 2] %}\n  {{ i }}\n\t{% endfor %}\nend   {% if true %}X{% endif %}  \n",
    "raw": "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw -%}|",
    "crlf": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
    "generation": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                  "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    "specials_agp": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token is defined }}"
                    "|{{ add_generation_prompt }}|{{ tools }}|{{ documents }}",
    "elif_chain": "{% for m in messages %}{% if m.role == 'system' %}S{% elif m.role == 'user' %}U"
                  "{% elif m.role == 'tool' %}T{% else %}A{% endif %}{% endfor %}",
    "string_escape_data": "{{ messages[3].content ~ '|' }}{{ messages[3].content|trim }}|\\n stays|",
    "strftime": "{{ strftime_now('%Y')|length }}",
    "dict_literal_keys": "{% set d = {'x': 1, 2: 'two', true: 'yes'} %}{{ d['x'] }}{{ d[2] }}{{ d|length }}",
    "raise_ok": "{% if messages[0].role != 'system' %}{{ raise_exception('must start with system') }}{% endif %}ok",
    # Expected errors.
    "err_raise": "{{ raise_exception('Conversation roles must alternate user/assistant') }}",
    "err_unknown_filter": "{{ 'x'|nosuchfilter }}",
    "err_unknown_test": "{{ 'x' is nosuchtest }}",
    "err_syntax_unclosed": "{% if true %}never closed",
    "err_syntax_expr": "{{ 1 + }}",
    "err_syntax_endfor": "{% for x in y %}{% endif %}",
    "err_undefined_attr": "{{ missing.attr }}",
    "err_dict_missing_chain": "{{ messages[0].nope.deeper }}",
    "err_add_none": "{{ 'a' + none }}",
    "err_add_undefined": "{{ 'a' + missing }}",
    "err_div_zero": "{{ 1 // 0 }}",
    "err_not_iterable": "{% for x in 5 %}{% endfor %}",
    "err_in_none": "{{ 'a' in none }}",
    "err_ns_assign": "{% set x = 1 %}{% set x.y = 2 %}",
    "err_append": "{% set l = [] %}{{ l.append(1) }}",
    "err_range_big": "{% for i in range(1000000) %}{% endfor %}",
    "err_unterminated_string": "{{ 'abc }}",
    "err_break_outside": "{% break %}",
}


def shared_path(shared, rel):
    return os.path.join(shared, rel)


def load_tokenizer(shared, config_rel):
    """A tokenizer from the shared tokenizer.json and the given tokenizer_config.json."""
    d = tempfile.mkdtemp(prefix="chat-goldens-")
    shutil.copy(shared_path(shared, f"{TOK}/tokenizer.json"), os.path.join(d, "tokenizer.json"))
    shutil.copy(shared_path(shared, config_rel), os.path.join(d, "tokenizer_config.json"))
    tok = AutoTokenizer.from_pretrained(d)
    shutil.rmtree(d)
    return tok


def render_case(fn):
    try:
        return {"expected": fn()}
    except Exception as e:  # jinja2 TemplateError, TypeError, ... all count as failures
        return {"error": f"{type(e).__name__}: {e}"}


def deepseek_cases(shared):
    cases = []
    tokenizers = {}
    for name, spec in TEMPLATES.items():
        cfg = spec.get("config") or spec["specials"]
        if cfg not in tokenizers:
            tokenizers[cfg] = load_tokenizer(shared, cfg)
        tok = tokenizers[cfg]
        text = None
        if "jinja" in spec:
            with open(shared_path(shared, spec["jinja"]), encoding="utf-8") as f:
                text = f.read()
        for conv_name, (messages, tools, extra) in CONVERSATIONS.items():
            for agp in (False, True):
                def fn(messages=messages, tools=tools, extra=extra, agp=agp):
                    return tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                   add_generation_prompt=agp,
                                                   chat_template=text, **(extra or {}))
                case = {"template": name, "name": f"{conv_name}/agp={int(agp)}",
                        "messages": messages, "add_generation_prompt": agp}
                if tools is not None:
                    case["tools"] = tools
                if extra:
                    case["extra"] = extra
                case.update(render_case(fn))
                cases.append(case)
    return cases, tokenizers[TEMPLATES["v3"]["config"]].special_tokens_map


def construct_cases(specials):
    cases = []
    for name, text in CONSTRUCTS.items():
        tools = [WEATHER_TOOL] if name == "tools_json" else None

        def fn(text=text, tools=tools):
            rendered, _ = render_jinja_template(conversations=[CONSTRUCT_MESSAGES], tools=tools,
                                                chat_template=text, add_generation_prompt=True,
                                                **specials)
            return rendered[0]
        case = {"template": "inline", "name": name, "text": text,
                "messages": CONSTRUCT_MESSAGES, "add_generation_prompt": True}
        if tools is not None:
            case["tools"] = tools
        case.update(render_case(fn))
        cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "shared"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "chat", "goldens.json"))
    args = ap.parse_args()
    ds_cases, specials = deepseek_cases(args.shared)
    cases = ds_cases + construct_cases(specials)
    doc = {
        "generator": f"tools/make_chat_goldens.py with transformers {transformers.__version__}, "
                     f"jinja2 {jinja2.__version__}",
        "templates": TEMPLATES,
        "specials_of_inline": TEMPLATES["v3"]["config"],
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"{args.out}: {len(cases)} cases ({n_err} expected errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
