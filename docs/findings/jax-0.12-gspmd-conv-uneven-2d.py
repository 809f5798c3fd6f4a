import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
m = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a0", "a1"))
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 5, 6, 2)); w = rng.standard_normal((3, 3, 2, 4))
def f(x, w, sx, sw):
    x = jax.lax.with_sharding_constraint(x, NamedSharding(m, sx))
    w = jax.lax.with_sharding_constraint(w, NamedSharding(m, sw))
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
ref = f(x, w, P(), P())
for sx in [P(None, "a1", "a0", None), P(), P(None, "a1"), P(None, None, "a0")]:
    for sw in [P(None, "a1"), P("a1"), P(None, "a0"), P()]:
        r = jax.jit(f, static_argnums=(2, 3))(x, w, sx, sw)
        print(sx, sw, float(np.abs(np.asarray(r) - np.asarray(ref)).max()))
