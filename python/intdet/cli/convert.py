"""``intdet convert``: a GGUF file, Hugging Face directory or repo id to an intdet model."""

from __future__ import annotations

import os
import sys

import click

from .errors import _err, user_errors
from .options import WEIGHTS, _warn_revision


@click.command()
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
