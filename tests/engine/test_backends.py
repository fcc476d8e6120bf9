"""The backends table (python/intdet/backends/__init__.py): a backend is
one module with intdet._core's API and one row; Engine, State, the
scheduler (batches, prefix cache, speculation) and hash-check run any row
without knowing its name; a device that cannot run gives one line naming
it and why."""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys

import numpy as np
import pytest

import fake_backend
from intdet import backends
from intdet.convert import convert
from intdet.errors import IntdetError
from intdet.model import Engine, load_model


@pytest.fixture(scope="module")
def lm(tmp_path_factory, tiny_llama_hf):
    return load_model(convert(tiny_llama_hf, str(tmp_path_factory.mktemp("b") / "m"), progress=False))


@pytest.fixture
def fake(monkeypatch):
    """fake_backend registered as device "fake": one row added, nothing else."""
    monkeypatch.setitem(backends.BACKENDS, "fake", backends.Backend("fake", "fake_backend", "fake (tests)"))
    monkeypatch.setattr(fake_backend, "REASON", None)
    fake_backend.calls.clear()
    return fake_backend


def _generate(engine, prompts, **kw):
    from intdet.api import LLM
    from intdet.scheduler import Request

    reqs = [Request(p, 12) for p in prompts]
    LLM(engine, max_batch=4, **kw).run(reqs)
    return [(r.tokens, r.hash) for r in reqs]


def test_a_registered_module_runs_through_engine_state_and_scheduler(lm, fake):
    """The fake backend gives the cpu's logits through State.forward,
    forward_batch (with an out buffer), truncate and copy_prefix, and the
    scheduler's tokens and chain hashes with batching, the prefix cache and
    n-gram speculation; every call went to its module."""
    cpu, eng = Engine(lm, "cpu"), Engine(lm, "fake")
    assert eng.backend is fake and fake.calls == ["Model"]
    ids = [1, 7, 9, 4, 7, 9, 4, 2]
    want = cpu.new_state(32).forward(ids, all_logits=True)
    s = eng.new_state(32)
    assert np.array_equal(s.forward(ids, all_logits=True), want) and s.n_past == 8
    s.truncate(5)
    assert np.array_equal(s.forward(ids[5:]), want[-1:])
    t = eng.new_state(32)
    t.copy_prefix(s, 6)
    a, b = eng.new_state(32), eng.new_state(32)
    out = np.zeros((1 + 3 + 1, lm.cfg["vocab_size"]), np.int32)  # the rows: 1, 3 (all logits), 1
    got = eng.forward_batch([a, b, t], [ids[:4], ids[:3], ids[6:]], [False, True, False], out=out)
    assert all(np.shares_memory(g, out) for g in got)
    assert np.array_equal(got[0], want[3:4]) and np.array_equal(got[1], want[:3]) and np.array_equal(got[2], want[-1:])
    assert (a.n_past, b.n_past, t.n_past) == (4, 3, 8)
    assert {"forward", "truncate", "copy_prefix", "forward_batch"} <= set(fake.calls)
    # the scheduler: shared headers (prefix cache), repeats (n-gram drafts), several in a batch
    head = list(range(30, 60))
    prompts = [head + [5, 6, 5, 6, 5, 6], head + [8, 9, 8, 9], [3, 4, 3, 4, 3, 4, 3]]
    fake.calls.clear()
    assert _generate(eng, prompts, spec_tokens=4) == _generate(cpu, prompts, prefix_cache=False)
    assert {"forward_batch", "copy_prefix"} <= set(fake.calls)
    assert (eng.isa, eng.available_isas(), eng.threads, eng.device_name) == ("fake", ["fake"], 1, "fake adapter")
    assert not eng.cuda_graphs and not s.device_pick
    with pytest.raises(IntdetError, match="^set_isa: the fake backend has one kernel set$"):
        eng.set_isa("scalar")
    with pytest.raises(IntdetError, match="^cuda_graphs: the fake backend has no CUDA graphs$"):
        eng.cuda_graphs = True
    from intdet.trace import first_divergence, trace_names

    assert first_divergence(eng.trace(ids), cpu.trace(ids), trace_names(lm.cfg)) is None


def test_model_py_never_tests_the_device_name():
    """Engine and State compare no device name (the table's capabilities
    decide): no comparison in model.py reads a ``device`` name or attribute."""
    import intdet.model as M

    tree = ast.parse(inspect.getsource(M))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            attrs = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            assert "device" not in names | attrs, ast.unparse(node)


