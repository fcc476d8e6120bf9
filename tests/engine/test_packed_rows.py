"""The embedding of a tied model reads its rows from the output head's
packed copy (W8Packer::row), so the file's pages of tok_embd stay out of
memory: every row read back from a packed weight equals the source row, for
sizes that are not multiples of the layout's channel group or input pair,
under every kernel set this CPU runs."""

import numpy as np
import pytest

from intdet import _core

from conftest import ISAS, using_isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,k", [(1, 1), (7, 3), (8, 2), (13, 17), (37, 640), (4099, 5)])
def test_packed_rows_read_back_the_source(isa, n, k):
    w = np.random.default_rng(n * 1000 + k).integers(-128, 128, (n, k), dtype=np.int8)
    with using_isa(isa, 1):
        got = _core.ops.packed_rows(w)
    if got is None:  # a row-major kernel set: nothing packed, rows read from w itself
        pytest.skip(f"{isa} reads row-major weights")
    assert got.dtype == np.int8 and np.array_equal(got, w)


def test_packed_rows_refuses_an_empty_weight():
    with pytest.raises(ValueError, match="packed_rows"):
        _core.ops.packed_rows(np.zeros((0, 4), np.int8))
