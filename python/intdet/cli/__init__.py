"""``intdet`` command line: each verb parses its options and calls the library.

Every error, a bad option value or usage included, prints one line,
``intdet: error: ...``, and exits 1; no traceback, no partial output.
Warnings (contradictory but harmless options) print ``intdet: warning: ...``.
Ctrl-C exits 130: during generation after printing the text so far and its
hash, elsewhere with the one line ``intdet: interrupted``. SIGTERM during a
conversion exits 143 with the line ``intdet: terminated``. A closed or broken
stdout (``>&-``, ``| head -c1``) exits 1 without a traceback; with stderr
closed the work still runs and its stdout is whole, but the exit status is 1
when a line meant for stderr (stats, hash, an error) could not be shown.
"""

from __future__ import annotations

import json
import os
import sys

import click

from ..errors import IntdetError
from .errors import IntdetGroup, _err, _need_stdout, _STREAMS, user_errors, _warn  # noqa: F401
from .options import (THREADS_HELP, NUMBER, WEIGHTS, _cap_threads, _load, _log, _make_sampler, _warn_revision,  # noqa: F401
                      compile_structured, model_options, parse_ids, read_text_file, sampling_options, stats_line,
                      structured_options, structured_params, verbosity_options)

PROMPT_FILE_LIMIT = 64 << 20  # bytes: -f of generate
TEXT_FILE_LIMIT = 256 << 20  # bytes: -f of perplexity


# intdet.random_model.SHAPES, spelled out here so that --help needs no import
# of numpy (tests/test_entry_points.py checks the two agree).
RANDOM_MODEL_SHAPES = ("qwen3-0.6b", "tiny-llama", "tiny-qwen3", "tiny-gemma3", "qwen3-1.7b", "qwen3-4b", "llama3-8b")


def _build_info() -> list[str]:
    """Lines naming the build: the C++ compiler (from the core's ELF .comment),
    the CUDA module, the CPU kernel sets and the one in use."""
    lines = []
    try:
        from .. import _core
    except ImportError as e:
        return [f"C++ core: not built ({e})"]
    compiler = "unknown compiler"
    try:
        with open(_core.__file__, "rb") as f:
            data = f.read(64 << 20)
        for tag in (b"GCC: (", b"clang version "):
            i = data.find(tag)
            if i >= 0:
                compiler = data[i:data.index(b"\0", i)].decode("ascii", "replace")
                break
    except (OSError, ValueError):
        pass
    lines.append(f"C++ core: {os.path.basename(_core.__file__)} ({compiler})")
    try:
        from .. import _cuda

        n = _cuda.device_count()
        lines.append(f"CUDA module: built ({n} device{'s' if n != 1 else ''} visible)")
    except ImportError:
        lines.append("CUDA module: not built")
    try:
        in_use = _core.isa()
    except ValueError as e:
        in_use = f"none ({e})"
    lines.append(f"CPU kernel sets: {', '.join(_core.available_isas())}; in use: {in_use}")
    return lines


def _print_version(ctx, param, value):
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata

    try:
        v = metadata.version("intdet")
    except metadata.PackageNotFoundError:
        v = "unknown (not installed)"
    click.echo("\n".join([f"intdet version {v}"] + _build_info()))
    ctx.exit(0)


