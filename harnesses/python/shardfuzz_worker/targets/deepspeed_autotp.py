"""The case's tensor parallelism in deepspeed-zero as DeepSpeed's AutoTP training: `tensor_parallel.autotp_size` in
the engine's config, with a `partition_config` naming the model's projections (column-parallel q / k / v / up / gate,
row-parallel o / down: DeepSpeed replaces them by its LinearLayer / LinearAllreduce and shards their weights, unevenly
where tp does not divide a width), so that `deepspeed.initialize` shards the model and ZeRO runs over the
data-parallel ranks of DeepSpeed's (dp, tp) mesh (rank = dp index x tp + tp index).

What a rank reports: a sharded parameter or gradient gathered over the tensor-parallel ranks (by the shard sizes its
layer was built with, with our own all-gather, not DeepSpeed's), a replicated one (norms, embedding, LM head, a
row-parallel bias) as its own local copy, so that a replicated gradient the tensor-parallel ranks disagree on shows
as disagreeing replicas.
"""

from .base import label_smoothing, parallel, vocab_sharded_loss
from .torch_model import model_defaults, sparse_embedding

#: The model's projections by how AutoTP shards them (torch_model's names).
LAYER_SPECS = (
    {"patterns": [r".*\.(q|k|v|up|gate)\.(weight|bias)$"], "partition_type": "column"},
    {"patterns": [r".*\.(o|down)\.(weight|bias)$"], "partition_type": "row"},
)


def tensor_parallel(case):
    return parallel(case)["tp"]


def vocab_sharded(case):
    """Whether the LM head is AutoTP's vocabulary-parallel one (`vocab_parallel_lm_head`, the case's `vocab_loss`
    `sharded`; by default DeepSpeed keeps a head without an HF plan replicated)."""
    return tensor_parallel(case) > 1 and vocab_sharded_loss(case, False)


def unsupported_autotp(case):
    """Why DeepSpeed's AutoTP training cannot express the case's tensor parallelism (None: it can, or tp is 1)."""
    tp = tensor_parallel(case)
    if tp == 1:
        return None
    p, m = parallel(case), model_defaults(case)
    if not _has_partition_config():
        return "this DeepSpeed release has no AutoTP partition_config (AutoTP training names layers by HF models only)"
    if p["sequence_parallel"]:
        return "AutoTP training has no sequence parallelism"
    if p["cp"] > 1:
        return "AutoTP beside Ulysses is not expressed"
    if (p["ep"] > 1 or "moe" in m["layers"]) and not p.get("auto_ep"):
        return "AutoTP beside DeepSpeed's MoE layer is not expressed (beside AutoEP's, with auto_ep, it is)"
    if sparse_embedding(case):
        return "AutoTP beside a sparse embedding gradient is not expressed"
    if vocab_sharded(case):
        if m.get("tied_embeddings"):
            return "AutoTP's vocabulary-parallel head is an nn.Linear named lm_head: the case's tied head is the embedding"
        if label_smoothing(case) or (case.get("data") or {}).get("class_weights"):
            return "DeepSpeed's vocabulary-parallel loss has no label smoothing and no class weights"
    return None


def _has_partition_config():
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig

    return "partition_config" in TPTrainingConfig.model_fields


def config(cfg, case):
    """The engine's config with AutoTP where the case's tp is above 1."""
    tp, overlap = tensor_parallel(case), parallel(case)["tp_overlap_comm"]
    if tp == 1:
        return cfg
    # DeepSpeed derives the global batch itself: it checks it against the whole world at stages 0-2 and against the
    # data-parallel ranks at stage 3 (measured), so a value given here fails one or the other.
    cfg.pop("train_batch_size", None)
    cfg["tensor_parallel"] = {"autotp_size": tp,
                              "partition_config": {"use_default_specs": False, "layer_specs": list(LAYER_SPECS)}}
    if vocab_sharded(case):
        cfg["tensor_parallel"]["vocab_parallel_lm_head"] = True
    if overlap is not None:
        # Column-parallel backward through AsyncColumnParallel: the input gradient's all-reduce overlapped.
        cfg["tensor_parallel"]["tp_overlap_comm"] = overlap
    return cfg


def prepare(model, case):
    """The model as a transformers model meets AutoTP: a `config` with its head counts (from which AutoTP splits q / k
    / v / o by key-value head groups, unevenly where tp does not divide kv_heads, and leaves ranks beyond kv_heads
    without a head), and, for the vocabulary-parallel head, a `loss_function` attribute, which DeepSpeed replaces by
    its vocabulary-parallel causal-LM loss."""
    import types

    if tensor_parallel(case) > 1:
        m = model_defaults(case)
        model.config = types.SimpleNamespace(num_attention_heads=m["heads"], num_key_value_heads=m["kv_heads"],
                                             hidden_size=m["hidden"])
    if vocab_sharded(case):
        model.loss_function = None
    return model


