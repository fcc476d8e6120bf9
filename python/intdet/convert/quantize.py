"""Float model -> intdet integer model: the only place where float meets the
integer spec.

Reproducibility: every float step here is a correctly rounded IEEE-754
operation on float64 (multiply, divide, sqrt, rint, frexp, max) applied
element by element, with no sums, no BLAS and no libm transcendental
function, so two machines produce byte-identical files.

Formats produced (see docs/format.md):
- linear weights int8 [N, K], symmetric per output channel:
  q = rint(w / s), s = max|w_row| / 127; or, with ``weights="int4"``, 4-bit
  codes on a per-group (32 inputs) integer grid (quant_rows_int4);
- per-channel dyadic output scales ``mant`` int32 (< 2^15), ``shift`` int32:
  c_in * s * 2^F_out ~= mant * 2^-shift;
- RMSNorm gammas int16: round(gamma * 2^G), max |g| in [2^13, 2^14);
- RoPE tables int16 Q14 (rope_tables.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import IntdetError
from ..format import FORMAT_VERSION, W4_GROUP, W4_MAX, WEIGHT_FORMATS
from ..ref.ops import NORM_OUT_FRAC, PROB_FRAC
from ..models.rope_scaling import attention_factor
from .lazy import row_blocks, rows_of
from .rope_tables import rope_tables
from ..background import resolve_source

RESIDUAL_FRAC = 16  # residual stream int32 Q16
PROJ_FRAC = 16  # q/k/v/gate/up/o/down outputs int32 Q16
LOGIT_FRAC = 16  # logits int32 Q16
LOG2E = 1.4426950408889634  # float64 nearest to log2(e)


def dyadic(c: float):
    """Positive float64 c -> (mant, shift) with c ~= mant * 2^-shift and
    2^14 <= mant <= 2^15 (relative error <= 2^-15). c == 0 -> (0, 0)."""
    if c == 0.0:
        return 0, 0
    if not (c > 0.0 and math.isfinite(c)):
        raise IntdetError(f"internal: dyadic scale {c!r} is not a positive finite number")
    m, e = math.frexp(c)  # c = m * 2^e, m in [0.5, 1): exact
    mant = int(np.rint(m * 32768.0))
    return mant, 15 - e


def softcap_constants(c: float, k: float, what: str):
    """Soft-capping c * tanh(X / c) of a value held as x = X * k
    (ref/intmath.py softcap) -> (cap, inv_mant, inv_shift): cap = round(c k)
    and inv_mant / 2^inv_shift ~= 2 log2(e) 2^16 / (c k) with inv_mant in
    [2^30, 2^31). IntdetError naming ``what`` if c k is not in [1, 2^31)."""
    ck = float(c) * k
    if not (math.isfinite(ck) and 1.0 <= ck < 2.0**31 - 1):
        raise IntdetError(f"{what} = {c!r}: soft-capping needs a cap c with c * {k:g} in [1, 2^31)")
    v = 2.0 * LOG2E * 2.0**16 / ck
    m, e = math.frexp(v)  # v = m 2^e, m in [0.5, 1)
    mant, shift = int(np.rint(m * 2.0**31)), 31 - e
    if mant == 2**31:
        mant, shift = 2**30, shift - 1
    if not 5 <= shift <= 62:
        raise IntdetError(f"{what} = {c!r}: soft-capping cap outside the supported range")
    return int(np.rint(ck)), mant, shift


def dyadic_vec(c: np.ndarray):
    """Vector form of ``dyadic``: float64 [N] -> int32 mant [N], int32 shift [N]."""
    c = np.asarray(c, dtype=np.float64)
    m, e = np.frexp(c)
    mant = np.rint(m * 32768.0).astype(np.int64)
    shift = (15 - e).astype(np.int64)
    zero = c == 0.0
    mant[zero] = 0
    shift[zero] = 0
    return mant.astype(np.int32), shift.astype(np.int32)


def quant_rows_int8(w: np.ndarray):
    """Symmetric per-row int8: returns (q int8 [N, K], s float64 [N]) with
    w ~= q * s[:, None], q = rint(w / s) in float64, s = max|w_row| / 127;
    an all-zero row gets s = 0. (One float64 buffer, divided, rounded and
    narrowed in place: the values of the plain numpy expression.)"""
    w = np.asarray(w)
    if w.dtype not in (np.float32, np.float64):
        w = w.astype(np.float64)
    # max |w| from max and -min: exact in the input's precision, as abs then max is
    amax = np.maximum(w.max(axis=1, initial=-np.inf), -w.min(axis=1, initial=np.inf)).astype(np.float64)
    amax[~np.isfinite(amax)] = 0.0  # an empty row (K = 0)
    s = amax / 127.0
    safe = np.where(s > 0, s, 1.0)
    buf = w.astype(np.float64)  # a copy: the caller's array is left as it was
    np.divide(buf, safe[:, None], out=buf)
    np.rint(buf, out=buf)
    # |w| <= amax and s = fl(amax / 127) give |w / s| < 127.5, so rint stays in [-127, 127]; only a
    # subnormal s (its relative error unbounded) could leave the range: clip those rows' values
    if np.any((s > 0) & (s < 2.0**-1000)):
        np.clip(buf, -127, 127, out=buf)
    return buf.astype(np.int8), s


def quant_rows_int4(w: np.ndarray):
    """Per-group asymmetric int4 on an integer grid under a per-row scale.

    w: float [N, K] with K % 32 == 0. Every group of 32 inputs of a row gets
    an integer step ``gd >= 0`` and offset ``gm`` (int16) so that the
    effective integer weight is ``w_eff = gd * u + gm`` for a code u in
    0..15, with |w_eff| <= 2047 (12-bit weights: exact int32 dot blocks of 32
    inputs against int16 activations). Like GGUF Q4_1 (min and step per block
    of 32), so a Q4_1 source keeps its codes; the integer step and offset add
    at most 8 units of 2047 per weight.
    Returns (w4 uint8 [N, K/2]: code of input 2i in the low nibble of byte i,
    2i+1 in the high nibble; gd int16 [N, K/32]; gm int16 [N, K/32];
    s float64 [N]) with w ~= w_eff * s[:, None]. Elementwise float64 only
    (min, max, divide, rint), so reproducible.
    """
    w = np.asarray(w, dtype=np.float64)
    N, K = w.shape
    if K % W4_GROUP:
        raise IntdetError(f"int4 weights need input sizes that are multiples of {W4_GROUP} (got {K})")
    g = w.reshape(N, K // W4_GROUP, W4_GROUP)
    lo, hi = g.min(axis=2), g.max(axis=2)  # [N, G]; min/max are exact in any order
    amax = np.maximum(np.abs(lo), np.abs(hi)).max(axis=1)
    # 2039, not 2047: rounding gm and gd moves gm + 15 gd by at most 0.5 + 7.5.
    s = amax / (W4_MAX - 8)
    safe = np.where(s > 0, s, 1.0)[:, None]
    gm = np.rint(lo / safe)
    gd = np.rint((hi - lo) / 15.0 / safe)
    u = np.rint((g / safe[..., None] - gm[..., None]) / np.where(gd > 0, gd, 1.0)[..., None])
    u = np.clip(np.where(gd[..., None] > 0, u, 0.0), 0, 15).astype(np.uint8).reshape(N, K)
    w4 = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    return w4, gd.astype(np.int16), gm.astype(np.int16), s


def quant_gamma(g: np.ndarray):
    """RMSNorm gamma -> (int16 [n], G) with g_int = rint(gamma * 2^G) and
    max |g_int| in [2^13, 2^14)."""
    g = np.asarray(g, dtype=np.float64)
    amax = float(np.abs(g).max())
    if amax == 0.0:
        return np.zeros(g.shape, np.int16), 0
    _, e = math.frexp(amax)  # amax in [2^(e-1), 2^e)
    G = 14 - e
    gi = np.rint(g * 2.0**G)
    return gi.astype(np.int16), G


def model_config(arch: str, hp: dict, weights: str = "int8") -> dict:
    """The config.json of a converted model (format_version 2) without the
    fixed-point notes: sizes, the integer RMSNorm epsilons, the weight
    format and the per-layer block description ``hp["layers"]``."""
    H, D = hp["hidden_size"], hp["head_dim"]
    cfg = {
        "format": "intdet",
        "format_version": FORMAT_VERSION,
        "architecture": arch,
        **{k: hp[k] for k in (
            "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "vocab_size", "context_length", "rope_theta", "rms_eps", "tied_embeddings")},
        **({"rope_local_theta": hp["rope_local_theta"]} if "rope_local_theta" in hp else {}),
        **({"rope_scaling": hp["rope_scaling"]} if hp.get("rope_scaling") else {}),
        # Only when not 16, so the files of the other families keep their bytes.
        **({"residual_frac_bits": hp["residual_frac"]} if hp.get("residual_frac", 16) != 16 else {}),
        "rms_eps_q60": {
            "hidden": int(np.rint(H * hp["rms_eps"] * 2.0**60)),
            "head": int(np.rint(D * hp["rms_eps"] * 2.0**60)),
            # a projection-wide q/k RMSNorm (OLMo 2) over nh*D and nkv*D features
            **({"q_proj": int(np.rint(hp["num_heads"] * D * hp["rms_eps"] * 2.0**60)),
                "k_proj": int(np.rint(hp["num_kv_heads"] * D * hp["rms_eps"] * 2.0**60))}
               if any(b.get("qk_norm_span") == "projection" for b in hp["layers"]) else {}),
        },
        "layers": hp["layers"],
    }
    if hp.get("final_softcap"):  # absent without (Gemma 2 has it), so other files keep their bytes
        cfg["final_logit_softcap"] = True
    if weights == "int4":  # absent for int8
        cfg["weight_format"] = "int4"
        cfg["weight_group_size"] = W4_GROUP
    return cfg


def model_params(cfg: dict, where: str = "config.json") -> list:
    """The one tensor table (csrc/model/layout.cpp) for a config dict;
    IntdetError naming ``where`` for a config the loader refuses."""
    from .. import _core

    try:
        return _core.model_params(cfg, where)
    except ValueError as e:
        raise IntdetError(str(e)) from None


def source_tensors(hp: dict, where: str) -> dict:
    """Float tensor name -> shape of every source tensor the model is made
    from (rope and attention score scales are derived, not read)."""
    want = {}
    for p in model_params(model_config("", hp), where):
        if p["kind"] in ("embedding", "norm", "post_norm", "linear", "router", "experts") or (
                p["kind"] == "lm_head" and not hp["tied_embeddings"]):
            want[p["name"]] = tuple(p["shape"])
        if p["bias"]:
            want[p["name"] + ".bias"] = (p["shape"][0],)
    return want


# Row blocks of this many elements: float64 temporaries of 8 MiB each, so a
# tensor of any size is quantized in a bounded working set.
BLOCK_ELEMS = 1 << 20


def fixed_point_notes(weights: str, R: int) -> dict:
    """config.json "fixed_point": the formats, for readers of the file."""
    return {
        "residual_frac_bits": R,
        "proj_frac_bits": PROJ_FRAC,
        "logit_frac_bits": LOGIT_FRAC,
        "norm_out_frac_bits": NORM_OUT_FRAC,
        "rope_frac_bits": 14,
        "prob_frac_bits": PROB_FRAC,
        "exp_in_frac_bits": 16,
        "exp_out_frac_bits": 30,
        "activations": "int16 per token, power-of-two scale",
        "weights": "int8 per output channel, dyadic scale (15-bit mantissa)" if weights == "int8" else (
            "decoder linears: int4 codes, per group of 32 inputs w = gd * u + gm (|w| <= 2047), per-channel dyadic "
            "scale; embedding and lm_head int8 per channel"),
        "kv_cache": "int8 per (position, kv head), absmax scale",
    }


class Plan:
    """What a conversion writes, known before any large tensor is read.

    ``specs``: output name -> (numpy dtype, shape) of every integer tensor;
    ``static``: the small ones already computed (norm gammas, RoPE tables,
    scales, biases); ``jobs``: callables, one per row block of each large
    tensor (embedding, linears, router, experts, lm_head), that quantize the
    block and hand its parts to ``put(name, element_offset, array)``;
    ``cfg``: the config.json contents. ``run(put, workers)`` writes
    everything, in the source's layer order. ``output_bytes()``: the
    tensors' total size."""

    def __init__(self, cfg: dict):
        self.cfg, self.specs, self.static, self.jobs = cfg, {}, {}, []
        self.job_tensors: list[str] = []  # the output name (prefix) of each job's tensor
        self.close = lambda: None  # the progress bar's

    def add_static(self, name: str, a: np.ndarray) -> None:
        self.static[name] = a
        self.specs[name] = (a.dtype, a.shape)

    def output_bytes(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for dt, shape in self.specs.values())

    def run(self, put, workers: int = 1) -> None:
        """Run every job; ``workers`` > 1: on that many threads (numpy and
        the file writes release the GIL), at most 2 x workers blocks in
        flight, so memory stays bounded. Blocks are independent (rows are
        quantized alone), so any order gives the same bytes. ``put`` must
        take calls from several threads (disjoint ranges)."""
        for name, a in self.static.items():
            put(name, 0, a)
        if workers <= 1:
            for job in self.jobs:
                job(put)
            return
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        ex = ThreadPoolExecutor(workers, thread_name_prefix="intdet-quantize")
        pending = set()
        try:
            for job in self.jobs:
                while len(pending) >= 2 * workers:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        f.result()  # a block's error (NaN in the source...) stops the run
                pending.add(ex.submit(job, put))
            for f in pending:
                f.result()
        finally:  # on an error or Ctrl-C: no new blocks, wait for the running ones
            ex.shutdown(wait=True, cancel_futures=True)