@click.group(cls=IntdetGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version, the build (compiler, CUDA module) and the CPU kernel sets, then exit.")
def main():
    """Integer-only LLM inference: bit-identical logits on every machine."""


@main.command()
@click.argument("src")
@click.option("-o", "--out", "out_dir", required=True, metavar="DIR", help="Output model directory.")
@click.option("--revision", default=None, metavar="REV", help="Hub revision (branch, tag or commit) when SRC is a repo id.")
@click.option("--force", is_flag=True, help="Replace OUT if it is an intdet model directory.")
@click.option("--weights", type=WEIGHTS, default="int8", show_default=True,
              help="Linear weights: int8 per channel, or int4 in groups of 32 (W4A16; embedding and lm_head stay int8).")
@click.option("-v", "--verbose", is_flag=True, help="Say what is being read and written.")
@user_errors
def convert(src, out_dir, revision, force, weights, verbose):
    """Convert SRC (GGUF file, Hugging Face directory or repo id) to an intdet model."""
    from ..convert import convert as do_convert
    from ..resolve import REPO_ID, download_repo

    _warn_revision(revision, src)
    if not os.path.exists(src) and REPO_ID.match(src):
        if verbose:
            _err(f"intdet: downloading {src} from the Hugging Face Hub...")
        src = download_repo(src, revision)
    if verbose:
        _err(f"intdet: converting {src} into {out_dir} ({weights})...")
    out = do_convert(src, out_dir, force=force, progress=sys.stderr.isatty(), weights=weights)
    _err(f"converted {src} -> {out}")


def _read_prompt(prompt, prompt_opt, file, ids):
    given = [x is not None for x in (prompt, prompt_opt, file, ids)]
    if sum(given) > 1:
        raise IntdetError("give the prompt once: PROMPT, -p, -f or --ids")
    if file is not None:
        return read_text_file(file, "-f", PROMPT_FILE_LIMIT), None
    if ids is not None:
        return None, parse_ids(ids)
    text = prompt if prompt is not None else prompt_opt
    if text is None:
        raise IntdetError("no prompt: give PROMPT, -p, -f or --ids")
    from ..tokenizer import check_text

    check_text(text, "PROMPT" if prompt is not None else "-p")  # argv bytes that are not UTF-8
    return text, None


def _prefill_bar(n_prompt: int, quiet: bool):
    """A tqdm bar on stderr for prompts longer than one prefill chunk, on a terminal."""
    from ..generate import PREFILL_CHUNK

    if quiet or n_prompt <= PREFILL_CHUNK or _STREAMS["stderr_closed"] or not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=n_prompt, desc="prefill", unit="tok", file=sys.stderr, leave=False)
    return bar, (lambda done, total: bar.update(done - bar.n))


@main.command()
@click.argument("prompt", required=False)
@click.option("-p", "--prompt", "prompt_opt", default=None, metavar="TEXT", help="Prompt text.")
@click.option("-f", "--file", default=None, metavar="FILE",
              help=f"Read the prompt from a UTF-8 file ('-' = stdin; at most {PROMPT_FILE_LIMIT >> 20} MiB).")
@click.option("--ids", default=None, metavar="IDS", help="Prompt as token ids, e.g. 1,2,3.")
@click.option("--chat", is_flag=True, help="Apply the model's chat template.")
@click.option("--system", default=None, metavar="PROMPT",
              help="System prompt for --chat (default: the template's own, if any).")
@click.option("--truncate", type=click.Choice(["left", "right"]), default=None,
              help="Cut a prompt too long for the context at its start (left) or end (right) instead of failing.")
