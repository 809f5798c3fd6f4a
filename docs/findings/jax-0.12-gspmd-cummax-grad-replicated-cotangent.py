import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:2]), ("a",))
rng = np.random.default_rng(0)
x = rng.standard_normal(4); g = rng.standard_normal(4)
want = jax.vjp(jax.lax.cumsum, x)[1](g)[0], jax.vjp(jax.lax.cummax, x)[1](g)[0]
def f(x, g, spec):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(m, spec))
    return jax.vjp(jax.lax.cumsum, x)[1](g)[0], jax.vjp(jax.lax.cummax, x)[1](g)[0]
gr = jax.device_put(g, NamedSharding(m, P()))
gs = jax.device_put(g, NamedSharding(m, P("a")))
for gname, gg in (("numpy", g), ("replicated", gr), ("sharded", gs)):
    for spec in (P(), P("a")):
        got = jax.jit(f, static_argnums=2)(x, gg, spec)
        print("cot", gname, "x spec", spec, [float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got, want)])
print("x", x, "g", g)
print(jax.jit(f, static_argnums=2)(x, gr, P("a"))[1], want[1])
