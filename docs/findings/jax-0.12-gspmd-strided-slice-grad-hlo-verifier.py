"""jax 0.12 (jit + NamedSharding on 8 host CPU devices): the gradient of a strided jax.lax.slice_in_dim
(columns 3 and 5 of a [3, 7] array: start_index=-4, stride=2, axis=1), with the columns split over 2 devices
by a sharding constraint and the input and cotangent passed in replicated, fails XLA's HLO verifier after SPMD
partitioning ("Expected instruction to have shape equal to f64[3,3], actual shape is f64[3,4]", at the
transpose of the sharding constraint: a copy of the padded gradient). Found by shardfuzz on 2026-11-26
(jax-gspmd, a `bench guidance` campaign; minimized to one mesh axis, f64), in one jit computing the output and
its vjp, as the fuzzer's programs do. Measured beside it: 8 and 4 columns with stride 2 fail alike, 6 columns
compile; stride 1 compiles (STRIDE=1 below); the same program with the inputs as plain numpy arrays, or with
the output itself as the cotangent, compiles.

Run:  python jax-0.12-gspmd-strided-slice-grad-hlo-verifier.py
Prints CRASH (exit 1) when the sharded gradient does not compile, OK (exit 0) when it matches one device.
"""

import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

STRIDE = int(os.environ.get("STRIDE", "2"))


def main():
    mesh = Mesh(np.array(jax.devices()[:2]), ("a0",))
    x = np.random.default_rng(0).standard_normal((3, 7))
    cot = np.random.default_rng(1).standard_normal((3, len(range(3, 7, STRIDE))))

    def step(v, c, sharded):
        def f(v):
            if sharded:
                v = jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(None, "a0")))  # 7 columns over 2 devices
            return jax.lax.slice_in_dim(v, -4, None, stride=STRIDE, axis=1)

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
