"""Every _core.ops binding checks its arguments' ranks and shapes and raises
ValueError naming the op and the array, instead of reading past a buffer
(round_shift with 8 values and 1 shift, swiglu with 8 and 2, ...)."""

import numpy as np
import pytest

from intdet import _core

C = _core.ops
I64 = np.int64


def i64(*shape):
    return np.ones(shape, I64)


def i16(*shape):
    return np.ones(shape, np.int16)


def i32(*shape):
    return np.ones(shape, np.int32)


def i8(*shape):
    return np.ones(shape, np.int8)


def u8(*shape):
    return np.ones(shape, np.uint8)


# (op, args, words the message must hold)
BAD = {
    "round_shift_short_s": ("round_shift", (i64(8), i64(1)), ["round_shift", "x and s", "(8,)", "(1,)"]),
    "round_shift_long_s": ("round_shift", (i64(2), i64(9)), ["round_shift", "same shape"]),
    "round_shift_rank": ("round_shift", (i64(2, 4), i64(8)), ["round_shift", "(2, 4)", "(8,)"]),
    "shift_round_sat32": ("shift_round_sat32", (i64(8), i64(1)), ["shift_round_sat32", "x and s"]),
    "round_div_short_b": ("round_div", (i64(8), i64(1)), ["round_div", "a and b"]),
    "round_div_zero": ("round_div", (i64(3), np.array([1, 0, 2], I64)), ["round_div", "positive"]),
    "round_div_negative": ("round_div", (i64(1), np.array([-3], I64)), ["round_div", "positive"]),
    "floor_div_recip_short_b": ("floor_div_recip", (i64(8), i64(1)), ["floor_div_recip", "a and b"]),
    "floor_div_recip_zero": ("floor_div_recip", (i64(2), np.array([1, 0], I64)), ["floor_div_recip", "positive"]),
    "round_div_recip_negative": ("round_div_recip", (i64(1), np.array([-3], I64)), ["round_div_recip", "positive"]),
    "recip_u64_zero": ("recip_u64", (np.array([5, 0], np.uint64),), ["recip_u64", "positive"]),
    "isqrt_negative": ("isqrt", (np.array([4, -1], I64),), ["isqrt", "negative"]),
    "bitlen_negative": ("bitlen", (np.array([-5], I64),), ["bitlen", "negative"]),
    "exp2_negative": ("exp2_neg_q30", (np.array([-1], I64),), ["exp2_neg_q30", "negative"]),
    "swiglu_short_u": ("swiglu", (i64(8), i64(2)), ["swiglu", "g and u", "(8,)", "(2,)"]),
    "add_sat32_short_d": ("add_sat32", (i64(8), i64(2)), ["add_sat32", "x and d", "(8,)", "(2,)"]),
    "add_sat32_huge": ("add_sat32", (i64(3), np.array([0, 2**62, 0], I64)), ["add_sat32", "2^62"]),
    "add_sat32_int64_min": ("add_sat32", (np.array([-(2**63)], I64), i64(1)), ["add_sat32", "2^62"]),
    "swiglu_long_u": ("swiglu", (i64(2), i64(8)), ["swiglu", "g and u"]),
    "geglu_short_u": ("geglu", (i64(8), i64(2)), ["geglu", "g and u", "(8,)", "(2,)"]),
    "geglu_long_u": ("geglu", (i64(2), i64(8)), ["geglu", "g and u"]),
    "rms_norm_short_g": ("rms_norm", (i64(3, 8), i16(4), 0, 16), ["rms_norm", "g", "(8,)", "(4,)"]),
    "rms_norm_scalar": ("rms_norm", (np.array(5, I64), i16(1), 0, 16), ["rms_norm", "scalar"]),
    "rms_norm_too_long": ("rms_norm", (i64(1, 8193), i16(8193), 0, 16), ["rms_norm", "8192"]),
    "quant16_scalar": ("quant16", (np.array(5, I64),), ["quant16", "scalar"]),
    "quant8_scalar": ("quant8_row", (np.array(5, I64),), ["quant8_row", "scalar"]),
    "softmax_scalar": ("softmax_q16", (np.array(5, I64),), ["softmax_q16", "scalar"]),
    "rope_rank": ("rope", (i64(2, 8), i16(2, 4), i16(2, 4)), ["rope", "x", "3 dimensions"]),
    "rope_odd_d": ("rope", (i64(2, 1, 7), i16(2, 3), i16(2, 3)), ["rope", "even"]),
    "rope_short_cos": ("rope", (i64(4, 2, 8), i16(1, 4), i16(4, 4)), ["rope", "cos", "(4, 4)", "(1, 4)"]),
    "rope_short_sin": ("rope", (i64(4, 2, 8), i16(4, 4), i16(4, 2)), ["rope", "sin"]),
    "rope_huge_x": ("rope", (np.array([[[0, 2**47, 0, 0]]], I64), i16(1, 2), i16(1, 2)), ["rope", "x", "2^47"]),
    "rope_int64_min": ("rope", (np.array([[[-(2**63), 0]]], I64), i16(1, 1), i16(1, 1)), ["rope", "2^47"]),
    "quant8_past_int32": ("quant8_row", (np.array([[5, 2**31]], I64),), ["quant8_row", "int32", "2^31 - 1"]),
    "quant8_int64_min": ("quant8_row", (np.array([[-(2**63), 5]], I64),), ["quant8_row", "int32"]),
    "linear_k": ("linear", (i16(2, 8), i32(2), i8(3, 7), i32(3), i32(3)), ["linear", "w", "(3, 8)"]),
    "linear_short_e": ("linear", (i16(5, 8), i32(1), i8(3, 8), i32(3), i32(3)), ["linear", "e", "(5,)"]),
    "linear_short_mant": ("linear", (i16(2, 8), i32(2), i8(3, 8), i32(1), i32(3)), ["linear", "mant", "(3,)"]),
    "linear_short_shift": ("linear", (i16(2, 8), i32(2), i8(3, 8), i32(3), i32(2)), ["linear", "shift"]),
    "linear_q_rank": ("linear", (i16(8), i32(1), i8(3, 8), i32(3), i32(3)), ["linear", "q", "2 dimensions"]),
    "linear_w_rank": ("linear", (i16(2, 8), i32(2), i8(24), i32(3), i32(3)), ["linear", "w", "2 dimensions"]),
    "linear_empty": ("linear", (i16(2, 0), i32(2), i8(3, 0), i32(3), i32(3)), ["linear", "empty"]),
    "packed_rows_rank": ("packed_rows", (i8(24),), ["packed_rows", "w", "2 dimensions"]),
    "packed_rows_empty": ("packed_rows", (i8(0, 4),), ["packed_rows", "empty"]),
    "linear_w4_k": ("linear_w4", (i16(2, 48), i32(2), u8(3, 24), i16(3, 1), i16(3, 1), i32(3), i32(3)),
                    ["linear_w4", "multiple of 32"]),
    "linear_w4_short_e": ("linear_w4", (i16(2, 64), i32(1), u8(3, 32), i16(3, 2), i16(3, 2), i32(3), i32(3)),
                          ["linear_w4", "e", "(2,)"]),
    "linear_w4_short_gm": ("linear_w4", (i16(2, 64), i32(2), u8(3, 32), i16(3, 2), i16(3, 1), i32(3), i32(3)),
                           ["linear_w4", "gm", "(3, 2)"]),
    "linear_w4_short_mant": ("linear_w4", (i16(2, 64), i32(2), u8(3, 32), i16(3, 2), i16(3, 2), i32(2), i32(3)),
                             ["linear_w4", "mant"]),
    "linear_w4_short_shift": ("linear_w4", (i16(2, 64), i32(2), u8(3, 32), i16(3, 2), i16(3, 2), i32(3), i32(1)),
                              ["linear_w4", "shift"]),
    "linear_w4_gd_rank": ("linear_w4", (i16(2, 64), i32(2), u8(3, 32), i16(6), i16(3, 2), i32(3), i32(3)),
                          ["linear_w4", "gd"]),
    "attend_q": ("attend", (i16(8), 0, i8(5, 16), i32(5), i8(5, 16), i32(5), 1 << 14, 30), ["attend", "q", "(16,)"]),
    "attend_q_2d": ("attend", (i16(2, 8), 0, i8(5, 16), i32(5), i8(5, 16), i32(5), 1 << 14, 30), ["attend", "q"]),
    "attend_vc": ("attend", (i16(16), 0, i8(5, 16), i32(5), i8(4, 16), i32(5), 1 << 14, 30), ["attend", "vc"]),
    "attend_ka": ("attend", (i16(16), 0, i8(5, 16), i32(2), i8(5, 16), i32(5), 1 << 14, 30), ["attend", "ka"]),
    "attend_va": ("attend", (i16(16), 0, i8(5, 16), i32(5), i8(5, 16), i32(9), 1 << 14, 30), ["attend", "va"]),
    "attend_empty_d": ("attend", (i16(0), 0, i8(5, 0), i32(5), i8(5, 0), i32(5), 1 << 14, 30), ["attend", "empty"]),
    "attend_big_d": ("attend", (i16(272), 0, i8(1, 272), i32(1), i8(1, 272), i32(1), 1 << 14, 30), ["attend", "256"]),
    "attend_rows_q_rank": ("attend_rows", (i64(2, 16), i8(5, 1, 16), i32(5, 1), i8(5, 1, 16), i32(5, 1), i64(2),
                                           1 << 14, 30, 0), ["attend_rows", "q"]),
    "attend_rows_heads": ("attend_rows", (i64(2, 3, 16), i8(5, 2, 16), i32(5, 2), i8(5, 2, 16), i32(5, 2), i64(2),
                                          1 << 14, 30, 0), ["attend_rows", "multiple"]),
    "attend_rows_va": ("attend_rows", (i64(2, 2, 16), i8(5, 1, 16), i32(5, 1), i8(5, 1, 16), i32(4, 1), i64(2),
                                       1 << 14, 30, 0), ["attend_rows", "va"]),
    "attn_row_passes_va": ("attn_row_passes", (i64(4), 1, i32(3), 0), ["attn_row_passes", "va"]),
    "attn_row_passes_rr": ("attn_row_passes", (i64(4), 0, i32(4), 0), ["attn_row_passes", "rr"]),
    "attend_rows_pos": ("attend_rows", (i64(2, 2, 16), i8(5, 1, 16), i32(5, 1), i8(5, 1, 16), i32(5, 1),
                                        np.array([0, 5], np.int64), 1 << 14, 30, 0), ["attend_rows", "pos"]),
    "attend_rows_window": ("attend_rows", (i64(2, 2, 16), i8(5, 1, 16), i32(5, 1), i8(5, 1, 16), i32(5, 1), i64(2),
                                           1 << 14, 30, -1), ["attend_rows", "window"]),
    "softcap_cap_zero": ("softcap", (i64(4), 0, 1 << 20, 30), ["softcap", "cap"]),
    "softcap_shift": ("softcap", (i64(4), 5, 1 << 20, 63), ["softcap", "inv_shift"]),
    "softcap_past_int32": ("softcap", (np.array([0, 2**31], I64), 5, 1 << 20, 30), ["softcap", "int32"]),
    "attend_kc_rank": ("attend", (i16(16), 0, i8(80), i32(5), i8(5, 16), i32(5), 1 << 14, 30), ["attend", "kc"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_raise_value_error(case):
    op, args, words = BAD[case]
    with pytest.raises(ValueError) as info:
        getattr(C, op)(*args)
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_every_op_has_a_bad_argument_case():
    ops = {name for name in dir(C) if not name.startswith("_")}
    assert ops == {op for op, _, _ in BAD.values()}


# The same ops with well-formed arguments still run (the checks refuse only
# what the kernels cannot take).
GOOD = [
    ("round_shift", (i64(8), i64(8))),
    ("round_div", (i64(2, 3), i64(2, 3))),
    ("floor_div_recip", (i64(2, 3), i64(2, 3))),
    ("round_div_recip", (i64(2, 3), i64(2, 3))),
    ("recip_u64", (np.ones((2, 3), np.uint64),)),
    ("rms_norm", (i64(3, 8), i16(8), 0, 16)),
    ("swiglu", (i64(2, 4), i64(2, 4))),
    ("add_sat32", (i64(2, 4), i64(2, 4))),
    ("geglu", (i64(2, 4), i64(2, 4))),
    ("rope", (i64(4, 2, 8), i16(4, 4), i16(4, 4))),
    ("linear", (i16(2, 8), i32(2), i8(3, 8), i32(3), i32(3))),
    ("linear_w4", (i16(2, 64), i32(2), u8(3, 32), i16(3, 2), i16(3, 2), i32(3), i32(3))),
    ("attend", (i16(16), 0, i8(5, 16), i32(5), i8(5, 16), i32(5), 1 << 14, 30)),
    ("attend_rows", (i64(2, 2, 16), i8(5, 1, 16), i32(5, 1), i8(5, 1, 16), i32(5, 1), np.array([3, 4], np.int64),
                     1 << 14, 30, 0)),
    ("softcap", (i64(2, 4), 5, 1 << 20, 30)),
    ("softmax_q16", (i64(2, 0),)),  # empty rows: nothing to read
]


@pytest.mark.parametrize("op,args", GOOD, ids=[g[0] for g in GOOD])
def test_good_arguments_run(op, args):
    getattr(C, op)(*args)
