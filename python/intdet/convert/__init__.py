"""``intdet convert``: source checkpoint -> intdet model directory.

The output directory holds model.safetensors (integer tensors only),
config.json and tokenizer.json/tokenizer_config.json. It is written into a
temporary sibling directory and renamed into place, so an interrupted or
failed conversion, or one stopped by SIGINT or SIGTERM, leaves nothing
behind; ``--force`` replaces only an intdet model directory, by one atomic
swap (output.py). The ``signal_at`` calls are a test hook (testhook.py),
inert unless $INTDET_TEST_SIGNAL_AT is set.
"""

from __future__ import annotations

import json
import os
import secrets

from ..background import Background, sha256_file
from ..errors import IntdetError
from ..format import MODEL_SHA256_KEY, WEIGHT_FORMATS, is_converted
from ..signals import sigterm_raises
from ..testhook import signal_at, watch_quantize
from .output import TMP_PREFIX, check_output, claim, install, old_path, release, remove_tree, sweep_stale
from ..preflight import check_convert
from .quantize import plan_model
from .sources import read_source, resolve_source
from .writer import SafetensorsWriter


def convert(src: str, out_dir: str, force: bool = False, progress: bool = True, weights: str = "int8",
            on_read=None) -> str:
    """Convert ``src`` (GGUF file or Hugging Face directory) into ``out_dir``
    with "int8" or "int4" linear weights (quantize.plan_model), streamed:
    each source tensor is read, quantized and written a block of rows at a
    time (convert/lazy.py, convert/writer.py), so memory stays bounded
    whatever the model's size.

    Raises IntdetError if the source is unreadable or unsupported, or if
    ``out_dir`` exists and is not empty, unless force and out_dir is an
    intdet model directory (output.check_output), or if writing fails (an
    OSError, reported as IntdetError naming out_dir); KeyboardInterrupt (SIGINT)
    or signals.Terminated (SIGTERM, in the main thread) after removing the
    temporary directory. ``on_read()``: called once the source's header,
    config and tensor table have been read and checked (a file that is no
    model fails before it, with nothing said). Returns out_dir.
    """
    with sigterm_raises():  # `kill PID` cleans up as Ctrl-C does
        return _convert(src, out_dir, force, progress, weights, on_read)


def _convert(src: str, out_dir: str, force: bool, progress: bool, weights: str, on_read=None) -> str:
    out_dir = os.path.abspath(out_dir)
    check_output(out_dir, src, force)
    if weights not in WEIGHT_FORMATS:
        raise IntdetError(f"weights {weights!r}: choose int8 or int4", field="weights")
    if os.path.isdir(src) and is_converted(src):
        raise IntdetError(f"{src}: already a converted intdet model (convert its source instead)")
    fm = read_source(src)
    if on_read:
        on_read()
    signal_at("read")
    plan = plan_model(fm, weights=weights, progress=progress)
    check_convert(plan.output_bytes(), out_dir)
    watch_quantize(plan)
    try:
        _write(fm, plan, src, out_dir, force)
    except OSError as e:  # named by the output the user gave, not by the temporary directory
        raise IntdetError(f"{out_dir}: cannot write the converted model ({e.strerror or e})") from None
    return out_dir


def _write(fm, plan, src: str, out_dir: str, force: bool) -> None:
    """Quantize and write the model (plan: quantize.Plan), tensor by tensor,
    into a temporary sibling of out_dir, then install it there."""
    from ..tokenizer import save_tokenizer

    parent = os.path.dirname(out_dir) or "."
    os.makedirs(parent, exist_ok=True)
    sweep_stale(parent)
    # The name is fixed before the directory exists, so an interrupt at any
    # point (even inside mkdir) is cleaned up by the handler below.
    tmp = os.path.join(parent, f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    lock = None
    try:
        os.mkdir(tmp)
        lock = claim(tmp)
        writer = SafetensorsWriter(os.path.join(tmp, "model.safetensors"), plan.specs, metadata={"format": "intdet"})
        try:
            plan.run(writer.write, workers=quantize_workers())
        except BaseException:
            writer.abort()
            raise
        finally:
            plan.close()
        writer.close()
        signal_at("written")
        # read back once (the pages are mostly still cached): the blocks were
        # written out of order by several threads, so no running hash is possible
        st_sha = Background(sha256_file, os.path.join(tmp, "model.safetensors"))
        cfg = plan.cfg
        cfg["source"] = resolve_source(cfg["source"])
        cfg[MODEL_SHA256_KEY] = st_sha.result()
        cfg["tokenizer"] = {"bos_token_id": fm.tok_meta.get("bos_token_id"),
                            "eos_token_ids": fm.tok_meta.get("eos_token_ids", [])}
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        save_tokenizer(fm.tokenizer, fm.tok_meta, tmp)
        _readable_by_all(tmp)
        signal_at("install")
        install(tmp, out_dir, src, force)
        signal_at("installed")
    finally:
        remove_tree(tmp)  # the old model after a swap, or the partial new one
        remove_tree(old_path(tmp))
        release(lock)


def quantize_workers() -> int:
    """Threads for the row blocks: the cores this process may use (at most 8:
    past that the source's read and the writes are the limit)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _readable_by_all(d: str):
    """The files as any new file under the umask: safetensors writes 0600."""
    umask = os.umask(0)
    os.umask(umask)
    for n in os.listdir(d):
        os.chmod(os.path.join(d, n), 0o666 & ~umask)
