#!/usr/bin/env python3
"""jax 0.12.0.1, XLA CPU, jit + NamedSharding: the weight gradient of `jax.lax.conv` whose input is split along a
spatial dim over ONE axis of a 2x2 mesh (the other axis unused, the weight replicated) comes back doubled, in
float64, with an even split (8 rows over 2) as with an uneven one (7), for a `.sum()` loss as for a float64
cotangent passed in. The forward is right; on a 1-D mesh of 2 devices the gradient is right. Silent: a conv trained
this way takes twice the step.

It is the Shardy partitioner's: with `jax_use_shardy_partitioner` on (the default since jax 0.7.0) jax 0.6.2 doubles
it too, and with it off (GSPMD, `--gspmd` below) 0.12 is right. By release, defaults: 0.6.2 OK; 0.7.0, 0.7.1, 0.8.0,
0.10.0 and 0.12.0.1 MISMATCH. Workaround: jax.config.update("jax_use_shardy_partitioner", False).

It widens jax-0.12-gspmd-conv-weight-grad-doubled-converted-cotangent.py, whose float64 program (an uneven height
over the second mesh axis, a dilated padded conv) was right: the convert is not needed, the mesh shape is.

Found by shardfuzz: campaign 220 (`fuzz --target jax-gspmd` under jax 0.6.2, seed 220) reported `jax.lax.conv`
doubled under 0.6.2 and 0.12 (input split on a spatial dim over one mesh axis, weight split on its input features
over the other); reduced by hand to this program, which doubles under 0.12 only.

Run: python3 jax-0.12-gspmd-conv-weight-grad-doubled-2d-mesh-float64.py [--gspmd]   (one process, 4 CPU devices)
Prints one line per case; exit status 1 when a case MISMATCHes (jax 0.12.0.1: the 2x2 mesh cases), else 0 (0.6.2,
or any of them with --gspmd).
"""
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.config.update("jax_enable_x64", True)
if "--gspmd" in sys.argv:
    jax.config.update("jax_use_shardy_partitioner", False)
rng = np.random.default_rng(0)
w = rng.standard_normal((2, 2, 3, 3))  # OIHW, replicated
bad = False
for mesh_shape in ((2,), (2, 2)):
    names = ("a", "b")[:len(mesh_shape)]
    mesh = Mesh(np.array(jax.devices()[:int(np.prod(mesh_shape))]).reshape(mesh_shape), names)
    split = NamedSharding(mesh, P(None, None, "a", None))  # NCHW: height over mesh axis "a" only
    for rows in (8, 7):
        x = rng.standard_normal((1, 2, rows, 7))
        cot = rng.standard_normal((1, 2, rows, 7))

        def conv(a, b, sharded):
            a = jax.lax.with_sharding_constraint(a, split) if sharded else a
            return jax.lax.conv(a, b, (1, 1), "SAME")

        for how, grad in (("sum() loss", lambda a, b, s: jax.grad(lambda b: conv(a, b, s).sum())(b)),
                          ("float64 cotangent", lambda a, b, s: jax.vjp(lambda b: conv(a, b, s), b)[1](cot)[0])):
            got = np.asarray(jax.jit(lambda a, b: grad(a, b, True))(x, w))
            want = np.asarray(grad(x, w, False))
            ok = np.allclose(got, want, rtol=1e-12, atol=1e-12)
            bad |= not ok
            print(f"{'OK' if ok else 'MISMATCH'}: mesh {mesh_shape}, height {rows} split over 'a', {how}: "
                  f"|sharded w grad| / |unsharded| = {np.linalg.norm(got) / np.linalg.norm(want):.4f}")
print("jax", jax.__version__, "shardy partitioner:", jax.config.jax_use_shardy_partitioner)
sys.exit(1 if bad else 0)
