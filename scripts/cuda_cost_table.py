#!/usr/bin/env python3
"""Cost per kernel of one decode token against the bandwidth bound (issue 50):

    python scripts/cuda_cost_table.py --before OLD_cuda.so [--after NEW_cuda.so] [--pos 512] [--markdown OUT.md]

For batch 1, no CUDA graph, a Qwen3-0.6B-shaped int8 model (hidden 1024,
16 / 8 heads of 128, ffn 3072, 28 layers, vocab 151936) at decode position
POS, each kernel a token launches, for the BEFORE build (main at 478c6a9:
GEMV last-block norm tails, two-kernel split attention) and the AFTER build
(norms / quant16 in GEMV prologues, `attn_fused_kernel`), matched by role:

- launches per token: the engines' launch sequences (docs/cuda.md "Launches
  per decode token"; 6 L + 4 before, 5 L + 3 after);
- bytes per call, COMPUTED FROM THE SHAPES: the least global-memory traffic
  the kernel's job needs (every weight, activation and KV byte it reads or
  writes, once), split into int8 weight matrices, other weights (scales,
  gammas, RoPE rows, the embedding row), activations, KV cache, and scratch
  (data one launch writes and reads back: the split attention's score rows,
  atomics, last-block re-reads; small, likely L2-resident);
- static SASS instructions (sm_90, NOP padding not counted) of the kernel
  function, READ FROM THE MODULE with cuobjdump (scripts/check_sass.py's
  tools): code size, not instructions executed per call.

Nothing here is a GPU measurement. The host emulator (csrc/cuda/emu.h)
counts launches only (`launch_count()`), no instructions or bytes, so no
per-call dynamic count appears. The bound: the token's bytes over 3.35 TB/s
(H100 SXM HBM3) and 4.8 TB/s (H200 HBM3e).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_sass  # noqa: E402  (scripts/ is not a package)

# Qwen3-0.6B's shape (hparams names of an intdet model's config).
QWEN3_06B = dict(hidden_size=1024, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072, num_layers=28,
                 vocab_size=151936)
BANDWIDTHS = (("H100", 3.35e12), ("H200", 4.8e12))
VARIANTS = ("before", "after")

# Mangled-name pieces of the kernel functions (sm_90 SASS of each build).
SYM = {
    "embed": "12embed_kernelE",
    "norm_quant16": "19norm_quant16_kernelE",
    "gemv_before": "11gemv_kernelILi1EEEv",        # gemv_kernel<1> (NormAfter tails)
    "gemv_staged": "11gemv_kernelILi1ELb1EEEv",    # gemv_kernel<1, true>: GemvIn prologue
    "gemv_plain": "11gemv_kernelILi1ELb0EEEv",     # gemv_kernel<1, false>
    "attn_scores": "18attn_scores_kernelE",
    "attn_pv": "14attn_pv_kernelE",
    "attn_fused": "17attn_fused_kernelE",
}


@dataclasses.dataclass
class Call:
    """One kernel's calls in a decode token: ``launches`` per token, bytes per call."""
    role: str
    kernel: str            # readable name, e.g. "gemv_kernel<1, true>"
    sym: str               # key of SYM
    launches: int
    w_int8: int = 0        # int8 weight matrices
    w_other: int = 0       # per-channel scales, gammas, RoPE rows, embedding row
    act: int = 0           # activations read and written
    kv: int = 0            # KV cache rows and scales read and written
    scratch: int = 0       # written and read back within the step (L2-sized)

    @property
    def bytes(self) -> int:
        """Bytes per call a bandwidth bound counts (scratch excluded)."""
        return self.w_int8 + self.w_other + self.act + self.kv


def _shape(cfg: dict):
    H, nh, nkv, D = (int(cfg[k]) for k in ("hidden_size", "num_heads", "num_kv_heads", "head_dim"))
    F, L, V = (int(cfg[k]) for k in ("intermediate_size", "num_layers", "vocab_size"))
    if min(H, nh, nkv, D, F, L, V) < 1 or nh % nkv:
        raise ValueError(f"config: sizes must be positive and num_heads a multiple of num_kv_heads: {cfg}")
    return H, nh, nkv, D, F, L, V


