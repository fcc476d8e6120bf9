"""What the verbs share: option sets (model_options, sampling_options,
structured_options, verbosity_options) and the single options they are
made of, the click parameter types, and the helpers that turn option
values into work (reading text files, token ids, a Sampler, a loaded
model, the stats line).

A verb whose option differs from the shared one (another help text,
default or choice list) passes the difference to the option's function,
e.g. ``device_option(choices=("cpu", "cuda"), help=...)``.
"""

from __future__ import annotations

import os
import sys

import click

from .. import backends
from ..errors import IntdetError
from .errors import _err, _warn

# -- parameter types ---------------------------------------------------------


class Number(click.ParamType):
    """A decimal number kept as the string typed, so that sampling.py parses
    it exactly (Decimal, never float); its checks give the error line."""

    name = "float"

    def convert(self, value, param, ctx):
        return str(value)


class Seed(click.ParamType):
    """An integer, or ``random`` (drawn from os.urandom)."""

    name = "integer|random"

    def get_metavar(self, param, ctx=None):
        return "[INTEGER|random]"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "random":
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor 'random'", param, ctx)


NUMBER = Number()
WEIGHTS = click.Choice(["int8", "int4"])
DEVICES = backends.names()  # the backends table's names: cpu, cuda, ref, webgpu


def _cap_threads(ctx, param, value):
    """--threads: >= 0, and at most the cores this process may use (more
    threads than cores only wait on each other: 1000 threads gave 0.6 tok/s)."""
    from ..model import default_threads

    def one(n):
        if not 0 <= n <= 1024:
            raise click.BadParameter(f"{n} must be in [0, 1024] (0 = auto)")
        cores = default_threads()
        if n > cores:
            _warn(f"--threads {n}: this process may use {cores} core{'s' if cores > 1 else ''}; using {cores}")
            return cores
        return n

    return tuple(one(n) for n in value) if isinstance(value, tuple) else one(value)


# -- single options ----------------------------------------------------------

MODEL_HELP = "Converted model dir, GGUF file, Hugging Face dir or repo id (default: SmolLM2-135M-Instruct)."
MODEL_HELP_SHORT = "Model (default: SmolLM2-135M-Instruct)."
WEIGHTS_HELP = "Linear weights when -m needs converting: int8 (default) or int4 (W4A16, groups of 32)."
DEVICE_HELP = backends.help_text() + "."
THREADS_HELP = ("CPU threads (default 0: auto, every core this process may use, fewer while other processes keep "
                "some busy; at most the cores).")


def model_option(help: str = MODEL_HELP):
    """-m/--model, default None: the default model."""
    return click.option("-m", "--model", default=None, metavar="MODEL", help=help)


def revision_option():
    return click.option("--revision", default=None, metavar="REV", help="Hub revision when -m is a repo id.")


def weights_option(help: str = WEIGHTS_HELP):
    return click.option("--weights", type=WEIGHTS, default=None, help=help)


def device_option(choices=DEVICES, help: str = DEVICE_HELP):
    return click.option("--device", type=click.Choice(list(choices)), default="cpu", show_default=True, help=help)


def threads_option(help: str = THREADS_HELP):
    """--threads N, default 0 (auto), checked and capped at the cores."""
    return click.option("--threads", default=0, type=int, metavar="N", callback=_cap_threads, help=help)


def json_option(help: str = "Print one JSON object."):
    return click.option("--json", "as_json", is_flag=True, help=help)


def _apply(fn, decorators):
    for dec in reversed(decorators):
        fn = dec(fn)
    return fn


# -- option sets -------------------------------------------------------------


def model_options(fn):
    """-m, --revision, --weights, --device, --threads."""
    return _apply(fn, [model_option(), revision_option(), weights_option(), device_option(), threads_option()])


def _check_stops(ctx, param, stops):
    """--stop: an empty string would never match (the text always "contains" it only trivially): refused."""
    if any(x == "" for x in stops):
        raise click.BadParameter("an empty string never ends the text; give the text to stop at")
    return stops


