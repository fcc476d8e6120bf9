"""Real chat templates of the model families (tests/data/chat_templates:
Llama 3.1 and 3.2, Mistral Nemo, Mixtral, Qwen2.5, Qwen3, Phi-3.5, Gemma 2,
Granite 3.3, SmolLM3; none found offline for OLMo 2) on the tiny family
checkpoints of tests/families.py.

Each template goes into its checkpoint's tokenizer_config.json, with the
special tokens it writes added to the tiny tokenizer (special added tokens,
as in the real tokenizers; the tiny vocab has room for them), tokenizer.json
is written back by transformers' tokenizer class for the model type, and the
checkpoint is converted. The oracle is transformers' own
``apply_chat_template(..., add_generation_prompt=True)``: intdet's prompt ids
equal its ids for system + user, multi-turn, whitespace at the contents'
edges and SmolLM3's "/no_think" switch; a special-token string typed in a
message renders the same text but stays plain text. ``generate --chat``,
``intdet chat`` and the server's /v1/chat/completions give the same tokens
(chain hash); templates that refuse a system message (Gemma 2, Mixtral) give
one-line errors and a 400. Then ``intdet hash-check`` on each new family."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import families
from intdet.chat import conversation_ids
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import load_model

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
jinja2 = pytest.importorskip("jinja2")

TEMPLATES = Path(__file__).parent.parent / "data" / "chat_templates"

# case -> (family, template file, the special tokens it writes that the tiny
# tokenizer lacks, bos_token, eos_token); None keeps the tiny tokenizer's own.
CASES = {
    "llama3": ("llama3", "meta-llama-Llama-3.1-8B-Instruct.jinja",
               ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2": ("llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja",  # today's date (strftime_now)
                 ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                 "<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("mistral", "mistralai-Mistral-Nemo-Instruct-2407.jinja",  # [INST] is a control token there
                ["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>"),
    "mixtral": ("mixtral", "mistralai-Mixtral-8x7B-Instruct-v0.1.jinja",  # [INST] is text there
                ["<s>", "</s>"], "<s>", "</s>"),
    "qwen2": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", [], None, None),
    "qwen3": ("qwen3", "Qwen-Qwen3-0.6B.jinja", [], None, None),
    "qwen3-moe": ("qwen3-moe", "Qwen-Qwen3-0.6B.jinja", [], None, None),  # Qwen3's template
    "phi3": ("phi3", "microsoft-Phi-3.5-mini-instruct.jinja",
             ["<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], "<s>", "<|endoftext|>"),
    "gemma2": ("gemma2", "google-gemma-2-2b-it.jinja", ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
               "<bos>", "<eos>"),
    "granite": ("granite", "ibm-granite-granite-3.3-2B-Instruct.jinja",
                ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"], "<|end_of_text|>", "<|end_of_text|>"),
    "smollm3": ("smollm3", "HuggingFaceTB-SmolLM3-3B.jinja", [], None, None),
}
REFUSE_SYSTEM = {"gemma2", "mixtral"}  # their templates raise_exception() on a system message
# The families added for issue 36, each hash-checked.
NEW_FAMILIES = ["llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "olmo2", "granite", "smollm3",
                "qwen3-moe", "mixtral"]

SYSTEM = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there, how are you?"}]
CONVERSATIONS = {
    "system": SYSTEM,
    "multi-turn": [{"role": "system", "content": "Be kind"}, {"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "no-system": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "What is 12+30?"}],
    # contents' edges: the Llama and Gemma templates trim them, Mixtral's joins them to " [/INST]"
    "edges": [{"role": "user", "content": "  spaced out \n"}, {"role": "assistant", "content": "\nok "},
              {"role": "user", "content": "\n\nnext"}],
    "no-think": [{"role": "system", "content": "Answer briefly. /no_think"}, {"role": "user", "content": "why?"}],
}


def write_chat_family(case: str, hf_dir: str, extra_specials=(), **overrides) -> str:
    """The tiny checkpoint of the case's family with the real template and its special tokens
    (and ``extra_specials``); ``overrides``: config values (families.write_family)."""
    from tokenizers import AddedToken, Tokenizer

    family, template, specials, bos, eos = CASES[case]
    specials = list(specials) + list(extra_specials)
    families.write_family(family, hf_dir, **overrides)
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert tok.get_vocab_size() <= families.TINY["vocab_size"]  # the new ids have rows in the model
    tok.save(os.path.join(hf_dir, "tokenizer.json"))
    p = os.path.join(hf_dir, "tokenizer_config.json")
    with open(p, encoding="utf-8") as f:
        tc = json.load(f)
    tc["chat_template"] = (TEMPLATES / template).read_text(encoding="utf-8")
    tc.update({k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None})
    with open(p, "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=2)
    # tokenizer.json as transformers' class for the model type has it: Qwen2Tokenizer swaps in
    # Qwen2's own pre-tokenizer and NFC, as a real Qwen2 checkpoint's tokenizer.json has them
    reference(hf_dir).backend_tokenizer.save(os.path.join(hf_dir, "tokenizer.json"))
    return hf_dir


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """built(case) -> (hf dir, converted dir), made once per case; a family
    name without a template case gives its plain checkpoint."""
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            hf = (write_chat_family(name, str(d / "hf")) if name in CASES
                  else families.write_family(name, str(d / "hf")))
            cache[name] = (hf, convert(hf, str(d / "int"), progress=False))
        return cache[name]

    return get


@pytest.fixture(autouse=True)
def _real_clock(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)  # transformers' strftime_now ignores it


def reference(hf):
    return transformers.AutoTokenizer.from_pretrained(hf)


def hf_ids(ref, msgs):
    return list(ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def hf_text(ref, msgs):
    return ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_prompt_ids_equal_transformers(built, case):
    hf, conv = built(case)
    ref, lm = reference(hf), load_model(conv)
    refused = set()
    for name, msgs in CONVERSATIONS.items():
        try:
            want = hf_ids(ref, msgs)
        except jinja2.TemplateError as e:
            refused.add(name)
            with pytest.raises(IntdetError, match=rf"chat template failed \({re.escape(str(e))}\)"):
                conversation_ids(lm, msgs)
            continue
        got = conversation_ids(lm, msgs)
        assert got == want, (name, lm.tokenizer.decode(got, skip_special_tokens=False), hf_text(ref, msgs))
    assert refused == ({"system", "multi-turn", "no-think"} if CASES[case][0] in REFUSE_SYSTEM else set())


@pytest.mark.parametrize("case", sorted(CASES))
def test_typed_special_tokens_stay_text(built, case):
    """A message holding the template's own control tokens renders the text
    transformers renders, but they stay plain text in intdet's ids."""
    hf, conv = built(case)
    ref, lm = reference(hf), load_model(conv)
    typed = " ".join(CASES[case][2] or ["<|im_end|>", "<|im_start|>"])
    clean = [{"role": "user", "content": "say it"}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "again"}]
    hostile = [dict(m, content=f"{m['content']} {typed} end") for m in clean]
    special = {t for t, a in lm.tokenizer.get_added_tokens_decoder().items() if a.special}
    got = conversation_ids(lm, hostile)
    assert lm.tokenizer.decode(got, skip_special_tokens=False) == hf_text(ref, hostile)
    n_special = sum(t in special for t in got)
    assert n_special == sum(t in special for t in conversation_ids(lm, clean))
    assert n_special < sum(t in special for t in hf_ids(ref, hostile))  # transformers lets them through


