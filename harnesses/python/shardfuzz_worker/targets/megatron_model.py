"""The case's model from megatron-core tensor-parallel layers (see megatron_tp.py), its training loop on one
tensor-parallel rank, and the assembly of the ranks' slices into full case-layout tensors."""

import functools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import known_fixes
from .base import (IGNORE_INDEX, chunk_range, dtype_name, grad_or_fail, is_frozen, label_smoothing, loss_denominator,
                   micro_batches, parallel, resume_after, resumed_case, vocab_sharded_loss)
from .megatron_checkpoint import load_checkpoint, save_checkpoint
from .megatron_moe import Moe, frozen_moe_param, is_moe_param, load_moe, moe_config, moe_of, to_case_layout
from .megatron_common import (cuda_on_cpu, ddp_settings, loss_scale_of, megatron_step, megatron_training,
                              optimizer_settings, per_token_loss, reduced_grads, scales_loss, sync_parameters,
                              transformer_config, weight_decay_overrides)
from .torch_common import shared_tempdir, torch_dtype
from .torch_model import Norm, block_sequence, causal_attention, checkpointed_block, model_defaults

#: Case-layout dimension along which each kind of parameter is sharded (None: replicated on every rank).
COLUMN, ROW = ("q", "k", "v", "up", "gate"), ("o", "down")


def linear_kind(name):
    """'column' / 'row' for the projections of layers.{i}.attn|mlp.{proj}.{weight|bias}, else None."""
    parts = name.split(".")
    if len(parts) == 5 and parts[2] in ("attn", "mlp"):
        return "column" if parts[3] in COLUMN else "row" if parts[3] in ROW else None
    return None


def shard_dim(name):
    if name in ("embed.weight", "lm_head.weight") or name.endswith(("attn.q_norm.weight", "attn.k_norm.weight")):
        return 0  # (query/key norms: a weight per element of every head, held with the rank's heads)
    kind, leaf = linear_kind(name), name.rsplit(".", 1)[-1]
    if kind == "column":
        return 1 if leaf == "weight" else 0  # case weight [in, out]: out sharded
    if kind == "row" and leaf == "weight":
        return 0  # case weight [in, out]: in sharded
    return None  # norms, row-parallel biases


def _init(_w):
    return None


class Attention(nn.Module):
    def __init__(self, m, cfg, tp):
        super().__init__()
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.utils import divide

        h, d = m["hidden"], m["hidden"] // m["heads"]
        self.d = d
        # megatron's attention takes whole heads (and query groups) per rank, with its own `divide` assertion.
        self.local_heads = divide(m["heads"], tp)
        self.local_kv = divide(m["kv_heads"], tp)
        col = dict(config=cfg, init_method=_init, bias=m["bias"], gather_output=False)
        self.q = ColumnParallelLinear(h, m["heads"] * d, **col)
        self.k = ColumnParallelLinear(h, m["kv_heads"] * d, **col)
        self.v = ColumnParallelLinear(h, m["kv_heads"] * d, **col)
        self.o = RowParallelLinear(m["heads"] * d, h, config=cfg, init_method=_init, bias=m["bias"],
                                   input_is_parallel=True, skip_bias_add=False)

    def forward(self, x):  # x: [s(/tp), b, h]
        q, k, v = self.q(x)[0], self.k(x)[0], self.v(x)[0]  # [s, b, heads_local * d]
        s, b = q.shape[0], q.shape[1]
        q = q.view(s, b, q.shape[-1] // self.d, self.d).permute(1, 2, 0, 3)
        k = k.view(s, b, k.shape[-1] // self.d, self.d).permute(1, 2, 0, 3)
        v = v.view(s, b, v.shape[-1] // self.d, self.d).permute(1, 2, 0, 3)
        a = causal_attention(q, k, v)  # [b, heads_local, s, d]
        a = a.permute(2, 0, 1, 3).reshape(s, b, a.shape[1] * a.shape[3])  # no -1: s may be 0
        return self.o(a)[0]


class Mlp(nn.Module):
    def __init__(self, m, cfg):
        super().__init__()
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        h, f = m["hidden"], m["ffn"]
        self.swiglu = m["activation"] == "swiglu"
        col = dict(config=cfg, init_method=_init, bias=m["bias"], gather_output=False)
        self.up = ColumnParallelLinear(h, f, **col)
        if self.swiglu:
            self.gate = ColumnParallelLinear(h, f, **col)
        self.down = RowParallelLinear(f, h, config=cfg, init_method=_init, bias=m["bias"], input_is_parallel=True,
                                      skip_bias_add=False)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)[0]) * self.up(x)[0])[0]
        return self.down(F.gelu(self.up(x)[0], approximate="tanh"))[0]


