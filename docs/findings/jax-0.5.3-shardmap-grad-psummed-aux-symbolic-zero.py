#!/usr/bin/env python3
"""jax 0.4.38 and 0.5.3 (shard_map with its replication check on, the default; CPU): the gradient of a shard_map'ed
loss that also returns a `psum`med auxiliary output (a metric, logits gathered for logging: `value_and_grad(...,
has_aux=True)`) fails while JAX transposes the program: the `psum`'s transpose is handed a symbolic zero cotangent
for the auxiliary output and calls an array method on it:
  0.4.38: AttributeError: 'Zero' object has no attribute 'reshape'
  0.5.3:  TypeError: expand_dims requires ndarray or scalar arguments, got <class 'jax._src.ad_util.Zero'>
With `check_rep=False` the same program runs; 0.6.2, 0.7.1 and 0.12.0.1 give the right gradient.

Found by shardfuzz: jax-shardmap's pipeline (model cases with pp > 1) first returned the last stage's logits as a
`psum` over the stages of a masked value, beside the loss; under jax 0.4.38 (`--python .venv-jax04/bin/python`) every
such case failed this way (2026-12-03). Reduced by hand. A search of stored JAX issue threads found no exact match
(jax-ml/jax#3653 fixed the same symptom for pmap's psum in 2020).

Run: python jax-0.5.3-shardmap-grad-psummed-aux-symbolic-zero.py
Prints CRASH: <exception> (exit status 1), MISMATCH (exit status 1) or OK (exit status 0).
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

mesh = Mesh(np.array(jax.devices()[:2]), ("i",))


def body(w, x):
    y = x * w
    return jnp.sum(y)[None], jax.lax.psum(y, "i")  # each device's loss term, and a psummed metric


def loss(w, x):
    terms, metric = shard_map(body, mesh=mesh, in_specs=(P(), P("i")), out_specs=(P("i"), P()))(w, x)
    return jnp.sum(terms), metric


w, x = jnp.ones(2), jnp.arange(4.0)
try:
    g, metric = jax.grad(loss, has_aux=True)(w, x)
except Exception as e:  # noqa: BLE001
    print(f"CRASH: {type(e).__name__}: {str(e).splitlines()[0]} (jax {jax.__version__})")
    sys.exit(1)
want_g, want_metric = x.reshape(2, 2).sum(0), x.reshape(2, 2).sum(0)
if np.allclose(g, want_g) and np.allclose(metric, want_metric):
    print(f"OK (jax {jax.__version__})")
    sys.exit(0)
print(f"MISMATCH: grad {np.asarray(g).tolist()} (expected {np.asarray(want_g).tolist()}) (jax {jax.__version__})")
sys.exit(1)
