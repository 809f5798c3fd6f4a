"""Model cases on the JAX targets: the case's training run as a JAX user writes it, one jitted step per optimizer
step over a [dp, tp] mesh of host devices ([dp, pp, tp] for jax-shardmap's pipeline, jax_pipeline.py).

- Parameters: tensor parallelism splits them as Megatron does (q, k, v, up, gate and the LM head by output
  features, o and down by input features, the embedding by vocabulary rows; norms replicated). ZeRO stages are
  shardings over dp: 1 the optimizer state, 2 the gradients too, 3 the parameters too (FSDP).
- `jax-gspmd` (mode "gspmd"): the model on global arrays, the shardings as `with_sharding_constraint`s (and
  `device_put` where a dimension divides), sequence parallelism as the residual stream split over tp; XLA's
  partitioner places every collective and pads uneven dimensions.
- `jax-shardmap` (mode "shardmap"): the loss under `shard_map` with explicit collectives (jax_model_shardmap.py),
  differentiated from outside as JAX's shard_map documentation trains: the gradient reductions over dp and tp
  come from JAX's transposes of the forward's collectives.
Each step: the micro-batches' gradients accumulated in the parameter dtype, clipped, the optimizer applied.
Reported: step-0 logits and gradients, every step's loss, the final parameters (each with its device copies as
replicas), and the same run on one device in the case dtype (`baseline/`).
"""

import json

import numpy as np

from .base import dtype_name, parallel, setup_features
from .jax_common import device_copies, hlo_features, jax, jnp, model_mesh
from . import jax_model as jm


def tp_spec(name, ndim):
    """Tensor-parallel PartitionSpec entries of a parameter in case layout (linear weights [in, out])."""
    col = (".q.", ".k.", ".v.", ".up.", ".gate.")
    if name in ("embed.weight", "lm_head.weight"):  # both [vocab, hidden]
        return ["tp", None]
    if any(c in name for c in col):
        return [None, "tp"] if ndim == 2 else ["tp"]
    if (".o." in name or ".down." in name) and ndim == 2:
        return ["tp", None]
    return [None] * ndim


def with_dp(entries, shape, dp):
    """`entries` with dp added on the first dimension tp leaves whole (or beside tp on a vector); a dimension
    smaller than dp is skipped."""
    out = list(entries)
    for d, e in enumerate(out):
        if e is None and shape[d] >= dp:
            out[d] = "dp"
            return out
    if len(out) == 1 and out[0] == "tp":
        out[0] = ("tp", "dp")
    return out


class Plan:
    """PartitionSpecs of parameters, gradients, optimizer state and activations for the case."""

    def __init__(self, case, shapes):
        p = parallel(case)
        self.dp, self.tp, self.zero = p["dp"], p["tp"], p["zero_stage"]
        self.sp = bool(p.get("sequence_parallel")) and self.tp > 1
        self.param, self.grad, self.state = {}, {}, {}
        for n, shape in shapes.items():
            base = tp_spec(n, len(shape)) if self.tp > 1 else [None] * len(shape)
            sharded = with_dp(base, shape, self.dp) if self.dp > 1 else base
            self.param[n] = sharded if self.zero >= 3 else base
            self.grad[n] = sharded if self.zero >= 2 else base
            self.state[n] = sharded if self.zero >= 1 else base

    def batch(self):
        return ["dp", None]

    def residual(self):
        return ["dp", "tp" if self.sp else None, None]


def spec(entries):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*entries)


def divides(shape, entries, m_):
    sizes = dict(zip(m_.axis_names, m_.devices.shape))
    for n, e in zip(shape, entries):
        k = 1
        for a in (e if isinstance(e, tuple) else (e,) if e else ()):
            k *= sizes[a]
        if n % k:
            return False
    return True


class GspmdParallel(jm.Parallel):
    def __init__(self, constrain, plan):
        self.constrain, self.plan = constrain, plan

    def residual(self, x):
        return self.constrain(x, self.plan.residual())


