"""The model's loss under `shard_map` with explicit collectives, as JAX's shard_map documentation writes data,
tensor and fully-sharded data parallelism: each dp rank's rows, its loss scaled by dp / global tokens and
averaged with `pmean`; ZeRO-3 parameters `all_gather`ed over dp before use; with tp, Megatron's pieces
(column-parallel local matmuls, row-parallel ones `psum`med, a vocabulary-parallel embedding and cross-entropy
with `axis_index` offsets, `pmax` and `psum`); with sequence parallelism, Megatron's: the residual stream split
along the sequence over tp, `all_gather`ed before column-parallel layers, row-parallel and embedding partial sums
`psum_scatter`ed back into it, the norms on each rank's part of the sequence. The loss is differentiated from outside the shard_map, so every
gradient reduction (the `psum`s over dp and tp, the `psum_scatter` of a gathered parameter) is JAX's transpose
of a forward collective.
"""

from jax.sharding import PartitionSpec as P

from . import jax_model as jm
from . import jax_pipeline, jax_release
from .base import IGNORE_INDEX, parallel
from .jax_common import jax, jnp, up


class ShardMapParallel(jm.Parallel):
    def __init__(self, tp, sp):
        self.tp = tp
        self.sp = sp and tp > 1

    def reduce(self, partial):
        """Partial sums over tp ([b, s, h]) reduced: all-reduced, or with sequence parallelism reduce-scattered
        along the sequence (Megatron's reduce_scatter_to_sequence_parallel_region)."""
        if self.tp == 1:
            return partial
        if self.sp:
            return jax.lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)
        return jax.lax.psum(partial, "tp")

    def row(self, x, w, b):
        y = self.reduce(x @ w)
        return y if b is None else y + b

    def whole_sequence(self, x):
        return jax.lax.all_gather(x, "tp", axis=1, tiled=True) if self.sp else x

    def embed(self, table, ids):
        if self.tp == 1:
            return jnp.take(table, ids, axis=0)
        rows = table.shape[0]
        lo = jax.lax.axis_index("tp") * rows
        inside = (ids >= lo) & (ids < lo + rows)
        local = jnp.take(table, jnp.where(inside, ids - lo, 0), axis=0)
        return self.reduce(jnp.where(inside[..., None], local, jnp.zeros((), table.dtype)))

    def token_losses(self, logits, tgt, weights, smoothing):
        if self.tp == 1:
            return jm.token_losses(logits, tgt, weights, smoothing)
        return vocab_parallel_losses(logits, tgt, weights, smoothing, self.tp)


def vocab_parallel_losses(logits, tgt, weights, smoothing, tp):
    """Per-token loss from this rank's vocabulary columns: Megatron's vocab_parallel_cross_entropy."""
    z = up(logits)
    cols = z.shape[-1]
    lo = jax.lax.axis_index("tp") * cols
    zs = z - jax.lax.pmax(jax.lax.stop_gradient(jnp.max(z, axis=-1)), "tp")[:, None]
    lse = jnp.log(jax.lax.psum(jnp.sum(jnp.exp(zs), axis=-1), "tp"))
    counted = tgt != IGNORE_INDEX
    safe = jnp.where(counted, tgt, 0)
    inside = (safe >= lo) & (safe < lo + cols)
    picked = jnp.take_along_axis(zs, jnp.where(inside, safe - lo, 0)[:, None], axis=-1)[:, 0]
    nll = lse - jax.lax.psum(jnp.where(inside, picked, jnp.zeros((), z.dtype)), "tp")
    w = jnp.ones_like(nll) if weights is None else jnp.take(weights.astype(z.dtype), safe)
    if smoothing is None:
        return jnp.where(counted, nll * w, jnp.zeros((), z.dtype))
    eps = smoothing.astype(z.dtype)
    loss = (1.0 - eps) * nll * w + eps * (lse - jax.lax.psum(jnp.sum(zs, axis=-1), "tp") / (cols * tp))
    return jnp.where(counted, loss, jnp.zeros((), z.dtype))