def test_a_device_that_cannot_run_says_why(lm, fake, monkeypatch, tmp_path):
    """available()'s reason, a module that cannot be imported (missing, or
    its native library missing) and a name not in the table: one line
    naming the device (field "device"), and availability() gives the same
    line without raising."""
    fake.REASON = "no adapter on this machine"
    with pytest.raises(IntdetError, match=r"^device fake: not available \(no adapter on this machine\)$") as e:
        Engine(lm, "fake")
    assert e.value.field == "device" and backends.availability("fake") == str(e.value)
    monkeypatch.setitem(sys.modules, "intdet.webgpu.backend", None)  # as if the module were not there
    msg = r"^device webgpu: no WebGPU adapter available \(intdet.webgpu.backend cannot be imported: .+\)$"
    with pytest.raises(IntdetError, match=msg):
        Engine(lm, "webgpu")
    assert backends.availability("webgpu").startswith("device webgpu: no WebGPU adapter available (")
    (tmp_path / "nolib_backend.py").write_text("raise OSError('libwgpu_native.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(backends.BACKENDS, "nolib", backends.Backend("nolib", "nolib_backend", "nolib (tests)"))
    with pytest.raises(IntdetError, match=r"^device nolib: not available \(nolib_backend cannot be imported: libwgpu"):
        Engine(lm, "nolib")
    with pytest.raises(IntdetError, match=r"^device 'tpu' is not available \(choose from cpu, cuda, ref, webgpu"):
        Engine(lm, "tpu")


def test_every_device_option_lists_the_table():
    """--device of the verbs (generate, serve, batch...) offers the table's names, webgpu included."""
    from click.testing import CliRunner

    from intdet.cli import main

    for verb in ("generate", "serve", "batch", "perplexity", "compress"):
        r = CliRunner().invoke(main, [verb, "--help"], terminal_width=200)
        assert r.exit_code == 0 and "[cpu|cuda|ref|webgpu]" in r.output, (verb, r.output)
    r = CliRunner().invoke(main, ["hash-check", "--help"], terminal_width=200)
    assert "[cpu|cuda|webgpu]" in r.output


def _hash_check(lm, *args):
    from click.testing import CliRunner

    from intdet.cli import main

    r = CliRunner().invoke(main, ["hash-check", "-m", os.path.dirname(lm.st_path), "--steps", "3", "--prompt",
                                  "hello", *args])
    return r.exit_code, r.output


def test_hash_check_lists_webgpu_runs_or_why_not(lm, fake, monkeypatch):
    """hash-check --device webgpu runs the device configurations against a
    CPU run when the backend can run (here the fake in webgpu's place), and
    is one error line naming why when it cannot; the CPU matrix says, for
    each device it did not run, whether it is available or why not."""
    monkeypatch.setitem(sys.modules, "intdet.webgpu.backend", fake)
    code, out = _hash_check(lm, "--device", "webgpu", "--json")
    assert code == 0, out
    res = json.loads(out.strip().splitlines()[-1])
    configs = [x["config"] for x in res["runs"]]
    assert res["all_equal"] and len(configs) == 8 and configs[1] == "webgpu (fake adapter), prefill whole"
    assert "webgpu, inside a batch of 8" in configs and not any("CUDA graphs" in c for c in configs)
    fake.REASON = "no adapter found"
    code, out = _hash_check(lm, "--device", "webgpu")
    assert code == 1 and out.strip() == "intdet: error: --device webgpu: no WebGPU adapter available (no adapter found)"
    code, out = _hash_check(lm, "--json")
    assert code == 0 and json.loads(out)["other_devices"]["webgpu"] == (
        "device webgpu: no WebGPU adapter available (no adapter found)")
    fake.REASON = None
    code, out = _hash_check(lm)
    assert code == 0 and "(no webgpu runs: available here; --device webgpu runs them)" in out


def test_the_ref_backend_is_the_core_api(lm):
    """ref/backend.py answers as intdet._core does: forward and
    forward_batch write into ``out`` (views of it) with the core's checks
    and messages, and its trace is the CPU's on every name it records."""
    from intdet.trace import first_divergence

    cpu, ref = Engine(lm, "cpu"), Engine(lm, "ref")
    V, ids = lm.cfg["vocab_size"], [3, 1, 4, 1, 5]
    for bad, msg in ((np.zeros((2, V), np.int32), rf"^out: shape \[1, {V}\] expected$"),
                     (np.zeros((1, V), np.int64), "^out: an int32 numpy array expected$"),
                     (np.zeros((1, 2 * V), np.int32)[:, ::2], "^out: a writable C-contiguous array expected$")):
        for eng in (cpu, ref):
            with pytest.raises(ValueError, match=msg):
                eng.new_state(8).forward(ids, out=bad)
    outs = {}
    for eng in (cpu, ref):
        out = np.zeros((len(ids) + 1, V), np.int32)
        got = eng.forward_batch([eng.new_state(8), eng.new_state(8)], [ids, ids[:2]], [True, False], out=out)
        assert all(np.shares_memory(g, out) for g in got) and [g.shape for g in got] == [(5, V), (1, V)]
        outs[eng.device] = out
    assert np.array_equal(outs["cpu"], outs["ref"])
    got, want = ref.trace(ids), cpu.trace(ids)
    assert first_divergence(want, got, list(got)) is None and set(got) <= set(want)


def test_a_minimal_module_gets_the_optional_controls(lm, monkeypatch):
    """A module with only Model, State, forward, forward_batch, device_name
    and available() -> (ok, detail) (no kernel-set, thread or trace calls)
    runs: the controls answer as a one-kernel-set device, trace says there
    is none, and (False, why) is the device error."""
    import types

    mod = types.ModuleType("minimal_backend")
    for name in ("Model", "State", "forward", "forward_batch", "device_name"):
        setattr(mod, name, getattr(fake_backend, name))
    mod.available = lambda: (True, "fake adapter")
    monkeypatch.setitem(sys.modules, "minimal_backend", mod)
    monkeypatch.setitem(backends.BACKENDS, "mini", backends.Backend("mini", "minimal_backend", "mini (tests)"))
    eng = Engine(lm, "mini", threads=0)
    assert (eng.isa, eng.available_isas(), eng.threads, eng.thread_setting, eng.last_forward_threads()) == (
        "mini", ["mini"], 1, 0, 1)
    eng.set_threads(4)
    ids = [2, 7, 1, 8]
    assert np.array_equal(eng.new_state(8).forward(ids), Engine(lm, "cpu").new_state(8).forward(ids))
    with pytest.raises(IntdetError, match="^trace: the mini backend has no trace$"):
        eng.trace(ids)
    with pytest.raises(IntdetError, match="^set_isa: the mini backend has one kernel set$"):
        eng.set_isa("scalar")
    mod.available = lambda: (False, "no adapter")
    with pytest.raises(IntdetError, match=r"^device mini: not available \(no adapter\)$"):
        Engine(lm, "mini")
