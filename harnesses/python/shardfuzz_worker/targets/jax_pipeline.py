"""Pipeline parallelism under `shard_map`, as JAX's shard_map documentation writes a pipeline: the layers split
into `pp` stages, the micro-batches flowing from stage to stage by `ppermute` (GPipe: every forward, then JAX's
transpose of the loop: every backward, the activations' cotangents sent back by the transposed `ppermute`).
Stages of the same layer kinds have their parameters stacked along a leading dimension split over the mesh's `pp`
axis; otherwise (other kinds per stage, an uneven split, shared blocks) every stage holds every parameter and runs
its own blocks by `lax.switch` on its pp index.

The embedding, the final norm and the LM head are whole on every stage (the first stage's embedding and the last
stage's head are the ones that count; JAX sums their gradients over the stages as it transposes a replicated
parameter), and the loss is the last stage's, summed over `pp`.
"""

from . import jax_model as jm
from .base import parallel
from . import jax_release
from .jax_common import jax, jnp

LAYER = "layers."


def unsupported(case):
    """Why the pipeline cannot run this case, or None (pp > 1 only)."""
    p, m = parallel(case), case["model"]
    if p.get("pipeline_schedule") == "interleaved" or p.get("virtual_stages", 1) > 1:
        return "the interleaved schedule (virtual stages) is not expressed: JAX's pipeline is GPipe"
    rows = m["batch"] // case["train"].get("grad_accumulation", 1) // p["dp"]
    if rows % p.get("microbatches", 1):
        return f"the pipeline splits each dp rank's rows ({rows}) into equal micro-batches ({p.get('microbatches', 1)})"
    return None


def stacked(case):
    """Whether the stages' parameters can be stacked over pp: every stage the same layer kinds, no shared blocks.
    Otherwise every stage holds every parameter and runs its own layers by `lax.switch` on its pp index."""
    p, m = parallel(case), case["model"]
    stages, layers = p["pp"], m["layers"]
    per = len(layers) // stages
    return (len(layers) % stages == 0 and m.get("layer_passes", 1) == 1
            and all(layers[k * per:(k + 1) * per] == layers[:per] for k in range(stages)))


def stage_blocks(m, stages):
    """Each stage's blocks [(layer index, kind)]: the model's blocks (every pass) split contiguously, the first
    stages one shorter where they do not divide."""
    blocks = jm.model_blocks(m)
    return [blocks[k * len(blocks) // stages:(k + 1) * len(blocks) // stages] for k in range(stages)]


def stage_of(name, per):
    """(stage, the layer's name within its stage) of a layer parameter, or None for a shared one."""
    if not name.startswith(LAYER):
        return None
    i, rest = name[len(LAYER):].split(".", 1)
    return int(i) // per, f"{LAYER}{int(i) % per}.{rest}"


def stack(params, m, stages):
    """(shared parameters, stage parameters stacked [stages, ...] under their first stage's names)."""
    per = len(m["layers"]) // stages
    shared, groups = {}, {}
    for n, v in params.items():
        where = stage_of(n, per)
        if where is None:
            shared[n] = v
        else:
            groups.setdefault(where[1], {})[where[0]] = v
    return shared, {n: jnp.stack([g[k] for k in range(stages)]) for n, g in groups.items()}


def logits(par, shared, stage, ids, m, stages, microbatches):
    """The last stage's logits [rows * s, vocab (this rank's part)] and whether this device is on it. `stage`: this
    device's layers named as the first stage's (stacked), or {} when `shared` holds every layer (switched)."""
    k = jax.lax.axis_index("pp")
    if stage:  # the first stage's blocks, named as its parameters are
        blocks = stage_blocks(m, stages)[0]

        def forward(x):
            return jm.run_blocks(par, stage, blocks, x, m)
    else:
        # every parameter made varying over pp before the switch, so that JAX's transpose (a psum over pp) lies
        # outside it: inside, only the stage's own devices would reach it
        owned = {n: jax_release.varying(v, "pp") for n, v in shared.items()}
        branches = [lambda x, b=b: jm.run_blocks(par, owned, b, x, m) for b in stage_blocks(m, stages)]

        def forward(x):
            return jax.lax.switch(k, branches, x)

    x = jm.embedded(par, shared, ids)
    micro = x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    state, outs = jnp.zeros_like(micro[0]), []
    for t in range(microbatches + stages - 1):
        y = forward(jnp.where(k == 0, micro[t], state) if t < microbatches else state)
        if t >= stages - 1:
            outs.append(y)
        state = jax.lax.ppermute(y, "pp", [(i, i + 1) for i in range(stages - 1)])
    return jm.head_logits(par, shared, jnp.concatenate(outs), m), k == stages - 1
