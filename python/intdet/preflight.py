"""Pre-flight checks: refuse a conversion or a load that cannot fit, with
the estimate and what the machine has, instead of an OOM kill halfway.

Estimates come from header sizes only (nothing is read or allocated;
check_disk is also compress's and decompress's output check):
- convert: the output's bytes must fit on the output's file system; its
  memory is bounded (quantize.BLOCK_ELEMS row blocks, the source mapped),
  so only the working set is compared with available memory;
- load (CPU engine): the packed weights are a copy of model.safetensors'
  integer tensors (the file's pages are released as each is packed), so the
  process needs about their bytes plus the working margin below.
Available memory is MemAvailable from /proc/meminfo, lowered to the cgroup
limit where one applies (containers); where neither can be read the check
passes. ``INTDET_SKIP_PREFLIGHT=1`` skips the memory checks (the estimate
is deliberately conservative) and compress's and decompress's disk check.
"""

from __future__ import annotations

import os

from .errors import IntdetError

GiB = 1 << 30
MARGIN = 512 << 20  # interpreter, tokenizer, activations, KV of a short context
CONVERT_WORKING_SET = 1 << 30  # float64 row blocks, the source pages in flight, the small tensors


def gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            raw = f.read().strip()
    except OSError:
        return None
    if raw == "max":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _file_cache(d: str) -> int:
    """Page cache charged to cgroup directory d (memory.stat): reclaimable,
    e.g. the model file's pages that the loader's checks just read."""
    try:
        with open(os.path.join(d, "memory.stat")) as f:
            stat = dict(line.split() for line in f if line.count(" ") == 1)
    except (OSError, ValueError):
        return 0
    return int(stat.get("total_cache", stat.get("file", 0)))


def _cgroup_free() -> int | None:
    """Bytes this process's memory cgroups (v1 or v2, and their parents)
    still allow: limit - usage + page cache, the least over the hierarchy;
    None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if "memory" in ctrls.split(","):  # v1
            root, limit_f, usage_f = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        elif hid == "0" and ctrls == "":  # v2 (the unified hierarchy)
            root = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
            limit_f, usage_f = "memory.max", "memory.current"
        else:
            continue
        p = path
        while True:
            d = os.path.join(root, p.lstrip("/"))
            limit, usage = _read_int(os.path.join(d, limit_f)), _read_int(os.path.join(d, usage_f))
            if limit is not None and usage is not None and limit < 1 << 60:  # v1 writes "no limit" as ~2^63
                free = max(0, limit - usage + _file_cache(d))
                best = free if best is None else min(best, free)
            if p in ("/", ""):
                break
            p = os.path.dirname(p)
    return best


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


def skipped() -> bool:
    """INTDET_SKIP_PREFLIGHT is set (not "" or "0")."""
    return os.environ.get("INTDET_SKIP_PREFLIGHT", "") not in ("", "0")


def existing_parent(path: str) -> str:
    """The nearest existing directory above ``path`` (its file system is the
    one a new file or directory at ``path`` lands on)."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    while not os.path.isdir(parent):  # convert creates missing parents
        parent = os.path.dirname(parent)
    return parent


def disk_free(directory: str) -> int | None:
    """Bytes an unprivileged process may still write on ``directory``'s file
    system (statvfs f_bavail); None where unknown or a pseudo file system."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize if st.f_blocks else None  # no blocks: a pseudo file system (/proc)


def size_text(n: int) -> str:
    """n bytes as GiB, or MiB/KiB/bytes for a small n."""
    if n >= GiB:
        return gib(n)
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


def check_disk(need: int, directory: str, what: str, margin: int = 0, fmt=size_text, hint: str = "") -> None:
    """IntdetError "WHAT needs N but DIRECTORY has M free[; HINT]" (sizes
    written by ``fmt``) when ``need`` + ``margin`` bytes do not fit on
    ``directory``'s file system; passes where the free space is unknown."""
    free = disk_free(directory)
    if free is not None and need + margin > free:
        raise IntdetError(f"{what} needs {fmt(need)} but {directory} has {fmt(free)} free" + (f"; {hint}" if hint else ""))


def check_convert(output_bytes: int, out_dir: str, available=None) -> None:
    """IntdetError naming the numbers if the converted model (output_bytes)
    cannot fit on out_dir's file system, or the conversion's working set
    does not fit in memory."""
    check_disk(output_bytes, existing_parent(out_dir), f"{out_dir}: the converted model", margin=64 << 20, fmt=gib)
    avail = None if skipped() else (available or mem_available)()
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
    if skipped():
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
