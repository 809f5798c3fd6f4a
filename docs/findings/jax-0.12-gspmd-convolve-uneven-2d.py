import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a0", "a1"))
rng = np.random.default_rng(0)
def f(x, k, sx, sk):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(m, sx))
    k = jax.lax.with_sharding_constraint(k, NamedSharding(m, sk))
    return jnp.convolve(x, k)
for n, kk in ((7, 3), (8, 4)):
    x = rng.standard_normal(n); k = rng.standard_normal(kk)
    ref = jnp.convolve(x, k)
    for sx, sk in ((P("a1"), P("a1")), (P("a0"), P("a0")), (P("a1"), P()), (P(), P("a1"))):
        out = jax.jit(f, static_argnums=(2, 3))(x, k, sx, sk)
        print(n, kk, sx, sk, float(np.abs(np.asarray(out) - np.asarray(ref)).max()))
