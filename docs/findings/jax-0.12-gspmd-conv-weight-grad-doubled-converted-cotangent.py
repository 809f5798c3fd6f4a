# jax 0.12.0.1, XLA CPU, jit + NamedSharding: the weight gradient of a convolution whose input is split
# unevenly along a spatial dim (height 5 over the second axis of a
# 2×2 mesh; on a 1-D mesh of 2 devices it is right) comes back doubled when the cotangent enters the
# jitted program in float64 and is converted to the compute dtype (float32 or bfloat16) inside it. With the
# cotangent passed in the compute dtype, or with everything in float64 (no convert), the gradient is right.
# Found 2026-11-28 by `shardfuzz bench sensitivity --library-ops --target jax-gspmd --dtype bf16` (seed 1790:
# `jax.lax.conv_with_general_padding` sample 15, weight a pending sum) and reduced by hand.
# Prints one line per case: OK, or MISMATCH with the norm ratio of the gradient to the unsharded one.
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

m = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a0", "a1"))
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 2, 5, 6)); w = rng.standard_normal((3, 2, 2, 3)); g = rng.standard_normal((1, 3, 5, 5))
kw = dict(window_strides=(1, 1), padding=((1, 0), (2, 1)), lhs_dilation=(1, 1), rhs_dilation=(1, 2))


def weight_grad(x, w, cot):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(m, P(None, None, "a1")))
    y, vjp = jax.vjp(lambda w: jax.lax.conv_with_general_padding(x, w, **kw), w)
    return vjp(cot.astype(y.dtype))[0]


for dt in (jnp.float64, jnp.float32, jnp.bfloat16):
    for cot_dt in (jnp.float64, dt):
        ref = jax.vjp(lambda w: jax.lax.conv_with_general_padding(jnp.asarray(x, dt), w, **kw), jnp.asarray(w, dt))[1](
            jnp.asarray(g, dt))[0]
        got = jax.jit(weight_grad)(jnp.asarray(x, dt), jnp.asarray(w, dt), jnp.asarray(g, cot_dt))
        ratio = float(jnp.linalg.norm(got.astype(jnp.float64)) / jnp.linalg.norm(ref.astype(jnp.float64)))
        verdict = "OK" if abs(ratio - 1) < 0.02 else "MISMATCH"
        print(f"{verdict}: compute {jnp.dtype(dt).name}, cotangent {jnp.dtype(cot_dt).name}: "
              f"|sharded grad| / |unsharded grad| = {ratio:.4f}")