def sampling_options(fn):
    """-n, sampling, stop sequences, --seed."""
    return _apply(fn, [
        click.option("-n", "--max-new-tokens", default=128, show_default=True, type=int,
                     help="Most tokens to generate (generation also stops at EOS, a stop sequence or the context end)."),
        click.option("--temperature", default="0", show_default=True, type=NUMBER,
                     help="Softmax temperature, exact decimal in [0, 100] (0 = greedy)."),
        click.option("--top-k", default=0, type=int, show_default=True, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", default="1", type=NUMBER, show_default=True,
                     help="Keep the smallest set of most likely tokens holding this probability mass, in (0, 1] (1 = off)."),
        click.option("--min-p", default="0", type=NUMBER, show_default=True,
                     help="Drop tokens less likely than this fraction of the most likely one, in [0, 1] (0 = off)."),
        click.option("--repeat-penalty", default="1", type=NUMBER, show_default=True,
                     help="Divide positive logits (multiply negative ones) of recent tokens by this, in (0, 100] "
                          "(1 = off; llama.cpp's; applies to greedy too)."),
        click.option("--repeat-last-n", default=64, type=int, show_default=True,
                     help="How many recent tokens (prompt included) --repeat-penalty looks at (-1 = all, 0 = off)."),
        click.option("--stop", "stops", multiple=True, metavar="STR", callback=_check_stops,
                     help="Stop when the text contains STR (not printed); repeat for several."),
        click.option("--seed", default="0", type=Seed(), show_default=True,
                     help="Seed of the sampling draws; 'random' draws one and prints it on stderr."),
    ])


GRAMMAR_FILE_LIMIT = 1 << 20  # a schema or grammar file's most bytes


def spec_draft_options(fn):
    """--spec-draft MODEL, --spec-draft-max K: speculative decoding with a draft model."""
    for dec in reversed([
        click.option("--spec-draft", default=None, metavar="MODEL",
                     help="Speculative decoding: a smaller model with the same tokenizer drafts tokens "
                          "(any -m source; the same tokens and hash)."),
        click.option("--spec-draft-max", default=4, show_default=True, type=click.IntRange(1, 64), metavar="K",
                     help="Tokens the --spec-draft model drafts per step."),
    ]):
        fn = dec(fn)
    return fn


def spec_settings(spec_ngram: int, spec_draft, spec_draft_max: int) -> tuple:
    """(spec_tokens, draft_model) of the speculation options; IntdetError
    for both kinds at once."""
    if spec_draft is not None and spec_ngram:
        raise IntdetError("--spec-draft: give --spec-ngram or --spec-draft, not both")
    return (spec_draft_max, spec_draft) if spec_draft is not None else (spec_ngram, None)


def structured_options(fn):
    """--json-schema(-file), --grammar(-file), --regex: structured output."""
    return _apply(fn, [
        click.option("-j", "--json-schema", "json_schema", default=None, metavar="SCHEMA",
                     help="The output is JSON matching this JSON schema (text; '{}' = any JSON object)."),
        click.option("--json-schema-file", default=None, metavar="FILE", help="--json-schema read from FILE."),
        click.option("--grammar", default=None, metavar="GRAMMAR",
                     help="The output matches this GBNF (llama.cpp's) or Lark grammar."),
        click.option("--grammar-file", default=None, metavar="FILE", help="--grammar read from FILE."),
        click.option("--regex", default=None, metavar="REGEX", help="The whole output matches this regular expression."),
    ])


def verbosity_options(fn):
    fn = click.option("-v", "--verbose", is_flag=True, help="Say what is being loaded, hashed and converted.")(fn)
    return click.option("-q", "--quiet", is_flag=True, help="No stats line (token counts, speed, hash) on stderr.")(fn)


# -- option values to work ---------------------------------------------------


def read_text_file(path: str, opt: str, limit: int) -> str:
    """The UTF-8 text of ``path`` (``-`` = stdin), at most ``limit`` bytes,
    without a leading byte-order mark. IntdetError naming ``opt`` and the file
    otherwise; a regular file's size is checked before it is read, anything
    else (a pipe, /dev/zero) is read to limit + 1 bytes at most."""
    name = "stdin" if path == "-" else path
    too_big = f"{opt} {name}: larger than {limit >> 20} MiB, the limit for this option"
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size > limit:
                    raise IntdetError(too_big)
                data = f.read(limit + 1)
    except OSError as e:
        raise IntdetError(f"{opt} {name}: cannot read ({e.strerror})") from None
    if len(data) > limit:
        raise IntdetError(too_big)
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark: not text
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise IntdetError(f"{opt} {name}: not valid UTF-8 (byte {e.start})") from None


