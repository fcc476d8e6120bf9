"""Mixture of experts (Qwen3-MoE, Mixtral) beyond the per-family checks of
tests/models/test_families.py: the integer MoE op against the float one on the same
input, bits unchanged by batch composition (rows are grouped by expert),
dense and MoE layers mixed, the router's tie rule, and the CUDA engine's
MoE kernels (host emulator) against the CPU."""

import copy

import numpy as np
import pytest

import families
from intdet.convert import convert
from intdet.convert.sources import read_source
from intdet.errors import IntdetError
from intdet.floatref import FloatModel
from intdet.model import Engine, load_model
from intdet.ref import ops
from intdet.ref.intmath import quant16
from intdet.ref.model import RefModel

pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = [5, 17, 99, 230, 41, 7, 300, 12, 64, 128, 3, 77] + list(range(100, 136))


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    hf = families.write_family("qwen3-moe", str(d / "hf"))
    return hf, load_model(convert(hf, str(d / "int"), progress=False))


def test_moe_op_matches_float_on_the_same_input(moe_model):
    """Layer 1's MoE on the integer model's own FFN input: where the float
    router's k-th and (k+1)-th choices are 0.25 log2 units apart or more,
    the integer router picks the same experts and the output is within 3%
    (the int8 weights' and int16 activations' rounding)."""
    hf, lm = moe_model
    fm = read_source(hf)
    ref = RefModel(lm.cfg, lm.tensors)
    tr = {}
    ref.forward(PROMPT, 0, trace=tr)
    p, blk = "blk.1.", lm.cfg["layers"][1]
    a, f = tr[p + "ffn_norm"]
    hq, he = quant16(a)
    x = (hq * 2.0 ** he[:, None]) * f  # the int16 input as real numbers
    z, out = ref._moe(p, blk["moe"], hq, he)
    got = out / 65536.0  # the residual's Q16
    fl = FloatModel(fm, np.float64, max_len=64)
    want = fl._moe(p, blk["moe"], x)
    zf = x @ fm.weights[p + "ffn_gate_inp"].T * np.log2(np.e)
    k = blk["moe"]["experts_per_token"]
    srt = np.sort(zf, axis=1)[:, ::-1]
    clear = srt[:, k - 1] - srt[:, k] >= 0.25
    assert clear.sum() >= len(PROMPT) * 3 // 4
    pick_i = np.sort(np.argsort(-z, axis=1, kind="stable")[:, :k], axis=1)
    pick_f = np.sort(np.argsort(-zf, axis=1, kind="stable")[:, :k], axis=1)
    assert np.array_equal(pick_i[clear], pick_f[clear])
    err = np.sqrt(np.mean((got[clear] - want[clear]) ** 2) / np.mean(want[clear] ** 2))
    assert err < 0.03, err
    assert np.abs(z / 65536.0 - zf).max() < 0.2  # router logits in log2 units


def test_batch_composition_does_not_change_a_bit(moe_model):
    """Rows are grouped by expert; alone, batched with others, decoded
    together: the same logits."""
    _, lm = moe_model
    eng = Engine(lm, "cpu")
    prompts = [PROMPT[:20], PROMPT[5:9], list(range(200, 231)), [42]]
    alone = [eng.new_state(64).forward(t, all_logits=True) for t in prompts]
    seqs = [eng.new_state(64) for _ in prompts]
    batched = eng.forward_batch(seqs, prompts, all_logits=True)
    assert all(np.array_equal(a, b) for a, b in zip(alone, batched))
    solo = [eng.new_state(64) for _ in prompts]
    for s, t in zip(solo, prompts):
        s.forward(t)
    for step in range(3):
        toks = [[(7 * step + 3 * i) % 300] for i in range(len(prompts))]
        b = eng.forward_batch(seqs, toks)
        for i, s in enumerate(solo):
            assert np.array_equal(b[i], s.forward(toks[i])), (step, i)


