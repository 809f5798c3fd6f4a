"""Partial (pending-sum) inputs: a full value split into uneven random summands, exactly, in the case dtype.

This mirrors the random partial splits of PyTorch's sharding-rule validator
(torch/distributed/tensor/_ops/strategy_validation.py `_create_partial_input`): every coordinate of a
partial mesh dim holds a different, nonzero summand, so a reduction over the wrong summands (or a rule
that treats a partial input as replicated) cannot agree with the reference by coincidence. Unlike the
validator's float splits, ours sum to the full value exactly: the fuzzer's oracle must not see a
rounding error we introduced ourselves.

Exact in every order, not only in one: a sharded run adds the summands in whatever order its reduction
takes (a ring, a tree, rank order), and a split exact in one order only is off by an ulp in another. That
ulp was harmless for smooth ops and decisive for discontinuous ones: an argmax over exactly tied values
(integer data), summed in XLA's order, picked the other element of the tie, and its gradient went there,
a divergence we had made ourselves (jax-gspmd, op max over a `P` input, f64, 2026-11-28).

Construction (per element, k summands): the value is n quanta q, q its ulp in the case dtype (the
subnormal spacing below the normal range); k − 1 cut points drawn uniformly in [1, n − 1] split the n
quanta into k counts (a random composition: uneven, each nonzero unless cuts coincide), and each summand is
its count of quanta with the value's sign. Every subset of the summands then adds up to a multiple of q
no larger than |x|, which the dtype represents: every partial sum, in any order, is exact. Which
coordinate holds which summand is random per element. An element with fewer quanta than summands (zero,
the smallest subnormals) or not finite puts its whole value in one summand.
"""

import zlib

import numpy as np


def round_to(values, dtype_name):
    """float64 values rounded to the case dtype (and back to float64)."""
    if dtype_name == "f64":
        return np.asarray(values, dtype=np.float64)
    if dtype_name == "bf16":
        import ml_dtypes

        return np.asarray(values, dtype=ml_dtypes.bfloat16).astype(np.float64)
    return np.asarray(values, dtype={"f32": np.float32, "f16": np.float16}[dtype_name]).astype(np.float64)


def split_rng(seed, name):
    """The generator of one input's split: from the case's data seed and the input's name (crc32, stable
    across processes, unlike hash())."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, zlib.crc32(name.encode())])


#: Significand bits and the exponent of the smallest normal value of each dtype.
PRECISION = {"f64": 53, "f32": 24, "bf16": 8, "f16": 11}
MIN_NORMAL_EXPONENT = {"f64": -1022, "f32": -126, "bf16": -126, "f16": -14}


def quantum(x, dtype_name):
    """Per element, the dtype's spacing at |x| (its ulp; the subnormal spacing below the normal range)."""
    _, e = np.frexp(np.where(np.isfinite(x), x, 1.0))  # x = m · 2^e, 1/2 ≤ |m| < 1: leading bit 2^(e−1)
    lead = np.maximum(e.astype(np.int64) - 1, MIN_NORMAL_EXPONENT[dtype_name])
    return np.ldexp(1.0, lead - (PRECISION[dtype_name] - 1))


def split(full, k, dtype_name, rng):
    """`k` summands of `full` (float64 values representable in the dtype), stacked on a new leading axis:
    each representable in the dtype, and every partial sum of them, in any order, exact (module doc)."""
    x = np.asarray(full, dtype=np.float64)
    if k <= 1:
        return x[None].copy()
    q = quantum(x, dtype_name)
    n = np.where(np.isfinite(x), np.abs(x) / q, 0.0)
    cuts = np.sort(1.0 + np.floor(rng.random((k - 1,) + x.shape) * np.maximum(n - 1.0, 0.0)), axis=0)
    bounds = np.concatenate([np.zeros((1,) + x.shape), cuts, n[None]], axis=0)
    parts = np.copysign(np.diff(bounds, axis=0) * q, x)
    whole = np.zeros((k,) + x.shape)
    whole[0] = x
    parts = np.where((n >= k) & exact(parts, x, dtype_name), parts, whole)
    return rng.permuted(parts, axis=0)


def exact(parts, x, dtype_name):
    """Per element: every summand is representable in the dtype and they add up to `x` exactly. Summed from
    the last summand up, every partial sum is a remainder of the construction, representable in the dtype,
    so each float64 addition is exact when the construction was."""
    ok = np.all(round_to(parts, dtype_name) == parts, axis=0)
    total = parts[-1]
    for p in parts[-2::-1]:
        total = total + p
    return ok & (total == x)


def partial_parts(full, sizes, dtype_name, seed, name):
    """Summands of input `name` for partial mesh dims of `sizes` (mesh order): shape sizes + full.shape."""
    k = int(np.prod(sizes)) if len(sizes) else 1
    parts = split(full, k, dtype_name, split_rng(seed, name))
    return parts.reshape(tuple(sizes) + np.shape(full))