def unsupported(case):
    """Why shard_map cannot run the model case (its blocks must split evenly), or None."""
    p = parallel(case)
    m = case["model"]
    dp, tp = p["dp"], p["tp"]
    rows = m["batch"] // case["train"].get("grad_accumulation", 1)
    if rows % dp:
        return "shard_map splits each micro-batch's rows evenly over dp (batch / grad_accumulation divisible by dp)"
    if p.get("sequence_parallel") and tp > 1 and m["seq"] % tp:
        return f"shard_map splits the sequence ({m['seq']}) evenly over tp ({tp}) under sequence parallelism"
    if tp > 1:
        for field in ("heads", "kv_heads", "ffn", "vocab"):
            if m[field] % tp:
                return f"shard_map splits model.{field} ({m[field]}) evenly over tp ({tp})"
    return jax_pipeline.unsupported(case) if p["pp"] > 1 else None


def local_entries(entries, shape, sizes):
    """A parameter's shard_map in_spec: its plan's spec, without dp on a dimension dp does not divide (`sizes`: the
    mesh's axis sizes by name)."""
    out = []
    for n, e in zip(shape, entries):
        axes = e if isinstance(e, tuple) else (e,) if e else ()
        k = 1
        for a in axes:
            k *= sizes[a]
        if "dp" in axes and n % k:
            axes = tuple(a for a in axes if a != "dp")
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return out


def gather_dp(x, entries):
    """A ZeRO-3 parameter whole again over dp (the tp split stays): all_gather along its dp dimension."""
    for d, e in enumerate(entries):
        axes = e if isinstance(e, tuple) else (e,) if e else ()
        if "dp" in axes:
            return jax.lax.all_gather(x, "dp", axis=d, tiled=True)
    return x


def sharded_loss(case, plan, m_, trained_names, frozen):
    """loss_fn(pt, pf, ids, tgt, weights, inv_tokens, smoothing) -> (loss, logits) for jax.value_and_grad."""
    m = case["model"]
    p = parallel(case)
    dp, tp, pp = p["dp"], p["tp"], p["pp"]
    par = ShardMapParallel(tp, bool(p.get("sequence_parallel")))
    sizes = dict(zip(m_.axis_names, m_.devices.shape))
    stacks = pp > 1 and jax_pipeline.stacked(case)
    specs = {}

    def body(shared, stage, ids, tgt, weights, inv_tokens, smoothing):
        shared = {n: gather_dp(v, specs[n]) for n, v in shared.items()}
        if pp == 1:
            logits, counts = jm.logits_of(par, shared, ids, m), None
        else:
            stage = {n: gather_dp(v, specs["stage:" + n])[0] for n, v in stage.items()}
            logits, counts = jax_pipeline.logits(par, shared, stage, ids, m, pp, p.get("microbatches", 1))
        losses = par.token_losses(logits, tgt.reshape(-1), weights, smoothing)
        local = jnp.sum(losses) * (inv_tokens * dp)
        if counts is not None:  # the last stage's loss; every stage's logits (the last one's taken outside)
            local = jax.lax.psum(jnp.where(counts, local, jnp.zeros((), local.dtype)), "pp")
            logits = logits[None]
        return jax.lax.pmean(local, "dp"), logits

    def loss_fn(pt, pf, ids, tgt, weights, inv_tokens, smoothing):
        params = {**pf, **pt}
        shared, stage = jax_pipeline.stack(params, m, pp) if stacks else (params, {})
        for n, v in shared.items():
            specs[n] = local_entries(plan.param[n], v.shape, sizes)
        for n, v in stage.items():
            specs["stage:" + n] = ["pp"] + local_entries(plan.param[n], v.shape[1:], sizes)
        w = jnp.ones((m["vocab"],), jnp.float64) if weights is None else weights
        in_specs = ({n: P(*specs[n]) for n in shared}, {n: P(*specs["stage:" + n]) for n in stage},
                    P("dp", None), P("dp", None), P(), P(), P())
        out_specs = (P(), P(*(["pp"] if pp > 1 else []), "dp", "tp" if tp > 1 else None))
        smooths = smoothing is not None

        def inner(shared, stage, ids, tgt, weights, inv_tokens, eps):
            return body(shared, stage, ids, tgt, weights, inv_tokens, eps if smooths else None)

        f = jax_release.shard_map(inner, m_, in_specs, out_specs)
        eps = smoothing if smooths else jnp.zeros((), jnp.float64)  # (a None argument has no leaf for its in_spec)
        loss, logits = f(shared, stage, ids, tgt, w, inv_tokens, eps)
        return loss, logits[-1] if pp > 1 else logits

    return loss_fn
