"""examples/grpo_trl.py at its smallest size: TRL's GRPOTrainer trains a
tiny Qwen3 for 2 steps with intdet generating the rollouts. Every step's
receipts replay bit for bit (in-process on a fresh conversion of that step's
weights, and with `intdet verify` on another kernel set and thread count);
model_version changes every step, equals what update_weights returned, what
every rollout reports and the hash of a fresh convert; the receipts of one
step do not verify against another step's model; the trainer/intdet
mismatch numbers are finite (their size is not asserted: it is measured)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import ISAS

pytest.importorskip("trl", reason="the example needs trl (pip install 'intdet[rl]')")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, PROMPTS, SAMPLES = 2, 2, 2


def _example():
    spec = importlib.util.spec_from_file_location("grpo_trl", os.path.join(ROOT, "examples", "grpo_trl.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["grpo_trl"] = mod  # its dataclass looks its module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("grpo")
    return d, _example().run(str(d), steps=STEPS, prompts=PROMPTS, samples=SAMPLES, max_tokens=4, threads=2)


def test_every_step_replays_bit_for_bit(run):
    _, steps = run
    assert [s.step for s in steps] == list(range(STEPS))
    for s in steps:
        assert (s.verified, s.mismatched) == (PROMPTS * SAMPLES, 0), s
        lines = open(s.receipts).read().splitlines()
        assert len(lines) == PROMPTS * SAMPLES
        assert all(json.loads(x)["receipt"]["model_sha256"] == s.model_version for x in lines)


def test_model_version_changes_every_step_and_names_every_rollout(run):
    _, steps = run
    assert len({s.model_version for s in steps}) == STEPS
    for s in steps:
        assert len(s.model_version) == 64
        assert s.versions == [s.model_version] * (PROMPTS * SAMPLES)
        assert s.converted_version == s.model_version  # update_weights' hash is a fresh convert's


def test_mismatch_numbers_are_finite(run):
    _, steps = run
    for s in steps:
        assert s.tokens > 0
        for m in (s.behaviour, s.raw):
            assert set(m) == {"mean_abs", "max_abs", "k3"}
            assert all(math.isfinite(v) for v in m.values()), m
            assert 0 <= m["mean_abs"] <= m["max_abs"]
        assert math.isfinite(s.reward)


def _verify(receipts, model_dir):
    env = dict(os.environ, INTDET_ISA=ISAS[0])
    return subprocess.run([sys.executable, "-m", "intdet", "verify", receipts, "-m", model_dir, "--threads", "1"],
                          capture_output=True, text=True, env=env)


def test_intdet_verify_on_another_kernel_set_and_another_steps_model(run):
    d, steps = run
    last, first = steps[-1], steps[0]
    r = _verify(last.receipts, str(d / f"step{last.step}" / "model"))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == PROMPTS * SAMPLES and all(x.endswith(": match") for x in lines)
    r = _verify(last.receipts, str(d / f"step{first.step}" / "model"))  # the policy before the update
    assert r.returncode == 1
    assert r.stdout.count("MISMATCH: model differs") == PROMPTS * SAMPLES


def test_problems_names_what_went_wrong(run):
    import dataclasses

    ex = _example()
    _, steps = run
    assert ex.problems(steps) == []
    same = [steps[0], dataclasses.replace(steps[1], model_version=steps[0].model_version,
                                          versions=[steps[0].model_version] * len(steps[1].versions))]
    assert any("is step 0's" in p for p in ex.problems(same))
    bad = [dataclasses.replace(steps[0], verified=1, mismatched=1)]
    assert ex.problems(bad) == ["step 0: 1 of 2 receipts do not replay"]


def test_bad_arguments_are_one_line_errors(capsys):
    ex = _example()
    for args, msg in ((["--samples", "1"], "--samples 1: a GRPO group needs at least 2"),
                      (["--steps", "0"], "--steps 0: must be >= 1"), (["--workers", "-1"], "--workers -1")):
        with pytest.raises(SystemExit) as e:
            ex.main(args)
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_table_has_a_row_per_step(run):
    _, steps = run
    rows = _example().table(steps).splitlines()
    assert len(rows) == STEPS + 1
    assert rows[1].split()[1] == steps[0].model_version[:12]