def _release(t) -> None:
    """Drop a source tensor's pages once it is quantized (lazy.LazyTensor)."""
    rel = getattr(t, "release", None)
    if rel is not None:
        rel()


def _rows_job(plan: Plan, name: str, src, lead: tuple, K: int, quant: str, scale, done=None):
    """Plan the quantized rows of ``src`` (2-D view rows x K, as ``lead`` +
    (K,)) under ``name``: quant "int8" (.q), "int4" (.q4, .gd, .gm) or
    "scales" (no weights: a tied lm_head reads the embedding's), and
    .mant/.shift = dyadic_vec(scale(s)) of each row's float64 int8 step s
    (int4: its own step). One job per row block; ``done()`` after the
    last block's (a progress count: blocks may finish in any order)."""
    if quant == "int8":
        plan.specs[name + ".q"] = (np.dtype(np.int8), lead + (K,))
    elif quant == "int4":
        plan.specs[name + ".q4"] = (np.dtype(np.uint8), lead + (K // 2,))
        plan.specs[name + ".gd"] = (np.dtype(np.int16), lead + (K // W4_GROUP,))
        plan.specs[name + ".gm"] = (np.dtype(np.int16), lead + (K // W4_GROUP,))
    plan.specs[name + ".mant"] = (np.dtype(np.int32), lead)
    plan.specs[name + ".shift"] = (np.dtype(np.int32), lead)
    R = int(np.prod(lead, dtype=np.int64))
    blocks = list(row_blocks(R, K, BLOCK_ELEMS))

    def block(put, lo, hi, last):
        w = rows_of(src, lo, hi)
        if quant == "int4":
            q4, gd, gm, s = quant_rows_int4(w)
            put(name + ".q4", lo * (K // 2), q4)
            put(name + ".gd", lo * (K // W4_GROUP), gd)
            put(name + ".gm", lo * (K // W4_GROUP), gm)
        else:
            q, s = quant_rows_int8(w)
            if quant == "int8":
                put(name + ".q", lo * K, q)
        mant, shift = dyadic_vec(scale(s))
        put(name + ".mant", lo, mant)
        put(name + ".shift", lo, shift)
        _release(src)  # the source pages read so far: RSS stays a few blocks, not the tensor
        if last and done:
            done()

    for i, (lo, hi) in enumerate(blocks):
        plan.jobs.append(lambda put, lo=lo, hi=hi, last=i == len(blocks) - 1: block(put, lo, hi, last))
        plan.job_tensors.append(name)


def plan_model(fm, weights: str = "int8", progress: bool = False, with_rope: bool = True) -> Plan:
    """FloatModel -> Plan (above): every output tensor's name, dtype and
    shape, the small tensors computed, and one job per large tensor.

    weights: "int8" (per-channel int8) or "int4" (the decoder layers' linear
    weights as per-group int4, quant_rows_int4; the embedding and lm_head
    stay int8). Raises IntdetError for another value. ``with_rope``:
    False leaves the RoPE tables out (they depend on the config alone).

    Activations entering each linear layer carry a static factor c_in (the
    value of one unit of the int16 activation at exponent 0):
    - after RMSNorm over n elements: sqrt(n) * 2^-(14 + G);
    - the residual stream itself (blocks without pre-norms, OLMo 2): 2^-R;
    - attention output: 1 / (127 * 2^(16 + PROJ_FRAC));
    - SwiGLU / GeGLU output: 2^-(2 * PROJ_FRAC).

    The residual stream is int32 in Q R, R = hp["residual_frac"] (default
    16; Gemma 3: 10). Folded into existing integers (docs/format.md): the
    embedding scale hp["embed_scale"] into tok_embd's dyadic scale, the
    attention scale hp["attn_scale"] (default 1/sqrt(D)) into attn_score,
    and a post-norm's sqrt(H) into its gamma (post_norm kind).

    Every weight matrix is read a row block at a time (quantization is per
    row, so the blocks give the whole tensor's bytes) and its source pages
    are dropped once it is done: peak memory does not grow with the model.
    """
    hp, W = fm.hp, fm.weights
    D = hp["head_dim"]
    R = hp.get("residual_frac", RESIDUAL_FRAC)
    if weights not in WEIGHT_FORMATS:
        raise IntdetError(f"weights {weights!r}: choose int8 or int4", field="weights")
    _check_bounds(hp, weights)
    plan = Plan(model_config(fm.arch, hp, weights))
    norm_exp = {}  # G of every RMSNorm gamma (analysis: int -> real of norm outputs)
    c_of = {"residual": 2.0**-R}  # activation name -> c_in of the layers reading it (no pre-norm: the residual, Q R)
    int4 = "int4" if weights == "int4" else "int8"

    from tqdm import tqdm

    bar = tqdm(total=hp["num_layers"], desc="quantize", unit="layer", disable=not progress, leave=False)

    def matrix(name, src, c_in, f_out, quant, done=None):
        shape = tuple(src.shape)
        _rows_job(plan, name, src, shape[:-1], shape[-1], quant, lambda s: c_in * s * 2.0**f_out, done)

    for p in model_params(plan.cfg):
        name, kind, layer = p["name"], p["kind"], p["layer"]
        pre = f"blk.{layer}."
        if kind == "embedding":  # int8 rows, dyadic per-row scale straight to the residual
            e = hp.get("embed_scale", 1.0)
            _rows_job(plan, name, W[name], tuple(W[name].shape[:-1]), W[name].shape[-1], "int8",
                      lambda s, e=e: s * e * 2.0**R)
        elif kind == "rope" and not with_rope:  # LLM.update_weights: weights never change them
            continue
        elif kind == "rope":  # "rope" (rope_theta) or "rope_local" (rope_local_theta: Gemma's local layers)
            theta = hp["rope_local_theta"] if name == "rope_local" else hp["rope_theta"]
            scaling = None if name == "rope_local" else hp.get("rope_scaling")  # local layers keep plain RoPE
            cos, sin = rope_tables(theta, D, hp["context_length"], scaling=scaling)
            plan.add_static(name + ".cos", cos)
            plan.add_static(name + ".sin", sin)
        elif kind == "post_norm":  # RMSNorm of a branch straight to the residual (Gemma)
            gi, G = quant_gamma(np.asarray(W[name], np.float64) * math.sqrt(p["shape"][0]))
            plan.add_static(name + ".g", gi)
            plan.add_static(name + ".shift", np.array([NORM_OUT_FRAC + G - R], np.int32))
            norm_exp[name] = G
        elif kind == "norm":
            gi, G = quant_gamma(W[name])
            plan.add_static(name + ".g", gi)
            norm_exp[name] = G
            c_of[name] = math.sqrt(p["shape"][0]) * 2.0 ** -(NORM_OUT_FRAC + G)
        elif kind == "linear":
            c_of[pre + "attn_out"] = 1.0 / (127.0 * 2.0 ** (PROB_FRAC + PROJ_FRAC))
            c_of[pre + "ffn_act"] = 2.0 ** -(2 * PROJ_FRAC)
            # o and down write the residual (Q R), or with post-norms their Q16 input.
            post = "post_attention_norm" in hp["layers"][layer]["norms"]
            f_out = R if p["input"] in (pre + "attn_out", pre + "ffn_act") and not post else PROJ_FRAC
            matrix(name, W[name], c_of[p["input"]], f_out, int4,
                   done=(lambda: bar.update(1)) if name.endswith("ffn_down") else None)
            if p["bias"]:
                plan.add_static(name + ".bias", _fixed_i32(W.get(name + ".bias"), f_out, name + ".bias"))
        elif kind == "router":  # MoE router: int8, straight to Q16 log2 units (the integer softmax's input)
            c_in = c_of[p["input"]]
            _rows_job(plan, name, W[name], tuple(W[name].shape[:-1]), W[name].shape[-1], "int8",
                      lambda s, c=c_in: c * s * LOG2E * 2.0**16)
        elif kind == "experts":  # [E, N, K]: each expert's rows as a linear's, stored as one tensor
            c_of[pre + "ffn_act"] = 2.0 ** -(2 * PROJ_FRAC)  # SwiGLU output Q32
            post = "post_ffw_norm" in hp["layers"][layer]["norms"]
            f_out = R if name.endswith("ffn_down_exps") and not post else PROJ_FRAC
            matrix(name, W[name], c_of[p["input"]], f_out, int4,
                   done=(lambda: bar.update(1)) if name.endswith("ffn_down_exps") else None)
        elif kind == "attn_score":
            # z (Q16 log2 units) = raw * mk * 2^(e_q + ek) * c_q * c_k * log2(e) / (127 * sqrt(D)) * 2^16;
            # q and k leave their projection in Q16, or a per-head RMSNorm.
            c_q = c_of.get(pre + "attn_q_norm", 2.0**-PROJ_FRAC)
            c_k = c_of.get(pre + "attn_k_norm", 2.0**-PROJ_FRAC)
            af2 = attention_factor(hp.get("rope_scaling")) ** 2  # YaRN scales cos and sin: q.k by its square
            if "attn_scale" in hp or af2 != 1.0:  # Gemma: query_pre_attn_scalar^-0.5
                scale = hp.get("attn_scale", 1.0 / math.sqrt(D)) * af2
                sm, ss = dyadic(c_q * c_k * LOG2E * 2.0**16 * scale / 127.0)
            else:  # 1/sqrt(D), written as before so existing files keep their bits
                sm, ss = dyadic(c_q * c_k * LOG2E * 2.0**16 / (127.0 * math.sqrt(D)))
            plan.add_static(name + ".mant", np.array([sm], np.int32))
            plan.add_static(name + ".shift", np.array([ss], np.int32))
        elif kind == "softcap":  # Gemma 2: of the Q16 log2-domain scores (a layer's) or of the Q16 logits
            c, k, what = ((hp["attn_softcap"], LOG2E * 2.0**16, "attn_logit_softcapping") if layer >= 0
                          else (hp["final_softcap"], 2.0**LOGIT_FRAC, "final_logit_softcapping"))
            vals = softcap_constants(c, k, what)
            for suffix, v in zip((".cap", ".inv_mant", ".inv_shift"), vals):
                plan.add_static(name + suffix, np.array([v], np.int32))
        elif kind == "lm_head":
            c_in = c_of[p["input"]]
            src = W["tok_embd"] if hp["tied_embeddings"] else W[name]
            _rows_job(plan, name, src, tuple(src.shape[:-1]), src.shape[-1],
                      "scales" if hp["tied_embeddings"] else "int8", lambda s, c=c_in: c * s * 2.0**LOGIT_FRAC)
        else:
            raise IntdetError(f"internal: no quantizer for parameter kind {kind!r}")
    plan.cfg["fixed_point"] = fixed_point_notes(weights, R)
    plan.cfg["norm_gamma_exponents"] = norm_exp
    if fm.hparams:  # what LLM.update_weights quantizes new weights with (update.py)
        plan.cfg["hparams"] = fm.hparams
    plan.cfg["source"] = fm.source  # its sha256 may still be computing (sources.resolve_source)
    plan.close = bar.close
    return plan


def quantize_model(fm, progress: bool = False, weights: str = "int8") -> tuple[dict, dict]:
    """FloatModel -> (tensors: name -> int array, config dict), in memory:
    plan_model's tensors gathered into arrays (the converter streams them
    into the file instead; this form is for analysis and tests)."""
    plan = plan_model(fm, weights=weights, progress=progress)
    out = {name: np.empty(shape, dt) for name, (dt, shape) in plan.specs.items()}

    def put(name, start, a):
        flat = out[name].reshape(-1)
        flat[start:start + a.size] = np.asarray(a).reshape(-1)

    plan.run(put)
    plan.close()
    plan.cfg["source"] = resolve_source(plan.cfg["source"])
    return out, plan.cfg


def _fixed_i32(v, frac, name):
    x = np.rint(np.asarray(v, dtype=np.float64) * 2.0**frac)
    if np.abs(x).max(initial=0) > 2**31 - 1:
        raise IntdetError(f"tensor '{name}' does not fit int32 in Q{frac}")
    return x.astype(np.int32)


def _check_bounds(hp, weights="int8"):
    """Refuse models whose sizes could overflow an accumulator (docs/format.md
    derives each bound)."""
    H, F, D = hp["hidden_size"], hp["intermediate_size"], hp["head_dim"]
    nh = hp["num_heads"]
    if weights == "int4":
        for n, k in (("hidden_size", H), ("intermediate_size", F), ("num_heads * head_dim", nh * D)):
            if k % W4_GROUP:
                raise IntdetError(f"weights int4: {n} = {k} is not a multiple of {W4_GROUP} (int4 groups)", field="weights")
        if max(H, F, nh * D) >= 1 << 21:
            raise IntdetError("weights int4: a linear layer's input reaches 2^21 features: int64 accumulator bound",
                              field="weights")
    if H > 8192 or D > 8192:
        raise IntdetError(f"hidden_size {H} exceeds 8192: RMSNorm's int64 sum of squares could overflow")
    for b in hp.get("layers", ()):
        fm = b.get("moe", {}).get("expert_ffn_size", 0)
        if weights == "int4" and fm % W4_GROUP:
            raise IntdetError(f"weights int4: expert intermediate size {fm} is not a multiple of {W4_GROUP}",
                              field="weights")
        if fm > 1 << 24:
            raise IntdetError("an expert's input exceeds 2^24 features: int64 accumulator bound")
    if nh * D > 8192 and any(b.get("qk_norm_span") == "projection" for b in hp.get("layers", ())):
        raise IntdetError(f"num_heads * head_dim = {nh * D} exceeds 8192: the projection-wide q/k RMSNorm's "
                          "int64 sum of squares could overflow")
    if max(H, F, nh * D) > 1 << 24:
        raise IntdetError("a linear layer's input exceeds 2^24 features: int64 accumulator bound")
    if D > 256 or D % 2:
        raise IntdetError(f"head_dim {D} must be even and at most 256 (attention score bound)")
    if hp["context_length"] >= 1 << 19:
        raise IntdetError(f"context_length {hp['context_length']} exceeds 2^19 positions")
