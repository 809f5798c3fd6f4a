# ------------------------------------------------------ the fuzzer's statistics

STATS = ("max", "rms", "norm", "sum", "direction")


def load_blob():
    """The case's inputs (float64 values, already rounded to the case dtype; ids int64), from BLOB below."""
    raw = zlib.decompress(base64.b64decode("".join(BLOB.split())))
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def max_abs(r):
    r = np.abs(np.asarray(r, dtype=np.float64))
    r = r[np.isfinite(r)]
    return float(r.max()) if r.size else 0.0


def scales(reference):
    """Each tensor's error scale: its own max |ref|, or a tenth of its family's (the name's part before the
    first '/') where that is larger: tensors that are round-off in exact arithmetic."""
    family = {}
    for name, r in reference.items():
        fam = name.split("/")[0]
        family[fam] = max(family.get(fam, 0.0), max_abs(r))
    return {name: max(max_abs(r), 0.1 * family[name.split("/")[0]]) for name, r in reference.items()}


def statistics(t, r, scale):
    """max |t-r| / scale, ||t-r|| / max(||r||, scale), | ||t|| - ||r|| | / max(||r||, scale), and the sum and
    direction errors, as the fuzzer computes them (fuzz/src/oracle/stats.rs). An element where either is
    not finite is left out when both hold the same value; otherwise every statistic is NaN (a mismatch)."""
    t = np.asarray(t, dtype=np.float64).ravel()
    r = np.asarray(r, dtype=np.float64).ravel()
    bad = ~(np.isfinite(t) & np.isfinite(r))
    if bad.any():
        if not np.array_equal(t[bad].view(np.uint64), r[bad].view(np.uint64)):
            return dict.fromkeys(STATS, float("nan"))
        t, r = t[~bad], r[~bad]
    d = t - r
    tn, rn = float(np.sqrt(np.sum(t * t))), float(np.sqrt(np.sum(r * r)))
    rmax = float(np.max(np.abs(r), initial=0.0))
    norm_scale = max(rn, scale)
    floor = scale if scale > rmax else 0.0
    tns, rns = max(tn, floor), max(rn, floor)
    if tn > 0 and rn > 0:
        cross = max(float(np.sum(d * d)) - (tn - rn) ** 2, 0.0) / (tn * rn)
        direction = np.sqrt(cross * (tn / tns) * (rn / rns) + (tn / tns - rn / rns) ** 2)
    else:
        direction = tn / tns if tn > 0 else (rn / rns if rn > 0 else 0.0)
    div = lambda a, b: a / b if b > 0 else a  # noqa: E731
    return {
        "max": div(float(np.max(np.abs(d), initial=0.0)), scale),
        "rms": div(float(np.sqrt(np.sum(d * d))), norm_scale),
        "norm": div(abs(tn - rn), norm_scale),
        "sum": div(abs(float(np.sum(t)) - float(np.sum(r))), max(float(np.sum(np.abs(r))), scale)),
        "direction": float(direction),
    }


def preview(t, at):
    flat = np.asarray(t, dtype=np.float64).ravel()
    head = ", ".join(f"{v:.8g}" for v in flat[:4]) + (", ..." if flat.size > 4 else "")
    return f"[{head}]  [{at}] = {flat[at]:.10g}" if flat.size else "[]"


def crash_guard(entry):
    """Runs `entry`; an exception (the framework crashing) prints CRASH and ends the process with status 1 at
    once, so that torchrun stops the other ranks instead of leaving them waiting in a collective."""
    try:
        return entry()
    except Exception as e:  # noqa: BLE001 - any framework error is the finding
        import traceback

        traceback.print_exc()
        rank = os.environ.get("RANK", "0")
        print(f"CRASH on rank {rank}: {type(e).__name__}: {e}", flush=True)
        sys.stderr.flush()
        os._exit(1)


