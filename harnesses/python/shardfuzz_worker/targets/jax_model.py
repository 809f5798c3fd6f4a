"""The case's model and its training step in jax.numpy, numerically the model of the Rust reference (and of
torch_model): embedding -> pre-norm residual blocks (causal GQA attention, MLP with tanh-GELU or SwiGLU) -> final
norm -> LM head -> token cross-entropy summed and divided by the global count of counted tokens, trained by the
case's optimizer with torch's semantics (SGD with L2 decay, Adam, AdamW; clipping by the global norm).

Parameters are a dict in the case's names and layouts (linear weights [in, out], so `x @ w`). Where the model
meets a collective the sharded targets differ, so those places go through `Parallel`: `jax-gspmd` passes the
plain one (global arrays; XLA's partitioner places the collectives), `jax-shardmap` one with explicit collectives
inside `shard_map` (jax_model_shardmap.py).
"""

import math

import numpy as np

from .base import IGNORE_INDEX, is_frozen, label_smoothing, loss_denominator
from .jax_common import jax, jnp, jnp_dtype, up

NORM_EPS = 1e-5


class Parallel:
    """The plain model: every array global. Subclasses put collectives where a sharded model needs them."""

    def column(self, x, w, b):
        """A linear layer whose output features a tensor-parallel model splits (q, k, v, up, gate)."""
        y = x @ w
        return y if b is None else y + b

    def row(self, x, w, b):
        """A linear layer whose input features a tensor-parallel model splits (o, down): partial sums reduced."""
        y = x @ w
        return y if b is None else y + b

    def embed(self, table, ids):
        return jnp.take(table, ids, axis=0)

    def token_losses(self, logits, tgt, weights, smoothing):
        """Per-token loss [n] (0 where the target is ignored), class-weighted and label-smoothed (`smoothing`: ε, or
        None without smoothing) as torch's cross_entropy with reduction="sum" computes each token's term."""
        return token_losses(logits, tgt, weights, smoothing)

    def residual(self, x):
        """The residual stream between blocks ([b, s, h]): where sequence parallelism splits it."""
        return x

    def whole_sequence(self, x):
        """A normalised residual ([b, s, h]) about to enter column-parallel layers: where sequence parallelism
        gathers the sequence it split."""
        return x


def token_losses(logits, tgt, weights, smoothing):
    z = up(logits)
    logp = jax.nn.log_softmax(z, axis=-1)
    counted = tgt != IGNORE_INDEX
    safe = jnp.where(counted, tgt, 0)
    nll = -jnp.take_along_axis(logp, safe[:, None], axis=-1)[:, 0]
    w = jnp.ones_like(nll) if weights is None else jnp.take(weights.astype(z.dtype), safe)
    if smoothing is None:
        return jnp.where(counted, nll * w, jnp.zeros((), z.dtype))
    eps = smoothing.astype(z.dtype)
    loss = (1.0 - eps) * nll * w + eps / z.shape[-1] * -jnp.sum(logp, axis=-1)
    return jnp.where(counted, loss, jnp.zeros((), z.dtype))


def norm(x, w, b, kind):
    z = up(x)
    if kind == "layernorm":
        mean = jnp.mean(z, axis=-1, keepdims=True)
        zc = z - mean
        y = zc * jax.lax.rsqrt(jnp.mean(zc * zc, axis=-1, keepdims=True) + NORM_EPS) * up(w)
        y = y if b is None else y + up(b)
    else:
        y = z * jax.lax.rsqrt(jnp.mean(z * z, axis=-1, keepdims=True) + NORM_EPS) * up(w)
    return y.astype(x.dtype)