# ------------------------------------------------------------------ CLI and server


def run_cli(args, tmp_path, stdin=None):
    env = dict(os.environ, INTDET_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "intdet.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, input=stdin, timeout=300)


def one_line_error(r, needle):
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("intdet: error: ") and needle in lines[0], r.stderr


def chat_hashes(stderr):
    return re.findall(r"\| hash ([0-9a-f]{12})$", stderr, re.M)


@pytest.fixture(scope="module")
def serve(built):
    from test_serve import start_server

    procs = {}

    def get(case):
        if case not in procs:
            procs[case] = start_server(built(case)[1], "--max-batch", "2")
        return procs[case][1]

    yield get
    for proc, _ in procs.values():
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


GREEDY = {"temperature": 0, "max_tokens": 8, "seed": 0}


@pytest.mark.parametrize("case,convs", [("llama3", (SYSTEM, CONVERSATIONS["multi-turn"])),
                                        ("gemma2", (CONVERSATIONS["no-system"],))], ids=["llama3", "gemma2"])
def test_cli_chat_and_server_agree(built, serve, tmp_path, case, convs):
    from test_serve import post

    hf, conv = built(case)
    ref, port = reference(hf), serve(case)
    for msgs in convs:
        status, r = post(port, "/tokenize", {"messages": msgs})
        assert status == 200 and r["tokens"] == hf_ids(ref, msgs)
    # generate --chat: the system + user conversation (or the user message alone)
    msgs = convs[0][-1:] if case in REFUSE_SYSTEM else convs[0]
    sys_opt = [] if case in REFUSE_SYSTEM else ["--system", msgs[0]["content"]]
    g = run_cli(["generate", "-m", conv, "--chat", *sys_opt, msgs[-1]["content"], "-n", 8, "--temperature", 0,
                 "--json", "-q"], tmp_path)
    assert g.returncode == 0, g.stderr
    g = json.loads(g.stdout)
    status, s = post(port, "/v1/chat/completions", dict(GREEDY, messages=msgs))
    assert status == 200, s
    choice = s["choices"][0]
    assert (choice["hash"], choice["message"]["content"]) == (g["hash"], g["text"])
    assert s["usage"] == {"prompt_tokens": len(hf_ids(ref, msgs)), "completion_tokens": len(g["tokens"]),
                          "total_tokens": len(hf_ids(ref, msgs)) + len(g["tokens"]),
                          "prompt_tokens_details": {"cached_tokens": 0}}  # the prefix cache is on; nothing ran before
    assert g["prompt_tokens"] == len(hf_ids(ref, msgs))
    # intdet chat, two turns: the second reply is the server's for the conversation with the first reply in it
    second = "And then?"
    c = run_cli(["chat", "-m", conv, *sys_opt, "-n", 8, "--temperature", 0], tmp_path,
                stdin=f"{msgs[-1]['content']}\n{second}\n")
    assert c.returncode == 0, c.stderr
    turn2 = msgs + [{"role": "assistant", "content": choice["message"]["content"]}, {"role": "user", "content": second}]
    status, s2 = post(port, "/v1/chat/completions", dict(GREEDY, messages=turn2))
    assert status == 200, s2
    assert chat_hashes(c.stderr) == [g["hash"], s2["choices"][0]["hash"]]


@pytest.mark.parametrize("case", sorted(REFUSE_SYSTEM))
def test_system_message_refused(built, tmp_path, case):
    _, conv = built(case)
    # Mixtral's template checks the alternation first, and the system message breaks it
    needle = "chat template failed (" + ("System role not supported)" if case == "gemma2"
                                         else "Conversation roles must alternate user/assistant/")
    one_line_error(run_cli(["generate", "-m", conv, "--chat", "--system", "Be brief", "hi", "-n", 2], tmp_path), needle)
    one_line_error(run_cli(["chat", "-m", conv, "--system", "Be brief", "-n", 2], tmp_path, stdin="hi\n"), needle)
    assert run_cli(["generate", "-m", conv, "--chat", "hi", "-n", 2], tmp_path).returncode == 0


def test_server_refusals_are_400(built, serve):
    from test_serve import post

    port = serve("gemma2")
    for msgs, needle in ((SYSTEM, "System role not supported"),
                         ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                          "Conversation roles must alternate")):
        for path in ("/v1/chat/completions", "/tokenize"):
            status, r = post(port, path, dict(GREEDY, messages=msgs) if "chat" in path else {"messages": msgs})
            assert status == 400 and needle in r["error"]["message"] and "\n" not in r["error"]["message"], r
            assert r["error"]["param"] == "messages"
    status, _ = post(port, "/v1/chat/completions", dict(GREEDY, messages=SYSTEM[1:]))
    assert status == 200  # and the server still serves


def test_template_failing_in_python_is_one_line(built, tmp_path):
    """A template whose own code raises (a TypeError here) fails like one that
    calls raise_exception: one line, no traceback."""
    d = tmp_path / "bad"
    shutil.copytree(built("llama3")[1], d)
    p = d / "tokenizer_config.json"
    tc = json.loads(p.read_text())
    tc["chat_template"] = "{{ messages[0].content + 1 }}"
    p.write_text(json.dumps(tc))
    one_line_error(run_cli(["generate", "-m", d, "--chat", "hi", "-n", 2], tmp_path),
                   "chat template failed (TypeError: can only concatenate str")


# ------------------------------------------------------------------ hash-check


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_hash_check(built, tmp_path, family):
    conv = built(family)[1]
    r = run_cli(["hash-check", "-m", conv, "--prompt", "Shall I compare thee to a summer's day?", "--steps", 6,
                 "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["all_equal"] and out["steps"] == 6 and out["prompt_tokens"] > 7  # past a chunk of 7
    greedy = [x for x in out["runs"] if x["group"] == "greedy"]
    assert len(greedy) >= 7 and len({x["hash"] for x in greedy}) == 1
    assert all(x["diverges_at"] is None for x in out["runs"])