@model_options
@sampling_options
@structured_options
@click.option("--spec-ngram", "spec_ngram", default=0, show_default=True, type=click.IntRange(0, 64), metavar="K",
              help="Speculative decoding: draft up to K tokens a step by prompt lookup (the same tokens and hash).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@verbosity_options
@click.pass_context
@user_errors
def generate(ctx, prompt, prompt_opt, file, ids, chat, system, truncate, model, revision, weights, device, threads,
             max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, stops, seed, json_schema,
             json_schema_file, grammar, grammar_file, regex, spec_ngram, as_json, quiet, verbose):
    """Generate text; stream it to stdout, stats and the chain hash to stderr."""
    import time

    from ..api import LLM, SamplingParams
    from ..generate import PREFILL_CHUNK, Generation, check_prompt
    from ..testhook import signal_at
    from ..tokenizer import encode

    _need_stdout()
    if chat and ids is not None:
        raise IntdetError("--chat: cannot apply the chat template to --ids (give the prompt as text)")
    if system is not None and not chat:
        raise IntdetError("--system: needs --chat")
    if system is not None:
        from ..tokenizer import check_text

        check_text(system, "--system")
    if quiet and verbose:
        raise IntdetError("-q and -v: choose one")
    sampler = _make_sampler(ctx, ctx.params, as_json)
    structured, structured_opt = structured_params(ctx.params)
    text, prompt_ids = _read_prompt(prompt, prompt_opt, file, ids)
    lm = _load(model, revision, weights, verbose, quiet)
    tok, meta = lm.tokenizer, lm.tok_meta
    if prompt_ids is None:
        if chat:
            from ..chat import conversation_ids

            msgs = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": text}]
            prompt_ids = conversation_ids(lm, msgs)
        else:
            prompt_ids = encode(tok, meta, text)
    n_given = len(prompt_ids)
    prompt_ids = check_prompt(prompt_ids, lm.cfg["context_length"], lm.cfg["vocab_size"], max_new_tokens, truncate,
                              meta.get("bos_token_id"))
    # The Python API's scheduler runs the request (one sequence; prefill in
    # PREFILL_CHUNK calls, Ctrl-C honoured between them); the whole KV cache
    # is the request's, so no KV budget applies.
    llm = LLM(lm, device, threads, max_batch=1, step_tokens=PREFILL_CHUNK, kv_bytes=1 << 62, spec_tokens=spec_ngram)
    if structured is not None:
        compile_structured(llm, structured, structured_opt)  # a bad schema fails before the prompt runs
    p = ctx.params
    params = SamplingParams(max_tokens=max_new_tokens, temperature=p["temperature"], top_p=p["top_p"],
                            top_k=p["top_k"], min_p=p["min_p"], repeat_penalty=p["repeat_penalty"],
                            repeat_last_n=p["repeat_last_n"], seed=sampler.seed, stop=list(stops),
                            structured_outputs=structured)
    out = sys.stdout
    bar, show_prefill = _prefill_bar(len(prompt_ids), quiet or as_json)
    chunks = [0]

    def on_prefill(done, total):
        chunks[0] += 1
        if show_prefill:
            show_prefill(done, total)
        signal_at(f"prefill-{chunks[0]}")  # test hook (testhook.py), inert unless its variable is set

    printed, n_tok = [], 0
    t0 = time.perf_counter()
    t_first = t_last = None
    stream = llm.stream(prompt_ids, params, on_prefill=on_prefill)
    try:
        for chunk in stream:
            if chunk.text and not as_json:
                out.write(chunk.text)
                out.flush()
            printed.append(chunk.text)
            if chunk.token is not None:
                n_tok += 1
                t_last = time.perf_counter()
                t_first = t_first or t_last
                signal_at(f"token-{n_tok}")  # test hook
    except KeyboardInterrupt:
        pass
    finally:
        if bar is not None:
            bar.close()
    c = stream.close()
    if c.finish_reason == "error":
        raise IntdetError(c.error)
    g = Generation(prompt_ids=c.prompt_ids, tokens=c.tokens, hash=c.hash, hashes=c.hashes,
                   # interrupted before the first token: the prompt's rate is unknown (shown as "-")
                   prefill_s=(t_first - t0) if t_first else 0.0, decode_s=(t_last - t_first) if t_first else 0.0,
                   stop="interrupted" if c.finish_reason == "cancelled" else c.finish_reason,
                   truncated=n_given - len(prompt_ids))
    if max_new_tokens == 0:
        g.prefill_s = 0.0  # nothing ran (as before: no prefill for -n 0)
    tail = c.text[len("".join(printed)):]  # held-back text flushed at the end
    if as_json:
        st = g.stats()
        st["text"] = c.text
        st["tokens"] = g.tokens
        st["seed"] = sampler.seed
        if spec_ngram:
            st["spec_drafted"], st["spec_accepted"] = c.spec_drafted, c.spec_accepted
        click.echo(json.dumps(st))
    else:
        out.write(tail + "\n")
        out.flush()
        if not quiet:
            _err(stats_line(g))
            if spec_ngram and verbose:
                _err(f"speculative decoding: {c.spec_accepted} of {c.spec_drafted} drafted tokens kept")
    if g.stop == "interrupted":
        sys.exit(130)


@main.command()
@click.option("--system", default=None, metavar="PROMPT",
              help="System prompt (default: the chat template's own, if any).")
@model_options
@sampling_options
@verbosity_options
@click.pass_context
@user_errors
def chat(ctx, system, model, revision, weights, device, threads, max_new_tokens, temperature, top_k, top_p, min_p,
         repeat_penalty, repeat_last_n, stops, seed, quiet, verbose):
    """Interactive multi-turn chat: one message per line; /reset, /help; Ctrl-D leaves, Ctrl-C stops a reply."""
    from ..chat import run_chat
    from ..model import Engine

    _need_stdout()
    if quiet and verbose:
        raise IntdetError("-q and -v: choose one")
    sampler = _make_sampler(ctx, ctx.params)
    lm = _load(model, revision, weights, verbose, quiet)
    engine = Engine(lm, device, threads)
    run_chat(engine, lm, sampler, max_new_tokens, system=system, stop=stops, quiet=quiet or _STREAMS["stderr_closed"],
             stats_line=stats_line)


@main.group(cls=click.Group)
def cache():
    """List or remove converted models in the cache ($INTDET_CACHE, else $XDG_CACHE_HOME/intdet, else ~/.cache/intdet)."""


@cache.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def cache_list(as_json):
    """One line per cache entry: name, size, weight format, source."""
    from ..resolve import cache_dir, cache_entries

    _need_stdout()
    entries = cache_entries()
    if as_json:
        click.echo(json.dumps({"cache": cache_dir(), "entries": entries}))
        return
    if not entries:
        _err(f"no entries in {os.path.join(cache_dir(), 'models')}")
        return
    w = max(len(e["name"]) for e in entries)
    click.echo(f"{'entry':<{w}}  {'size':>12}  {'weights':7}  source")
    for e in entries:
        src = e["source_path"] or e["source"] or "?"
        state = "" if e["complete"] else "  (incomplete)"
        click.echo(f"{e['name']:<{w}}  {e['bytes'] / 2**20:8.1f} MiB  {e['weights'] or '?':7}  {src}{state}")


@cache.command("clean")
@click.argument("names", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Remove every entry.")
@user_errors
def cache_clean(names, everything):
    """Remove the named entries (see `intdet cache list`), or all with --all; nothing outside the cache's models/ dir."""
    from ..resolve import clean_cache

    if not names and not everything:
        raise IntdetError("cache clean: name the entries to remove, or give --all")
    if names and everything:
        raise IntdetError("cache clean: give entry names or --all, not both")
    for n in clean_cache(names, everything):
        _err(f"removed {n}")


@main.command()
@click.option("-m", "--model", default=None, metavar="MODEL", help="Model (default: SmolLM2-135M-Instruct).")
@click.option("-f", "--file", "file", required=True, metavar="FILE",
              help=f"UTF-8 text file to score ('-' = stdin; at most {TEXT_FILE_LIMIT >> 20} MiB).")
@click.option("--ctx", default=512, show_default=True, type=int, help="Window length in tokens.")
@click.option("--max-windows", default=None, type=int, help="Score only the first N windows.")
@click.option("--float", "use_float", is_flag=True, help="Score with the float32 reference of the same source instead.")
@click.option("--second-half", is_flag=True, help="Score only the second half of each window (llama.cpp's protocol).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "ref"]), default="cpu", show_default=True,
              help="Integer backend: cpu (C++ core), cuda (GPU) or ref (numpy spec).")
@click.option("--threads", default=0, type=int, metavar="N", callback=_cap_threads, help=THREADS_HELP)
@click.option("--revision", default=None, metavar="REV", help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", type=WEIGHTS, default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def perplexity(model, file, ctx, max_windows, use_float, second_half, device, threads, revision, as_json, weights):
    """Perplexity of a text file: non-overlapping windows of --ctx tokens."""
    from ..model import Engine, load_model
    from ..perplexity import float_logits_fn, integer_logits_fn, perplexity as run, window_bos, windows_of
    from ..resolve import check_weights, converted_path, resolve_source
    from ..tokenizer import encode

    _need_stdout()
    text = read_text_file(file, "-f", TEXT_FILE_LIMIT)
    _warn_revision(revision, model)
    src = resolve_source(model, revision)
    if use_float and src is None:
        raise IntdetError("--float needs the source model (GGUF file, Hugging Face dir or repo id), not a converted dir")
    if src is None:
        check_weights(model, weights)
    lm = load_model(model if src is None else converted_path(src, progress=sys.stderr.isatty(), weights=weights or "int8"))
    if ctx > lm.cfg["context_length"]:
        raise IntdetError(f"--ctx: {ctx} exceeds the model's context length {lm.cfg['context_length']}")
    ids = encode(lm.tokenizer, lm.tok_meta, text, add_bos=False)
    wins = windows_of(ids, ctx, max_windows, bos=window_bos(lm.tok_meta))
    if use_float:
        import numpy as np

        from ..convert.sources import read_source
        from ..floatref import FloatModel

        fn, kind = float_logits_fn(FloatModel(read_source(src), np.float32, max_len=ctx)), "float32 reference"
    else:
        fn, kind = integer_logits_fn(Engine(lm, device, threads)), f"integer ({device})"
    n_bytes = lambda w: len(lm.tokenizer.decode(w).encode("utf-8"))  # noqa: E731
    r = run(fn, wins, n_bytes, progress=sys.stderr.isatty() and not as_json, second_half=second_half)
    if as_json:
        click.echo(json.dumps({**r.as_dict(), "model": os.path.basename(src or model), "kind": kind, "file": file}))
    else:
        click.echo(f"{kind}: perplexity {r.perplexity:.4f}, mean NLL {r.nll:.5f} nats/token, "
                   f"{r.bits_per_byte:.5f} bits/byte over {r.tokens} tokens ({r.windows} window{'s' if r.windows != 1 else ''} of {r.ctx}) "
                   f"in {r.seconds:.1f} s; second half of each window only (llama.cpp's protocol): "
                   f"{r.perplexity_second_half:.4f}")


def _cuda_hash_runs(lm, cpu, ids, steps, seed, temperature, with_ref, progress):
    """hash-check --device cuda: one CPU run first (the group's reference),
    then the GPU with the prefill whole, token by token and in chunks of 7,
    inside batches of 4 and 8, and replayed from CUDA graphs; sampled runs
    on both."""
    from ..hashcheck import mark_divergence, run_one
    from ..model import Engine
    from ..sampling import Sampler

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
@click.option("--shape", type=click.Choice(list(RANDOM_MODEL_SHAPES)), default="qwen3-0.6b",
              show_default=True, help="Architecture and size of the checkpoint.")
@click.option("--seed", default=0, type=click.IntRange(0, 2**64 - 1), show_default=True,
              help="Seed of the random weights, in [0, 2^64).")
@user_errors
def random_model(out_dir, shape, seed):
    """Write a Hugging Face checkpoint with deterministic random weights (then `intdet convert` it)."""
    import time

    from ..random_model import write_random_model

    t0 = time.monotonic()
    log = lambda msg: click.echo(f"{time.monotonic() - t0:7.1f}s {msg}", err=True)  # noqa: E731
    write_random_model(out_dir, shape, seed, log=log)
    log(f"wrote {out_dir}")


@main.command("hash-check")
@click.option("-m", "--model", default=None, metavar="MODEL", help="Model (default: SmolLM2-135M-Instruct).")
@click.option("--prompt", default="Shall I compare thee to a summer's day?", show_default=True, metavar="TEXT",
              help="Prompt of every run.")
@click.option("--steps", default=512, show_default=True, type=int, help="Tokens generated per run.")
@click.option("--seed", default=0, type=int, show_default=True, help="Seed of the sampled run and the co-prompts.")
@click.option("--temperature", default="0.8", show_default=True, type=NUMBER, help="Temperature of the sampled run.")
@click.option("--expect", default=None, metavar="HASH", help="Greedy hash from another machine to compare with.")
@click.option("--ref", "with_ref", is_flag=True, help="Also run the numpy integer spec (slow).")
@click.option("--float", "with_float", is_flag=True, help="Run the same matrix in float too, to show it diverge.")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="cpu: every ISA x threads; cuda: GPU prefill splits, batches and CUDA graphs against a CPU run.")
@click.option("--revision", default=None, metavar="REV", help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", type=WEIGHTS, default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def hash_check(model, prompt, steps, seed, temperature, expect, with_ref, with_float, device, revision, as_json, weights):
    """Run one generation under every configuration here; exit 1 unless all hashes agree."""
    import re

    from ..hashcheck import float_check, hash_check as run
    from ..model import Engine, load_model
    from ..resolve import check_weights, converted_path, resolve_source
    from ..sampling import Sampler
    from ..tokenizer import encode

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
    ids = encode(lm.tokenizer, lm.tok_meta, prompt, what="--prompt")
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
            if not any(r.config.startswith("torch") for r in fruns):
                import importlib.util

                why = ("torch is not installed" if importlib.util.find_spec("torch") is None
                       else "torch's float reference does not run this architecture")
                click.echo(f"(no torch float32 rows: {why})")
        if expect:
            click.echo(f"--expect {expect}: {'matches' if expect_ok else 'DIFFERS from ' + greedy[0].hash}")
    if not ok or not expect_ok:
        sys.exit(1)


@main.command()
@click.option("-m", "--model", default=None, metavar="MODEL", help="Model (default: SmolLM2-135M-Instruct).")
@click.option("--prompt-tokens", default=512, show_default=True, type=int, help="Prompt length for prompt processing.")
@click.option("--gen-tokens", default=128, show_default=True, type=int, help="Greedy tokens to decode.")
@click.option("--threads", multiple=True, type=int, metavar="N", callback=_cap_threads,
              help="Thread count, at most the cores; repeat for one row each (default: 0, auto).")
@click.option("--batch", default=1, show_default=True, type=int, help="Also decode B sequences together (forward_batch).")
@click.option("--revision", default=None, metavar="REV", help="Hub revision when -m is a repo id.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--weights", type=WEIGHTS, default=None,
              help="Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32).")
@user_errors
def bench(model, prompt_tokens, gen_tokens, threads, batch, revision, as_json, weights):
    """Prompt-processing and decode speed, peak RSS, ISA and threads: one row per --threads."""
    from ..bench import format_table, run_bench
    from ..model import load_model
    from ..resolve import resolve_model

    lm = load_model(resolve_model(model, revision, progress=sys.stderr.isatty(), weights=weights,
                                  notice=_log(True)))
    show = (lambda msg: click.echo(f"  {msg}", err=True)) if sys.stderr.isatty() and not as_json else None
    rows = run_bench(lm, prompt_tokens, gen_tokens, threads or (0,), batch, progress=show)
    click.echo(json.dumps({"model": lm.path, "rows": rows}) if as_json else format_table(rows))


main.add_command(__import__("intdet.cli_serve", fromlist=["command"]).command(model_options, user_errors))  # serve
main.add_command(__import__("intdet.cli_batch", fromlist=["command"]).command(model_options, user_errors))  # batch
from .. import cli_compress  # noqa: E402  (its commands use the helpers above)
main.add_command(cli_compress.compress)
main.add_command(cli_compress.decompress)

if __name__ == "__main__":
    main()
