#!/usr/bin/env python3
"""jax 0.4.30 to 0.11.2 (XLA's SPMD partitioner, CPU; right in jax 0.12.0): `lax.dynamic_slice` whose start index is
out of range, with its result split along the sliced dim, reads the wrong elements. DynamicSlice clamps the global
start (here 5 -> 3 for 3 columns of 6) and each shard should read its piece of that window; the partitioned program
clamps each shard's own start instead, so every shard reads the last column. Unsharded, and with in-range starts,
the same program is right. Reported upstream as openxla/xla#49122 ("SPMD partitioner clamps a partitioned
dynamic-slice per shard instead of globally", 2026-09), with the dynamic-update-slice sibling #49118.

Found by shardfuzz: a 300-s jax-gspmd campaign against jax 0.5.3 (seed 211; the table's dynamic_slice sample, start
indices drawn beyond the operand, output constrained to S(1) on 3 devices), minimized there to that alone (17
executions). MISMATCH under 0.4.30, 0.4.38, 0.5.3, 0.6.2, 0.7.1, 0.8.0, 0.10.0 and 0.11.2; OK under 0.12.0 and
0.12.0.1 (with GSPMD or Shardy).

Run: python jax-0.11-gspmd-dynamic-slice-clamped-per-shard.py
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=3").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

jax.config.update("jax_enable_x64", True)
mesh = Mesh(np.array(jax.devices()[:3]), ("a",))
x = np.arange(30.0).reshape(5, 6)


def sliced(x, i, j):
    out = jax.lax.dynamic_slice(x, (i, j), (2, 3))
    return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, PartitionSpec(None, "a")))  # 3 columns, 3 devices


print(f"jax {jax.__version__}")
bad = False
for i, j in [(0, 0), (1, 2), (3, 3), (4, 5), (9, 9)]:  # the last two out of range: clamped to (3, 3)
    want = np.asarray(jax.lax.dynamic_slice(x, (i, j), (2, 3)))
    got = np.asarray(jax.jit(sliced)(x, np.int64(i), np.int64(j)))
    same = np.array_equal(got, want)
    bad |= not same
    print(f"start ({i}, {j}): " + ("right" if same else f"got {got.tolist()}, want {want.tolist()}"))
print("MISMATCH: a clamped start read per shard" if bad else "OK")
raise SystemExit(1 if bad else 0)
