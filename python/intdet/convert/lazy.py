"""Source tensors read on demand, a block of rows at a time.

A checkpoint of 8B parameters is 32 GB as float32: more than the machines
intdet runs on. A ``LazyTensor`` stands for one float32 source tensor
without holding it: ``shape`` is known from the file's header, and
``rows(lo, hi)`` reads rows lo..hi of its 2-D view (all axes but the last
flattened: an expert tensor [E, N, K] has E * N rows of K) from the memory
map of the file, converting only those to float32. The quantizer
(quantize.py) walks each tensor in row blocks, so peak memory is a few
blocks, whatever the model's size.

The architecture modules' fix-ups (models/) keep their numpy spelling and
stay lazy: a slice or an index array on the first axis (``w[:qd]``,
``w[perm]``), a slice on the second axis of a 3-D tensor (``w[:, :F]``),
elementwise arithmetic with a scalar (``w + 1.0``, ``w * m``, ``w / s``) and
``astype(float32)`` give new LazyTensors; ``stack`` joins tensors along a
new first axis. Anything else materialises the whole tensor through
``__array__`` (``np.asarray(t)``), which is correct and costs its memory.

Every block read is checked for NaN/Inf (IntdetError naming the tensor and
the file), so a bad value is reported wherever the conversion meets it.
"""

from __future__ import annotations

import numpy as np

from ..errors import IntdetError


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class LazyTensor:
    """float32 tensor of ``shape`` whose rows come from ``read(lo, hi)``
    (float32 [hi - lo, shape[-1]], rows of the 2-D view). ``name`` and
    ``where`` (the file) name it in errors."""

    dtype = np.dtype(np.float32)

    def __init__(self, shape, read, name: str = "", where: str = "", release=None):
        self.shape = tuple(int(d) for d in shape)
        self._read = read
        self.name, self.where = name, where
        self._release = release

    def release(self) -> None:
        """Drop the source pages this tensor was read from (a hint: a later
        read maps them back in)."""
        if self._release is not None:
            self._release()

    # --------------------------------------------------------- reading

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return _count(self.shape)

    @property
    def nrows(self) -> int:
        """Rows of the 2-D view (1 for a vector)."""
        return _count(self.shape[:-1]) if self.shape else 1

    @property
    def ncols(self) -> int:
        return self.shape[-1] if self.shape else 1

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """float32 [hi - lo, ncols]: rows lo..hi of the 2-D view, checked
        finite. IntdetError for NaN or Inf."""
        w = np.asarray(self._read(lo, hi), dtype=np.float32).reshape(hi - lo, self.ncols)
        if not np.isfinite(w).all():
            raise IntdetError(f"{self.where}: tensor '{self.name}' holds NaN or Inf values")
        return w

    def numpy(self) -> np.ndarray:
        """The whole tensor, float32 of ``shape`` (its full memory)."""
        return self.rows(0, self.nrows).reshape(self.shape)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"LazyTensor({self.name!r}, shape={self.shape})"

    # ------------------------------------------------ lazy numpy spelling

    @property
    def T(self):
        return self.numpy().T

    def _derive(self, shape, read):
        return LazyTensor(shape, read, self.name, self.where, self._release)

    def astype(self, dtype, copy=True):
        if np.dtype(dtype) == np.float32:
            return self
        return self.numpy().astype(dtype)

    def _elementwise(self, fn):
        return self._derive(self.shape, lambda lo, hi: fn(self.rows(lo, hi)))

    def __add__(self, c):
        return self._elementwise(lambda w: w + c) if np.isscalar(c) else self.numpy() + c

    def __sub__(self, c):
        return self._elementwise(lambda w: w - c) if np.isscalar(c) else self.numpy() - c

    def __mul__(self, c):
        return self._elementwise(lambda w: w * c) if np.isscalar(c) else self.numpy() * c

    def __truediv__(self, c):
        return self._elementwise(lambda w: w / c) if np.isscalar(c) else self.numpy() / c

    __radd__, __rmul__ = __add__, __mul__

    def __getitem__(self, key):
        if isinstance(key, slice) and self.ndim >= 1:
            return self._select_first(np.arange(self.shape[0])[key])
        if isinstance(key, np.ndarray) and key.ndim == 1 and key.dtype.kind in "iu" and self.ndim >= 1:
            if key.size and (key.min() < 0 or key.max() >= self.shape[0]):
                raise IndexError(f"index out of range for {self.name} of {self.shape[0]} rows")
            return self._select_first(key.astype(np.int64))
        if (isinstance(key, tuple) and len(key) == 2 and key[0] == slice(None) and isinstance(key[1], slice)
                and self.ndim == 3):
            E, N, K = self.shape
            pick = np.arange(N)[key[1]]
            rowmap = (np.arange(E)[:, None] * N + pick[None, :]).reshape(-1)
            return self._gather((E, pick.size, K), rowmap)
        return self.numpy()[key]

    def _select_first(self, idx: np.ndarray):
        """Entries idx of the first axis (each is nrows / shape[0] rows)."""
        per = self.nrows // self.shape[0] if self.shape[0] else 1
        rowmap = (idx[:, None] * per + np.arange(per)[None, :]).reshape(-1)
        return self._gather((idx.size,) + self.shape[1:], rowmap)

    def _gather(self, shape, rowmap: np.ndarray):
        """A tensor of ``shape`` whose 2-D row r is this tensor's row rowmap[r]."""
        rowmap = np.asarray(rowmap, dtype=np.int64)

        def read(lo, hi):
            idx = rowmap[lo:hi]
            if idx.size == 0:
                return np.zeros((0, self.ncols), np.float32)
            a, b = int(idx.min()), int(idx.max()) + 1
            if b - a == idx.size and np.array_equal(idx, np.arange(a, b)):
                return self.rows(a, b)
            return self.rows(a, b)[idx - a]  # the maps here (un-permutes, splits) stay within a few rows' span

        return self._derive(shape, read)


