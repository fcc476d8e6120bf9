"""The WebGPU engine end to end: tiny models of the families give the C++
core's int32 logits bit for bit (prefill, prefill in pieces, decode,
batches of several sizes), and the state operations and refusals of
intdet._core's API."""

import os

import numpy as np
import pytest

import families
import models
from intdet import _core
from intdet.convert import convert
from intdet.model import load_model
from intdet.webgpu import backend as W

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77]
# The families of tests/families.py; each brings its own block features: sliding windows (mistral,
# phi3, gemma2), biases (qwen2), q/k norms per head (qwen3) and per projection without pre-norms
# (olmo2), NoPE layers (smollm3), soft caps (gemma2), folded multipliers (granite), experts.
FAMS = ["llama3", "mistral", "qwen2", "qwen3", "granite", "phi3", "olmo2", "smollm3", "gemma2", "qwen3-moe", "mixtral"]


@pytest.fixture(scope="module")
def model_of(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            if name == "gemma3":  # local/global layers, window 5, post-norms, GeGLU, residual Q10
                src = models.write_hf_model(str(d / "hf"), "gemma3")
            elif name == "int4":
                src = models.write_hf_model(str(d / "hf"), "qwen3", **models.INT4_SHAPE)
            elif name == "moe-int4":  # int4 experts, 3 of 8 per token (inputs multiples of 32)
                src = families.write_family("qwen3-moe", str(d / "hf"), hidden_size=64, intermediate_size=128,
                                            moe_intermediate_size=64, head_dim=32, num_experts_per_tok=3)
            elif name == "moe-full-softmax":  # weights from the softmax over all experts; layer 1 dense
                src = families.write_family("qwen3-moe", str(d / "hf"), norm_topk_prob=False, mlp_only_layers=[1])
            else:
                src = families.write_family(name, str(d / "hf"))
            int4 = {"weights": "int4"} if name in ("int4", "moe-int4") else {}
            lm = load_model(convert(src, str(d / "int"), progress=False, **int4))
            cache[name] = (lm, _core.Model(lm.cfg, lm.tensors), W.Model(lm.cfg, lm.tensors))
        return cache[name]

    return get


def cpu_run(cm, chunks, tokens=PROMPT, max_len=64):
    s = _core.State(cm, max_len)
    outs, i = [], 0
    for c in chunks:
        outs.append(_core.forward(cm, s, np.array(tokens[i:i + c], np.int32), i, True))
        i += c
    return np.concatenate(outs)


def gpu_run(gm, chunks, tokens=PROMPT, max_len=64):
    s = W.State(gm, max_len)
    outs, i = [], 0
    for c in chunks:
        outs.append(W.forward(gm, s, tokens[i:i + c], i, True))
        i += c
    return np.concatenate(outs)


@pytest.mark.parametrize("name", FAMS + ["gemma3", "int4", "moe-int4", "moe-full-softmax"])
def test_family_logits_bit_for_bit(model_of, name):
    """Every logit of a prefill, and of the same tokens in pieces and one by one, equals the CPU's."""
    lm, cm, gm = model_of(name)
    want = cpu_run(cm, [len(PROMPT)])
    got = gpu_run(gm, [len(PROMPT)])
    assert got.dtype == np.int32 and got.shape == (len(PROMPT), lm.cfg["vocab_size"])
    assert np.array_equal(got, want)
    assert np.array_equal(gpu_run(gm, [5, 1, 6]), want)
    assert np.array_equal(gpu_run(gm, [1] * len(PROMPT)), want)


def test_long_prefill_in_passes(model_of, monkeypatch):
    """A prefill longer than one pass (CHUNK rows) gives the one-pass logits; past the sliding window too."""
    lm, cm, gm = model_of("mistral")
    toks = [int(t) for t in (np.arange(40) * 37 + 11) % lm.cfg["vocab_size"]]
    want = cpu_run(cm, [40], toks)
    monkeypatch.setattr(W, "CHUNK", 6)
    assert np.array_equal(gpu_run(gm, [40], toks), want)
    s = W.State(gm, 64)
    last = W.forward(gm, s, toks, 0, False)
    assert last.shape == (1, lm.cfg["vocab_size"]) and np.array_equal(last[0], want[-1])


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_batches(model_of, batch):
    """forward_batch of mixed prefills and decodes, per-sequence all_logits, into one out array:
    each sequence's logits are those it gets alone on the CPU."""
    lm, cm, gm = model_of("qwen2")
    V = lm.cfg["vocab_size"]
    seqs = [[(7 * b + 3 * j + 1) % V for j in range(2 + b)] for b in range(batch)]
    first = [s[:1 + b % 2] for b, s in enumerate(seqs)]
    rest = [s[1 + b % 2:] for b, s in enumerate(seqs)]
    flags = [b % 2 == 0 for b in range(batch)]
    states = [W.State(gm, 32) for _ in range(batch)]
    W.forward_batch(gm, states, first, True)
    rows = sum(len(r) if f else 1 for r, f in zip(rest, flags))
    out = np.zeros((rows, V), np.int32)
    got = W.forward_batch(gm, states, rest, flags, out)
    for b in range(batch):
        want = cpu_run(cm, [len(first[b]), len(rest[b])], seqs[b])[len(first[b]):]
        want = want if flags[b] else want[-1:]
        assert np.array_equal(got[b], want), b
        assert np.shares_memory(got[b], out)
        assert states[b].n_past == len(seqs[b])


def test_truncate_and_copy_prefix(model_of):
    lm, cm, gm = model_of("gemma2")
    want = cpu_run(cm, [len(PROMPT)])
    s = W.State(gm, 64)
    W.forward(gm, s, PROMPT[:8] + [1, 2, 3], 0, True)
    s.truncate(8)  # drafts rejected: positions 8.. are written again
    assert np.array_equal(W.forward(gm, s, PROMPT[8:], 8, True), want[8:])
    t = W.State(gm, 32)
    t.copy_prefix(s, 6)
    assert t.n_past == 6
    assert np.array_equal(W.forward(gm, t, PROMPT[6:], 6, True), want[6:])
    with pytest.raises(ValueError, match="outside"):
        t.truncate(99)


def test_refusals(model_of, tmp_path):
    lm, cm, gm = model_of("llama3")
    s = W.State(gm, 8)
    with pytest.raises(ValueError, match="tokens: ids"):
        W.forward(gm, s, [lm.cfg["vocab_size"]], 0)
    with pytest.raises(ValueError, match="does not fit"):
        W.forward(gm, s, list(range(9)), 0)
    with pytest.raises(ValueError, match="out: shape"):
        W.forward(gm, s, [1, 2], 0, True, np.zeros((1, lm.cfg["vocab_size"]), np.int32))
    with pytest.raises(ValueError, match="out: an int32"):
        W.forward(gm, s, [1], 0, False, np.zeros((1, lm.cfg["vocab_size"]), np.int64))
    with pytest.raises(ValueError, match="max_len"):
        W.State(gm, lm.cfg["context_length"] + 1)
    bad = dict(lm.tensors)
    del bad["output_norm.g"]
    with pytest.raises(ValueError, match="output_norm"):
        W.Model(lm.cfg, bad)
    lmm = model_of("mixtral")[0]
    cfg = dict(lmm.cfg, layers=[dict(b, norms=["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"])
                                for b in lmm.cfg["layers"]])
    t = dict(lmm.tensors)
    H = lmm.cfg["hidden_size"]
    for i in range(lmm.cfg["num_layers"]):
        for n in ("post_attention_norm", "post_ffw_norm"):
            t[f"blk.{i}.{n}.g"] = np.full(H, 8192, np.int16)
            t[f"blk.{i}.{n}.shift"] = np.array([14], np.int32)
    _core.Model(cfg, t)  # a model the CPU runs
    with pytest.raises(ValueError, match="mixture-of-experts with a post-norm"):
        W.Model(cfg, t)


def test_available_and_name():
    ok, why = W.available()
    assert ok and why == W.device_name()


@pytest.mark.parametrize("name", ["gemma2", "olmo2", "qwen3-moe"])
def test_batch_split_over_passes(model_of, monkeypatch, name):
    """Sequences longer than a pass and sequences sharing one, the kept rows' logits
    (soft-capped on gemma2) gathered across passes: each as on the CPU alone."""
    lm, cm, gm = model_of(name)
    monkeypatch.setattr(W, "CHUNK", 4)
    seqs = [PROMPT[:7], PROMPT[3:4], PROMPT[2:5], PROMPT[:10]]
    flags = [True, False, False, True]
    states = [W.State(gm, 16) for _ in seqs]
    got = W.forward_batch(gm, states, seqs, flags)
    for s, f, g in zip(seqs, flags, got):
        want = cpu_run(cm, [len(s)], s)
        assert np.array_equal(g, want if f else want[-1:])


def test_binding_limit_splits_passes_and_submissions(model_of, monkeypatch):
    """Under a small storage binding limit the attention scratch takes fewer rows per pass and the
    logits come back in several submissions: the same bits; past it, a clear refusal."""
    lm, cm, gm = model_of("gemma2")
    V, nh = lm.cfg["vocab_size"], lm.cfg["num_heads"]
    want = cpu_run(cm, [len(PROMPT)])
    runs = []
    run = W.Recorder.run
    monkeypatch.setattr(W.Recorder, "run", lambda self, read=None: runs.append(read) or run(self, read))
    monkeypatch.setattr(W, "_binding_limit", lambda m: 3 * V * 4)
    assert np.array_equal(gpu_run(gm, [len(PROMPT)]), want)
    assert len(runs) == 4  # 3 rows a pass, the logits of one pass a submission
    monkeypatch.setattr(W, "_binding_limit", lambda m: nh * 4 * 5)
    with pytest.raises(ValueError, match="storage binding limit"):
        W.forward(gm, W.State(gm, 64), PROMPT, 0)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma2"])
def test_matrices_in_several_buffers(model_of, monkeypatch, name):
    """Matrices over the adapter's binding limit (128 MiB on lavapipe:
    Qwen3-0.6B's 155 MB embedding / lm_head, a 14B model's fused gate+up)
    kept in buffers of whole rows within it: every token's embedding row
    looked up in the buffer that holds it, each buffer's channels written
    in place (logits, residual adds), q/k/v and gate/up left unfused when
    together they pass the limit; tied (qwen3) and untied (llama3) weights,
    Gemma 2's soft caps. The CPU's logits for prompts whose tokens fall in
    every buffer; a row over the limit, or stacked experts over it, are
    refused naming the limit."""
    lm, cm, _ = model_of(name)
    V, H = lm.cfg["vocab_size"], lm.cfg["hidden_size"]
    row = 4 * -(-H // 4)
    monkeypatch.setattr(W, "_chunk_limit", lambda dev: 37 * row + 3)  # 37 hidden-size rows a buffer
    gm = W.Model(lm.cfg, lm.tensors)
    out = gm.lin["output"][3]
    assert len(gm.emb_chunks) == -(-V // 37) and len(out) == len(gm.emb_chunks)
    assert (gm.emb_chunks[0][2] is out[0][2]) == ("output.q" not in lm.tensors)
    assert not gm.seg and all(len(v[3]) > 1 for k, v in gm.lin.items() if k.endswith(("ffn_up", "attn_q")))
    tokens = [int(t) for t in np.linspace(0, V - 1, 12).astype(int)]
    assert np.array_equal(gpu_run(gm, [8, 1, 3], tokens), cpu_run(cm, [8, 1, 3], tokens))
    monkeypatch.setattr(W, "_chunk_limit", lambda dev: row - 1)
    with pytest.raises(ValueError, match="binding limit"):
        W.Model(lm.cfg, lm.tensors)


def test_stacked_experts_over_the_limit_are_refused(model_of, monkeypatch):
    lm, _, _ = model_of("qwen3-moe")
    monkeypatch.setattr(W, "_chunk_limit", lambda dev: 4096)
    with pytest.raises(ValueError, match=r"tensor blk\.0\.ffn_\w+_exps needs \d+ bytes in one buffer, over this "
                                         r"adapter's 4096-byte buffer binding limit"):
        W.Model(lm.cfg, lm.tensors)


def test_a_step_in_several_command_buffers(model_of, monkeypatch):
    """A step's dispatches go out in command buffers of SUBMIT_EVERY (the GPU starts on the first
    while the host encodes the rest): the same bits at any cut, one read back."""
    from intdet.webgpu import kernels as K

    lm, cm, gm = model_of("qwen3")
    want = cpu_run(cm, [len(PROMPT) - 2, 1, 1])
    submits = []
    q = type(gm.kernels.device.queue)
    sub = q.submit
    monkeypatch.setattr(q, "submit", lambda self, cbs: submits.append(len(cbs)) or sub(self, cbs))
    counts = []
    for every in (1, 7, 10_000):
        monkeypatch.setattr(K, "SUBMIT_EVERY", every)
        submits.clear()
        assert np.array_equal(gpu_run(gm, [len(PROMPT) - 2, 1, 1]), want), every
        counts.append(len(submits))
    assert counts[0] > 4 * counts[1] > 4 * counts[2] > 0, counts


def test_a_parameter_outside_int32_names_the_kernel(model_of):
    from intdet.webgpu.kernels import Recorder

    lm, cm, gm = model_of("qwen3")
    rec = Recorder(gm.kernels, gm.pool)
    rec.dispatch("softcap", [gm.pool.scratch("nomask", 16)], [1, 0, 0, 0], (1, 1, 1))
    rec.dispatch("glu", [gm.pool.scratch("nomask", 16)] * 3, [1, 2**31], (1, 1, 1))
    with pytest.raises(ValueError, match=r"^glu: parameters \[1, 2147483648, 0"):
        rec.run()
    assert not rec.cmds and not rec.params
    with pytest.raises(ValueError, match="17 parameters"):
        rec.dispatch("glu", [], list(range(17)), (1, 1, 1))


@pytest.mark.parametrize("name", ["qwen2", "qwen3-moe", "gemma2", "llama3"])
def test_coop_linears_give_the_same_logits(model_of, name):
    """The GPUs' shape of the int8 linears (each channel's row split over TPC invocations, the
    parts added in workgroup memory): the CPU's logits for prefill, decode and a batch."""
    lm, cm, _ = model_of(name)
    gm = W.Model(lm.cfg, lm.tensors, coop=True)
    assert gm.kernels.coop
    assert np.array_equal(gpu_run(gm, [7, 1, 1, 1]), cpu_run(cm, [7, 1, 1, 1]))
    seqs = [PROMPT[:5], PROMPT[2:3], PROMPT[:9]]
    got = W.forward_batch(gm, [W.State(gm, 16) for _ in seqs], seqs, False)
    for s, g in zip(seqs, got):
        assert np.array_equal(g, cpu_run(cm, [len(s)], s)[-1:])


def test_no_adapter_reason_is_one_line():
    """With no adapter (wgpu forced onto a backend this build lacks) the reason
    is one line: wgpu's "Validation Error / Caused by:" text folded."""
    import subprocess
    import sys

    code = "from intdet.webgpu.device import available; ok, why = available(); print(repr(ok)); print(repr(why))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, WGPU_BACKEND_TYPE="D3D12"))
    ok, why = [eval(x) for x in r.stdout.splitlines()[-2:]]
    assert ok is False and "\n" not in why and "Caused by" not in why and "adapter" in why, why