class Block(nn.Module):
    def __init__(self, m, kind, cfg, tp, moe_cfg=None, number=1):
        super().__init__()
        self.norm = Norm(m["hidden"], m["norm"], m["bias"])
        if kind == "attention":
            self.attn = Attention(m, cfg, tp)
        elif kind == "moe":
            self.moe = Moe(moe_cfg, number)
        else:
            self.mlp = Mlp(m, cfg)

    def forward(self, x):
        inner = self.attn if hasattr(self, "attn") else self.moe if hasattr(self, "moe") else self.mlp
        return x + inner(self.norm(x))


class MegatronModel(nn.Module):
    """The case's model, or the blocks of one pipeline stage of it (`stage` = (rank, stages, chunk, chunks): the
    blocks split evenly by megatron's `divide` over stages x virtual chunks in megatron's interleaved order, chunk c
    of stage r holding the r-th share of the c-th part; the embedding on the first stage's first chunk, the final norm
    and LM head on the last stage's last; block names stay the case's, `layers.{i}`)."""

    def __init__(self, m, cfg, tp, gather=False, stage=(0, 1, 0, 1), moe_cfg=None):
        super().__init__()
        from megatron.core.enums import ModelType
        from megatron.core.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding
        from megatron.core.utils import divide

        self.model_type = ModelType.encoder_or_decoder  # (what megatron's schedules ask a model)
        rank, stages, chunk, chunks = stage
        self.pre_process, self.post_process = (rank, chunk) == (0, 0), (rank, chunk) == (stages - 1, chunks - 1)
        # Tied embeddings as megatron's GPTModel ties them: on one stage an LM head without a weight of its own
        # (skip_weight_param_allocation), handed the embedding's vocabulary shard at every forward; across stages the
        # last holds a copy (marked `shared`, left out of the gradient norm), whose gradient finalize_model_grads
        # all-reduces with the embedding's over megatron's embedding group (both marked `shared_embedding`).
        self.tied = m.get("tied_embeddings", False)
        self.share_embeddings_and_output_weights = self.tied
        self.input_tensor = None
        self.sp = cfg.sequence_parallel
        self.recompute = m.get("activation_checkpointing")
        self.passes = m.get("layer_passes", 1)
        if self.pre_process:
            self.embed = VocabParallelEmbedding(m["vocab"], m["hidden"], init_method=_init, config=cfg,
                                                reduce_scatter_embeddings=self.sp)
        # (The splits of the vocabulary, the heads and the MLP width are megatron's checks on the stages that hold an
        # embedding, attention or MLP; made on every stage, so that all refuse a case alike instead of the others
        # waiting on them.)
        kinds = set(m["layers"])
        for size in [m["vocab"]] + [m["heads"], m["kv_heads"]] * ("attention" in kinds) + [m["ffn"]] * ("mlp" in kinds):
            divide(size, tp)
        per = divide(len(m["layers"]), stages * chunks)
        first = (chunk * stages + rank) * per
        self.layers = nn.ModuleDict({str(i): Block(m, m["layers"][i], cfg, tp, moe_cfg, i + 1)
                                     for i in range(first, first + per)})
        if self.post_process:
            self.final_norm = Norm(m["hidden"], m["norm"], m["bias"])
            self.lm_head = ColumnParallelLinear(m["hidden"], m["vocab"], config=cfg, init_method=_init, bias=False,
                                                gather_output=gather,
                                                skip_weight_param_allocation=self.tied and self.pre_process)
            if self.tied and not self.pre_process:
                self.lm_head.weight.shared = self.lm_head.weight.shared_embedding = True
        if self.tied and self.pre_process and not self.post_process:
            # (As megatron's LanguageModule marks both: the distributed optimizer gives each its own bucket, so the
            # first and last stages shard it alike before the embedding group's all-reduce.)
            self.embed.weight.shared_embedding = True
        if self.sp:
            # What megatron's LayerNorm wrappers do: norms see a sequence chunk; their grads are summed over tp.
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.sequence_parallel = True

    def forward(self, ids):
        """ids [b, s] -> local logits [s, b, vocab / tp] (gathered: [s, b, vocab]) on the last stage, hidden states
        [s(/tp), b, h] on the others (which take theirs from the previous stage: set_input_tensor)."""
        if self.pre_process:
            x = self.embed(ids)
            if not self.sp:
                x = x.transpose(0, 1).contiguous()  # (with sp the embedding's reduce-scatter did it)
        else:
            x = self.input_tensor
        for layer in block_sequence(list(self.layers.values()), self.passes):
            x = self.run_block(layer, x)
        if not self.post_process:
            return x
        return self.lm_head(self.final_norm(x), weight=self.embed.weight if self.tied and self.pre_process else None)[0]

    def shared_embedding_or_output_weight(self):
        """The tied weight this stage holds (what megatron's embedding-group reduction asks a model)."""
        return self.embed.weight if self.pre_process else self.lm_head.weight

    def set_input_tensor(self, tensors):
        """megatron's schedules hand a stage its input (a list of one tensor; None on the first stage)."""
        self.input_tensor = tensors[0] if isinstance(tensors, list) else tensors

    def run_block(self, layer, x):
        """A block, under Megatron's own re-entrant activation checkpoint (`tensor_parallel.checkpoint`, what its
        TransformerBlock's full recomputation calls) or torch's non-re-entrant one, as the case asks."""
        if self.recompute != "reentrant" or not torch.is_grad_enabled():
            return checkpointed_block(layer, x, self.recompute)
        from megatron.core import tensor_parallel

        if not x.requires_grad:
            # (Its input needs a gradient, or the block's parameters get none: a frozen embedding's output does
            # not; users make it require one, as torch_model.checkpointed_block does.)
            x = x.detach().requires_grad_(True)
        return tensor_parallel.checkpoint(layer, False, x)


