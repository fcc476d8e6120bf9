"""Fail if the compiled integer core contains a floating-point instruction.

Builds csrc/ (without Python) with CMake, disassembles libintdet_core.a with
objdump and looks for x87 instructions and SSE/AVX arithmetic or conversion
on floats (…ss/sd/ps/pd). Pure data moves and bitwise ops on xmm registers
(movaps, xorps, shufps…) are allowed: compilers use them for integer vectors.
Usage: python scripts/check_no_float.py [build_dir]
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOAT_OPS = re.compile(
    r"^v?(add|sub|mul|div|sqrt|min|max|cmp\w*|u?comi|h(add|sub)|dp|round|rcp|rsqrt|f[n]?m(add|sub)\w*|addsub)(ss|sd|ps|pd)$"
    r"|^v?cvt\w*(ss|sd|ps|pd|si2sd|si2ss)\w*$"
    r"|^f(ld|st|add|sub|mul|div|sqrt|ild|ist|com|ucom)\w*$"
)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "core-check")
    subprocess.run(["cmake", "-S", ROOT, "-B", build, "-DINTDET_PYTHON=OFF", "-DCMAKE_BUILD_TYPE=Release",
                    # this interpreter finds the nlohmann-json package, not another python on PATH
                    f"-DPython_EXECUTABLE={sys.executable}"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "-j2"], check=True, stdout=subprocess.DEVNULL)
    lib = os.path.join(build, "libintdet_core.a")
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], check=True, capture_output=True, text=True).stdout
    bad, n = [], 0
    for line in asm.splitlines():
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip().endswith(":"):
            continue
        n += 1
        mnem = parts[1].split()[0] if parts[1].split() else ""
        if FLOAT_OPS.match(mnem):
            bad.append(line.strip())
    if n == 0:
        sys.exit("check_no_float: no instructions found (objdump output not understood)")
    if bad:
        print(f"check_no_float: {len(bad)} floating-point instructions in the integer core:", file=sys.stderr)
        print("\n".join(bad[:20]), file=sys.stderr)
        sys.exit(1)
    print(f"check_no_float: {n} instructions in libintdet_core.a, none floating point")


if __name__ == "__main__":
    main()
