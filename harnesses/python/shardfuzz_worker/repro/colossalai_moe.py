"""Repro of a colossalai-moe model case: the case's MoE model as a `transformers` Mixtral trained through Colossal-AI's
Booster with MoeHybridParallelPlugin (its arguments exactly as the worker gives them), with the worker's CPU start-up
shims and colossalai-hybrid's training code, under torchrun; against the same Mixtral on one device in float64
(colossalai_hybrid.py's generator, for this target)."""

from . import colossalai_hybrid
from .torch_model import producible  # noqa: F401 - the generator's interface

TARGET = "colossalai-moe"


def check(case):
    colossalai_hybrid.check(case, TARGET)


def generate(case, inputs, bounds, dropped):
    return colossalai_hybrid.generate(case, inputs, bounds, dropped, TARGET)
