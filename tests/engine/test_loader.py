"""The one loader (csrc/model/loader.cpp) on bad input, called directly
(intdet._core.Model / check_model / model_params) and through load_model:
a clear ValueError / IntdetError naming the file and the key or tensor,
never a skipped check."""

import copy
import json
import os
import shutil

import pytest

from intdet import _core
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import load_model


@pytest.fixture(scope="module")
def lm(tiny_qwen3_hf, tmp_path_factory):
    return load_model(convert(tiny_qwen3_hf, str(tmp_path_factory.mktemp("loader") / "m"), progress=False))


def _bad_cfg(lm, edit):
    cfg = copy.deepcopy(lm.cfg)
    edit(cfg)
    return cfg


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.__setitem__("format_version", 1), r"format_version 1 is not 2; re-convert"),
    (lambda c: c.pop("layers"), r"layers \(the per-layer block description\) is missing"),
    (lambda c: c["layers"].pop(), r"layers describes 2 blocks but num_layers is 3"),
    (lambda c: c["layers"][1].__setitem__("post_ffw_norm", True), r"layers\[1\]\.post_ffw_norm: unknown block feature"),
    (lambda c: c["layers"][0].__setitem__("activation", "gelu"), r"layers\[0\]\.activation 'gelu'"),
    (lambda c: c["layers"][2].__setitem__("attention_window", -1), r"layers\[2\]\.attention_window = -1 is outside"),
    (lambda c: c["layers"][1].__setitem__("rope", "rope_yarn"), r"layers\[1\]\.rope 'rope_yarn'"),
    (lambda c: c.__setitem__("residual_frac_bits", 17), r"residual_frac_bits = 17 is outside \[8, 16\]"),
    (lambda c: c["layers"][0].__setitem__("bias", ["attn_q", "attn_q"]), r"layers\[0\]\.bias names attn_q twice"),
    (lambda c: c["layers"][0].__setitem__("bias", ["ffn_up"]), r"layers\[0\]\.bias holds \"ffn_up\""),
    (lambda c: c["layers"][0].__setitem__("qk_norm", 1), r"layers\[0\]\.qk_norm = 1 is not true or false"),
    (lambda c: c.__setitem__("num_heads", True), r"num_heads = true is not an integer"),
    (lambda c: c.__setitem__("head_dim", 7), r"head counts/sizes outside"),
    (lambda c: c["layers"][1].__setitem__("qk_norm_span", "group"), r"layers\[1\]\.qk_norm_span 'group'"),
    (lambda c: c["layers"][1].update(qk_norm=False, qk_norm_span="head"), r"layers\[1\]\.qk_norm_span without qk_norm"),
    (lambda c: c["layers"][0].__setitem__("qk_norm_span", "projection"), r"rms_eps_q60\.q_proj is missing"),
    (lambda c: c["layers"][0].__setitem__("norms", ["post_ffw_norm"]), r"layers\[0\]\.norms \[\"post_ffw_norm\"\]"),
])
def test_bad_config_is_refused_by_every_entry_point(lm, edit, match):
    cfg = _bad_cfg(lm, edit)
    with pytest.raises(ValueError, match="^cfg.json: " + match):
        _core.model_params(cfg, "cfg.json")
    with pytest.raises(ValueError, match="^cfg.json: " + match):
        _core.check_model(cfg, lm.tensors, "cfg.json", "st")
    with pytest.raises(ValueError, match="^cfg.json: " + match):
        _core.Model(cfg, lm.tensors, config_path="cfg.json")


def test_tensor_errors_name_the_tensor(lm):
    t = dict(lm.tensors)
    extra = dict(t, **{"blk.0.attn_output.bias": t["output_norm.g"].astype("int32")})
    with pytest.raises(ValueError, match=r"^st: tensor 'blk\.0\.attn_output\.bias' is not part of the model"):
        _core.Model(lm.cfg, extra, tensors_path="st")
    missing = {k: v for k, v in t.items() if k != "blk.2.ffn_norm.g"}
    with pytest.raises(ValueError, match=r"^st: missing tensor 'blk\.2\.ffn_norm\.g'"):
        _core.check_model(lm.cfg, missing, "c", "st")
    wrong = dict(t, **{"rope.cos": t["rope.cos"].astype("int32")})
    with pytest.raises(ValueError, match=r"^st: tensor 'rope\.cos' is I32\[256, 24\], expected I16\[256, 24\]"):
        _core.check_model(lm.cfg, wrong, "c", "st")
    with pytest.raises(ValueError, match=r"tensor 'rope\.sin' has dtype float64"):
        _core.check_model(lm.cfg, dict(t, **{"rope.sin": t["rope.sin"].astype("float64")}), "c", "st")


def test_a_version_1_directory_gets_one_line(lm, tmp_path):
    d = tmp_path / "v1"
    shutil.copytree(lm.path, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["format_version"] = 1
    del cfg["layers"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntdetError, match=r"config\.json: format_version 1 is not 2; re-convert the model$"):
        load_model(str(d))
    assert os.path.isfile(d / "model.safetensors")  # nothing touched