def test_dense_and_moe_layers_mixed(tmp_path):
    """Qwen3-MoE's mlp_only_layers: layer 1 keeps a dense FFN."""
    hf = families.write_family("qwen3-moe", str(tmp_path / "hf"), mlp_only_layers=[1])
    lm = load_model(convert(hf, str(tmp_path / "int"), progress=False))
    assert ["moe" in b for b in lm.cfg["layers"]] == [True, False, True]
    assert "blk.1.ffn_gate.q" in lm.tensors and "blk.1.ffn_gate_exps.q" not in lm.tensors
    want = families.hf_logits(hf, PROMPT)
    got = FloatModel(read_source(hf), np.float64, max_len=64).forward(np.array(PROMPT), 0)
    assert np.abs(got - want).max() < 1e-3
    eng = Engine(lm, "cpu")
    assert np.array_equal(eng.new_state(64).forward(PROMPT[:16], all_logits=True),
                          Engine(lm, "ref").new_state(64).forward(PROMPT[:16], all_logits=True))


def test_router_ties_go_to_the_lowest_expert_id(moe_model):
    """Equal router outputs: the lower expert ids win, in the spec and in the
    engine (a router whose rows are all equal makes every score a tie)."""
    _, lm = moe_model
    t = dict(lm.tensors)
    for l in range(lm.cfg["num_layers"]):
        q = t[f"blk.{l}.ffn_gate_inp.q"].copy()
        q[:] = q[0]
        t[f"blk.{l}.ffn_gate_inp.q"] = q
        t[f"blk.{l}.ffn_gate_inp.mant"] = np.full_like(t[f"blk.{l}.ffn_gate_inp.mant"], t[f"blk.{l}.ffn_gate_inp.mant"][0])
        t[f"blk.{l}.ffn_gate_inp.shift"] = np.full_like(t[f"blk.{l}.ffn_gate_inp.shift"], t[f"blk.{l}.ffn_gate_inp.shift"][0])
    ref = RefModel(lm.cfg, t)
    tr = {}
    want = ref.forward(PROMPT[:8], 0, trace=tr)
    z = tr["blk.0.ffn_gate_inp"][0]
    assert (z == z[:, :1]).all()
    # only experts 0 and 1 run: zeroing every other expert's down weights changes nothing
    t2 = dict(t)
    for l in range(lm.cfg["num_layers"]):
        d = t2[f"blk.{l}.ffn_down_exps.q"].copy()
        d[2:] = 0
        t2[f"blk.{l}.ffn_down_exps.q"] = d
    assert np.array_equal(RefModel(lm.cfg, t2).forward(PROMPT[:8], 0), want)
    lm2 = copy.copy(lm)
    lm2.tensors = t2
    assert np.array_equal(Engine(lm2, "cpu").new_state(64).forward(PROMPT[:8], all_logits=True), want)
    w = ops.softmax_q16(np.zeros((1, 2), np.int64))
    assert w.tolist() == [[32768, 32768]]  # norm_topk_prob over two tied experts: half each


@pytest.fixture(scope="module")
def wide_moe(tmp_path_factory):
    """Sizes that take the CUDA kernels' vector paths (inputs multiples of 16
    and 32), int8 and int4, with 3 of 8 experts per token."""
    d = tmp_path_factory.mktemp("wide_moe")
    hf = families.write_family("qwen3-moe", str(d / "hf"), hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                               head_dim=32,
                               num_experts_per_tok=3)
    return {"int8": load_model(convert(hf, str(d / "int8"), progress=False)),
            "int4": load_model(convert(hf, str(d / "int4"), progress=False, weights="int4"))}


@pytest.mark.parametrize("weights,graphs", [("int8", True), ("int4", False)])
@pytest.mark.cuda
def test_cuda_emulator_same_bits_vector_paths(wide_moe, weights, graphs):
    """The device router, gathered expert linears and weighted sum against
    the CPU: prefill, decode (graphs on: the routing lives on the device),
    chunks and batches (test_cuda._compare_model)."""
    from test_cuda import _compare_model, _emu_or_skip

    mod = _emu_or_skip()
    lm = wide_moe[weights]
    assert lm.cfg.get("weight_format", "int8") == weights and lm.cfg["layers"][0]["moe"]["experts_per_token"] == 3
    _compare_model(mod, lm, graphs, PROMPT[:12], 3, batch_co=2, ctx=64)


