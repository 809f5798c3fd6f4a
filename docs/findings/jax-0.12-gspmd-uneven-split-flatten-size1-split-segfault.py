#!/usr/bin/env python3
"""jax 0.4.30 to 0.12.0.1 (jit + NamedSharding, XLA's SPMD partitioner, CPU): a segmentation fault kills the process
when an array split unevenly over 3 devices (a leading dim of 2: one shard empty) is flattened, given a leading dim
of 1, and constrained to split that size-1 dim over the same 3 devices. No error message: the process dies (exit
status 139, or -11 for a child). Without the first split, it runs.

Found by shardfuzz: a 300-s jax-gspmd campaign against jax 0.4.30 (seed 216) as a `jnp.matmul` library-op case with
output views `flatten`, `unsqueeze` and an output constraint; the finding killed the worker under 0.5.3 and 0.12.0.1
too; minimized under 0.12.0.1 (45 executions, 13 s); reduced by hand to the program below (no matmul needed). A
search of JAX and XLA issue threads found no match: a crash of the current release, possibly new. CRASH (SIGSEGV)
under 0.4.30, 0.5.3 and 0.12.0.1.

Run: python jax-0.12-gspmd-uneven-split-flatten-size1-split-segfault.py   (runs the program in a child process)
"""

import subprocess
import sys

PROGRAM = r"""
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_enable_x64", True)
mesh = Mesh(np.array(jax.devices()[:3]), ("a",))
c = lambda v, *spec: jax.lax.with_sharding_constraint(v, NamedSharding(mesh, P(*spec)))
SPLIT_FIRST = {split}


def f(y):
    if SPLIT_FIRST:
        y = c(y, "a")                 # 2 rows over 3 devices: one shard empty
    z = y.reshape(-1)[None]           # [1, 40]
    return c(z, "a", None)            # the size-1 dim over 3 devices


out = jax.jit(f)(np.arange(40.0).reshape(2, 4, 5))
print("ran under jax", jax.__version__, "output", np.asarray(out).shape)
"""

crashed = False
for split in (False, True):
    r = subprocess.run([sys.executable, "-c", PROGRAM.format(split=split)], capture_output=True, text=True)
    said = (r.stdout + r.stderr).strip().splitlines()[-1:] or ["(nothing)"]
    print(f"split first: {split}: exit status {r.returncode}, {said[0]}")
    crashed |= split and r.returncode != 0
print("CRASH: the process died" if crashed else "OK")
raise SystemExit(1 if crashed else 0)
