"""Receipts (receipts.py): made by the API when asked, replayed by teacher
forcing through the scheduler on another kernel set and thread count, a
changed output id named at its step, another model named; the receipt
example of docs/receipts.md parses and checks."""

import copy
import json
import os
import re

import pytest

import intdet
from conftest import ISAS, using_isa
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.receipts import RECEIPT_KEYS, check_receipt, receipts_in, replay

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "receipts.md")

PARAMS = [dict(max_tokens=12, temperature="0.8", seed=11), dict(max_tokens=9, temperature="1.3", top_k=20, seed=5),
          dict(max_tokens=10), dict(max_tokens=8, temperature="0.9", top_p="0.85", min_p="0.02", seed=2),
          dict(max_tokens=10, temperature="1", repeat_penalty="1.3", repeat_last_n=-1, seed=7),
          dict(max_tokens=0)]
PROMPTS = [[5, 17, 99, 230], "hello world", [7, 8, 9], "a much longer prompt " * 5, [300, 4], [12, 13]]


@pytest.fixture(scope="module")
def llm(tmp_path_factory, tiny_llama_hf):
    d = convert(tiny_llama_hf, str(tmp_path_factory.mktemp("rcpt") / "m"), progress=False)
    return intdet.load(d, max_batch=4, step_tokens=16)


@pytest.fixture(scope="module")
def made(llm):
    params = [intdet.SamplingParams(receipt=True, step_hashes=i % 2 == 0, **p) for i, p in enumerate(PARAMS)]
    return llm.generate(PROMPTS, params)


def _rs(completions):
    return [(f"c{i}", c.receipt) for i, c in enumerate(completions)]


def test_receipt_fields(llm, made):
    for c, p in zip(made, PARAMS):
        r = c.receipt
        assert list(r) == [k for k in RECEIPT_KEYS if k in r]
        assert r["model_sha256"] == llm.model_sha256 and r["prompt_ids"] == c.prompt_ids
        assert r["output_ids"] == c.tokens and r["finish_reason"] == c.finish_reason
        assert r["chain_hash"][:12] == c.hash and len(r["chain_hash"]) == 32
        assert r["sampling"]["seed"] == p.get("seed", 0)
        assert json.loads(json.dumps(r)) == r
        check_receipt(r, "x")
    assert made[0].receipt["sampling"]["temperature"] == "0.8" and made[2].receipt["sampling"]["temperature"] == "0"
    assert made[0].receipt["step_hashes"] == made[0].step_hashes and len(made[0].step_hashes) == len(made[0].tokens)
    assert "step_hashes" not in made[1].receipt and made[1].step_hashes is None
    assert llm.generate([1, 2], intdet.SamplingParams(max_tokens=2)).receipt is None
    with pytest.raises(IntdetError, match="receipt"):
        intdet.SamplingParams(receipt=1)


@pytest.mark.parametrize("isa", ISAS)
def test_replay_matches_on_every_kernel_set_and_thread_count(llm, made, isa):
    with using_isa(isa, 3 if isa == ISAS[0] else 1):
        verdicts = replay(llm, _rs(made))
    assert [v.ok for v in verdicts] == [True] * len(made), [v.line() for v in verdicts]
    assert verdicts[0].line() == "c0: match"


def test_changed_token_is_named_with_its_step(llm, made):
    for k, step in ((0, 4), (1, 1), (3, 8)):
        rs = _rs(made)
        r = copy.deepcopy(rs[k][1])
        r["output_ids"][step - 1] = (r["output_ids"][step - 1] + 1) % llm.vocab_size
        rs[k] = ("bad", r)
        verdicts = replay(llm, rs)
        assert [v.ok for v in verdicts] == [i != k for i in range(len(rs))]
        assert verdicts[k].step == step and "the sampler picks" in verdicts[k].reason, verdicts[k].line()
        assert re.match(rf"bad: MISMATCH at step {step}: the receipt has token \d+", verdicts[k].line())


def test_changed_logits_and_hashes(llm, made):
    r = copy.deepcopy(made[0].receipt)  # step hashes: the step is named
    r["step_hashes"][5] = "0" * 12
    (v,) = replay(llm, [("h", r)])
    assert (v.ok, v.step) == (False, 6) and "chain hash differs" in v.reason
    r = copy.deepcopy(made[1].receipt)  # no step hashes: the end hash alone
    r["chain_hash"] = "f" * 32
    (v,) = replay(llm, [("h", r)])
    assert (v.ok, v.step) == (False, None) and "step hashes" in v.reason


def test_other_model_is_named(llm, made):
    r = copy.deepcopy(made[0].receipt)
    r["model_sha256"] = "ab" * 32
    (v,) = replay(llm, [("m", r)], model_name="-m tiny")
    assert not v.ok and v.step is None
    assert "model differs" in v.reason and "abababab" in v.reason and "-m tiny" in v.reason


def test_structured_receipt_replays(llm):
    so = {"choice": ["yes", "no", "maybe"]}
    c = llm.generate("answer:", intdet.SamplingParams(max_tokens=8, temperature="1", seed=3, receipt=True,
                                                      structured_outputs=so))
    assert c.receipt["structured_outputs"] == so
    assert replay(llm, [("s", c.receipt)])[0].ok


def test_receipts_in_shapes_and_checks(made):
    r = made[0].receipt
    assert receipts_in(r, "f") == [("f", r)]
    assert receipts_in({"text": "x", "receipt": r}, "f") == [("f", r)]
    assert receipts_in({"id": "a", "result": {"receipt": r}}, "f:3") == [("f:3 (id 'a')", r)]
    resp = {"choices": [{"index": 0, "receipt": r}, {"index": 1, "receipt": made[1].receipt}]}
    assert [w for w, _ in receipts_in(resp, "f")] == ["f choices[0]", "f choices[1]"]
    with pytest.raises(IntdetError, match="f: holds no receipt"):
        receipts_in({"text": "x"}, "f")
    for change, msg in ((("receipt_version", 9), "receipt_version 9"), (("chain_hash", "xyz"), "chain_hash"),
                        (("prompt_ids", []), "prompt_ids: empty"), (("output_ids", [1, -2]), "output_ids"),
                        (("step_hashes", ["0" * 12]), "step_hashes"),
                        (("sampling", dict(r["sampling"], top_p="1.5")), "sampling.top_p"),
                        (("sampling", dict(r["sampling"], repeat_last_n=-5)), "sampling.repeat_last_n"),
                        (("sampling", {"seed": 1}), "sampling must hold")):
        bad = dict(r, **{change[0]: change[1]})
        with pytest.raises(IntdetError, match=re.escape(msg)):
            check_receipt(bad, "f:2")
    with pytest.raises(IntdetError, match="not a receipt: no model_sha256"):
        check_receipt({k: v for k, v in r.items() if k != "model_sha256"}, "f")


def test_docs_example_parses():
    text = open(DOCS, encoding="utf-8").read()
    blocks = re.findall(r"```json\n(.*?)```", text, re.S)
    assert blocks, "docs/receipts.md has no ```json example"
    r = json.loads(blocks[0])
    assert check_receipt(r, "docs/receipts.md") is r
    assert receipts_in({"choices": [{"receipt": r}]}, "d")[0][1] is r
