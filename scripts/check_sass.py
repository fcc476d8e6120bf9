#!/usr/bin/env python3
"""Fail on any floating-point instruction in the CUDA backend's machine code.

    python scripts/check_sass.py                 # the built module intdet._cuda
    python scripts/check_sass.py FILE...         # objects, executables, .so, .cubin, .fatbin
    python scripts/check_sass.py --compile       # nvcc -c csrc/cuda/sources.txt's files first (sm_80 + sm_90)

Disassembles every kernel with ``cuobjdump -sass`` (it needs ``nvdisasm``
beside it) and counts opcodes per architecture; any opcode in FLOAT_OPS
(float/double/half arithmetic, compares, conversions, the special-function
unit MUFU, float tensor-core MMA) fails the check. The embedded PTX
(``cuobjdump -ptx``, what a future GPU would JIT) must not name a float type
either. No GPU is needed. Exit status: 0 clean, 1 float instructions found
(or no SASS at all), 2 tools or inputs missing.

cuobjdump is looked up on PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin and
in the pip packages nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm
(``pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``).

Why it matters: integer division by a variable is lowered by nvcc through
I2F + MUFU.RCP + F2I (exact, but float hardware); the sources avoid it
(intmath.h DivBy, a reciprocal and IMAD.HI), and this check proves no such
code came back.
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CUDA_SRC = os.path.join(ROOT, "csrc", "cuda")


def _listed_sources() -> list[str]:
    with open(os.path.join(CUDA_SRC, "sources.txt"), encoding="utf-8") as f:
        names = [ln.strip() for ln in f]
    return [os.path.join(CUDA_SRC, n) for n in names if n and not n.startswith("#")]


def cuda_sources() -> list[str]:
    """The CUDA kernel files (absolute paths; the .cu lines of csrc/cuda/sources.txt,
    the one list CMakeLists.txt and the emulator build (tests/engine/test_cuda.py) read too)."""
    return [p for p in _listed_sources() if p.endswith(".cu")]


def host_sources() -> list[str]:
    """The engine's host files (absolute paths; the .cpp lines of csrc/cuda/sources.txt)."""
    return [p for p in _listed_sources() if p.endswith(".cpp")]

# SASS opcodes (the part before the first '.') that use floating point, for
# sm_80 .. sm_100 and older names kept for completeness.
FLOAT_OPS = {
    # fp32
    "FADD", "FADD32I", "FMUL", "FMUL32I", "FFMA", "FFMA32I", "FFMA2", "FADD2", "FMUL2", "FMNMX", "FMNMX3",
    "FSET", "FSETP", "FSEL", "FCHK", "FRND", "FSWZADD", "FCMP", "FMAD", "FSIN", "FCOS", "RRO",
    # special function unit (rcp, rsqrt, ex2, lg2, sin, cos, sqrt)
    "MUFU",
    # fp64
    "DADD", "DMUL", "DFMA", "DMNMX", "DSET", "DSETP",
    # fp16 / bf16
    "HADD2", "HADD2_32I", "HMUL2", "HMUL2_32I", "HFMA2", "HFMA2_32I", "HMNMX2", "HSET2", "HSETP2",
    # conversions between float and integer or float formats
    "F2I", "I2F", "F2F", "F2FP", "I2FP", "F2IP",
    # float tensor-core matrix ops (integer IMMA is fine)
    "HMMA", "DMMA", "HGMMA", "QGMMA", "UTCHMMA", "UTCQMMA", "UTCFMMA",
}

INSN = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)")
ARCH = re.compile(r"^\s*arch\s*=\s*(sm_\d+\w*)")
FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
# ptxas materializes constants (0 most often) into a register through the
# half-precision FMA pipe when the integer pipes are busy:
# "HFMA2.MMA R16, -RZ, RZ, 0, 0" is -0 * 0 + (c, c') per half, the
# immediate's bits for any non-NaN c (-0 + -0 = -0, -0 + x = x). No value
# of the program goes through float arithmetic, so it is counted as a move
# (CONST_MOVE_OP) and not as HFMA2. Register or constant-bank operands, or a
# NaN immediate, stay HFMA2.
CONST_MOVE = re.compile(r"\bHFMA2(?:\.MMA)?\s+R\d+\s*,\s*-RZ\s*,\s*RZ\s*,\s*(-?[0-9][0-9.e+-]*|-?INF)\s*,"
                        r"\s*(-?[0-9][0-9.e+-]*|-?INF)\s*;")
CONST_MOVE_OP = "HFMA2-const-move"
PTX_FLOAT = re.compile(r"\.(?:f16x2|bf16x2|f16|bf16|f32|f64|tf32|e4m3|e5m2|e4m3x2|e5m2x2)\b")


def _pip_cuda_bins():
    out = []
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return out
    for base in getattr(nvidia, "__path__", []):
        out += sorted(glob.glob(os.path.join(base, "cu*", "bin"))) + sorted(glob.glob(os.path.join(base, "*", "bin")))
    return out


def tool_dirs():
    dirs = []
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(os.path.join(os.environ[env], "bin"))
    dirs += ["/usr/local/cuda/bin"] + _pip_cuda_bins()
    return [d for d in dirs if os.path.isdir(d)]


def find_tool(name: str) -> str | None:
    """Path of a CUDA tool (cuobjdump, nvdisasm, nvcc) or None."""
    p = shutil.which(name)
    if p:
        return p
    for d in tool_dirs():
        c = os.path.join(d, name)
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def tools_available() -> bool:
    return find_tool("cuobjdump") is not None and find_tool("nvdisasm") is not None


