"""Hostile and broken model files, crafted byte by byte.

Each crafted GGUF / safetensors file goes through the real CLI,
``python -m intdet.cli convert FILE -o OUT``, which must: exit 1, print one
stderr line ``intdet: error: ...`` naming the file and the problem, print no
traceback, create neither OUT nor a ``.intdet-convert-*`` temp dir, and finish
well within 60 s (no hang, no giant allocation). Files start from the tiny
valid fixtures (tests/models.py) split into their header fields by
tests/gguf_bytes.py, so each case changes one thing. (Missing files, plain
truncation at a few sizes, a safetensors header 1000 bytes past the end, bad
configs and NaN weights in safetensors are in test_cli_errors.py.)

The CLI runs go through a thread pool (one subprocess each) so the module
stays well under a minute; every case is still its own test.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf_bytes as gb
import models
import numpy as np
import pytest

from intdet.errors import IntdetError

CLI = [sys.executable, "-m", "intdet.cli"]
TIMEOUT = 60


def run_convert(src, out, cache) -> dict:
    env = dict(os.environ, INTDET_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONIOENCODING="utf-8")
    t0 = time.monotonic()
    try:
        p = subprocess.run(CLI + ["convert", str(src), "-o", str(out)], capture_output=True, env=env,
                           timeout=TIMEOUT, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": None, "stdout": "", "stderr": f"timed out after {TIMEOUT} s", "secs": TIMEOUT}
    return {"rc": p.returncode, "stdout": p.stdout.decode("utf-8", "replace"),
            "stderr": p.stderr.decode("utf-8", "replace"), "secs": time.monotonic() - t0}


def assert_rejected(r: dict, src, out, *needles):
    assert r["rc"] is not None, r  # no hang
    assert r["rc"] == 1, r
    assert "Traceback" not in r["stderr"] and "Traceback" not in r["stdout"], r
    lines = r["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("intdet: error: "), r
    for n in (str(src), *needles):
        assert n in lines[0], (n, r)
    assert r["stdout"] == "", r
    assert not os.path.lexists(out), out
    left = [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".intdet-convert-")]
    assert left == [], left


# ------------------------------------------------------------- GGUF cases
# name -> (source qtype, mutate(GGUF) -> bytes, needles in the error line)


def _set_kv(key, value):
    def f(g):
        gb.set_kv(g, key, value)
        return gb.build(g)
    return f


def _tensor(tensor_name, **changes):
    def f(g):
        t = g.tensor(tensor_name)
        for k, v in changes.items():
            setattr(t, k, v(t) if callable(v) else v)
        return gb.build(g)
    return f


def _patch(offset, fmt, value):
    def f(g):
        b = bytearray(gb.build(g))
        struct.pack_into(fmt, b, offset, value)
        return bytes(b)
    return f


def _kv_raw(key, make_raw):
    def f(g):
        kv = g.kv(key)
        kv.raw = make_raw(kv.raw)
        return gb.build(g)
    return f


def _q8_scale(bits):
    """Set the f16 scale of one Q8_0 block of a weight matrix to ``bits``."""
    def f(g):
        t = g.tensor("blk.1.ffn_up.weight")
        assert t.ttype == 8  # Q8_0: blocks of (f16 d, 32 x int8)
        pos = t.offset + 34 * 7  # the 8th block
        g.data = g.data[:pos] + struct.pack("<H", bits) + g.data[pos + 2:]
        return gb.build(g)
    return f


def _dup_name(g):
    t = g.tensor("blk.1.ffn_up.weight")
    t.name = b"blk.0.ffn_up.weight"  # same length: the rest of the header is unchanged
    return gb.build(g)


def _dup_key(g):
    g.kvs.append(gb.KV(g.kvs[2].key, g.kvs[2].vtype, g.kvs[2].raw))
    return gb.build(g)


def _overlap(g):
    a, b = g.tensor("blk.0.attn_norm.weight"), g.tensor("blk.0.attn_q.weight")
    b.offset = a.offset  # both aligned, b now covers a
    return gb.build(g)


def _nested_array(g):
    inner = struct.pack("<IQ", gb.T_UINT32, 1) + struct.pack("<I", 7)
    g.kvs.append(gb.KV(b"general.nested", gb.T_ARRAY, struct.pack("<IQ", gb.T_ARRAY, 1) + inner))
    return gb.build(g)


def _truncate_data(g):
    g.data = g.data[: len(g.data) - 100]
    return gb.build(g)


MAX64 = 2**64 - 1
EOF_LEN = 10**6  # more than the whole tiny file (and than what is left after any field)

GGUF_CASES = {
    "version_1": ("F32", _patch(4, "<I", 1), ["version 1"]),
    "version_big_endian": ("F32", _patch(4, ">I", 3), ["big-endian"]),
    "huge_tensor_count": ("F32", lambda g: gb.build(g, tensor_count=2**63), ["tensor count"]),
    "tensor_count_past_header": ("F32", lambda g: gb.build(g, tensor_count=5000), ["tensor"]),
    "huge_kv_count": ("F32", lambda g: gb.build(g, kv_count=MAX64), ["key/value count"]),
    "key_length_past_eof": ("F32", _patch(24, "<Q", EOF_LEN), ["metadata key #0"]),
    "key_length_2^64-1": ("F32", _patch(24, "<Q", MAX64), ["metadata key #0"]),
    "string_value_past_eof": ("F32", _kv_raw("tokenizer.chat_template", lambda r: struct.pack("<Q", EOF_LEN) + r[8:]),
                              ["tokenizer.chat_template", "truncated"]),
    "string_value_2^64-1": ("F32", _kv_raw("tokenizer.chat_template", lambda r: struct.pack("<Q", MAX64) + r[8:]),
                            ["tokenizer.chat_template"]),
    "token_string_past_eof": ("F32", _kv_raw("tokenizer.ggml.tokens", lambda r: r[:12] + struct.pack("<Q", EOF_LEN) + r[20:]),
                              ["element 0 of metadata 'tokenizer.ggml.tokens'"]),
    "string_array_2^61": ("F32", _kv_raw("tokenizer.ggml.tokens", lambda r: r[:4] + struct.pack("<Q", 2**61) + r[12:]),
                          ["tokenizer.ggml.tokens"]),
    "string_array_past_eof": ("F32", _kv_raw("tokenizer.ggml.tokens", lambda r: r[:4] + struct.pack("<Q", 400_000) + r[12:]),
                              ["tokenizer.ggml.tokens", "truncated"]),
    "int_array_len_wraps": ("F32", _kv_raw("tokenizer.ggml.token_type", lambda r: r[:4] + struct.pack("<Q", 2**62) + r[12:]),
                            ["tokenizer.ggml.token_type"]),
    "int_array_past_eof": ("F32", _kv_raw("tokenizer.ggml.token_type", lambda r: r[:4] + struct.pack("<Q", 300_000) + r[12:]),
                           ["tokenizer.ggml.token_type", "truncated"]),
    "unknown_value_type": ("F32", lambda g: (setattr(g.kvs[1], "vtype", 13), gb.build(g))[1], ["unknown value type 13"]),
    "nested_array": ("F32", _nested_array, ["nested array"]),
    "duplicate_key": ("F32", _dup_key, ["duplicate metadata key"]),
    "key_not_utf8": ("F32", lambda g: (setattr(g.kvs[0], "key", b"general.architectur\xff"), gb.build(g))[1], ["UTF-8"]),
    "five_dims": ("F32", _tensor("blk.0.attn_q.weight", dims=lambda t: t.dims + [1, 1, 1]), ["5 dimensions"]),
    "zero_dims": ("F32", _tensor("blk.0.attn_norm.weight", dims=[]), ["0 dimensions"]),
    "dims_product_wraps_64": ("F32", _tensor("token_embd.weight", dims=[2**32, 2**32]), ["overflow 64 bits"]),
    "dims_bytes_wrap_64": ("F32", _tensor("token_embd.weight", dims=[2**31, 2**31]), ["token_embd.weight", "past the end"]),
    "zero_dimension": ("F32", _tensor("token_embd.weight", dims=[72, 0]), ["zero dimension"]),
    "alignment_zero": ("F32", _set_kv("general.alignment", gb.u32(0)), ["general.alignment 0"]),
    "alignment_not_power_of_two": ("F32", _set_kv("general.alignment", gb.u32(48)), ["general.alignment 48"]),
    "alignment_huge": ("F32", _set_kv("general.alignment", gb.u32(2**31)), ["general.alignment 2147483648"]),
    "alignment_wrong_type": ("F32", _set_kv("general.alignment", gb.u64(64)), ["general.alignment", "UINT64"]),
    "tensor_offset_past_eof": ("F32", _tensor("output.weight", offset=1 << 40), ["output.weight", "past the end"]),
    "tensor_offset_wraps": ("F32", _tensor("output.weight", offset=2**64 - 64), ["output.weight", "past the end"]),
    "tensor_offset_unaligned": ("F32", _tensor("blk.0.attn_q.weight", offset=lambda t: t.offset + 4), ["not a multiple"]),
    "overlapping_tensors": ("F32", _overlap, ["overlap"]),
    "data_shorter_than_shape": ("F32", _tensor("output.weight", dims=lambda t: [t.dims[0], t.dims[1] * 2]),
                                ["output.weight", "past the end"]),
    "data_section_cut": ("F32", _truncate_data, ["output.weight", "past the end"]),
    "unknown_tensor_type": ("F32", _tensor("blk.0.attn_q.weight", ttype=200), ["unknown ggml type id 200"]),
    "block_size_mismatch": ("Q8_0", _tensor("blk.0.attn_q.weight", dims=lambda t: [t.dims[0] - 1, t.dims[1]]),
                            ["block size 32"]),
    "tensor_name_too_long": ("F32", _tensor("blk.0.attn_q.weight", name=b"x" * 100), ["name of tensor #2"]),
    "duplicate_tensor_names": ("F32", _dup_name, ["duplicate tensor name 'blk.0.ffn_up.weight'"]),
    "q8_0_nan_scale": ("Q8_0", _q8_scale(0x7E00), ["blk.1.ffn_up", "NaN or Inf"]),
    "q8_0_inf_scale": ("Q8_0", _q8_scale(0x7C00), ["blk.1.ffn_up", "NaN or Inf"]),
    "unknown_architecture": ("F32", _set_kv("general.architecture", gb.string("gptj")), ["architecture 'gptj'"]),
    "vocab_size_disagrees": ("F32", _set_kv("llama.vocab_size", gb.u32(321)), ["vocab_size 321", "320"]),
    "hparam_wrong_type": ("F32", _set_kv("llama.embedding_length", gb.string("big")), ["llama.embedding_length"]),
    "huge_block_count": ("F32", _set_kv("llama.block_count", gb.u32(2**31)), ["2147483648 layers"]),
    "nan_rms_eps": ("F32", _set_kv("llama.attention.layer_norm_rms_epsilon", (6, struct.pack("<f", float("nan")))),
                    ["llama.attention.layer_norm_rms_epsilon"]),
    "rope_theta_zero": ("F32", _set_kv("llama.rope.freq_base", (6, struct.pack("<f", 0.0))), ["rope theta"]),
    # found by tests/fuzz/fuzz_gguf.py:
    "vocab_size_inf": ("F32", _set_kv("llama.vocab_size", (6, struct.pack("<f", float("inf")))), ["llama.vocab_size"]),
    "tokenizer_pre_array": ("F32", _set_kv("tokenizer.ggml.pre",
                                           (gb.T_ARRAY, struct.pack("<IQ", gb.T_STRING, 1) + gb.string("gpt2")[1])),
                            ["tokenizer.ggml.pre", "expected STRING"]),
    "token_type_floats": ("F32", _kv_raw("tokenizer.ggml.token_type", lambda r: struct.pack("<I", 6) + r[4:]),
                          ["tokenizer.ggml.token_type", "FLOAT32"]),
    "tensor_name_newline": ("F32", _tensor("blk.0.attn_q.weight", name=b"blk.0.attn\n\n\n\n\n\n\n\n\n"),
                            ["control characters"]),
}

# ------------------------------------------------------- safetensors cases


def _st_rewrite(path, edit):
    """Rewrite a safetensors file with edit(header dict) applied; the data
    bytes stay where they were relative to the data section."""
    b = Path(path).read_bytes()
    (n,) = struct.unpack_from("<Q", b, 0)
    header, data = json.loads(b[8:8 + n]), b[8 + n:]
    edit(header)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(hb)) + hb + data)


def _st_header_len(value):
    def f(path):
        b = bytearray(Path(path).read_bytes())
        struct.pack_into("<Q", b, 0, value)
        Path(path).write_bytes(bytes(b))
    return f


def _st_edit(fn):
    return lambda path: _st_rewrite(path, fn)


ST = "model.safetensors"
Q = "model.layers.0.self_attn.q_proj.weight"
NORM0, NORM1 = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"


def _lie_dtype(h):
    h[Q]["dtype"] = "F16"


def _overlap_st(h):
    h[NORM1]["data_offsets"] = list(h[NORM0]["data_offsets"])


def _reversed_offsets(h):
    h[Q]["data_offsets"] = h[Q]["data_offsets"][::-1]


def _offsets_past_2_64(h):
    b = h[Q]["data_offsets"][0]
    h[Q]["data_offsets"] = [b, b + 2**64]


def _shape_wraps(h):
    b = h[Q]["data_offsets"][0]
    h[Q]["shape"], h[Q]["data_offsets"] = [2**21, 2**21, 2**20], [b, b]  # 4 * 2^62 bytes = 0 mod 2^64


def _config_vocab(path):
    cfg_path = os.path.join(os.path.dirname(path), "config.json")
    cfg = json.loads(Path(cfg_path).read_text())
    cfg["vocab_size"] = 321
    Path(cfg_path).write_text(json.dumps(cfg))


def _deep_json(path):
    Path(path).write_bytes(struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000)


ST_CASES = {
    "st_header_len_2^64-1": (_st_header_len(MAX64), [ST, "header length"]),
    "st_header_len_wraps": (_st_header_len(2**64 - 8), [ST, "header length"]),
    "st_dtype_lie": (_st_edit(_lie_dtype), [ST, Q, "F16"]),
    "st_overlapping_offsets": (_st_edit(_overlap_st), [ST, "overlap"]),
    "st_reversed_offsets": (_st_edit(_reversed_offsets), [ST, Q, "offsets"]),
    "st_offset_past_2^64": (_st_edit(_offsets_past_2_64), [ST, Q, "offsets"]),
    "st_shape_bytes_wrap": (_st_edit(_shape_wraps), [ST, Q]),
    "st_vocab_disagrees": (_config_vocab, ["tok_embd", "(321, 72)"]),
    # found by tests/fuzz/fuzz_safetensors.py:
    "st_dtype_list": (_st_edit(lambda h: h[Q].update(dtype=["F32"])), [ST, Q, "unsupported dtype"]),
    "st_dtype_dict": (_st_edit(lambda h: h[Q].update(dtype={"a": 1})), [ST, Q, "unsupported dtype"]),
    "st_deep_json": (_deep_json, [ST, "nested too deeply"]),
    "st_metadata_not_object": (_st_edit(lambda h: h.update(__metadata__=[1])), [ST, "__metadata__"]),
    "st_shape_bool": (_st_edit(lambda h: h[NORM0].update(shape=[True, 72])), [ST, NORM0, "invalid shape"]),
}


# ------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("crafted_src")
    return {
        "F32": Path(models.write_gguf_model(str(d / "f32.gguf"), "F32")).read_bytes(),
        "Q8_0": Path(models.write_gguf_model(str(d / "q8_0.gguf"), "Q8_0")).read_bytes(),
        "hf": models.write_hf_model(str(d / "hf"), "llama"),
    }


@pytest.fixture(scope="module")
def crafted(sources, tmp_path_factory):
    """Write every crafted file, run the CLI on all of them concurrently;
    name -> (src, out, result)."""
    base = tmp_path_factory.mktemp("crafted")
    jobs = {}
    for name, (qtype, mutate, _) in GGUF_CASES.items():
        src = base / f"{name}.gguf"
        src.write_bytes(mutate(gb.parse(sources[qtype])))
        jobs[name] = (src, base / "out" / name)
    for name, (mutate, _) in ST_CASES.items():
        d = shutil.copytree(sources["hf"], base / name)
        st = os.path.join(d, "model.safetensors")
        mutate(st)
        jobs[name] = (d, base / "out" / name)
    (base / "out").mkdir()
    (base / "cache").mkdir()

    def one(item):
        name, (src, out) = item
        return name, run_convert(src, out, base / "cache")

    with ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2))) as ex:
        results = dict(ex.map(one, jobs.items()))
    return {name: (job[0], job[1], results[name]) for name, job in jobs.items()}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_crafted_gguf(crafted, case):
    src, out, r = crafted[case]
    assert_rejected(r, src, out, *GGUF_CASES[case][2])


@pytest.mark.parametrize("case", list(ST_CASES))
def test_crafted_safetensors(crafted, case):
    src, out, r = crafted[case]
    assert_rejected(r, src, out, *ST_CASES[case][1])


# ----------------------------------------------------- positive controls


def test_gguf_bytes_round_trip(sources):
    """The crafting helper rebuilds a valid file byte for byte."""
    for q in ("F32", "Q8_0"):
        assert gb.build(gb.parse(sources[q])) == sources[q]


def test_check_accepts_valid_and_realigned(sources, tmp_path):
    """check_gguf_structure accepts the fixtures, and a re-laid-out file with
    general.alignment = 64 converts (the alignment key is honoured)."""
    from intdet.convert.gguf_check import check_gguf_structure
    from intdet.convert.sources import read_gguf

    p = tmp_path / "f32.gguf"
    p.write_bytes(sources["F32"])
    s = check_gguf_structure(p)
    assert s["alignment"] == 32 and len(s["tensors"]) == 30
    g = gb.parse(sources["F32"])
    gb.relayout(g, 64)
    p64 = tmp_path / "a64.gguf"
    p64.write_bytes(gb.build(g))
    assert check_gguf_structure(p64)["alignment"] == 64
    fm = read_gguf(str(p64))
    ref = read_gguf(str(p))
    assert all(np.array_equal(np.asarray(fm.weights[k]), np.asarray(ref.weights[k]))
               for k in ref.weights if ref.weights[k] is not None)


# ---------------------------------------------------------- truncation


def test_truncated_at_every_header_boundary(sources, tmp_path):
    """In process (fast): a file cut at each field boundary of the header,
    and at each tensor's data start, is refused with IntdetError naming the
    file; nothing else is raised."""
    from intdet.convert.sources import read_gguf

    b = sources["Q8_0"]
    g = gb.parse(b)
    cuts = [c for c in g.boundaries if c < len(b)] + [c - 1 for c in g.boundaries if 0 < c - 1 < len(b)]
    assert len(cuts) > 200
    p = tmp_path / "cut.gguf"
    t0 = time.monotonic()
    for cut in sorted(set(cuts)):
        p.write_bytes(b[:cut])
        with pytest.raises(IntdetError) as ei:
            read_gguf(str(p))
        assert str(p) in str(ei.value), cut
        assert "\n" not in str(ei.value), cut
    assert time.monotonic() - t0 < 30


def test_truncated_sections_through_cli(sources, tmp_path):
    """Through the CLI, one cut in each section: magic, version, counts, a
    key, a value type, an array, a string array, a tensor name, its dims,
    its type, its offset, the padding and the tensor data."""
    b = sources["Q8_0"]
    g = gb.parse(b)
    bd = g.boundaries
    # boundaries: 4 magic, 8 version, 16 and 24 counts, then the first key's
    # length (bd[4]), name (bd[5]) and value type (bd[6]) ...
    data_start = len(b) - len(g.data)
    picks = {"magic": 3, "version": 6, "tensor_count": 12, "kv_count": 20, "key_len": bd[4] - 3,
             "key": bd[5] - 2, "value_type": bd[6] - 1, "string_array": bd[len(bd) // 4],
             "tensor_info": data_start - 120, "padding": data_start - 1, "data": data_start + 1000}
    (tmp_path / "cache").mkdir()
    jobs = []
    for name, cut in picks.items():
        src = tmp_path / f"cut-{name}.gguf"
        src.write_bytes(b[:cut])
        jobs.append((src, tmp_path / f"out-{name}"))
    with ThreadPoolExecutor(max_workers=4) as ex:
        results = list(ex.map(lambda j: run_convert(j[0], j[1], tmp_path / "cache"), jobs))
    for (src, out), r in zip(jobs, results):
        assert_rejected(r, src, out)
