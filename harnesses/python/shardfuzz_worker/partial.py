"""Partial (pending-sum) inputs: a full value split into uneven random summands, exactly, in the case dtype.

This mirrors the random partial splits of PyTorch's sharding-rule validator
(torch/distributed/tensor/_ops/strategy_validation.py `_create_partial_input`): every coordinate of a
partial mesh dim holds a different, nonzero summand, so a reduction over the wrong summands (or a rule
that treats a partial input as replicated) cannot agree with the reference by coincidence. Unlike the
validator's float splits, ours sum to the full value exactly: the fuzzer's oracle must not see a
rounding error we introduced ourselves.

Construction (per element, k summands): p = round_dtype(r * w) with w uniform in [0.5, 1), so p lies in
[r/2, r] and r - p is exact (Sterbenz's lemma); the next summand splits the remainder the same way and
the last takes what is left. Which coordinate holds which summand is shuffled per element. An element
where the round trip is not exact (subnormals) puts its whole value in one summand.
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


def split(full, k, dtype_name, rng):
    """`k` summands of `full` (float64 values representable in the dtype), stacked on a new leading axis:
    each representable in the dtype, their exact sum `full`."""
    x = np.asarray(full, dtype=np.float64)
    if k <= 1:
        return x[None].copy()
    parts, r = [], x
    for _ in range(k - 1):
        p = round_to(r * rng.uniform(0.5, 1.0, size=x.shape), dtype_name)
        # Rounded up to r itself: take r/2 instead, so the remainder (and the next summand) is not zero.
        p = np.where(p == r, round_to(r * 0.5, dtype_name), p)
        parts.append(p)
        r = r - p
    parts.append(r)
    parts = np.stack(parts)
    whole = np.zeros_like(parts)
    whole[0] = x
    parts = np.where(exact(parts, x, dtype_name), parts, whole)
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
