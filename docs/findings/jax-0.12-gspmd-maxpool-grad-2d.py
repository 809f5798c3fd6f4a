import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a0", "a1"))
rng = np.random.default_rng(0)
x = rng.permutation(24).reshape(4, 6) / 8.0
def pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 2), (1, 1), ((0, 1), (1, 0)))
g = rng.standard_normal(pool(x).shape)
for dt in (jnp.float32, jnp.float64):
    def f(x, g, spec):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(m, spec))
        y, vjp = jax.vjp(pool, x)
        return y, vjp(g.astype(y.dtype))[0]
    xx = jnp.asarray(x, dt)
    for gin in ("f64", "dt"):
        gg = jnp.asarray(g, jnp.float64 if gin == "f64" else dt)
        r0 = jax.jit(f, static_argnums=2)(xx, gg, P())
        r1 = jax.jit(f, static_argnums=2)(xx, gg, P("a0", "a1"))
        print(dt.__name__, "cot", gin, float(jnp.abs(r1[0] - r0[0]).max()), float(jnp.abs(r1[1] - r0[1]).max()))
