"""intdet serve's token-in/token-out and receipts (serve/token_io.py):
``return_token_ids`` gives the prompt's and each choice's ids, logprobs
entries carry ``behaviour_logprob`` beside ``logprob``, and ``receipt``
gives each choice's receipt, which replays to a match; all equal to the
Python API's result for the same request."""

import json

import pytest

import intdet
from intdet.receipts import replay
from test_serve import params, post, sse


from test_serve import llm, server  # noqa: E402,F401  (test_serve's server and API over the same model)


from test_serve import model_dir  # noqa: E402,F401  (the same converted tiny model)


def test_completions_token_ids_behaviour_and_receipts(server, llm):
    body = {"prompt": [5, 17, 99, 230], "max_tokens": 8, "temperature": 0.7, "top_k": 30, "seed": 11, "n": 2,
            "logprobs": 1, "return_token_ids": True, "receipt": True}
    status, r = post(server, "/v1/completions", body)
    assert status == 200, r
    for i, ch in enumerate(r["choices"]):
        want = llm.generate(body["prompt"], intdet.SamplingParams(
            **{**vars(params(body, 8)), "seed": ch["seed"], "receipt": True}))
        assert ch["prompt_token_ids"] == body["prompt"] and ch["token_ids"] == want.tokens
        lp = ch["logprobs"]
        assert lp["token_logprobs"] == [t.logprob for t in want.logprobs]
        assert lp["behaviour_logprobs"] == [t.behaviour_logprob for t in want.logprobs]
        assert any(b != t for b, t in zip(lp["behaviour_logprobs"], lp["token_logprobs"]))  # T 0.7, top-k 30
        assert ch["receipt"] == want.receipt and ch["receipt"]["output_ids"] == ch["token_ids"]
    # a saved response replays, choice by choice
    assert [v.ok for v in replay(llm, [(f"c{i}", ch["receipt"]) for i, ch in enumerate(r["choices"])])] == [True] * 2
    status, plain = post(server, "/v1/completions", {k: v for k, v in body.items()
                                                     if k not in ("return_token_ids", "receipt")})
    assert all("token_ids" not in ch and "receipt" not in ch for ch in plain["choices"])


def test_chat_token_ids_behaviour_and_receipt(server, llm):
    msgs = [{"role": "user", "content": "hi there"}]
    body = {"messages": msgs, "max_tokens": 6, "temperature": 0.9, "seed": 4, "logprobs": True,
            "return_token_ids": True, "receipt": True}
    status, r = post(server, "/v1/chat/completions", body)
    assert status == 200, r
    want = llm.chat(msgs, intdet.SamplingParams(max_tokens=6, temperature=0.9, seed=4, logprobs=0, receipt=True))
    ch = r["choices"][0]
    assert r["prompt_token_ids"] == llm.chat_ids(msgs) and ch["token_ids"] == want.tokens
    assert [e["behaviour_logprob"] for e in ch["logprobs"]["content"]] == [t.behaviour_logprob for t in want.logprobs]
    assert [e["logprob"] for e in ch["logprobs"]["content"]] == [t.logprob for t in want.logprobs]
    assert ch["receipt"] == want.receipt


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed(server, llm, path):
    body = {"max_tokens": 7, "temperature": 0.8, "seed": 2, "stream": True, "return_token_ids": True,
            "receipt": True}
    if path == "/v1/completions":
        body["prompt"], ids = "stream me", llm.encode("stream me")
    else:
        body["messages"] = [{"role": "user", "content": "stream me"}]
        ids = llm.chat_ids(body["messages"])
    chunks = sse(server, path, body)
    chs = [c["choices"][0] for c in chunks if c["choices"]]
    toks = [t for ch in chs for t in ch.get("token_ids", [])]
    last = [ch for ch in chs if ch.get("finish_reason")][-1]
    want = llm.generate(ids, intdet.SamplingParams(max_tokens=7, temperature=0.8, seed=2, receipt=True))
    assert toks == want.tokens and last["receipt"] == want.receipt


@pytest.mark.parametrize("field", ["return_token_ids", "receipt"])
def test_bad_values(server, field):
    status, r = post(server, "/v1/completions", {"prompt": "x", field: "yes"})
    assert status == 400 and r["error"]["param"] == field, json.dumps(r)
