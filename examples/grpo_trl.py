"""GRPO with TRL's GRPOTrainer, intdet generating the rollouts (docs/rl.md).

TRL's ``rollout_func`` hook (trl >= 1.16; experimental there) hands each
step's prompts to an outside engine. Here that engine is intdet: a tiny
Qwen3 (the TINY shape of intdet.random_model, float32) is trained with
torch on the CPU for a few steps; before each step's rollouts the trainer's
weights are pushed with ``update_weights(model.state_dict())``; every
rollout carries its receipt, its ``model_version`` and per token the exact
behaviour and raw log-probabilities. At the end every step's weights are
converted afresh from a saved checkpoint and each step's receipts
(``RUN/stepK/receipts.jsonl``) are replayed bit for bit on that conversion,
as ``intdet verify RUN/stepK/receipts.jsonl -m RUN/stepK/model`` would.

Per step it reports the mismatch between the trainer's float log-probs (a
torch forward of the same tokens) and intdet's, as RL users measure a
rollout engine against its trainer: with r = log p_trainer - log p_intdet
per completion token, mean and max of |r| and the k3 estimator of
KL(intdet || trainer), mean of exp(r) - 1 - r.

    python examples/grpo_trl.py                       # 5 steps, 4 prompts x 4 samples
    python examples/grpo_trl.py --workers 2           # rollouts on intdet.rl.RolloutPool (Ray)

Needs ``pip install 'intdet[rl]'`` (trl, and ray for --workers).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL: we know

PROMPTS = ["The cat", "A story about", "Once upon a time", "In the morning", "She said", "Numbers:",
           "The weather is", "My favourite"]


@dataclasses.dataclass
class StepRecord:
    """One training step's rollouts: what the example prints and checks."""

    step: int
    model_version: str  # what update_weights returned (the initial conversion's at step 0)
    versions: list  # each rollout's Completion.model_version
    reward: float  # mean reward of the step's rollouts
    tokens: int  # completion tokens compared
    behaviour: dict  # |r| mean/max and k3 of trainer (tempered) vs intdet behaviour log-probs
    raw: dict  # the same for trainer (temperature 1) vs intdet raw log-probs
    update_s: float  # update_weights seconds (0 at step 0)
    receipts: str  # the step's receipts.jsonl
    checkpoint: str  # the step's weights, saved as a Hugging Face checkpoint
    verified: int = 0  # receipts that replayed bit for bit
    mismatched: int = 0
    converted_version: str = ""  # sha256 of a fresh `intdet convert` of the checkpoint


def mismatch(trainer_lp: list, intdet_lp: list) -> dict:
    """Mean and max of |r| and mean k3 = exp(r) - 1 - r, r = trainer - intdet
    per token (k3: Schulman's estimator of KL(intdet || trainer) from
    intdet's samples, as verl and prime-rl report rollout mismatch)."""
    rs = [a - b for a, b in zip(trainer_lp, intdet_lp)]
    if not rs:
        return {"mean_abs": 0.0, "max_abs": 0.0, "k3": 0.0}
    return {"mean_abs": sum(abs(r) for r in rs) / len(rs), "max_abs": max(abs(r) for r in rs),
            "k3": sum(math.expm1(r) - r for r in rs) / len(rs)}


def lowercase_reward(tokenizer):
    """Toy reward: the fraction of completion tokens that are lowercase
    ASCII letters only (a random tiny model rarely makes them)."""
    good = {i for i in range(len(tokenizer)) if (t := tokenizer.decode([i])).isascii() and t.isalpha() and t.islower()}

    def reward(completion_ids, **_):
        return [sum(t in good for t in ids) / max(len(ids), 1) for ids in completion_ids]

    return reward


