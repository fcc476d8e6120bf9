"""``intdet cache list`` / ``intdet cache clean``: the converted models in the cache."""

from __future__ import annotations

import json
import os

import click

from ..errors import IntdetError
from .errors import _err, _need_stdout, user_errors
from .options import json_option


@click.group(cls=click.Group)
def cache():
    """List or remove converted models in the cache ($INTDET_CACHE, else $XDG_CACHE_HOME/intdet, else ~/.cache/intdet)."""


@cache.command("list")
@json_option()
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
