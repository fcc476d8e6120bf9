import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402

import models  # noqa: E402  (tests/models.py: deterministic tiny checkpoints)


@pytest.fixture(scope="session")
def tiny_llama_hf(tmp_path_factory):
    """Path of a tiny LlamaForCausalLM checkpoint dir (float32, untied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_llama_hf")), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_hf(tmp_path_factory):
    """Path of a tiny Qwen2ForCausalLM checkpoint dir (q/k/v bias, tied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_qwen2_hf")), "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_hf(tmp_path_factory):
    """Path of a tiny Qwen3ForCausalLM checkpoint dir (q/k norm, tied)."""
    return models.write_hf_model(str(tmp_path_factory.mktemp("tiny_qwen3_hf")), "qwen3")


@pytest.fixture(scope="session")
def tiny_llama_gguf(tmp_path_factory):
    """Path of an F32 llama GGUF made from models.hf_twin_of_gguf("F32")
    (the same weights as tiny_llama_hf)."""
    return models.write_gguf_model(str(tmp_path_factory.mktemp("tiny_llama_gguf") / "tiny-llama-f32.gguf"), "F32")