class VocabShard:
    """`train`'s `vocab` for AutoTP's vocabulary-parallel head: each micro-batch's loss from the loss DeepSpeed
    installed as the model's `loss_function` (given the targets as `shift_labels`: they are already the next tokens),
    a sum (`num_items_in_batch` 1) or, with the case's `local_mean_loss`, its own mean, as micro_batch_loss counts
    them; logits gathered over tp. `module()`: the engine's model now (a resumed run has a new one)."""

    def __init__(self, case, inputs, module):
        self.case, self.inputs, self.module = case, inputs, module

    def loss(self, logits, targets):
        from .torch_training import local_mean_count

        loss = self.module().loss_function
        count = local_mean_count(self.case, self.inputs, targets)
        if count is not None:
            return loss(logits, shift_labels=targets), count
        return loss(logits, shift_labels=targets, num_items_in_batch=1), 1.0

    def whole(self, logits):
        head = self.module().lm_head
        return gather_shards(logits, logits.dim() - 1, tuple(head._partition_sizes))


def dp_index(rank, case):
    return rank // tensor_parallel(case)


def sharded_dims(module):
    """{parameter name: (dim, shard sizes)} of the parameters AutoTP sharded in `module` (a row-parallel bias stays
    whole)."""
    from deepspeed.module_inject.layers import LinearAllreduce, LinearLayer

    out = {}
    for name, mod in module.named_modules():
        pre = f"{name}." if name else ""
        if isinstance(mod, LinearAllreduce):
            out[pre + "weight"] = (1, tuple(mod._partition_sizes))
        elif isinstance(mod, LinearLayer):
            out[pre + "weight"] = (0, tuple(mod._partition_sizes))
            if mod.bias is not None:
                out[pre + "bias"] = (0, tuple(mod._partition_sizes))
    return out


def gather_shards(t, dim, sizes):
    """The whole tensor from every tensor-parallel rank's shard `t` along `dim` (`sizes`: every rank's width there;
    uneven shards padded for the collective)."""
    import torch
    import torch.distributed as dist
    from deepspeed.utils import groups

    assert t.shape[dim] == sizes[groups.get_tensor_model_parallel_rank()], (t.shape, dim, sizes)
    widest = max(sizes)
    shape = list(t.shape)
    shape[dim] = widest
    padded = t.new_zeros(shape)
    padded.narrow(dim, 0, t.shape[dim]).copy_(t)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=groups.get_tensor_model_parallel_group())
    return torch.cat([part.narrow(dim, 0, n) for part, n in zip(parts, sizes)], dim=dim)


def features(stage, case):
    """AutoTP's degree, whether the MLP's projections are sharded unevenly (tp does not divide ffn), and how the
    key-value head groups meet the tensor-parallel ranks."""
    tp = tensor_parallel(case)
    if tp == 1:
        return []
    m = model_defaults(case)
    uneven = m["ffn"] % tp != 0 and any(k == "mlp" for k in m["layers"])
    out = [f"{stage}:autotp{tp}", f"{stage}:autotp:{'uneven' if uneven else 'even'}-shards"]
    if m["kv_heads"] % tp:
        # AutoTP splits attention by key-value head group: unevenly, and with ranks that hold none beyond kv_heads.
        out.append(f"{stage}:autotp:{'empty-head-shards' if tp > m['kv_heads'] else 'uneven-heads'}")
    overlap = parallel(case)["tp_overlap_comm"]
    if overlap is not None:
        out.append(f"{stage}:autotp:{'overlapped' if overlap else 'blocking'}-input-grad-reduce")
    if vocab_sharded(case):
        vocab = "uneven" if m["vocab"] % tp else "even"
        out.append(f"{stage}:autotp:vocab-parallel-head-{vocab}")
    return out


def forget():
    """What a fresh process has: no tensor-parallel groups left by an earlier case's AutoTP engine (DeepSpeed keeps them
    in module globals that no engine's teardown clears, and builds new ones only when none is set: a later case with
    another tp, or none, would run with the earlier case's groups)."""
    from deepspeed.utils import groups

    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                 "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK"):
        if hasattr(groups, name):
            setattr(groups, name, None)


def loss_group(case):
    """The group `train` sums a step's loss over: DeepSpeed's data-parallel ranks where AutoTP runs (the
    tensor-parallel ranks of one data-parallel index compute the same loss), else None (every rank)."""
    if tensor_parallel(case) == 1:
        return None
    from deepspeed.utils import groups

    return groups.get_data_parallel_group()
