"""scripts/webgpu_host_cost.py: the dispatches of a decode step as the
forward records them (15 a Qwen3 layer + 3) and the host's time with the
GPU stubbed; the stubs are put back afterwards."""

import importlib.util
import json
import os

import families
import numpy as np
from intdet.convert import convert

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("webgpu_host_cost",
                                              os.path.join(HERE, "..", "..", "scripts", "webgpu_host_cost.py"))
hc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hc)


def test_counts_a_qwen3_step_and_restores_the_gpu(tmp_path, capsys):
    import wgpu.backends.wgpu_native as native

    from intdet.webgpu import backend as W
    from intdet.webgpu import kernels as K

    path = convert(families.write_family("qwen3", str(tmp_path / "hf")), str(tmp_path / "int"), progress=False)
    submit, run = native.GPUQueue.submit, K.Recorder.run
    assert hc.main(["-m", path, "--steps", "3", "--repeats", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    layers = json.load(open(os.path.join(path, "config.json")))["num_layers"]
    assert r["dispatches"] == 15 * layers + 3 and r["host_ms"] > 0 and r["linears"] in ("coop", "channel")
    assert native.GPUQueue.submit is submit and K.Recorder.run is run
    # the GPU really runs again: a forward after the measurement gives logits, not the stub's zeros
    import intdet

    m = intdet.load(path, device="webgpu").engine._model
    assert np.any(W.forward(m, W.State(m, 8), [1, 2, 3], 0))
    assert hc.main(["--steps", "0"]) == 2
