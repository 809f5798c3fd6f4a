# ---------------------------------------------------------------- process group


def main():
    if int(os.environ.get("WORLD_SIZE", "0")) != WORLD:
        print(f"run with: torchrun --nproc_per_node {WORLD} {os.path.basename(__file__)}", file=sys.stderr)
        return 2
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback, as the fuzzer's ranks
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    code = run(dist.get_rank())
    # Rank 0 decides; every rank exits with its code.
    flag = torch.tensor([code or 0])
    dist.broadcast(flag, src=0)
    # Free the device mesh (held by reference cycles) before its groups go: a group that outlives
    # destroy_process_group can abort the process at exit ("terminate called without an active exception").
    gc.collect()
    dist.destroy_process_group()
    return int(flag.item())


def to_numpy(t):
    return t.detach().to(torch.float64, copy=True).cpu().numpy()

