"""``intdet`` command line: the group ``main`` and its verbs, one module each.

Every error, a bad option value or usage included, prints one line,
``intdet: error: ...``, and exits 1 (errors.py). Shared options and
helpers are in options.py. A verb is a module here defining a click command
of the verb's name ('-' as '_'), named in VERBS; it imports options.py and
errors.py, never this package or another verb. Only the verb that runs is
imported (``intdet --help`` imports them all for their one-line help).
"""

from __future__ import annotations

import importlib
import os

import click

from .errors import IntdetGroup

# verb -> the module of this package that defines it. A new verb: one module
# and one line here. `intdet --help` lists them alphabetically.
VERBS = {
    "convert": "convert",
    "generate": "generate",
    "chat": "chat",
    "cache": "cache",
    "perplexity": "perplexity",
    "random-model": "random_model",
    "hash-check": "hash_check",
    "bench": "bench",
    "batch": "batch",
    "compress": "compress",
    "decompress": "compress",
    "serve": "serve",
    "verify": "verify",
}


class VerbGroup(IntdetGroup):
    """The group whose commands are VERBS, each imported when first needed
    (commands given to add_command are listed too)."""

    def list_commands(self, ctx):
        return sorted(set(VERBS) | set(self.commands))

    def get_command(self, ctx, name):
        if name in self.commands or name not in VERBS:
            return super().get_command(ctx, name)
        module = importlib.import_module(f"{__name__}.{VERBS[name]}")
        return getattr(module, name.replace("-", "_"))


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


@click.group(cls=VerbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version, the build (compiler, CUDA module) and the CPU kernel sets, then exit.")
def main():
    """Integer-only LLM inference: bit-identical logits on every machine."""
