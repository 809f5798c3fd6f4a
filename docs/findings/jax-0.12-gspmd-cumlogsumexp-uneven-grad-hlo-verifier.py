"""jax 0.12 (jit + NamedSharding on 8 host CPU devices): the gradient of jax.lax.cumlogsumexp along a dim split
unevenly (3 rows over a mesh axis of 4) fails XLA's HLO verifier after SPMD partitioning
("Expected instruction to have shape equal to f64[3,5], actual shape is f64[1,5]"). Found by shardfuzz on
2026-11-25 (jax-gspmd, the sample edit `negate` turning the sample's `reverse=True` into False), in one jit
computing the output and its vjp, as the fuzzer's programs do. With reverse=True, or 4 rows (even), it
compiles and matches one device.

Run:  python jax-0.12-gspmd-cumlogsumexp-uneven-grad-hlo-verifier.py
Prints CRASH (exit 1) when the sharded gradient does not compile, OK (exit 0) when it matches one device.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)


def main():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a0", "a1"))
    x = np.random.default_rng(0).standard_normal((3, 5))
    cot = np.random.default_rng(1).standard_normal((3, 5))

    def step(v, c, sharded):
        def f(v):
            if sharded:
                v = jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P("a1", None)))  # 3 rows over 4 devices
            return jax.lax.cumlogsumexp(v, axis=0, reverse=False)

        out, vjp = jax.vjp(f, v)
        return out, vjp(c)[0]

    want = step(x, cot, False)[1]
    try:
        rep = NamedSharding(mesh, P())
        got = jax.jit(lambda v, c: step(v, c, True))(jax.device_put(x, rep), jax.device_put(cot, rep))[1]
    except Exception as e:  # noqa: BLE001
        print(f"CRASH: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        return 1
    err = float(np.max(np.abs(np.asarray(got) - want)))
    print(f"max |sharded - single-device| = {err:.3g}")
    print("OK" if err < 1e-9 else "MISMATCH")
    return 0 if err < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