def load_local(model, inputs, rank, tp, dt, swiglu=False):
    """Each rank's slice of the case's parameters (megatron layouts: linear weights [out_local, in]; a tied LM
    head's copy on the last stage: the embedding's; MoE blocks: megatron_moe.load_moe)."""
    for i, block in model.layers.items():
        if hasattr(block, "moe"):
            load_moe(f"layers.{i}", block.moe, inputs, dt, swiglu)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_moe_param(name):
                continue
            src = torch.tensor(inputs[case_name(model, name)])
            d = shard_dim(name)
            if d is not None:
                n = src.shape[d] // tp
                src = src.narrow(d, rank * n, n)
            if linear_kind(name) and name.endswith(".weight"):
                src = src.t()
            if tuple(src.shape) != tuple(p.shape):
                raise RuntimeError(f"harness: {name} slice {tuple(src.shape)} vs megatron {tuple(p.shape)}")
            p.copy_(src.to(dt))


def case_name(model, name):
    """The case's name of a parameter of `model`: a tied LM head's copy on the last stage is the embedding."""
    return "embed.weight" if name == "lm_head.weight" and model.tied else name


def case_view(name, t):
    """A local parameter or gradient in the case layout (its slice of it)."""
    t = t.detach().to(torch.float64, copy=True)
    if linear_kind(name) and name.endswith(".weight"):
        t = t.t()
    return t.contiguous().numpy()