def make_step(case, plan, m_, mode, trained_names, frozen):
    """The jitted step (params, state, ids, tgt, weights, inv_tokens, t, hyper) -> (loss, logits, grads, params,
    state). `m_`: the mesh, or None for the single-device run (no constraints). A step serves every case of the same
    jm.compiled_shape() (the values that differ are its arguments)."""
    from jax.sharding import NamedSharding

    m = case["model"]

    def constrain(x, entries):
        if m_ is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(m_, spec(entries)))

    if mode == "shardmap" and m_ is not None:
        from .jax_model_shardmap import sharded_loss

        loss_fn = sharded_loss(case, plan, m_, trained_names, frozen)
    else:
        par = GspmdParallel(constrain, plan)

        def loss_fn(pt, pf, ids, tgt, weights, inv_tokens, smoothing):
            p = {**pf, **pt}
            logits = jm.logits_of(par, p, constrain(ids, plan.batch()), m)
            losses = par.token_losses(logits, constrain(tgt, plan.batch()).reshape(-1), weights, smoothing)
            return jnp.sum(losses) * inv_tokens, logits

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(params, state, ids, tgt, weights, inv_tokens, t, hyper):
        smoothing = hyper["smoothing"] if jm.label_smoothing(case) else None
        params = {n: constrain(v, plan.param[n]) for n, v in params.items()}
        pt = {n: params[n] for n in trained_names}
        pf = {n: v for n, v in params.items() if n not in pt}
        loss, grads, rows = jnp.zeros((), jnp.float64), None, []
        for a, c in jm.micro_batches(case):
            (l, logits), g = grad_fn(pt, pf, ids[a:c], tgt[a:c], weights, inv_tokens, smoothing)
            loss = loss + l.astype(jnp.float64)
            rows.append(logits)
            grads = g if grads is None else {n: grads[n] + g[n] for n in g}
        grads = {n: constrain(g, plan.grad[n]) for n, g in grads.items()}
        new_p, new_s = jm.update(case, params, jm.clip(case, grads, hyper), state, t, hyper)
        new_p = {n: constrain(v, plan.param[n]) for n, v in new_p.items()}
        new_s = {n: tuple(constrain(x, plan.state[n]) for x in s) for n, s in new_s.items()}
        return loss, jnp.concatenate(rows), grads, new_p, new_s

    return jax.jit(step)


_STEPS = {}


def cached_step(case, plan, m_, mode, trained_names, frozen):
    """make_step()'s jitted step, reused by every case of the same compiled shape (and mode and mesh)."""
    key = json.dumps([mode if m_ is not None else "plain", jm.compiled_shape(case)], sort_keys=True)
    if key not in _STEPS:
        if len(_STEPS) >= 64:
            _STEPS.clear()
        _STEPS[key] = make_step(case, plan, m_, mode, trained_names, frozen)
    return _STEPS[key]


_FEATURES = {}


def step_features(step, args):
    """The HLO collective features of the step's first program (once per cached step: its input shardings follow from
    the case's shapes, which its compiled shape fixes)."""
    if step not in _FEATURES:
        if len(_FEATURES) >= 64:
            _FEATURES.clear()
        _FEATURES[step] = hlo_features(step.lower(*args).compile().as_text())
    return _FEATURES[step]


def place(m_, arrays, entries):
    """Arrays on the mesh with their specs where the shape divides (else replicated: constrained inside)."""
    from jax.sharding import NamedSharding

    out = {}
    for n, a in arrays.items():
        e = entries[n] if n in entries else [None] * np.ndim(a)
        if not divides(np.shape(a), e, m_):
            e = [None] * np.ndim(a)
        out[n] = jax.device_put(a, NamedSharding(m_, spec(e)))
    return out


