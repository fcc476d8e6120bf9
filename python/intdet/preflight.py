"""Pre-flight checks: refuse a conversion or a load that cannot fit, with
the estimate and what the machine has, instead of an OOM kill halfway.

Estimates come from header sizes only (nothing is read or allocated):
- convert: the output's bytes must fit on the output's file system; its
  memory is bounded (quantize.BLOCK_ELEMS row blocks, the source mapped),
  so only the working set is compared with available memory;
- load (CPU engine): the packed weights are a copy of model.safetensors'
  integer tensors (the file's pages are released as each is packed), so the
  process needs about their bytes plus the working margin below.
Available memory is MemAvailable from /proc/meminfo, lowered to the cgroup
limit where one applies (containers); where neither can be read the check
passes. ``INTDET_SKIP_PREFLIGHT=1`` skips the memory checks (the estimate
is deliberately conservative).
"""

from __future__ import annotations

import os

from .errors import IntdetError

GiB = 1 << 30
MARGIN = 512 << 20  # interpreter, tokenizer, activations, KV of a short context
CONVERT_WORKING_SET = 1 << 30  # float64 row blocks, the source pages in flight, the small tensors


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _cgroup_free() -> int | None:
    """Bytes the cgroup (v2, else v1) still allows, or None."""
    for limit_p, usage_p in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                             ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                              "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_p) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            limit = int(raw)
            with open(usage_p) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit >= 1 << 60:  # v1's "no limit"
            return None
        return max(0, limit - usage)
    return None


def mem_available() -> int | None:
    """Bytes of memory a new allocation can get without swapping or an OOM
    kill: MemAvailable, capped by the cgroup's remaining limit; None where
    unknown."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    cg = _cgroup_free()
    if cg is not None:
        avail = cg if avail is None else min(avail, cg)
    return avail


def _skipped() -> bool:
    return os.environ.get("INTDET_SKIP_PREFLIGHT", "") not in ("", "0")


def check_convert(output_bytes: int, out_dir: str, available=None) -> None:
    """IntdetError naming the numbers if the converted model (output_bytes)
    cannot fit on out_dir's file system, or the conversion's working set
    does not fit in memory."""
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    while not os.path.isdir(parent):  # convert creates missing parents
        parent = os.path.dirname(parent)
    try:
        st = os.statvfs(parent)
        free = st.f_bavail * st.f_frsize if st.f_blocks else None  # no blocks: a pseudo file system (/proc)
    except (OSError, AttributeError):
        free = None
    if free is not None and output_bytes + (64 << 20) > free:
        raise IntdetError(f"{out_dir}: the converted model needs {gib(output_bytes)} but {parent} has {gib(free)} free")
    avail = None if _skipped() else (available or mem_available)()
    if avail is not None and CONVERT_WORKING_SET > avail:
        raise IntdetError(f"convert: needs about {gib(CONVERT_WORKING_SET)} of memory, {gib(avail)} available")


def load_estimate(tensors: dict) -> int:
    """Bytes the CPU engine holds for a model: its tensors' bytes plus MARGIN."""
    return sum(int(getattr(t, "nbytes", 0)) for t in tensors.values()) + MARGIN


def int4_estimate(cfg: dict, tensors: dict) -> int:
    """What the same model would hold with --weights int4: each decoder
    linear's int8 [N, K] becomes K/2 bytes of codes plus 2 x K/32 int16
    group values per row (0.625 of its bytes); the rest unchanged."""
    total = 0
    for name, t in tensors.items():
        n = int(getattr(t, "nbytes", 0))
        if name.startswith("blk.") and name.endswith(".q"):
            n = n * 5 // 8
        total += n
    return total + MARGIN


def check_load(cfg: dict, tensors: dict, where: str, available=None) -> None:
    """IntdetError naming the estimate and the memory available if the CPU
    engine cannot hold the model; names --weights int4 where that would
    fit (for an int8 model)."""
    if _skipped():
        return
    avail = (available or mem_available)()
    if avail is None:
        return
    need = load_estimate(tensors)
    if need <= avail:
        return
    hint = ""
    if cfg.get("weight_format", "int8") == "int8" and int4_estimate(cfg, tensors) <= avail:
        hint = f"; --weights int4 needs about {gib(int4_estimate(cfg, tensors))}"
    raise IntdetError(f"{where}: loading needs about {gib(need)} of memory, {gib(avail)} available{hint}")