def report(sharded, reference, bounds, scale_of=None):
    """Prints every bounded tensor's statistics against its bound; returns 1 on a mismatch, else 0. `scale_of`
    gives the error scale of tensors that are not compared with the reference (replicas)."""
    if not bounds:
        print("OK: the sharded run completed (the finding was a crash or a hang; it did not show)", flush=True)
        return 0
    scale = scales({name: reference[name] for name in bounds if name not in (scale_of or {})}) | (scale_of or {})
    worst = None
    for name, stat_bounds in bounds.items():
        t, r = np.asarray(sharded[name]), np.asarray(reference[name])
        if t.size != r.size:
            raise SystemExit(f"{name}: the sharded run gave {t.shape}, the reference {r.shape}")
        diff = np.abs(t.astype(np.float64).ravel() - r.astype(np.float64).ravel())
        at = int(np.nanargmax(diff)) if diff.size and not np.isnan(diff).all() else 0
        print(f"{name}  shape {tuple(r.shape)}  scale {scale[name]:.4g}  (element {at}: largest difference)")
        print(f"    sharded    {preview(t, at)}")
        print(f"    reference  {preview(r, at)}")
        values = statistics(t, r, scale[name])
        for stat, bound in stat_bounds.items():
            v = values[stat]
            ratio = float("inf") if np.isnan(v) else (v / bound if bound > 0 else (0.0 if v == 0 else float("inf")))
            bad = not v <= bound
            print(f"    {stat:<9} {v:.4e}  bound {bound:.4e}  ratio {ratio:.3g}{'  <-- MISMATCH' if bad else ''}")
            if bad and (worst is None or ratio > worst[0]):
                worst = (ratio, name, stat, v, bound)
    if worst is not None:
        _, name, stat, v, bound = worst
        print(f"MISMATCH: {name} {stat} {v:.6g} > bound {bound:.6g}", flush=True)
        return 1
    print("OK: all tensors within the fuzzer's noise bounds", flush=True)
    return 0


def disagreement(reason):
    """A run that diverged by itself (the ranks' loss scalers skipped different steps): MISMATCH, returns 1."""
    print(f"MISMATCH: {reason}", flush=True)
    return 1


def dump(sharded, reference):
    """With REPRO_DUMP=path.npz set, both runs' tensors are also saved there (sharded/NAME, reference/NAME)."""
    path = os.environ.get("REPRO_DUMP")
    if path:
        arrays = {f"sharded/{n}": np.asarray(v) for n, v in sharded.items()}
        arrays.update({f"reference/{n}": np.asarray(v) for n, v in reference.items()})
        np.savez(path, **arrays)


def compare_replicas(replicas, sharded, reference):
    """For each bounded `replicas/NAME`: every rank's copy of a replicated tensor against the first holder's, as the
    fuzzer compares them. The copy that strays most goes in `sharded`, the first in `reference` (under the
    `replicas/` name); returns their error scales: the first copy's max |x|, or a tenth of the reference family's."""
    scale_of = {}
    for name, copies in replicas.items():
        key = f"replicas/{name}"
        if key not in BOUNDS or len(copies) < 2:
            continue
        family = name.split("/")[0]
        fam = max((max_abs(r) for n, r in reference.items() if n.split("/")[0] == family), default=0.0)
        first = np.asarray(copies[0][1])
        scale_of[key] = max(max_abs(first), 0.1 * fam)

        def badness(t):
            values = statistics(t, first, scale_of[key])
            return max(float("inf") if np.isnan(values[s]) or (b <= 0 < values[s]) else values[s] / b if b > 0 else 0.0
                       for s, b in BOUNDS[key].items())

        rank, worst = max(copies[1:], key=lambda c: badness(np.asarray(c[1])))
        print(f"{key}: rank {rank}'s copy against rank {copies[0][0]}'s (the one that strays most)")
        sharded[key], reference[key] = np.asarray(worst), first
    return scale_of
