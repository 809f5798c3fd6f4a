"""Pipeline parallelism under `shard_map`, as JAX's shard_map documentation writes a pipeline: the layers split
into `pp` stages of the same layer kinds, each stage's parameters stacked along a leading dimension split over the
mesh's `pp` axis, the micro-batches flowing from stage to stage by `ppermute` (GPipe: every forward, then JAX's
transpose of the loop: every backward, the activations' cotangents sent back by the transposed `ppermute`).

The embedding, the final norm and the LM head are whole on every stage (the first stage's embedding and the last
stage's head are the ones that count; JAX sums their gradients over the stages as it transposes a replicated
parameter), and the loss is the last stage's, summed over `pp`.
"""

from . import jax_model as jm
from .base import parallel
from .jax_common import jax, jnp

LAYER = "layers."


def unsupported(case):
    """Why the pipeline cannot run this case, or None (pp > 1 only)."""
    p, m = parallel(case), case["model"]
    stages, per = p["pp"], len(m["layers"]) // p["pp"]
    if len(m["layers"]) % stages:
        return f"the pipeline splits model.layers ({len(m['layers'])}) evenly over pp ({stages})"
    if any(m["layers"][k * per:(k + 1) * per] != m["layers"][:per] for k in range(stages)):
        return "the pipeline's stages hold the same layer kinds (their parameters are stacked over pp)"
    if m.get("layer_passes", 1) > 1:
        return "shared blocks (layer_passes) across pipeline stages are not expressed"
    if p.get("pipeline_schedule") == "interleaved" or p.get("virtual_stages", 1) > 1:
        return "the interleaved schedule (virtual stages) is not expressed: JAX's pipeline is GPipe"
    rows = m["batch"] // case["train"].get("grad_accumulation", 1) // p["dp"]
    if rows % p.get("microbatches", 1):
        return f"the pipeline splits each dp rank's rows ({rows}) into equal micro-batches ({p.get('microbatches', 1)})"
    return None


def stage_of(name, per):
    """(stage, the layer's name within its stage) of a layer parameter, or None for a shared one."""
    if not name.startswith(LAYER):
        return None
    i, rest = name[len(LAYER):].split(".", 1)
    return int(i) // per, f"{LAYER}{int(i) % per}.{rest}"


def stack(params, stages, per):
    """(shared parameters, stage parameters stacked [stages, ...] under their first stage's names)."""
    shared, groups = {}, {}
    for n, v in params.items():
        where = stage_of(n, per)
        if where is None:
            shared[n] = v
        else:
            groups.setdefault(where[1], {})[where[0]] = v
    return shared, {n: jnp.stack([g[k] for k in range(stages)]) for n, g in groups.items()}


def stage_forward(par, stage, kinds, x, m):
    for j, kind in enumerate(kinds):
        f = lambda p_, x_, j=j, kind=kind: jm.block(par, p_, j, kind, x_, m)  # noqa: E731
        if m.get("activation_checkpointing"):
            f = jax.checkpoint(f)
        x = f(stage, x)
    return x


def logits(par, shared, stage, ids, m, stages, microbatches):
    """The last stage's logits [rows * s, vocab (this rank's part)] and whether this device is on it; `stage`: this
    device's layers, named as the first stage's."""
    kinds = m["layers"][: len(m["layers"]) // stages]
    x = par.residual(par.embed(shared["embed.weight"], ids))
    micro = x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    k = jax.lax.axis_index("pp")
    state, outs = jnp.zeros_like(micro[0]), []
    for t in range(microbatches + stages - 1):
        inp = jnp.where(k == 0, micro[t], state) if t < microbatches else state
        y = stage_forward(par, stage, kinds, inp, m)
        if t >= stages - 1:
            outs.append(y)
        state = jax.lax.ppermute(y, "pp", [(i, i + 1) for i in range(stages - 1)])
    h = jnp.concatenate(outs)
    z = par.whole_sequence(jm.norm(h, shared["final_norm.weight"], shared.get("final_norm.bias"), m.get("norm", "layernorm")))
    head = shared["embed.weight"] if m.get("tied_embeddings") else shared["lm_head.weight"]
    return par.column(z, head.T, None).reshape(-1, head.shape[0]), k == stages - 1