def run(case, inputs, resumed=None):
    """The case's training on this rank, under megatron's parallel state (megatron_common.model_parallel): the
    megatron model's slices of this tensor-parallel rank in megatron's DistributedDataParallel over the data-parallel
    replicas, trained by megatron's optimizer (its gradient norm, its clipping) under its parameter scheduler,
    finalize_model_grads after the micro-batches (the sequence-parallel norms' partial gradients summed over tp
    there); with pipeline stages, the blocks of this rank's stage. Returns this rank's slices, its tensor-, pipeline-
    and data-parallel ranks (the final layout's; `first`: those of the first step's, where the run resumed into other
    degrees). `resumed`: train_megatron's."""
    from megatron.core import ModelParallelConfig, parallel_state as ps

    m = model_defaults(case)
    dt = torch_dtype(dtype_name(case))
    # The case's vocab_loss: the LM head's vocabulary shards into vocab_parallel_cross_entropy (Megatron's
    # parallel_output, its default), or gathered (gather_output=True) into the plain loss.
    gathered = not vocab_sharded_loss(case, True)

    def chunks(layout):
        # (The tensor- and pipeline-parallel degrees of megatron's parallel state now, `layout` the case as laid out
        # now: its sequence parallelism. A config of their own: megatron_setup sets the DDP's hooks on it, which a
        # rebuilt MoE layer's deepcopy of the config could not copy.)
        tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        stage = (ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size())
        vs = ps.get_virtual_pipeline_model_parallel_world_size() or 1
        sp = parallel(layout)["sequence_parallel"]
        cfg = ModelParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=sp, use_cpu_initialization=True,
                                  perform_initialization=False, params_dtype=dt)
        moe_cfg = (moe_config(case, dt, tp, sp and tp > 1, stage[1], vs, per_token_loss(case)) if moe_of(case)
                   else None)
        out = []
        for c in range(vs):
            model = MegatronModel(m, cfg, tp, gathered, (*stage, c, vs), moe_cfg).to(dt)  # (plain norms: default dtype)
            load_local(model, inputs, tp_rank, tp, dt, m["activation"] == "swiglu")
            for name, p in model.named_parameters():  # (before megatron's DDP wraps it: no gradient buffer for these)
                p.requires_grad_(not (frozen_moe_param(case, name) if is_moe_param(name)
                                      else is_frozen(case, case_name(model, name))))
            out.append(model)
        return out, moe_cfg

    with cuda_on_cpu():
        out = train_megatron(case, inputs, chunks, gathered, resumed)
    return out | coordinates()


