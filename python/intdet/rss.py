"""Peak resident set size of this process.

Standard library only, and no import of the rest of intdet, so that
scripts/bench_cpu.py can load this one file by path inside the
llama-cpp-python venv (which has no intdet) and measure both engines the
same way.
"""

from __future__ import annotations

import sys


def peak_rss_bytes() -> int:
    """Peak resident set size of this process. On Linux, VmHWM from
    /proc/self/status: ru_maxrss there also counts the RSS the parent had
    when it forked this process (the pre-exec address space), so a small
    process started by a big one would report the big one's size. Elsewhere
    ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024
