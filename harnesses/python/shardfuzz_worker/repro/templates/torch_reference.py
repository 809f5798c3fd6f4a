# -------------------------------------------------- the single-device reference


def run_reference(data):
    """The case's training in float64 on one device: the plain torch model and the worker's loop on one rank
    (the whole batch). The single-device reference."""
    model = Model(M).to(torch.float64)
    load_case_params(model, data, torch.float64)
    freeze(model, CASE)
    named = list(model.named_parameters())
    out = train(CASE, data, model, [p for _, p in named], 0, 1, named=named)
    return combine_dp(CASE, [out], [])["tensors"]
