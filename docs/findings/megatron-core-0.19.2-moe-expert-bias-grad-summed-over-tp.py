"""megatron-core 0.19.2: with MoE experts that have biases (`add_bias_linear`), tensor parallelism and sequence
parallelism, every expert's fc2 bias gradient is silently summed over the tensor-parallel ranks.

Megatron takes expert biases at expert-tensor-parallel size 1 only (transformer_config.py: "Bias in Moe is only
supported when ETP==1"), and MoE with tensor parallelism needs sequence parallelism (moe_layer.py). The experts'
fc2 is a RowParallelLinear, which marks its bias `sequence_parallel = config.sequence_parallel`
(tensor_parallel/layers.py:1413) whether or not it is an expert. An expert's bias is not added to a sequence chunk:
it is added to the tokens dispatched to the expert (mlp.py:354, `output += output_bias * per_token_scale`), and DDP
already reduces its gradient over the expert-data-parallel group. finalize_model_grads then sums every
`sequence_parallel` gradient over the tensor-parallel group as well (`_allreduce_non_tensor_model_parallel_grads`,
finalize_model_grads.py:452), adding another rank's expert-bias gradient (of another expert, or of the same one
counted twice) to it. The weights of the same experts are right.

Setup: 4 ranks, tp 2 with sequence parallelism, ep 2, etp 1, 4 experts, top-2, the all-to-all dispatcher, no
capacity. Loss = sum(output * g) for a fixed g, so d loss / d b2_e = sum over tokens routed to e of p_(t,e) * g_t,
computed here from the full batch in plain torch. `calculate_per_token_loss` keeps DDP from scaling gradients.

Found by shardfuzz's megatron-tp target (2026-11-30, a hand-written MoE case while adding MoE to the target):
`grad/layers.1.moe.down.bias` off by 100 % while every other tensor passes. `--fixed` leaves experts' biases
unmarked. Without expert parallelism (ep 1) the same configuration crashes instead: the fc2's reduce-scatter over a
group of one returns its input and mlp.py:354 adds the bias to it in place (autograd's view + inplace error).

Run: torchrun --nproc_per_node 4 megatron-core-0.19.2-moe-expert-bias-grad-summed-over-tp.py [--fixed] [--ep1]
(CPU, gloo). Prints MISMATCH (exit 1) or OK; with --ep1 (expert parallelism off) CRASH (exit 1), fixed or not.
"""

import contextlib
import functools
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29553")
dist.init_process_group("gloo")
rank = dist.get_rank()


class NoStream:
    """What megatron waits on before a reduction or a host copy: on the CPU, work is done when it returns."""

    def wait_stream(self, _stream):
        pass

    def wait_event(self, _event):
        pass

    def synchronize(self):
        pass

    def record_event(self, _event=None):
        return self