@pytest.mark.cuda
def test_cuda_trace_is_the_cpu_trace(monkeypatch, moe_model):
    """Every named intermediate of a MoE model (router outputs, the weighted
    sum, the residual) from the CUDA engine equals the CPU's, bit for bit."""
    from intdet.trace import first_divergence, trace_cpu, trace_cuda, trace_names
    from test_cuda import _emu_or_skip

    mod = _emu_or_skip()
    monkeypatch.setattr("intdet.backends.cuda.cuda_module", lambda: mod)
    _, lm = moe_model
    cpu = trace_cpu(Engine(lm, "cpu"), PROMPT[:10])
    gpu = trace_cuda(Engine(lm, "cuda"), PROMPT[:10])
    names = trace_names(lm.cfg)
    assert "blk.0.ffn_gate_inp" in names and list(gpu) == names
    assert first_divergence(cpu, gpu, names) is None


@pytest.mark.cuda
def test_cuda_engine_refuses_moe_with_a_post_norm_by_name(moe_model):
    """A MoE block with a post-FFN norm (no family has one yet; the CPU runs
    it) is refused by the CUDA engine rather than run wrong."""
    from test_cuda import _emu_or_skip

    mod = _emu_or_skip()
    _, lm = moe_model
    cfg = copy.deepcopy(lm.cfg)
    cfg["layers"][0]["norms"] = ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]  # Gemma's placement
    t = dict(lm.tensors)
    for name in ("post_attention_norm", "post_ffw_norm"):
        t[f"blk.0.{name}.g"] = t["blk.0.ffn_norm.g"].copy()
        t[f"blk.0.{name}.shift"] = np.zeros(1, np.int32)
        cfg["norm_gamma_exponents"][f"blk.0.{name}"] = cfg["norm_gamma_exponents"]["blk.0.ffn_norm"]
    lm2 = copy.copy(lm)
    lm2.cfg, lm2.tensors = cfg, t
    Engine(lm2, "cpu").new_state(8).forward(PROMPT[:4])  # a model the CPU engine runs
    with pytest.raises(ValueError, match="mixture-of-experts blocks with a post-FFN norm are not implemented by the "
                                         "CUDA engine"):
        mod.Model(cfg, t, False)
    with pytest.raises(IntdetError):
        Engine(lm2, "cuda")


def test_int4_experts(tmp_path):
    """--weights int4 packs every expert as a linear's int4 groups; the spec and
    every CPU path agree; an expert size off the 32-input groups is refused."""
    hf = families.write_family("qwen3-moe", str(tmp_path / "hf"), moe_intermediate_size=64, hidden_size=64,
                               head_dim=32, intermediate_size=128)  # int4: every input a multiple of 32
    lm = load_model(convert(hf, str(tmp_path / "int"), progress=False, weights="int4"))
    assert lm.tensors["blk.0.ffn_down_exps.q4"].shape == (8, 64, 32)
    assert np.array_equal(Engine(lm, "cpu").new_state(64).forward(PROMPT[:12], all_logits=True),
                          Engine(lm, "ref").new_state(64).forward(PROMPT[:12], all_logits=True))
    bad = families.write_family("qwen3-moe", str(tmp_path / "hf40"), hidden_size=64, head_dim=32, intermediate_size=128)
    with pytest.raises(IntdetError, match="expert intermediate size 40 is not a multiple of 32"):
        convert(bad, str(tmp_path / "o"), progress=False, weights="int4")
    assert not (tmp_path / "o").exists()


def test_every_intermediate_same_bits_spec_and_cpu(moe_model):
    """intdet.trace: the router outputs (ffn_gate_inp), the MoE output
    (ffn_down) and every other named tensor agree between the numpy spec and
    the scalar and active kernel sets."""
    from intdet import _core
    from intdet.trace import compare_backends, trace_cpu, trace_names, trace_ref

    _, lm = moe_model
    names = trace_names(lm.cfg)
    assert any(n.endswith("ffn_gate_inp") for n in names) and not any(n.endswith("ffn_swiglu") for n in names)
    engine = Engine(lm, "cpu")
    assert list(trace_ref(lm, PROMPT[:10])) == names and list(trace_cpu(engine, PROMPT[:10])) == names
    got = compare_backends(engine, PROMPT[:10], ["ref", "scalar", _core.isa()])
    assert all(d is None for _, d in got), got
