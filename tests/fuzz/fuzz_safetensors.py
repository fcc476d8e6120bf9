"""Fuzz intdet's checked safetensors reader: SafetensorsFile(path), then
info() and get() of every tensor, on mutated bytes of a small valid file.
IntdetError is the only accepted failure. See harness.py for the options;
scripts/fuzz.sh runs it for longer, tests/convert/test_fuzz_smoke.py for ~20 s."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import seeds  # noqa: E402

from intdet.safetensors_io import SafetensorsFile  # noqa: E402

DTYPE_CHOICES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "U64", "", "f32",
                 7, None, ["F32"], {"a": 1}]


def target(path):
    st = SafetensorsFile(path)
    for name in st.names():
        st.info(name)
        a = st.get(name)
        a.tobytes()  # touch every byte of the view


def structure(data: bytes, rng):
    """Change one thing in the JSON header, keep the length field right
    (mostly) and the data bytes as they were."""
    (n,) = struct.unpack_from("<Q", data, 0)
    header, rest = json.loads(data[8:8 + n]), data[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    op = rng.randrange(12)
    name = rng.choice(names) if names else "x"
    ent = header.get(name) if isinstance(header.get(name), dict) else {}
    v = rng.choice(harness.INTERESTING + [-1, -(2**63), len(rest), len(rest) + 1, 1.5, "3", None, True])
    if op == 0:
        ent["dtype"] = rng.choice(DTYPE_CHOICES)
    elif op == 1 and isinstance(ent.get("shape"), list):
        s = ent["shape"]
        if s and rng.random() < 0.7:
            s[rng.randrange(len(s))] = v
        else:
            s.append(v)
    elif op == 2 and isinstance(ent.get("data_offsets"), list) and ent["data_offsets"]:
        ent["data_offsets"][rng.randrange(len(ent["data_offsets"]))] = v
    elif op == 3 and names:
        other = header[rng.choice(names)]
        if isinstance(other, dict) and "data_offsets" in other:
            ent["data_offsets"] = list(other["data_offsets"])
    elif op == 4:
        ent.pop(rng.choice(["dtype", "shape", "data_offsets"]), None)
    elif op == 5:
        header[name] = rng.choice([None, 1, "x", [], [1, 2], {"dtype": "F32"}])
    elif op == 6:
        header["__metadata__"] = rng.choice([None, 1, "x", [], {"format": 1}, {"a": {"b": []}}])
    elif op == 7:
        ent["shape"] = rng.choice([[], [0], [2**40], [2**39, 2**39], "3", None, [[1]], [1.0], [True, 3]])
    elif op == 8:
        ent["data_offsets"] = rng.choice([[], [0], [1, 2, 3], [0, 2**64], [2**64, 0], None, "0,4", [0.0, 4.0]])
    elif op == 9:
        header = rng.choice([[], 1, "x", None, {"__metadata__": {}}])
    elif op == 10:
        header[name + "2"] = dict(ent)
    else:
        hb = json.dumps(header).encode()
        return struct.pack("<Q", interesting_len(rng, len(hb), len(data))) + hb + rest
    hb = json.dumps(header).encode()
    if rng.random() < 0.5:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + rest


def interesting_len(rng, n, size):
    return rng.choice([n - 1, n + 1, n + 8, size, size - 7, 2**63, 2**64 - 1, 0, 1])


def main():
    tmp = tempfile.mkdtemp()
    try:
        with open(seeds.write_safetensors_seed(os.path.join(tmp, "seed.safetensors")), "rb") as f:
            seed = f.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    (hlen,) = struct.unpack_from("<Q", seed, 0)
    harness.instrument(["intdet.safetensors_io"])
    return harness.Fuzzer("safetensors", target, seed, 8 + hlen, structure).run()


if __name__ == "__main__":
    sys.exit(main())
