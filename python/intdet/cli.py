"""``intdet`` command line: each verb parses its options and calls the library.

User errors print one line, ``intdet: error: ...``, and exit 1 (usage errors
exit 2, as click does); no traceback, no partial output. Ctrl-C exits 130:
during generation after printing the text so far and its hash, elsewhere
with the one line ``intdet: interrupted``. SIGTERM during a conversion exits
143 with the line ``intdet: terminated``.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from .errors import IntdetError
from .signals import Terminated


def _fail(msg: str, code: int = 1):
    click.echo(f"intdet: error: {msg}", err=True)
    sys.exit(code)


def user_errors(fn):
    """Turn IntdetError (and errors from bad model files) into one-line exits."""

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except IntdetError as e:
            _fail(str(e))
        except BrokenPipeError:
            sys.exit(1)
        except KeyboardInterrupt:  # Ctrl-C outside generation (convert, model load): one line, exit 130
            click.echo("intdet: interrupted", err=True)
            sys.exit(130)
        except Terminated:  # SIGTERM during a conversion, which cleaned up first
            click.echo("intdet: terminated", err=True)
            sys.exit(143)
        except MemoryError:
            _fail("out of memory")
        except OSError as e:  # permission denied, disk full, ... on a named file
            where = f"{e.filename}: " if e.filename else ""
            _fail(f"{where}{e.strerror or e}")

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="intdet")
def main():
    """Integer-only LLM inference: bit-identical logits on every machine."""


@main.command()
@click.argument("src")
@click.option("-o", "--out", "out_dir", required=True, help="Output model directory.")
@click.option("--revision", default=None, help="Hub revision when SRC is a repo id.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("--weights", default="int8", show_default=True,
              help="Linear weights: int8 per channel, or int4 in groups of 32 (W4A16; embedding and lm_head stay int8).")
@user_errors
def convert(src, out_dir, revision, force, weights):
    """Convert SRC (GGUF file, Hugging Face directory or repo id) to an intdet model."""
    import os

    from .convert import convert as do_convert
    from .resolve import REPO_ID, download_repo

    if not os.path.exists(src) and REPO_ID.match(src):
        src = download_repo(src, revision)
    out = do_convert(src, out_dir, force=force, progress=sys.stderr.isatty(), weights=weights)
    click.echo(f"converted {src} -> {out}", err=True)


def _read_prompt(prompt, prompt_opt, file, ids):
    given = [x is not None for x in (prompt, prompt_opt, file, ids)]
    if sum(given) > 1:
        raise IntdetError("give the prompt once: PROMPT, -p, -f or --ids")
    if file is not None:
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError as e:
            raise IntdetError(f"{file}: cannot read ({e.strerror})") from None
        try:
            return data.decode("utf-8"), None
        except UnicodeDecodeError as e:
            raise IntdetError(f"{file}: not valid UTF-8 (byte {e.start})") from None
    if ids is not None:
        try:
            return None, [int(x) for x in ids.split(",") if x.strip()]
        except ValueError:
            raise IntdetError(f"--ids: {ids!r} is not a comma-separated list of integers") from None
    text = prompt if prompt is not None else prompt_opt
    if text is None:
        raise IntdetError("no prompt: give PROMPT, -p, -f or --ids")
    return text, None


@main.command()
@click.argument("prompt", required=False)
@click.option("-m", "--model", default=None, help="Model dir, GGUF, HF dir or repo id (default: SmolLM2-135M-Instruct).")
@click.option("-p", "--prompt", "prompt_opt", default=None, help="Prompt text.")
@click.option("-f", "--file", default=None, help="Read the prompt from a UTF-8 file.")
@click.option("--ids", default=None, help="Prompt as token ids, e.g. 1,2,3.")
@click.option("-n", "--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--chat", is_flag=True, help="Apply the model's chat template.")
@click.option("--temperature", default="0", show_default=True, help="0 = greedy.")
@click.option("--top-k", default=0, type=int, help="Keep the k most likely tokens (0 = off).")
@click.option("--top-p", default="1", help="Nucleus sampling mass (1 = off).")
@click.option("--seed", default=0, type=int, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu (C++ core), cuda (GPU, same bits) or ref (numpy spec).")
@click.option("--threads", default=0, type=int, help="CPU threads (default 0: all cores).")
@click.option("--revision", default=None, help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@click.option("--weights", default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def generate(prompt, model, prompt_opt, file, ids, max_new_tokens, chat, temperature, top_k, top_p, seed, device, threads,
             revision, as_json, weights):
    """Generate text; stream it to stdout, stats and the chain hash to stderr."""
    from .generate import generate as run
    from .model import DEVICES, Engine, load_model
    from .resolve import resolve_model
    from .sampling import Sampler
    from .tokenizer import StreamDecoder, encode, encode_chat

    if device not in DEVICES:
        raise IntdetError(f"--device {device!r} is not available (choose from {', '.join(DEVICES)})")
    if max_new_tokens < 0:
        raise IntdetError(f"-n: {max_new_tokens} must be >= 0")
    sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    text, prompt_ids = _read_prompt(prompt, prompt_opt, file, ids)
    lm = load_model(resolve_model(model, revision, progress=sys.stderr.isatty(), weights=weights))
    tok, meta = lm.tokenizer, lm.tok_meta
    if prompt_ids is None:
        if chat:
            import jinja2

            try:
                prompt_ids = encode_chat(tok, meta, text)
            except ValueError as e:
                raise IntdetError(str(e)) from None
            except jinja2.TemplateError as e:  # a broken template or its raise_exception()
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise IntdetError(f"{lm.path}: chat template failed ({msg})") from None
        else:
            prompt_ids = encode(tok, meta, text)
    engine = Engine(lm, device, threads)
    stream = StreamDecoder(tok, skip_special_tokens=True)
    out = sys.stdout

    def on_token(t):
        # Ids past the tokenizer's last token (embedding rows padded to a round
        # vocab size) have no text: skip them, as tok.decode does.
        if not as_json and tok.id_to_token(int(t)) is not None:
            out.write(stream.push(t))
            out.flush()

    g = run(engine, prompt_ids, max_new_tokens, sampler, eos_ids=meta.get("eos_token_ids") or [], on_token=on_token)
    st = g.stats()
    if as_json:
        st["text"] = tok.decode(g.tokens, skip_special_tokens=True)
        st["tokens"] = g.tokens
        click.echo(json.dumps(st))
    else:
        out.write(stream.flush() + "\n")
        out.flush()
        rate = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
        click.echo(
            f"prompt {st['prompt_tokens']} tok, generated {st['generated_tokens']} tok | "
            f"prefill {rate(st['prefill_tok_s'])} tok/s, decode {rate(st['decode_tok_s'])} tok/s | "
            f"hash {g.hash}" + (" (interrupted)" if g.stop == "interrupted" else ""),
            err=True,
        )
    if g.stop == "interrupted":
        sys.exit(130)


@main.command()
@click.option("-m", "--model", default=None, help="Model (default: SmolLM2-135M-Instruct).")
@click.option("-f", "--file", "file", required=True, help="UTF-8 text file to score.")
@click.option("--ctx", default=512, show_default=True, type=int, help="Window length in tokens.")
@click.option("--max-windows", default=None, type=int, help="Score only the first N windows.")
@click.option("--float", "use_float", is_flag=True, help="Score with the float32 reference of the same source instead.")
@click.option("--second-half", is_flag=True, help="Score only the second half of each window (llama.cpp's protocol).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or ref (integer backends).")
@click.option("--threads", default=0, type=int, help="CPU threads (default 0: all cores).")
@click.option("--revision", default=None, help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def perplexity(model, file, ctx, max_windows, use_float, second_half, device, threads, revision, as_json, weights):
    """Perplexity of a text file: non-overlapping windows of --ctx tokens."""
    import os

    from .model import Engine, load_model
    from .perplexity import float_logits_fn, integer_logits_fn, perplexity as run, windows_of
    from .resolve import check_weights, converted_path, resolve_source
    from .tokenizer import encode

    try:
        with open(file, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise IntdetError(f"{file}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise IntdetError(f"{file}: not valid UTF-8 (byte {e.start})") from None
    src = resolve_source(model, revision)
    if use_float and src is None:
        raise IntdetError("--float needs the source model (GGUF file, Hugging Face dir or repo id), not a converted dir")
    if src is None:
        check_weights(model, weights)
    lm = load_model(model if src is None else converted_path(src, progress=sys.stderr.isatty(), weights=weights or "int8"))
    if ctx > lm.cfg["context_length"]:
        raise IntdetError(f"--ctx: {ctx} exceeds the model's context length {lm.cfg['context_length']}")
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False)
    wins = windows_of(ids, ctx, max_windows)
    if use_float:
        import numpy as np

        from .convert.sources import read_source
        from .floatref import FloatModel

        fn, kind = float_logits_fn(FloatModel(read_source(src), np.float32, max_len=ctx)), "float32 reference"
    else:
        fn, kind = integer_logits_fn(Engine(lm, device, threads)), f"integer ({device})"
    n_bytes = lambda w: len(lm.tokenizer.decode(w).encode("utf-8"))  # noqa: E731
    r = run(fn, wins, n_bytes, progress=sys.stderr.isatty() and not as_json, second_half=second_half)
    if as_json:
        click.echo(json.dumps({**r.as_dict(), "model": os.path.basename(src or model), "kind": kind, "file": file}))
    else:
        click.echo(f"{kind}: perplexity {r.perplexity:.4f}, mean NLL {r.nll:.5f} nats/token, "
                   f"{r.bits_per_byte:.5f} bits/byte over {r.tokens} tokens ({r.windows} windows of {r.ctx}) "
                   f"in {r.seconds:.1f} s; second half of each window only (llama.cpp's protocol): "
                   f"{r.perplexity_second_half:.4f}")


def _cuda_hash_runs(lm, cpu, ids, steps, seed, temperature, with_ref, progress):
    """hash-check --device cuda: one CPU run first (the group's reference),
    then the GPU with the prefill whole, token by token and in chunks of 7,
    inside batches of 4 and 8, and replayed from CUDA graphs; sampled runs
    on both."""
    from .hashcheck import mark_divergence, run_one
    from .model import Engine
    from .sampling import Sampler

    gpu = Engine(lm, "cuda", cuda_graphs=False)
    runs = []

    def go(label, engine, sampler, group="greedy", **kw):
        r = run_one(engine, ids, steps, sampler, **kw)
        r.config, r.group = label, group
        runs.append(r)
        if progress:
            progress(r)

    go(f"cpu ({cpu._core.isa()}, {cpu._core.num_threads()} threads)", cpu, Sampler())
    go(f"cuda ({gpu._core.device_name()}), prefill whole", gpu, Sampler())
    go("cuda, prefill token by token", gpu, Sampler(), prefill_chunk=1)
    go("cuda, prefill in chunks of 7", gpu, Sampler(), prefill_chunk=7)
    go("cuda, inside a batch of 4", gpu, Sampler(), batch=4, co_seed=seed + 4)
    go("cuda, inside a batch of 8", gpu, Sampler(), batch=8, co_seed=seed + 8)
    gpu._model.cuda_graphs = True
    go("cuda, CUDA graphs", gpu, Sampler())
    go("cuda, CUDA graphs, inside a batch of 8", gpu, Sampler(), batch=8, co_seed=seed + 8)
    gpu._model.cuda_graphs = False
    samp = Sampler(temperature=temperature, top_p="0.95", seed=seed)
    go(f"sampled T={temperature} seed={seed}: cpu", cpu, samp, group="sampled")
    go(f"sampled T={temperature} seed={seed}: cuda, batch of 4", gpu, samp, group="sampled", batch=4, co_seed=seed + 99)
    if with_ref:
        go("ref (numpy integer spec)", Engine(lm, "ref"), Sampler())
    mark_divergence(runs)
    return runs


@main.command("random-model")
@click.argument("out_dir")
# the choices are random_model.SHAPES, spelled out so that importing the CLI does not import numpy
@click.option("--shape", type=click.Choice(["qwen3-0.6b", "tiny-llama", "tiny-qwen3"]), default="qwen3-0.6b",
              show_default=True)
@click.option("--seed", default=0, type=int, show_default=True)
@user_errors
def random_model(out_dir, shape, seed):
    """Write a Hugging Face checkpoint with deterministic random weights (then `intdet convert` it)."""
    import time

    from .random_model import write_random_model

    t0 = time.monotonic()
    log = lambda msg: click.echo(f"{time.monotonic() - t0:7.1f}s {msg}", err=True)  # noqa: E731
    write_random_model(out_dir, shape, seed, log=log)
    log(f"wrote {out_dir}")


@main.command("hash-check")
@click.option("-m", "--model", default=None, help="Model (default: SmolLM2-135M-Instruct).")
@click.option("--prompt", default="Shall I compare thee to a summer's day?", show_default=True)
@click.option("--steps", default=512, show_default=True, type=int, help="Tokens generated per run.")
@click.option("--seed", default=0, type=int, show_default=True, help="Seed of the sampled run and the co-prompts.")
@click.option("--temperature", default="0.8", show_default=True, help="Temperature of the sampled run.")
@click.option("--expect", default=None, help="Greedy hash from another machine to compare with.")
@click.option("--ref", "with_ref", is_flag=True, help="Also run the numpy integer spec (slow).")
@click.option("--float", "with_float", is_flag=True, help="Run the same matrix in float too, to show it diverge.")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="cpu: every ISA x threads; cuda: GPU prefill splits, batches and CUDA graphs against a CPU run.")
@click.option("--revision", default=None, help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def hash_check(model, prompt, steps, seed, temperature, expect, with_ref, with_float, device, revision, as_json, weights):
    """Run one generation under every configuration here; exit 1 unless all hashes agree."""
    import re

    from .hashcheck import float_check, hash_check as run
    from .model import Engine, load_model
    from .resolve import check_weights, converted_path, resolve_source
    from .sampling import Sampler
    from .tokenizer import encode

    if steps < 1:
        raise IntdetError(f"--steps: {steps} must be >= 1")
    if expect is not None and not re.fullmatch(r"[0-9a-f]{12}", expect):
        raise IntdetError(f"--expect: {expect!r} is not a 12-hex-digit hash")
    Sampler(temperature=temperature, seed=seed)  # validate early
    src = resolve_source(model, revision)
    if with_float and src is None:
        raise IntdetError("--float needs the source model (GGUF file, Hugging Face dir or repo id), not a converted dir")
    if src is None:
        check_weights(model, weights)
    lm = load_model(model if src is None else converted_path(src, progress=sys.stderr.isatty(), weights=weights or "int8"))
    ids = encode(lm.tokenizer, lm.tok_meta, prompt)
    if not ids:
        raise IntdetError("--prompt: empty")
    if len(ids) + steps > lm.cfg["context_length"]:
        raise IntdetError(f"--steps: prompt ({len(ids)} tokens) + {steps} steps exceed the context length {lm.cfg['context_length']}")
    engine = Engine(lm, "cpu")
    show = None if as_json else (lambda r: click.echo(f"  done: {r.config} ({r.seconds:.1f} s)", err=True))
    if device == "cuda":
        runs = _cuda_hash_runs(lm, engine, ids, steps, seed, temperature, with_ref, show)
    else:
        runs = run(engine, ids, steps, seed=seed, temperature=temperature, with_ref=with_ref, progress=show)
    fruns = float_check(src, ids, steps, progress=show) if with_float else []
    greedy = [r for r in runs if r.group == "greedy"]
    ok = all(r.diverges_at is None for r in runs)
    expect_ok = expect is None or greedy[0].hash == expect
    if as_json:
        click.echo(json.dumps({
            "model": lm.path, "prompt_tokens": len(ids), "steps": steps, "all_equal": ok,
            "expect": expect, "expect_matches": expect_ok if expect else None,
            "runs": [{k: getattr(r, k) for k in ("config", "group", "hash", "tokens_hash", "diverges_at", "seconds")}
                     for r in runs + fruns]}))
    else:
        w = max(len(r.config) for r in runs + fruns)
        click.echo(f"{'configuration':<{w}}  logits hash   tokens hash   first divergent step  time")
        for r in runs + fruns:
            div = "-" if r.diverges_at is None else str(r.diverges_at)
            click.echo(f"{r.config:<{w}}  {r.hash}  {r.tokens_hash}  {div:>20}  {r.seconds:6.1f} s")
        click.echo(f"integer runs: {'all identical' if ok else 'MISMATCH'} ({len(runs)} runs, {steps} steps each)")
        if fruns:
            nf = sum(r.diverges_at is not None for r in fruns)
            click.echo(f"float runs: {nf} of {len(fruns) - 1} differ from the first float run")
        if expect:
            click.echo(f"--expect {expect}: {'matches' if expect_ok else 'DIFFERS from ' + greedy[0].hash}")
    if not ok or not expect_ok:
        sys.exit(1)


@main.command()
@click.option("-m", "--model", default=None, help="Model (default: SmolLM2-135M-Instruct).")
@click.option("--prompt-tokens", default=512, show_default=True, type=int, help="Prompt length for prompt processing.")
@click.option("--gen-tokens", default=128, show_default=True, type=int, help="Greedy tokens to decode.")
@click.option("--threads", multiple=True, type=int, help="Thread count; repeat for one row each (default: all cores).")
@click.option("--batch", default=1, show_default=True, type=int, help="Also decode B sequences together (forward_batch).")
@click.option("--revision", default=None, help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def bench(model, prompt_tokens, gen_tokens, threads, batch, revision, as_json, weights):
    """Prompt-processing and decode speed, peak RSS, ISA and threads: one row per --threads."""
    from .bench import format_table, run_bench
    from .model import load_model
    from .resolve import resolve_model

    lm = load_model(resolve_model(model, revision, progress=sys.stderr.isatty(), weights=weights))
    show = (lambda msg: click.echo(f"  {msg}", err=True)) if sys.stderr.isatty() and not as_json else None
    rows = run_bench(lm, prompt_tokens, gen_tokens, threads or (0,), batch, progress=show)
    click.echo(json.dumps({"model": lm.path, "rows": rows}) if as_json else format_table(rows))


if __name__ == "__main__":
    main()