class IntdetRollouts:
    """TRL's ``rollout_func(prompts, trainer)``: pushes the trainer's
    weights when they changed, generates the step's GRPO groups on intdet
    (token ids in, token ids out) and records the step."""

    def __init__(self, engine, tokenizer, run_dir: str, max_tokens: int, temperature: float, seed: int):
        self.engine, self.tokenizer, self.run_dir = engine, tokenizer, run_dir
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.steps: list = []
        self.pushed_step = 0

    def __call__(self, prompts: list, trainer) -> dict:
        import torch

        from intdet import SamplingParams, derive_seed

        step = trainer.state.global_step
        t0 = time.perf_counter()
        if step != self.pushed_step:  # the optimizer stepped: push the new policy
            version = self.engine.update_weights(trainer.model.state_dict())
            self.pushed_step = step
        else:
            version = self.engine.model_version
        update_s = time.perf_counter() - t0 if step else 0.0
        # every step's weights on disk, to convert afresh and replay the receipts against at the end
        ckpt = os.path.join(self.run_dir, f"step{step}", "hf")
        trainer.model.save_pretrained(ckpt)
        self.tokenizer.save_pretrained(ckpt)

        n = trainer.num_generations  # TRL repeats each prompt n times, consecutively
        groups = prompts[::n]
        assert all(prompts[i] == groups[i // n] for i in range(len(prompts))), "prompts not in groups of n"
        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in groups]
        params = SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, seed=self.seed + step,
                                logprobs=0, receipt=True)
        if hasattr(self.engine, "workers"):  # intdet.rl.RolloutPool: groups of n, spread over the actors
            outs = [c for group in self.engine.generate(ids, params, n=n) for c in group]
        else:  # one LLM: sample i of a group seeded as RolloutPool seeds it
            jobs = [(p, dataclasses.replace(params, seed=derive_seed(params.seed, i))) for p in ids for i in range(n)]
            outs = self.engine.generate([p for p, _ in jobs], [sp for _, sp in jobs])

        # the trainer's float log-probs of the same tokens: TRL's policy is softmax(logits / temperature)
        tr_tempered, tr_raw, mu, raw = [], [], [], []
        with torch.no_grad():
            for c in outs:
                if not c.tokens:
                    continue
                seq = torch.tensor([c.prompt_ids + c.tokens])
                logits = trainer.model(seq).logits[0, len(c.prompt_ids) - 1:-1].double()
                tgt = torch.tensor(c.tokens).unsqueeze(1)
                tr_tempered += torch.log_softmax(logits / self.temperature, -1).gather(1, tgt)[:, 0].tolist()
                tr_raw += torch.log_softmax(logits, -1).gather(1, tgt)[:, 0].tolist()
                mu += [t.behaviour_logprob for t in c.logprobs]
                raw += [t.logprob for t in c.logprobs]

        receipts = os.path.join(self.run_dir, f"step{step}", "receipts.jsonl")
        with open(receipts + ".tmp", "w", encoding="utf-8") as f:
            for c in outs:
                f.write(json.dumps({"model_version": c.model_version, "receipt": c.receipt}) + "\n")
        os.replace(receipts + ".tmp", receipts)

        self.steps.append(StepRecord(step, version, [c.model_version for c in outs], 0.0, len(mu),
                                     mismatch(tr_tempered, mu), mismatch(tr_raw, raw), update_s, receipts, ckpt))
        return {"prompt_ids": [c.prompt_ids for c in outs], "completion_ids": [c.tokens for c in outs],
                "logprobs": [[t.behaviour_logprob for t in c.logprobs] for c in outs]}


def verify_steps(steps: list, run_dir: str, threads: int = 1) -> None:
    """Convert each step's saved checkpoint afresh and replay its receipts
    on it (receipts.replay, what `intdet verify` runs); fills each
    StepRecord's converted_version, verified and mismatched."""
    from intdet import LLM
    from intdet.cli.verify import read_receipts
    from intdet.convert import convert
    from intdet.receipts import replay

    for s in steps:
        model_dir = os.path.join(os.path.dirname(s.checkpoint), "model")
        convert(s.checkpoint, model_dir, force=True, progress=False)
        llm = LLM(model_dir, threads=threads, prefix_cache=False)
        s.converted_version = llm.model_version
        verdicts = replay(llm, read_receipts(s.receipts), model_name=model_dir)
        s.verified = sum(v.ok for v in verdicts)
        s.mismatched = len(verdicts) - s.verified
        for v in verdicts:
            if not v.ok:
                print(v.line(), file=sys.stderr)


