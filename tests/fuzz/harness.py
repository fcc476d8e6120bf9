"""Shared driver of the file-format fuzzers (fuzz_gguf.py, fuzz_safetensors.py).

A fuzzer feeds mutated bytes of a small valid file to a reader: IntdetError
is the only accepted failure, any other exception is a crash. Engines:

- atheris (libFuzzer, coverage-guided; ``pip install atheris``), the default
  when it imports;
- ``--engine plain``: a seeded random-mutation loop, no coverage feedback
  (used automatically when atheris is missing).

Both use the same mutator: libFuzzer's own byte mutations (plain: a few
simple ones), interesting integers (0, 2^31, 2^63, 2^64-1, the file size ...)
written over header bytes, and a structure-aware mutation supplied by the
format (a GGUF field or a safetensors JSON entry changed, the rest kept
valid).

Usage: python tests/fuzz/fuzz_gguf.py [--seconds N] [--engine atheris|plain]
           [--seed N] [--artifacts DIR] [FILE ...]
With FILEs it replays them (a crash shows its traceback; exit 1) instead of
fuzzing. A crash while fuzzing is written to ARTIFACTS/crash-* and the
process exits non-zero; a clean run ends with libFuzzer's ``Done N runs``
(atheris) or ``fuzz: OK ...`` (plain). ARTIFACTS/.work-NAME-PID holds the
current input and corpus (removed by the next run once that one ended).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/ (models.py, gguf_bytes.py)

INTERESTING = [0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256, 1023, 1024, 4096, 2**15, 2**16 - 1,
               2**16, 2**20, 2**24, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**53, 2**62, 2**63 - 1, 2**63,
               2**64 - 8, 2**64 - 1]


def interesting(rng: random.Random, size: int) -> int:
    r = rng.random()
    if r < 0.6:
        return rng.choice(INTERESTING)
    if r < 0.8:
        return rng.choice([size, size - 1, size + 1, size * 2, size // 2])
    return rng.getrandbits(rng.choice([8, 16, 32, 64]))


def put_int(data: bytearray, rng: random.Random, pos: int, v: int):
    fmt = rng.choice(["<B", "<H", "<I", "<Q", "<Q"])
    n = struct.calcsize(fmt)
    if pos + n <= len(data):
        struct.pack_into(fmt, data, pos, v & ((1 << (8 * n)) - 1))


def plain_byte_mutation(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    if not b:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
    op = rng.randrange(6)
    i = rng.randrange(len(b))
    if op == 0:
        b[i] ^= 1 << rng.randrange(8)
    elif op == 1:
        b[i] = rng.getrandbits(8)
    elif op == 2:
        del b[rng.randrange(len(b)):]
    elif op == 3:
        j = min(len(b), i + rng.randint(1, 64))
        del b[i:j]
    elif op == 4:
        j = min(len(b), i + rng.randint(1, 64))
        b[i:i] = b[i:j]
    else:
        b[i:i] = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 16)))
    return bytes(b)


class Fuzzer:
    """name: for messages; target(path): reads the file (raises IntdetError
    or nothing); seed_bytes: a valid file; header_len: bytes of it worth
    corrupting most; structure(data, rng) -> bytes or None: a format-aware
    mutation."""

    def __init__(self, name, target, seed_bytes: bytes, header_len: int, structure=None):
        self.name, self.target, self.seed = name, target, seed_bytes
        self.header_len, self.structure = max(8, header_len), structure
        self.tmpdir = self.path = None  # set by run(): a work dir under the artifacts dir
        self.byte_mutate = None  # atheris.Mutate when running under atheris

    # -------------------------------------------------------------- target

    def one(self, data: bytes):
        from intdet.errors import IntdetError

        if os.path.exists(self.path):
            os.unlink(self.path)  # a fresh inode: no mmap of the last input sees new bytes
        with open(self.path, "wb") as f:
            f.write(data)
        try:
            self.target(self.path)
        except IntdetError as e:
            msg = str(e)
            if "\n" in msg or not msg.startswith(self.path):
                raise AssertionError(f"IntdetError message not one line naming the file: {msg!r}") from None

    # ------------------------------------------------------------- mutator

    def mutate(self, data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            r = rng.random()
            out = None
            if r < 0.35 and self.structure is not None:
                try:
                    out = self.structure(data, rng)
                except Exception:  # the helper parsers assume sane input
                    out = None
            elif r < 0.65 and data:
                b = bytearray(data)
                lim = min(len(b), self.header_len) if rng.random() < 0.8 else len(b)
                put_int(b, rng, rng.randrange(max(1, lim)), interesting(rng, len(b)))
                out = bytes(b)
            if out is None:
                out = self.byte_mutate(data, max_size) if self.byte_mutate else plain_byte_mutation(data, rng)
            data = out
        return data[:max_size]

    # ------------------------------------------------------------ engines

    def run(self, argv=None):
        ap = argparse.ArgumentParser(description=f"fuzz the {self.name} reader")
        ap.add_argument("--seconds", type=float, default=float(os.environ.get("INTDET_FUZZ_SECONDS", "60")))
        ap.add_argument("--engine", choices=["auto", "atheris", "plain"], default="auto")
        ap.add_argument("--seed", type=int, default=None)
        ap.add_argument("--artifacts", default=os.path.join(os.getcwd(), "fuzz-artifacts"))
        ap.add_argument("files", nargs="*", help="replay these inputs instead of fuzzing")
        a = ap.parse_args(argv)
        # libFuzzer ends the process with C exit(), so no Python cleanup runs:
        # the work dir (input file, corpus) lives under the artifacts dir and
        # stale ones of finished runs are removed here.
        os.makedirs(a.artifacts, exist_ok=True)
        _remove_stale_workdirs(a.artifacts, self.name)
        self.tmpdir = os.path.join(a.artifacts, f".work-{self.name}-{os.getpid()}")
        os.makedirs(self.tmpdir)
        self.path = os.path.join(self.tmpdir, "input")
        try:
            if a.files:
                return self.replay(a.files)
            engine = a.engine
            if engine == "auto":
                try:
                    import atheris  # noqa: F401

                    engine = "atheris"
                except ImportError:
                    engine = "plain"
            seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
            print(f"fuzz {self.name}: engine {engine}, {a.seconds:g} s, seed {seed}", flush=True)
            if engine == "atheris":
                return self.run_atheris(a.seconds, seed, a.artifacts)
            return self.run_plain(a.seconds, seed, a.artifacts)
        finally:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def replay(self, files):
        bad = 0
        for fn in files:
            with open(fn, "rb") as f:
                data = f.read()
            try:
                self.one(data)
                print(f"{fn}: ok")
            except Exception:
                bad += 1
                print(f"{fn}: CRASH")
                traceback.print_exc()
        return 1 if bad else 0

    def run_plain(self, seconds, seed, artifacts):
        rng = random.Random(seed)
        corpus = [self.seed]
        self.one(self.seed)
        t_end, n = time.monotonic() + seconds, 0
        while time.monotonic() < t_end:
            data = self.mutate(rng.choice(corpus), 2 * len(self.seed), rng.getrandbits(32))
            n += 1
            try:
                self.one(data)
            except Exception:
                path = os.path.join(artifacts, f"crash-{self.name}-{seed}-{n}")
                with open(path, "wb") as f:
                    f.write(data)
                traceback.print_exc()
                print(f"fuzz: CRASH after {n} inputs, input written to {path}", flush=True)
                return 1
            if len(corpus) < 64 and rng.random() < 0.01:
                corpus.append(data)
        print(f"fuzz: OK {self.name}, {n} inputs, no crash", flush=True)
        return 0

    def run_atheris(self, seconds, seed, artifacts):
        import atheris

        # atheris.Mutate is rebound when Fuzz() starts: look it up at each call.
        self.byte_mutate = lambda data, max_size: atheris.Mutate(data, max_size)
        corpus = os.path.join(self.tmpdir, "corpus")
        os.makedirs(corpus)
        with open(os.path.join(corpus, "seed"), "wb") as f:
            f.write(self.seed)
        self.one(self.seed)  # the seed itself must pass
        args = [sys.argv[0], f"-max_total_time={max(1, int(seconds))}", f"-seed={seed}",
                f"-artifact_prefix={artifacts}{os.sep}crash-{self.name}-", f"-max_len={2 * len(self.seed)}",
                "-timeout=30", "-rss_limit_mb=6144", "-print_final_stats=1", corpus]
        atheris.Setup(args, lambda data: self.one(bytes(data)), custom_mutator=self.mutate)
        try:
            atheris.Fuzz()  # exits the process at -max_total_time (0) or on a crash (non-zero)
        except SystemExit as e:
            if e.code in (0, None):
                print(f"fuzz: OK {self.name}, no crash", flush=True)
            raise
        return 0


def _remove_stale_workdirs(artifacts, name):
    prefix = f".work-{name}-"
    for d in os.listdir(artifacts):
        if d.startswith(prefix) and d[len(prefix):].isdigit():
            try:
                os.kill(int(d[len(prefix):]), 0)
                continue  # that run is still going
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            shutil.rmtree(os.path.join(artifacts, d), ignore_errors=True)


def instrument(modules):
    """Coverage instrumentation for atheris, called after the readers are
    imported: every loaded Python function of the named modules.
    (instrument_imports() records no coverage for intdet, which the editable
    install loads through scikit-build-core's own loader; instrument_all()
    takes ~30 s on numpy and friends.) A no-op without atheris."""
    try:
        import atheris
    except ImportError:
        return
    import gc
    import types

    modules, n = set(modules), 0
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and getattr(obj, "__module__", None) in modules:
            try:
                atheris.instrument_func(obj)
                n += 1
            except Exception as e:  # a function atheris cannot patch: fuzz without its coverage
                print(f"fuzz: not instrumented {obj.__module__}.{obj.__qualname__}: {e}", file=sys.stderr)
    print(f"fuzz: instrumented {n} functions", file=sys.stderr, flush=True)
