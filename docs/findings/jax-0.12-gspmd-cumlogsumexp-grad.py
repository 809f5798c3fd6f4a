import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a0", "a1"))
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 3, 4)); g = rng.standard_normal((2, 3, 4))
for fn in (jax.lax.cumlogsumexp, jax.lax.cumsum, jax.lax.cummax, jax.lax.cumprod):
    def f(x, g, spec):
        x = jax.lax.with_sharding_constraint(x, NamedSharding(m, spec))
        y, vjp = jax.vjp(lambda x: fn(x, axis=2), x)
        return y, vjp(g)[0]
    for spec in (P("a0", None, "a1"), P(None, None, "a1"), P(("a0", "a1"))):
        gr = jax.device_put(g, NamedSharding(m, P()))
        r0 = jax.jit(f, static_argnums=2)(x, g, P())
        r1 = jax.jit(f, static_argnums=2)(x, gr, spec)
        print(fn.__name__, spec, float(jnp.abs(r1[0] - r0[0]).max()), float(jnp.abs(r1[1] - r0[1]).max()))
