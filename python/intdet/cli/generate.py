"""``intdet generate``: one prompt's text streamed to stdout; its stats and
chain hash on stderr. Ctrl-C stops it after printing the text so far and
its hash, exit 130."""

from __future__ import annotations

import json
import sys

import click

from ..errors import IntdetError
from .errors import _STREAMS, _err, _need_stdout, user_errors
from .options import (_load, _make_sampler, compile_structured, model_options, parse_ids, read_text_file,
                      sampling_options, spec_draft_options, spec_settings, stats_line, structured_options,
                      structured_params, verbosity_options)

PROMPT_FILE_LIMIT = 64 << 20  # bytes: -f of generate


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


@click.command()
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
@spec_draft_options
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object instead of streaming text (with a receipt for `intdet verify`).")
@click.option("--step-hashes", is_flag=True, help="With --json: the chain hash after every token, in the receipt.")
@verbosity_options
@click.pass_context
@user_errors
def generate(ctx, prompt, prompt_opt, file, ids, chat, system, truncate, model, revision, weights, device, threads,
             max_new_tokens, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, stops, seed, json_schema,
             json_schema_file, grammar, grammar_file, regex, spec_ngram, spec_draft, spec_draft_max, as_json, step_hashes,
             quiet, verbose):
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
    if step_hashes and not as_json:
        raise IntdetError("--step-hashes: needs --json (the hashes go in its receipt)")
    sampler = _make_sampler(ctx, ctx.params, as_json)
    spec_tokens, draft_model = spec_settings(spec_ngram, spec_draft, spec_draft_max)
    structured, structured_opt = structured_params(ctx.params)
    text, prompt_ids = _read_prompt(prompt, prompt_opt, file, ids)
    lm = _load(model, revision, weights, verbose, quiet)
    tok, meta = lm.tokenizer, lm.tok_meta
    if prompt_ids is None:
        if chat:
            from ..conversation import conversation_ids

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
    # is the request's, so no KV budget applies (and one request leaves a
    # prefix cache nothing to reuse).
    llm = LLM(lm, device, threads, max_batch=1, step_tokens=PREFILL_CHUNK, kv_bytes=1 << 62, prefix_cache=False,
              spec_tokens=spec_tokens, draft_model=draft_model, revision=revision, weights=weights)
    if structured is not None:
        compile_structured(llm, structured, structured_opt)  # a bad schema fails before the prompt runs
    p = ctx.params
    params = SamplingParams(max_tokens=max_new_tokens, temperature=p["temperature"], top_p=p["top_p"],
                            top_k=p["top_k"], min_p=p["min_p"], repeat_penalty=p["repeat_penalty"],
                            repeat_last_n=p["repeat_last_n"], seed=sampler.seed, stop=list(stops),
                            structured_outputs=structured, receipt=as_json, step_hashes=step_hashes)
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
        if spec_tokens:
            st["spec_drafted"], st["spec_accepted"] = c.spec_drafted, c.spec_accepted
        st["receipt"] = c.receipt
        click.echo(json.dumps(st))
    else:
        out.write(tail + "\n")
        out.flush()
        if not quiet:
            _err(stats_line(g))
            if spec_tokens and verbose:
                _err(f"speculative decoding: {c.spec_accepted} of {c.spec_drafted} drafted tokens kept")
    if g.stop == "interrupted":
        sys.exit(130)
