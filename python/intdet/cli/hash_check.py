"""``intdet hash-check``: one generation under every configuration here; exit 1 unless all hashes agree."""

from __future__ import annotations

import json
import sys

import click

from .. import backends
from ..errors import IntdetError
from .errors import _need_stdout, user_errors
from .options import (MODEL_HELP_SHORT, NUMBER, device_option, json_option, model_option, revision_option,
                      weights_option)


def _device_hash_runs(lm, cpu, device, ids, steps, seed, temperature, with_ref, progress):
    """hash-check --device NAME (a backend with the table's device_matrix
    capability: cuda, webgpu): one CPU run first (the group's reference),
    then the device with the prefill whole, token by token and in chunks of
    7, inside batches of 4 and 8, and replayed from CUDA graphs where the
    backend has them; sampled runs on both. IntdetError naming the device
    and why when it cannot run here."""
    from ..hashcheck import mark_divergence, run_one
    from ..model import Engine
    from ..sampling import Sampler

    dev = Engine(lm, device, cuda_graphs=False)
    runs = []

    def go(label, engine, sampler, group="greedy", **kw):
        r = run_one(engine, ids, steps, sampler, **kw)
        r.config, r.group = label, group
        runs.append(r)
        if progress:
            progress(r)

    go(f"cpu ({cpu.isa}, {cpu.threads} threads)", cpu, Sampler())
    go(f"{device} ({dev.device_name}), prefill whole", dev, Sampler())
    go(f"{device}, prefill token by token", dev, Sampler(), prefill_chunk=1)
    go(f"{device}, prefill in chunks of 7", dev, Sampler(), prefill_chunk=7)
    go(f"{device}, inside a batch of 4", dev, Sampler(), batch=4, co_seed=seed + 4)
    go(f"{device}, inside a batch of 8", dev, Sampler(), batch=8, co_seed=seed + 8)
    if dev.spec.cuda_graphs:
        dev.cuda_graphs = True
        go(f"{device}, CUDA graphs", dev, Sampler())
        go(f"{device}, CUDA graphs, inside a batch of 8", dev, Sampler(), batch=8, co_seed=seed + 8)
        dev.cuda_graphs = False
    samp = Sampler(temperature=temperature, top_p="0.95", seed=seed)
    go(f"sampled T={temperature} seed={seed}: cpu", cpu, samp, group="sampled")
    go(f"sampled T={temperature} seed={seed}: {device}, batch of 4", dev, samp, group="sampled", batch=4,
       co_seed=seed + 99)
    if with_ref:
        go("ref (numpy integer spec)", Engine(lm, "ref"), Sampler())
    mark_divergence(runs)
    return runs


@click.command("hash-check")
@model_option(help=MODEL_HELP_SHORT)
@click.option("--prompt", default="Shall I compare thee to a summer's day?", show_default=True, metavar="TEXT",
              help="Prompt of every run.")
@click.option("--steps", default=512, show_default=True, type=int, help="Tokens generated per run.")
@click.option("--seed", default=0, type=int, show_default=True, help="Seed of the sampled run and the co-prompts.")
@click.option("--temperature", default="0.8", show_default=True, type=NUMBER, help="Temperature of the sampled run.")
@click.option("--expect", default=None, metavar="HASH", help="Greedy hash from another machine to compare with.")
@click.option("--ref", "with_ref", is_flag=True, help="Also run the numpy integer spec (slow).")
@click.option("--float", "with_float", is_flag=True, help="Run the same matrix in float too, to show it diverge.")
# its own choices and help: no ref (that is --ref); a device (cuda, webgpu) runs against a CPU run
@device_option(choices=("cpu",) + backends.matrix_devices(),
               help=f"cpu: every ISA x threads; {', '.join(backends.matrix_devices())}: the device's prefill splits, "
                    "batches (and CUDA graphs) against a CPU run.")