def run(run_dir: str, steps: int = 5, prompts: int = 4, samples: int = 4, max_tokens: int = 8,
        temperature: float = 0.8, lr: float = 2e-3, workers: int = 0, seed: int = 1, threads=None) -> list:
    """Train for ``steps`` GRPO steps of ``prompts`` x ``samples`` rollouts
    in ``run_dir`` (made; its contents are the model, each step's
    checkpoint, conversion and receipts) and verify them; returns the
    [StepRecord]. ``workers`` 0: one in-process LLM, else a RolloutPool of
    that many Ray actors."""
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from intdet import LLM
    from intdet.convert import convert
    from intdet.random_model import write_hf_model

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # TRL 1.16 on transformers 5: renamed arguments
    torch.manual_seed(seed)
    hf_dir, model_dir = os.path.join(run_dir, "hf"), os.path.join(run_dir, "model")
    write_hf_model(hf_dir, "qwen3")  # the TINY shape, float32, deterministic weights
    convert(hf_dir, model_dir, force=True, progress=False)
    policy = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)

    if workers:
        from intdet.rl import RolloutPool

        engine = RolloutPool(model_dir, workers=workers)
    else:
        engine = LLM(model_dir, threads=threads)
    try:
        rollouts = IntdetRollouts(engine, tokenizer, run_dir, max_tokens, temperature, seed)
        data = datasets.Dataset.from_dict({"prompt": (PROMPTS * (prompts * steps // len(PROMPTS) + 1))[:prompts * steps]})
        args = GRPOConfig(output_dir=os.path.join(run_dir, "trl"), max_steps=steps, learning_rate=lr,
                          per_device_train_batch_size=prompts * samples, num_generations=samples,
                          max_completion_length=max_tokens, temperature=temperature, beta=0.0,
                          logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                          seed=seed, shuffle_dataset=False, disable_tqdm=True, log_completions=False)
        trainer = GRPOTrainer(model=policy, reward_funcs=lowercase_reward(tokenizer), args=args, train_dataset=data,
                              processing_class=tokenizer, rollout_func=rollouts)
        trainer.remove_callback(transformers.PrinterCallback)  # the table below says it per step
        trainer.train()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
        for s, r in zip(rollouts.steps, rewards):
            s.reward = r
    finally:
        if workers:
            engine.close()
    verify_steps(rollouts.steps, run_dir)
    return rollouts.steps


def problems(steps: list) -> list:
    """What the run got wrong, one line each (none: every receipt
    replayed, each step's version is new, is what every rollout of the step
    reports and is the sha256 of a fresh convert of the step's weights)."""
    out = []
    seen: dict = {}
    for s in steps:
        if s.model_version in seen:
            out.append(f"step {s.step}: model_version {s.model_version[:12]} is step {seen[s.model_version]}'s")
        seen.setdefault(s.model_version, s.step)
        if s.mismatched or not s.verified:
            out.append(f"step {s.step}: {s.mismatched} of {s.verified + s.mismatched} receipts do not replay")
        if s.converted_version != s.model_version:
            out.append(f"step {s.step}: version {s.model_version[:12]}, a fresh convert {s.converted_version[:12]}")
        if any(v != s.model_version for v in s.versions):
            out.append(f"step {s.step}: a rollout reports another version ({sorted(set(s.versions))})")
    return out


def table(steps: list) -> str:
    """The per-step table the example prints."""
    head = (f"{'step':>4}  {'version':<12}  {'update s':>8}  {'reward':>6}  {'tokens':>6}  "
            f"{'|r| mean':>8}  {'|r| max':>8}  {'k3':>9}  {'raw |r| mean':>12}  {'raw |r| max':>11}  {'replayed':>8}")
    rows = [head]
    for s in steps:
        b, r = s.behaviour, s.raw
        rows.append(f"{s.step:>4}  {s.model_version[:12]:<12}  {s.update_s:>8.3f}  {s.reward:>6.3f}  {s.tokens:>6}  "
                    f"{b['mean_abs']:>8.4f}  {b['max_abs']:>8.4f}  {b['k3']:>9.2e}  {r['mean_abs']:>12.4f}  "
                    f"{r['max_abs']:>11.4f}  {s.verified:>3}/{s.verified + s.mismatched:<4}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt (the GRPO group)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--workers", type=int, default=0, help="0: one LLM in this process; N: a RolloutPool of N Ray actors")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None, help="run directory (default: a temporary one, removed)")
    a = ap.parse_args(argv)
    for name in ("steps", "prompts", "samples", "max_tokens"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: must be >= 1")
    if a.samples < 2:
        ap.error(f"--samples {a.samples}: a GRPO group needs at least 2 samples (TRL's num_generations)")
    if a.workers < 0:
        ap.error(f"--workers {a.workers}: must be >= 0")
    if not 0 < a.temperature <= 100:
        ap.error(f"--temperature {a.temperature}: must be in (0, 100]")
    run_dir = a.out or tempfile.mkdtemp(prefix="intdet-grpo-")
    os.makedirs(run_dir, exist_ok=True)
    t0 = time.perf_counter()
    try:
        steps = run(run_dir, a.steps, a.prompts, a.samples, a.max_tokens, a.temperature, a.lr, a.workers, a.seed)
        print(table(steps))
        print(f"r = trainer float log-prob - intdet's, per completion token; behaviour at temperature "
              f"{a.temperature} (trainer: log_softmax(logits / T)), raw at 1; {time.perf_counter() - t0:.1f} s")
        bad = problems(steps)
        for line in bad:
            print(f"error: {line}", file=sys.stderr)
        if a.out:
            print(f"replay any step elsewhere: intdet verify {steps[-1].receipts} -m "
                  f"{os.path.join(os.path.dirname(steps[-1].checkpoint), 'model')}")
        return 1 if bad else 0
    finally:
        if not a.out:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