def stack(tensors: list) -> "LazyTensor | np.ndarray":
    """np.stack of equal-shaped tensors along a new first axis; lazy if any
    input is a LazyTensor (rows of part e come from tensor e)."""
    if not any(isinstance(t, LazyTensor) for t in tensors):
        return np.stack(tensors)
    shape = tuple(tensors[0].shape)
    for t in tensors:
        if tuple(t.shape) != shape:
            raise IntdetError(f"cannot stack tensors of shapes {shape} and {tuple(t.shape)}")
    parts = [t if isinstance(t, LazyTensor) else from_array(t) for t in tensors]
    per = parts[0].nrows
    first = parts[0]

    def read(lo, hi):
        out = []
        r = lo
        while r < hi:
            e, off = divmod(r, per)
            n = min(hi - r, per - off)
            out.append(parts[e].rows(off, off + n))
            r += n
        return np.concatenate(out) if len(out) != 1 else out[0]

    def release():
        for t in parts:
            t.release()

    return LazyTensor((len(parts),) + shape, read, first.name, first.where, release)


def from_array(a: np.ndarray, name: str = "", where: str = "") -> LazyTensor:
    """A LazyTensor over an array already in memory."""
    a = np.asarray(a)
    K = a.shape[-1] if a.ndim else 1
    flat = a.reshape(-1, K)
    return LazyTensor(a.shape, lambda lo, hi: flat[lo:hi], name, where)


def row_blocks(nrows: int, ncols: int, max_elems: int):
    """(lo, hi) row ranges covering nrows rows, each at most max_elems
    elements (at least one row)."""
    step = max(1, max_elems // max(1, ncols))
    for lo in range(0, nrows, step):
        yield lo, min(nrows, lo + step)


def rows_of(t, lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi of the 2-D view of a LazyTensor or an array (float32)."""
    if isinstance(t, LazyTensor):
        return t.rows(lo, hi)
    a = np.asarray(t, dtype=np.float32)
    return a.reshape(-1, a.shape[-1] if a.ndim else 1)[lo:hi]


def nrows_of(t) -> int:
    shape = tuple(t.shape)
    return _count(shape[:-1]) if shape else 1

