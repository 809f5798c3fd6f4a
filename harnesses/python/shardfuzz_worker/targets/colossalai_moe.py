"""colossalai-moe: the case's MoE model as a `transformers` Mixtral (colossalai_mixtral.py) trained through Colossal-AI's
Booster with MoeHybridParallelPlugin: its experts over the case's `ep` ranks (shardformer's EPMixtralSparseMoeBlock:
uneven all-to-alls of the routed tokens), the data-parallel ranks of each expert (moe_dp = dp / ep) and the rest of the
model over every data-parallel rank, tp x pp beside them, ZeRO 0-1 (the plugin turns ZeRO-2 into 1 itself; with ZeRO 0
PyTorch DDP, which the plugin runs only where every parameter has the same data-parallel group, ep 1; beside a pipeline
its own data-parallel sync, ep > 1 included). Runs resume from the booster's sharded or whole checkpoints (the MoE
checkpoint IO), into another layout. Everything else is colossalai-hybrid's (colossalai_hybrid.py: the loss, the
schedules, what is reported and how it is combined).

An expert routed no token on a rank gets no gradient there (Mixtral skips it); one routed no token anywhere has none
at all, which is reported as zero, the reference's. The optimizer steps only parameters with a gradient (torch's
optimizers skip the others), where the reference steps every one: with an optimizer that moves a parameter whose
gradient is zero (momentum, Adam after its first step, weight decay) each run watches its routing and is unsupported
where some expert got no token in a step (colossalai_mixtral.RoutingWatch)."""

from .base import dtype_name, parallel
from .colossalai_common import unsupported_loss_scale
from .colossalai_hybrid import ColossalHybrid, SP_MODES
from .colossalai_mixtral import unsteppable_unused_experts
from .torch_model import unsupported_layout


class ColossalMoe(ColossalHybrid):
    name = "colossalai-moe"
    plugin_name = "MoeHybridParallelPlugin"
    checkpoint_layouts = ("sharded", "gathered")
    resumes_into = ("dp", "tp", "pp", "ep", "zero_stage", "reduce_bucket")

    def unsupported(self, case):
        why = unsupported_layout(case, ("dp", "tp", "pp", "ep"), "colossalai-moe runs dp x tp x pp with ep within dp",
                                 SP_MODES, offload=True, loss_scaling=True, moe=True) or unsupported_loss_scale(
                                     case, dtype_name(case))
        if why:
            return why
        if "moe" not in case["model"]["layers"]:
            return "colossalai-moe trains MoE models (colossalai-hybrid the dense ones)"
        from .colossalai_mixtral import expressible

        why = expressible(case["model"])
        if why:
            return why
        p = parallel(case)
        if p["ep"] > 1 and p["zero_stage"] == 0 and p["pp"] == 1:
            # (Colossal-AI 0.5.0 means to refuse it where it would run DDP, with a ValueError whose message names an
            # undefined `dp_group`: a NameError instead; docs/findings/colossalai-0.5.0-moe-expert-gradients-scaled-by-
            # active-data-parallel-ranks.py. Beside a pipeline it runs no DDP and accepts ep > 1: expressed.)
            return "MoeHybridParallelPlugin runs PyTorch DDP (ZeRO 0) only where the experts' data-parallel group is every rank's (ep 1)"
        if p["zero_stage"] == 0 and p["dp"] > 1 and p["pp"] == 1 and case["model"].get("activation_checkpointing") == "reentrant":
            # (Measured: every such case fails in backward with DDP's "Expected to mark a variable ready only once".)
            return ("MoeHybridParallelPlugin runs ZeRO 0 as PyTorch DDP with find_unused_parameters (an expert may get no "
                    "token), which PyTorch's reentrant activation checkpointing does not support")
        if p["zero_stage"] > 0 and dtype_name(case) == "f32":
            return "MoeHybridParallelPlugin runs ZeRO in bf16 or fp16 only (its own assertion)"
        why = unshardable(case["model"], p["tp"])
        if why:
            return why
        if case["model"]["moe"]["experts"] % p["ep"]:
            # (Its own check, but under a pipeline raised on the stage holding the layer only: campaign 319.)
            return "EPMixtralSparseMoeBlock refuses experts not divisible by the ep ranks"
        if p["zero_stage"] > 0 and p["pp"] * max(p["virtual_stages"], 1) > len(case["model"]["layers"]) // 2:
            # (Measured: the stage's MoeHybridParallelZeroOptimizer raises "No parameters found in moe_dp_group"
            # while the others go on.)
            return "a pipeline stage without a decoder layer holds no expert, which MoeHybridParallelPlugin's ZeRO refuses"
        return self.unsupported_plugin(case)

    def plugin_options(self, case):
        kw = super().plugin_options(case)
        kw["ep_size"] = parallel(case)["ep"]
        # Mixtral's policy gathers the LM head's output whatever parallel_output says (Linear1D_Col, gather_output):
        # one realisation of the case's vocab_loss, the gathered one (and our criterion must not gather again).
        kw["parallel_output"] = False
        return kw

    def combine(self, case, outs):
        if any(o.get("idle_experts") for o in outs):
            # (Decided by the run's routing: see the module and `unsteppable_unused_experts`.)
            return {"unsupported": f"an expert was routed no token in a step, which {unsteppable_unused_experts(case)}"}
        out = super().combine(case, outs)
        p = parallel(case)
        if "features" in out:
            out["features"] = [f.replace("colossalai-hybrid", "colossalai-moe") for f in out["features"]] + [
                f"colossalai-moe:ep{p['ep']}:moe-dp{p['dp'] // p['ep']}:experts{case['model']['moe']['experts']}"
                f":top{case['model']['moe']['top_k']}"]
        return out


def unshardable(m, tp):
    """Why Mixtral's shardformer policy cannot shard the case's model over `tp` ranks, or None. It refuses each of
    these itself (a divisibility assertion, or a layer's "not integer multiples of tensor parallel size"), but under a
    pipeline only on the stage that holds the layer while the others go on: refused here for every stage alike."""
    if tp == 1:
        return None
    for what, size in (("attention heads", m["heads"]), ("key/value heads", m["kv_heads"]), ("ffn (the experts' width)",
                                                                                           m["ffn"]), ("vocabulary (the LM head's columns)", m["vocab"])):
        if size % tp:
            return f"Mixtral's shardformer policy splits the {what} ({size}) over tp = {tp} without padding"
    return None


TARGET = ColossalMoe()
