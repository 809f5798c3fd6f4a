"""jax 0.12 (jit + NamedSharding on 8 host CPU devices): XLA aborts the whole process in the SPMD partitioner
("hlo_sharding_util.cc:3007] Check failed: sliced.has_value() Could not slice dimension 1 with size 3") when
a [6, 4] array is constrained to P(None, ("a0", "a1")) (its 4 columns over all 6 devices of a 2x3 mesh:
uneven, two shards empty) and then to P("a0", "a1") (4 columns over 3 devices), inside one jit. Found by
shardfuzz on 2026-11-26 (jax-gspmd, a `bench guidance` campaign: the output of jax.lax.collapse through that
redistribution chain; minimized to the chain, f64, forward only; any op before it aborts alike).
An abort is a crash of the user's program, not an exception it can catch.

Run:  python jax-0.12-gspmd-uneven-reshard-abort.py
The child process aborting prints CRASH (exit 1); OK (exit 0) when the sharded result matches one device.
"""

import os
import subprocess
import sys

CHILD = "--child"


def child():
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    jax.config.update("jax_enable_x64", True)
    mesh = Mesh(np.array(jax.devices()[:6]).reshape(2, 3), ("a0", "a1"))
    x = np.random.default_rng(0).standard_normal((6, 4))

    def f(v):
        y = 2.0 * v
        y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, ("a0", "a1"))))
        y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("a0", "a1")))
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P()))

    got = np.asarray(jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P()))))
    err = float(np.max(np.abs(got - 2.0 * x)))
    print(f"max |sharded - single-device| = {err:.3g}")
    return 0 if err == 0 else 1


def main():
    if CHILD in sys.argv:
        return child()
    r = subprocess.run([sys.executable, __file__, CHILD], capture_output=True, text=True)
    if r.returncode < 0 or "Check failed" in r.stderr:
        line = next((ln for ln in r.stderr.splitlines() if "Check failed" in ln), r.stderr.strip()[-300:])
        print(f"CRASH (signal {-r.returncode}): {line.strip()[:300]}")
        return 1
    print(r.stdout.strip())
    print("OK" if r.returncode == 0 else "MISMATCH")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