def coordinates():
    """This rank's tensor-, pipeline- and data-parallel ranks in megatron's parallel state now."""
    from megatron.core import parallel_state as ps

    return {"tp_rank": ps.get_tensor_model_parallel_rank(), "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank()}


class RankRows:
    """This rank's rows of the batch in megatron's parallel state now (torch.chunk over the data-parallel replicas,
    as the other targets split it), its micro-batches of them, and the `MicroBatches` that feed them to megatron's
    schedule (without the case's `per_token_loss` each summed token loss scaled by dp / global tokens: megatron's DDP
    averages over the replicas)."""

    def __init__(self, case, inputs, gathered):
        from megatron.core import parallel_state as ps

        self.dp = ps.get_data_parallel_world_size()
        self.lo, self.hi = chunk_range(case["model"]["batch"], self.dp, ps.get_data_parallel_rank())
        self.rows = [(self.lo + a, self.lo + c) for a, c in micro_batches(self.hi - self.lo, micro_batch_count(case))]
        self.batch = MicroBatches(case, inputs, gathered, per_token_loss(case),
                                  self.dp * len(self.rows) / loss_denominator(inputs))


def train_megatron(case, inputs, fresh_chunks, gathered, resumed=None):
    """Megatron's training loop on this rank's rows of the batch (RankRows): megatron's schedule for the layout
    (forward_backward_no_pipelining; over pipeline stages 1F1B, forward_backward_pipelining_without_interleaving, or
    with virtual chunks (`model` a list of them) the interleaved one; shapes sent between stages:
    `variable_seq_lengths`) over the case's micro-batches times its accumulation steps (no_sync on every micro-batch
    but the last, the optimizer's loss scale, finalize_model_grads), then the optimizer and scheduler steps; with the
    case's `per_token_loss` megatron normalises (`calculate_per_token_loss`). `fresh_chunks(layout)` builds this
    rank's model chunks for the case as laid out (virtual ones go to the schedule as a list) and their MoE config
    (None without MoE blocks); with `resume_after` the run is saved in megatron's checkpoint
    (megatron_checkpoint, in the case's layout) and loaded into fresh chunks, DDPs, optimizer and scheduler (resume);
    `resumed` (megatron_common.resumed_training: the case resumes into another layout) switches megatron's parallel
    state and gives the fresh DDPs' and optimizer's settings."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    t, s = case["train"], case["model"]["seq"]
    ddps, opt, schedule, settings = megatron_setup(case, *fresh_chunks(case))
    part = RankRows(case, inputs, gathered)
    if moe_of(case):  # (what the known fix megatron-moe-aux-loss-per-token-counted needs and the router cannot know)
        known_fixes.batch_tokens(loss_denominator(inputs), part.dp * len(part.rows))
    losses, first, skipped = [], {}, []
    for k in range(t["steps"]):
        if k == resume_after(case):
            ddps, opt, schedule, settings = resume(case, ddps, opt, schedule, settings, fresh_chunks, resumed)
            part = RankRows(resumed_case(case), inputs, gathered)
        for d in ddps:
            d.zero_grad_buffer()
        opt.zero_grad()
        # (Virtual chunks go to the schedule as a list; the layout may have changed at a resume.)
        batch, chunked, pp = part.batch, len(ddps) > 1, ps.get_pipeline_model_parallel_world_size()
        batch.start(keep_logits=k == 0)
        get_forward_backward_func()(forward_step_func=batch.forward_step, num_microbatches=len(part.rows),
                                    seq_length=s, data_iterator=[iter(part.rows) for _ in ddps] if chunked
                                    else iter(part.rows), model=ddps if chunked else ddps[0],
                                    micro_batch_size=part.rows[0][1] - part.rows[0][0])
        loss_sum = torch.stack(batch.sums).sum() if batch.sums else torch.zeros((), dtype=torch.float64)
        if part.dp > 1:
            torch.distributed.all_reduce(loss_sum, group=ps.get_data_parallel_group())
        if pp > 1:  # (the loss is the last stage's)
            torch.distributed.broadcast(loss_sum, src=ps.get_pipeline_model_parallel_last_rank(),
                                        group=ps.get_pipeline_model_parallel_group())
        losses.append(float(loss_sum) / loss_denominator(inputs))
        if k == 0:
            first = first_step(case, ddps, opt, settings, part)
        # megatron's unscaling and overflow check, its clipping (its norm over the model- and data-parallel groups)
        # and step; the scheduler after a successful update
        skipped.append(megatron_step(opt, schedule, case))
    sync_parameters(ddps, settings)
    final = {name: case_view(name, p) for name, p in case_parameters(ddps)}
    grads0 = first.pop("grads")
    if moe_of(case):  # (megatron's expert slices -> the case's full [experts, in, out] tensors)
        swiglu = case["model"].get("activation") == "swiglu"
        grads0, final = to_case_layout(grads0, swiglu), to_case_layout(final, swiglu)
    return first | {"losses": losses, "grads": grads0, "params": final,
                    "skipped": skipped if scales_loss(case) else None}


def resume(case, ddps, opt, schedule, settings, fresh_chunks, resumed):
    """The run saved in megatron's checkpoint (megatron_checkpoint, in the case's layout) and loaded into fresh chunks,
    DDPs, optimizer and scheduler: (DDPs, optimizer, scheduler, DDP settings). `resumed`: resumed_training's (the
    layout switched after the save), None where the run resumes into its own layout."""
    layout = resumed_case(case)  # (the case itself where it has no resume_parallel: `resumed` is None)
    with shared_tempdir() as path:
        save_checkpoint(case, path, ddps, opt, schedule, settings)
        if resumed is not None:
            resumed[0]()
        out = megatron_setup(layout, *fresh_chunks(layout), settings=None if resumed is None else resumed[1:])
        load_checkpoint(case, path, *out)
    return out


def first_step(case, ddps, opt, settings, part):
    """What the first step leaves to compare: this rank's rows of the batch (flattened tokens), its logits, its
    reduced gradients (unscaled: the buffers hold the scaled loss's, megatron unscales in its step) in the case
    layout, and its coordinates then (`first`: a run may resume into other degrees)."""
    s = case["model"]["seq"]
    scale = loss_scale_of(opt)
    reduced = {case_name(d.module, n): g / scale for d in ddps
               for n, g in reduced_grads(d, settings["use_distributed_optimizer"]).items()}
    trained = [name for name, p in case_parameters(ddps) if p.requires_grad]
    rows = part.batch.rows
    return {"rows": (part.lo * s, part.hi * s), "logits": torch.cat(rows).numpy() if rows else None,
            "grads": {name: case_view(name, grad_or_fail(name, reduced.get(name))) for name in trained},
            "first": coordinates()}


def case_parameters(ddps):
    """(case name, parameter) of every parameter of the DDP chunks' models."""
    return [(case_name(d.module, n), p) for d in ddps for n, p in d.module.named_parameters()]


def megatron_setup(case, chunks, moe_cfg=None, settings=None):
    """(DDP chunks, optimizer, scheduler, DDP settings) for the model chunks of this rank, and the config megatron's
    schedules read set as its training loop sets it (no_sync, finalize_model_grads, the optimizer's loss scale);
    `settings`: (DDP settings, optimizer settings) in place of the case's."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import finalize_model_grads

    tp, pp = ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size()
    # (With MoE blocks, their config, as megatron shares one: `num_moe_experts` makes the schedules scale the
    # auxiliary loss's gradient.)
    config = moe_cfg or transformer_config(next(chunks[0].parameters()).dtype, tp,
                                           bool(parallel(case)["sequence_parallel"]) and tp > 1, per_token_loss(case),
                                           pp, len(chunks))
    settings, opt_settings = settings or (ddp_settings(case), optimizer_settings(case))
    ddps, opt, schedule = megatron_training(case, chunks, config, settings, opt_settings, weight_decay_overrides(case))
    config.no_sync_func = [d.no_sync for d in ddps] if len(ddps) > 1 else ddps[0].no_sync
    config.finalize_model_grads_func, config.grad_scale_func = finalize_model_grads, opt.scale_loss
    # As Megatron-LM's training loop sets them with its defaults (`--no-align-grad-reduce` and
    # `--no-align-param-gather` unset): the schedules start each chunk's overlapped gradient reduction and parameter
    # all-gather themselves, on every pipeline stage at once.
    if settings["overlap_grad_reduce"]:
        config.grad_sync_func = [d.start_grad_sync for d in ddps] if len(ddps) > 1 else ddps[0].start_grad_sync
    if settings["overlap_param_gather"]:
        config.param_sync_func = [d.start_param_sync for d in ddps] if len(ddps) > 1 else ddps[0].start_param_sync
    if len(ddps) > 1:
        # The interleaved schedule as Megatron-LM's training runs it (overlap_p2p_comm, so no batched p2p), with
        # fixed message shapes: [seq (/ tp under sequence parallelism), micro-batch rows, hidden].
        config.overlap_p2p_comm, config.batch_p2p_comm = True, False
        config.variable_seq_lengths, config.hidden_size = False, case["model"]["hidden"]
    return ddps, opt, schedule, settings


class MicroBatches:
    """megatron's `forward_step_func` over the case's micro-batches (row ranges the schedule's data iterator
    yields): the model's logits and a loss function as megatron's pretraining scripts write them, in fp32. Per-token:
    (summed loss, counted tokens, {}) for megatron to normalise; otherwise (summed loss x `scale` x micro-batches,
    {}), which megatron's schedule divides by the micro-batch count. Keeps each micro-batch's summed loss (float64)
    and, on request, its logits (float64, before the loss: megatron's vocab-parallel loss works in place)."""

    def __init__(self, case, inputs, gathered, per_token, scale):
        m = case["model"]
        self.ids = torch.tensor(inputs["tokens"].astype(np.int64)).view(m["batch"], m["seq"])
        self.targets = torch.tensor(inputs["targets"].astype(np.int64)).view(m["batch"], m["seq"])
        self.gathered, self.per_token, self.scale = gathered, per_token, scale
        self.smoothing, self.vocab = label_smoothing(case), m["vocab"]
        self.sums, self.rows = [], None

    def start(self, keep_logits):
        self.sums, self.rows = [], [] if keep_logits else None

    def forward_step(self, data_iterator, model):
        a, c = next(data_iterator)
        logits = model(self.ids[a:c])  # [s, bc, v / tp]
        if self.rows is not None and model.module.post_process:  # (logits: the last stage's last chunk)
            self.rows.append(logits.detach().transpose(0, 1).reshape(-1, logits.shape[-1]).to(torch.float64, copy=True))
        return logits, functools.partial(self.loss, self.targets[a:c].t().contiguous())

    def loss(self, target, logits):
        l = token_loss_sum(logits, target, self.gathered, self.smoothing, self.vocab).float()
        self.sums.append(l.detach().to(torch.float64))
        if self.per_token:
            return l, torch.tensor(int((target != IGNORE_INDEX).sum()), dtype=torch.int), {}
        return l * self.scale, {}


def micro_batch_count(case):
    """Micro-batches per optimizer step: the accumulation steps, times the pipeline's micro-batches over stages."""
    p = parallel(case)
    return case["train"].get("grad_accumulation", 1) * (p["microbatches"] if p["pp"] > 1 else 1)


class GptLoss:
    """What `LanguageModule.compute_language_model_loss` (GPTModel's loss from labels) reads of its model: the
    unfused cross-entropy, the tensor-parallel group, and whether the output layer keeps the vocabulary shards
    (GPTModel's `parallel_output`; False: `gather_output=True`, the logits gathered)."""

    def __init__(self, parallel_output):
        import types

        from megatron.core import parallel_state as ps

        self.config = types.SimpleNamespace(cross_entropy_loss_fusion=False)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.parallel_output = parallel_output


def token_loss_sum(logits, target, gathered, smoothing=0.0, vocab=1):
    """The micro-batch's summed token loss (ignored targets left out) from logits [s, b, v(/tp)], target [s, b]:
    Megatron's own language-model loss (`LanguageModule.compute_language_model_loss`, what GPTModel's forward returns
    given labels; with gathered logits, GPTModel's under `parallel_output=False`). It takes no label smoothing: with
    the case's `smoothing` ε (torch's definition over `vocab` entries), `vocab_parallel_cross_entropy` on the shards,
    or torch's loss on gathered logits."""
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if smoothing and gathered:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum",
                               label_smoothing=smoothing)
    safe = target.clamp(min=0)  # (Megatron's losses have no ignore_index: its loss mask zeroes ignored targets)
    if smoothing:
        # Megatron's label_smoothing α (NeMo's definition: 1 - α on the target, α / (V - 1) on each other entry) is
        # torch's ε with α = ε (V - 1) / V.
        per_token = vocab_parallel_cross_entropy(logits, safe, label_smoothing=smoothing * (vocab - 1) / vocab)
    else:
        per_token = LanguageModule.compute_language_model_loss(GptLoss(not gathered), safe.t(), logits).t()  # [s, bc]
    return (per_token * (target != IGNORE_INDEX)).sum()


def assemble_outputs(case, outs):
    """Per-rank slices -> per-rank results holding full tensors (sharded ones assembled from the slices of the
    rank's data-parallel replica, every stage's; replicated ones the rank's own copy, or, for another stage's, that
    of the same tensor-parallel rank there), the shape combine_dp expects. The first step's logits and gradients
    are assembled over the ranks as laid out then (`first`), the final parameters as laid out at the end: a run may
    resume into other degrees."""
    first = [o | o.get("first", {}) for o in outs]
    full = [dict(o) for o in outs]
    for r in range(len(outs)):
        full[r].update(assembled(case, replica_of(first, r), first[r], ("grads",)))
        full[r].update(assembled(case, replica_of(outs, r), outs[r], ("params",)))
    full[0]["baseline"] = outs[0].get("baseline")
    return full


def replica_of(outs, r):
    """The ranks of rank `r`'s data-parallel replica, in stage and tensor-parallel order."""
    group = [o for o in outs if o["dp_rank"] == outs[r]["dp_rank"]]
    return sorted(group, key=lambda x: (x.get("pp_rank", 0), x["tp_rank"]))


def assembled(case, group, own, kinds):
    """Of one rank, its `kinds` (grads, params) and, with its gradients, its logits, from its replica's ranks
    (`group`, in stage and tp order): sharded tensors concatenated over the tensor-parallel ranks of the stage
    holding them, replicated ones from `own` or the same tensor-parallel rank of their stage."""
    out = {}
    if "grads" in kinds:
        last = [o for o in group if o["logits"] is not None]
        # (Gathered logits are the whole vocabulary on every rank.)
        out["logits"] = (np.concatenate([o["logits"] for o in last], axis=1) if vocab_sharded_loss(case, True)
                         else last[0]["logits"])
        out["rows"] = last[0]["rows"]
    for kind in kinds:
        out[kind] = {}
        names = dict.fromkeys(n for o in group for n in o[kind] if o["tp_rank"] == 0)
        for name in names:
            # (A tensor two stages hold, a tied embedding and its copy: each rank's stage's, the other's as replica.)
            stage = (own.get("pp_rank", 0) if name in own[kind]
                     else min(o.get("pp_rank", 0) for o in group if name in o[kind]))
            holders = [o for o in group if name in o[kind] and o.get("pp_rank", 0) == stage]
            d = shard_dim(name)
            if d is not None:
                out[kind][name] = np.concatenate([o[kind][name] for o in holders], axis=d)
            else:
                mine = own if name in own[kind] else next(o for o in holders if o["tp_rank"] == own["tp_rank"])
                out[kind][name] = mine[kind][name]
    return out
