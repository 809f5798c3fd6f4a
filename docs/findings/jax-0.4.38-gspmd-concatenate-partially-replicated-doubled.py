#!/usr/bin/env python3
"""jax 0.4.30 to 0.4.38 (CPU; jax-ml/jax#24576, reported on GPU with 0.4.34, right in 0.5.3): the concatenation of
arrays split over one axis of a 2x2 mesh and replicated over the other comes out doubled, eagerly and under jit,
whenever the operands' shards are partially replicated. jnp.stack, hstack, column_stack, append and the reflecting
modes of jnp.pad, which concatenate, are wrong the same way.

Found by shardfuzz: a 300-s jax-gspmd campaign against jax 0.4.38 (seed 209), as six findings (`append`,
`column_stack`, `hstack`, `stack`, `pad` outputs 2x or 4x, and the doubled gradient of `glu`, a split whose transpose
concatenates); reduced by hand to the issue's program. MISMATCH under 0.4.30 and 0.4.38; OK under 0.5.3, 0.6.2 and
0.12.0.1.

Run: python jax-0.4.38-gspmd-concatenate-partially-replicated-doubled.py
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b"))
rows = NamedSharding(mesh, PartitionSpec("a"))  # split over "a", replicated over "b"
x = np.arange(1.0, 5.0, dtype=np.float32)
y = np.arange(5.0, 17.0, dtype=np.float32)
want = np.concatenate([x, y])
got = {"eager": jnp.concatenate([jax.device_put(x, rows), jax.device_put(y, rows)]),
       "jit": jax.jit(lambda a, b: jnp.concatenate([a, b]))(jax.device_put(x, rows), jax.device_put(y, rows))}
print(f"jax {jax.__version__}")
bad = False
for how, out in got.items():
    ratio = np.asarray(out) / want
    print(f"{how}: concatenate / expected = {np.unique(ratio)}")
    bad |= not np.array_equal(np.asarray(out), want)
print("MISMATCH: the concatenation is not its operands" if bad else "OK")
raise SystemExit(1 if bad else 0)