def _gemv(N: int, K: int, n_in: int, residual: bool = False) -> dict:
    """A GEMV's bytes for one row: N x K int8, mant + shift per channel (8 B),
    int16 input row + its exponent (``n_in`` values), int32 output (read and
    written again when added into the residual)."""
    return dict(w_int8=N * K, w_other=8 * N, act=2 * n_in + 4 + 4 * N * (2 if residual else 1))


def _norm_in(H: int) -> dict:
    """RMSNorm + quant16 of the residual row: x int32 and gamma int16 read,
    the int16 row and exponent written (by a launch or a tail; a prologue
    keeps the result in shared memory, see callers)."""
    return dict(w_other=2 * H, act=4 * H + 2 * H + 4)


def _add(*parts: dict) -> dict:
    out = collections.Counter()
    for p in parts:
        out.update(p)
    return dict(out)


def attn_chunk(sstride: int, nkv: int, nrows: int = 1) -> int:
    """The BEFORE build's split chunk (kernels_attention.cu attn_chunk at 478c6a9)."""
    blocks = nkv * nrows
    want = 1 if blocks >= 256 else (256 + blocks - 1) // blocks
    c = (sstride + want - 1) // want
    c = (c + 31) // 32 * 32
    return min(max(c, 32), 512)


def decode_calls(cfg: dict, pos: int, variant: str) -> list[Call]:
    """The kernels one decode row at position ``pos`` (pos + 1 positions
    attended, no graph) launches, in order, for ``variant`` "before" or
    "after". Raises ValueError for a bad config, position or variant."""
    if variant not in VARIANTS:
        raise ValueError(f"variant: {variant!r} is not one of {VARIANTS}")
    H, nh, nkv, D, F, L, V = _shape(cfg)
    if pos < 0:
        raise ValueError(f"pos: {pos} is negative")
    n = pos + 1
    qd, kvd = nh * D, nkv * D
    kv_row = nkv * (2 * D + 8)  # one position's K and V (int8) and their int32 scales, all kv heads
    # q/k RMSNorm gammas (D each) and one RoPE cos + sin row (D/2 int16 each)
    head_w = 2 * D * 2 + 2 * (D // 2) * 2
    # q, k, v rows (int32) in; the new position's K and V appended
    qkv_in = 4 * (qd + 2 * kvd)
    out_act = 4 * qd + 2 * qd + 4  # attn_out int32 and its int16 row + exponent (the o-proj's input)
    calls = [Call("embedding", "embed_kernel", "embed", 1, w_other=H + 8, act=4 + 4 * H)]
    qkv = _add(_gemv(qd, H, H), _gemv(kvd, H, 0), _gemv(kvd, H, 0))
    qkv["act"] -= 2 * 4  # one input row for the three segments
    o = _gemv(H, qd, qd, residual=True)
    # gate and up (N = F each) on one input row; gate, up (int32) and the GLU (int64) stored
    gu = _add(_gemv(F, H, H), dict(w_int8=F * H, w_other=8 * F, act=4 * F + 8 * F))
    down = _gemv(H, F, F, residual=True)
    head = _gemv(V, H, H)
    if variant == "before":
        norm_tail = _norm_in(H)
        calls.append(Call("attn_norm, layer 0 (later layers: the down-proj's tail)", "norm_quant16_kernel",
                          "norm_quant16", 1, **_norm_in(H)))
        calls.append(Call("q+k+v GEMV", "gemv_kernel<1>", "gemv_before", L, **qkv))
        nsplit = -(-n // attn_chunk((n + 255) // 256 * 256, nkv))
        scores = nh * n * 4
        calls.append(Call("attention: scores (+ q/k norm, RoPE, KV append, softmax tail)", "attn_scores_kernel",
                          "attn_scores", L, w_other=head_w, act=qkv_in,
                          kv=(n - 1) * nkv * (D + 4) + n * nkv * 4 + kv_row,  # K rows, V scales, the append
                          # scores written; the tail's exp2, p, w16 passes read and rewrite them; chunk maxima
                          scratch=scores + 6 * scores + 2 * nsplit * nh * 8))
        calls.append(Call("attention: P.V (+ quant16 tail)", "attn_pv_kernel", "attn_pv", L,
                          act=out_act, kv=n * kvd,
                          # w16 read; int64 atomics per chunk; the tail reads and zeroes oacc
                          scratch=scores + 4 * nh + nsplit * qd * 8 + 2 * qd * 8))
        calls.append(Call("o-proj GEMV (+ residual; before: + ffn_norm tail)", "gemv_kernel<1>", "gemv_before", L,
                          **_add(o, norm_tail)))
        gq = _add(gu, dict(act=8 * F + 2 * F + 4))  # quant16 tail: GLU rows read back, int16 row written
        calls.append(Call("gate+up GEMV + GLU (before: + quant16 tail)", "gemv_kernel<1>", "gemv_before", L,
                          **gq))
        calls.append(Call("down GEMV (+ residual; before: + next attn_norm tail)", "gemv_kernel<1>", "gemv_before",
                          L - 1, **_add(down, norm_tail)))
        calls.append(Call("down GEMV (+ residual; before: + next attn_norm tail)", "gemv_kernel<1>", "gemv_before",
                          1, **down))
        calls.append(Call("final norm", "norm_quant16_kernel", "norm_quant16", 1, **_add(_norm_in(H), dict(act=4))))
        calls.append(Call("lm_head GEMV", "gemv_kernel<1>", "gemv_before", 1, **head))
        return calls
    # after: the prologue reads x and gamma instead of the int16 row (the result stays in shared memory)
    qkv_p = _add(qkv, dict(act=-(2 * H + 4)), dict(w_other=2 * H, act=4 * H))
    calls.append(Call("q+k+v GEMV (after: + attn_norm prologue)", "gemv_kernel<1, true>", "gemv_staged", L, **qkv_p))
    calls.append(Call("attention (after: one kernel, + q/k norm, RoPE, KV append, quant16)", "attn_fused_kernel",
                      "attn_fused", L, w_other=head_w, act=qkv_in + out_act,
                      kv=(n - 1) * kv_row + kv_row,  # K, V and scales of the cached positions; the append
                      scratch=4 * qd))  # the last block re-reads the row's attn_out for quant16
    calls.append(Call("o-proj GEMV (+ residual; before: + ffn_norm tail)", "gemv_kernel<1, false>", "gemv_plain", L,
                      **o))
    gu_p = _add(gu, dict(act=-(2 * H + 4)), dict(w_other=2 * H, act=4 * H))
    calls.append(Call("gate+up GEMV + GLU (after: + ffn_norm prologue)", "gemv_kernel<1, true>", "gemv_staged", L,
                      **gu_p))
    down_p = _add(down, dict(act=-(2 * F + 4)), dict(act=8 * F))  # the GLU rows (int64) quant16'd in the prologue
    calls.append(Call("down GEMV (+ residual; after: + quant16 prologue)", "gemv_kernel<1, true>", "gemv_staged", L,
                      **down_p))
    calls.append(Call("final norm", "norm_quant16_kernel", "norm_quant16", 1, **_add(_norm_in(H), dict(act=4))))
    calls.append(Call("lm_head GEMV", "gemv_kernel<1, false>", "gemv_plain", 1, **head))
    return calls


# Role keys shared by both variants (the table's rows, in order).
ROLES = ("embedding", "attn_norm", "q+k+v", "attention", "attention: P.V", "o-proj", "gate+up", "down", "final norm",
         "lm_head")


def role_key(call: Call) -> str:
    r = call.role
    if r.startswith("attention: P.V"):
        return "attention: P.V"
    for k in ROLES:
        if r.startswith(k):
            return k
    raise ValueError(f"no role for {r!r}")


def token_totals(calls: list[Call]) -> dict:
    """Per-token sums: launches and each byte kind (bytes x launches)."""
    t = collections.Counter()
    for c in calls:
        t["launches"] += c.launches
        for f in ("w_int8", "w_other", "act", "kv", "scratch"):
            t[f] += getattr(c, f) * c.launches
    t["bytes"] = t["w_int8"] + t["w_other"] + t["act"] + t["kv"]
    return dict(t)


@functools.lru_cache(maxsize=4)  # one cuobjdump run per module and process
def sass_per_function(path: str, arch: str = "sm_90") -> dict:
    """{mangled function name: SASS instructions (NOP not counted)} of ``arch``
    in ``path`` (cuobjdump -sass; check_sass's tools and line parser).
    Raises RuntimeError when cuobjdump fails or finds no function of ``arch``."""
    cuobjdump = check_sass.find_tool("cuobjdump")
    if not cuobjdump or not check_sass.find_tool("nvdisasm"):
        raise RuntimeError("cuobjdump/nvdisasm not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    r = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, timeout=900, check=False,
                       env=check_sass._env_with_nvdisasm())
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {path} failed: {(r.stderr or r.stdout).strip()[:300]}")
    counts, cur_arch, func = collections.Counter(), "?", None
    for line in r.stdout.splitlines():
        m = check_sass.ARCH.match(line)
        if m:
            cur_arch = m.group(1)
            continue
        m = check_sass.FUNC.match(line)
        if m:
            func = m.group(1) if cur_arch == arch else None
            if func:
                counts[func] += 0
            continue
        if func:
            op = check_sass.opcode_of(line)
            if op and op != "NOP":
                counts[func] += 1
    if not counts:
        raise RuntimeError(f"{path}: no {arch} kernel functions in its SASS")
    return dict(counts)


def sass_of(funcs: dict, sym: str, path: str) -> int:
    """The instruction count of the one function whose name holds SYM[sym]."""
    hits = [f for f in funcs if SYM[sym] in f]
    if len(hits) != 1:
        raise RuntimeError(f"{path}: {len(hits)} sm_90 functions match {SYM[sym]!r} ({sym}); "
                           "is it the build this column describes?")
    return funcs[hits[0]]


def kernel_base_names(funcs: dict) -> set:
    """Kernel names (the mangled ``<length><name>_kernel`` piece) of the functions."""
    out = set()
    for f in funcs:
        name = f
        for m in re.finditer(r"\d+", f):
            run = m.group()
            for i in range(len(run)):  # the length prefix may follow other digits (a hash)
                cand = f[m.end():m.end() + int(run[i:])]
                if len(cand) == int(run[i:]) and cand.endswith("_kernel") and cand[0].isalpha():
                    name = cand
                    break
        out.add(name)
    return out


def _mb(b: float) -> str:
    return f"{b / 1e6:.3f}" if b < 1e7 else f"{b / 1e6:.1f}"


def build_rows(cfg: dict, pos: int, sass: dict) -> list[dict]:
    """One row per role: for each variant its kernel, launches, bytes per call
    (distinct values) and per token, SASS instructions (or None)."""
    rows = []
    for key in ROLES:
        row = {"role": key}
        for v in VARIANTS:
            cs = [c for c in decode_calls(cfg, pos, v) if role_key(c) == key]
            if not cs:
                row[v] = None
                continue
            per_call = []
            for c in cs:
                if c.bytes not in per_call:
                    per_call.append(c.bytes)
            ins = None
            if sass.get(v) is not None:
                ins = sass_of(sass[v][0], cs[0].sym, sass[v][1])
            row[v] = dict(kernel=cs[0].kernel, launches=sum(c.launches for c in cs), per_call=per_call,
                          per_token=sum(c.bytes * c.launches for c in cs),
                          scratch=sum(c.scratch * c.launches for c in cs), sass=ins)
        rows.append(row)
    return rows


ROLE_TITLE = {
    "embedding": "embedding", "attn_norm": "attn_norm (layer 0; later ones in the down-proj's tail)",
    "q+k+v": "q+k+v GEMV", "attention": "attention (before: scores + softmax tail)",
    "attention: P.V": "attention P.V + quant16 tail", "o-proj": "o-proj GEMV (+ residual)",
    "gate+up": "gate+up GEMV + GLU", "down": "down GEMV (+ residual)", "final norm": "final norm",
    "lm_head": "lm_head GEMV"}


def markdown(cfg: dict, pos: int, rows: list[dict]) -> str:
    """The table (one row per role, before / after in each cell) and the token's bounds."""
    tot = {v: token_totals(decode_calls(cfg, pos, v)) for v in VARIANTS}
    out = ["| role | kernel before / after | launches / token | MB per call (shapes) | MB per token (shapes) "
           "| H100 bound per call (us) | SASS instr. sm_90 (static) |", "|---|---|---|---|---|---|---|"]

    def cell(r, f, fmt=str):
        return " / ".join("-" if r[v] is None else (fmt(r[v][f]) if r[v][f] is not None else "n/a") for v in VARIANTS)

    for r in rows:
        kern = " / ".join("-" if r[v] is None else f"`{r[v]['kernel']}`" for v in VARIANTS)
        per_call = cell(r, "per_call", lambda pc: " or ".join(_mb(b) for b in pc))
        us = cell(r, "per_call", lambda pc: " or ".join(f"{b / BANDWIDTHS[0][1] * 1e6:.2f}" for b in pc))
        out.append(f"| {ROLE_TITLE[r['role']]} | {kern} | {cell(r, 'launches')} | {per_call} | "
                   f"{cell(r, 'per_token', _mb)} | {us} | {cell(r, 'sass')} |")
    out.append(f"| **token** | | {tot['before']['launches']} / {tot['after']['launches']} | | "
               f"{_mb(tot['before']['bytes'])} / {_mb(tot['after']['bytes'])} | "
               f"{tot['before']['bytes'] / BANDWIDTHS[0][1] * 1e6:.0f} / {tot['after']['bytes'] / BANDWIDTHS[0][1] * 1e6:.0f}"
               " (token) | |")
    out.append("")
    for v in VARIANTS:
        t = tot[v]
        bounds = ", ".join(f"{t['bytes'] / bw * 1e6:.0f} us = {bw / t['bytes']:.0f} tok/s at {bw / 1e12:.2f} TB/s "
                           f"({name})" for name, bw in BANDWIDTHS)
        out.append(f"- {v}: {t['bytes'] / 1e6:.1f} MB per token (int8 matrices {t['w_int8'] / 1e6:.1f}, other "
                   f"weights {t['w_other'] / 1e6:.2f}, activations {t['act'] / 1e6:.2f}, KV cache "
                   f"{t['kv'] / 1e6:.2f}; scratch besides: {t['scratch'] / 1e6:.2f}); bound {bounds}.")
    return "\n".join(out) + "\n"


def plain(cfg: dict, pos: int) -> str:
    """Every call's byte split, per variant (the markdown's inputs)."""
    out = []
    for v in VARIANTS:
        out.append(f"{v}: decode position {pos}, bytes per call (computed from shapes)")
        out.append(f"  {'kernel':24} {'launches':>8} {'int8 w':>11} {'other w':>9} {'act':>9} {'kv':>9} {'scratch':>9}"
                   "  role")
        for c in decode_calls(cfg, pos, v):
            out.append(f"  {c.kernel:24} {c.launches:8d} {c.w_int8:11d} {c.w_other:9d} {c.act:9d} {c.kv:9d} "
                       f"{c.scratch:9d}  {c.role}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="the BEFORE build's _cuda .so (478c6a9); its SASS column is 'n/a' without it")
    ap.add_argument("--after", help="the AFTER build's _cuda .so (default: the importable intdet._cuda)")
    ap.add_argument("--pos", type=int, default=512, help="decode position (pos + 1 positions attended)")
    ap.add_argument("--markdown", metavar="OUT", help="also write the markdown table to OUT")
    ap.add_argument("--no-sass", action="store_true", help="skip cuobjdump (byte and launch columns only)")
    a = ap.parse_args(argv)
    if a.pos < 0 or a.pos > 1 << 20:
        ap.error(f"--pos: {a.pos} is not in 0..{1 << 20}")
    paths = {"before": a.before, "after": a.after or (None if a.no_sass else check_sass.built_module())}
    for v, p in paths.items():
        if p and not os.path.isfile(p):
            print(f"cuda_cost_table: error: --{v}: {p}: no such file", file=sys.stderr)
            return 2
    sass = {}
    if not a.no_sass:
        for v, p in paths.items():
            if p is None:
                continue
            try:
                sass[v] = (sass_per_function(p), p)
            except RuntimeError as e:
                print(f"cuda_cost_table: error: --{v}: {e}", file=sys.stderr)
                return 2
    try:
        rows = build_rows(QWEN3_06B, a.pos, sass)
    except RuntimeError as e:
        print(f"cuda_cost_table: error: {e}", file=sys.stderr)
        return 2
    md = markdown(QWEN3_06B, a.pos, rows)
    print(plain(QWEN3_06B, a.pos))
    print(md)
    if len(sass) == 2:
        b, af = (kernel_base_names(sass[v][0]) for v in VARIANTS)
        used = {v: {c.kernel for c in decode_calls(QWEN3_06B, a.pos, v)} for v in VARIANTS}
        print(f"kernels only in the before module: {sorted(b - af) or 'none'}; only in the after module: "
              f"{sorted(af - b) or 'none'}")
        print(f"launched per token before but not after (template instances included): "
              f"{sorted(used['before'] - used['after'])}")
    if a.markdown:
        d = os.path.dirname(os.path.abspath(a.markdown))
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(md)
        os.replace(tmp, a.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
