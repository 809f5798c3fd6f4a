#!/usr/bin/env python3
"""jax 0.4.38 (CPU): a two-stage pipeline written as JAX's shard_map documentation writes one (the stages'
parameters stacked along a leading dimension split over a `pp` mesh axis, activations passed by `ppermute`) computes
with every stage parameter doubled when the mesh also has a tensor-parallel axis (here [dp 1, pp 2, tp 2]): under jit,
`jnp.stack` of the stages' parameters resharded to P("pp", None) (split over pp, replicated over tp) doubles them.
The concatenation of partially replicated arrays doubled (jax-ml/jax#24576; the script
jax-0.4.38-gspmd-concatenate-partially-replicated-doubled.py), reached through a pipeline's stacked parameters.

Found by shardfuzz: jax-shardmap's pipeline model cases with tp > 1 diverged under jax 0.4.38 (`--python
.venv-jax04/bin/python`, 2026-12-03; float64 logits off by up to 3.2), narrowed by monkeypatching the model, then
reduced by hand. MISMATCH under 0.4.38; OK under 0.5.3 and 0.12.0.1.

Run: python jax-0.4.38-shardmap-pipeline-stacked-params-doubled.py
Prints MISMATCH (exit status 1) or OK (exit status 0).
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 2, 2), ("dp", "pp", "tp"))
bias0, bias1 = jnp.arange(4.0), 100 + jnp.arange(4.0)  # each stage's parameter
x = jnp.ones((3, 4))


def stages(b, x):
    k = jax.lax.axis_index("pp")
    y = jnp.where(k == 0, x, 0.0) + b[0]           # stage 0: x + bias0
    y = jax.lax.ppermute(y, "pp", [(0, 1)])        # to stage 1
    return (y + b[0])[None]                        # stage 1: + bias1


@jax.jit
def pipeline(bias0, bias1, x):
    stacked = jnp.stack([bias0, bias1])            # [stage, 4], split over pp below
    return shard_map(stages, mesh=mesh, in_specs=(P("pp", None), P()), out_specs=P("pp"))(stacked, x)[-1]


out, want = np.asarray(pipeline(bias0, bias1, x)), np.asarray(x + bias0 + bias1)
if np.allclose(out, want):
    print(f"OK (jax {jax.__version__})")
    sys.exit(0)
print(f"MISMATCH: {out[0].tolist()} (expected {want[0].tolist()}) (jax {jax.__version__})")
sys.exit(1)