def _env_with_nvdisasm():
    env = dict(os.environ)
    nd = find_tool("nvdisasm")
    if nd:
        env["PATH"] = os.path.dirname(nd) + os.pathsep + env.get("PATH", "")
    return env


def opcode_of(line: str) -> str | None:
    """The opcode a SASS line counts as (None: not an instruction line);
    ptxas's constant-move idiom (CONST_MOVE) is CONST_MOVE_OP."""
    m = INSN.match(line)
    if not m:
        return None
    if m.group(1) == "HFMA2" and CONST_MOVE.search(line):
        return CONST_MOVE_OP
    return m.group(1)


def sass_counts(path: str):
    """{arch: Counter(opcode -> n)}, {arch: {opcode: set(functions)}} for the
    float opcodes, and the number of functions seen."""
    cuobjdump = find_tool("cuobjdump")
    r = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, env=_env_with_nvdisasm(), timeout=600,
                       check=False)
    if r.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {path} failed: {(r.stderr or r.stdout).strip()[:500]}")
    counts = collections.defaultdict(collections.Counter)
    where = collections.defaultdict(lambda: collections.defaultdict(set))
    arch, func, nfunc = "?", "?", 0
    for line in r.stdout.splitlines():
        m = ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = FUNC.match(line)
        if m:
            func, nfunc = m.group(1), nfunc + 1
            continue
        op = opcode_of(line)
        if op:
            counts[arch][op] += 1
            if op in FLOAT_OPS:
                where[arch][op].add(func)
    return counts, where, nfunc


def ptx_float_lines(path: str):
    """Lines of the embedded PTX that name a float type (declarations included)."""
    cuobjdump = find_tool("cuobjdump")
    r = subprocess.run([cuobjdump, "-ptx", path], capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        return []  # no PTX embedded (e.g. code=sm_XX only): nothing to check
    bad = []
    for line in r.stdout.splitlines():
        code = line.split("//", 1)[0]
        if PTX_FLOAT.search(code):
            bad.append(line.strip())
    return bad


def compile_kernels(out_dir: str) -> list[str]:
    nvcc = find_tool("nvcc")
    if not nvcc:
        raise FileNotFoundError("nvcc not found")
    outs = []
    for src in cuda_sources():
        obj = os.path.join(out_dir, os.path.basename(src) + ".o")
        cmd = [nvcc, "-std=c++20", "-O3", "-fmad=false", "-I", os.path.join(ROOT, "csrc", "include"),
               "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
               "-c", src, "-o", obj]
        subprocess.run(cmd, check=True, timeout=900)
        outs.append(obj)
    return outs


def built_module() -> str | None:
    try:
        spec = importlib.util.find_spec("intdet._cuda")
    except ImportError:
        return None
    return spec.origin if spec and spec.origin else None


def check(paths, show_top: int = 0) -> int:
    bad_total = 0
    for path in paths:
        counts, where, nfunc = sass_counts(path)
        total = sum(sum(c.values()) for c in counts.values())
        print(f"{path}: {nfunc} kernel functions, {total} SASS instructions")
        if total == 0:
            print("  no SASS found: nothing was checked", file=sys.stderr)
            return 1
        for arch in sorted(counts):
            c = counts[arch]
            fl = {op: n for op, n in c.items() if op in FLOAT_OPS}
            bad_total += sum(fl.values())
            print(f"  {arch}: {sum(c.values())} instructions, {len(c)} opcodes, float opcodes: "
                  + (", ".join(f"{op} x{n}" for op, n in sorted(fl.items())) if fl else "none"))
            for op in sorted(fl):
                for fn in sorted(where[arch][op])[:5]:
                    print(f"    {op} in {fn}")
            if show_top:
                print("    top: " + ", ".join(f"{op} {n}" for op, n in c.most_common(show_top)))
        ptx = ptx_float_lines(path)
        bad_total += len(ptx)
        print(f"  embedded PTX lines with a float type: {len(ptx)}")
        for line in ptx[:10]:
            print(f"    {line}")
    print(f"checked {len(FLOAT_OPS)} float opcodes: {'FAIL, ' + str(bad_total) + ' found' if bad_total else 'none found'}")
    return 1 if bad_total else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="files to check (default: the built intdet._cuda module)")
    ap.add_argument("--compile", action="store_true",
                    help="compile csrc/cuda/sources.txt's files with nvcc and check the objects")
    ap.add_argument("--top", type=int, default=0, help="also print the N most frequent opcodes per arch")
    args = ap.parse_args(argv)
    if not tools_available():
        print("check_sass: cuobjdump/nvdisasm not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = list(args.paths)
        if args.compile:
            try:
                paths += compile_kernels(tmp)
            except (FileNotFoundError, subprocess.CalledProcessError) as e:
                print(f"check_sass: compiling failed: {e}", file=sys.stderr)
                return 2
        if not paths:
            mod = built_module()
            if not mod:
                print("check_sass: intdet._cuda is not built (no nvcc at build time?); give files or --compile",
                      file=sys.stderr)
                return 2
            paths = [mod]
        for p in paths:
            if not os.path.isfile(p):
                print(f"check_sass: {p}: no such file", file=sys.stderr)
                return 2
        return check(paths, args.top)


if __name__ == "__main__":
    sys.exit(main())
