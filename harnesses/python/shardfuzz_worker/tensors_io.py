"""Inputs and outputs as safetensors files (float64; ids int64)."""

import os

import numpy as np
from safetensors.numpy import load_file, save_file


def read_inputs(path):
    return {k: v for k, v in load_file(path).items()}


def write_outputs(path, tensors, replicas):
    out = {}
    for name, t in tensors.items():
        out[name] = np.array(t, dtype=np.float64, order="C")
    for name, copies in replicas.items():
        for rank, t in copies:
            out[f"replica/{rank}/{name}"] = np.array(t, dtype=np.float64, order="C")
    tmp = f"{path}.tmp"
    save_file(out, tmp)
    os.replace(tmp, path)
