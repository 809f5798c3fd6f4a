# ---------------------------------------------- training (as torch_training.py)


def train(model, data, loss_ctx, view):
    """The case's training steps on the whole batch in GRAD_ACCUMULATION micro-batches: summed token
    cross-entropy (or each micro-batch's mean times its count) scaled by 1 / counted tokens, backward, optional
    gradient clipping, the optimizer step.
    Returns (logits of step 0, every step's loss, step-0 gradients and final parameters (case layout); the
    steps the loss scaler skipped)."""
    b, s = M["batch"], M["seq"]
    ids = torch.tensor(data["tokens"].astype(np.int64)).view(b, s)
    tgt = torch.tensor(data["targets"].astype(np.int64)).view(b, s)
    weights = data["class_weights"] if "class_weights" in data else None  # the case's class weights, or None
    counted = data["targets"][data["targets"] != -100]  # F.cross_entropy's sum skips -100
    tokens = float(len(counted) if weights is None else weights[counted].sum())  # the loss mean's denominator
    bounds = np.linspace(0, b, GRAD_ACCUMULATION + 1).round().astype(int)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    opt = make_optimizer(CASE, params)
    scaler = loss_scaler(CASE["train"])  # the case's dynamic loss scaling, or None
    out, skipped = {}, []
    for k in range(CASE["train"]["steps"]):
        opt.zero_grad()
        loss_sum = torch.zeros((), dtype=torch.float64)
        rows = []
        for a, c in zip(bounds[:-1], bounds[1:]):
            with loss_ctx():
                logits = model(ids[a:c])
                weight = None if weights is None else torch.tensor(weights, dtype=logits.dtype)
                count = 1.0  # what the loss stands for in units of the summed token loss
                if CASE["train"].get("local_mean_loss"):  # the micro-batch's mean (reduction="mean") times its count
                    here = data["targets"].reshape(b, s)[a:c].reshape(-1)
                    here = here[here != -100]
                    count = float(len(here) if weights is None else weights[here].sum()) or 1.0  # none counted: a sum
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[a:c].reshape(-1),
                                       reduction="sum" if count == 1.0 else "mean", weight=weight,
                                       label_smoothing=CASE["train"].get("label_smoothing", 0.0))
                scaled = loss * (count / tokens) if scaler is None else scaler.scale(loss.float()) * (count / tokens)
                scaled.backward()
            loss_sum += full(loss) * count
            if k == 0:
                rows.append(full(logits).reshape(-1, logits.shape[-1]))
        out[f"loss/step{k}"] = np.array(float(loss_sum) / tokens)
        if scaler is not None:
            scaler.unscale_(opt)
        if k == 0:
            out["logits"] = torch.cat(rows).numpy()[:, : M["vocab"]]
            trained = [(n, p) for n, p in named if not is_frozen(CASE, n)]  # a frozen parameter has no gradient
            missing = [n for n, p in trained if p.grad is None]
            if missing:
                raise RuntimeError(f"no gradient came back for {', '.join(missing)}")
            out.update({f"grad/{n}": view(n, p.grad) for n, p in trained})
        if CASE["train"].get("clip_grad_norm") is not None:
            torch.nn.utils.clip_grad_norm_(params, CASE["train"]["clip_grad_norm"], clip_norm_type(CASE),
                                           foreach=foreach_clip(CASE))
        if scaler is not None:
            skipped.append(scaled_step(scaler, opt))
        else:
            opt.step()
    out.update({f"param/{n}": view(n, p) for n, p in named})
    return out, skipped


# ---------------------------------------------------- sharded run and reference


def run_sharded(data, rank):
    """The model under tensor parallelism, as the fuzzer's torch-tp ranks run it: parallelize_module with the
    plan above (and, without sequence parallelism, replicated norms fed local tensors), loss under loss_parallel
    where the LM head's output stays sharded over the vocabulary; with COMPILED each block under torch.compile.
    Replicated parameters are reported from this rank's local copy, sharded ones gathered."""
    model = Model(M).to(DTYPE)
    load_case_params(model, data, DTYPE)
    freeze(model, CASE)  # the case's frozen parameters, frozen before parallelizing as a user does
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, tp_plan())
    if not SEQUENCE_PARALLEL:
        replicated_norms(model, mesh)
    if COMPILED:  # each block compiled after parallelize_module, as torchtitan does (in place: the names stay)
        torch._dynamo.reset()
        for block in model.layers:
            block.compile(backend="aot_eager")

    def view(name, t):
        if isinstance(t, DTensor) and all(isinstance(pl, Replicate) for pl in t.placements):
            local = t.to_local()
        elif isinstance(t, DTensor):
            local = t.full_tensor()
        else:
            local = t
        return to_case_layout(name, local.detach().to(torch.float64, copy=True)).numpy()

    return train(model, data, loss_parallel if VOCAB_SHARDED_LOSS else contextlib.nullcontext, view)  # (outputs, skipped steps)


def run_reference(data):
    """The same training in float64 on one device with plain torch: the single-device reference."""
    model = Model(M).to(torch.float64)
    load_case_params(model, data, torch.float64)
    freeze(model, CASE)
    return train(model, data, contextlib.nullcontext, lambda name, t: to_case_layout(name, full(t)).numpy())[0]


def run(rank):
    data = load_blob()
    sharded, skipped = run_sharded(data, rank)
    per_rank = [None] * WORLD
    dist.all_gather_object(per_rank, skipped)
    if rank != 0:
        return None
    if any(s != per_rank[0] for s in per_rank):
        return disagreement("the ranks' loss scalers skipped different steps: "
                            + ", ".join(f"rank {r} {s}" for r, s in enumerate(per_rank)))
    reference = run_reference(data)
    dump(sharded, reference)
    return report(sharded, reference, BOUNDS)