def parse_ids(ids: str) -> list[int]:
    parts = ids.split(",")
    if any(not p.strip() for p in parts) and ids.strip():
        raise IntdetError(f"--ids: {ids!r} has an empty item (give ids separated by single commas, e.g. 1,2,3)")
    try:
        return [int(x) for x in parts if x.strip()]
    except ValueError:
        raise IntdetError(f"--ids: {ids!r} is not a comma-separated list of integers") from None


def structured_params(p: dict):
    """(StructuredOutputsParams or None, the option it came from), from the
    structured_options; IntdetError naming the option."""
    from ..structured import StructuredOutputsParams

    given = [o for o in ("json_schema", "json_schema_file", "grammar", "grammar_file", "regex") if p.get(o) is not None]
    if not given:
        return None, None
    opt = f"--{given[0].replace('_', '-')}"
    if len(given) > 1:
        raise IntdetError(f"{opt}: give one of --json-schema, --json-schema-file, --grammar, --grammar-file, --regex")
    v = p[given[0]]
    if given[0].endswith("_file"):
        v = read_text_file(v, opt, GRAMMAR_FILE_LIMIT)
    try:
        if given[0].startswith("json_schema"):
            so = StructuredOutputsParams(json_object=True) if v.strip() == "{}" else StructuredOutputsParams(json=v)
        elif given[0].startswith("grammar"):
            so = StructuredOutputsParams(grammar=v)
        else:
            so = StructuredOutputsParams(regex=v)
    except IntdetError as e:
        raise IntdetError(f"{opt}: {str(e).split(': ', 1)[-1]}") from None
    return so, opt


def compile_structured(llm, so, opt: str):
    """``llm.grammar(so)`` with errors naming the CLI option."""
    try:
        return llm.grammar(so)
    except IntdetError as e:
        msg = str(e)
        if e.field and msg.startswith(e.field):
            msg = opt + msg[len(e.field):]
        raise IntdetError(msg) from None


def _explicit(ctx, name) -> bool:
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP, None)


def _make_sampler(ctx, p, as_json=False):
    """The Sampler of the sampling options (errors before any model work),
    warning about options that do nothing at temperature 0."""
    from ..sampling import Sampler

    seed = p["seed"]
    if seed == "random":
        seed = int.from_bytes(os.urandom(8), "little")
        _err(f"intdet: --seed random: using --seed {seed}")
    if p["max_new_tokens"] < 0:
        raise IntdetError(f"-n: {p['max_new_tokens']} must be >= 0")
    s = Sampler(temperature=p["temperature"], top_k=p["top_k"], top_p=p["top_p"], seed=seed, min_p=p["min_p"],
                repeat_penalty=p["repeat_penalty"], repeat_last_n=p["repeat_last_n"])
    if s.greedy:
        idle = [f"--{n.replace('_', '-')}" for n in ("top_k", "top_p", "min_p", "seed") if _explicit(ctx, n)]
        if idle:
            _warn(f"{', '.join(idle)} {'has' if len(idle) == 1 else 'have'} no effect at --temperature 0 (greedy)")
    return s


def _log(verbose):
    """The CLI's ``intdet: ...`` stderr line writer when ``verbose``, else None."""
    return (lambda m: _err(f"intdet: {m}")) if verbose else None


def _warn_revision(revision, spec):
    if revision is not None and spec is not None and os.path.exists(spec):
        _warn(f"--revision {revision} is ignored: {spec} is a local path, not a Hugging Face repo id")


def _load(model, revision, weights, verbose, quiet=False):
    """The model of the model_options, resolved (downloaded, converted) and loaded."""
    from ..model import load_model
    from ..resolve import resolve_model

    _warn_revision(revision, model)
    log = _log(verbose)
    path = resolve_model(model, revision, progress=sys.stderr.isatty() and not quiet, weights=weights, log=log,
                         notice=_log(not quiet))
    if log:
        log(f"loading {path}")
    return load_model(path)


def stats_line(g) -> str:
    """generate's and chat's stderr line: token counts, speeds, the hash."""
    st = g.stats()
    rate = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
    cut = f" ({g.truncated} cut by --truncate)" if g.truncated else ""
    end = {"interrupted": " (interrupted)", "context": " (stopped: context full)"}.get(g.stop, "")
    return (f"prompt {st['prompt_tokens']} tok{cut}, generated {st['generated_tokens']} tok | "
            f"prefill {rate(st['prefill_tok_s'])} tok/s, decode {rate(st['decode_tok_s'])} tok/s | "
            f"hash {g.hash}{end}")
