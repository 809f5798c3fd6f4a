import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
rng = np.random.default_rng(1)
x = rng.standard_normal((6, 3)); v = rng.standard_normal((5, 3)); idx = np.array([0, 2, 2, 5, 1])
for shape in ((2,), (2, 2)):
    m = Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), ("a0", "a1")[:len(shape)])
    ax = ("a0", "a1")[len(shape) - 1]
    def f(x, idx, v, how):
        idx = jax.lax.with_sharding_constraint(idx, NamedSharding(m, P(ax)))
        return getattr(x.at[idx], how)(v)
    for how in ("min", "max", "add"):
        ref = getattr(jnp.asarray(x).at[idx], how)(v)
        out = jax.jit(f, static_argnums=3)(x, idx, v, how)
        print(shape, how, float(np.abs(np.asarray(out) - np.asarray(ref)).max()))