def rotate(x, base):
    """`x` [batch, heads, tokens, head_dim] turned by the rotary embedding with `base` (`model.rotary_base`, Llama's
    half-split layout) at positions 0 .. tokens-1, computed in the graph (iota) in float64 (jax_common turns x64 on),
    cos and sin rounded to x's dtype, then x * cos + rotate_half(x) * sin in x's dtype."""
    d, s = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / jnp.asarray(float(base), jnp.float64) ** (jnp.arange(0, d, 2, dtype=jnp.float64) / d)
    angles = jnp.arange(s, dtype=jnp.float64)[:, None] * inv_freq
    both = jnp.concatenate((angles, angles), axis=-1)
    cos, sin = jnp.cos(both).astype(x.dtype), jnp.sin(both).astype(x.dtype)
    half = jnp.concatenate((-x[..., d // 2:], x[..., : d // 2]), axis=-1)
    return x * cos + half * sin


def attention(par, p, pre, x, m):
    b, s, _ = x.shape
    d = m["hidden"] // m["heads"]
    q, k, v = (par.column(x, p[f"{pre}.{n}.weight"], p.get(f"{pre}.{n}.bias")) for n in "qkv")
    q, k, v = (t.reshape(b, s, t.shape[-1] // d, d).transpose(0, 2, 1, 3) for t in (q, k, v))
    if m.get("rotary_base") is not None:
        q, k = rotate(q, m["rotary_base"]), rotate(k, m["rotary_base"])
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) * jnp.asarray(1.0 / math.sqrt(d), q.dtype)
    mask = jnp.triu(jnp.ones((s, s), dtype=bool), 1)
    scores = jnp.where(mask, jnp.asarray(-jnp.inf, scores.dtype), scores)
    a = jax.nn.softmax(up(scores), axis=-1).astype(v.dtype) @ v
    a = a.transpose(0, 2, 1, 3).reshape(b, s, a.shape[1] * d)
    return par.row(a, p[f"{pre}.o.weight"], p.get(f"{pre}.o.bias"))


def mlp(par, p, pre, x, m):
    up_ = par.column(x, p[f"{pre}.up.weight"], p.get(f"{pre}.up.bias"))
    if m.get("activation", "gelu") == "swiglu":
        h = jax.nn.silu(par.column(x, p[f"{pre}.gate.weight"], p.get(f"{pre}.gate.bias"))) * up_
    else:
        h = jax.nn.gelu(up_, approximate=True)
    return par.row(h, p[f"{pre}.down.weight"], p.get(f"{pre}.down.bias"))


def block(par, p, i, kind, x, m):
    pre = f"layers.{i}"
    h = par.whole_sequence(norm(x, p[f"{pre}.norm.weight"], p.get(f"{pre}.norm.bias"), m.get("norm", "layernorm")))
    inner = attention(par, p, f"{pre}.attn", h, m) if kind == "attention" else mlp(par, p, f"{pre}.mlp", h, m)
    return par.residual(x + inner)


def model_blocks(m):
    """The model's blocks in order, [(layer index, kind)], every pass of shared blocks included."""
    return [(i, kind) for _ in range(m.get("layer_passes", 1)) for i, kind in enumerate(m["layers"])]


def embedded(par, p, ids):
    """The residual stream entering the first block."""
    return par.residual(par.embed(p["embed.weight"], ids))


def run_blocks(par, p, blocks, x, m):
    """`blocks` ([(layer index, kind)]) applied to the residual stream, each recomputed in the backward where the
    model checkpoints activations."""
    for i, kind in blocks:
        f = lambda p_, x_, i=i, kind=kind: block(par, p_, i, kind, x_, m)  # noqa: E731
        if m.get("activation_checkpointing"):
            f = jax.checkpoint(f)
        x = f(p, x)
    return x


def head_logits(par, p, x, m):
    """The final norm and the LM head on the last block's output: logits [b * s, vocab (this rank's part)]."""
    z = par.whole_sequence(norm(x, p["final_norm.weight"], p.get("final_norm.bias"), m.get("norm", "layernorm")))
    head = p["embed.weight"] if m.get("tied_embeddings") else p["lm_head.weight"]  # [vocab, hidden], both
    return par.column(z, head.T, None).reshape(-1, head.shape[0])


def logits_of(par, p, ids, m):
    """Logits [b * s, vocab (this rank's part of it under a vocabulary-parallel head)]."""
    return head_logits(par, p, run_blocks(par, p, model_blocks(m), embedded(par, p, ids), m), m)


def unsupported(case):
    """Why the JAX model cannot express this case, or None (shared by both JAX targets)."""
    m = case["model"]
    t = case["train"]
    if "moe" in m["layers"]:
        return "MoE layers are not expressed by the JAX model"
    if m["heads"] < 1 or m["hidden"] % m["heads"] or m["heads"] % m["kv_heads"]:
        return "heads must divide hidden and kv_heads must divide heads"
    if t.get("loss_scale") is not None:
        return "dynamic loss scaling is not expressed by the JAX targets"
    for field in ("master_dtype", "grad_accum_dtype"):
        if t.get(field) not in (None, t["dtype"]):
            return f"train.{field} other than the compute dtype is not expressed by the JAX targets"
    if t.get("reduce_dtype") not in (None, t["dtype"]):
        return "train.reduce_dtype other than the compute dtype is not expressed by the JAX targets"
    if label_smoothing(case) and inputs_weighted(case):
        return "label smoothing with class weights is not expressed by the JAX model"
    if m.get("sparse_embedding"):
        return "JAX has no sparse gradients"
    if t["dtype"] == "f16" and t["optimizer"]["kind"] != "sgd":
        return "Adam moments in f16 (refused as for the torch targets: the second moment underflows)"
    ga = t.get("grad_accumulation", 1)
    if m["batch"] % ga:
        return "JAX accumulation splits the batch into equal micro-batches (batch divisible by grad_accumulation)"
    return None


def inputs_weighted(case):
    return bool(case["data"].get("class_weights"))


def micro_batches(case):
    """The global batch's row ranges of the accumulation micro-batches (equal, contiguous)."""
    b, ga = case["model"]["batch"], case["train"].get("grad_accumulation", 1)
    return [(k * b // ga, (k + 1) * b // ga) for k in range(ga)]


def case_params(case, inputs):
    """The case's initial parameters in its dtype, as numpy (case names and layouts)."""
    dt = jnp_dtype(case["train"]["dtype"])
    skip = ("tokens", "targets", "class_weights")
    return {n: np.asarray(jnp.asarray(np.asarray(v, dtype=np.float64), dtype=dt)) for n, v in inputs.items() if n not in skip}


def batch(case, inputs):
    m = case["model"]
    ids = np.asarray(inputs["tokens"], dtype=np.int32).reshape(m["batch"], m["seq"])
    tgt = np.asarray(inputs["targets"], dtype=np.int32).reshape(m["batch"], m["seq"])
    w = inputs.get("class_weights")
    weights = None if w is None or len(w) == 0 else np.asarray(w, dtype=np.float64)
    return ids, tgt, weights


# ---------------------------------------------------------------------------------------- optimizer


def optimizer_init(case, params):
    """Adam's moments (float32, float64 for f64 parameters; zeros), or {} for SGD."""
    if case["train"]["optimizer"]["kind"] == "sgd":
        return {}
    return {n: (jnp.zeros(p.shape, state_dtype(p)), jnp.zeros(p.shape, state_dtype(p))) for n, p in params.items()}


def state_dtype(p):
    return jnp.float64 if p.dtype == jnp.float64 else jnp.float32


def clip(case, grads, hyper):
    """torch's clip_grad_norm_: every gradient times min(1, max_norm / (‖g‖ + 1e-6)) over the global norm."""
    if case["train"].get("clip_grad_norm") is None or not grads:
        return grads
    sq = sum(jnp.sum(jnp.square(g.astype(state_dtype(g)))) for g in grads.values())
    coef = jnp.minimum(hyper["clip"] / (jnp.sqrt(sq) + 1e-6), 1.0)
    return {n: (g.astype(state_dtype(g)) * coef.astype(state_dtype(g))).astype(g.dtype) for n, g in grads.items()}


def hyper(case):
    """The case's values a compiled step takes as arguments (so that a step compiled once serves every case that
    differs only in them): learning rate, weight decay, Adam's betas and eps, the clipping norm, label smoothing."""
    t, o = case["train"], case["train"]["optimizer"]
    values = {"lr": o["lr"], "wd": o.get("weight_decay", 0.0), "b1": o.get("beta1", 0.9), "b2": o.get("beta2", 0.999),
              "eps": o.get("eps", 1e-8), "clip": t.get("clip_grad_norm") or 0.0, "smoothing": label_smoothing(case)}
    return {k: jnp.asarray(float(v), jnp.float64) for k, v in values.items()}


def compiled_shape(case):
    """What a compiled step depends on besides its arguments (hyper()): the model, the parallel layout, and the
    training choices that change the program (optimizer kind, which parameters decay, whether the step clips or
    smooths, accumulation, frozen parameters, class weights)."""
    t, o = case["train"], case["train"]["optimizer"]
    return {"model": case["model"], "parallel": case["parallel"], "dtype": t["dtype"], "kind": o["kind"],
            "no_decay_vectors": bool(o.get("no_decay_vectors")), "decays": bool(o.get("weight_decay", 0.0)),
            "clips": t.get("clip_grad_norm") is not None, "smooths": bool(label_smoothing(case)),
            "accumulation": t.get("grad_accumulation", 1), "frozen": t.get("frozen") or [],
            "weighted": inputs_weighted(case)}


def update(case, params, grads, state, step, hyper):
    """One optimizer step on the trained parameters (torch's SGD / Adam / AdamW arithmetic in float32, or float64,
    rounded once to the parameter dtype); returns (params, state)."""
    o = case["train"]["optimizer"]
    new_p, new_s = dict(params), dict(state)
    for n, g in grads.items():
        p = params[n]
        sd = state_dtype(p)
        pw, gw = p.astype(sd), g.astype(sd)
        lr, wd = hyper["lr"].astype(sd), hyper["wd"].astype(sd)
        decays = o.get("weight_decay", 0.0) and not (o.get("no_decay_vectors") and p.ndim < 2)
        if o["kind"] == "sgd":
            new_p[n] = (pw - lr * (gw + wd * pw if decays else gw)).astype(p.dtype)
            continue
        b1, b2, eps = (hyper[k].astype(sd) for k in ("b1", "b2", "eps"))
        if decays and o["kind"] == "adamw":
            pw = pw * (1.0 - lr * wd)
        elif decays:
            gw = gw + wd * pw
        m, v = state[n]
        m = b1 * m + (1.0 - b1) * gw
        v = b2 * v + (1.0 - b2) * gw * gw
        # torch computes the bias corrections and the step size as Python floats (float64), then in the state dtype
        t = (step + 1).astype(jnp.float64)
        correction2 = jnp.sqrt(1.0 - hyper["b2"] ** t).astype(sd)
        step_size = (hyper["lr"] / (1.0 - hyper["b1"] ** t)).astype(sd)
        denom = jnp.sqrt(v) / correction2 + eps
        new_p[n] = (pw - step_size * m / denom).astype(p.dtype)
        new_s[n] = (m, v)
    return new_p, new_s


def trained(case, names):
    return [n for n in names if not is_frozen(case, n)]


def loss_scale(inputs):
    """1 / the global count of counted tokens (class-weighted): the summed token loss times it is the mean."""
    return 1.0 / loss_denominator(inputs)