@revision_option()
@json_option()
@weights_option()
@user_errors
def hash_check(model, prompt, steps, seed, temperature, expect, with_ref, with_float, device, revision, as_json, weights):
    """Run one generation under every configuration here; exit 1 unless all hashes agree."""
    _need_stdout()
    import re

    from ..hashcheck import float_check, hash_check as run
    from ..model import Engine, load_model
    from ..resolve import check_weights, converted_path, resolve_source
    from ..sampling import Sampler
    from ..tokenizer import encode

    if steps < 1:
        raise IntdetError(f"--steps: {steps} must be >= 1")
    if expect is not None:
        expect = expect.strip().lower()  # as pasted from anywhere: hex is hex in either case
    if expect is not None and not re.fullmatch(r"[0-9a-f]{12}", expect):
        raise IntdetError(f"--expect: {expect!r} is not a 12-hex-digit hash")
    Sampler(temperature=temperature, seed=seed)  # validate early
    src = resolve_source(model, revision)
    if with_float and src is None:
        raise IntdetError("--float needs the source model (GGUF file, Hugging Face dir or repo id), not a converted dir")
    if src is None:
        check_weights(model, weights)
    lm = load_model(model if src is None else converted_path(src, progress=sys.stderr.isatty(), weights=weights or "int8"))
    ids = encode(lm.tokenizer, lm.tok_meta, prompt, what="--prompt")
    if not ids:
        raise IntdetError("--prompt: empty")
    if len(ids) + steps > lm.cfg["context_length"]:
        raise IntdetError(f"--steps: prompt ({len(ids)} tokens) + {steps} steps exceed the context length "
                          f"{lm.cfg['context_length']}")
    engine = Engine(lm, "cpu")
    show = None if as_json else (lambda r: click.echo(f"  done: {r.config} ({r.seconds:.1f} s)", err=True))
    if device != "cpu":
        runs = _device_hash_runs(lm, engine, device, ids, steps, seed, temperature, with_ref, show)
    else:
        runs = run(engine, ids, steps, seed=seed, temperature=temperature, with_ref=with_ref, progress=show)
    # the devices not run, each with why not: available here, or the error --device NAME would give
    others = {d: backends.availability(d) for d in backends.matrix_devices() if d != device}
    fruns = float_check(src, ids, steps, progress=show) if with_float else []
    greedy = [r for r in runs if r.group == "greedy"]
    ok = all(r.diverges_at is None for r in runs)
    expect_ok = expect is None or greedy[0].hash == expect
    if as_json:
        click.echo(json.dumps({
            "model": lm.path, "prompt_tokens": len(ids), "steps": steps, "all_equal": ok,
            "expect": expect, "expect_matches": expect_ok if expect else None, "other_devices": others,
            "runs": [{k: getattr(r, k) for k in ("config", "group", "hash", "tokens_hash", "diverges_at", "seconds")}
                     for r in runs + fruns]}))
    else:
        w = max(len(r.config) for r in runs + fruns)
        click.echo(f"{'configuration':<{w}}  logits hash   tokens hash   first divergent step  time")
        for r in runs + fruns:
            div = "-" if r.diverges_at is None else str(r.diverges_at)
            click.echo(f"{r.config:<{w}}  {r.hash}  {r.tokens_hash}  {div:>20}  {r.seconds:6.1f} s")
        click.echo(f"integer runs: {'all identical' if ok else 'MISMATCH'} ({len(runs)} runs, {steps} steps each)")
        for d, why in others.items():
            click.echo(f"(no {d} runs: {why or f'available here; --device {d} runs them'})")
        if fruns:
            nf = sum(r.diverges_at is not None for r in fruns)
            click.echo(f"float runs: {nf} of {len(fruns) - 1} differ from the first float run")
            if not any(r.config.startswith("torch") for r in fruns):
                import importlib.util

                why = ("torch is not installed" if importlib.util.find_spec("torch") is None
                       else "torch's float reference does not run this architecture")
                click.echo(f"(no torch float32 rows: {why})")
        if expect:
            click.echo(f"--expect {expect}: {'matches' if expect_ok else 'DIFFERS from ' + greedy[0].hash}")
    if not ok or not expect_ok:
        sys.exit(1)

