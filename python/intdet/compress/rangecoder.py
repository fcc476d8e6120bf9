"""The range coder of ``intdet compress``: the readable spec, in Python ints.

A carry-propagating byte-wise range coder (G. N. N. Martin 1979, "Range
encoding"; the carry handling with a cached byte and a count of pending 0xFF
bytes is Subbotin's / LZMA's) with a 48-bit window:

* state: ``low`` (48 bits plus a carry bit), ``range`` in [2^40, 2^48) between
  symbols (2^48 - 1 at the start), ``cache`` (the last byte not yet written,
  0 at the start) and ``pending`` (0xFF bytes after it, waiting for a carry).
* encode(cum, freq, P): r = range >> P; low += r * cum; range = r * freq; while
  range < 2^40: range <<= 8, shift_low().
* shift_low: if low < 0xFF * 2^40 or low >= 2^48 (the byte below is settled):
  write cache + carry, then ``pending`` bytes (0xFF + carry) mod 256, and
  cache = bits 40..47 of low; else pending += 1. Then low = (low mod 2^40) * 2^8.
* finish: low rounded up to a multiple of 2^40 (still inside the interval,
  as range >= 2^40), shift_low twice; trailing zero bytes are dropped.
* the first byte written is always 0 (the interval never leaves [0, 2^48))
  and is not stored.

The decoder mirrors it: code = the first 6 stored bytes (big-endian), reading
0 past the end; target = code // r must be < 2^P (else the data is not a
stream of this coder); the symbol s is the one with cum_s <= target <
cum_s + f_s; code -= r * cum_s; range = r * f_s; renormalize by bytes.

The C++ twin (csrc/compress/range_coder.h, ``intdet._core.compress``) must
write the same bytes (tests/compress/test_compress_coder.py).
"""

from __future__ import annotations

import numpy as np

WINDOW_BITS = 48
MASK = (1 << WINDOW_BITS) - 1
TOP = 1 << (WINDOW_BITS - 8)


class CorruptStream(ValueError):
    """The bytes cannot come from this coder with these tables."""


class RangeEncoder:
    def __init__(self):
        self.low, self.range, self.cache, self.pending = 0, MASK, 0, 0
        self.first = True
        self.out = bytearray()

    def encode(self, cum: int, freq: int, precision: int) -> None:
        """Code the slot [cum, cum + freq) of a total 2^precision (freq >= 1)."""
        r = self.range >> precision
        self.low += r * cum
        self.range = r * freq
        while self.range < TOP:
            self.range <<= 8
            self._shift_low()

    def _emit(self, b: int) -> None:
        if self.first:  # always 0: not stored
            self.first = False
        else:
            self.out.append(b)

    def _shift_low(self) -> None:
        if self.low < (0xFF << (WINDOW_BITS - 8)) or self.low > MASK:
            carry = self.low >> WINDOW_BITS
            self._emit((self.cache + carry) & 0xFF)
            for _ in range(self.pending):
                self._emit((0xFF + carry) & 0xFF)
            self.pending = 0
            self.cache = (self.low >> (WINDOW_BITS - 8)) & 0xFF
        else:
            self.pending += 1
        self.low = (self.low & (TOP - 1)) << 8

    def finish(self) -> bytes:
        self.low = (self.low + TOP - 1) & ~(TOP - 1)
        self._shift_low()
        self._shift_low()
        return bytes(self.out).rstrip(b"\0")


class RangeDecoder:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0
        self.range, self.code = MASK, 0
        for _ in range(WINDOW_BITS // 8):
            self.code = (self.code << 8) | self._next()

    def _next(self) -> int:
        if self.pos < len(self.data):
            self.pos += 1
            return self.data[self.pos - 1]
        return 0

    def decode(self, freqs, precision: int) -> int:
        """The next symbol under frequencies ``freqs`` (ints >= 1 summing to
        2^precision). Raises CorruptStream for impossible data."""
        r = self.range >> precision
        target = self.code // r
        if target >> precision:
            raise CorruptStream("range-coded data is corrupt")
        cum = np.cumsum(np.asarray(freqs, dtype=np.int64))
        s = int(np.searchsorted(cum, target, side="right"))
        lo = int(cum[s - 1]) if s else 0
        self.code -= r * lo
        self.range = r * int(freqs[s])
        while self.range < TOP:
            self.code = (self.code << 8) | self._next()
            self.range <<= 8
        return s
