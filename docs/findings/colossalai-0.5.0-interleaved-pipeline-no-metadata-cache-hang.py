# Colossal-AI 0.5.0 (torch 2.5.1, transformers 4.51.3): HybridParallelPlugin(pp_style="interleaved",
# enable_metadata_cache=False) hangs in its second step (the first ends with the flag below turned off).
# InterleavedSchedule.send_forward_recv_forward and send_backward_recv_backward (pipeline/schedule/interleaved_pp.py:249, :275) set
#     self.send_tensor_metadata = not self.enable_metadata_cache and is_send
# so a call on a rank that only receives (the last device receiving chunk 1's input while chunk 0 has nothing
# to send) turns the flag off; that rank's next send then carries no metadata while its peer, which caches
# none, waits for it (p2p.py:320 against p2p.py:346). 1F1B (one_f_one_b.py) sets the flag only after a send.
# Fix: leave the flag as it was when the call does not send (`--fixed` applies that). Found by shardfuzz
# (target colossalai-hybrid, interleaved schedule). Run: timeout 60 python this.py [--fixed]  (2 CPU ranks,
# gloo). Measured: without --fixed both ranks print step 0 and then wait until killed; with it, both steps finish.
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def fix():
    from colossalai.pipeline.schedule.interleaved_pp import InterleavedSchedule

    def keep_flag_unless_sent(method, flag, sends):
        def wrapped(self, model_chunk_id_send, model_chunk_id_recv, *args, **kwargs):
            with self.stage_manager.switch_model_chunk_id(model_chunk_id_send):
                is_send = sends(self.stage_manager)
            before = getattr(self, flag)
            out = method(self, model_chunk_id_send, model_chunk_id_recv, *args, **kwargs)
            if not is_send:
                setattr(self, flag, before)
            return out

        return wrapped

    S = InterleavedSchedule
    S.send_forward_recv_forward = keep_flag_unless_sent(S.send_forward_recv_forward, "send_tensor_metadata",
                                                        lambda sm: not sm.is_last_stage())
    S.send_backward_recv_backward = keep_flag_unless_sent(S.send_backward_recv_backward, "send_grad_metadata",
                                                          lambda sm: not sm.is_first_stage())


def run(rank, fixed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29565", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    from colossalai.accelerator.cpu_accelerator import CpuAccelerator  # its RNG methods raise on CPU
    CpuAccelerator.get_rng_state = lambda self, device=None: torch.get_rng_state()
    CpuAccelerator.set_rng_state = lambda self, state, device=None: torch.set_rng_state(state)
    CpuAccelerator.manual_seed = lambda self, seed: torch.manual_seed(seed)
    dist.Backend.HCCL = getattr(dist.Backend, "HCCL", "hccl")  # p2p.py reads it; absent from CPU builds
    if fixed:
        fix()
    from colossalai.booster import Booster
    from colossalai.booster.plugin import HybridParallelPlugin
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=2, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    plugin = HybridParallelPlugin(tp_size=1, pp_size=2, pp_style="interleaved", num_model_chunks=2,
                                  num_microbatches=2, precision="fp32", overlap_p2p=False,
                                  enable_metadata_cache=False)
    booster = Booster(plugin=plugin)
    model, optimizer, *_ = booster.boost(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(0, 16, (4, 4))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def criterion(outputs, micro_batch):
        logits = outputs.logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 16), micro_batch["input_ids"].reshape(-1))

    for step in range(2):
        try:
            out = booster.execute_pipeline(iter([batch]), model, criterion, optimizer, return_loss=True)
            optimizer.step()
            optimizer.zero_grad()
            print(f"rank {rank}: step {step} finished, loss {out['loss']}")
        except Exception as e:  # the hang, ended by the process group's timeout
            print(f"rank {rank}: step {step}: {type(e).__name__}: {str(e)[:200]}")
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=("--fixed" in sys.argv,), nprocs=2)