class CudaOnCpu(TorchFunctionMode):
    """megatron-core allocates its buffers on 'cuda' and checks parameters' CUDA type names: the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


torch.cuda.current_device = lambda: "cpu"
torch.cuda.current_stream = lambda *args, **kwargs: NoStream()
torch.cuda.Stream = lambda *args, **kwargs: NoStream()
torch.cuda.stream = lambda _stream: contextlib.nullcontext()
torch.cuda.Event = lambda *args, **kwargs: NoStream()

from megatron.core import parallel_state as ps  # noqa: E402
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig  # noqa: E402
from megatron.core.distributed import finalize_model_grads  # noqa: E402
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec  # noqa: E402
from megatron.core.tensor_parallel.layers import RowParallelLinear  # noqa: E402
from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.moe import moe_utils, token_dispatcher  # noqa: E402

# The all-to-all dispatcher copies its split sizes to the host as numpy arrays (CUDA tensors only): on the CPU too.
_to_host = moe_utils.maybe_move_tensor_to_cpu
token_dispatcher.maybe_move_tensor_to_cpu = (
    lambda t, as_numpy=False, record_stream=False: t.numpy() if as_numpy and torch.is_tensor(t) else _to_host(t))

if "--fixed" in sys.argv:
    _init = RowParallelLinear.__init__

    def _unmarked_expert_bias(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if self.is_expert and self.bias is not None:
            self.bias.sequence_parallel = False

    RowParallelLinear.__init__ = _unmarked_expert_bias

TP, EP, EXPERTS, TOPK, SEQ, BATCH, HIDDEN, FFN = 2, 1 if "--ep1" in sys.argv else 2, 4, 2, 4, 2, 8, 12
ps.initialize_model_parallel(tensor_model_parallel_size=TP, expert_model_parallel_size=EP,
                             expert_tensor_parallel_size=1)
config = TransformerConfig(
    num_layers=1, hidden_size=HIDDEN, ffn_hidden_size=FFN, moe_ffn_hidden_size=FFN, num_attention_heads=TP,
    tensor_model_parallel_size=TP, expert_model_parallel_size=EP, expert_tensor_parallel_size=1,
    sequence_parallel=True, num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_router_pre_softmax=True,
    moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="alltoall",
    moe_grouped_gemm=False, add_bias_linear=True, activation_func=functools.partial(F.gelu, approximate="tanh"),
    bias_activation_fusion=False, use_cpu_initialization=True, calculate_per_token_loss=True)

with CudaOnCpu():
    layer = get_moe_module_spec(use_te=False, num_experts=EXPERTS, moe_grouped_gemm=False)(config=config,
                                                                                           layer_number=1)
    g = torch.Generator().manual_seed(0)
    router = torch.randn(EXPERTS, HIDDEN, generator=g)
    experts = [(torch.randn(FFN, HIDDEN, generator=g), torch.randn(FFN, generator=g),
                torch.randn(HIDDEN, FFN, generator=g), torch.randn(HIDDEN, generator=g)) for _ in range(EXPERTS)]
    x_all = torch.randn(SEQ, BATCH * 2, HIDDEN, generator=g)  # [s, b over 2 data-parallel replicas, h]
    g_all = torch.randn(SEQ, BATCH * 2, HIDDEN, generator=g)  # d loss / d output
    local = len(layer.experts.local_experts)
    with torch.no_grad():
        layer.router.weight.copy_(router)
        layer.router.bias.zero_()
        for j, expert in enumerate(layer.experts.local_experts):
            w1, b1, w2, b2 = experts[ps.get_expert_model_parallel_rank() * local + j]
            expert.linear_fc1.weight.copy_(w1)
            expert.linear_fc1.bias.copy_(b1)
            expert.linear_fc2.weight.copy_(w2)
            expert.linear_fc2.bias.copy_(b2)
    layer.router.bias.requires_grad_(False)  # (the reference's router has none)
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), layer)
    tp_rank, dp_rank = ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()
    rows = slice(dp_rank * BATCH, (dp_rank + 1) * BATCH)
    chunk = slice(tp_rank * SEQ // TP, (tp_rank + 1) * SEQ // TP)  # (sequence parallelism: this rank's chunk)
    try:
        out = ddp(x_all[chunk, rows].contiguous())[0]
        (out * g_all[chunk, rows]).sum().backward()
    except RuntimeError as e:  # (--ep1)
        print(f"rank {rank}: CRASH: {str(e)[:160]}")
        sys.exit(1)
    finalize_model_grads([ddp])

    # The reference: d loss / d b2_e = sum over the tokens routed to e of p_(t, e) * g_t (the whole batch).
    tokens, grads_out = x_all.reshape(-1, HIDDEN), g_all.reshape(-1, HIDDEN)
    probs = torch.softmax(tokens @ router.t(), dim=-1)
    chosen = probs.topk(TOPK, dim=-1).indices
    worst = 0.0
    for j, expert in enumerate(layer.experts.local_experts):
        e = ps.get_expert_model_parallel_rank() * local + j
        routed = (chosen == e).any(dim=-1)
        want = (probs[routed, e, None] * grads_out[routed]).sum(dim=0)
        got = expert.linear_fc2.bias.main_grad
        worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        print(f"rank {rank} expert {e}: fc2 bias grad {got[:3].tolist()} ... reference {want[:3].tolist()} ...")

print(f"rank {rank}: largest relative error {worst:.3g}: {'MISMATCH' if worst > 1e-4 else 'OK'}")
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if worst > 1e-4 else 0)