def train(case, inputs, mode, m_, plan):
    """Runs the case's steps; returns (tensors, replicas, hlo features). `m_` None: on one device."""
    params = jm.case_params(case, inputs)
    names = sorted(params)
    trained_names = jm.trained(case, names)
    ids, tgt, weights = jm.batch(case, inputs)
    step = cached_step(case, plan, m_, mode, trained_names, [n for n in names if n not in trained_names])
    state = jm.optimizer_init(case, {n: params[n] for n in trained_names})
    p_j = {n: jnp.asarray(v) for n, v in params.items()}
    args = (ids, tgt)
    if m_ is not None:
        p_j = place(m_, p_j, plan.param)
        state = {n: tuple(place(m_, {n: x}, plan.state)[n] for x in s) for n, s in state.items()}
        args = tuple(place(m_, {"b": a}, {"b": plan.batch()})["b"] for a in args)
    w = None if weights is None else jnp.asarray(weights)
    inv = jnp.asarray(jm.loss_scale(inputs), jnp.float64)
    hyper = jm.hyper(case)
    tensors, replicas, feats = {}, {}, []
    for k in range(case["train"]["steps"]):
        t = jnp.asarray(k, jnp.float64)  # the step index (update() counts from 1)
        if k == 0 and m_ is not None:
            feats = step_features(step, (p_j, state, *args, w, inv, t, hyper))
        loss, logits, grads, p_j, state = step(p_j, state, *args, w, inv, t, hyper)
        tensors[f"loss/step{k}"] = np.asarray(loss, dtype=np.float64)
        if k == 0:
            tensors["logits"] = np.asarray(logits, dtype=np.float64)
            for n, g in grads.items():
                collect(tensors, replicas, f"grad/{n}", g)
    for n, v in p_j.items():
        collect(tensors, replicas, f"param/{n}", v)
    return tensors, replicas, feats


def collect(tensors, replicas, key, arr):
    tensors[key] = np.asarray(arr, dtype=np.float64)
    copies = device_copies(arr)
    if len(copies) > 1:
        replicas[key] = copies


def run(case, inputs, mode):
    """A model case through `mode` ("gspmd" or "shardmap"): the run's result dict."""
    p = parallel(case)
    shapes = {n: np.shape(v) for n, v in jm.case_params(case, inputs).items()}
    plan = Plan(case, shapes)
    m_ = model_mesh(p["dp"], p["pp"], p["tp"])
    tensors, replicas, feats = train(case, inputs, mode, m_, plan)
    base, _, _ = train(case, inputs, "plain", None, plan)
    tensors.update({f"baseline/{n}": v for n, v in base.items()})
    prefix = f"jax-{mode}:dp{p['dp']}:tp{p['tp']}" + (f":pp{p['pp']}" if p["pp"] > 1 else "")
    features = [prefix, f"{prefix}:zero{plan.zero}", f"dtype:{dtype_name(case)}"]
    features += [f"{prefix}:microbatches"] if p["pp"] > 1 and p.get("microbatches", 1) > 1 else []
    features += [f"{prefix}:sp"] if plan.sp else []
    features += [f"{prefix}:accumulate"] if case["train"].get("grad_accumulation", 1) > 1 else []
    features += [f"{prefix}:clip"] if case["train"].get("clip_grad_norm") is not None else []
    features += [f"{prefix}:{case['train']['optimizer']['kind']}"]
    features += setup_features(prefix, case) + feats
    return {"tensors": tensors, "replicas": replicas, "features": features}


def unsupported(case, mode):
    """Why a JAX target cannot run this model case, or None."""
    why = jm.unsupported(case)
    if why:
        return why
    p = parallel(case)
    if p["cp"] > 1 or p["ep"] > 1:
        return "the JAX targets shard model cases over [dp, tp] (and pp on jax-shardmap) only"
    if p["pp"] > 1 and mode != "shardmap":
        return "GSPMD has no pipeline parallelism (jax-shardmap runs pp as a ppermute pipeline)"
    if p["dp"] * p["pp"] * p["tp"] > 8:
        return f"mesh {p['dp']}x{p['pp']}x{p['tp']} needs more than the 8 host CPU devices"
    if p.get("sequence_parallel") and p.get("sequence_parallel_mode", "split_gather") != "split_gather":
        return "the JAX targets split the sequence as split_gather only"
    if mode == "shardmap":
        from .jax_model_shardmap import unsupported as smap_unsupported

        return smap_unsupported(case)
    return None
