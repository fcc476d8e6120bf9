"""``intdet hash-check``: the same generation under every configuration this
machine offers, compared bit for bit through the chain hash.

Configurations: each CPU kernel set (ISA) x thread counts 1, 2 and all cores;
prefill whole, token by token and in chunks of 7; alone and inside batches of
4 and 8 with random co-prompts of other lengths; greedy and one seeded
sampled run. Every run decodes exactly ``steps`` tokens (EOS does not stop
it) so all runs are comparable step by step.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import xxhash

from .errors import IntdetError
from .hashing import ChainHash
from .model import Engine, default_threads
from .sampling import Sampler
from .scheduler import Request


@dataclass
class Run:
    config: str
    hash: str = ""
    tokens_hash: str = ""
    step_hashes: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    seconds: float = 0.0
    group: str = "greedy"  # runs are compared within a group
    diverges_at: int | None = None  # first step whose hash differs from the group's first run (1-based)


def _tokens_hash(tokens) -> str:
    return xxhash.xxh3_128(b"".join(int(t).to_bytes(4, "little") for t in tokens)).hexdigest()[:12]


def run_one(engine: Engine, prompt, steps: int, sampler: Sampler, prefill_chunk: int = 0,
            batch: int = 1, co_seed: int = 0) -> Run:
    """Generate ``steps`` tokens for ``prompt`` through ``LLM`` on ``engine``
    (the product's loop, as it is set: ISA, threads), the prompt in calls of
    ``prefill_chunk`` tokens (0: one call); with batch > 1 the sequence runs
    inside a batch with batch-1 random co-prompts (greedy, own lengths,
    submitted with it)."""
    from .api import LLM

    lm = engine.lm
    rng = random.Random(co_seed)
    cos = [[rng.randrange(lm.cfg["vocab_size"]) for _ in range(rng.randrange(1, max(2, len(prompt) * 2)))]
           for _ in range(batch - 1)]
    budget = prefill_chunk or len(prompt) + sum(len(c) for c in cos)
    # no prefix cache: every run computes its whole prompt in the configuration's chunks
    llm = LLM(engine, max_batch=batch, step_tokens=budget, kv_bytes=1 << 62, prefix_cache=False)
    t0 = time.perf_counter()
    req = Request(prompt, steps, sampler, step_hashes=True)  # no EOS: every run makes `steps` tokens
    reqs = [req] + [Request(c, steps) for c in cos]
    llm.run(reqs)
    failed = [q for q in reqs if q.finish_reason == "error"]
    if failed:  # the scheduler retires a request whose step raised: its hash would cover a cut run
        raise IntdetError(f"the engine failed during the run: {failed[0].error}")
    r = Run(config="", hash=req.hash, step_hashes=list(req.step_hashes), tokens=list(req.tokens),
            seconds=time.perf_counter() - t0)
    r.tokens_hash = _tokens_hash(r.tokens)
    return r


def configurations(isas, threads_all: int):
    """(label, isa, threads, prefill_chunk, batch) for the greedy matrix."""
    thread_counts = sorted({1, 2, threads_all})
    out = [(f"{isa}, {th} thread{'s' if th > 1 else ''}", isa, th, 0, 1) for isa in isas for th in thread_counts]
    best = isas[-1]
    out += [
        (f"{best}, prefill token by token", best, threads_all, 1, 1),
        (f"{best}, prefill in chunks of 7", best, threads_all, 7, 1),
        (f"{best}, inside a batch of 4", best, threads_all, 0, 4),
        (f"{best}, inside a batch of 8", best, threads_all, 0, 8),
        (f"{best}, auto threads (fewer while the cores are busy)", best, 0, 0, 1),
    ]
    return out


def hash_check(engine: Engine, prompt, steps: int, seed: int = 0, temperature: str = "0.8",
               with_ref: bool = False, progress=None) -> list[Run]:
    """Run the matrix; returns the runs with ``diverges_at`` filled in."""
    isas = engine.available_isas()
    all_th = default_threads()
    before = (engine.isa, engine.thread_setting)
    runs = []
    try:
        for label, isa, th, chunk, batch in configurations(isas, all_th):
            engine.set_isa(isa)
            engine.set_threads(th)
            r = run_one(engine, prompt, steps, Sampler(), prefill_chunk=chunk, batch=batch, co_seed=seed + batch)
            r.config = label
            runs.append(r)
            if progress:
                progress(r)
        samp = Sampler(temperature=temperature, top_p="0.95", seed=seed)
        for isa, th, batch in ((isas[0], 1, 1), (isas[-1], all_th, 4)):
            engine.set_isa(isa)
            engine.set_threads(th)
            r = run_one(engine, prompt, steps, samp, batch=batch, co_seed=seed + 99)
            r.config = f"sampled T={temperature} seed={seed}: {isa}, {th} thread{'s' if th > 1 else ''}" + (
                f", batch of {batch}" if batch > 1 else "")
            r.group = "sampled"
            runs.append(r)
            if progress:
                progress(r)
    finally:
        engine.set_isa(before[0])
        engine.set_threads(before[1])
    if with_ref:
        ref = Engine(engine.lm, "ref")
        r = run_one(ref, prompt, steps, Sampler())
        r.config = "ref (numpy integer spec)"
        runs.append(r)
        if progress:
            progress(r)
    mark_divergence(runs)
    return runs


def mark_divergence(runs):
    first = {}
    for r in runs:
        base = first.setdefault(r.group, r)
        r.diverges_at = next((i + 1 for i, (a, b) in enumerate(zip(r.step_hashes, base.step_hashes)) if a != b), None)
        if r.diverges_at is None and len(r.step_hashes) != len(base.step_hashes):
            r.diverges_at = min(len(r.step_hashes), len(base.step_hashes)) + 1


def float_check(src: str, prompt, steps: int, progress=None) -> list[Run]:
    """The same greedy matrix in float (analysis): numpy float32 with the
    prefill whole, token by token and in chunks of 7, and, when torch is
    installed, torch float32 at 1 thread and all threads. Float logits are
    hashed by their IEEE bytes; runs are compared with the first one."""
    import numpy as np

    from .convert.sources import read_source
    from .floatref import FloatModel

    fm = read_source(src)
    n = len(prompt) + steps
    runs = []

    def record(label, first_logits, step_fn, seconds0):
        chain = ChainHash(0, "00" * 32, prompt)
        r = Run(config=label, group="float")
        t0 = time.perf_counter()
        logits = first_logits
        for i in range(steps):
            tok = int(np.argmax(logits))
            chain.update(np.ascontiguousarray(logits, dtype=np.float32).view(np.int32), tok)
            r.step_hashes.append(chain.hex())
            r.tokens.append(tok)
            if i + 1 < steps:
                logits = step_fn(tok, len(prompt) + i)
        r.seconds = seconds0 + time.perf_counter() - t0
        r.hash, r.tokens_hash = chain.hex(), _tokens_hash(r.tokens)
        runs.append(r)
        if progress:
            progress(r)

    model = FloatModel(fm, np.float32, max_len=n)
    for label, chunk in (("numpy float32, prefill whole", 0), ("numpy float32, prefill token by token", 1),
                         ("numpy float32, prefill in chunks of 7", 7)):
        model.reset()
        t0 = time.perf_counter()
        step = chunk or len(prompt)
        for i in range(0, len(prompt), step):
            first = model.forward(np.array(prompt[i:i + step]), i)[-1]
        record(label, first, lambda tok, pos: model.forward(np.array([tok]), pos)[-1], time.perf_counter() - t0)
    try:
        import torch
    except ImportError:
        torch = None
    from .floatref import torch_supported

    if torch is not None and torch_supported(fm.hp):  # Gemma 3: the numpy float runs only
        from .floatref import torch_model

        tm = torch_model(fm)
        for th in sorted({1, default_threads()}):
            torch.set_num_threads(th)
            t0 = time.perf_counter()
            first, step_fn = tm.start(prompt)
            record(f"torch float32, {th} thread{'s' if th > 1 else ''}", first, step_fn, time.perf_counter() - t0)
    mark_divergence(runs)
    return runs
